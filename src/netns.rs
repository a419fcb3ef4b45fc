//! TCP connections made inside another process's network namespace.
//!
//! A stack in a container (a pod: its own network and PID namespace) listens on *its*
//! `127.0.0.1:30000`; the host's `127.0.0.1:30000` is someone else, or nobody. Discovery reads
//! the listening sockets of the process's own namespace (`/proc/PID/net/tcp`), so the address
//! is right but only means something in there. A socket belongs to the namespace of the
//! thread that created it, for its whole life, so we create it on a dedicated short-lived
//! thread that has entered the target's namespace with `setns(2)` and hand the socket back;
//! the connect, the request and the read then run on the normal (tokio) code path.
//!
//! Why a fresh `std::thread` per socket and never a pooled one (tokio's blocking pool, the
//! runtime's workers, the main thread): `setns` changes the namespace of the calling thread
//! only, and a pooled thread would keep the foreign namespace for whatever work it picks up
//! next (a `/workers` GET to the host router, a `sock_diag` dump, a DNS lookup). Our thread
//! does nothing but `setns` + `socket()` and exits, taking the namespace with it.
//!
//! The namespace is named by the pid discovery saw *and* the inode of its `ns/net` then: the
//! file is opened once and its inode checked on that same open descriptor before `setns`, so a
//! pid that was reused by a process in another namespace is refused, not entered.

use std::fs::File;
use std::net::SocketAddr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
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
    #[error("cannot open {path}: {source}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "network namespace of pid {pid} is now {found}, not {expected} (process gone or pid reused); not entered"
    )]
    Changed { pid: i32, expected: u64, found: u64 },
    #[error("setns into net:[{inode}]: {source}")]
    Setns { inode: u64, source: nix::Error },
    #[error("socket in net:[{inode}]: {source}")]
    Socket { inode: u64, source: std::io::Error },
    #[error("connect to {addr} in net:[{inode}]: {source}")]
    Connect {
        addr: SocketAddr,
        inode: u64,
        source: std::io::Error,
    },
    #[error("connect to {addr} in net:[{inode}] timed out after {ms} ms")]
    Timeout {
        addr: SocketAddr,
        inode: u64,
        ms: u128,
    },
    #[error("namespace thread: {0}")]
    Thread(String),
}

impl NetnsError {
    /// A refused connection (nothing listens there now), as opposed to any other failure.
    pub fn is_refused(&self) -> bool {
        matches!(self, NetnsError::Connect { source, .. }
            if source.kind() == std::io::ErrorKind::ConnectionRefused)
    }
}

/// Inode of the network namespace `pid` lives in, read under `proc_root` (`/proc`).
pub fn inode_of(proc_root: &Path, pid: i32) -> std::io::Result<u64> {
    std::fs::metadata(proc_root.join(pid.to_string()).join("ns/net")).map(|m| m.ino())
}

/// Inode of our own network namespace (`/proc/self/ns/net`).
pub fn own_inode() -> std::io::Result<u64> {
    std::fs::metadata("/proc/self/ns/net").map(|m| m.ino())
}

/// The namespace file of `ns`, checked to still be namespace `ns.inode` on the descriptor
/// that will be entered (no window between check and use). When that pid is gone or now
/// elsewhere (an engine restarted inside its pod, until the next discovery), any process
/// still in namespace `ns.inode` leads to it: the namespace is the same object whoever's
/// file names it, and the inode is checked on the descriptor entered all the same.
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

/// Most pids looked at when searching for another process in a namespace (a host has a few
/// thousand; bounded so a pathological process table cannot hold the namespace thread).
const MAX_SCAN: usize = 100_000;

/// A pid living in network namespace `inode`, if any is left.
fn another_member(inode: u64) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .take(MAX_SCAN)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|&pid| inode_of(Path::new("/proc"), pid).is_ok_and(|i| i == inode))
}

