//! Where the stack's jobs keep their directories (working directory, `HOME`, `TMPDIR`, output).
//! Under the state directory, as the scheduler's default, unless the accounts' users cannot
//! reach it: a stack started as root in root's home (`/root` is 0700) runs its jobs as `nobody`,
//! who may not pass `/root`, and every launch would fail. Then a directory of the stack's own
//! under `/var/tmp`, named by the state directory's device and inode so that a restart finds
//! its jobs again. `/var/tmp` is writable by anyone, who could have made that name first: the
//! directory is used only if it is a real directory, this user's own, and writable by no one
//! else.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Where the stack's jobs run, when not under the state directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobsDir {
    pub path: PathBuf,
    /// Why: the directory above the state directory its jobs' users cannot pass, if that is
    /// the reason (else the operator asked for it).
    pub closed: Option<PathBuf>,
}

/// The jobs' directory for a stack whose state directory is `state` (made already): the one
/// asked for, else one under `/var/tmp` when the stack runs as root (its jobs as other users)
/// and a directory on the way to `state` is closed to others; `None`: the scheduler's default.
pub fn choose(state: &Path, asked: Option<&Path>, as_root: bool) -> Result<Option<JobsDir>> {
    if let Some(path) = asked {
        return Ok(Some(JobsDir {
            path: std::path::absolute(path)
                .map_err(Error::io(format!("resolving {}", path.display())))?,
            closed: None,
        }));
    }
    if !as_root {
        return Ok(None);
    }
    let state = std::fs::canonicalize(state)
        .map_err(Error::io(format!("resolving {}", state.display())))?;
    let Some(closed) = first_closed_to_others(&state) else {
        return Ok(None);
    };
    let base = Path::new("/var/tmp");
    let base = if base.is_dir() {
        base.to_owned()
    } else {
        std::env::temp_dir()
    };
    let path = own_dir_under(&base, &state)?;
    Ok(Some(JobsDir {
        path,
        closed: Some(closed),
    }))
}

/// The first of `dir` and the directories above it that users other than its owner and group
/// may not pass (no `x` for others), if any.
fn first_closed_to_others(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().find_map(|d| {
        let mode = std::fs::metadata(d).ok()?.mode();
        (mode & 0o001 == 0).then(|| d.to_owned())
    })
}

/// `base/gpuledger-up-<device>-<inode of state>`, made 0711 if missing; an error when something
/// else is there: a link, a file, another user's directory, or one others may write to.
fn own_dir_under(base: &Path, state: &Path) -> Result<PathBuf> {
    let meta =
        std::fs::metadata(state).map_err(Error::io(format!("reading {}", state.display())))?;
    let path = base.join(format!("gpuledger-up-{:x}-{:x}", meta.dev(), meta.ino()));
    match std::fs::DirBuilder::new().mode(0o711).create(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io(format!("creating {}", path.display()))(e)),
    }
    let found = std::fs::symlink_metadata(&path)
        .map_err(Error::io(format!("reading {}", path.display())))?;
    let own = found.file_type().is_dir()
        && found.uid() == nix::unistd::geteuid().as_raw()
        && found.mode() & 0o022 == 0;
    if !own {
        return Err(Error::Usage(format!(
            "{} is not this user's own directory (a link, another user's, or writable by others): remove it, or give --jobs-dir",
            path.display()
        )));
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o711))
        .map_err(Error::io(format!("setting the mode of {}", path.display())))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_directory_closed_to_others_sends_jobs_elsewhere() {
        let top = tempfile::tempdir().unwrap();
        let state = top.path().join("home/stack");
        std::fs::create_dir_all(&state).unwrap();
        let home = top.path().join("home");
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(first_closed_to_others(&state), Some(home.clone()));
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o711)).unwrap();
        assert_eq!(first_closed_to_others(&state), None);
        assert_eq!(
            choose(&state, Some(Path::new("/srv/jobs")), true).unwrap(),
            Some(JobsDir {
                path: "/srv/jobs".into(),
                closed: None
            })
        );
        assert_eq!(choose(&state, None, false).unwrap(), None, "not root");
    }

    #[test]
    fn a_name_someone_else_took_first_under_the_shared_directory_is_refused() {
        let base = tempfile::tempdir().unwrap();
        let state = tempfile::tempdir().unwrap();
        let made = own_dir_under(base.path(), state.path()).unwrap();
        let meta = std::fs::symlink_metadata(&made).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o711);
        assert_eq!(
            own_dir_under(base.path(), state.path()).unwrap(),
            made,
            "again"
        );

        let elsewhere = tempfile::tempdir().unwrap();
        for plant in ["link", "writable", "file", "others"] {
            std::fs::remove_dir(&made).ok();
            std::fs::remove_file(&made).ok();
            match plant {
                "link" => std::os::unix::fs::symlink(elsewhere.path(), &made).unwrap(),
                "writable" => {
                    std::fs::create_dir(&made).unwrap();
                    std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o777))
                        .unwrap();
                }
                "file" => std::fs::write(&made, "").unwrap(),
                _ => {
                    std::fs::create_dir(&made).unwrap();
                    std::os::unix::fs::chown(&made, Some(65534), Some(65534)).unwrap();
                }
            }
            let refused = own_dir_under(base.path(), state.path()).unwrap_err();
            assert!(
                refused
                    .to_string()
                    .contains("not this user's own directory"),
                "{plant}: {refused}"
            );
        }
    }
}
