//! Stack captures -> per-thread windows (classified state per dump) of a component.

use super::Model;
use crate::clock::Millis;
use crate::model::{Component, StackCapture, ThreadState};
use std::collections::BTreeMap;

/// One scheduler (or other) thread across the stack dumps of the window.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadWindow {
    pub pid: i32,
    pub tid: i32,
    pub name: Option<String>,
    /// Classified state per dump, oldest first.
    pub states: Vec<ThreadState>,
    /// Innermost frame per dump, oldest first.
    pub top_frames: Vec<String>,
    /// Frames of the latest dump, rendered.
    pub frames: Vec<String>,
    /// The rule that decided the latest dump's state, and the frame it matched.
    pub rule: Option<String>,
    pub decided_by: Option<String>,
}

impl Model {
    pub(super) fn ingest_stacks(&mut self, t: Millis, caps: &[StackCapture]) {
        for c in caps {
            let mut c = c.clone();
            if c.t_ms == 0 {
                c.t_ms = t;
            }
            self.stacks.push_back(c);
        }
    }
}

impl Model {
    pub(super) fn thread_windows(&self, c: &Component, now: Millis) -> Vec<ThreadWindow> {
        let from = now - self.window_ms;
        let mut by_tid: BTreeMap<(i32, i32), ThreadWindow> = BTreeMap::new();
        for cap in self
            .stacks
            .iter()
            .filter(|s| s.t_ms >= from && s.t_ms <= now && c.pids.contains(&s.pid))
        {
            if cap.error.is_some() || cap.skipped.is_some() {
                continue;
            }
            for th in &cap.threads {
                let w = by_tid.entry((cap.pid, th.tid)).or_insert(ThreadWindow {
                    pid: cap.pid,
                    tid: th.tid,
                    name: th.name.clone(),
                    states: Vec::new(),
                    top_frames: Vec::new(),
                    frames: Vec::new(),
                    rule: None,
                    decided_by: None,
                });
                w.states.push(th.state.clone());
                w.rule.clone_from(&th.rule);
                w.decided_by.clone_from(&th.decided_by);
                w.top_frames
                    .push(th.frames.first().map(|f| f.render()).unwrap_or_default());
                w.frames = th.frames.iter().map(|f| f.render()).collect();
            }
        }
        by_tid.into_values().collect()
    }
}
