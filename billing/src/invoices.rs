//! Invoices on disk: each account's revisions of a month under its directory
//! (`<month>/<account>/rN.{json,csv,html}`, a new revision only when something changed), the
//! month's FOCUS file and the comparison of billing models beside them, and the reservations
//! file billing reads ([`gpuledger_model::billed_reservations`]). Files are written under a
//! temporary name and renamed, so a reader never sees half of one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use gpuledger_model::billed_reservations::{BilledReservations, BILLED_RESERVATIONS_FILE};
use gpuledger_model::AccountId;

use crate::render::{
    focus_csv, invoice_csv, invoice_from_json, invoice_html, invoice_json, Comparison,
};
use crate::{
    charge, revise, BillingInput, BillingModel, Error, Invoice, Period, PriceBook, Reservation,
    Result,
};

/// Reads a reservations file; errors name the file, line and field.
pub fn read_reservations(path: &Path) -> Result<Vec<Reservation>> {
    let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
    let file = BilledReservations::from_toml_str(&text, &path.display().to_string())
        .map_err(|e| Error::Input(e.to_string()))?;
    Ok(file
        .reservations
        .into_iter()
        .map(|r| Reservation {
            id: r.id,
            account: r.account,
            project: r.project,
            gpu_model: r.gpu_model,
            gpus: r.gpus,
            nodes: r.nodes,
            start: r.start.timestamp(),
            end: r.end.timestamp(),
        })
        .collect())
}

/// The reservations the scheduler wrote under `data_root`, none if it wrote no file.
pub fn reservations_in(data_root: &Path) -> Result<Vec<Reservation>> {
    let path = data_root.join(BILLED_RESERVATIONS_FILE);
    if path.exists() {
        read_reservations(&path)
    } else {
        Ok(Vec::new())
    }
}

/// What one invoice run wrote.
#[derive(Debug)]
pub struct MonthOutput {
    /// The latest revision of every account's invoice for the month.
    pub invoices: Vec<Invoice>,
    /// Accounts whose invoice got a new revision in this run.
    pub revised: Vec<String>,
    pub files: Vec<PathBuf>,
    pub comparison: Comparison,
}

/// The highest revision `rN.json` in an account's directory, if any.
pub fn latest_revision(dir: &Path) -> Result<Option<Invoice>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(None);
    };
    let mut latest: Option<(u32, PathBuf)> = None;
    for e in entries {
        let path = e.map_err(Error::io(dir))?.path();
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let Some(n) = name
            .strip_prefix('r')
            .and_then(|s| s.strip_suffix(".json"))
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if latest.as_ref().is_none_or(|(m, _)| n > *m) {
            latest = Some((n, path));
        }
    }
    let Some((_, path)) = latest else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path).map_err(Error::io(&path))?;
    invoice_from_json(&text)
        .map(Some)
        .map_err(|e| Error::Input(format!("reading {}: {e}", path.display())))
}

fn write_file(path: &Path, text: &str) -> Result<PathBuf> {
    gpuledger_model::durable::replace_file(path, text.as_bytes()).map_err(Error::io(path))?;
    Ok(path.to_path_buf())
}

