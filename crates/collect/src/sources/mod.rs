//! Sources: each samples one kind of OS input behind the [`Source`] trait, under a hard
//! timeout, and degrades to an explicit status instead of failing.

pub mod gpu;
pub mod metrics;
pub mod processes;
pub mod pyspy_json;
pub mod router_key;
pub mod sockets;
pub mod stacks;
pub mod versions;
pub mod window;

use crate::clock::Clock;
use crate::model::{Sample, SourceKind, Topology};
use std::future::Future;
use std::pin::Pin;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// One input of the sampler. Implementations never panic and never return an error: a
/// failure is a `Sample` whose status says `degraded`/`unavailable` and why.
pub trait Source: Send + Sync {
    fn kind(&self) -> SourceKind;
    /// Takes one sample of the given topology.
    fn sample<'a>(&'a self, topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample>;
}
