//! Evidence across the dumps of a window: one dump is a guess, a thread in the same state
//! (or the same innermost frame) in every dump is evidence.

use crate::model::{Frame, StackCapture, ThreadStack, ThreadState};
use std::collections::BTreeMap;

/// What one thread did across the dumps of a window.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadEvidence {
    pub pid: i32,
    pub tid: i32,
    pub name: Option<String>,
    /// Its state in each dump it appeared in, in time order.
    pub states: Vec<ThreadState>,
    /// Dumps of the pid that succeeded (the thread may be missing from some).
    pub dumps: usize,
    /// The state, when the thread was seen in every successful dump (at least 2) in the
    /// same state: evidence, not a guess.
    pub consistent_state: Option<ThreadState>,
    /// The innermost frame, when it was identical (function, file, line) in every dump:
    /// the thread did not move.
    pub same_innermost_frame: Option<String>,
}

/// Groups the captures of a window by thread and says which threads are consistently in
/// one state (see [`ThreadEvidence`]).
pub fn summarize_window(captures: &[StackCapture]) -> Vec<ThreadEvidence> {
    /// A thread's name and its stack in each dump, with the dump's time.
    type Sightings<'a> = (Option<String>, Vec<(i64, &'a ThreadStack)>);
    let mut dumps: BTreeMap<i32, usize> = BTreeMap::new();
    let mut by_thread: BTreeMap<(i32, i32), Sightings> = BTreeMap::new();
    for c in captures {
        if c.error.is_some() || c.skipped.is_some() {
            continue;
        }
        *dumps.entry(c.pid).or_default() += 1;
        for t in &c.threads {
            let e = by_thread
                .entry((c.pid, t.tid))
                .or_insert_with(|| (t.name.clone(), Vec::new()));
            e.1.push((c.t_ms, t));
        }
    }
    by_thread
        .into_iter()
        .map(|((pid, tid), (name, mut seen))| {
            seen.sort_by_key(|(t, _)| *t);
            let n = dumps.get(&pid).copied().unwrap_or(0);
            let states: Vec<ThreadState> = seen.iter().map(|(_, t)| t.state.clone()).collect();
            let every = seen.len() == n && n >= 2;
            let consistent_state =
                (every && states.windows(2).all(|w| w[0] == w[1])).then(|| states[0].clone());
            let inner: Vec<Option<&Frame>> = seen.iter().map(|(_, t)| t.frames.first()).collect();
            let same_innermost_frame = match inner.first() {
                Some(Some(f0)) if every && inner.iter().all(|f| *f == Some(*f0)) => {
                    Some(f0.render())
                }
                _ => None,
            };
            ThreadEvidence {
                pid,
                tid,
                name,
                states,
                dumps: n,
                consistent_state,
                same_innermost_frame,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::CaptureMode;

    #[test]
    fn window_evidence() {
        let a = ThreadStack {
            tid: 1,
            name: Some("MainThread".into()),
            active: true,
            owns_gil: true,
            frames: vec![Frame {
                name: "on_idle".into(),
                file: "/s.py".into(),
                line: 1,
            }],
            state: ThreadState::Idle,
            rule: None,
            decided_by: None,
        };
        let mut b = a.clone();
        b.frames[0].line = 2;
        let cap = |t_ms, th: &ThreadStack| StackCapture {
            pid: 7,
            t_ms,
            mode: CaptureMode::Nonblocking,
            error: None,
            skipped: None,
            warnings: vec![],
            threads: vec![th.clone()],
        };
        let ev = summarize_window(&[cap(1, &a), cap(2, &a), cap(3, &b)]);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].consistent_state, Some(ThreadState::Idle));
        assert_eq!(ev[0].same_innermost_frame, None);
        let ev = summarize_window(&[cap(1, &a), cap(2, &a)]);
        assert_eq!(
            ev[0].same_innermost_frame.as_deref(),
            Some("on_idle (/s.py:1)")
        );
        let ev = summarize_window(&[cap(1, &a)]);
        assert_eq!(ev[0].consistent_state, None, "one dump is a guess");
    }
}
