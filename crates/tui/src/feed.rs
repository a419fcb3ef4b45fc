//! Where the UI gets its data: a [`Feed`] hands over the newest [`FeedFrame`] when asked and
//! never blocks. Two implementations: [`ReplayFeed`] (a fixed list of snapshots, with pause,
//! step, seek and speed driven by an injected clock) and [`ChannelFeed`] (live frames pushed
//! by the daemon/sampler through a channel).

use crate::clock::{parse_rfc3339, Millis};
use crate::model::Snapshot;
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};

/// How the sampler itself is doing, shown in the header next to the source statuses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SamplerHealth {
    /// How far behind its schedule the sampler is (None: not measured, e.g. in replay).
    pub lag_ms: Option<u64>,
    /// Samples dropped since the start (a source too slow for its tick, a full queue).
    pub dropped_samples: u64,
    /// Anything else the sampler wants the engineer to know (short).
    pub note: Option<String>,
}

/// One update for the UI: a correlated snapshot and the sampler's health at that time.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedFrame {
    pub snapshot: Snapshot,
    pub sampler: SamplerHealth,
}

impl FeedFrame {
    /// The UI's one way in: the snapshot is redacted again (unless taken with
    /// `--no-redact`) and its strings neutralised, so a control sequence in a cmdline never
    /// reaches the terminal.
    pub fn new(snapshot: Snapshot) -> Self {
        let snapshot = crate::redact::for_output(&[&snapshot], snapshot.redacted)
            .and_then(|mut v| v.pop())
            .unwrap_or_else(|| Snapshot {
                components: Vec::new(),
                threads: Vec::new(),
                config_changed: Vec::new(),
                ..snapshot
            });
        FeedFrame {
            snapshot,
            sampler: SamplerHealth::default(),
        }
    }
}

/// Commands the replay keys send to the feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayCommand {
    TogglePause,
    /// Pause and move one frame forward (positive) or back (negative).
    Step(i64),
    /// Move this many frames forward or back, keeping the play/pause state.
    Seek(i64),
    Faster,
    Slower,
}

/// Where a replay stands, for the header.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReplayStatus {
    /// 0-based index of the frame on screen.
    pub position: usize,
    pub len: usize,
    pub paused: bool,
    pub speed: f64,
}

/// What kind of feed this is, for the header.
#[derive(Debug, Clone, PartialEq)]
pub enum FeedState {
    Live,
    Replay(ReplayStatus),
    /// The producer went away (daemon stopped, sampler thread ended): the UI keeps showing
    /// the last frame and says so.
    Disconnected(String),
}

/// A non-blocking source of frames. `latest` is called once per UI tick.
pub trait Feed {
    /// The newest frame not yet handed out, if any. Must return immediately.
    fn latest(&mut self, now_ms: Millis) -> Option<FeedFrame>;
    /// What the header should say about this feed.
    fn state(&self) -> FeedState;
    /// Replay keys; live feeds ignore them and return false.
    fn control(&mut self, command: ReplayCommand, now_ms: Millis) -> bool {
        let _ = (command, now_ms);
        false
    }
}

/// Live frames from a channel. The producer (daemon client or in-process sampler) sends
/// [`FeedFrame`]s; the UI drains everything queued each tick and keeps only the newest, so a
/// slow UI never makes the queue grow.
#[derive(Debug)]
pub struct ChannelFeed {
    rx: Receiver<FeedFrame>,
    disconnected: bool,
    received: u64,
}

impl ChannelFeed {
    pub fn new(rx: Receiver<FeedFrame>) -> Self {
        ChannelFeed {
            rx,
            disconnected: false,
            received: 0,
        }
    }

    /// A connected sender/feed pair.
    pub fn channel() -> (Sender<FeedFrame>, ChannelFeed) {
        let (tx, rx) = mpsc::channel();
        (tx, ChannelFeed::new(rx))
    }

    /// Frames received so far (including the ones superseded before the UI showed them).
    pub fn received(&self) -> u64 {
        self.received
    }
}

impl Feed for ChannelFeed {
    fn latest(&mut self, _now_ms: Millis) -> Option<FeedFrame> {
        let mut newest = None;
        // Bounded by what is queued right now: try_recv never waits.
        loop {
            match self.rx.try_recv() {
                Ok(frame) => {
                    self.received += 1;
                    newest = Some(frame);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    self.disconnected = true;
                    break;
                }
            }
        }
        newest
    }

    fn state(&self) -> FeedState {
        if self.disconnected {
            FeedState::Disconnected("sampler stopped sending".to_string())
        } else {
            FeedState::Live
        }
    }
}

/// The header's note on a still frame.
pub const STILL_NOTE: &str = "still frame (a snapshot, not a recording)";

/// Used when a snapshot's `taken_at` cannot be parsed or does not move forward.
const DEFAULT_FRAME_INTERVAL_MS: i64 = 1000;
const MIN_SPEED: f64 = 0.25;
const MAX_SPEED: f64 = 64.0;

