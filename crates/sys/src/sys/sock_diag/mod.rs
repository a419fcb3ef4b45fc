//! The kernel's TCP socket table with `tcp_info`, behind the [`SockDiag`] trait: the
//! netlink `sock_diag` implementation ([`NetlinkSockDiag`], per network namespace) and a
//! fake ([`FakeSockDiag`]) so the sockets source can be tested without a kernel's sockets.

mod decode;
mod fake;
mod netlink;
mod recent;

pub use decode::decode_datagram;
pub use fake::FakeSockDiag;
pub use netlink::{dump_netlink, NetlinkSockDiag};
pub use recent::RecentDump;

use super::ProcFsError;
use crate::model::SocketEntry;
use std::time::Duration;

/// What one dump of one namespace produced.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Dump {
    pub sockets: Vec<SocketEntry>,
    /// Messages that could not be decoded (kept from the raw header, without tcp_info).
    pub undecoded: u32,
}

/// Why a dump failed (the texts end up in the sockets source's status).
#[derive(Debug, thiserror::Error)]
pub enum SockDiagError {
    #[error("netlink {step}: {source}")]
    Io {
        step: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("netlink dump timed out after {} ms", .after.as_millis())]
    Timeout { after: Duration },
    #[error("malformed netlink message (length {len})")]
    Malformed { len: usize },
    #[error("netlink error {0}")]
    Kernel(std::io::Error),
    #[error("{0}")]
    Namespace(#[from] ProcFsError),
    #[error("setns into network namespace of pid {pid}: {source}")]
    Setns {
        pid: i32,
        #[source]
        source: nix::Error,
    },
    #[error("spawn netns thread: {0}")]
    Thread(std::io::Error),
    #[error("netns dump thread panicked")]
    Panicked,
    /// What a fake was told to answer.
    #[error("{0}")]
    Fake(String),
}

/// Dumps of every TCP socket (IPv4 and IPv6, all states unless `time_wait` is false: the
/// kernel then skips TIME_WAIT) of a network namespace, each bounded by `timeout`. Blocking.
pub trait SockDiag: Send + Sync + std::fmt::Debug {
    /// Our own network namespace.
    fn dump(&self, timeout: Duration, time_wait: bool) -> Result<Dump, SockDiagError>;

    /// The network namespace `pid` lives in (the netlink one enters it on a thread of its
    /// own; needs CAP_SYS_ADMIN over that namespace).
    fn dump_netns_of(
        &self,
        pid: i32,
        timeout: Duration,
        time_wait: bool,
    ) -> Result<Dump, SockDiagError>;
}