/// Prices `input` under `book`, revises each account's invoice against its latest revision in
/// `month_dir/<account>/rN.{json,csv,html}` (a new revision only when something changed), and
/// writes `focus-YYYY-MM.csv` and `compare-YYYY-MM.{csv,md}`. `only` limits the revision to
/// one account; the exports always cover every account's latest revision.
pub fn bill_month(
    month_dir: &Path,
    period: &Period,
    input: &BillingInput,
    book: &PriceBook,
    only: Option<&str>,
    issuer: &str,
) -> Result<MonthOutput> {
    let fresh = charge(period, input, book, None)?;
    let per_model: Vec<Vec<Invoice>> = BillingModel::ALL
        .iter()
        .map(|m| charge(period, input, book, Some(*m)))
        .collect::<Result<_>>()?;
    std::fs::create_dir_all(month_dir).map_err(Error::io(month_dir))?;
    let mut accounts: BTreeSet<String> = fresh.iter().map(|i| i.account.to_string()).collect();
    for e in std::fs::read_dir(month_dir).map_err(Error::io(month_dir))? {
        let e = e.map_err(Error::io(month_dir))?;
        if e.file_type().map_err(Error::io(e.path()))?.is_dir() {
            accounts.insert(e.file_name().to_string_lossy().into_owned());
        }
    }
    let mut latest = Vec::new();
    let mut revised = Vec::new();
    let mut files = Vec::new();
    for account in accounts {
        let dir = month_dir.join(&account);
        let previous = latest_revision(&dir)?;
        if only.is_some_and(|o| o != account) {
            latest.extend(previous);
            continue;
        }
        let current = match fresh.iter().find(|i| i.account.as_str() == account) {
            Some(i) => i.clone(),
            None => empty_invoice(period, &account, book, previous.as_ref())?,
        };
        let before = previous.as_ref().map(|p| p.revision);
        let inv = revise(previous, current);
        if before != Some(inv.revision) {
            std::fs::create_dir_all(&dir).map_err(Error::io(&dir))?;
            let stem = dir.join(format!("r{}", inv.revision));
            files.push(write_file(
                &stem.with_extension("json"),
                &invoice_json(&inv),
            )?);
            files.push(write_file(&stem.with_extension("csv"), &invoice_csv(&inv))?);
            files.push(write_file(
                &stem.with_extension("html"),
                &invoice_html(&inv),
            )?);
            revised.push(account);
        }
        latest.push(inv);
    }
    files.push(write_file(
        &month_dir.join(format!("focus-{}.csv", period.name)),
        &focus_csv(&latest, issuer),
    )?);
    let comparison = Comparison::new(&latest, [&per_model[0], &per_model[1], &per_model[2]]);
    files.push(write_file(
        &month_dir.join(format!("compare-{}.csv", period.name)),
        &comparison.csv(),
    )?);
    files.push(write_file(
        &month_dir.join(format!("compare-{}.md", period.name)),
        &comparison.markdown(),
    )?);
    Ok(MonthOutput {
        invoices: latest,
        revised,
        files,
        comparison,
    })
}

/// One account's invoice of one month as kept on disk: its latest revision, and which
/// revisions there are.
#[derive(Clone, Debug, PartialEq)]
pub struct InvoiceOnFile {
    pub latest: Invoice,
    /// Every revision number on file, oldest first.
    pub revisions: Vec<u32>,
}

