//! The cgroup v2 device filter: a BPF program of type `BPF_PROG_TYPE_CGROUP_DEVICE` attached to
//! a job's cgroup, which the kernel runs at every open (and `mknod`) of a device by a process of
//! the cgroup. It denies the character devices of the GPUs the job was not given and allows
//! everything else, as Slurm's `cgroup/v2` plugin does for `ConstrainDevices=yes` (cgroup v2 has
//! no `devices.deny` file; a BPF program is its only device control).
//!
//! The program is a handful of instructions written here, not compiled from C: it compares the
//! device's type, major and minor numbers with each denied GPU's. Loading and attaching it are
//! two `bpf(2)` calls, the only unsafe code of the workspace (`bpf` below); everything they are
//! given is built and checked in safe code first.
//!
//! It is attached with `BPF_F_ALLOW_MULTI`: the programs of a cgroup and of its ancestors all
//! run and a device is allowed only if every one allows it, so a site's own policy (systemd's
//! `DevicePolicy`, a container runtime's) still holds, and nothing attached below a job's
//! cgroup can allow what its filter denies.
#![allow(unsafe_code)]

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::libc;

use super::GpuDevice;

/// `bpf(2)` commands.
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_PROG_ATTACH: libc::c_int = 8;
/// `BPF_PROG_TYPE_CGROUP_DEVICE`.
const PROG_TYPE_CGROUP_DEVICE: u32 = 15;
/// `BPF_CGROUP_DEVICE`, the attach type.
const ATTACH_CGROUP_DEVICE: u32 = 6;
const BPF_F_ALLOW_MULTI: u32 = 2;
/// `BPF_DEVCG_DEV_CHAR`: the low 16 bits of the context's `access_type`.
const DEVICE_CHAR: i32 = 2;
/// At most this many devices are denied by one program (a node has at most 64 GPUs): each
/// takes four instructions and a jump must reach past them all.
pub(super) const MAX_DENIED: usize = 1024;

/// One BPF instruction (`struct bpf_insn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Insn {
    code: u8,
    /// `dst` in the low four bits, `src` in the high four.
    regs: u8,
    off: i16,
    imm: i32,
}

impl Insn {
    /// `dst = *(u32 *)(src + off)`.
    fn load_word(dst: u8, src: u8, off: i16) -> Self {
        Insn {
            code: 0x61,
            regs: (src << 4) | dst,
            off,
            imm: 0,
        }
    }
    /// `(u32) dst &= imm`.
    fn and32(dst: u8, imm: i32) -> Self {
        Insn {
            code: 0x54,
            regs: dst,
            off: 0,
            imm,
        }
    }
    /// `if dst != imm goto pc + 1 + off`.
    fn jump_unless(dst: u8, imm: i32, off: i16) -> Self {
        Insn {
            code: 0x55,
            regs: dst,
            off,
            imm,
        }
    }
    /// `dst = imm`.
    fn mov(dst: u8, imm: i32) -> Self {
        Insn {
            code: 0xb7,
            regs: dst,
            off: 0,
            imm,
        }
    }
    fn exit() -> Self {
        Insn {
            code: 0x95,
            regs: 0,
            off: 0,
            imm: 0,
        }
    }
    fn to_bytes(self) -> [u8; 8] {
        let mut out = [0; 8];
        out[0] = self.code;
        out[1] = self.regs;
        out[2..4].copy_from_slice(&self.off.to_le_bytes());
        out[4..8].copy_from_slice(&self.imm.to_le_bytes());
        out
    }
}

