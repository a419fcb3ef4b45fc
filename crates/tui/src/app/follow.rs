//! Following a finding: from what the cursor is on (a finding, a request, a thread, a
//! component) to the hop it blames, then one key each to that hop's scheduler thread (`t`),
//! its configuration changes (`d`) and its metrics (`m`); esc goes back the way it came.
//!
//! The hop followed (the focus) orders the Diff and Metrics tabs (its changes and series
//! first); without one they put the most severe finding's hop first.

use super::{App, Tab};
use crate::model::{Finding, Role, SnapThread, Snapshot, Verdict};

/// Where `t`, `d` and `m` go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jump {
    Thread,
    Diff,
    Metrics,
}

impl Jump {
    fn tab(self) -> Tab {
        match self {
            Jump::Thread => Tab::Threads,
            Jump::Diff => Tab::Diff,
            Jump::Metrics => Tab::Metrics,
        }
    }
}

/// How many tabs esc can walk back.
const BACK_MAX: usize = 8;

/// The top-level component `id` belongs to: itself, or up its parents. A bounded walk: a
/// parent cycle in a hostile snapshot must not spin.
pub fn top_level<'a>(s: &'a Snapshot, id: &'a str) -> &'a str {
    let mut at = id;
    for _ in 0..8 {
        match s
            .components
            .iter()
            .find(|c| c.id == at)
            .and_then(|c| c.parent.as_deref())
        {
            Some(p) => at = p,
            None => break,
        }
    }
    at
}

/// Whether `id` is `subject`'s engine or one of its processes (scheduler, detokenizer): the
/// report folds their findings and changes into the engine's, and so does following.
pub fn in_family(s: &Snapshot, subject: &str, id: &str) -> bool {
    top_level(s, subject) == top_level(s, id)
}

/// The hop of the most severe finding that names one (the first of equals, as the header's
/// headline picks it).
pub fn worst_component(s: &Snapshot) -> Option<&str> {
    let with_hop = || s.findings.iter().filter(|f| f.component.is_some());
    let sev = with_hop().map(|f| f.severity).max()?;
    with_hop()
        .find(|f| f.severity == sev)
        .and_then(|f| f.component.as_deref())
}

/// The hop a finding blames: its component, else where its requests are stuck.
fn blamed<'a>(s: &'a Snapshot, f: &'a Finding) -> Option<&'a str> {
    f.component.as_deref().or_else(|| {
        s.logical_requests
            .iter()
            .filter(|l| f.requests.contains(&l.id) && l.verdict == Verdict::Stuck)
            .find_map(|l| l.stuck_at.as_deref())
    })
}

/// The thread `t` goes to among `threads` (indices into `s.threads`): the main thread of
/// the family's scheduler, else any of its scheduler's, else the engine's main thread.
fn scheduler_thread(s: &Snapshot, threads: &[usize], subject: &str) -> Option<usize> {
    let role = |t: &SnapThread| {
        t.component
            .as_deref()
            .and_then(|c| s.components.iter().find(|x| x.id == c))
            .map(|c| c.role)
    };
    threads
        .iter()
        .enumerate()
        .filter_map(|(pos, &i)| Some((pos, s.threads.get(i)?)))
        .filter(|(_, t)| {
            t.component
                .as_deref()
                .is_some_and(|c| in_family(s, subject, c))
        })
        .min_by_key(|(_, t)| {
            let main = t.tid == t.pid || t.name.as_deref() == Some("MainThread");
            (
                role(t) != Some(Role::Scheduler),
                !main,
                t.component.clone(),
                t.tid,
            )
        })
        .map(|(pos, _)| pos)
}

impl App {
    /// The hop followed with `t`/`d`/`m` (None: not following).
    pub fn focus(&self) -> Option<&str> {
        self.focus.as_deref()
    }

    /// Whether esc goes back to a tab `t`/`d`/`m` came from.
    pub fn can_go_back(&self) -> bool {
        !self.back.is_empty()
    }

    /// The hop the Diff and Metrics tabs put first: the one followed, else the most
    /// severe finding's.
    pub(super) fn subject_of_views(&self) -> Option<String> {
        let s = self.snapshot()?;
        self.focus
            .clone()
            .or_else(|| worst_component(s).map(str::to_string))
    }

