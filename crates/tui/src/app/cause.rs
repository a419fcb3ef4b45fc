//! The header's cause line: the change on the hop where requests are stuck and the first
//! request it left unanswered, on one time line ("09:29:10 decode restarted (+SGLANG_X) ->
//! 09:29:14 first request never answered").
//!
//! Read from the time line report.md opens with (`model::cause`): one rule, read everywhere.

use crate::clock::{parse_rfc3339, Millis};
use crate::model::cause::EventKind;
use crate::model::Snapshot;

/// What changed on the suspect hop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CauseChange {
    /// The hop: its role when no other top-level component has it, else its id.
    pub hop: String,
    /// Its processes were replaced (a restart), at this time when known.
    pub restarted: bool,
    pub restarted_at: Option<Millis>,
    /// Environment, command-line, version and config changes: `+NAME=value` added, `-NAME`
    /// removed, `~NAME=value` changed (each once, though the engine's processes all carry it).
    pub keys: Vec<String>,
}

/// The first request left unanswered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CauseEffect {
    /// When it entered the stack.
    pub at: Millis,
    pub request: String,
    /// Its response started, then stopped (`stalled_stream`), rather than never starting.
    pub stalled: bool,
    /// Requests stuck at that hop in all.
    pub stuck: usize,
    pub hop: String,
}

/// One line of cause and effect: no line without a stuck request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    pub change: Option<CauseChange>,
    pub effect: CauseEffect,
}

/// The cause line of `s`: the snapshot's time line (`model::cause`, computed once when the
/// snapshot was assembled; computed here for a snapshot that carries none), its first stuck
/// request as the effect and its suspect as the change.
pub fn cause(s: &Snapshot) -> Option<Cause> {
    let line = s.cause.clone().or_else(|| crate::model::cause::of(s))?;
    let first = line.events.iter().find(|e| {
        matches!(
            e.kind,
            EventKind::FirstNoResponse
                | EventKind::FirstStreamStalled
                | EventKind::FirstKvTransferStalled
        )
    })?;
    let effect = CauseEffect {
        at: first.at.as_deref().and_then(parse_rfc3339)?,
        request: first.detail.first()?.clone(),
        stalled: first.kind == EventKind::FirstStreamStalled,
        stuck: first.detail.len(),
        hop: first.name.clone(),
    };
    let change = line.suspect.as_ref().map(|suspect| {
        let restart = line
            .events
            .iter()
            .find(|e| e.component == suspect.component && e.kind == EventKind::Restarted);
        CauseChange {
            hop: suspect.name.clone(),
            restarted: restart.is_some(),
            restarted_at: restart.and_then(|e| parse_rfc3339(e.at.as_deref()?)),
            keys: suspect.changes.clone(),
        }
    });
    Some(Cause { change, effect })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Verdict;

    fn demo() -> Snapshot {
        serde_json::from_str(include_str!(
            "../../../../tests/fixtures/snapshots/demo.json"
        ))
        .expect("fixture")
    }

    #[test]
    fn the_demo_restart_comes_before_its_first_stuck_request() {
        let s = demo();
        let c = cause(&s).expect("requests are stuck");
        assert_eq!(
            c.change,
            Some(CauseChange {
                hop: "decode".into(),
                restarted: true,
                restarted_at: parse_rfc3339("2026-12-05T09:29:10.120Z"),
                // Once, though decode, its scheduler and its detokenizer all carry it.
                keys: vec!["+SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100".into()],
            })
        );
        // The stuck request that entered first (r25 and r36 are 30.268 s old).
        assert_eq!(
            c.effect.at,
            parse_rfc3339("2026-12-05T09:29:14.134Z").unwrap_or(0)
        );
        assert_eq!((c.effect.stuck, c.effect.hop.as_str()), (2, "decode"));
        assert!(!c.effect.stalled);
    }

    #[test]
    fn no_stuck_request_no_line_and_a_change_elsewhere_is_named_as_the_time_line_names_it() {
        let mut s = demo();
        // Decode's changes moved to prefill: the time line's suspect is then the newest change
        // before the first stuck request (model::cause), and the header says so.
        for ch in &mut s.config_changed {
            if ch.component.contains("decode") {
                ch.component = "prefill@127.0.0.1:26180".into();
            }
        }
        let c = cause(&s).expect("still stuck");
        let change = c.change.expect("the newest change before it");
        assert_eq!(change.hop, "prefill");
        assert_eq!(c.effect.hop, "decode");
        for l in &mut s.logical_requests {
            l.verdict = Verdict::Done;
        }
        assert_eq!(cause(&s), None);
        // A hostile age does not overflow: the effect's time is unknown, and there is no line.
        let mut s = demo();
        for l in &mut s.logical_requests {
            l.age_ms = f64::MAX;
        }
        let taken = parse_rfc3339(&s.taken_at).expect("taken_at");
        assert!(cause(&s).is_none_or(|c| c.effect.at <= taken));
    }
}
