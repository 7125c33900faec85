//! The files the service makes in a job's directory. The directory belongs to the job's user,
//! so whatever is in it when the service comes back to it (a requeued job launched again, an
//! elastic job resized) is the tenant's: a symbolic link to `/etc/cron.d/x` in place of
//! `stdout` would have root append the job's output there, a link in place of `allocation`
//! would have root truncate another file, a link in place of `tmp` would have root chown a
//! directory of its own to the tenant, and a FIFO would hang the service on its open.
//!
//! So no path in the directory is followed: an entry is opened with `O_NOFOLLOW` (and
//! `O_NONBLOCK`, so a FIFO fails at once), taken only if it is a plain file with one link (a
//! hard link would make it another file too) or a directory, and otherwise removed (the link,
//! never what it points to) and made anew with `O_EXCL`, which no link can redirect. Ownership
//! is given through the open descriptor, never by path.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::libc;

/// A Unix user and group, by number: whom a job runs as and whose its files are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JobUser {
    pub uid: u32,
    pub gid: u32,
}

/// How a file is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Writing {
    /// Appended to (a requeued job's output follows its earlier runs').
    Append,
    /// Replaced.
    Replace,
}

/// The plain file `name` of the job's directory `dir`, opened to write as `how` says, owned by
/// `owner` (the service's own user when `None`) with mode 0600.
pub(crate) fn open(
    dir: &Path,
    name: &str,
    how: Writing,
    owner: Option<JobUser>,
) -> io::Result<File> {
    let path = dir.join(name);
    let options = |create_new: bool| {
        let mut options = OpenOptions::new();
        options
            .write(true)
            .append(how == Writing::Append)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC);
        if create_new {
            options.create_new(true);
        } else {
            options.create(true);
        }
        options
    };
    let file = match options(false).open(&path) {
        Ok(file) if is_plain(&file)? => file,
        // A link, a FIFO, a socket, a directory, a hard link: removed, and made anew.
        _ => {
            remove_entry(&path)?;
            options(true).open(&path)?
        }
    };
    if how == Writing::Replace {
        file.set_len(0)?;
    }
    if let Some(user) = owner {
        std::os::unix::fs::fchown(&file, Some(user.uid), Some(user.gid))?;
    }
    Ok(file)
}

/// Replaces the plain file `name` of `dir` by `text`, as [`open`] does.
pub(crate) fn write(dir: &Path, name: &str, text: &str, owner: Option<JobUser>) -> io::Result<()> {
    open(dir, name, Writing::Replace, owner)?.write_all(text.as_bytes())
}

/// The directory `name` of `dir`, made if missing (or if something else is there), owned by
/// `owner`.
pub(crate) fn make_dir(dir: &Path, name: &str, owner: Option<JobUser>) -> io::Result<()> {
    let path = dir.join(name);
    let open_dir = || {
        OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
    };
    let opened = match open_dir() {
        Ok(d) => d,
        Err(_) => {
            remove_entry(&path)?;
            fs::create_dir(&path)?;
            open_dir()?
        }
    };
    if let Some(user) = owner {
        std::os::unix::fs::fchown(&opened, Some(user.uid), Some(user.gid))?;
    }
    Ok(())
}

/// The first bytes (at most 64) of the plain file `name` of `dir`, as text: what the job's
/// wrapper leaves (its exit status) and the service's own small notes (the pid). `None` for a
/// link, a FIFO (which would block the read), a device (which could be read for ever) or
/// anything else that is not a plain file.
pub(crate) fn read_small(dir: &Path, name: &str) -> Option<String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(dir.join(name))
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut text = String::new();
    file.take(64).read_to_string(&mut text).ok()?;
    Some(text)
}

/// The prefix of a job's `tmp` set aside to be removed.
const DISCARDED_TMP: &str = ".tmp-discarded-";

