//! The header's cause line: the change on the hop where requests are stuck and the first
//! request it left unanswered, on one time line ("09:29:10 decode restarted (+SGLANG_X) ->
//! 09:29:14 first request never answered").
//!
//! Derived here from what the snapshot carries (its changes against the baseline, the
//! components' start times, the stuck requests' ages), in this one function, so that it can
//! be swapped for a timeline shared with report.md once there is one.

use super::follow::{in_family, top_level};
use crate::clock::{parse_rfc3339, Millis};
use crate::model::{Snapshot, StuckKind, Verdict};

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

/// A hop's name in the line: `decode` when it is the only top-level `decode`, else its id.
fn hop_name(s: &Snapshot, id: &str) -> String {
    let top = top_level(s, id);
    let Some(c) = s.components.iter().find(|c| c.id == top) else {
        return top.to_string();
    };
    let same_role = s
        .components
        .iter()
        .filter(|x| x.parent.is_none() && x.role == c.role)
        .count();
    if same_role == 1 {
        c.role.as_str().to_string()
    } else {
        c.id.clone()
    }
}

/// The cause line of `s` (see the module doc).
pub fn cause(s: &Snapshot) -> Option<Cause> {
    let taken = parse_rfc3339(&s.taken_at)?;
    let stuck: Vec<_> = s
        .logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Stuck && l.stuck_at.is_some())
        .collect();
    let first = stuck.iter().max_by(|a, b| a.age_ms.total_cmp(&b.age_ms))?;
    let suspect = first.stuck_at.as_deref()?;
    let effect = CauseEffect {
        at: taken.saturating_sub(first.age_ms.max(0.0) as Millis),
        request: first.id.clone(),
        stalled: first.stuck_kind == Some(StuckKind::StreamStalled),
        stuck: stuck
            .iter()
            .filter(|l| {
                l.stuck_at
                    .as_deref()
                    .is_some_and(|c| in_family(s, suspect, c))
            })
            .count(),
        hop: hop_name(s, suspect),
    };
    let changes: Vec<_> = s
        .config_changed
        .iter()
        .filter(|c| c.field != "topology" && in_family(s, suspect, &c.component))
        .collect();
    let restarts: Vec<&str> = changes
        .iter()
        .filter(|c| c.field == "process")
        .map(|c| c.component.as_str())
        .collect();
    let restarted_at = s
        .components
        .iter()
        .filter(|c| restarts.contains(&c.id.as_str()))
        .filter_map(|c| parse_rfc3339(c.started_at.as_deref()?))
        .min();
    let mut keys: Vec<String> = Vec::new();
    for c in changes.iter().filter(|c| c.field != "process") {
        let name = c.key.as_deref().unwrap_or(&c.field);
        let key = match (&c.before, &c.after) {
            (None, Some(v)) => format!("+{name}={v}"),
            (Some(_), None) => format!("-{name}"),
            (_, Some(v)) => format!("~{name}={v}"),
            (None, None) => format!("~{name}"),
        };
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let change = (!changes.is_empty()).then(|| CauseChange {
        hop: hop_name(s, suspect),
        restarted: !restarts.is_empty(),
        restarted_at,
        keys,
    });
    Some(Cause { change, effect })
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn no_stuck_request_no_line_and_other_hops_changes_are_not_the_cause() {
        let mut s = demo();
        // The proxy's appearance (a topology change) and changes elsewhere are not named.
        for ch in &mut s.config_changed {
            if ch.component.contains("decode") {
                ch.component = "prefill@127.0.0.1:26180".into();
            }
        }
        let c = cause(&s).expect("still stuck");
        assert_eq!(c.change, None);
        for l in &mut s.logical_requests {
            l.verdict = Verdict::Done;
        }
        assert_eq!(cause(&s), None);
        // A hostile age does not overflow.
        let mut s = demo();
        for l in &mut s.logical_requests {
            l.age_ms = f64::MAX;
        }
        assert!(cause(&s).is_some());
    }
}
