//! The stacks source: a window of py-spy dumps of every Python process of the topology, in
//! parallel with bounded concurrency, each thread classified by the rules as it arrives.

use super::not_python::{not_python_reasons, Verdicts};
use super::pyspy::{ptrace_hint, run_py_spy, DumpFailure, DumpOutcome};
use super::{targets_from_topology, RuleSet, StackRule, StackTarget, StacksConfig};
use crate::clock::Clock;
use crate::error::Result;
use crate::model::{
    CaptureMode, Payload, Sample, SourceKind, SourceStatus, StackCapture, Topology,
};
use crate::sources::pyspy_json::MAX_THREADS;
use crate::sources::window;
use crate::sources::{BoxFuture, Source};
use crate::sys::ProcFs;
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Stacks captured over one window, and how complete they are.
#[derive(Debug, Clone, PartialEq)]
pub struct StackWindow {
    pub status: SourceStatus,
    pub captures: Vec<StackCapture>,
    /// The collection's window ended before every dump was done (the status says how many
    /// were not): no further round is started.
    pub cut_short: bool,
}

/// The stacks source: py-spy dumps of every Python process, classified by probe rules.
#[derive(Debug, Clone)]
pub struct StackSource {
    cfg: StacksConfig,
    rules: Arc<RuleSet>,
    /// Where a target's `exe`, `maps` and liveness are read (py-spy itself reads the
    /// kernel's `/proc`).
    proc: ProcFs,
    /// Which targets `maps` showed not to be Python, per process incarnation.
    not_python: Verdicts,
}

/// One finished py-spy task: the target, when its dump started, and what came back.
type Dumped = (StackTarget, i64, DumpOutcome);

impl StackSource {
    pub fn new(cfg: StacksConfig, rules: &[StackRule]) -> Result<StackSource> {
        Ok(StackSource {
            cfg,
            rules: Arc::new(RuleSet::new(rules)?),
            proc: ProcFs::real(),
            not_python: Verdicts::default(),
        })
    }

    /// The same source reading targets' `/proc` files through `proc` (`--proc-root`, tests).
    pub fn with_proc(mut self, proc: ProcFs) -> StackSource {
        self.proc = proc;
        self
    }

    pub fn config(&self) -> &StacksConfig {
        &self.cfg
    }

    pub fn rules(&self) -> &RuleSet {
        &self.rules
    }

    fn mode(&self) -> (CaptureMode, Duration) {
        if self.cfg.native {
            (CaptureMode::Native, self.cfg.native_timeout)
        } else {
            (CaptureMode::Nonblocking, self.cfg.timeout)
        }
    }

    /// One dump of each target, in parallel (at most `concurrency` py-spy at once). Inside
    /// a one-shot collection, dumps not done by its wrap-up time ([`window::wrap_up_by`])
    /// are given up and the rest delivered (the status says how many): targets started
    /// first are the ones kept.
    pub async fn capture_once(&self, targets: &[StackTarget], clock: &dyn Clock) -> StackWindow {
        let py_spy = match self.cfg.resolve_py_spy() {
            Ok(p) => p,
            Err(reason) => {
                return StackWindow {
                    status: SourceStatus::unavailable(reason),
                    captures: Vec::new(),
                    cut_short: false,
                }
            }
        };
        let (mode, _) = self.mode();
        let wrap_up = window::wrap_up_by();
        let (mut set, mut captures) = self.spawn_dumps(&py_spy, targets, clock).await;
        let mut failures = Vec::new();
        let mut not_dumped = 0;
        loop {
            let next = match wrap_up {
                Some(t) => match tokio::time::timeout_at(t, set.join_next()).await {
                    Ok(next) => next,
                    Err(_) => {
                        not_dumped = set.len();
                        set.abort_all();
                        break;
                    }
                },
                None => set.join_next().await,
            };
            let Some(joined) = next else { break };
            let Ok((target, t_ms, out)) = joined else {
                continue;
            };
            let (cap, failure) = self.finish_capture(&target, t_ms, mode, out);
            if let Some(f) = failure {
                failures.push((target.pid, f));
            }
            captures.push(cap);
        }
        captures.sort_by_key(|c| c.pid);
        let mut status = failure_status(&self.proc, &failures);
        if not_dumped > 0 {
            status = status.worst(SourceStatus::degraded(format!(
                "{not_dumped} of {} processes not dumped: the window ended first",
                targets.len()
            )));
        }
        StackWindow {
            status,
            captures,
            cut_short: not_dumped > 0,
        }
    }

