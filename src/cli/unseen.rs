//! What a check could not see: the sources a snapshot had unavailable. Green means "looked
//! and found nothing", so a check says what it did not look at (a line and perfdata), is
//! UNKNOWN when it saw neither processes nor sockets (no request can be judged without
//! them), and CRITICAL when a source named in `--require` is unavailable.

use wedgewatch::model::{Snapshot, SourceKind, Status};

/// Sources without which no request can be judged.
const ESSENTIAL: [SourceKind; 2] = [SourceKind::Processes, SourceKind::Sockets];

/// One unavailable source.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Unseen {
    pub source: String,
    pub reason: String,
    /// Named in `--require`.
    pub required: bool,
    /// Processes or sockets.
    #[serde(skip)]
    pub essential: bool,
}

/// `--require` values: a source's name.
pub fn parse_source(s: &str) -> Result<SourceKind, String> {
    SourceKind::ALL
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| {
            let all: Vec<&str> = SourceKind::ALL.iter().map(|k| k.as_str()).collect();
            format!("unknown source {s:?}: one of {}", all.join(", "))
        })
}

/// The snapshot's unavailable sources, each marked required or essential.
pub fn unseen(s: &Snapshot, require: &[SourceKind]) -> Vec<Unseen> {
    s.sources
        .iter()
        .filter(|(_, st)| st.status == Status::Unavailable)
        .map(|(k, st)| Unseen {
            source: k.clone(),
            reason: st
                .reason
                .clone()
                .unwrap_or_else(|| "no reason given".into()),
            required: require.iter().any(|r| r.as_str() == k),
            essential: ESSENTIAL.iter().any(|e| e.as_str() == k),
        })
        .collect()
}

/// Why the status is not the findings' own: a required source unavailable (CRITICAL), or an
/// essential one with nothing found (UNKNOWN); `None` when the findings decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Override {
    RequiredMissing,
    Blind,
}

pub fn overrides(found_nothing: bool, unseen: &[Unseen]) -> Option<Override> {
    if unseen.iter().any(|u| u.required) {
        Some(Override::RequiredMissing)
    } else if found_nothing && unseen.iter().any(|u| u.essential) {
        Some(Override::Blind)
    } else {
        None
    }
}
