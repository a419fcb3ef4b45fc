//! Socket inode -> owning pid, from the processes' fd links ([`ProcFs::socket_inodes`]),
//! cached between samples and refreshed only when unknown inodes appear, and then only over
//! the candidate pids ([`Scope`]).

use crate::model::SocketEntry;
use crate::sys::ProcFs;
use std::collections::{HashMap, HashSet};

/// Which processes may own the sockets we care about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every process (`ss -p` style); used when there is no topology yet.
    All,
    /// Only these pids (the topology's). An unknown socket touching one of `ports` (the
    /// topology's listen ports; empty: any) rescans every pid; any other only pids whose fd
    /// count changed, so churn elsewhere does not cost a rescan per tick.
    Pids { pids: Vec<i32>, ports: Vec<u16> },
}

/// Counters of one [`InodeMap::resolve`] call (for the bench and the doctor).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolveStats {
    pub pids_scanned: u32,
    pub fds_read: u64,
    /// Inodes that were unknown before this call.
    pub unknown_before: u32,
    /// Inodes still without an owner (not in scope, or unreadable).
    pub unresolved: u32,
    /// Per-pid problems (permission denied, vanished).
    pub errors: Vec<String>,
}

/// Cached socket inode -> owning pid map, refreshed incrementally (see [`Scope`]): a
/// `resolve` call reads `fd/` links only when the table holds inodes it has never seen;
/// inodes looked for and not found are remembered as foreign until the scope changes, so
/// sockets of unrelated processes do not force a rescan every tick.
#[derive(Debug, Default)]
pub struct InodeMap {
    proc: ProcFs,
    owners: HashMap<u64, i32>,
    foreign: HashSet<u64>,
    scope: Option<Scope>,
    /// Open fd count of each pid at its last scan (`st_size` of `fd/`; 0 where the kernel
    /// does not give it, and only relevant sockets trigger rescans).
    fd_counts: HashMap<i32, u64>,
}

/// The unknown inodes of one table, and whether one of them touches a topology port.
struct Unknown {
    inodes: Vec<u64>,
    relevant: bool,
    present: HashSet<u64>,
}

impl InodeMap {
    /// A map over the kernel's `/proc`.
    pub fn new() -> Self {
        InodeMap::default()
    }

    /// A map over another procfs tree (tests: a fixture).
    pub fn with_proc(proc: ProcFs) -> Self {
        InodeMap {
            proc,
            ..InodeMap::default()
        }
    }

    /// Number of inodes with a known owner.
    pub fn len(&self) -> usize {
        self.owners.len()
    }

    pub fn is_empty(&self) -> bool {
        self.owners.is_empty()
    }

    /// Forgets everything (the next resolve is a cold one).
    pub fn clear(&mut self) {
        *self = InodeMap::with_proc(self.proc.clone());
    }

    /// Fills `pid` of every socket whose inode an in-scope process holds.
    pub fn resolve(&mut self, sockets: &mut [SocketEntry], scope: &Scope) -> ResolveStats {
        let mut stats = ResolveStats::default();
        if self.scope.as_ref() != Some(scope) {
            // A new pid may own what we called foreign.
            self.foreign.clear();
            self.scope = Some(scope.clone());
        }
        let unknown = self.unknown(sockets, scope);
        stats.unknown_before = unknown.inodes.len() as u32;
        if !unknown.inodes.is_empty() {
            let pids = self.candidates(scope, unknown.relevant);
            self.scan(&pids, scope, &mut stats);
            for i in &unknown.inodes {
                if !self.owners.contains_key(i) {
                    self.foreign.insert(*i);
                }
            }
        }
        // Bound memory: keep only what the current table holds.
        let present = unknown.present;
        if self.owners.len() + self.foreign.len() > present.len() {
            self.owners.retain(|i, _| present.contains(i));
            self.foreign.retain(|i| present.contains(i));
        }
        for s in sockets.iter_mut() {
            s.pid = self.owners.get(&s.inode).copied();
            if s.pid.is_none() && s.inode != 0 {
                stats.unresolved += 1;
            }
        }
        stats
    }