    /// Starts one py-spy task per target (past `max_pids`, or not Python: a skipped capture
    /// instead, returned at once).
    async fn spawn_dumps(
        &self,
        py_spy: &Path,
        targets: &[StackTarget],
        clock: &dyn Clock,
    ) -> (tokio::task::JoinSet<Dumped>, Vec<StackCapture>) {
        let (mode, timeout) = self.mode();
        let sem = Arc::new(tokio::sync::Semaphore::new(self.cfg.concurrency.max(1)));
        let mut set = tokio::task::JoinSet::new();
        let mut skipped_now = Vec::new();
        let max = self.cfg.max_pids.max(1);
        let pids = targets.iter().take(max).map(|t| t.pid).collect();
        let checked = not_python_reasons(&self.proc, pids, &self.not_python).await;
        for (i, target) in targets.iter().enumerate() {
            let t_ms = clock.now_ms();
            if i >= max {
                skipped_now.push(skipped(target.pid, t_ms, mode, "over the max_pids limit"));
                continue;
            }
            if let Some(reason) = checked.get(i).cloned().flatten() {
                skipped_now.push(skipped(target.pid, t_ms, mode, &reason));
                continue;
            }
            let sem = Arc::clone(&sem);
            let py_spy = py_spy.to_path_buf();
            let target = target.clone();
            let proc = self.proc.clone();
            set.spawn(async move {
                let _permit = sem.acquire_owned().await.ok();
                let native = mode == CaptureMode::Native;
                let mut out = run_py_spy(&proc, &py_spy, target.pid, native, timeout).await;
                if matches!(out.failure, Some(DumpFailure::Race(_))) {
                    // Reading without pausing races the interpreter now and then (a frame
                    // freed mid-read); the next read almost always succeeds.
                    out = run_py_spy(&proc, &py_spy, target.pid, native, timeout).await;
                }
                (target, t_ms, out)
            });
        }
        (set, skipped_now)
    }

    /// The capture of one finished dump, its threads classified; a failure that degrades
    /// the source is handed back for the window's status.
    fn finish_capture(
        &self,
        target: &StackTarget,
        t_ms: i64,
        mode: CaptureMode,
        out: DumpOutcome,
    ) -> (StackCapture, Option<DumpFailure>) {
        let mut cap = StackCapture {
            pid: target.pid,
            t_ms,
            mode,
            error: None,
            skipped: None,
            warnings: Vec::new(),
            threads: Vec::new(),
        };
        if mode == CaptureMode::Native {
            cap.warnings
                .push("--native: the target was paused while its stacks were read".into());
        }
        match out.failure {
            None => {
                cap.threads = out.threads;
                self.classify_all(target, &mut cap);
                (cap, None)
            }
            Some(DumpFailure::NotPython(r)) => {
                cap.skipped = Some(r);
                (cap, None)
            }
            Some(DumpFailure::Exited(r)) => {
                cap.error = Some(r);
                (cap, None)
            }
            Some(
                f @ (DumpFailure::Permission(_)
                | DumpFailure::Timeout(_)
                | DumpFailure::Race(_)
                | DumpFailure::Other(_)),
            ) => {
                cap.error = Some(f.reason().to_string());
                (cap, Some(f))
            }
        }
    }

    /// Classifies every thread of a successful dump, with warnings for what looks off.
    fn classify_all(&self, target: &StackTarget, cap: &mut StackCapture) {
        for th in &mut cap.threads {
            self.rules.classify(target.stack.as_deref(), th).apply(th);
            if th.tid == 0 {
                cap.warnings
                    .push(format!("thread {:?} without an OS thread id", th.name));
            }
        }
        if cap.threads.is_empty() {
            cap.warnings.push("py-spy returned no threads".into());
        }
        if cap.threads.len() >= MAX_THREADS {
            cap.warnings
                .push(format!("only the first {MAX_THREADS} threads are kept"));
        }
    }

    /// `dumps_per_window` dumps, `dump_interval` apart: every target in the first round,
    /// the `whole_window` ones in the others.
    pub async fn capture_window(&self, targets: &[StackTarget], clock: &dyn Clock) -> StackWindow {
        self.capture_rounds(targets, self.cfg.dumps_per_window, clock)
            .await
    }