    /// The hop `t`/`d`/`m` follow from what the cursor is on: the finding's blamed hop, the
    /// request's stuck (else deepest) hop, the thread's, change's, series' or component's;
    /// else the most severe finding's.
    pub fn subject(&self) -> Option<String> {
        let s = self.snapshot()?;
        let d = &self.derived;
        let sel = self.selected();
        let here = match self.tab {
            Tab::Overview => self
                .finding_rows
                .get(sel)
                .and_then(|r| s.findings.get(r.finding))
                .and_then(|f| blamed(s, f)),
            Tab::Requests => self.request_hop(),
            Tab::Threads => d
                .threads
                .get(sel)
                .and_then(|&i| s.threads.get(i))
                .and_then(|t| t.component.as_deref()),
            Tab::Diff => d
                .changes
                .get(sel)
                .and_then(|&i| s.config_changed.get(i))
                .map(|c| c.component.as_str()),
            Tab::Metrics => d
                .metric_lines
                .get(sel)
                .and_then(|(ci, _)| s.components.get(*ci))
                .map(|c| c.id.as_str()),
            Tab::Components => s.components.get(sel).map(|c| c.id.as_str()),
            Tab::Sockets => self
                .selected_connection()
                .and_then(|k| d.connections.get(k))
                .and_then(|&i| s.requests.get(i))
                .map(|r| r.component.as_str()),
            Tab::Gpu => None,
        };
        here.or_else(|| worst_component(s)).map(str::to_string)
    }

    /// The selected request's stuck hop, else its deepest hop.
    fn request_hop(&self) -> Option<&str> {
        let s = self.snapshot()?;
        let d = &self.derived;
        let row = d.rows.get(*d.request_order.get(self.selected())?)?;
        let stuck = d
            .chain_request
            .get(row.chain)
            .copied()
            .flatten()
            .and_then(|li| s.logical_requests.get(li))
            .and_then(|l| l.stuck_at.as_deref());
        stuck.or_else(|| {
            d.chains
                .get(row.chain)?
                .iter()
                .filter_map(|&m| Some((m, d.rows.get(m)?.lane)))
                .max_by_key(|&(_, lane)| lane)
                .and_then(|(m, _)| s.requests.get(m))
                .map(|r| r.component.as_str())
        })
    }

    /// `t`, `d`, `m`: to the subject's scheduler thread, changes or metrics, remembering
    /// where esc goes back to.
    pub(super) fn follow(&mut self, jump: Jump) {
        let Some(subject) = self.subject() else {
            self.status = Some("nothing to follow: no hop is named here".into());
            return;
        };
        let from = self.tab;
        self.focus = Some(subject.clone());
        self.recompute();
        self.tab = jump.tab();
        self.detail = false;
        self.detail_scroll = 0;
        if from != self.tab {
            if self.back.len() == BACK_MAX {
                self.back.remove(0);
            }
            self.back.push(from);
        }
        let found = self.select_for(jump, &subject);
        self.status = Some(match (jump, found) {
            (Jump::Thread, true) => format!("{subject}: its scheduler thread · esc back"),
            (Jump::Thread, false) => format!("no thread dump of {subject} · esc back"),
            (Jump::Diff, true) => format!("{subject}: its changes first · esc back"),
            (Jump::Diff, false) => {
                format!("no changes of {subject} against the baseline · esc back")
            }
            (Jump::Metrics, true) => format!("{subject}: its metrics first · esc back"),
            (Jump::Metrics, false) => format!("no metrics from {subject} · esc back"),
        });
    }

    /// Puts the cursor of `jump`'s tab on the subject's row; false when it has none.
    fn select_for(&mut self, jump: Jump, subject: &str) -> bool {
        let Some(s) = self.current.as_ref().map(|f| &f.snapshot) else {
            return false;
        };
        let d = &self.derived;
        let pos = match jump {
            Jump::Thread => scheduler_thread(s, &d.threads, subject),
            // Ordered with the subject's first (`after_derive`): the first row, if its.
            Jump::Diff => d
                .changes
                .first()
                .and_then(|&i| s.config_changed.get(i))
                .filter(|c| in_family(s, subject, &c.component))
                .map(|_| 0),
            Jump::Metrics => d
                .metric_lines
                .first()
                .and_then(|(ci, _)| s.components.get(*ci))
                .filter(|c| in_family(s, subject, &c.id))
                .map(|_| 0),
        };
        self.selected[jump.tab().index()] = pos.unwrap_or(0);
        pos.is_some()
    }

    /// Esc after following: back to the tab it came from (the trail ends there).
    pub(super) fn go_back(&mut self) -> bool {
        let Some(tab) = self.back.pop() else {
            return false;
        };
        self.tab = tab;
        self.detail = false;
        self.detail_scroll = 0;
        self.status = None;
        if self.back.is_empty() {
            self.focus = None;
            self.recompute();
        }
        true
    }

    /// A tab changed by hand (tab, 1-8) leaves the trail.
    pub(super) fn leave_trail(&mut self) {
        self.back.clear();
        if self.focus.take().is_some() {
            self.recompute();
        }
    }
}
