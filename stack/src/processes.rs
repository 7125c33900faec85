//! The stack's processes: each is started with its output going to its log file, its address
//! read from its "listening on http://..." line (or, for a process that prints none, a probe
//! of its readiness URL), watched while the stack runs, and stopped in the reverse order of
//! starting: SIGTERM, then SIGKILL after a grace.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::{Error, Result, START_TIMEOUT};

/// How long a stopped service has to exit before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(15);

/// A process to start: its name in messages and logs, the program and its arguments.
#[derive(Debug)]
pub struct Service {
    name: String,
    command: Command,
    /// Where it answers once ready, for a process that prints no address.
    ready_url: Option<String>,
}

impl Service {
    pub fn new(name: &str, program: impl AsRef<std::ffi::OsStr>) -> Service {
        Service {
            name: name.to_owned(),
            command: Command::new(program),
            ready_url: None,
        }
    }

    pub fn args<I, S>(mut self, args: I) -> Service
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        self.command.args(args);
        self
    }

    /// A process that prints no address: ready once `url` answers 200.
    pub fn ready_at(mut self, url: &str) -> Service {
        self.ready_url = Some(url.to_owned());
        self
    }
}

#[derive(Debug)]
struct Running {
    name: String,
    child: Child,
    log: PathBuf,
}

/// The started processes, in starting order.
#[derive(Debug)]
pub struct Services {
    logs: PathBuf,
    running: Vec<Running>,
}

fn log_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The first http(s) URL on a line, without a trailing path.
fn url_in(line: &str) -> Option<String> {
    line.split_whitespace()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"))
        .map(|w| w.trim_end_matches('/').to_owned())
}

impl Services {
    pub fn new(logs: PathBuf) -> Services {
        Services {
            logs,
            running: Vec::new(),
        }
    }

