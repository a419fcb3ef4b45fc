//! `incident.json`: what an incident bundle is about (the finding that opened it, when, what
//! the bundle holds) and, once it closed, how long it lasted and what closed it.

use crate::clock::{rfc3339, Millis};
use crate::model::FindingKind;
use serde::{Deserialize, Serialize};

pub const INCIDENT_SCHEMA: &str = "wedgewatch.incident/1";

/// One incident: a critical finding of a component, and those that joined it while it was
/// open. Every string is redacted and its control characters escaped before it is stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Incident {
    pub schema: String,
    /// The critical finding that opened it.
    pub kind: FindingKind,
    pub component: Option<String>,
    /// The finding's one-line summary when it opened.
    pub summary: String,
    pub opened_ms: Millis,
    pub opened_at: String,
    /// Other critical findings of the same component while it was open.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub joined: Vec<FindingKind>,
    /// None while open.
    #[serde(default)]
    pub closed: Option<Closed>,
    pub recording: RecordingPart,
    /// The daemon that wrote it.
    pub daemon_pid: u32,
}

/// How an incident ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Closed {
    pub by: ClosedBy,
    /// When it closed (None: the daemon stopped and its end was not seen).
    pub at_ms: Option<Millis>,
    pub at: Option<String>,
    pub lasted_ms: Option<i64>,
    /// e.g. the process identities before and after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What closed an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClosedBy {
    /// A finding judged from requests went away with the same process running: its requests
    /// finished or were given up.
    RequestsFinished,
    /// Any other finding went away with the same process running.
    Cleared,
    /// The component's process was replaced (or is gone) since the incident opened.
    ProcessRestarted,
    /// The component is no longer part of the topology.
    ComponentGone,
    /// The daemon stopped while it was open.
    DaemonStopped,
}

impl ClosedBy {
    pub fn as_str(self) -> &'static str {
        match self {
            ClosedBy::RequestsFinished => "requests_finished",
            ClosedBy::Cleared => "cleared",
            ClosedBy::ProcessRestarted => "process_restarted",
            ClosedBy::ComponentGone => "component_gone",
            ClosedBy::DaemonStopped => "daemon_stopped",
        }
    }
}

/// The recording excerpt of a bundle, or why there is none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum RecordingPart {
    Kept {
        file: String,
        /// The first and last sample's time.
        first_at: Option<String>,
        last_at: Option<String>,
        samples: u64,
        bytes: u64,
        /// The span was shortened to fit the bundle's bound.
        cut: bool,
    },
    Missing {
        why: String,
    },
}

impl Incident {
    /// A new open incident.
    pub fn opened(
        kind: FindingKind,
        component: Option<String>,
        summary: String,
        at: Millis,
    ) -> Self {
        Incident {
            schema: INCIDENT_SCHEMA.to_string(),
            kind,
            component,
            summary,
            opened_ms: at,
            opened_at: rfc3339(at),
            joined: Vec::new(),
            closed: None,
            recording: RecordingPart::Missing {
                why: "not written yet".into(),
            },
            daemon_pid: std::process::id(),
        }
    }

    /// Closes it at `at` (None: not seen).
    pub fn close(&mut self, by: ClosedBy, at: Option<Millis>, detail: Option<String>) {
        self.closed = Some(Closed {
            by,
            at_ms: at,
            at: at.map(rfc3339),
            lasted_ms: at.map(|t| (t - self.opened_ms).max(0)),
            detail,
        });
    }

    pub fn is_open(&self) -> bool {
        self.closed.is_none()
    }

    /// How long it lasted (closed), or has lasted so far at `now` (open); None when its end
    /// was not seen.
    pub fn lasted_ms(&self, now: Millis) -> Option<i64> {
        match &self.closed {
            Some(c) => c.lasted_ms,
            None => Some((now - self.opened_ms).max(0)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_incident_reads_back_as_written_and_says_how_long_it_lasted() {
        let mut i = Incident::opened(
            FindingKind::WedgedRequest,
            Some("decode@127.0.0.1:30001".into()),
            "3 requests".into(),
            1_000,
        );
        assert!(i.is_open());
        assert_eq!(i.lasted_ms(61_000), Some(60_000), "so far");
        i.close(
            ClosedBy::ProcessRestarted,
            Some(73_000),
            Some("1:2 -> none".into()),
        );
        let back: Incident =
            serde_json::from_str(&serde_json::to_string(&i).expect("json")).expect("parse");
        assert_eq!(back, i);
        assert_eq!(back.lasted_ms(999_999), Some(72_000));
        let v = serde_json::to_value(&i).expect("json");
        assert_eq!(v["closed"]["by"], "process_restarted");
        assert_eq!(v["kind"], "wedged_request");
        assert_eq!(v["recording"]["state"], "missing");
        i.close(ClosedBy::DaemonStopped, None, None);
        assert_eq!(i.lasted_ms(999_999), None, "its end was not seen");
    }
}
