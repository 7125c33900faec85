//! Jobs on the executor between cycles: reaping those that exited (their outcome and end
//! event), SIGKILL at grace and time-limit deadlines, stopping one, and the job mapping the
//! exporters read.

use super::*;

impl Inner {
    /// A copy of `job` for a caller who sees the accounts `sees` says yes to: a preempting job
    /// of an account they do not see is not named.
    pub(crate) fn shown(&self, job: &JobInfo, sees: &dyn Fn(&str) -> bool) -> JobInfo {
        let mut shown = job.clone();
        if let Some(Preemptor::Job(by)) = &job.preempted_by {
            let by_account = self.state.jobs.get(by).map(|j| j.request.account.as_str());
            if !by_account.is_some_and(sees) {
                shown.preempted_by = Some(Preemptor::Unnamed(Preemptor::UNNAMED.to_owned()));
            }
        }
        shown
    }

    /// Marks a job done and queues its `finished` event.
    pub(crate) fn finish_record(
        &mut self,
        id: &JobId,
        now: UnixSeconds,
        state: JobState,
        exit_code: Option<i32>,
    ) -> Option<JobInfo> {
        let outcome = match state {
            JobState::Completed => Outcome::Completed,
            JobState::Cancelled => Outcome::Cancelled,
            JobState::Timeout => Outcome::Timeout,
            _ => Outcome::Failed,
        };
        self.finish_record_as(id, now, state, exit_code, outcome)
    }

    /// [`Inner::finish_record`] with the event's outcome finer than the state's (a failure out
    /// of memory).
    fn finish_record_as(
        &mut self,
        id: &JobId,
        now: UnixSeconds,
        state: JobState,
        exit_code: Option<i32>,
        outcome: Outcome,
    ) -> Option<JobInfo> {
        let job = self.state.jobs.get_mut(id).map(Arc::make_mut)?;
        job.state = state;
        job.end_s = Some(now);
        self.ended.insert((now, id.clone()));
        job.exit_code = exit_code;
        job.reason = None;
        job.estimated_start_s = None;
        job.gpu_wait_from_s = None;
        job.stopping = None;
        let info = job.clone();
        let mut ev = event(&info, now, JobEventKind::Finished);
        ev.outcome = Some(outcome);
        ev.exit_code = exit_code;
        self.state.outbox.push(ev);
        self.touched(id);
        self.touched_events();
        Some(info)
    }

    /// A job the cycle started that could not be launched: failed, with why as its reason
    /// (Slurm's `launch failed`), so its owner sees it without the service's log.
    pub(crate) fn fail_launch(
        &mut self,
        id: &JobId,
        now: UnixSeconds,
        error: &dyn std::fmt::Display,
    ) {
        tracing::error!(job = %id, %error, "job could not be launched");
        self.sched.finish(id, now);
        self.finish_record(id, now, JobState::Failed, None);
        if let Some(job) = self.state.jobs.get_mut(id).map(Arc::make_mut) {
            job.reason = Some(format!("launch failed: {error}"));
        }
        self.touched(id);
    }

    /// Signals a running job to stop (cancel or time limit); SIGKILL follows at the deadline.
    pub(crate) fn stop(&mut self, id: &JobId, now: UnixSeconds, grace_s: u64, why: JobState) {
        let signal = self
            .state
            .jobs
            .get(id)
            .and_then(|j| signal_named(j.request.checkpoint_signal.as_deref()).ok())
            .unwrap_or(Signal::SIGTERM);
        let _ = self.executor.signal(id, signal);
        if let Some(job) = self.state.jobs.get_mut(id).map(Arc::make_mut) {
            // A later stop (a time limit, a cancel) may bring SIGKILL forward, never put it off.
            let kill_s = now + grace_s as i64;
            job.kill_s = Some(job.kill_s.map_or(kill_s, |k| k.min(kill_s)));
            // The first reason to stop it is the one it ends with.
            job.stopping.get_or_insert(why);
            job.signal_s = Some(now);
        }
        self.touched(id);
    }

