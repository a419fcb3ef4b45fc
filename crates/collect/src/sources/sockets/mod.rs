//! TCP sockets through sock_diag with tcp_info, mapped to processes by inode.
//!
//! The kernel dump ([`crate::sys::SockDiag`], or `net/tcp{,6}` without tcp_info) is a
//! [`SocketOs`]; [`InodeMap`] maps inodes to pids, refreshed only when unknown inodes appear;
//! [`build_table_with`] keeps only the topology's sockets. [`SocketSource`] (here) runs under a
//! hard timeout and lists TIME_WAIT sockets only every few seconds.

mod inodes;
mod table;
#[cfg(test)]
mod tests;

pub use crate::sys::sock_diag::{dump_netlink, Dump};
pub use inodes::{InodeMap, ResolveStats, Scope};
pub use table::{build_table, build_table_with};

use crate::clock::Clock;
use crate::model::{Payload, Sample, SocketEntry, SocketTable, SourceKind, SourceStatus, Status};
use crate::model::{TcpState, Topology};
use crate::sources::{BoxFuture, Source};
use crate::sys::sock_diag::RecentDump;
use crate::sys::{NetlinkSockDiag, ProcFs, SockDiag};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Options of the socket source.
#[derive(Debug, Clone)]
pub struct SocketConfig {
    /// Hard limit for one sample (dump of every namespace + inode mapping).
    pub timeout: Duration,
    /// Keep every socket on the box, not only the topology's (the default keeps sockets of
    /// topology pids and sockets touching a component's listen port).
    pub keep_all: bool,
    /// How often [`SocketSource`] lists TIME_WAIT sockets; between, it repeats the last list
    /// (under churn they are most of the table and say nothing new). Zero: every sample.
    pub time_wait_every: Duration,
}

impl Default for SocketConfig {
    fn default() -> Self {
        SocketConfig {
            timeout: Duration::from_millis(2000),
            keep_all: false,
            time_wait_every: Duration::from_secs(5),
        }
    }
}

/// What the socket source reads the kernel through: a sock_diag and a procfs.
#[derive(Debug, Clone)]
pub struct SocketOs {
    pub sock_diag: Arc<dyn SockDiag>,
    pub proc: ProcFs,
}

impl Default for SocketOs {
    /// The kernel's netlink sock_diag and `/proc`.
    fn default() -> Self {
        SocketOs::kernel(ProcFs::real())
    }
}

impl SocketOs {
    /// The kernel's netlink sock_diag, with pids, fds and namespaces read through `proc` (the
    /// tree discovery read the pids from, so inodes map to those pids).
    pub fn kernel(proc: ProcFs) -> Self {
        SocketOs::kernel_sharing(proc, None)
    }

    /// [`SocketOs::kernel`], each dump of our own namespace offered to `recent` (the
    /// daemon's rediscovery reads it instead of dumping again).
    pub fn kernel_sharing(proc: ProcFs, recent: Option<Arc<RecentDump>>) -> Self {
        SocketOs {
            sock_diag: Arc::new(NetlinkSockDiag {
                proc: proc.clone(),
                recent,
            }),
            proc,
        }
    }
}

/// The sockets source: a dump per namespace + a cached inode map, under a hard timeout.
#[derive(Debug, Clone)]
pub struct SocketSource {
    cfg: SocketConfig,
    os: SocketOs,
    map: Arc<Mutex<InodeMap>>,
    time_wait: Arc<Mutex<TimeWaitList>>,
}

/// The TIME_WAIT sockets of the last sample that listed them.
#[derive(Debug, Default)]
struct TimeWaitList {
    listed_at: Option<Instant>,
    sockets: Vec<SocketEntry>,
}

/// Said in a table whose TIME_WAIT sockets are repeated from an earlier sample.
pub const TIME_WAIT_REPEATED: &str =
    "TIME_WAIT sockets as of the last sample that listed them (listed every few seconds)";

impl SocketSource {
    /// A source over the kernel's sock_diag and `/proc`.
    pub fn new(cfg: SocketConfig) -> Self {
        SocketSource::with_os(cfg, SocketOs::default())
    }

    /// A source over another sock_diag and procfs (tests: fakes).
    pub fn with_os(cfg: SocketConfig, os: SocketOs) -> Self {
        SocketSource {
            cfg,
            map: Arc::new(Mutex::new(InodeMap::with_proc(os.proc.clone()))),
            os,
            time_wait: Arc::new(Mutex::new(TimeWaitList::default())),
        }
    }
}

/// One sample: TIME_WAIT sockets listed when due, else repeated from the last listing.
fn sample_table(
    os: &SocketOs,
    map: &mut InodeMap,
    tw: &mut TimeWaitList,
    topo: &Topology,
    cfg: &SocketConfig,
) -> (SocketTable, SourceStatus) {
    let due = tw
        .listed_at
        .is_none_or(|t| t.elapsed() >= cfg.time_wait_every);
    let (mut table, status) = build_table_with(os, map, topo, cfg, due);
    if status.status == Status::Unavailable {
        return (table, status);
    }
    if due {
        tw.sockets = table
            .sockets
            .iter()
            .filter(|e| e.state == TcpState::TimeWait)
            .cloned()
            .collect();
        tw.listed_at = Some(Instant::now());
    } else {
        table.sockets.extend(tw.sockets.iter().cloned());
        table.notes.push(TIME_WAIT_REPEATED.to_string());
    }
    (table, status)
}

impl SocketSource {
    /// The blocking part of a sample, on the blocking pool under [`SocketConfig::timeout`].
    async fn table(&self, topo: &Topology) -> (SocketTable, SourceStatus) {
        let (map, time_wait) = (Arc::clone(&self.map), Arc::clone(&self.time_wait));
        let (topo, cfg, os) = (topo.clone(), self.cfg.clone(), self.os.clone());
        let work = tokio::task::spawn_blocking(move || {
            // try_lock: a previous sample that overran its timeout still holds the map;
            // do not queue up behind it.
            match (map.try_lock(), time_wait.try_lock()) {
                (Ok(mut m), Ok(mut tw)) => sample_table(&os, &mut m, &mut tw, &topo, &cfg),
                _ => (
                    SocketTable::default(),
                    SourceStatus::unavailable(
                        "previous socket sample still running (overran its timeout)",
                    ),
                ),
            }
        });
        // Grace above the config timeout: the blocking dump enforces it itself.
        let limit = self.cfg.timeout + Duration::from_millis(500);
        match tokio::time::timeout(limit, work).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => (
                SocketTable::default(),
                SourceStatus::unavailable(format!("socket sampler task failed: {e}")),
            ),
            Err(_) => (
                SocketTable::default(),
                SourceStatus::unavailable(format!(
                    "socket sample timed out after {} ms",
                    limit.as_millis()
                )),
            ),
        }
    }
}

impl Source for SocketSource {
    fn kind(&self) -> SourceKind {
        SourceKind::Sockets
    }

    fn sample<'a>(&'a self, topo: &'a Topology, clock: &'a dyn Clock) -> BoxFuture<'a, Sample> {
        Box::pin(async move {
            let t_ms = clock.now_ms();
            let start = Instant::now();
            let (table, status) = self.table(topo).await;
            Sample {
                t_ms,
                status,
                took_ms: start.elapsed().as_millis() as u64,
                payload: Payload::Sockets(table),
            }
        })
    }
}
