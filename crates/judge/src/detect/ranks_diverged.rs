//! `ranks_diverged` (critical): most of an engine's rank processes wait in one collective
//! while one or more are consistently elsewhere, each judged over at least
//! `scheduler_min_dumps` agreeing dumps, while the engine generates no token. Waits that are
//! normal by design (pipeline point-to-point, TP ranks > 0 in a gloo collective) do not count. Rule and what to do:
//! `ranks_diverged` in docs/findings.md.
//!
//! Thresholds read: `scheduler_min_dumps`.

use super::join_states;
use crate::correlate::{ComponentState, Correlator, ThreadWindow, View};
use crate::model::{Component, Evidence, Finding, FindingKind, Role, Severity, ThreadState};
use std::collections::BTreeMap;

/// `ranks_diverged`: most of an engine's ranks wait in one collective, the odd ones do not.
pub fn ranks_diverged(m: &Correlator, v: &View) -> Vec<Finding> {
    let mut out = Vec::new();
    for cs in v.components.values().filter(|c| c.role.is_engine()) {
        // Tokens still come out: its ranks only take turns at a collective (a rank behind
        // in its forward while the others wait in the all-reduce), not hung apart.
        if cs.gen_rate.is_some_and(|r| r > 0.0) {
            continue;
        }
        let Some(ranks) = ranks_of(m, v, &cs.id) else {
            continue;
        };
        if let Some(split) = Split::of(&ranks) {
            out.push(split.finding(m, v, cs));
        }
    }
    out
}

/// One rank process: its label (`TP3`, `DP1_TP3`), pid and main thread's window.
struct Rank<'a> {
    label: String,
    pid: i32,
    thread: &'a ThreadWindow,
    place: Place,
}

/// Where a rank's main thread is in every dump of the window: its state and, for a
/// collective, which one (the deciding rule and the function it matched).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Place {
    state: ThreadState,
    what: String,
}

impl Place {
    /// The thread's place when every dump (at least `min_dumps`) agrees; else none.
    fn of(t: &ThreadWindow, min_dumps: usize) -> Option<Place> {
        let first = t.states.first()?;
        if t.states.len() < min_dumps.max(2) || t.states.iter().any(|s| s != first) {
            return None;
        }
        let frame = t
            .decided_by
            .as_deref()
            .or(t.top_frames.last().map(String::as_str));
        let function = frame.map(|f| f.split(" (").next().unwrap_or(f));
        let what = match (t.rule.as_deref(), function) {
            (Some(r), Some(f)) => format!("{f} ({r})"),
            (None, Some(f)) => f.to_string(),
            (Some(r), None) => r.to_string(),
            (None, None) => String::new(),
        };
        Some(Place {
            state: first.clone(),
            what,
        })
    }

    fn is_collective(&self) -> bool {
        self.state.is_peer_wait() && self.state != ThreadState::P2pWait
    }

    /// Device collectives say more than CPU ones: on a tie they are "the" collective.
    fn weight(&self) -> u8 {
        match self.state {
            ThreadState::NcclCollective => 3,
            ThreadState::Collective => 2,
            ThreadState::GlooCollective => 1,
            _ => 0,
        }
    }

    fn describe(&self) -> String {
        if self.what.is_empty() {
            self.state.to_string()
        } else {
            format!("{} in {}", self.state, self.what)
        }
    }
}

/// The engine's rank processes with their places, when there are at least two and every one
/// is judged (a rank still moving between dumps says the engine is not hung the same way).
fn ranks_of<'a>(m: &Correlator, v: &'a View, engine: &str) -> Option<Vec<Rank<'a>>> {
    let topo = m.topology();
    let min = m.thresholds.detect.scheduler_min_dumps;
    let mut ranks = Vec::new();
    for c in topo.components.iter().filter(|c| is_rank_of(c, engine, m)) {
        let cs = v.components.get(&c.id)?;
        let thread = main_thread(m, cs)?;
        ranks.push(Rank {
            label: rank_label(c),
            pid: thread.pid,
            place: Place::of(thread, min)?,
            thread,
        });
    }
    (ranks.len() >= 2).then_some(ranks)
}

fn is_rank_of(c: &Component, engine: &str, m: &Correlator) -> bool {
    c.role == Role::Scheduler
        && (c.parent.as_deref() == Some(engine)
            || m.topology()
                .component(engine)
                .is_some_and(|e| e.children.contains(&c.id)))
}

/// A rank process's main thread (the loop runs there), under its own component.
fn main_thread<'a>(m: &Correlator, cs: &'a ComponentState) -> Option<&'a ThreadWindow> {
    cs.threads.iter().find(|t| {
        (t.tid == t.pid || t.name.as_deref() == Some("MainThread"))
            && m.topology().component_of_pid(t.pid).map(|c| c.id.as_str()) == Some(&cs.id)
    })
}

