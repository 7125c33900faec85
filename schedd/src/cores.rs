//! Which of this host's CPU cores each running job is bound to (`--job-cpu-bind cores`), as
//! Slurm's `ConstrainCores` with `--cpu-bind=cores`: a job gets whole cores of its own, so its
//! threads do not crowd other jobs' caches, and `nproc`, `os.cpu_count()` in a cgroup-aware
//! runtime, OpenMP and PyTorch's data loaders size their thread pools to what it has rather
//! than to the whole node (with a CPU quota alone they would see every core and be throttled).
//!
//! The scheduler places GPUs, not cores: a job gets free cores where there are enough, those
//! local to its GPUs first (on the GPUs' NUMA node, as the driver and the PCI bus say: a
//! two-socket server's GPUs 0-3 on one socket, 4-7 on the other; Slurm's `gres.conf` `Cores=`);
//! where there are not enough (more CPUs per GPU were given than the host has per GPU), it
//! shares the cores fewest jobs hold, and the launch says so. The book is rebuilt from the
//! jobs' cgroups when a restarted scheduler adopts them.

use std::collections::HashMap;
use std::path::Path;

use gpuledger_model::JobId;

/// The cores jobs hold.
#[derive(Debug, Default)]
pub(crate) struct CoreBook {
    online: Vec<u32>,
    held: HashMap<JobId, Vec<u32>>,
}

impl CoreBook {
    pub(crate) fn new(online: Vec<u32>) -> Self {
        CoreBook {
            online,
            held: HashMap::new(),
        }
    }

    /// `count` cores for `job` (at least one, at most the host's): free ones first, those in
    /// `local` (its GPUs' cores) before others, lowest numbers first, then those fewest jobs
    /// hold; and whether it had to share.
    pub(crate) fn take(&mut self, job: &JobId, count: usize, local: &[u32]) -> (Vec<u32>, bool) {
        self.held.remove(job);
        let count = count.clamp(1, self.online.len().max(1));
        let mut by_load: Vec<(usize, bool, u32)> = self
            .online
            .iter()
            .map(|&core| (self.holders(core), !local.contains(&core), core))
            .collect();
        by_load.sort_unstable();
        let mut cores: Vec<u32> = by_load.iter().take(count).map(|&(_, _, c)| c).collect();
        let shared = by_load
            .iter()
            .take(count)
            .any(|&(holders, _, _)| holders > 0);
        cores.sort_unstable();
        self.held.insert(job.clone(), cores.clone());
        (cores, shared)
    }

    /// A job adopted after a restart, with the cores its cgroup holds.
    pub(crate) fn adopt(&mut self, job: &JobId, cores: Vec<u32>) {
        self.held.insert(job.clone(), cores);
    }

    pub(crate) fn release(&mut self, job: &JobId) {
        self.held.remove(job);
    }

    fn holders(&self, core: u32) -> usize {
        self.held.values().filter(|c| c.contains(&core)).count()
    }
}

/// The cores a cpu list names (`0-3,8,10-11`, as `cpuset.cpus` and
/// `/sys/devices/system/cpu/online` write them); `None` when it is not one.
pub(crate) fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cores = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((from, to)) => {
                let (from, to): (u32, u32) = (from.parse().ok()?, to.parse().ok()?);
                if to < from || to - from > 65_536 {
                    return None;
                }
                cores.extend(from..=to);
            }
            None => cores.push(part.parse().ok()?),
        }
    }
    Some(cores)
}

/// Cores as a cpu list, ranges joined (`0-3,8`).
pub(crate) fn cpu_list(cores: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cores.len() {
        let start = cores[i];
        let mut end = start;
        while i + 1 < cores.len() && cores[i + 1] == end + 1 {
            i += 1;
            end = cores[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(",")
}

/// The cores local to each GPU, by its index (the driver's minor number): the driver lists each
/// GPU under `ROOT/proc/driver/nvidia/gpus/<PCI address>/information` (`Device Minor: N`), and
/// the PCI bus gives the device's local cores (`ROOT/sys/bus/pci/devices/<address>/local_cpulist`).
/// Empty without the driver: cores are then chosen without regard to GPUs.
pub(crate) fn gpu_local_cores(root: &Path) -> HashMap<u32, Vec<u32>> {
    let gpus = root.join("proc/driver/nvidia/gpus");
    let Ok(entries) = std::fs::read_dir(&gpus) else {
        return HashMap::new();
    };
    let mut local = HashMap::new();
    for entry in entries.flatten() {
        let address = entry.file_name();
        let minor = std::fs::read_to_string(entry.path().join("information"))
            .ok()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    let (key, value) = l.split_once(':')?;
                    (key.trim() == "Device Minor").then(|| value.trim().parse::<u32>().ok())?
                })
            });
        let cores = std::fs::read_to_string(
            root.join("sys/bus/pci/devices")
                .join(&address)
                .join("local_cpulist"),
        )
        .ok()
        .and_then(|t| parse_cpu_list(&t));
        if let (Some(minor), Some(cores)) = (minor, cores) {
            local.insert(minor, cores);
        }
    }
    local
}

