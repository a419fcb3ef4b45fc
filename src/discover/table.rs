//! The process table discovery works on: pid, parent, comm and cmdline of every process,
//! read once per discovery through [`ProcFs`] under deadlines, with ancestry, descendants,
//! environments, listening sockets and per-namespace TCP tables on demand.

use crate::error::{Error, Result};
use crate::model::{SocketEntry, TcpState};
use crate::sys::netns::Netns;
use crate::sys::ProcFs;
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

/// How far up we look for a launcher, and how deep down for children: real launch chains are
/// 1-3 levels (shell -> timeout -> python); bounded so a pathological tree cannot stall us.
const MAX_ANCESTRY: usize = 8;
const MAX_CHILD_DEPTH: usize = 6;
const MAX_CHILDREN: usize = 512;
/// Longest wait for one /proc read of one process (normally microseconds): a process holding
/// its mmap lock makes reads of its cmdline or environ block for as long as it likes.
const READ_DEADLINE: Duration = Duration::from_millis(250);
/// Longest wait for the whole process table; processes not read by then are left out.
const TABLE_DEADLINE: Duration = Duration::from_millis(1_000);

/// One process as discovery sees it.
#[derive(Debug, Clone, Default)]
pub(super) struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub comm: String,
    pub cmdline: Vec<String>,
}

impl Proc {
    pub fn joined(&self) -> String {
        self.cmdline.join(" ")
    }
    pub fn argv0(&self) -> &str {
        self.cmdline.first().map(String::as_str).unwrap_or("")
    }
}

pub(super) struct ProcTable {
    pub proc: ProcFs,
    pub procs: BTreeMap<i32, Proc>,
    children: BTreeMap<i32, Vec<i32>>,
    /// netns inode -> tcp + tcp6 entries, read once per namespace and shared, not copied,
    /// for each pid that asks (thousands of entries under connection churn, asked once per
    /// candidate process).
    net: RefCell<BTreeMap<u64, Rc<Vec<SocketEntry>>>>,
    /// Our own network namespace (netns, issue 11 item 5): processes in another one are in a
    /// container, keyed and scraped in there.
    own_net: Option<u64>,
}

impl ProcTable {
    pub fn read(proc: &ProcFs) -> Result<ProcTable> {
        let pids = proc.pids().map_err(|e| {
            Error::Other(format!(
                "cannot list processes in {}: {e}",
                proc.root().display()
            ))
        })?;
        // Listing is readdir only; reading each process may block (see `read_proc`).
        let items: Vec<(std::path::PathBuf, i32)> =
            pids.into_iter().map(|p| (proc.pid_dir(p), p)).collect();
        let reader = proc.clone();
        let read = move |&pid: &i32| read_proc(&reader, pid);
        let procs: BTreeMap<i32, Proc> =
            crate::deadline::map(items, READ_DEADLINE, TABLE_DEADLINE, read)
                .into_iter()
                // Vanished, a kernel thread, or blocked: not a candidate this pass.
                .filter_map(|r| r.ok().flatten())
                .map(|p| (p.pid, p))
                .collect();
        let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for p in procs.values() {
            children.entry(p.ppid).or_default().push(p.pid);
        }
        Ok(ProcTable {
            proc: proc.clone(),
            procs,
            children,
            net: RefCell::default(),
            own_net: proc.own_ns_inode("net").ok(),
        })
    }

    pub fn ancestors(&self, pid: i32) -> Vec<i32> {
        let mut out = Vec::new();
        let mut cur = pid;
        for _ in 0..MAX_ANCESTRY {
            let Some(p) = self.procs.get(&cur) else { break };
            if p.ppid <= 1 || out.contains(&p.ppid) {
                break;
            }
            out.push(p.ppid);
            cur = p.ppid;
        }
        out
    }

