//! A small live workload for the stack: every few seconds, while fewer jobs wait than the
//! stack has nodes, one job of the next account in turn (1 to 8 GPUs, a few minutes of
//! `sleep`) is submitted to the scheduler with the stack's workload token, so that the status
//! page, the queue and the exporters' job labels have something to show.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use gpuledger_model::config::ClusterConfig;
use gpuledger_model::units::DurationSpec;
use gpuledger_model::AccountId;
use gpuledger_schedd::http::QueueReply;
use gpuledger_schedd::state::{JobState, SubmitRequest};

use crate::layout::Layout;
use crate::{Error, Result};

/// Time between two looks at the queue.
const EVERY: Duration = Duration::from_secs(5);

#[derive(Debug)]
pub struct Workload {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The `n`-th job of the workload: whose, how many GPUs, how long.
pub fn nth_job(accounts: &[AccountId], n: u64) -> Option<SubmitRequest> {
    let account = accounts.get((n % accounts.len().max(1) as u64) as usize)?;
    let gpus = [1, 2, 4, 8, 2, 1][(n % 6) as usize];
    let seconds = 60 + (n * 37) % 240;
    Some(SubmitRequest {
        command: format!("sleep {seconds}"),
        account: account.clone(),
        project: None,
        partition: None,
        gpus,
        min_gpus: None,
        gpus_per_node: None,
        nodes: None,
        gpu_types: Vec::new(),
        gpu_share: None,
        time_limit: DurationSpec::from_secs(seconds + 60),
        grace: None,
        checkpoint_signal: None,
        checkpoint_every: None,
        env: Default::default(),
    })
}

impl Workload {
    pub fn start(layout: &Layout, scheduler: &str) -> Result<Workload> {
        let text = std::fs::read_to_string(layout.config_path())
            .map_err(Error::io("reading the stack's cluster config"))?;
        let config = ClusterConfig::from_toml_str(&text, "cluster.toml")
            .map_err(|e| Error::Config(e.to_string()))?;
        let accounts: Vec<AccountId> = config.accounts.iter().map(|a| a.id.clone()).collect();
        let token = gpuledger_service::read_token_file(&layout.secret("workload"))?;
        let most_waiting = layout.nodes().len();
        let scheduler = scheduler.to_owned();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("workload".into())
            .spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(10)))
                    .build()
                    .into();
                let auth = format!("Bearer {token}");
                let mut n = 0u64;
                while !flag.load(Ordering::Relaxed) {
                    let waiting = agent
                        .get(format!("{scheduler}/api/v1/queue"))
                        .header("authorization", &auth)
                        .call()
                        .ok()
                        .and_then(|mut r| r.body_mut().read_to_string().ok())
                        .and_then(|text| serde_json::from_str::<QueueReply>(&text).ok())
                        .map(|q| {
                            q.jobs
                                .iter()
                                .filter(|j| j.state == JobState::Pending)
                                .count()
                        });
                    if waiting.is_some_and(|w| w < most_waiting) {
                        if let Some(job) = nth_job(&accounts, n) {
                            match agent
                                .post(format!("{scheduler}/api/v1/jobs"))
                                .header("authorization", &auth)
                                .header("content-type", "application/json")
                                .send(serde_json::to_vec(&job).unwrap_or_default())
                            {
                                Ok(r) if r.status().is_success() => n += 1,
                                Ok(r) => {
                                    tracing::warn!(status = r.status().as_u16(), account = %job.account, "workload job refused");
                                    n += 1;
                                }
                                Err(error) => tracing::warn!(%error, "submitting a workload job"),
                            }
                        }
                    }
                    let mut slept = Duration::ZERO;
                    while slept < EVERY && !flag.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(100));
                        slept += Duration::from_millis(100);
                    }
                }
            })
            .map_err(Error::io("starting the workload"))?;
        Ok(Workload {
            stop,
            thread: Some(thread),
        })
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_go_round_the_accounts_in_turn_with_sizes_that_fit_a_node() {
        let accounts: Vec<AccountId> = ["a", "b", "c"]
            .iter()
            .map(|a| AccountId::new(a).unwrap())
            .collect();
        let jobs: Vec<SubmitRequest> = (0..6).map(|n| nth_job(&accounts, n).unwrap()).collect();
        let whose: Vec<&str> = jobs.iter().map(|j| j.account.as_str()).collect();
        assert_eq!(whose, ["a", "b", "c", "a", "b", "c"]);
        assert!(jobs.iter().all(|j| (1..=8).contains(&j.gpus)));
        assert!(jobs
            .iter()
            .all(|j| j.time_limit.as_secs() > 60 && j.command.starts_with("sleep ")));
        assert!(nth_job(&[], 0).is_none());
    }
}
