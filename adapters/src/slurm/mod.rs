//! Slurm: its associations ([`assoc`]), its job records ([`jobs`]) and its queue as JSON
//! ([`queue`]), and the value formats they share ([`tres`], [`duration`], [`time`]).

pub mod assoc;
pub mod jobs;
pub mod queue;

use std::collections::BTreeMap;

/// A TRES string (`cpu=4,mem=16G,node=1,gres/gpu=8,gres/gpu:h100=8`) as name -> value text.
pub fn tres(text: &str) -> BTreeMap<String, String> {
    text.split(',')
        .filter_map(|kv| kv.trim().split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect()
}

/// GPUs in a TRES string: `gres/gpu`, else the sum of the typed `gres/gpu:<type>` entries.
pub fn tres_gpus(text: &str) -> Option<u64> {
    let t = tres(text);
    if let Some(v) = t.get("gres/gpu") {
        return v.parse().ok();
    }
    let typed: Vec<u64> = t
        .iter()
        .filter(|(k, _)| k.starts_with("gres/gpu:"))
        .filter_map(|(_, v)| v.parse().ok())
        .collect();
    (!typed.is_empty()).then(|| typed.iter().sum())
}

/// GPUs in a GRES request as `squeue %b` or `scontrol` print it: `gres:gpu:h100:3`,
/// `gres/gpu:3`, `gpu:3`, `gpu:h100:2(IDX:0-1)`, several comma-separated.
pub fn gres_gpus(text: &str) -> Option<u64> {
    let mut total = None;
    for part in text.split(',') {
        let part = part.split('(').next().unwrap_or("").trim();
        let part = part
            .strip_prefix("gres:")
            .or_else(|| part.strip_prefix("gres/"))
            .unwrap_or(part);
        let Some(rest) = part.strip_prefix("gpu") else {
            continue;
        };
        let count = rest.rsplit(':').next().and_then(|n| n.parse::<u64>().ok());
        let count = match (rest.is_empty(), count) {
            (true, _) => Some(1),
            (false, c) => c,
        };
        if let Some(c) = count {
            total = Some(total.unwrap_or(0u64).saturating_add(c));
        }
    }
    total
}

/// The `sinfo` format [`cluster_gpus`] reads: each node and its GRES, one line per node and
/// partition.
pub const SINFO_GPUS_ARGS: [&str; 3] = ["--noheader", "--Node", "--format=%N|%G"];

/// The cluster's GPUs from `sinfo` run with [`SINFO_GPUS_ARGS`]: each node's GPUs (its GRES,
/// `gpu:h100:8(S:0-1)`, `(null)` for none) counted once, whatever the partitions it is in. A
/// line without a node and its GRES is an error naming its line.
pub fn cluster_gpus(text: &str, source: &str) -> Result<u64, String> {
    let mut nodes: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let Some((node, gres)) = line.split_once('|') else {
            return Err(format!(
                "{source} line {}: expected `NODE|GRES`, read `{line}`",
                i + 1
            ));
        };
        let node = node.trim();
        if node.is_empty() {
            return Err(format!("{source} line {}: no node name", i + 1));
        }
        nodes.insert(node, gres_gpus(gres.trim()).unwrap_or(0));
    }
    nodes
        .values()
        .try_fold(0u64, |sum, gpus| sum.checked_add(*gpus))
        .ok_or_else(|| format!("{source}: the nodes' GPUs add up past {}", u64::MAX))
}

/// A Slurm duration in seconds: minutes (`90`), `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`,
/// `D-HH:MM:SS`; `UNLIMITED`, `INFINITE` and `Partition_Limit` are `None`.
pub fn duration(text: &str) -> Option<Result<u64, String>> {
    let t = text.trim();
    if t.is_empty()
        || t.eq_ignore_ascii_case("unlimited")
        || t.eq_ignore_ascii_case("infinite")
        || t.eq_ignore_ascii_case("partition_limit")
    {
        return None;
    }
    let bad = || format!("`{t}` is not a Slurm duration (minutes, [D-]HH:MM:SS)");
    let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
    let (days, rest) = match t.split_once('-') {
        Some((d, r)) => (Some(d), r),
        None => (None, t),
    };
    let parts: Vec<&str> = rest.split(':').collect();
    let secs = (|| -> Result<u64, String> {
        let d = days.map(num).transpose()?.unwrap_or(0) * 86_400;
        Ok(match (days.is_some(), parts.as_slice()) {
            (false, [m]) => num(m)? * 60,
            (false, [m, s]) => num(m)? * 60 + num(s)?,
            (_, [h, m, s]) => d + num(h)? * 3600 + num(m)? * 60 + num(s)?,
            (true, [h]) => d + num(h)? * 3600,
            (true, [h, m]) => d + num(h)? * 3600 + num(m)? * 60,
            _ => return Err(bad()),
        })
    })();
    Some(secs)
}

/// The time zone Slurm's timestamps are written in: the local time of the host that prints
/// them (slurmctld's and the commands'), or UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Zone {
    Utc,
    Local,
}