    /// Descendants, breadth first, bounded in depth and count.
    pub fn descendants(&self, pid: i32) -> Vec<i32> {
        let mut out = Vec::new();
        let mut level = vec![pid];
        for _ in 0..MAX_CHILD_DEPTH {
            let mut next = Vec::new();
            for p in level {
                for &c in self.children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
                    if out.len() < MAX_CHILDREN {
                        out.push(c);
                        next.push(c);
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            level = next;
        }
        out
    }

    pub fn netns(&self, pid: i32) -> Option<u64> {
        self.proc.ns_inode(pid, "net").ok()
    }

    // --- netns (issue 11 item 5) ---

    /// The network namespace of `pid` when it is not ours (a container); None for ours or
    /// when either cannot be read (then it is treated as the host's, as before).
    pub fn foreign_netns(&self, pid: i32) -> Option<u64> {
        let own = self.own_net?;
        self.netns(pid).filter(|&ns| ns != own)
    }

    /// Where to open connections to `pid`'s sockets: inside its namespace when foreign.
    pub fn netns_ref(&self, pid: i32) -> Option<Netns> {
        self.foreign_netns(pid).map(|inode| Netns { pid, inode })
    }

    /// A listen address as part of a component id: in a foreign namespace prefixed by it
    /// (`net:4026532845/127.0.0.1:30000`), since two pods can listen on one address.
    pub fn keyed(&self, pid: i32, addr: &str) -> String {
        match self.foreign_netns(pid) {
            Some(ns) => format!("net:{ns}/{addr}"),
            None => addr.to_string(),
        }
    }

    /// Sets where `c` (main process `pid`) lives: its foreign namespace, its container.
    pub fn place(&self, c: &mut crate::model::Component, pid: i32) {
        c.netns = self.foreign_netns(pid);
        c.container = crate::sys::cgroup::of_pid(&self.proc, pid).map(|p| p.name());
    }

    // --- end netns ---

    /// TCP entries of the network namespace `pid` lives in.
    pub fn tcp_of(&self, pid: i32) -> Rc<Vec<SocketEntry>> {
        let key = self.netns(pid).unwrap_or(0);
        if let Some(v) = self.net.borrow().get(&key) {
            return Rc::clone(v);
        }
        let entries = Rc::new(self.proc.tcp_table(pid).unwrap_or_default());
        self.net.borrow_mut().insert(key, Rc::clone(&entries));
        entries
    }

    /// Socket inodes `pid` holds (empty when its fds are unreadable).
    pub fn socket_inodes(&self, pid: i32) -> BTreeSet<u64> {
        self.proc
            .socket_inodes(pid)
            .map(|s| s.socket_inodes.into_iter().collect())
            .unwrap_or_default()
    }

    /// Listen addresses of `pid` (its own LISTEN sockets), sorted by port.
    pub fn listen_of(&self, pid: i32) -> Vec<SocketAddr> {
        let inodes = self.socket_inodes(pid);
        if inodes.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<SocketAddr> = self
            .tcp_of(pid)
            .iter()
            .filter(|e| e.state == TcpState::Listen && inodes.contains(&e.inode))
            .filter_map(|e| e.local.parse().ok())
            .collect();
        out.sort_by_key(|a| (a.port(), a.to_string()));
        out.dedup();
        out
    }

    /// The environment of `pid` (empty when unreadable: vanished, denied, or blocked).
    pub fn environ(&self, pid: i32) -> BTreeMap<String, String> {
        let path = self.proc.path(pid, "environ");
        let proc = self.proc.clone();
        let read = move || proc.environ(pid).unwrap_or_default();
        crate::deadline::call(&path, READ_DEADLINE, read).unwrap_or_default()
    }
}

/// One process's table entry (None: vanished, or a kernel thread). Reading cmdline takes the
/// process's mmap lock, so this runs under [`READ_DEADLINE`].
fn read_proc(proc: &ProcFs, pid: i32) -> Option<Proc> {
    // a process that vanished between readdir and stat is simply not there
    let stat = proc.stat(pid).ok()?;
    if stat.ppid == 2 || pid == 2 {
        return None; // kernel threads
    }
    let comm = proc.comm(pid).unwrap_or(stat.comm);
    let cmdline = proc.cmdline(pid).unwrap_or_default();
    Some(Proc {
        pid,
        ppid: stat.ppid,
        comm,
        cmdline,
    })
}