    fn unknown(&self, sockets: &[SocketEntry], scope: &Scope) -> Unknown {
        let ports: HashSet<u16> = match scope {
            Scope::Pids { ports, .. } => ports.iter().copied().collect(),
            Scope::All => HashSet::new(),
        };
        let mut out = Unknown {
            inodes: Vec::new(),
            relevant: false,
            present: HashSet::with_capacity(sockets.len()),
        };
        for s in sockets {
            if s.inode == 0 || !out.present.insert(s.inode) {
                continue;
            }
            if !self.owners.contains_key(&s.inode) && !self.foreign.contains(&s.inode) {
                out.inodes.push(s.inode);
                out.relevant |= ports.is_empty()
                    || s.local_port().is_some_and(|p| ports.contains(&p))
                    || s.remote_port().is_some_and(|p| ports.contains(&p));
            }
        }
        out
    }

    /// The pids to scan: all in scope when a relevant socket is unknown, else only those
    /// whose fd count changed since their last scan.
    fn candidates(&mut self, scope: &Scope, relevant: bool) -> Vec<i32> {
        match scope {
            Scope::All => self.proc.pids().unwrap_or_default(),
            Scope::Pids { pids, .. } => {
                let mut p = pids.clone();
                p.sort_unstable();
                p.dedup();
                self.fd_counts.retain(|k, _| p.contains(k));
                if relevant {
                    return p;
                }
                p.into_iter()
                    .filter(|pid| self.proc.fd_dir_size(*pid) != self.fd_counts.get(pid).copied())
                    .collect()
            }
        }
    }

    fn scan(&mut self, pids: &[i32], scope: &Scope, stats: &mut ResolveStats) {
        for (pid, result) in scan_many(&self.proc, pids) {
            match result {
                Ok(scan) => {
                    stats.pids_scanned += 1;
                    stats.fds_read += scan.fds_read;
                    if let Some(c) = scan.fd_count {
                        self.fd_counts.insert(pid, c);
                    }
                    for ino in scan.socket_inodes {
                        self.owners.entry(ino).or_insert(pid);
                    }
                }
                // Other users' processes are expected to be unreadable in `All`.
                Err(e) if matches!(scope, Scope::Pids { .. }) => stats.errors.push(e),
                Err(_) => {}
            }
        }
    }
}

/// One pid's scan: the fd count taken before it (see [`InodeMap`]) and what it found.
struct PidScan {
    fd_count: Option<u64>,
    fds_read: u64,
    socket_inodes: Vec<u64>,
}

fn scan_one(proc: &ProcFs, pid: i32) -> Result<PidScan, String> {
    let fd_count = proc.fd_dir_size(pid);
    let scan = proc.socket_inodes(pid).map_err(|e| e.to_string())?;
    Ok(PidScan {
        fd_count,
        fds_read: scan.fds_read,
        socket_inodes: scan.socket_inodes,
    })
}

/// Scans the fds of many pids on a few threads (the scan is syscall-bound: one readlinkat
/// per fd). Results come back in `pids` order, so "first owner wins" stays deterministic.
fn scan_many(proc: &ProcFs, pids: &[i32]) -> Vec<(i32, Result<PidScan, String>)> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4);
    if threads == 1 || pids.len() < 8 {
        return pids.iter().map(|&p| (p, scan_one(proc, p))).collect();
    }
    let chunk = pids.len().div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = pids
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|&p| (p, scan_one(proc, p)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(pids.len());
        for (h, part) in handles.into_iter().zip(pids.chunks(chunk)) {
            match h.join() {
                Ok(v) => out.extend(v),
                Err(_) => out.extend(
                    part.iter()
                        .map(|&p| (p, Err(format!("pid {p}: fd scan thread panicked")))),
                ),
            }
        }
        out
    })
}
