//! The storage-scan file, `DATA/storage/scans.csv`: `gpuledger storage-scan` appends one scan
//! (a time and the bytes and files of each tenant directory), billing prices the bytes in
//! TB-days, and the scheduler holds the jobs of accounts over their storage quota. One header,
//! one row format, one parser for all three.

use std::collections::BTreeMap;

use crate::ids::{AccountId, ProjectId};

/// The file's first line.
pub const SCAN_HEADER: &str = "time,account,project,bytes,files";
/// The file under a data directory.
pub const SCANS_FILE: &str = "storage/scans.csv";

/// One directory's figure in one scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScanLine {
    /// When the scan ran (Unix seconds).
    pub time: i64,
    pub account: AccountId,
    /// `None`: files directly under the account's directory.
    pub project: Option<ProjectId>,
    pub bytes: u64,
    pub files: u64,
}

/// A line that does not parse: the origin, the line number and the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{origin}:{line}: {message}")]
pub struct ScanError {
    pub origin: String,
    pub line: usize,
    pub message: String,
}

/// Every line of a scans file after its header.
pub fn parse_scans(text: &str, origin: &str) -> Result<Vec<ScanLine>, ScanError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate().skip(1) {
        let err = |message: String| ScanError {
            origin: origin.to_owned(),
            line: i + 1,
            message,
        };
        let at = |field: &str, e: &dyn std::fmt::Display| err(format!("field `{field}`: {e}"));
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 5 {
            return Err(err(format!("expected 5 fields ({SCAN_HEADER})")));
        }
        out.push(ScanLine {
            time: f[0].parse().map_err(|e| at("time", &e))?,
            account: AccountId::new(f[1]).map_err(|e| at("account", &e))?,
            project: (!f[2].is_empty())
                .then(|| ProjectId::new(f[2]))
                .transpose()
                .map_err(|e| at("project", &e))?,
            bytes: f[3].parse().map_err(|e| at("bytes", &e))?,
            files: f[4].parse().map_err(|e| at("files", &e))?,
        });
    }
    Ok(out)
}

/// The lines of `scan` as appended to the file, the header first when `new_file`.
pub fn format_scan(scan: &[ScanLine], new_file: bool) -> String {
    let mut text = String::new();
    if new_file {
        text.push_str(SCAN_HEADER);
        text.push('\n');
    }
    for r in scan {
        let project = r.project.as_ref().map(|p| p.as_str()).unwrap_or("");
        text.push_str(&format!(
            "{},{},{project},{},{}\n",
            r.time, r.account, r.bytes, r.files
        ));
    }
    text
}

/// The newest scan's bytes per account and project, with each account's total under project
/// `None`.
pub fn latest_scan(lines: &[ScanLine]) -> Vec<(AccountId, Option<ProjectId>, u64)> {
    let Some(newest) = lines.iter().map(|r| r.time).max() else {
        return Vec::new();
    };
    let mut totals: BTreeMap<AccountId, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for r in lines.iter().filter(|r| r.time == newest) {
        *totals.entry(r.account.clone()).or_default() += r.bytes;
        if r.project.is_some() {
            out.push((r.account.clone(), r.project.clone(), r.bytes));
        }
    }
    out.extend(totals.into_iter().map(|(a, b)| (a, None, b)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(time: i64, account: &str, project: Option<&str>, bytes: u64) -> ScanLine {
        ScanLine {
            time,
            account: AccountId::new(account).unwrap(),
            project: project.map(|p| ProjectId::new(p).unwrap()),
            bytes,
            files: 1,
        }
    }

    #[test]
    fn a_scan_reads_back_as_written() {
        let first = vec![
            line(100, "team-a", Some("pretrain"), 5),
            line(100, "team-a", None, 7),
        ];
        let second = vec![line(200, "team-b", None, 3)];
        let text = format_scan(&first, true) + &format_scan(&second, false);
        assert!(text.starts_with("time,account,project,bytes,files\n100,team-a,pretrain,5,1\n"));
        let read = parse_scans(&text, "scans.csv").unwrap();
        assert_eq!(read, [first, second].concat());
    }

    #[test]
    fn a_bad_line_names_file_line_and_field() {
        let text = "time,account,project,bytes,files\n100,team-a,,5,1\n100,team-a,,five,1\n";
        let err = parse_scans(text, "scans.csv").unwrap_err().to_string();
        assert!(err.starts_with("scans.csv:3: field `bytes`"), "{err}");
        let err = parse_scans("h\n100,../x,,5,1\n", "s")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("s:2: field `account`"), "{err}");
        let err = parse_scans("h\n100,team-a,5,1\n", "s")
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected 5 fields"), "{err}");
    }
}