/// A Slurm timestamp (`2026-12-01T08:00:01`, in `zone`) in Unix milliseconds; `Unknown`,
/// `None` and empty are `None`.
pub fn time_ms(text: &str, zone: Zone) -> Option<Result<i64, String>> {
    let t = text.trim();
    if t.is_empty()
        || t.eq_ignore_ascii_case("unknown")
        || t.eq_ignore_ascii_case("none")
        || t == "N/A"
    {
        return None;
    }
    let naive = match chrono::NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S") {
        Ok(d) => d,
        Err(_) => {
            return Some(Err(format!(
                "`{t}` is not a Slurm time (YYYY-MM-DDTHH:MM:SS)"
            )))
        }
    };
    Some(match zone {
        Zone::Utc => Ok(naive.and_utc().timestamp_millis()),
        // In a daylight-saving fold the earlier instant is taken.
        Zone::Local => chrono::TimeZone::from_local_datetime(&chrono::Local, &naive)
            .earliest()
            .map(|t| t.timestamp_millis())
            .ok_or_else(|| format!("`{t}` does not exist in the local time zone")),
    })
}

/// Expands a Slurm host list: `gpu[001-003,007],login1` -> gpu001 gpu002 gpu003 gpu007 login1.
pub fn hostlist(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    let bytes = text.as_bytes();
    let mut pieces = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        match b {
            b'[' => depth += 1,
            b']' => depth -= 1,
            b',' if depth == 0 => {
                pieces.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    pieces.push(&text[start..]);
    for piece in pieces.into_iter().map(str::trim).filter(|p| !p.is_empty()) {
        let (Some(open), Some(close)) = (piece.find('['), piece.rfind(']')) else {
            // What Slurm prints where no node is assigned yet.
            if !matches!(piece, "(null)" | "None" | "None assigned") {
                out.push(piece.to_owned());
            }
            continue;
        };
        let (prefix, ranges, suffix) =
            (&piece[..open], &piece[open + 1..close], &piece[close + 1..]);
        for range in ranges.split(',') {
            match range.split_once('-') {
                Some((a, b)) => {
                    let width = a.len();
                    if let (Ok(a), Ok(b)) = (a.parse::<u64>(), b.parse::<u64>()) {
                        for n in a..=b {
                            out.push(format!("{prefix}{n:0width$}{suffix}"));
                        }
                    }
                }
                None => out.push(format!("{prefix}{range}{suffix}")),
            }
        }
    }
    out
}

/// Expands an index list: `0-2,5` -> 0 1 2 5.
pub fn index_list(text: &str) -> Vec<u16> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.parse::<u16>(), b.parse::<u16>()) {
                    out.extend(a..=b);
                }
            }
            None => out.extend(part.parse::<u16>().ok()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_s_gpus_count_each_node_once_whatever_its_partitions() {
        let text = "gpu001|gpu:h100:8(S:0-1)\ngpu001|gpu:h100:8(S:0-1)\n\
                    gpu002|gpu:a100:4,gpu:h100:4\ncpu001|(null)\n\n";
        assert_eq!(cluster_gpus(text, "sinfo"), Ok(16));
        assert_eq!(cluster_gpus("", "sinfo"), Ok(0));
        let e = cluster_gpus("gpu001|gpu:8\ngpu002 gpu:8\n", "sinfo").unwrap_err();
        assert!(e.contains("sinfo line 2") && e.contains("NODE|GRES"), "{e}");
        let e = cluster_gpus("|gpu:8\n", "sinfo").unwrap_err();
        assert!(e.contains("line 1: no node name"), "{e}");
        let huge = format!("a|gpu:{}\nb|gpu:1\n", u64::MAX);
        assert!(cluster_gpus(&huge, "sinfo")
            .unwrap_err()
            .contains("add up past"));
        assert_eq!(
            gres_gpus(&format!("gpu:{0},gpu:{0}", u64::MAX)),
            Some(u64::MAX)
        );
    }

    #[test]
    fn tres_and_gres_give_gpus() {
        assert_eq!(
            tres_gpus("cpu=16,mem=64G,node=1,billing=16,gres/gpu=4"),
            Some(4)
        );
        assert_eq!(tres_gpus("cpu=16,gres/gpu:h100=2,gres/gpu:a100=1"), Some(3));
        assert_eq!(tres_gpus("cpu=16,node=1"), None);
        assert_eq!(gres_gpus("gres:gpu:h100:3"), Some(3));
        assert_eq!(gres_gpus("gres/gpu:2"), Some(2));
        assert_eq!(gres_gpus("gpu:h100:3(IDX:0-2)"), Some(3));
        assert_eq!(gres_gpus("gpu"), Some(1));
        assert_eq!(gres_gpus("N/A"), None);
        assert_eq!(gres_gpus("(null)"), None);
    }

    #[test]
    fn durations_times_and_lists_parse_as_slurm_writes_them() {
        assert_eq!(duration("90"), Some(Ok(5400)));
        assert_eq!(duration("2-00:00:00"), Some(Ok(172_800)));
        assert_eq!(duration("1-12"), Some(Ok(129_600)));
        assert_eq!(duration("04:30:00"), Some(Ok(16_200)));
        assert_eq!(duration("05:30"), Some(Ok(330)));
        assert_eq!(duration("UNLIMITED"), None);
        assert!(duration("soon").unwrap().is_err());
        assert_eq!(
            time_ms("2026-12-01T08:00:01", Zone::Utc),
            Some(Ok(1_796_112_001_000))
        );
        assert_eq!(time_ms("Unknown", Zone::Utc), None);
        assert_eq!(
            hostlist("gpu[001-003,007],login1"),
            ["gpu001", "gpu002", "gpu003", "gpu007", "login1"]
        );
        assert_eq!(hostlist("node1"), ["node1"]);
        assert!(hostlist("None assigned").is_empty());
        assert_eq!(index_list("0-2,5"), [0, 1, 2, 5]);
    }
}
