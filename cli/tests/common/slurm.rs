//! A real Slurm on this host for a test (Debian's `slurm-wlm` and `munge`, which
//! `./scripts/test.sh` installs when missing): a private munged with its own key and socket, a
//! `slurmctld` and a `slurmd` in the foreground on free loopback ports, one node ([`NODE`])
//! that declares 8 GPUs as GRES (its "devices" are links to /dev/null: slurmd needs character
//! devices, not GPUs), the text job-completion log on, and gpuledger's prolog and epilog
//! installed. All of it lives in a temporary directory and stops when the value is dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The Slurm node's name: the first node of a gpuledger node pool with prefix `node`.
pub const NODE: &str = "node001";

pub struct Slurm {
    pub dir: PathBuf,
    pub conf: PathBuf,
    pub node: String,
    pub jobcomp: PathBuf,
    pub job_mapping: PathBuf,
    daemons: Vec<Child>,
    munge_pid: PathBuf,
    _tmp: tempfile::TempDir,
}

fn need(binary: &str) -> PathBuf {
    for dir in ["/usr/sbin", "/usr/bin", "/sbin", "/bin"] {
        let p = Path::new(dir).join(binary);
        if p.exists() {
            return p;
        }
    }
    panic!("{binary} not found: ./scripts/test.sh installs Debian's slurm-wlm and munge");
}

fn user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

impl Slurm {
    /// Starts munged, slurmctld and slurmd; `account_map` is what the prolog reads.
    pub fn start(account_map: &str) -> Slurm {
        Slurm::start_with(account_map, "")
    }