/// The revision numbers `rN.json` in an account's directory, oldest first.
fn revisions_in(dir: &Path) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(Error::io(dir))? {
        let name = e.map_err(Error::io(dir))?.file_name();
        if let Some(n) = name
            .to_str()
            .and_then(|n| n.strip_prefix('r'))
            .and_then(|n| n.strip_suffix(".json"))
            .and_then(|n| n.parse::<u32>().ok())
        {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The subdirectories of `dir` whose names `keep` accepts, sorted; none when `dir` is missing.
fn subdirectories(dir: &Path, keep: impl Fn(&str) -> bool) -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::io(dir)(e)),
    };
    let mut out = Vec::new();
    for e in entries {
        let e = e.map_err(Error::io(dir))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().map_err(Error::io(e.path()))?.is_dir() && keep(&name) {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// Every invoice under `root` (`<month>/<account>/rN.json`, as [`bill_month`] writes it) of
/// the accounts `covers` accepts, the latest month first. Directories that are not a month or
/// an account id are not invoices and are passed over.
pub fn invoices_on_file(root: &Path, covers: impl Fn(&str) -> bool) -> Result<Vec<InvoiceOnFile>> {
    let mut out = Vec::new();
    let months = subdirectories(root, |m| Period::month(m).is_ok())?;
    for month in months.iter().rev() {
        let month_dir = root.join(month);
        let accounts = subdirectories(&month_dir, |a| AccountId::new(a).is_ok() && covers(a))?;
        for account in accounts {
            let dir = month_dir.join(&account);
            if let Some(latest) = latest_revision(&dir)? {
                out.push(InvoiceOnFile {
                    latest,
                    revisions: revisions_in(&dir)?,
                });
            }
        }
    }
    Ok(out)
}

/// One account's invoice of `month` under `root`: revision `revision`, or the latest when
/// `None`; `Ok(None)` when there is none. `month` and `account` come from requests: anything
/// but a month `YYYY-MM` and an account id is refused before a path is built from it.
pub fn invoice_on_file(
    root: &Path,
    month: &str,
    account: &str,
    revision: Option<u32>,
) -> Result<Option<Invoice>> {
    let period = Period::month(month)?;
    let account =
        AccountId::new(account).map_err(|e| Error::Input(format!("account `{account}`: {e}")))?;
    let dir = root.join(&period.name).join(account.as_str());
    let Some(n) = revision else {
        return latest_revision(&dir);
    };
    let path = dir.join(format!("r{n}.json"));
    match std::fs::read_to_string(&path) {
        Ok(text) => invoice_from_json(&text)
            .map(Some)
            .map_err(|e| Error::Input(format!("reading {}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(&path)(e)),
    }
}

/// An invoice with no lines, for an account whose earlier revision billed usage that is gone.
fn empty_invoice(
    period: &Period,
    account: &str,
    book: &PriceBook,
    previous: Option<&Invoice>,
) -> Result<Invoice> {
    let account = AccountId::new(account)
        .map_err(|e| Error::Input(format!("invoice directory `{account}`: {e}")))?;
    Ok(Invoice {
        invoice_id: Invoice::id_for(&period.name, &account, 1),
        period: period.name.clone(),
        period_start: period.start,
        period_end: period.end,
        currency: book.currency(),
        billing_model: previous.and_then(|p| p.billing_model),
        revision: 1,
        lines: Vec::new(),
        daily_gpu_seconds: Vec::new(),
        notes: Default::default(),
        account,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::UsageHour;
    use gpuledger_model::{GpuModel, JobId, NodeId};

    fn book() -> PriceBook {
        PriceBook::from_toml_str(
            include_str!("../../examples/seed-prices.toml"),
            "seed-prices.toml",
        )
        .unwrap()
    }

    /// `gpu_seconds` of job 7 on a June weekday morning (standard band), for `account`.
    fn input(account: &str, gpu_seconds: i64) -> BillingInput {
        BillingInput {
            usage: vec![UsageHour {
                account: AccountId::new(account).unwrap(),
                project: None,
                job_id: Some(JobId::new("7").unwrap()),
                node: NodeId::new("gpu001").unwrap(),
                gpu_model: GpuModel::H100Sxm,
                // 2026-06-02 02:00 UTC, 10:00 in Shanghai.
                hour_start: 1_780_365_600,
                gpu_seconds,
                quarter_seconds: None,
                mfu_bp: None,
            }],
            ..BillingInput::default()
        }
    }

    fn revisions(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn invoices_on_file_are_listed_per_scope_and_read_by_revision() {
        let dir = tempfile::tempdir().unwrap();
        let period = Period::month("2026-06").unwrap();
        let month = dir.path().join("2026-06");
        bill_month(
            &month,
            &period,
            &input("team-a", 7200),
            &book(),
            None,
            "seed",
        )
        .unwrap();
        bill_month(
            &month,
            &period,
            &input("team-a", 3600),
            &book(),
            None,
            "seed",
        )
        .unwrap();
        let mut b = input("team-b", 3600);
        b.usage.extend(input("team-a", 3600).usage);
        bill_month(&month, &period, &b, &book(), Some("team-b"), "seed").unwrap();
        // Not invoices: a stray directory and a file.
        std::fs::create_dir_all(dir.path().join("scratch/team-a")).unwrap();
        std::fs::write(dir.path().join("notes.txt"), "x").unwrap();

        let all = invoices_on_file(dir.path(), |_| true).unwrap();
        let listed: Vec<(&str, u32, Vec<u32>)> = all
            .iter()
            .map(|i| {
                (
                    i.latest.account.as_str(),
                    i.latest.revision,
                    i.revisions.clone(),
                )
            })
            .collect();
        assert_eq!(listed, [("team-a", 2, vec![1, 2]), ("team-b", 1, vec![1])]);
        let mine = invoices_on_file(dir.path(), |a| a == "team-b").unwrap();
        assert_eq!(mine.len(), 1);
        assert_eq!(mine[0].latest.account.as_str(), "team-b");

        let r1 = invoice_on_file(dir.path(), "2026-06", "team-a", Some(1))
            .unwrap()
            .unwrap();
        let latest = invoice_on_file(dir.path(), "2026-06", "team-a", None)
            .unwrap()
            .unwrap();
        assert_eq!((r1.revision, latest.revision), (1, 2));
        assert_ne!(r1.total(), latest.total());
        assert!(invoice_on_file(dir.path(), "2026-06", "team-a", Some(9))
            .unwrap()
            .is_none());
        assert!(invoice_on_file(dir.path(), "2026-07", "team-a", None)
            .unwrap()
            .is_none());
        // A path from a request is checked before it is joined.
        for (m, a) in [
            ("..", "team-a"),
            ("2026-06", "../2026-06"),
            ("2026-06/..", "x"),
            ("2026-13", "team-a"),
            ("2026-06", "team-a/../../etc"),
        ] {
            assert!(invoice_on_file(dir.path(), m, a, None).is_err(), "{m} {a}");
        }
    }

    #[test]
    fn a_revision_is_written_only_when_the_bill_changes_and_corrects_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let month = dir.path().join("2026-06");
        let period = Period::month("2026-06").unwrap();
        let run = |input: &BillingInput, only: Option<&str>| {
            bill_month(&month, &period, input, &book(), only, "seed").unwrap()
        };
        let first = run(&input("team-a", 7200), None);
        assert_eq!(first.revised, ["team-a"]);
        assert_eq!(
            revisions(&month.join("team-a")),
            ["r1.csv", "r1.html", "r1.json"]
        );
        assert!(month.join("focus-2026-06.csv").exists());
        assert!(month.join("compare-2026-06.md").exists());
        let total = |out: &MonthOutput| out.invoices[0].total().to_string();
        assert_eq!(total(&first), "20.00");

        let again = run(&input("team-a", 7200), None);
        assert!(again.revised.is_empty(), "nothing changed");
        assert_eq!(again.invoices[0].revision, 1);

        let late = run(&input("team-a", 10800), None);
        assert_eq!(late.revised, ["team-a"]);
        assert_eq!(late.invoices[0].revision, 2);
        assert_eq!(total(&late), "30.00");
        assert_eq!(
            latest_revision(&month.join("team-a"))
                .unwrap()
                .unwrap()
                .revision,
            2
        );

        // Another account's run leaves team-a's revisions as they are, and lists them.
        let other = run(&input("team-b", 3600), Some("team-b"));
        assert_eq!(other.revised, ["team-b"]);
        assert_eq!(revisions(&month.join("team-a")).len(), 6);
        assert_eq!(other.invoices.len(), 2);

        // Usage that is gone is corrected to nothing.
        let gone = run(&BillingInput::default(), Some("team-a"));
        let team_a = gone
            .invoices
            .iter()
            .find(|i| i.account.as_str() == "team-a")
            .unwrap();
        assert_eq!(
            (team_a.revision, team_a.total().to_string()),
            (3, "0.00".into())
        );
    }

    #[test]
    fn a_reservations_file_is_read_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert!(reservations_in(dir.path()).unwrap().is_empty());
        std::fs::write(
            dir.path().join(BILLED_RESERVATIONS_FILE),
            "[[reservations]]\nid = \"r\"\naccount = \"team-e\"\ngpu_model = \"h100-sxm\"\ngpus = 16\n\
             start = \"2026-06-10T08:00:00Z\"\nend = \"2026-06-11T08:00:00Z\"\n",
        )
        .unwrap();
        let read = reservations_in(dir.path()).unwrap();
        assert_eq!((read[0].gpus, read[0].end - read[0].start), (16, 86_400));
        std::fs::write(
            dir.path().join(BILLED_RESERVATIONS_FILE),
            "[[reservations]]\nid = 1\n",
        )
        .unwrap();
        let err = reservations_in(dir.path()).unwrap_err().to_string();
        assert!(err.contains("reservations.toml:2"), "{err}");
    }
}