    pub(crate) fn reap(&mut self, now: UnixSeconds) {
        for (id, status) in self.executor.reap() {
            let usage = self.executor.take_usage(&id).unwrap_or_default();
            let Some(info) = self.state.jobs.get_mut(&id).map(Arc::make_mut) else {
                continue;
            };
            info.cpu_time_ms = usage.cpu_time_us.map(|us| us / 1000);
            info.peak_memory_bytes = usage.peak_memory_bytes;
            let info = info.clone();
            self.touched(&id);
            let code = match status {
                ExitStatus::Code(c) => Some(c),
                ExitStatus::Killed => Some(137),
                ExitStatus::OutOfMemory { code, .. } => code.or(Some(137)),
            };
            if info.state == JobState::Preempting && info.stopping.is_none() {
                self.sched.requeue(&id, now);
                if let Some(job) = self.state.jobs.get_mut(&id).map(Arc::make_mut) {
                    job.state = JobState::Pending;
                    job.preemptions += 1;
                    job.pid = None;
                    job.allocation = None;
                    job.preempted_by = None;
                    job.signal_s = None;
                    job.kill_s = None;
                    job.exit_code = code;
                }
                let mut ev = event(&info, now, JobEventKind::Preempted);
                ev.exit_code = code;
                self.state.outbox.push(ev);
                tracing::info!(job = %id, exit_code = ?code, "preempted job exited and is requeued");
                self.touched(&id);
                self.touched_events();
                continue;
            }
            self.sched.finish(&id, now);
            let state = match (info.stopping, status) {
                (Some(why), _) => why,
                (None, ExitStatus::Code(0)) => JobState::Completed,
                _ => JobState::Failed,
            };
            tracing::info!(job = %id, exit_code = ?code, state = ?state, "job ended");
            let out_of_memory = matches!(status, ExitStatus::OutOfMemory { .. });
            if out_of_memory && state == JobState::Failed {
                self.finish_record_as(&id, now, state, code, Outcome::OutOfMemory);
            } else {
                self.finish_record(&id, now, state, code);
            }
            if let ExitStatus::OutOfMemory {
                kills, limit_bytes, ..
            } = status
            {
                let reason = out_of_memory_reason(kills, limit_bytes);
                tracing::warn!(job = %id, %reason, "job ran out of memory");
                self.counters.out_of_memory += 1;
                if let Some(job) = self.state.jobs.get_mut(&id).map(Arc::make_mut) {
                    job.reason = Some(reason);
                }
            }
        }
    }

    /// SIGKILL for jobs past their grace; the time-limit signal for jobs past their limit.
    pub(crate) fn deadlines(&mut self, now: UnixSeconds) {
        // The scheduler's running jobs are the records running or being preempted
        // (`check_mirrored`): a deep queue's waiting jobs are not walked.
        let jobs = &self.state.jobs;
        let due: Vec<(JobId, bool)> = self
            .sched
            .running()
            .filter_map(|r| jobs.get(&r.spec.id))
            .filter(|j| matches!(j.state, JobState::Running | JobState::Preempting))
            .filter_map(|j| {
                if j.kill_s.is_some_and(|k| now >= k) {
                    return Some((j.id.clone(), true));
                }
                // The time limit holds while a job is being preempted too.
                let limit_end = j.start_s? + j.request.time_limit.as_secs() as i64;
                let stopped_for_it =
                    matches!(j.stopping, Some(JobState::Timeout | JobState::Cancelled));
                (!stopped_for_it && now >= limit_end).then(|| (j.id.clone(), false))
            })
            .collect();
        for (id, kill) in due {
            if kill {
                let _ = self.executor.signal(&id, Signal::SIGKILL);
            } else {
                tracing::info!(job = %id, "time limit reached");
                // Slurm's KillWait: a short grace, then SIGKILL.
                self.stop(&id, now, 30, JobState::Timeout);
            }
        }
    }

    /// Drops the jobs that ended before `cutoff_s`, for the cycle's record. Their ids are
    /// never given again (`next_id` stays); their events were delivered or wait in the outbox
    /// on their own.
    pub(crate) fn forget_ended_before(&mut self, cutoff_s: UnixSeconds) {
        while self.ended.first().is_some_and(|(end, _)| *end < cutoff_s) {
            let Some((end, id)) = self.ended.pop_first() else {
                break;
            };
            let ended_then = self
                .state
                .jobs
                .get(&id)
                .is_some_and(|j| j.end_s == Some(end));
            if ended_then && self.state.jobs.remove(&id).is_some() {
                self.unrecorded.forgotten.push(id);
            }
        }
    }

    /// Copies into the job table what the cycle changed of the waiting jobs (reason, planned
    /// start, since when it waits for GPUs), job by job as the queue reports them: with tens
    /// of thousands waiting, looking each one up at every cycle was most of a cycle.
    pub(crate) fn refresh_pending(&mut self) {
        let Inner {
            sched,
            state,
            unrecorded,
            ..
        } = self;
        sched.take_pending_changes(|p| {
            let Some(job) = state.jobs.get_mut(&p.spec.id).map(Arc::make_mut) else {
                return;
            };
            let reason = p.reason.as_str();
            if job.reason.as_deref() != Some(reason) {
                job.reason = Some(reason.to_owned());
            }
            job.estimated_start_s = p.estimated_start_s;
            // Kept across restarts (the relief's count); the reason and planned start are
            // worked out again by the first cycle.
            if job.gpu_wait_from_s != p.gpu_wait_from {
                job.gpu_wait_from_s = p.gpu_wait_from;
                unrecorded.waits.insert(p.spec.id.clone());
            }
        });
        #[cfg(debug_assertions)]
        self.check_mirrored();
    }