/// Plays a fixed list of frames at their recorded pace (scaled by `speed`), with pause, step,
/// seek and speed. Time comes from the caller (`now_ms`), so tests drive it by hand.
#[derive(Debug)]
pub struct ReplayFeed {
    frames: Vec<FeedFrame>,
    /// Recorded time of each frame (ms), monotonic.
    times: Vec<Millis>,
    position: usize,
    paused: bool,
    speed: f64,
    /// Wall time at which the current frame started showing (None until first `latest`).
    shown_since: Option<Millis>,
    /// The frame at `position` still has to be handed to the UI.
    dirty: bool,
}

impl ReplayFeed {
    pub fn new(frames: Vec<FeedFrame>) -> Self {
        let mut times = Vec::with_capacity(frames.len());
        let mut last: Option<Millis> = None;
        for f in &frames {
            let t = parse_rfc3339(&f.snapshot.taken_at)
                .filter(|t| last.is_none_or(|l| *t > l))
                .unwrap_or_else(|| last.map_or(0, |l| l + DEFAULT_FRAME_INTERVAL_MS));
            times.push(t);
            last = Some(t);
        }
        ReplayFeed {
            frames,
            times,
            position: 0,
            paused: false,
            speed: 1.0,
            shown_since: None,
            dirty: true,
        }
    }

    /// Convenience: frames from snapshots (sampler health unknown in a recording).
    pub fn from_snapshots(snapshots: Vec<Snapshot>) -> Self {
        ReplayFeed::new(snapshots.into_iter().map(FeedFrame::new).collect())
    }

    /// Frames from snapshots, each with `note` in the header (what reading the recording
    /// skipped: the engineer must know the replay has gaps).
    pub fn with_note(snapshots: Vec<Snapshot>, note: Option<String>) -> Self {
        let frame = |snapshot| FeedFrame {
            snapshot,
            sampler: SamplerHealth {
                note: note.clone(),
                ..SamplerHealth::default()
            },
        };
        ReplayFeed::new(snapshots.into_iter().map(frame).collect())
    }

    /// One snapshot (a bundle or `snapshot.json` from a bug report) as a still frame: every
    /// tab, no timeline; the header says it is not a recording.
    pub fn still(snapshot: Snapshot) -> Self {
        ReplayFeed::with_note(vec![snapshot], Some(STILL_NOTE.to_string()))
    }

    pub fn status(&self) -> ReplayStatus {
        ReplayStatus {
            position: self.position,
            len: self.frames.len(),
            paused: self.paused,
            speed: self.speed,
        }
    }

    fn move_to(&mut self, position: usize, now_ms: Millis) {
        let last = self.frames.len().saturating_sub(1);
        let position = position.min(last);
        if position != self.position {
            self.position = position;
            self.dirty = true;
        }
        self.shown_since = Some(now_ms);
    }

    /// How long the current frame stays on screen at the current speed.
    fn dwell_ms(&self) -> f64 {
        let next = self.position + 1;
        let recorded = match (self.times.get(self.position), self.times.get(next)) {
            (Some(a), Some(b)) => (b - a) as f64,
            _ => DEFAULT_FRAME_INTERVAL_MS as f64,
        };
        recorded / self.speed
    }
}

impl Feed for ReplayFeed {
    fn latest(&mut self, now_ms: Millis) -> Option<FeedFrame> {
        if self.frames.is_empty() {
            return None;
        }
        let since = *self.shown_since.get_or_insert(now_ms);
        if !self.paused {
            // Advance over every frame whose dwell time has passed (bounded by the list).
            let mut since = since;
            while self.position + 1 < self.frames.len() {
                let dwell = self.dwell_ms();
                if ((now_ms - since) as f64) < dwell {
                    break;
                }
                since += dwell.round() as i64;
                self.position += 1;
                self.dirty = true;
            }
            self.shown_since = Some(since);
        }
        if self.dirty {
            self.dirty = false;
            return self.frames.get(self.position).cloned();
        }
        None
    }

    fn state(&self) -> FeedState {
        FeedState::Replay(self.status())
    }

