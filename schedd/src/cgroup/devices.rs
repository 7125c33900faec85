//! GPU device files and the v1 `devices` controller: a job's cgroup there denies the device
//! files (`/dev/nvidiaN`, a character device of the driver's major number) of the GPUs it was
//! not given, as Slurm's `ConstrainDevices=yes`. Opening one fails with `EPERM` whatever the
//! file's mode; the control files (`nvidiactl`, `nvidia-uvm`) and every other device stay
//! reachable.
//!
//! A GPU's index is taken to be the number in its file name, which is the driver's minor
//! number; NVML numbers GPUs by PCI bus order, which is the same on the usual servers (check
//! with `nvidia-smi -q | grep -i minor`). Under cgroup v2 the same devices are denied by a BPF
//! program instead (`bpf`).

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// One GPU's device file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    /// N of `nvidiaN`.
    pub index: u32,
    pub major: u64,
    pub minor: u64,
}

/// The GPU device files in `dir` (`/dev`): character devices named `nvidia` and a number, in
/// index order.
pub fn gpu_devices(dir: &Path) -> Vec<GpuDevice> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<GpuDevice> = entries
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let name = entry.file_name();
            let index = name.to_str()?.strip_prefix("nvidia")?.parse().ok()?;
            let meta = fs::metadata(entry.path()).ok()?;
            meta.file_type().is_char_device().then(|| GpuDevice {
                index,
                major: nix::sys::stat::major(meta.rdev()),
                minor: nix::sys::stat::minor(meta.rdev()),
            })
        })
        .collect();
    found.sort_by_key(|d| d.index);
    found
}

/// The devices of `all` that are not among `gpus`.
pub(super) fn others(all: &[GpuDevice], gpus: &[u32]) -> Vec<GpuDevice> {
    all.iter()
        .filter(|d| !gpus.contains(&d.index))
        .copied()
        .collect()
}

/// Creates the job's cgroup in the `devices` controller, denies `denied` there, then moves
/// `pid` into it (so the rules hold before the job's command exists).
pub(super) fn confine(dir: &Path, denied: &[GpuDevice], pid: u32) -> io::Result<()> {
    fs::create_dir_all(dir)?;
    for d in denied {
        fs::write(
            dir.join("devices.deny"),
            format!("c {}:{} rwm", d.major, d.minor),
        )?;
    }
    super::move_into(dir, pid)
}