/// Throws away the job's `tmp` (its `TMPDIR`, and its `/tmp` where it has its own) once its run
/// is over, as Slurm's `job_container/tmpfs` does: what it left there would otherwise fill the
/// jobs' filesystem run after run. Its output stays. The directory is renamed at once (the next
/// run of a requeued job gets a new one) and removed on a thread of its own, with whatever an
/// earlier removal (cut short by a restart) left; never following a link.
pub(crate) fn discard_tmp(dir: &Path) {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let aside = dir.join(format!("{DISCARDED_TMP}{stamp}"));
    if fs::rename(dir.join("tmp"), &aside).is_err() {
        return;
    }
    let dir = dir.to_owned();
    std::thread::spawn(move || {
        let Ok(entries) = fs::read_dir(&dir) else {
            return;
        };
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(DISCARDED_TMP)
            {
                if let Err(error) = remove_entry(&entry.path()) {
                    tracing::warn!(path = %entry.path().display(), %error, "a finished job's tmp could not be removed");
                }
            }
        }
    });
}

/// Whether an open file is a plain file that no other name links to.
fn is_plain(file: &File) -> io::Result<bool> {
    let meta = file.metadata()?;
    Ok(meta.is_file() && meta.nlink() == 1)
}

/// Removes whatever `path` names without following it: a link itself, a file, a FIFO, or a
/// directory tree (`remove_dir_all` does not follow links inside it either).
fn remove_entry(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_a_hard_link_or_a_fifo_in_place_of_a_file_is_replaced_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        fs::write(&outside, "keep\n").unwrap();
        let job = dir.path().join("job");
        fs::create_dir(&job).unwrap();
        std::os::unix::fs::symlink(&outside, job.join("stdout")).unwrap();
        fs::hard_link(&outside, job.join("allocation")).unwrap();
        nix::unistd::mkfifo(&job.join("stderr"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::os::unix::fs::symlink(dir.path(), job.join("tmp")).unwrap();

        open(&job, "stdout", Writing::Append, None)
            .unwrap()
            .write_all(b"out\n")
            .unwrap();
        write(&job, "allocation", "n1:0\n", None).unwrap();
        open(&job, "stderr", Writing::Append, None).unwrap();
        make_dir(&job, "tmp", None).unwrap();

        assert_eq!(fs::read_to_string(&outside).unwrap(), "keep\n");
        assert_eq!(fs::metadata(&outside).unwrap().nlink(), 1);
        assert_eq!(fs::read_to_string(job.join("stdout")).unwrap(), "out\n");
        assert_eq!(
            fs::read_to_string(job.join("allocation")).unwrap(),
            "n1:0\n"
        );
        for name in ["stdout", "allocation", "stderr"] {
            assert!(
                fs::symlink_metadata(job.join(name)).unwrap().is_file(),
                "{name}"
            );
        }
        assert!(fs::symlink_metadata(job.join("tmp")).unwrap().is_dir());
        // A plain file of its own is kept and appended to.
        open(&job, "stdout", Writing::Append, None)
            .unwrap()
            .write_all(b"more\n")
            .unwrap();
        assert_eq!(
            fs::read_to_string(job.join("stdout")).unwrap(),
            "out\nmore\n"
        );
    }

    #[test]
    fn only_a_plain_file_is_read_and_only_its_first_bytes() {
        let job = tempfile::tempdir().unwrap();
        let dir = job.path();
        fs::write(dir.join("exit"), "0\n").unwrap();
        assert_eq!(read_small(dir, "exit").as_deref(), Some("0\n"));
        fs::write(dir.join("long"), "1".repeat(1000)).unwrap();
        assert_eq!(read_small(dir, "long").map(|t| t.len()), Some(64));
        std::os::unix::fs::symlink("/dev/zero", dir.join("zero")).unwrap();
        nix::unistd::mkfifo(&dir.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        for name in ["zero", "fifo", "missing"] {
            assert_eq!(read_small(dir, name), None, "{name}");
        }
    }
}