    /// Starts `service` and waits until it is ready; its base URL.
    pub fn start(&mut self, mut service: Service) -> Result<String> {
        let log = self.logs.join(format!("{}.log", log_name(&service.name)));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(Error::io(format!("opening {}", log.display())))?;
        let err_file = file
            .try_clone()
            .map_err(Error::io(format!("opening {}", log.display())))?;
        let mut child = service
            .command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err_file))
            .spawn()
            .map_err(Error::io(format!("starting {}", service.name)))?;
        let stdout = child.stdout.take();
        let (tx, rx) = mpsc::channel::<String>();
        // Copies the process's standard output into its log, handing over the first address.
        if let Some(out) = stdout {
            let mut file = file;
            std::thread::Builder::new()
                .name(format!("log {}", service.name))
                .spawn(move || {
                    let mut told = false;
                    for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                        let _ = writeln!(file, "{line}");
                        if !told {
                            if let Some(url) = url_in(&line).filter(|_| line.contains("listening"))
                            {
                                told = tx.send(url).is_ok();
                            }
                        }
                    }
                })
                .map_err(Error::io("starting a log thread"))?;
        }
        self.running.push(Running {
            name: service.name.clone(),
            child,
            log: log.clone(),
        });
        let until = Instant::now() + START_TIMEOUT;
        let url = match &service.ready_url {
            Some(url) => {
                wait_ready(url, until, || self.exited(&service.name))?;
                url.trim_end_matches("/-/ready").to_owned()
            }
            None => loop {
                match rx.recv_timeout(Duration::from_millis(200)) {
                    Ok(url) => break url,
                    Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < until => {
                        if let Some(status) = self.exited(&service.name) {
                            return Err(Error::Down(format!(
                                "{} exited while starting ({status}); see {}",
                                service.name,
                                log.display()
                            )));
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        // Its output closed: it is exiting, or closed stdout and runs on.
                        let status = self.exited_within(&service.name, Duration::from_secs(5));
                        return Err(Error::Down(format!(
                            "{} {} before saying where it listens; see {}",
                            service.name,
                            status.map_or("closed its output".to_owned(), |s| {
                                format!("exited while starting ({s})")
                            }),
                            log.display()
                        )));
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        return Err(Error::Down(format!(
                            "{} did not say where it listens within {} s; see {}",
                            service.name,
                            START_TIMEOUT.as_secs(),
                            log.display()
                        )))
                    }
                }
            },
        };
        tracing::info!(service = %service.name, %url, "started");
        Ok(url)
    }

    /// How the named process ended, if it did.
    fn exited(&mut self, name: &str) -> Option<String> {
        let r = self.running.iter_mut().find(|r| r.name == name)?;
        match r.child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }

    /// How the named process ended, waiting up to `wait` for it to.
    fn exited_within(&mut self, name: &str, wait: Duration) -> Option<String> {
        let until = Instant::now() + wait;
        loop {
            if let Some(status) = self.exited(name) {
                return Some(status);
            }
            if Instant::now() > until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Runs until `stop` turns true (Ok) or a process exits on its own (an error naming it
    /// and its log).
    pub fn watch(&mut self, stop: &AtomicBool) -> Result<()> {
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            for r in &mut self.running {
                if let Ok(Some(status)) = r.child.try_wait() {
                    return Err(Error::Down(format!(
                        "{} stopped ({status}); see {}; stopping the rest",
                        r.name,
                        r.log.display()
                    )));
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Stops every process, the last started first: SIGTERM, and SIGKILL for one still there
    /// after the grace.
    pub fn stop_all(&mut self) {
        while let Some(mut r) = self.running.pop() {
            stop(&mut r);
        }
    }
}

fn stop(r: &mut Running) {
    if matches!(r.child.try_wait(), Ok(Some(_))) {
        return;
    }
    let pid = nix::unistd::Pid::from_raw(r.child.id() as i32);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
    let until = Instant::now() + STOP_GRACE;
    while Instant::now() < until {
        if matches!(r.child.try_wait(), Ok(Some(_))) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    tracing::warn!(service = %r.name, "still running after SIGTERM; killing it");
    let _ = r.child.kill();
    let _ = r.child.wait();
}

/// Polls `url` until it answers 200; fails when `exited` says the process ended or at `until`.
fn wait_ready(url: &str, until: Instant, mut exited: impl FnMut() -> Option<String>) -> Result<()> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    loop {
        if let Ok(r) = agent.get(url).call() {
            if r.status().as_u16() == 200 {
                return Ok(());
            }
        }
        if let Some(status) = exited() {
            return Err(Error::Down(format!("{url}: the process exited ({status})")));
        }
        if Instant::now() > until {
            return Err(Error::Down(format!(
                "{url} did not answer within {} s",
                START_TIMEOUT.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A file's path as an argument.
pub fn arg(p: &Path) -> String {
    p.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_comes_from_the_listening_line() {
        assert_eq!(
            url_in("gpuledger aggregator listening on http://127.0.0.1:9400 data-dir x"),
            Some("http://127.0.0.1:9400".into())
        );
        assert_eq!(url_in("nothing here"), None);
        assert_eq!(log_name("exporter gpu001"), "exporter-gpu001");
    }

    #[test]
    fn a_service_that_exits_while_starting_is_an_error_naming_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Services::new(dir.path().to_path_buf());
        let e = s
            .start(Service::new("broken", "sh").args(["-c", "echo oops >&2; exit 3"]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("broken exited while starting") && e.contains("broken.log"),
            "{e}"
        );
        let log = std::fs::read_to_string(dir.path().join("broken.log")).unwrap();
        assert!(log.contains("oops"), "{log}");
        let url = s
            .start(Service::new("fine", "sh").args([
                "-c",
                "echo 'x listening on http://127.0.0.1:1/'; exec sleep 30",
            ]))
            .unwrap();
        assert_eq!(url, "http://127.0.0.1:1");
        let t = Instant::now();
        s.stop_all();
        assert!(t.elapsed() < STOP_GRACE, "SIGTERM ends a sleep at once");
    }
}