    /// Debug builds: every waiting job's record says what the scheduler's queue says of it,
    /// and the records of jobs running or being preempted are the scheduler's running jobs.
    #[cfg(debug_assertions)]
    fn check_mirrored(&self) {
        let active =
            |j: &&Arc<JobInfo>| matches!(j.state, JobState::Running | JobState::Preempting);
        let records = self.state.jobs.values().filter(active).count();
        let running = self.sched.running().count();
        assert_eq!(
            records, running,
            "jobs running or being preempted: {records} records, {running} in the scheduler"
        );
        for r in self.sched.running() {
            let job = self.state.jobs.get(&r.spec.id);
            assert!(
                job.is_some_and(|j| active(&j)),
                "job {} runs, its record says {:?}",
                r.spec.id,
                job.map(|j| j.state)
            );
        }
        for p in self.sched.pending() {
            let job = &self.state.jobs[&p.spec.id];
            let mirrored = job.state == JobState::Pending
                && job.reason.as_deref() == Some(p.reason.as_str())
                && job.estimated_start_s == p.estimated_start_s
                && job.gpu_wait_from_s == p.gpu_wait_from;
            assert!(
                mirrored,
                "job {} waits with reason {}, planned start {:?}, waiting for GPUs since {:?}, \
                 but its record says {:?}, {:?}, {:?}, {:?}",
                p.spec.id,
                p.reason,
                p.estimated_start_s,
                p.gpu_wait_from,
                job.state,
                job.reason,
                job.estimated_start_s,
                job.gpu_wait_from_s
            );
        }
    }

    /// dcgm-exporter's HPC job mapping, per node: `job-mapping/<node>/<gpu>` holds
    /// `job_id account [project]` for each busy GPU. Exporters read it at every sample, so it
    /// changes file by file: a changed file is replaced whole by a rename, and only the files
    /// of GPUs no longer busy are removed; a busy GPU's file is never missing or half written,
    /// which would leave that sample billed to nobody.
    pub(crate) fn write_job_mapping(&self, dir: &Path) -> Result<()> {
        let root = dir.join("job-mapping");
        let io = |path: &Path| {
            let path = path.to_owned();
            move |source| Error::Io { path, source }
        };
        let mut wanted: BTreeMap<PathBuf, String> = BTreeMap::new();
        for r in self.sched.running() {
            let alloc = self.sched.cluster().to_allocation(&r.placement);
            let line = match &r.spec.project {
                Some(p) => format!("{} {} {p}\n", r.spec.id, r.spec.account),
                None => format!("{} {}\n", r.spec.id, r.spec.account),
            };
            for ng in &alloc.0 {
                for g in &ng.gpus {
                    let file = root.join(ng.node.as_str()).join(g.to_string());
                    wanted.insert(file, line.clone());
                }
            }
        }
        for (file, line) in &wanted {
            if std::fs::read_to_string(file).is_ok_and(|now| &now == line) {
                continue;
            }
            let node_dir = file.parent().unwrap_or(&root);
            std::fs::create_dir_all(node_dir).map_err(io(node_dir))?;
            let staged = file.with_extension("new");
            std::fs::write(&staged, line).map_err(io(&staged))?;
            std::fs::rename(&staged, file).map_err(io(file))?;
        }
        for node_dir in read_dir_paths(&root) {
            for file in read_dir_paths(&node_dir) {
                if !wanted.contains_key(&file) {
                    let _ = std::fs::remove_file(&file);
                }
            }
            // Empty once its last busy GPU ended; a node with a busy GPU keeps its directory.
            let _ = std::fs::remove_dir(&node_dir);
        }
        Ok(())
    }
}

/// The entries of `dir`, none if it cannot be read.
fn read_dir_paths(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// Why a job the kernel's OOM killer hit ended (Slurm's `OUT_OF_MEMORY`), for its owner.
fn out_of_memory_reason(kills: u64, limit_bytes: Option<u64>) -> String {
    let processes = if kills == 1 { "process" } else { "processes" };
    match limit_bytes {
        Some(bytes) => format!(
            "out of memory: the kernel killed {kills} {processes} of the job at its memory limit of {} (--job-memory-per-gpu times its GPUs)",
            gpuledger_model::ByteSize(bytes)
        ),
        None => format!(
            "out of memory: the kernel killed {kills} {processes} of the job at its memory limit"
        ),
    }
}