    fn control(&mut self, command: ReplayCommand, now_ms: Millis) -> bool {
        match command {
            ReplayCommand::TogglePause => {
                self.paused = !self.paused;
                self.shown_since = Some(now_ms);
            }
            ReplayCommand::Step(n) => {
                self.paused = true;
                let target = self.position.saturating_add_signed(n as isize);
                self.move_to(target, now_ms);
            }
            ReplayCommand::Seek(n) => {
                let target = self.position.saturating_add_signed(n as isize);
                self.move_to(target, now_ms);
            }
            ReplayCommand::Faster => self.speed = (self.speed * 2.0).min(MAX_SPEED),
            ReplayCommand::Slower => self.speed = (self.speed / 2.0).max(MIN_SPEED),
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SNAPSHOT_SCHEMA;
    use std::collections::BTreeMap;

    fn snap(taken_at: &str) -> Snapshot {
        Snapshot {
            schema: SNAPSHOT_SCHEMA.to_string(),
            taken_at: taken_at.to_string(),
            window_ms: 1000.0,
            sources: BTreeMap::new(),
            components: vec![],
            requests: vec![],
            gpus: vec![],
            threads: vec![],
            findings: vec![],
            edges: vec![],
            redacted: true,
            config_changed: vec![],
            tool: BTreeMap::new(),
            versions: BTreeMap::new(),
            logical_requests: vec![],
            node: None,
            connections: vec![],
            channels: vec![],
            fleet: None,
            elided: None,
            cause: None,
        }
    }

    /// What reaches the terminal: no live escape sequence, no secret.
    #[test]
    fn frames_are_redacted_and_neutralised() {
        let mut s = snap("2026-11-29T12:00:00.000Z");
        s.threads.push(crate::model::SnapThread {
            pid: 1,
            tid: 1,
            name: Some("t\u{1b}]52;c;aGk=\u{7}".into()),
            state: crate::model::ThreadState::Idle,
            frames: vec!["f (x.py:1) Authorization: Bearer tui-secret-1".into()],
            component: None,
            states_over_window: Vec::new(),
            rule: None,
            decided_by: None,
        });
        let f = FeedFrame::new(s);
        let text = serde_json::to_string(&f.snapshot).unwrap_or_default();
        assert!(!text.contains("tui-secret-1"), "{text}");
        let t = &f.snapshot.threads[0];
        assert_eq!(t.name.as_deref(), Some("t\\x1b]52;c;aGk=\\x07"));
    }

    fn three() -> ReplayFeed {
        ReplayFeed::from_snapshots(vec![
            snap("2026-11-29T12:00:00.000Z"),
            snap("2026-11-29T12:00:02.000Z"),
            snap("2026-11-29T12:00:03.000Z"),
        ])
    }

    #[test]
    fn replay_follows_recorded_pace() {
        let mut f = three();
        let first = f.latest(10_000).map(|x| x.snapshot.taken_at);
        assert_eq!(first.as_deref(), Some("2026-11-29T12:00:00.000Z"));
        // Nothing new until the recorded 2 s have passed.
        assert!(f.latest(11_999).is_none());
        let second = f.latest(12_000).map(|x| x.snapshot.taken_at);
        assert_eq!(second.as_deref(), Some("2026-11-29T12:00:02.000Z"));
        assert_eq!(f.status().position, 1);
        // Far in the future: stops at the last frame.
        assert!(f.latest(99_000).is_some());
        assert_eq!(f.status().position, 2);
        assert!(f.latest(199_000).is_none());
    }

    #[test]
    fn pause_step_seek_and_speed() {
        let mut f = three();
        assert!(f.latest(0).is_some());
        f.control(ReplayCommand::TogglePause, 0);
        assert!(f.latest(60_000).is_none(), "paused replay must not advance");
        f.control(ReplayCommand::Step(1), 60_000);
        assert_eq!(f.status().position, 1);
        assert!(f.status().paused);
        assert!(f.latest(60_000).is_some());
        f.control(ReplayCommand::Step(-5), 60_000);
        assert_eq!(f.status().position, 0);
        f.control(ReplayCommand::Seek(10), 60_000);
        assert_eq!(f.status().position, 2);
        f.control(ReplayCommand::Faster, 0);
        f.control(ReplayCommand::Faster, 0);
        assert_eq!(f.status().speed, 4.0);
        for _ in 0..20 {
            f.control(ReplayCommand::Slower, 0);
        }
        assert_eq!(f.status().speed, MIN_SPEED);
    }

    #[test]
    fn faster_replay_advances_sooner() {
        let mut f = three();
        f.control(ReplayCommand::Faster, 0);
        assert!(f.latest(0).is_some());
        // 2 s recorded at 2x = 1 s of wall time.
        assert!(f.latest(999).is_none());
        assert!(f.latest(1000).is_some());
    }

    #[test]
    fn channel_keeps_only_the_newest_and_reports_disconnect() {
        let (tx, mut feed) = ChannelFeed::channel();
        assert!(feed.latest(0).is_none());
        for t in ["a", "b", "c"] {
            tx.send(FeedFrame::new(snap(t))).ok();
        }
        let got = feed.latest(0).map(|f| f.snapshot.taken_at);
        assert_eq!(got.as_deref(), Some("c"));
        assert_eq!(feed.received(), 3);
        assert_eq!(feed.state(), FeedState::Live);
        drop(tx);
        assert!(feed.latest(0).is_none());
        assert!(matches!(feed.state(), FeedState::Disconnected(_)));
    }
}