/// This host's online cores.
pub(crate) fn online_cores() -> Vec<u32> {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|t| parse_cpu_list(&t))
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            (0..n as u32).collect()
        })
}

/// Writes what the NVIDIA driver and the PCI bus say of a GPU under `root`, in their formats:
/// its minor number, its PCI address and the cores local to it (for tests).
#[cfg(test)]
pub(crate) fn describe_gpu(root: &Path, minor: u32, address: &str, cores: &str) {
    let gpu = root.join("proc/driver/nvidia/gpus").join(address);
    std::fs::create_dir_all(&gpu).unwrap();
    std::fs::write(
        gpu.join("information"),
        format!("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 185\nDevice Minor: \t {minor}\nBus Location: \t {address}\n"),
    )
    .unwrap();
    let pci = root.join("sys/bus/pci/devices").join(address);
    std::fs::create_dir_all(&pci).unwrap();
    std::fs::write(pci.join("local_cpulist"), cores).unwrap();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_read_and_write_back() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        for wrong in ["a", "3-1", "1-", "0-999999"] {
            assert_eq!(parse_cpu_list(wrong), None, "{wrong}");
        }
    }

    #[test]
    fn jobs_get_free_cores_first_then_share_the_least_held() {
        let mut book = CoreBook::new((0..8).collect());
        let id = |s: &str| JobId::new(s).unwrap();
        assert_eq!(book.take(&id("a"), 3, &[]), (vec![0, 1, 2], false));
        assert_eq!(book.take(&id("b"), 4, &[]), (vec![3, 4, 5, 6], false));
        // One free core left: it and the least held (each held once) after it.
        assert_eq!(book.take(&id("c"), 2, &[]), (vec![0, 7], true));
        book.release(&id("a"));
        assert_eq!(book.take(&id("d"), 2, &[]), (vec![1, 2], false));
        book.adopt(&id("e"), vec![3]);
        assert!(book.take(&id("f"), 1, &[]).1, "every core is held now");
        assert_eq!(
            book.take(&id("g"), 99, &[]).0.len(),
            8,
            "never more than the host's"
        );
    }

    #[test]
    fn a_job_gets_its_gpus_cores_first() {
        // A two-socket server as the driver and the PCI bus describe it: GPUs 0 and 1 on
        // cores 0-3, GPUs 2 and 3 on cores 4-7.
        let root = tempfile::tempdir().unwrap();
        for (minor, address, cores) in [
            (0, "0000:18:00.0", "0-3"),
            (1, "0000:2a:00.0", "0-3"),
            (2, "0000:9a:00.0", "4-7\n"),
            (3, "0000:ab:00.0", "4-7\n"),
        ] {
            describe_gpu(root.path(), minor, address, cores);
        }
        let local = gpu_local_cores(root.path());
        assert_eq!(local.len(), 4);
        assert_eq!(local[&2], vec![4, 5, 6, 7]);
        assert!(gpu_local_cores(&root.path().join("none")).is_empty());

        let mut book = CoreBook::new((0..8).collect());
        let id = |s: &str| JobId::new(s).unwrap();
        assert_eq!(book.take(&id("on-2"), 2, &local[&2]), (vec![4, 5], false));
        assert_eq!(book.take(&id("on-0"), 2, &local[&0]), (vec![0, 1], false));
        assert_eq!(book.take(&id("on-3"), 2, &local[&3]), (vec![6, 7], false));
        // Its socket's cores all held: free ones of the other socket, not shared ones.
        assert_eq!(
            book.take(&id("on-2-again"), 2, &local[&2]),
            (vec![2, 3], false)
        );
    }
}
