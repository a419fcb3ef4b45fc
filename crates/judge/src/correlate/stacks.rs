//! Stack captures -> per-thread windows (classified state per dump) of a component.

use super::Correlator;
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
    /// When each of those dumps was taken, oldest first.
    pub times: Vec<Millis>,
    /// Innermost frame per dump, oldest first.
    pub top_frames: Vec<String>,
    /// Frames of the latest dump, rendered.
    pub frames: Vec<String>,
    /// The rule that decided the latest dump's state, and the frame it matched.
    pub rule: Option<String>,
    pub decided_by: Option<String>,
}

impl ThreadWindow {
    /// How long its dumps span, first to last, in ms (0 for one dump).
    pub fn span_ms(&self) -> i64 {
        match (self.times.first(), self.times.last()) {
            (Some(a), Some(b)) => b.saturating_sub(*a).max(0),
            _ => 0,
        }
    }

    /// "in 3/3 dumps over 12 s": `n` of its dumps, and the time they span (one dump: none).
    pub fn dumps_text(&self, n: usize) -> String {
        let total = self.states.len();
        if total < 2 {
            return format!("in {n}/{total} dumps");
        }
        format!("in {n}/{total} dumps over {}", span_text(self.span_ms()))
    }
}

/// A span of dumps in words: "0.6 s" under 10 s, else whole seconds ("25 s").
pub fn span_text(ms: i64) -> String {
    if ms < 10_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{} s", (ms + 500) / 1000)
    }
}

impl Correlator {
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

impl Correlator {
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
                    times: Vec::new(),
                    top_frames: Vec::new(),
                    frames: Vec::new(),
                    rule: None,
                    decided_by: None,
                });
                w.states.push(th.state.clone());
                w.times.push(cap.t_ms);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn window(times: &[Millis]) -> ThreadWindow {
        ThreadWindow {
            pid: 1,
            tid: 1,
            name: None,
            states: times.iter().map(|_| ThreadState::Idle).collect(),
            times: times.to_vec(),
            top_frames: Vec::new(),
            frames: Vec::new(),
            rule: None,
            decided_by: None,
        }
    }

    #[test]
    fn dumps_say_over_what_time_they_were_taken() {
        assert_eq!(
            window(&[1_000, 1_300, 1_600]).dumps_text(3),
            "in 3/3 dumps over 0.6 s"
        );
        let ticks: Vec<Millis> = (0..6).map(|i| i * 5_000).collect();
        assert_eq!(window(&ticks).dumps_text(6), "in 6/6 dumps over 25 s");
        assert_eq!(window(&ticks).dumps_text(4), "in 4/6 dumps over 25 s");
        assert_eq!(
            window(&[7]).dumps_text(1),
            "in 1/1 dumps",
            "one dump spans nothing"
        );
        assert_eq!(span_text(9_940), "9.9 s");
        assert_eq!(span_text(10_499), "10 s");
    }
}