/// The program denying the character devices `denied` (returns 0 for them, 1 for every other
/// device). The context (`struct bpf_cgroup_dev_ctx`, in r1) is `access_type` (the access in the
/// high 16 bits, the device type in the low), `major` and `minor`, each a `u32`.
fn program(denied: &[GpuDevice]) -> io::Result<Vec<Insn>> {
    if denied.len() > MAX_DENIED {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{} devices to deny: at most {MAX_DENIED} in one filter",
                denied.len()
            ),
        ));
    }
    let number = |n: u64, what: &str| {
        i32::try_from(n).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("device {what} number {n} out of range"),
            )
        })
    };
    let to_allow = i16::try_from(4 * denied.len()).expect("bounded by MAX_DENIED");
    let mut insns = vec![
        Insn::load_word(2, 1, 0),
        Insn::and32(2, 0xffff),
        Insn::load_word(3, 1, 4),
        Insn::load_word(4, 1, 8),
        Insn::jump_unless(2, DEVICE_CHAR, to_allow),
    ];
    for device in denied {
        insns.extend([
            Insn::jump_unless(3, number(device.major, "major")?, 3),
            Insn::jump_unless(4, number(device.minor, "minor")?, 2),
            Insn::mov(0, 0),
            Insn::exit(),
        ]);
    }
    insns.extend([Insn::mov(0, 1), Insn::exit()]);
    Ok(insns)
}

/// Attaches a filter denying `denied` to the cgroup `dir`; processes moved into it afterwards
/// (and those already there) cannot open those devices, whatever the files' modes.
pub(super) fn deny(dir: &Path, denied: &[GpuDevice]) -> io::Result<()> {
    let program = load(&program(denied)?)?;
    attach(dir, &program)
}

/// Whether this kernel and this process can filter devices of cgroups under `parent`: a
/// program allowing everything is attached to a cgroup made for the trial, which is removed.
pub(super) fn probe(parent: &Path) -> io::Result<()> {
    lift_memlock_limit();
    let trial = parent.join(format!("device-filter-probe-{}", std::process::id()));
    fs::create_dir_all(&trial)?;
    let attached = load(&program(&[])?).and_then(|program| attach(&trial, &program));
    let _ = fs::remove_dir(&trial);
    attached
}

/// Before Linux 5.11 every BPF program's memory counts against the loader's
/// `RLIMIT_MEMLOCK`, 64 KiB by default (systemd before 253, Debian 11's 5.10 with cgroup v2):
/// with a page or more a program and one program a running job, launches would start failing
/// after a dozen jobs. The limit is lifted for this process, as libbpf does; where it cannot be
/// (no `CAP_SYS_RESOURCE`), raised to the hard limit, and the filter works as far as that lets
/// it (a launch past it fails with the reason). Later kernels count the memory in the memory
/// cgroup instead.
fn lift_memlock_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
    let memlock = Resource::RLIMIT_MEMLOCK;
    if setrlimit(memlock, RLIM_INFINITY, RLIM_INFINITY).is_ok() {
        return;
    }
    if let Ok((soft, hard)) = getrlimit(memlock) {
        if soft < hard {
            let _ = setrlimit(memlock, hard, hard);
        }
    }
}

/// `union bpf_attr` as `BPF_PROG_LOAD` reads it (up to `prog_name`).
#[repr(C)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

/// `union bpf_attr` as `BPF_PROG_ATTACH` reads it.
#[repr(C)]
struct ProgAttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
}

/// Loads `insns` as a cgroup device program. Without the verifier's log first (a long one
/// would not fit its buffer and fail the load); where the load fails, again with the log, which
/// the error then holds.
fn load(insns: &[Insn]) -> io::Result<OwnedFd> {
    load_logging(insns, false).or_else(|_| load_logging(insns, true))
}

