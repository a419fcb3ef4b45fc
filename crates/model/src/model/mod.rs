//! The one data model every output renders: topology, samples from each source, and the
//! snapshot contract (`wedgewatch.snapshot/1`, `wedgewatch.diff/1`).

pub mod addr;
pub mod cause;
pub mod changes;
pub mod channel;
pub mod facts;
pub mod finding_kind;
pub mod fleet;
pub mod masked;
pub mod node;
pub mod parts;
pub mod sample;
pub mod snapshot;
pub mod suspicion;
pub mod thread_state;
pub mod topology;

pub use crate::config::Thresholds;
pub use channel::{Channel, ChannelFlow, ChannelKind, KvSide, RequestsOn};
pub use facts::ComponentFacts;
pub use finding_kind::FindingKind;
pub use fleet::{CrossLink, FailedNode, FleetInfo, FleetNode};
pub use node::{NodeClock, NodeIdentity, SnapConnection};
pub use parts::{ComponentExtras, RawFiles, SnapshotParts};
pub use sample::*;
pub use snapshot::*;
pub use suspicion::{RequestNote, Suspicion, SuspicionReason};
pub use thread_state::ThreadState;
pub use topology::*;
