//! `scheduler_stuck` (critical): a scheduler's main thread outside its loop, or in the same
//! innermost frame while `unknown`, in every dump (at least `scheduler_min_dumps`). See
//! `scheduler_stuck` in docs/findings.md.
//!
//! Thresholds read: `scheduler_min_dumps`.

use super::join_states;
use crate::correlate::{Correlator, View};
use crate::model::{Evidence, Finding, FindingKind, Role, Severity, ThreadState};

/// `scheduler_stuck`: a scheduler thread in the same frame outside its loop in every dump.
pub fn scheduler_stuck(m: &Correlator, v: &View) -> Vec<Finding> {
    let th = &m.thresholds;
    let mut out = Vec::new();
    for cs in v.components.values() {
        if !(cs.role.is_engine() || cs.role == Role::Scheduler) {
            continue;
        }
        let engine_main = m.topology().component(&cs.id).and_then(|c| c.main_pid);
        for t in &cs.threads {
            // Only scheduler processes run the loop this judges: an engine's own HTTP
            // process legitimately sits in one frame (epoll, queue waits) forever.
            if cs.role.is_engine() && Some(t.pid) == engine_main {
                continue;
            }
            // Threads are judged under their most specific component only.
            if m.topology().component_of_pid(t.pid).map(|c| c.id.as_str()) != Some(cs.id.as_str()) {
                continue;
            }
            // The loop runs on the main thread; watchdogs and transfer threads wait by design.
            if t.tid != t.pid && t.name.as_deref() != Some("MainThread") {
                continue;
            }
            if t.states.len() < th.detect.scheduler_min_dumps {
                continue;
            }
            // Left the loop for good (`threading._shutdown`) counts like stuck outside it;
            // start-up only when the very same frame is seen in every dump.
            let all_stuck = t
                .states
                .iter()
                .all(|s| matches!(s, ThreadState::StuckOutsideLoop | ThreadState::Shutdown));
            let same_frame = t
                .top_frames
                .iter()
                .all(|f| !f.is_empty() && *f == t.top_frames[0])
                && t.states.iter().all(|s| {
                    matches!(
                        s,
                        ThreadState::StuckOutsideLoop
                            | ThreadState::Unknown
                            | ThreadState::Shutdown
                            | ThreadState::Startup
                    )
                });
            if !(all_stuck || same_frame) {
                continue;
            }
            let frame = t.top_frames.last().cloned().unwrap_or_default();
            out.push(Finding {
                kind: FindingKind::SchedulerStuck,
                severity: Severity::Critical,
                component: Some(cs.id.clone()),
                role: Some(cs.role),
                summary: format!(
                    "{} thread {} ({}) is stuck in {frame} {}, outside the scheduler loop",
                    cs.id,
                    t.tid,
                    t.name.as_deref().unwrap_or("?"),
                    t.dumps_text(t.states.len()),
                ),
                requests: super::logical_ids(
                    v,
                    &v.requests
                        .iter()
                        .filter(|r| r.x.component == cs.id && View::is_outstanding(r))
                        .collect::<Vec<_>>(),
                ),
                evidence: vec![
                    Evidence::new("stacks", format!("states: {}", join_states(&t.states))),
                    Evidence::new("stacks", format!("latest stack: {}", t.frames.join(" <- "))),
                    Evidence::new("gpu", format!("GPU activity: {}", cs.gpu_activity)),
                ],
                explanation: Some("The scheduler's main thread is not cycling its event loop: a long or infinite operation (eviction, tree cache, grammar, a lock) holds it. /health may still answer. Capture a native stack (py-spy dump --native) and the frame's source.".into()),
            });
        }
    }
    out
}
