//! Files replaced so that a crash or a power loss leaves the old content or the new, never a
//! part of either nor none: the new content is written beside under a temporary name, flushed
//! to disk, renamed over the old, and the directory is flushed so that the rename itself
//! survives. Every state file of gpuledger (the scheduler's state, the token file, the Slurm
//! follower's position, invoices) is written through [`replace_file`].

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::Path;

/// Replaces the file at `path` with `bytes`, durably.
pub fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    replace_file_with_mode(path, bytes, None)
}

/// [`replace_file`], the new file created with Unix permissions `mode` (e.g. `0o600` for a
/// file of secrets) when given.
pub fn replace_file_with_mode(path: &Path, bytes: &[u8], mode: Option<u32>) -> io::Result<()> {
    replace_file_flushing_every(path, bytes, mode, usize::MAX)
}

/// [`replace_file_with_mode`], the new content flushed every `step` bytes as it is written. For
/// a large file written beside a service that flushes small records to the same filesystem
/// (the scheduler's `state.json` beside its journal): a filesystem commit that one of those
/// flushes forces writes out the data of files whose blocks it allocates (ext4's ordered
/// mode), so it waits behind at most `step` bytes of this file rather than all of it.
pub fn replace_file_flushing_every(
    path: &Path,
    bytes: &[u8],
    mode: Option<u32>,
    step: usize,
) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let mut options = OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    if let Some(mode) = mode {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&tmp)?;
    for chunk in bytes.chunks(step.max(1)) {
        file.write_all(chunk)?;
        if chunk.len() == step {
            file.sync_data()?;
        }
    }
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    sync_parent(path)
}

/// Flushes the directory holding `path`, so that a file created or renamed there survives.
pub fn sync_parent(path: &Path) -> io::Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_file_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        replace_file(&path, b"old").unwrap();
        replace_file(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("state.json")]);
    }

    #[cfg(unix)]
    #[test]
    fn a_file_of_secrets_is_created_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        replace_file_with_mode(&path, b"x", Some(0o600)).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn a_file_flushed_in_steps_is_written_whole_whatever_the_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        for step in [1, 7, 4096, 10_000, 10_001] {
            replace_file_flushing_every(&path, &bytes[..step.min(bytes.len()) / 2], None, step)
                .unwrap();
            replace_file_flushing_every(&path, &bytes, None, step).unwrap();
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "step {step}");
        }
    }

    #[test]
    fn a_directory_that_is_gone_is_an_error_not_a_silent_loss() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("state.json");
        assert!(replace_file(&path, b"x").is_err());
    }
}