fn open_pid(ns: Netns) -> Result<File, NetnsError> {
    let path = format!("/proc/{}/ns/net", ns.pid);
    let file = File::open(&path).map_err(|source| NetnsError::Open {
        path: path.clone(),
        source,
    })?;
    let found = file
        .metadata()
        .map_err(|source| NetnsError::Open { path, source })?
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

/// How long we wait for the namespace thread itself (it only calls `setns` and `socket`,
/// microseconds; a thread that cannot even be scheduled in this long is given up on).
const THREAD_WAIT: Duration = Duration::from_millis(500);

type Made = Result<tokio::net::TcpSocket, NetnsError>;

/// Makes the socket on a dedicated thread that exits right after (see the module doc) and
/// hands it to `reply`. Opening and checking the namespace file happens there too, so no
/// `/proc` access runs on the caller's (possibly async) thread.
fn make_socket(
    ns: Netns,
    addr: SocketAddr,
    reply: impl FnOnce(Made) + Send + 'static,
) -> Result<(), NetnsError> {
    let inode = ns.inode;
    std::thread::Builder::new()
        .name("ww-netns-sock".into())
        .spawn(move || {
            let r = open_checked(ns).and_then(|file| {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(|source| NetnsError::Setns { inode, source })
                    .and_then(|()| {
                        // Creating the socket needs no runtime; it is registered with the
                        // reactor only when the caller connects it.
                        let s = if addr.is_ipv4() {
                            tokio::net::TcpSocket::new_v4()
                        } else {
                            tokio::net::TcpSocket::new_v6()
                        };
                        s.map_err(|source| NetnsError::Socket { inode, source })
                    })
            });
            // The receiver may have given up; then the socket is simply closed.
            reply(r);
            // Returning ends the thread, and its namespace with it.
        })
        .map(|_| ())
        .map_err(|e| NetnsError::Thread(format!("spawn: {e}")))
}

/// An unconnected TCP socket of `addr`'s family created inside namespace `ns` (for
/// synchronous callers; [`connect`] is the async path).
pub fn socket_in(ns: Netns, addr: SocketAddr) -> Made {
    let (tx, rx) = std::sync::mpsc::channel();
    make_socket(ns, addr, move |r| {
        let _ = tx.send(r);
    })?;
    rx.recv_timeout(THREAD_WAIT)
        .map_err(|e| NetnsError::Thread(format!("no answer within 500 ms: {e}")))?
}

/// Connects to `addr` inside namespace `ns` within `within`. The socket is made in the
/// namespace ([`socket_in`]); the connect runs on the caller's runtime.
pub async fn connect(
    ns: Netns,
    addr: SocketAddr,
    within: Duration,
) -> Result<tokio::net::TcpStream, NetnsError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    make_socket(ns, addr, move |r| {
        let _ = tx.send(r);
    })?;
    let sock = match tokio::time::timeout(THREAD_WAIT, rx).await {
        Ok(Ok(r)) => r?,
        Ok(Err(_)) => return Err(NetnsError::Thread("ended without an answer".into())),
        Err(_) => return Err(NetnsError::Thread("no answer within 500 ms".into())),
    };
    match tokio::time::timeout(within, sock.connect(addr)).await {
        Err(_) => Err(NetnsError::Timeout {
            addr,
            inode: ns.inode,
            ms: within.as_millis(),
        }),
        Ok(Err(source)) => Err(NetnsError::Connect {
            addr,
            inode: ns.inode,
            source,
        }),
        Ok(Ok(s)) => Ok(s),
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

    #[test]
    fn a_changed_namespace_is_refused_not_entered() {
        // No namespace has inode 1, so no other process can stand in for it either.
        let mut ns = me();
        ns.inode = 1;
        let e = socket_in(ns, "127.0.0.1:1".parse().unwrap()).unwrap_err();
        assert!(matches!(e, NetnsError::Changed { .. }), "{e}");
        let gone = Netns {
            pid: i32::MAX,
            inode: 1,
        };
        assert!(matches!(
            socket_in(gone, "127.0.0.1:1".parse().unwrap()),
            Err(NetnsError::Open { .. })
        ));
    }

    #[test]
    fn a_gone_pid_is_replaced_by_another_process_in_the_same_namespace() {
        let ns = Netns {
            pid: i32::MAX,
            inode: own_inode().unwrap(),
        };
        assert!(socket_in(ns, "127.0.0.1:1".parse().unwrap()).is_ok());
    }

    #[tokio::test]
    async fn connects_in_our_own_namespace_and_leaves_this_thread_alone() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let before = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        let s = connect(me(), addr, Duration::from_millis(500))
            .await
            .unwrap();
        assert_eq!(s.peer_addr().unwrap(), addr);
        assert_eq!(
            std::fs::read_link("/proc/thread-self/ns/net").unwrap(),
            before
        );
        drop(l);
        let e = connect(me(), addr, Duration::from_millis(500))
            .await
            .unwrap_err();
        assert!(e.is_refused(), "{e}");
    }
}
