//! Incident bundles: evidence of a hang that outlives the restart that ends it
//! (docs/incidents.md). When a critical finding opens, the daemon writes `incidents/<UTC
//! time>-<kind>-<component>/` under its state directory: `snapshot.json`, `report.md`,
//! `recording.wwrec` (the [`IncidentPolicy::before_ms`] before) and `incident.json`
//! ([`record`]); when its findings close, how long it lasted and what closed it. At most
//! [`IncidentPolicy::keep`] incidents of [`IncidentPolicy::max_bytes`] are kept, oldest removed
//! first, only files the daemon wrote ([`store`]); each appears whole or not at all,
//! owner-only.

mod bundle;
pub mod names;
pub mod record;
pub mod store;
mod worker;

pub use record::{ClosedBy, Incident, RecordingPart};
pub use store::{list, Kept, INCIDENTS_DIR};
pub use worker::{Incidents, Stopped};

/// How many incidents are kept and what each holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncidentPolicy {
    /// Incidents kept, at most (the oldest go first).
    pub keep: usize,
    /// Bytes all kept incidents hold together, at most (the newest is kept even when it alone
    /// is over; its recording excerpt is bounded to a quarter of this).
    pub max_bytes: u64,
    /// How much recording before the incident a bundle carries.
    pub before_ms: i64,
}

impl Default for IncidentPolicy {
    /// 16 incidents, 256 MiB, 5 minutes: a day of a bad week, in less than the recording's
    /// own 128 MiB x 2 (an excerpt of a lab wedge's 5 minutes is about 1 MiB; docs/incidents.md).
    fn default() -> Self {
        IncidentPolicy {
            keep: 16,
            max_bytes: 256 << 20,
            before_ms: 5 * 60 * 1000,
        }
    }
}