    /// As [`Slurm::start`], with `extra` lines added to slurm.conf (before the node line).
    ///
    /// A start whose node does not come up is made again from scratch on new ports, three
    /// starts in all: the ports are free when chosen but a daemon binds its own a moment
    /// later, and another process may have taken one in between (slurmd then exits).
    pub fn start_with(account_map: &str, extra: &str) -> Slurm {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match Slurm::try_start(account_map, extra) {
                Ok(slurm) => {
                    for failure in &failures {
                        eprintln!("an earlier Slurm start failed: {failure}");
                    }
                    return slurm;
                }
                Err(failure) => failures.push(failure),
            }
        }
        panic!(
            "Slurm did not start in three tries:\n{}",
            failures.join("\n")
        );
    }

    /// One start: the cluster once its node is idle, or why it is not (the daemons are
    /// stopped and the directory removed).
    fn try_start(account_map: &str, extra: &str) -> Result<Slurm, String> {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        for sub in ["dev", "state", "spool", "log", "out", "jobs", "munge"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        for i in 0..8 {
            std::os::unix::fs::symlink("/dev/null", dir.join(format!("dev/nvidia{i}"))).unwrap();
        }
        let host =
            String::from_utf8_lossy(&Command::new("hostname").arg("-s").output().unwrap().stdout)
                .trim()
                .to_owned();
        // Named as a gpuledger node pool names its nodes, whatever this host is called: slurmd
        // finds its node by `NodeHostname`.
        let node = NODE.to_owned();
        // munge: a key of our own, so no system daemon or key is needed.
        let key = dir.join("munge/munge.key");
        let status = Command::new(need("mungekey"))
            .args(["--create", "--keyfile", key.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(status.success(), "mungekey failed");
        let socket = dir.join("munge/munge.socket");
        let munge_pid = dir.join("munge/munged.pid");
        let status = Command::new(need("munged"))
            .arg("--force")
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--pid-file={}", munge_pid.display()))
            .arg(format!(
                "--log-file={}",
                dir.join("munge/munged.log").display()
            ))
            .arg(format!(
                "--seed-file={}",
                dir.join("munge/munged.seed").display()
            ))
            .status()
            .unwrap();
        assert!(status.success(), "munged did not start");
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/slurm");
        let (mapping, map_file) = (dir.join("jobs"), dir.join("slurm-accounts"));
        std::fs::write(&map_file, account_map).unwrap();
        for (name, script, extra) in [
            (
                "prolog",
                "prolog.sh",
                format!("GPULEDGER_ACCOUNT_MAP={}", map_file.display()),
            ),
            ("epilog", "epilog.sh", String::new()),
        ] {
            let wrapper = dir.join(name);
            std::fs::write(
                &wrapper,
                format!(
                    "#!/bin/sh\nGPULEDGER_JOB_MAPPING_DIR={} {extra} exec sh {}\n",
                    mapping.display(),
                    scripts.join(script).display()
                ),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let (ctld_port, slurmd_port) = (super::free_port(), super::free_port());
        let d = dir.display();
        let who = user();
        let jobcomp = dir.join("log/jobcomp.txt");
        let conf_text = format!(
            "ClusterName=gpuledgertest\nSlurmctldHost={host}(127.0.0.1)\nSlurmUser={who}\nSlurmdUser={who}\n\
             SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\nAuthType=auth/munge\nAuthInfo=socket={socket}\n\
             StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd.log\nProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\nSchedulerType=sched/backfill\nSelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
             GresTypes=gpu\nJobCompType=jobcomp/filetxt\nJobCompLoc={jobcomp}\nAccountingStorageType=accounting_storage/none\n\
             JobAcctGatherType=jobacct_gather/none\nMpiDefault=none\nReturnToService=2\nPrologFlags=Alloc\n\
             Prolog={d}/prolog\nEpilog={d}/epilog\nMinJobAge=300\n{extra}\
             NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 Gres=gpu:h100:8 State=UNKNOWN\n\
             PartitionName=train Nodes={node} Default=YES MaxTime=INFINITE State=UP\n",
            socket = socket.display(),
            jobcomp = jobcomp.display(),
        );
        let conf = dir.join("slurm.conf");
        std::fs::write(&conf, conf_text).unwrap();
        std::fs::write(
            dir.join("gres.conf"),
            format!("NodeName={node} Name=gpu Type=h100 File={d}/dev/nvidia[0-7]\n"),
        )
        .unwrap();
        let daemon = |binary: &str, args: &[&str]| {
            Command::new(need(binary))
                .args(args)
                .env("SLURM_CONF", &conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        };
        let conf_arg = conf.to_str().unwrap();
        let daemons = vec![
            daemon("slurmctld", &["-D", "-c", "-f", conf_arg]),
            daemon("slurmd", &["-D", "-f", conf_arg]),
        ];
        let mut slurm = Slurm {
            dir,
            conf: conf.clone(),
            node,
            jobcomp,
            job_mapping: mapping,
            daemons,
            munge_pid,
            _tmp: tmp,
        };
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let state = slurm.command("sinfo", &["-h", "-o", "%T"]);
            if state.trim() == "idle" {
                return Ok(slurm);
            }
            let exited: Vec<String> = slurm
                .daemons
                .iter_mut()
                .zip(["slurmctld", "slurmd"])
                .filter_map(|(d, name)| {
                    d.try_wait()
                        .ok()
                        .flatten()
                        .map(|status| format!("{name} exited ({status})"))
                })
                .collect();
            if !exited.is_empty() || Instant::now() > until {
                return Err(format!(
                    "the Slurm node did not become idle (sinfo: {state:?}; {})\n{}",
                    if exited.is_empty() {
                        "both daemons run".to_owned()
                    } else {
                        exited.join(", ")
                    },
                    slurm.diagnosis()
                ));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// What a failing test prints: the node's and the queue's state with Slurm's reasons, and
    /// the end of each daemon's log.
    pub fn diagnosis(&self) -> String {
        let mut out = String::new();
        for (program, args) in [
            ("sinfo", &["-N", "-o", "%N %T %E %H"][..]),
            ("squeue", &["--states=all", "-o", "%i %T %r %S %b"][..]),
        ] {
            out += &format!("{program}:\n{}", self.command(program, args));
        }
        for log in ["slurmctld.log", "slurmd.log"] {
            let text = std::fs::read_to_string(self.dir.join("log").join(log)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            out += &format!("{log} (last 40 lines):\n{tail}\n");
        }
        out
    }

    /// Runs a Slurm client command against this cluster; its standard output.
    pub fn command(&self, program: &str, args: &[&str]) -> String {
        let out = Command::new(need(program))
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `sbatch --parsable`: the job id.
    pub fn sbatch(&self, account: &str, gres: &str, minutes: u32, script: &str) -> String {
        self.sbatch_with(account, gres, minutes, script, &[])
    }

    /// `sbatch --parsable` with more options (`--hold`, `--comment=...`): the job id.
    pub fn sbatch_with(
        &self,
        account: &str,
        gres: &str,
        minutes: u32,
        script: &str,
        more: &[&str],
    ) -> String {
        let out = Command::new(need("sbatch"))
            .args(more)
            .args([
                "--parsable",
                "-A",
                account,
                &format!("--gres={gres}"),
                "-t",
                &minutes.to_string(),
                &format!("--chdir={}", self.dir.join("out").display()),
                "-o",
                "%j.out",
                "--wrap",
                script,
            ])
            .env("SLURM_CONF", &self.conf)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sbatch: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .split(';')
            .next()
            .unwrap()
            .to_owned()
    }

    /// The job's state as squeue shows it (empty once slurmctld forgot it).
    pub fn state(&self, job: &str) -> String {
        self.command("squeue", &["-h", "--states=all", "-j", job, "-o", "%T"])
            .trim()
            .to_owned()
    }

    pub fn wait_state(&self, job: &str, states: &[&str]) {
        let until = Instant::now() + Duration::from_secs(90);
        loop {
            let s = self.state(job);
            if states.contains(&s.as_str()) {
                return;
            }
            assert!(
                Instant::now() < until,
                "job {job} stayed {s}, waiting for {states:?}\n{}",
                self.diagnosis()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        // scancel only asks, and a job it has not reached yet may still start as another
        // ends: the daemons go once no job is left, or a job's slurmstepd outlives them with
        // no slurmd to report to. Only while the controller runs: a client with no controller
        // retries for seconds per call, and a start that failed drops its cluster too.
        let controller_up = self
            .daemons
            .first_mut()
            .is_some_and(|d| matches!(d.try_wait(), Ok(None)));
        let user = user();
        let active = ["-h", "--user", &user, "--states=PD,CF,R,CG,S", "-o", "%i"];
        let until = Instant::now() + Duration::from_secs(10);
        while controller_up && Instant::now() < until {
            let _ = Command::new("scancel")
                .args(["--user", &user])
                .env("SLURM_CONF", &self.conf)
                .status();
            if self.command("squeue", &active).trim().is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
        if let Ok(pid) = std::fs::read_to_string(&self.munge_pid) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
    }
}
