//! TCP connections made inside another process's network namespace (a container's
//! `127.0.0.1:30000` is not the host's; docs/security.md §13a).
//!
//! A socket belongs for life to the namespace of the thread that created it, so each connection
//! is made on a fresh short-lived thread that `setns(2)`s in, connects and exits (never a
//! pooled thread: it would carry the foreign namespace into its next work); the socket goes
//! to the HTTP client's [`Connector`] seam. The namespace's inode is checked on the very
//! descriptor entered, so a reused pid is never followed elsewhere.

use crate::sys::http::{Connector, Resolver};
use crate::sys::ProcFs;
use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::time::Duration;

/// A network namespace: a pid living in it and the namespace's inode (as discovery saw it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Netns {
    pub pid: i32,
    pub inode: u64,
}

/// Why a connection inside a namespace was not made.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open the network namespace of pid {pid}: {source}")]
    Open { pid: i32, source: io::Error },
    #[error(
        "network namespace of pid {pid} is now {found}, not {expected} (process gone or pid reused); not entered"
    )]
    Changed { pid: i32, expected: u64, found: u64 },
    #[error("setns into net:[{inode}]: {source}")]
    Setns { inode: u64, source: nix::Error },
    #[error("connect to {addr} in net:[{inode}]: {source}")]
    Connect {
        addr: SocketAddr,
        inode: u64,
        source: io::Error,
    },
    #[error("namespace thread: {0}")]
    Thread(String),
}

impl NetnsError {
    /// As an `io::Error` for the client's [`Connector`], keeping "refused" and "timed out"
    /// recognisable and the message whole.
    fn into_io(self) -> io::Error {
        let kind = match &self {
            NetnsError::Connect { source, .. } => source.kind(),
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, self.to_string())
    }
}

/// Inode of our own network namespace.
pub fn own_inode() -> io::Result<u64> {
    std::fs::metadata("/proc/self/ns/net").map(|m| m.ino())
}

/// The namespace file of `ns`, checked to still be namespace `ns.inode` on the descriptor that
/// will be entered; when that pid is gone, another process still in the namespace leads to it.
fn open_checked(ns: Netns) -> Result<File, NetnsError> {
    match open_pid(ns) {
        Ok(f) => Ok(f),
        Err(first) => {
            match another_member(ns.inode).and_then(|pid| open_pid(Netns { pid, ..ns }).ok()) {
                Some(f) => Ok(f),
                None => Err(first),
            }
        }
    }
}

/// Most pids looked at when searching for another process in a namespace (a pathological
/// process table must not hold the namespace thread).
const MAX_SCAN: usize = 100_000;

/// A pid living in network namespace `inode`, if any is left.
fn another_member(inode: u64) -> Option<i32> {
    let proc = ProcFs::real();
    proc.pids()
        .ok()?
        .into_iter()
        .take(MAX_SCAN)
        .find(|&pid| std::fs::metadata(proc.path(pid, "ns/net")).is_ok_and(|m| m.ino() == inode))
}

fn open_pid(ns: Netns) -> Result<File, NetnsError> {
    let file = ProcFs::real()
        .open_netns(ns.pid)
        .map_err(|e| NetnsError::Open {
            pid: ns.pid,
            source: io::Error::other(e.to_string()),
        })?;
    let found = file
        .metadata()
        .map_err(|source| NetnsError::Open {
            pid: ns.pid,
            source,
        })?
        .ino();
    if found != ns.inode {
        return Err(NetnsError::Changed {
            pid: ns.pid,
            expected: ns.inode,
            found,
        });
    }
    Ok(file)
}

/// How long we wait for the namespace thread beyond the connect timeout itself (it only opens
/// a file and calls `setns` besides connecting).
const THREAD_SLACK: Duration = Duration::from_millis(500);

/// Connects to `addr` inside namespace `ns` within `within`, on a dedicated thread that
/// enters the namespace, connects and exits (see the module doc). Blocking.
pub fn connect_blocking(
    ns: Netns,
    addr: SocketAddr,
    within: Duration,
) -> Result<std::net::TcpStream, NetnsError> {
    let inode = ns.inode;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("ww-netns-conn".into())
        .spawn(move || {
            let r = open_checked(ns).and_then(|file| {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|source| NetnsError::Setns { inode, source })?;
                std::net::TcpStream::connect_timeout(&addr, within).map_err(|source| {
                    NetnsError::Connect {
                        addr,
                        inode,
                        source,
                    }
                })
            });
            // The receiver may have given up; then the stream is simply closed.
            let _ = tx.send(r);
            // Returning ends the thread, and its namespace with it.
        })
        .map_err(|e| NetnsError::Thread(format!("spawn: {e}")))?;
    rx.recv_timeout(within + THREAD_SLACK).map_err(|e| {
        NetnsError::Thread(format!(
            "no answer within {} ms: {e}",
            (within + THREAD_SLACK).as_millis()
        ))
    })?
}

/// The client [`Connector`] that connects inside `ns`.
pub fn connector(ns: Netns) -> Connector {
    Arc::new(move |sa, within| connect_blocking(ns, sa, within).map_err(NetnsError::into_io))
}

/// A [`Resolver`] for another namespace: IP literals only. A name would be resolved by the
/// host's resolver for the host's network, so it is refused rather than guessed at.
pub fn literal_only(authority: &str) -> io::Result<Vec<SocketAddr>> {
    authority.parse::<SocketAddr>().map(|sa| vec![sa]).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{authority}: not an IP address; names are not resolved inside another network namespace"
            ),
        )
    })
}

/// How to reach an endpoint of a component in `ns` (None: the host's namespace, as usual):
/// the resolver and connector to give the client.
pub fn route(ns: Option<Netns>) -> (Resolver, Option<Connector>) {
    match ns {
        Some(ns) => (literal_only, Some(connector(ns))),
        None => (crate::sys::http::system_resolver, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Netns {
        Netns {
            pid: std::process::id() as i32,
            inode: own_inode().unwrap(),
        }
    }

    const SOON: Duration = Duration::from_millis(500);

    #[test]
    fn a_changed_namespace_is_refused_not_entered() {
        // No namespace has inode 1, so no other process can stand in for it either.
        let ns = Netns { inode: 1, ..me() };
        let e = connect_blocking(ns, "127.0.0.1:1".parse().unwrap(), SOON).unwrap_err();
        assert!(matches!(e, NetnsError::Changed { .. }), "{e}");
        let gone = Netns {
            pid: i32::MAX,
            inode: 1,
        };
        let e = connect_blocking(gone, "127.0.0.1:1".parse().unwrap(), SOON).unwrap_err();
        assert!(matches!(e, NetnsError::Open { .. }), "{e}");
    }

    #[test]
    fn a_gone_pid_is_replaced_by_another_process_in_the_same_namespace() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ns = Netns {
            pid: i32::MAX,
            inode: own_inode().unwrap(),
        };
        assert!(connect_blocking(ns, l.local_addr().unwrap(), SOON).is_ok());
    }

    #[test]
    fn connects_in_our_own_namespace_and_leaves_this_thread_alone() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let before = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        let s = connect_blocking(me(), addr, SOON).unwrap();
        assert_eq!(s.peer_addr().unwrap(), addr);
        assert_eq!(
            std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
            before
        );
        drop(l);
        let e = connector(me())(addr, SOON).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
    }

    #[test]
    fn names_are_refused_literals_pass() {
        assert!(literal_only("localhost:80").is_err());
        assert_eq!(
            literal_only("[::1]:8000").unwrap(),
            vec!["[::1]:8000".parse().unwrap()]
        );
    }
}
