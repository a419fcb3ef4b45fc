//! The socket table of one sample: our namespace's dump, every other namespace a component
//! lives in, owners from the [`InodeMap`], and only the sockets the topology cares about.

use super::inodes::{InodeMap, Scope};
use super::{SocketConfig, SocketOs};
use crate::model::{SocketEntry, SocketTable, SourceStatus, Topology};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Instant;

/// Builds the socket table for a topology with the kernel's sock_diag and `/proc`: dumps
/// our namespace and every other namespace a component lives in, maps inodes to pids, keeps
/// the relevant sockets. Blocking. Returns the table and the status (degraded with the
/// reasons when something was not possible).
pub fn build_table(
    map: &mut InodeMap,
    topo: &Topology,
    cfg: &SocketConfig,
) -> (SocketTable, SourceStatus) {
    build_table_with(&SocketOs::default(), map, topo, cfg, true)
}

/// The topology's pids by network namespace.
struct Namespaces {
    pids: BTreeSet<i32>,
    /// Pids whose namespace could be read (or that did not vanish).
    live: Vec<i32>,
    /// Namespaces other than ours -> one pid living there.
    foreign: BTreeMap<u64, i32>,
}

/// As [`build_table`] through `os`; TIME_WAIT sockets only when `time_wait`.
pub fn build_table_with(
    os: &SocketOs,
    map: &mut InodeMap,
    topo: &Topology,
    cfg: &SocketConfig,
    time_wait: bool,
) -> (SocketTable, SourceStatus) {
    let start = Instant::now();
    let mut table = SocketTable::default();
    let mut problems: Vec<String> = Vec::new();
    let ns = namespaces(os, topo, &mut problems);
    if let Err(unavailable) = dump_own(os, cfg, time_wait, &mut table, &mut problems) {
        return (table, unavailable);
    }
    for (&inode, &pid) in &ns.foreign {
        let remaining = cfg.timeout.saturating_sub(start.elapsed());
        let sample = NsSample {
            inode,
            pid,
            remaining,
            time_wait,
        };
        dump_foreign(os, &sample, &mut table, &mut problems);
    }
    let stats = map.resolve(&mut table.sockets, &scope(topo, &ns));
    for e in stats.errors {
        problems.push(format!("cannot map sockets to pids: {e}"));
    }
    if !cfg.keep_all && !ns.pids.is_empty() {
        keep_relevant(&mut table, topo, &ns.pids);
    }
    let status = if problems.is_empty() {
        SourceStatus::ok()
    } else {
        SourceStatus::degraded(problems.join("; "))
    };
    (table, status)
}

fn namespaces(os: &SocketOs, topo: &Topology, problems: &mut Vec<String>) -> Namespaces {
    let own = os.proc.own_ns_inode("net").ok();
    let pids: BTreeSet<i32> = topo
        .components
        .iter()
        .flat_map(|c| c.pids.iter().copied())
        .collect();
    let mut out = Namespaces {
        pids,
        live: Vec::new(),
        foreign: BTreeMap::new(),
    };
    for &pid in &out.pids {
        match os.proc.ns_inode(pid, "net") {
            Ok(ns) => {
                out.live.push(pid);
                if Some(ns) != own {
                    out.foreign.entry(ns).or_insert(pid);
                }
            }
            Err(e) if e.is_vanished() => problems.push(format!("pid {pid} vanished")),
            Err(e) => {
                out.live.push(pid);
                problems.push(format!("pid {pid}: cannot read its network namespace: {e}"));
            }
        }
    }
    out
}

/// Our namespace: sock_diag, else `net/tcp` without tcp_info. Err: neither worked.
fn dump_own(
    os: &SocketOs,
    cfg: &SocketConfig,
    time_wait: bool,
    table: &mut SocketTable,
    problems: &mut Vec<String>,
) -> Result<(), SourceStatus> {
    match os.sock_diag.dump(cfg.timeout, time_wait) {
        Ok(d) => {
            if d.undecoded > 0 {
                table.notes.push(format!(
                    "{} sock_diag messages could not be decoded; their tcp_info is missing",
                    d.undecoded
                ));
            }
            table.sockets.extend(d.sockets);
            Ok(())
        }
        Err(e) => {
            problems.push(format!(
                "sock_diag failed ({e}); used /proc/net/tcp without tcp_info"
            ));
            match os.proc.own_tcp_table() {
                Ok(s) => {
                    table.sockets.extend(s);
                    Ok(())
                }
                Err(e2) => Err(SourceStatus::unavailable(format!(
                    "sock_diag: {e}; /proc/net/tcp: {e2}"
                ))),
            }
        }
    }
}

/// One other namespace to dump, and the time left for it.
struct NsSample {
    inode: u64,
    pid: i32,
    remaining: std::time::Duration,
    time_wait: bool,
}

/// Another namespace: entered for sock_diag, else its `net/tcp` without tcp_info.
fn dump_foreign(os: &SocketOs, ns: &NsSample, table: &mut SocketTable, problems: &mut Vec<String>) {
    let (inode, pid) = (ns.inode, ns.pid);
    let dumped = os.sock_diag.dump_netns_of(pid, ns.remaining, ns.time_wait);
    let mut entries: Vec<SocketEntry> = match dumped {
        Ok(d) => {
            table.notes.push(format!(
                "netns {inode} (pid {pid}): sampled inside the namespace with tcp_info"
            ));
            d.sockets
        }
        Err(e) => match os.proc.tcp_table(pid) {
            Ok(s) => {
                let note = format!(
                    "netns {inode} (pid {pid}): could not enter ({e}); read /proc/{pid}/net/tcp without tcp_info"
                );
                table.notes.push(note.clone());
                problems.push(note);
                s
            }
            Err(e2) => {
                problems.push(format!("netns {inode} (pid {pid}): {e}; {e2}"));
                return;
            }
        },
    };
    for s in &mut entries {
        s.netns = Some(inode);
    }
    table.sockets.extend(entries);
}

fn scope(topo: &Topology, ns: &Namespaces) -> Scope {
    if ns.pids.is_empty() {
        return Scope::All;
    }
    let mut ports: Vec<u16> = topo
        .components
        .iter()
        .flat_map(|c| c.listen_ports())
        .collect();
    ports.sort_unstable();
    ports.dedup();
    Scope::Pids {
        pids: ns.live.clone(),
        ports,
    }
}

/// Keeps sockets of topology pids and sockets touching a component's listen port.
fn keep_relevant(table: &mut SocketTable, topo: &Topology, pids: &BTreeSet<i32>) {
    let ports: HashSet<u16> = topo
        .components
        .iter()
        .flat_map(|c| c.listen_ports())
        .collect();
    table.sockets.retain(|s| {
        s.pid.is_some_and(|p| pids.contains(&p))
            || s.local_port().is_some_and(|p| ports.contains(&p))
            || s.remote_port().is_some_and(|p| ports.contains(&p))
    });
}