fn load_logging(insns: &[Insn], logging: bool) -> io::Result<OwnedFd> {
    let code: Vec<u8> = insns.iter().flat_map(|i| i.to_bytes()).collect();
    let license = c"GPL";
    let mut log = vec![0u8; if logging { 64 << 10 } else { 0 }];
    let mut name = [0u8; 16];
    name[..13].copy_from_slice(b"gpuledger_dev");
    let mut attr = ProgLoadAttr {
        prog_type: PROG_TYPE_CGROUP_DEVICE,
        insn_cnt: u32::try_from(insns.len()).expect("bounded by MAX_DENIED"),
        insns: code.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: u32::from(logging),
        log_size: u32::try_from(log.len()).expect("64 KiB"),
        log_buf: if logging { log.as_mut_ptr() as u64 } else { 0 },
        kern_version: 0,
        prog_flags: 0,
        prog_name: name,
    };
    let fd = bpf(BPF_PROG_LOAD, &mut attr).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        let verifier = String::from_utf8_lossy(&log[..end]);
        io::Error::new(
            e.kind(),
            format!("loading the device filter: {e} {}", verifier.trim()),
        )
    })?;
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("bpf(2) returned no descriptor"))?;
    // SAFETY: a successful BPF_PROG_LOAD returns a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Attaches `program` to the cgroup `dir` as a device filter, alongside any others.
fn attach(dir: &Path, program: &OwnedFd) -> io::Result<()> {
    let cgroup = fs::File::open(dir)?;
    let descriptor = |fd: i32| u32::try_from(fd).map_err(|_| io::Error::other("bad descriptor"));
    let mut attr = ProgAttachAttr {
        target_fd: descriptor(cgroup.as_raw_fd())?,
        attach_bpf_fd: descriptor(program.as_raw_fd())?,
        attach_type: ATTACH_CGROUP_DEVICE,
        attach_flags: BPF_F_ALLOW_MULTI,
        replace_bpf_fd: 0,
    };
    bpf(BPF_PROG_ATTACH, &mut attr).map(drop).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("attaching the device filter to {}: {e}", dir.display()),
        )
    })
}

/// The `bpf(2)` system call with `attr`, one of the `repr(C)` prefixes of `union bpf_attr` above.
fn bpf<T>(command: libc::c_int, attr: &mut T) -> io::Result<libc::c_long> {
    let size = libc::c_uint::try_from(size_of::<T>()).expect("a small struct");
    // SAFETY: `attr` is a live, fully initialised `repr(C)` struct without padding whose layout is
    // the start of `union bpf_attr` for `command`, and `size` is its size, so the kernel reads
    // and writes within it; the buffers its fields point to (instructions, license, log) are
    // owned by the caller and outlive the call.
    let result = unsafe { libc::syscall(libc::SYS_bpf, command, attr as *mut T, size) };
    if result < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, major: u64, minor: u64) -> GpuDevice {
        GpuDevice {
            index,
            major,
            minor,
        }
    }

    #[test]
    fn each_denied_device_is_four_instructions_and_the_type_check_jumps_past_them_all() {
        let insns = program(&[gpu(0, 195, 0), gpu(1, 195, 1)]).unwrap();
        assert_eq!(insns.len(), 5 + 4 * 2 + 2);
        assert_eq!(insns[4], Insn::jump_unless(2, DEVICE_CHAR, 8));
        // The jump lands on `r0 = 1`.
        assert_eq!(insns[4 + 1 + 8], Insn::mov(0, 1));
        assert_eq!(insns[5], Insn::jump_unless(3, 195, 3));
        assert_eq!(insns[10], Insn::jump_unless(4, 1, 2));
        assert_eq!(
            Insn::jump_unless(4, 1, 2).to_bytes(),
            [0x55, 0x04, 2, 0, 1, 0, 0, 0]
        );
        assert_eq!(
            Insn::load_word(3, 1, 4).to_bytes(),
            [0x61, 0x13, 4, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn the_kernel_takes_the_largest_filter() {
        let most: Vec<GpuDevice> = (0..MAX_DENIED as u64).map(|i| gpu(0, 195, i)).collect();
        load(&program(&most).unwrap()).expect("this host loads BPF device programs");
    }

    #[test]
    fn device_numbers_the_program_cannot_hold_and_too_many_devices_are_refused() {
        assert!(program(&[gpu(0, 1 << 40, 0)]).is_err());
        assert!(program(&vec![gpu(0, 195, 0); MAX_DENIED + 1]).is_err());
        assert!(program(&vec![gpu(0, 195, 0); MAX_DENIED]).is_ok());
    }
}