    /// `rounds` dumps, `dump_interval` apart, as [`Self::capture_window`] says; inside a
    /// one-shot collection the rounds stop before its window ends ([`window::wrap_up_by`]).
    pub async fn capture_rounds(
        &self,
        targets: &[StackTarget],
        rounds: u32,
        clock: &dyn Clock,
    ) -> StackWindow {
        let rounds = rounds.max(1);
        let mut status = SourceStatus::ok();
        let mut captures = Vec::new();
        let window_started = Instant::now();
        let wrap_up = window::wrap_up_by();
        let budget = match wrap_up {
            Some(t) => self
                .cfg
                .window_budget
                .min(t.saturating_duration_since(tokio::time::Instant::now())),
            None => self.cfg.window_budget,
        };
        let repeated: Vec<StackTarget> =
            targets.iter().filter(|t| t.whole_window).cloned().collect();
        for round in 0..rounds {
            let started = Instant::now();
            let this_round = if round == 0 { targets } else { &repeated[..] };
            if this_round.is_empty() {
                break;
            }
            let w = self.capture_once(this_round, clock).await;
            if w.cut_short && round > 0 {
                status = status.worst(SourceStatus::degraded(format!(
                    "{round} of {rounds} dumps: the window ended during dump {}",
                    round + 1
                )));
            }
            let cut_short = w.cut_short;
            let unavailable = w.status.status == crate::model::Status::Unavailable;
            status = status.worst(w.status);
            captures.extend(w.captures);
            if unavailable || cut_short {
                break;
            }
            // Another dump (and its spacing) would overrun the budget: stop with what we
            // have, and say so.
            let one = started.elapsed().max(self.cfg.dump_interval);
            if round + 1 < rounds && window_started.elapsed() + one > budget {
                status = status.worst(SourceStatus::degraded(format!(
                    "{} of {rounds} dumps: one dump of {} processes took {} ms (window budget {} ms)",
                    round + 1,
                    targets.len(),
                    started.elapsed().as_millis(),
                    budget.as_millis()
                )));
                break;
            }
            if round + 1 < rounds {
                if let Some(rest) = self.cfg.dump_interval.checked_sub(started.elapsed()) {
                    tokio::time::sleep(rest).await;
                }
            }
        }
        StackWindow {
            status,
            captures,
            cut_short: false,
        }
    }
}

fn skipped(pid: i32, t_ms: i64, mode: CaptureMode, reason: &str) -> StackCapture {
    StackCapture {
        pid,
        t_ms,
        mode,
        error: None,
        skipped: Some(reason.to_string()),
        warnings: Vec::new(),
        threads: Vec::new(),
    }
}

/// Exited pids and non-Python pids do not degrade the source; permission problems,
/// timeouts and other py-spy failures do, each named once.
fn failure_status(proc: &ProcFs, failures: &[(i32, DumpFailure)]) -> SourceStatus {
    let mut status = SourceStatus::ok();
    let mut seen = BTreeSet::new();
    for (pid, f) in failures {
        let reason = match f {
            DumpFailure::Permission(_) => ptrace_hint(proc),
            DumpFailure::Timeout(r) | DumpFailure::Race(r) | DumpFailure::Other(r) => {
                format!("pid {pid}: {r}")
            }
            DumpFailure::NotPython(_) | DumpFailure::Exited(_) => continue,
        };
        if seen.insert(reason.clone()) {
            status = status.worst(SourceStatus::degraded(reason));
        }
    }
    status
}

impl Source for StackSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Stacks
    }

    fn sample<'a>(&'a self, topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            let t_ms = clock.now_ms();
            let started = Instant::now();
            let mut targets = targets_from_topology(topo);
            // Schedulers first: a window cut short by its budget keeps the evidence.
            targets.sort_by_key(|t| !t.whole_window);
            let w = self.capture_window(&targets, clock).await;
            window_sample(t_ms, started, w)
        })
    }
}

/// The sample of a window of dumps that started at `t_ms` (`started` on the monotonic clock).
pub fn window_sample(t_ms: i64, started: Instant, w: StackWindow) -> Sample {
    Sample {
        t_ms,
        status: w.status,
        took_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        payload: Payload::Stacks(w.captures),
    }
}
