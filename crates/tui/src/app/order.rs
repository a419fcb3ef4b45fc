//! Stuck-first orders of the Threads, Sockets and Diff tabs, applied on top of what `derived`
//! lists (its filter is kept, only the order changes). A wedge is what the on-call engineer
//! looks for, so it must be the first row, not the ninth under idle helper threads sorted
//! by name.

use super::derived::{in_flight, RequestRow};
use super::follow::in_family;
use crate::model::{RequestState, Role, Severity, SnapThread, Snapshot, ThreadState};
use std::cmp::Reverse;
use std::collections::HashMap;

/// Each component's worst finding severity, passed down to its children: a scheduler is
/// suspect when its engine has a `wedged_request`, since the engine's finding is where the
/// scheduler's own findings are folded.
fn suspicion(s: &Snapshot) -> HashMap<&str, Severity> {
    let mut own: HashMap<&str, Severity> = HashMap::new();
    for f in &s.findings {
        if let Some(c) = f.component.as_deref() {
            let e = own.entry(c).or_insert(f.severity);
            *e = (*e).max(f.severity);
        }
    }
    let mut out = own.clone();
    for c in &s.components {
        let parent = c.parent.as_deref().and_then(|p| own.get(p)).copied();
        let mine = own.get(c.id.as_str()).copied();
        if let Some(sev) = parent.max(mine) {
            out.insert(c.id.as_str(), sev);
        }
    }
    out
}

/// How telling a thread state is for a hang, lowest first: out of its loop, then waiting on
/// something else (collectives, workers, the GPU, PD queues), then the loop's own states,
/// then unclassified threads, idle helpers last.
fn state_rank(state: &ThreadState) -> u8 {
    match state {
        ThreadState::StuckOutsideLoop | ThreadState::Shutdown => 0,
        ThreadState::Collective
        | ThreadState::NcclCollective
        | ThreadState::GlooCollective
        | ThreadState::P2pWait
        | ThreadState::WaitingWorkers
        | ThreadState::WaitingGpuResult
        | ThreadState::PdQueuePolling => 1,
        // An earlier build's name, still in tests/fixtures/snapshots/healthy.json.
        ThreadState::Other(x) if x == "waiting_gpu" => 1,
        ThreadState::Idle
        | ThreadState::RunningBatch
        | ThreadState::Startup
        | ThreadState::Waiting => 2,
        ThreadState::Unknown | ThreadState::Other(_) => 3,
        ThreadState::HelperIdle => 4,
    }
}

/// Which components' threads tell most about a hang, lowest first: the scheduler (its loop
/// is where an engine accepts, batches and forgets requests), then the engine process (its
/// HTTP server only waits on the scheduler), then everything else.
fn role_rank(roles: &HashMap<&str, Role>, component: Option<&str>) -> u8 {
    match component.and_then(|c| roles.get(c)).copied() {
        Some(Role::Scheduler) => 0,
        Some(r) if r.is_engine() => 1,
        _ => 2,
    }
}

/// A process's main thread (the scheduler loop runs there).
fn is_main(t: &SnapThread) -> bool {
    t.tid == t.pid || t.name.as_deref() == Some("MainThread")
}

/// Threads of suspect components first (worst finding first), a suspect's scheduler before
/// its engine's HTTP thread, each process's main thread before its other threads, then by
/// how telling the state is, then component, pid, tid.
pub(super) fn threads_stuck_first(s: &Snapshot, threads: &mut [usize]) {
    let suspect = suspicion(s);
    let roles: HashMap<&str, Role> = s
        .components
        .iter()
        .map(|c| (c.id.as_str(), c.role))
        .collect();
    threads.sort_by_cached_key(|&i| {
        let t = &s.threads[i];
        let comp = t.component.as_deref();
        let sev = comp.and_then(|c| suspect.get(c)).copied();
        (
            Reverse(sev),
            role_rank(&roles, comp),
            !is_main(t),
            state_rank(&t.state),
            comp.map(str::to_string),
            t.pid,
            t.tid,
        )
    });
}

/// Exchanges held by a stuck request first, then those in flight, most silent first.
pub(super) fn connections_stuck_first(s: &Snapshot, rows: &[RequestRow], conns: &mut [usize]) {
    let held = |i: usize| {
        let r = &s.requests[i];
        rows.get(i).is_some_and(|row| row.stuck)
            && in_flight(r.state)
            && r.state != RequestState::Streaming
    };
    conns.sort_by(|&a, &b| {
        let (ra, rb) = (&s.requests[a], &s.requests[b]);
        held(b)
            .cmp(&held(a))
            .then(in_flight(rb.state).cmp(&in_flight(ra.state)))
            .then(rb.idle_out_ms.total_cmp(&ra.idle_out_ms))
            .then(ra.id.cmp(&rb.id))
    });
}

/// The Diff tab: the changes of `subject`'s engine and its processes first (the hop being
/// followed, else the most severe finding's), the rest after in their order.
pub(super) fn changes_subject_first(s: &Snapshot, subject: Option<&str>, changes: &mut [usize]) {
    let Some(top) = subject else {
        return;
    };
    changes.sort_by_key(|&i| {
        !s.config_changed
            .get(i)
            .is_some_and(|c| in_family(s, top, &c.component))
    });
}
