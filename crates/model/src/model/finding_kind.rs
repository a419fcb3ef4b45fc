//! `FindingKind`: what a finding is, as a type. Its JSON form is the same snake_case string the
//! contract always had (`"wedged_request"`, ...); a kind this build does not know (from a newer
//! snapshot: the schema says "new kinds may be added") is kept verbatim as `Other`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

/// The kind of a [`Finding`](super::Finding). Serialized as its [`as_str`](Self::as_str)
/// string; compared, ordered and hashed by that string too, so `Other("wedged_request")`
/// (never built by [`From`]) equals `WedgedRequest`.
#[derive(Clone)]
pub enum FindingKind {
    WedgedRequest,
    KvTransferStalled,
    StalledStream,
    PdLegFailed,
    TokensUndelivered,
    BusyWithoutProgress,
    QueueNotDraining,
    SchedulerStuck,
    AccumulatingState,
    ProcessRestarted,
    EndpointUnresponsive,
    ConfigChanged,
    RanksDiverged,
    /// A kind this build does not know, kept as written.
    Other(String),
}

impl FindingKind {
    /// Every kind this build produces, in detector order.
    pub const KNOWN: [FindingKind; 13] = [
        FindingKind::WedgedRequest,
        FindingKind::KvTransferStalled,
        FindingKind::StalledStream,
        FindingKind::PdLegFailed,
        FindingKind::TokensUndelivered,
        FindingKind::BusyWithoutProgress,
        FindingKind::QueueNotDraining,
        FindingKind::SchedulerStuck,
        FindingKind::AccumulatingState,
        FindingKind::ProcessRestarted,
        FindingKind::EndpointUnresponsive,
        FindingKind::ConfigChanged,
        FindingKind::RanksDiverged,
    ];

    /// Judged from the socket table (requests, connections): without a fresh table these
    /// kinds cannot be judged at all (`View::sockets_fresh`), which says nothing about
    /// whether what they found is over.
    pub fn judged_from_sockets(&self) -> bool {
        matches!(
            self,
            FindingKind::WedgedRequest
                | FindingKind::KvTransferStalled
                | FindingKind::StalledStream
                | FindingKind::PdLegFailed
                | FindingKind::TokensUndelivered
                | FindingKind::BusyWithoutProgress
                | FindingKind::AccumulatingState
        )
    }

    /// The contract's name of the kind: `"wedged_request"`, ...
    pub fn as_str(&self) -> &str {
        match self {
            FindingKind::WedgedRequest => "wedged_request",
            FindingKind::KvTransferStalled => "kv_transfer_stalled",
            FindingKind::StalledStream => "stalled_stream",
            FindingKind::PdLegFailed => "pd_leg_failed",
            FindingKind::TokensUndelivered => "tokens_undelivered",
            FindingKind::BusyWithoutProgress => "busy_without_progress",
            FindingKind::QueueNotDraining => "queue_not_draining",
            FindingKind::SchedulerStuck => "scheduler_stuck",
            FindingKind::AccumulatingState => "accumulating_state",
            FindingKind::ProcessRestarted => "process_restarted",
            FindingKind::EndpointUnresponsive => "endpoint_unresponsive",
            FindingKind::ConfigChanged => "config_changed",
            FindingKind::RanksDiverged => "ranks_diverged",
            FindingKind::Other(s) => s,
        }
    }
}

impl From<&str> for FindingKind {
    fn from(s: &str) -> Self {
        FindingKind::KNOWN
            .into_iter()
            .find(|k| k.as_str() == s)
            .unwrap_or_else(|| FindingKind::Other(s.to_string()))
    }
}

impl From<String> for FindingKind {
    fn from(s: String) -> Self {
        match FindingKind::from(s.as_str()) {
            FindingKind::Other(_) => FindingKind::Other(s),
            known => known,
        }
    }
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so width and alignment (`{:<14}`) work as they did on the string.
        f.pad(self.as_str())
    }
}

impl fmt::Debug for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq for FindingKind {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for FindingKind {}

impl PartialOrd for FindingKind {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for FindingKind {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for FindingKind {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

/// `finding.kind == "wedged_request"` compares with the contract's string.
impl PartialEq<str> for FindingKind {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for FindingKind {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for FindingKind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for FindingKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(FindingKind::from)
    }
}

#[cfg(test)]
mod tests {
    use super::FindingKind;

    #[test]
    fn json_names_are_the_contract_strings() {
        let names = [
            "wedged_request",
            "kv_transfer_stalled",
            "stalled_stream",
            "pd_leg_failed",
            "tokens_undelivered",
            "busy_without_progress",
            "queue_not_draining",
            "scheduler_stuck",
            "accumulating_state",
            "process_restarted",
            "endpoint_unresponsive",
            "config_changed",
            "ranks_diverged",
        ];
        for (k, name) in FindingKind::KNOWN.iter().zip(names) {
            assert_eq!(serde_json::to_string(k).unwrap(), format!("\"{name}\""));
            let back: FindingKind = serde_json::from_str(&format!("\"{name}\"")).unwrap();
            assert_eq!(&back, k);
            assert!(!matches!(back, FindingKind::Other(_)));
            assert_eq!(format!("{k}"), name);
            assert_eq!(format!("{k:?}"), format!("{name:?}"));
        }
    }

    #[test]
    fn unknown_kinds_round_trip_verbatim() {
        let k: FindingKind = serde_json::from_str("\"gpu_fell_off_the_bus\"").unwrap();
        assert_eq!(k, FindingKind::Other("gpu_fell_off_the_bus".into()));
        assert_eq!(
            serde_json::to_string(&k).unwrap(),
            "\"gpu_fell_off_the_bus\""
        );
        assert_eq!(
            FindingKind::Other("wedged_request".into()),
            FindingKind::WedgedRequest
        );
        assert_eq!(
            format!("[{:<16}]", FindingKind::ConfigChanged),
            "[config_changed  ]"
        );
    }
}
