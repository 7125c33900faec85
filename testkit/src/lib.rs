//! What gpuledger's tests share across crates (a dev-dependency only): a real tmpfs mounted
//! for a test, for the full-disk cases, and a service started as a process with the address
//! it announced on its first line of output.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A real tmpfs of `size` (e.g. `64k`, `1m`), mounted for a test and unmounted when dropped.
/// Mounting needs root, which the test command runs as; elsewhere the test fails saying so.
#[derive(Debug)]
pub struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    pub fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs needs root (the test command runs as root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir)
    }

    pub fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.0.path()).status();
    }
}

/// A running service and the URL it announced. Killed when dropped, so a failing test leaves
/// no service behind.
#[derive(Debug)]
pub struct Process {
    pub child: Child,
    pub url: String,
}

impl Drop for Process {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// SIGTERM, then a clean exit.
pub fn terminate(mut p: Process) {
    let pid = p.child.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill")
        .success());
    let status = p.child.wait().expect("waits");
    assert!(status.success(), "{status:?}");
}

/// Starts `BINARY ARGS` and waits for its "listening on http(s)://..." line.
pub fn spawn_binary(binary: &str, args: &[&str], stderr: Stdio) -> Process {
    let mut command = Command::new(binary);
    command.args(args);
    spawn_command(command, stderr)
}

/// Starts a prepared command (its environment, its arguments) and waits for its "listening on
/// http(s)://..." line.
pub fn spawn_command(mut command: Command, stderr: Stdio) -> Process {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("piped"))
        .read_line(&mut line)
        .expect("reads");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"))
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    Process { child, url }
}

/// A TCP connection to `addr` from the loopback address `source` (any of 127.0.0.0/8), so that
/// one test can be several clients as a service's per-address limits see them.
pub fn connect_from(source: [u8; 4], addr: std::net::SocketAddr) -> std::net::TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("a TCP socket");
    socket
        .bind(&std::net::SocketAddr::from((source, 0)).into())
        .unwrap_or_else(|e| panic!("binding {source:?}: {e}"));
    socket
        .connect(&addr.into())
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    socket.into()
}

/// Kills, when dropped, every process whose working directory is below a directory: the jobs a
/// scheduler test started, which outlive the scheduler by design, should the test fail before
/// it ends them. Declare it after the directory, so that it is dropped first.
#[derive(Debug)]
pub struct KillJobsUnder(std::path::PathBuf);

impl KillJobsUnder {
    pub fn new(dir: &Path) -> Self {
        KillJobsUnder(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned()))
    }
}

impl Drop for KillJobsUnder {
    fn drop(&mut self) {
        for pid in processes_under(&self.0) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The processes whose working directory is `dir` or below it.
pub fn processes_under(dir: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_guard_kills_what_runs_in_its_directory_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        let spawn_in = |cwd: &Path| {
            Command::new("sleep")
                .arg("100")
                .current_dir(cwd)
                .spawn()
                .unwrap()
        };
        let mut inside = spawn_in(&dir.path().join("."));
        let mut outside = spawn_in(other.path());
        drop(KillJobsUnder::new(dir.path()));
        let status = inside.wait().unwrap();
        assert!(!status.success(), "killed");
        assert!(matches!(outside.try_wait(), Ok(None)), "left alone");
        outside.kill().unwrap();
        outside.wait().unwrap();
    }
}