/// `TP3` from the title `sglang::scheduler_TP3` (or the id `scheduler_TP3@...`).
fn rank_label(c: &Component) -> String {
    let name = c
        .title
        .as_deref()
        .map(|t| t.rsplit("::").next().unwrap_or(t))
        .unwrap_or_else(|| c.id.split('@').next().unwrap_or(&c.id));
    let rank = name.strip_prefix("scheduler_").unwrap_or(name);
    if rank.is_empty() || rank == "scheduler" {
        c.id.clone()
    } else {
        rank.to_string()
    }
}

/// `TP0, TP1, TP2`.
fn labels(rs: &[&Rank]) -> String {
    let names: Vec<&str> = rs.iter().map(|r| r.label.as_str()).collect();
    names.join(", ")
}

/// Most ranks in one collective (`waiting`), the others (`odd`) elsewhere.
struct Split<'a> {
    waiting: Vec<&'a Rank<'a>>,
    odd: Vec<&'a Rank<'a>>,
    total: usize,
}

impl<'a> Split<'a> {
    fn of(ranks: &'a [Rank<'a>]) -> Option<Split<'a>> {
        let mut groups: BTreeMap<&Place, Vec<&Rank>> = BTreeMap::new();
        for r in ranks {
            groups.entry(&r.place).or_default().push(r);
        }
        // The collective most ranks wait in (a device one on a tie).
        let (place, waiting) = groups
            .iter()
            .filter(|(p, _)| p.is_collective())
            .max_by_key(|(p, rs)| (rs.len(), p.weight()))?;
        let odd: Vec<&Rank> = ranks.iter().filter(|r| r.place != **place).collect();
        // "Most": at least half the ranks (TP 2: one in a collective, one elsewhere).
        if odd.is_empty() || waiting.len() * 2 < ranks.len() {
            return None;
        }
        // TP ranks > 0 wait in the CPU group for rank 0's requests while it cycles its loop.
        let loop_states = [
            ThreadState::Idle,
            ThreadState::RunningBatch,
            ThreadState::WaitingGpuResult,
            ThreadState::PdQueuePolling,
        ];
        if place.state == ThreadState::GlooCollective
            && odd.iter().all(|r| loop_states.contains(&r.place.state))
        {
            return None;
        }
        Some(Split {
            waiting: waiting.clone(),
            odd,
            total: ranks.len(),
        })
    }

    /// Each odd rank's states and stack, the collective the others wait in, the GPU.
    fn evidence(&self, m: &Correlator, cs: &ComponentState) -> Vec<Evidence> {
        let mut evidence = Vec::new();
        for r in &self.odd {
            let t = r.thread;
            let states = join_states(&t.states);
            let dumps = t.dumps_text(t.states.len());
            evidence.push(Evidence::new(
                "stacks",
                format!("{} pid {}: {states} {dumps}", r.label, r.pid),
            ));
            evidence.push(Evidence::new(
                "stacks",
                format!("{} stack: {}", r.label, t.frames.join(" <- ")),
            ));
        }
        let w = &self.waiting[0];
        evidence.push(Evidence::new(
            "stacks",
            format!(
                "{} wait in {}: {}",
                labels(&self.waiting),
                w.place.describe(),
                w.thread.frames.join(" <- ")
            ),
        ));
        evidence.push(Evidence::new(
            "stacks",
            format!(
                "every rank in the same place in each of its dumps (at least {})",
                m.thresholds.detect.scheduler_min_dumps
            ),
        ));
        evidence.push(Evidence::new(
            "gpu",
            format!("GPU activity: {}", cs.gpu_activity),
        ));
        evidence
    }

    fn finding(&self, m: &Correlator, v: &View, cs: &ComponentState) -> Finding {
        let place = &self.waiting[0].place;
        let odd_text: Vec<String> = self
            .odd
            .iter()
            .map(|r| format!("{} (pid {}) is {}", r.label, r.pid, r.place.describe()))
            .collect();
        let evidence = self.evidence(m, cs);
        Finding {
            kind: FindingKind::RanksDiverged,
            severity: Severity::Critical,
            component: Some(cs.id.clone()),
            role: Some(cs.role),
            summary: format!(
                "{}: {} of {} ranks ({}) wait in {}; {}",
                cs.id,
                self.waiting.len(),
                self.total,
                labels(&self.waiting),
                place.describe(),
                odd_text.join("; ")
            ),
            requests: super::logical_ids(
                v,
                &v.requests
                    .iter()
                    .filter(|r| r.x.component == cs.id && View::is_outstanding(r))
                    .collect::<Vec<_>>(),
            ),
            evidence,
            explanation: Some(format!(
                "The engine's ranks are split: {} wait in {} for rank(s) {} that went elsewhere. \
                 Every rank must enter the same collectives in the same order; the odd rank's \
                 stack shows where it went (a rank-local decision before the collective: its \
                 batch, a timeout, an exception path). Restarting the engine clears it; the \
                 NCCL flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE) gives the collectives' \
                 sequence on each rank.",
                labels(&self.waiting),
                place.describe(),
                labels(&self.odd),
            )),
        }
    }
}
