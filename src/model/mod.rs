//! The one data model every output renders: topology, samples from each source, and the
//! snapshot contract (`wedgewatch.snapshot/1`, `wedgewatch.diff/1`).

pub mod addr;
pub mod changes;
pub mod facts;
pub mod finding_kind;
pub mod masked;
pub mod parts;
pub mod sample;
pub mod snapshot;
pub mod suspicion;
pub mod thread_state;
pub mod topology;

pub use crate::config::Thresholds;
pub use facts::ComponentFacts;
pub use finding_kind::FindingKind;
pub use parts::{ComponentExtras, SnapshotParts};
pub use sample::*;
pub use snapshot::*;
pub use suspicion::{Suspicion, SuspicionReason};
pub use thread_state::ThreadState;
pub use topology::*;
