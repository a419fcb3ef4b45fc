//! The process table discovery works on: pid, parent and comm of every process (its `stat`
//! line, read through [`ProcFs`] under deadlines when new or needed, else as a recent pass read
//! it: `cache.rs`), the command lines of the pre-filter's candidates, and on demand ancestry,
//! descendants, other command lines, environments, listening sockets and per-namespace TCP
//! tables.

use super::cache::{DiscoveryCache, Entry, FdMemo, Identity};
use super::prefilter::Prefilter;
use crate::error::{Error, Result};
use crate::model::{SocketEntry, TcpState};
use crate::sys::netns::Netns;
use crate::sys::sock_diag::RecentDump;
use crate::sys::{Comm, PidEntry, ProcFs, StatReader};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How far up we look for a launcher, and how deep down for children: real launch chains are
/// 1-3 levels (shell -> timeout -> python); bounded so a pathological tree cannot stall us.
const MAX_ANCESTRY: usize = 8;
const MAX_CHILD_DEPTH: usize = 6;
const MAX_CHILDREN: usize = 512;
/// How long discovery waits on /proc (`DiscoverOptions::deadlines`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcDeadlines {
    /// One read of one process (normally microseconds): a process holding its mmap lock
    /// makes reads of its cmdline or environ block for as long as it likes.
    pub read: Duration,
    /// The whole process table; processes not read by then are left out (read next pass).
    pub table: Duration,
}

impl Default for ProcDeadlines {
    fn default() -> Self {
        ProcDeadlines {
            read: Duration::from_millis(250),
            table: Duration::from_millis(1_000),
        }
    }
}

/// One process as discovery sees it.
#[derive(Debug, Clone, Default)]
pub(super) struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub comm: Comm,
    /// Empty unless read (`full`): only candidates are read up front, see [`ProcTable::full`].
    pub cmdline: Vec<String>,
    /// The pre-filter let it through: it can match a profile.
    pub candidate: bool,
    /// Its command line was read (it may still be empty: denied, vanished, a zombie).
    pub full: bool,
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
    /// netns inode -> tcp + tcp6 entries and the pid they were read through, read once per
    /// namespace.
    net: RefCell<BTreeMap<u64, NamespaceTcp>>,
    /// Our own network namespace: processes in another one are in a container, keyed and
    /// scraped in there.
    own_net: Option<u64>,
    /// The sockets source's latest dump of our own namespace, when young enough, instead
    /// of a dump of our own (`DiscoverOptions::recent_dump`).
    pub recent_dump: Option<Arc<RecentDump>>,
    /// What earlier passes read (see `cache.rs`); given back by [`ProcTable::into_cache`].
    cache: RefCell<DiscoveryCache>,
    deadlines: ProcDeadlines,
}

/// One namespace's TCP entries, and the pid they were read through.
type NamespaceTcp = (i32, Rc<Vec<SocketEntry>>);

/// What a pass reads of a pid: its `stat` line.
struct StatLine {
    ppid: i32,
    id: Identity,
    /// A kernel thread: remembered, never in the table.
    kernel: bool,
}

impl ProcTable {
    /// A `stat` read per pid new, changed or needed (`cache.rs`); command lines only of new
    /// candidates (`prefilter`), the rest from `cache` or on demand.
    pub fn read(
        proc: &ProcFs,
        mut cache: DiscoveryCache,
        prefilter: &Prefilter,
        deadlines: ProcDeadlines,
    ) -> Result<ProcTable> {
        let started = Instant::now();
        let listing = proc.pid_entries().map_err(|e| {
            Error::Other(format!(
                "cannot list processes in {}: {e}",
                proc.root().display()
            ))
        })?;
        let reader = proc
            .stat_reader()
            .map_err(|e| Error::Other(format!("cannot open {}: {e}", proc.root().display())))?;
        cache.start_pass(&listing);
        let reader = Arc::new(reader);
        let (mut procs, to_stat, skipped) = take_unchanged(&mut cache, listing);
        cache.count_stat_reads(to_stat.len());
        let mut to_read = Vec::new();
        let stats = read_stats(proc, Arc::clone(&reader), to_stat, deadlines);
        admit_all(&mut cache, prefilter, stats, &mut procs, &mut to_read);
        // A process that exec'd a stack's program forks its children at once: new candidates'
        // skipped ancestors are read now rather than at their turn.
        let ancestors = skipped_ancestors(&procs, &to_read, &skipped);
        cache.count_refreshed(ancestors.len());
        let stats = read_stats(proc, reader, ancestors, deadlines);
        admit_all(&mut cache, prefilter, stats, &mut procs, &mut to_read);
        let left = deadlines
            .table
            .saturating_sub(started.elapsed())
            .max(deadlines.read);
        for (pid, cmdline) in read_cmdlines(proc, to_read, deadlines.read, left) {
            cache.count_full_read();
            let Some(cmdline) = cmdline else { continue };
            if let Some(e) = cache.get_mut(pid) {
                e.cmdline = Some(Arc::new(cmdline.clone()));
            }
            if let Some(p) = procs.get_mut(&pid) {
                p.cmdline = cmdline;
                p.full = true;
            }
        }
        let children = children_of(&procs);
        Ok(ProcTable {
            proc: proc.clone(),
            procs,
            children,
            net: RefCell::default(),
            own_net: proc.own_ns_inode("net").ok(),
            recent_dump: None,
            cache: RefCell::new(cache),
            deadlines,
        })
    }

    /// The cache, with what this pass learned, for the next pass.
    pub fn into_cache(self) -> DiscoveryCache {
        self.cache.into_inner()
    }

    /// `pid` with its command line, read now (once per incarnation) when the pre-filter
    /// skipped it.
    pub fn full(&self, pid: i32) -> Option<Proc> {
        let p = self.procs.get(&pid)?;
        if p.full {
            return Some(p.clone());
        }
        Some(Proc {
            cmdline: self.cmdline_on_demand(pid),
            full: true,
            ..p.clone()
        })
    }

    /// The command line of `pid` (empty when unreadable).
    pub fn cmdline(&self, pid: i32) -> Vec<String> {
        self.full(pid).map(|p| p.cmdline).unwrap_or_default()
    }

    fn cmdline_on_demand(&self, pid: i32) -> Vec<String> {
        let cached = self
            .cache
            .borrow_mut()
            .get_mut(pid)
            .and_then(|e| e.cmdline.clone());
        if let Some(c) = cached {
            return c.to_vec();
        }
        let path = self.proc.path(pid, "cmdline");
        let reader = self.proc.clone();
        let read = crate::deadline::call(&path, self.deadlines.read, move || reader.cmdline(pid));
        let mut cache = self.cache.borrow_mut();
        cache.count_full_read();
        // Timed out: not remembered, so a later pass tries again.
        let Ok(read) = read else {
            return Vec::new();
        };
        let cmdline = read.unwrap_or_default();
        if let Some(e) = cache.get_mut(pid) {
            e.cmdline = Some(Arc::new(cmdline.clone()));
        }
        cmdline
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

    /// Drops every process that is neither one of `roots` nor below one: another stack on a
    /// shared host is not discovered, nor are its sockets' holders.
    pub fn keep_within(&mut self, roots: &[i32]) {
        let mut inside: BTreeMap<i32, bool> = roots.iter().map(|&r| (r, true)).collect();
        for &pid in self.procs.keys() {
            self.is_within(pid, &mut inside);
        }
        self.procs.retain(|pid, _| inside.get(pid) == Some(&true));
        self.children = children_of(&self.procs);
    }

    /// Whether `pid` is below a root, walking up its parents (the answer kept for each one
    /// walked, so the table is walked once); a chain leaving the table is outside, and so
    /// is one longer than the table (a parent cycle in a hostile procfs).
    fn is_within(&self, pid: i32, inside: &mut BTreeMap<i32, bool>) -> bool {
        let mut chain = Vec::new();
        let mut cur = pid;
        let answer = loop {
            if let Some(&known) = inside.get(&cur) {
                break known;
            }
            chain.push(cur);
            match self.procs.get(&cur) {
                Some(p) if p.ppid > 0 && chain.len() <= self.procs.len() => cur = p.ppid,
                _ => break false,
            }
        };
        for p in chain {
            inside.insert(p, answer);
        }
        answer
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

    /// The network namespace of `pid`, remembered per incarnation (a `setns` without exec is
    /// not seen); an unreadable one is not tried again.
    pub fn netns(&self, pid: i32) -> Option<u64> {
        let cached = self.cache.borrow_mut().get_mut(pid).and_then(|e| e.netns);
        if let Some(ns) = cached {
            return ns;
        }
        let ns = self.proc.ns_inode(pid, "net").ok();
        if let Some(e) = self.cache.borrow_mut().get_mut(pid) {
            e.netns = Some(ns);
        }
        ns
    }

    // --- netns ---

    /// The network namespace of `pid` when it is not ours (a container); None for ours or when
    /// either cannot be read (treated as the host's).
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

    /// TCP entries of the network namespace `pid` lives in (no TIME_WAIT ones: a socket
    /// without an inode, which discovery never uses).
    pub fn tcp_of(&self, pid: i32) -> Rc<Vec<SocketEntry>> {
        let ns = self.netns(pid);
        let key = ns.unwrap_or(0);
        if let Some((_, v)) = self.net.borrow().get(&key) {
            return Rc::clone(v);
        }
        let entries = Rc::new(self.read_tcp(pid, ns, false));
        self.net
            .borrow_mut()
            .insert(key, (pid, Rc::clone(&entries)));
        entries
    }

    /// Of `inodes` (sockets of this pass's TCP tables), those still open now, from a fresh
    /// read of every namespace read this pass: a closed socket is not searched for in every
    /// process's fds.
    pub fn open_now(&self, inodes: &[u64]) -> BTreeSet<u64> {
        let namespaces: Vec<(u64, i32)> = self
            .net
            .borrow()
            .iter()
            .map(|(ns, (pid, _))| (*ns, *pid))
            .collect();
        let wanted: BTreeSet<u64> = inodes.iter().copied().collect();
        let mut open = BTreeSet::new();
        for (ns, pid) in namespaces {
            let ns = (ns != 0).then_some(ns);
            let now = self.read_tcp(pid, ns, true);
            open.extend(now.iter().map(|e| e.inode).filter(|i| wanted.contains(i)));
        }
        open
    }

    /// The TCP sockets of `pid`'s namespace `ns`: our own through sock_diag (the recent dump
    /// unless `fresh`); else, or when that fails, `net/tcp{,6}` as `pid` sees them.
    fn read_tcp(&self, pid: i32, ns: Option<u64>, fresh: bool) -> Vec<SocketEntry> {
        if ns.is_some() && ns == self.own_net && self.proc.is_real() {
            let recent = self.recent_dump.as_ref().filter(|_| !fresh);
            if let Some(kept) = recent.and_then(|r| r.latest(Instant::now())) {
                return Arc::unwrap_or_clone(kept);
            }
            if let Ok(dump) = crate::sys::sock_diag::dump_netlink(self.deadlines.read, false) {
                return dump.sockets;
            }
        }
        let mut all = self.proc.tcp_table(pid).unwrap_or_default();
        all.retain(|e| e.state != TcpState::TimeWait);
        all
    }

    /// Socket inodes `pid` holds (empty when its fds are unreadable). Kept per incarnation
    /// with its open-fd count: read again only when that count changed, or when `fresh`.
    pub fn socket_inodes_memo(&self, pid: i32, fresh: bool) -> Arc<Vec<u64>> {
        let count = self.proc.fd_dir_size(pid).filter(|n| *n > 0);
        self.cache.borrow_mut().count_fd_check();
        if !fresh {
            let memo = self
                .cache
                .borrow_mut()
                .get_mut(pid)
                .and_then(|e| e.fds.clone());
            if let (Some(m), Some(n)) = (memo, count) {
                if m.fd_count == n {
                    return m.sockets;
                }
            }
        }
        let sockets = Arc::new(
            self.proc
                .socket_inodes(pid)
                .map(|s| s.socket_inodes)
                .unwrap_or_default(),
        );
        let mut cache = self.cache.borrow_mut();
        cache.count_fd_scan();
        if let (Some(e), Some(fd_count)) = (cache.get_mut(pid), count) {
            e.fds = Some(FdMemo {
                fd_count,
                sockets: Arc::clone(&sockets),
            });
        }
        sockets
    }

    // --- what the proxy search remembers (`holders.rs`) ---

    pub fn socket_holders(&self) -> Vec<i32> {
        self.cache.borrow().socket_holders()
    }

    pub fn remember_socket_holders(&self, pids: impl Iterator<Item = i32>) {
        self.cache.borrow_mut().remember_socket_holders(pids);
    }

    pub fn give_up_sockets(&self, inodes: &[u64]) {
        self.cache.borrow_mut().give_up_sockets(inodes);
    }

    pub fn given_up_socket(&self, inode: u64) -> bool {
        self.cache.borrow().given_up_socket(inode)
    }

    pub fn retain_given_up(&self, wanted: &BTreeSet<u64>) {
        self.cache.borrow_mut().retain_given_up(wanted);
    }

    /// Socket inodes `pid` holds now (empty when its fds are unreadable).
    pub fn socket_inodes(&self, pid: i32) -> BTreeSet<u64> {
        self.socket_inodes_memo(pid, false)
            .iter()
            .copied()
            .collect()
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

    /// The environment of `pid`; None when unreadable (vanished, denied, or blocked).
    pub(super) fn environ_read(&self, pid: i32) -> Option<BTreeMap<String, String>> {
        let path = self.proc.path(pid, "environ");
        let proc = self.proc.clone();
        let read = move || proc.environ(pid).ok();
        self.cache.borrow_mut().count_env_read();
        crate::deadline::call(&path, self.deadlines.read, read)
            .ok()
            .flatten()
    }

    /// Runs `f` on the cache entry of `pid` (None: not remembered, the cache is full).
    pub(super) fn with_entry<R>(&self, pid: i32, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
        self.cache.borrow_mut().get_mut(pid).map(f)
    }

    pub(super) fn count_versions_read(&self) {
        self.cache.borrow_mut().count_versions_read();
    }
}

/// Each process's children, by parent pid.
fn children_of(procs: &BTreeMap<i32, Proc>) -> BTreeMap<i32, Vec<i32>> {
    let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for p in procs.values() {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    children
}

/// The processes of `listing` whose `stat` line this pass need not read (`cache.rs`), as
/// the table has them (kernel threads left out); the ones to read; the ones skipped.
fn take_unchanged(
    cache: &mut DiscoveryCache,
    listing: Vec<PidEntry>,
) -> (BTreeMap<i32, Proc>, Vec<PidEntry>, Vec<PidEntry>) {
    let mut procs = BTreeMap::new();
    let (mut to_stat, mut skipped) = (Vec::new(), Vec::new());
    for e in listing {
        let Some(known) = cache.unchanged(e) else {
            to_stat.push(e);
            continue;
        };
        skipped.push(e);
        if !known.kernel {
            let p = Proc {
                pid: e.pid,
                ppid: known.ppid,
                comm: known.id.comm,
                ..Proc::default()
            };
            procs.insert(e.pid, p);
        }
    }
    (procs, to_stat, skipped)
}

/// Admits the `stat` lines read into the table; candidates not read in full go to `to_read`
/// (the pids of two calls in one pass are disjoint: read, then skipped ones).
fn admit_all(
    cache: &mut DiscoveryCache,
    prefilter: &Prefilter,
    stats: Vec<(PidEntry, StatLine)>,
    procs: &mut BTreeMap<i32, Proc>,
    to_read: &mut Vec<i32>,
) {
    for (e, line) in stats {
        let Some(p) = admit(cache, prefilter, e, line) else {
            procs.remove(&e.pid);
            continue;
        };
        if p.candidate && !p.full {
            to_read.push(p.pid);
        }
        procs.insert(p.pid, p);
    }
}

/// The skipped (`skipped`, sorted by pid) ancestors of the processes `new`, each once.
fn skipped_ancestors(
    procs: &BTreeMap<i32, Proc>,
    new: &[i32],
    skipped: &[PidEntry],
) -> Vec<PidEntry> {
    let mut out: Vec<PidEntry> = Vec::new();
    for &pid in new {
        let mut cur = pid;
        for _ in 0..MAX_ANCESTRY {
            let Some(ppid) = procs.get(&cur).map(|p| p.ppid).filter(|p| *p > 1) else {
                break;
            };
            if let Ok(i) = skipped.binary_search_by_key(&ppid, |e| e.pid) {
                if !out.contains(&skipped[i]) {
                    out.push(skipped[i]);
                }
            }
            cur = ppid;
        }
    }
    out.sort_unstable_by_key(|e| e.pid);
    out
}

/// One process whose `stat` line this pass read, checked against its cache entry (a new
/// incarnation replaces it): its place in the table, None for a kernel thread.
fn admit(
    cache: &mut DiscoveryCache,
    prefilter: &Prefilter,
    e: PidEntry,
    line: StatLine,
) -> Option<Proc> {
    let mut p = Proc {
        pid: e.pid,
        ppid: line.ppid,
        comm: line.id.comm,
        ..Proc::default()
    };
    match cache.known(e.pid, &line.id) {
        Some(entry) => {
            (entry.ino, entry.ppid) = (e.ino, line.ppid);
            p.candidate = entry.candidate;
            if let Some(c) = &entry.cmdline {
                p.cmdline = c.to_vec();
                p.full = true;
            }
        }
        None => {
            let candidate = cache.is_uncached() || prefilter.candidate(p.comm.as_str());
            p.candidate = candidate && !line.kernel;
            let mut entry = Entry::new(line.id, p.candidate);
            (entry.ino, entry.ppid, entry.kernel) = (e.ino, line.ppid, line.kernel);
            cache.insert(e.pid, entry);
        }
    }
    (!line.kernel).then_some(p)
}

/// Pids whose `stat` lines one deadline item reads (per pid, the bookkeeping cost more than
/// the read); a blocked chunk's pids miss that pass only.
const STAT_CHUNK: usize = 64;

/// The `stat` line of each listed pid, under the table's deadlines; vanished processes and
/// blocked reads are left out.
fn read_stats(
    proc: &ProcFs,
    reader: Arc<StatReader>,
    pids: Vec<PidEntry>,
    deadlines: ProcDeadlines,
) -> Vec<(PidEntry, StatLine)> {
    let items: Vec<(std::path::PathBuf, Vec<PidEntry>)> = pids
        .chunks(STAT_CHUNK)
        .map(|c| (proc.path(c[0].pid, "stat"), c.to_vec()))
        .collect();
    let read = move |chunk: &Vec<PidEntry>| -> Vec<(PidEntry, StatLine)> {
        chunk
            .iter()
            .filter_map(|&e| read_stat(&reader, e.pid).map(|s| (e, s)))
            .collect()
    };
    crate::deadline::map(items, deadlines.read, deadlines.table, read)
        .into_iter()
        .filter_map(|r| r.ok())
        .flatten()
        .collect()
}

fn read_stat(reader: &StatReader, pid: i32) -> Option<StatLine> {
    // a process that vanished between readdir and stat is simply not there
    let stat = reader.brief(pid).ok()?;
    Some(StatLine {
        kernel: stat.kthread,
        ppid: stat.ppid,
        id: Identity {
            start: stat.starttime,
            comm: stat.comm,
            exec_mark: (stat.startcode, stat.startstack),
        },
    })
}

/// Command lines of `pids`. Reading one takes the process's mmap lock, so each runs under
/// `each`; None: not read (timed out, or the time was up), tried again next pass.
fn read_cmdlines(
    proc: &ProcFs,
    pids: Vec<i32>,
    each: Duration,
    total: Duration,
) -> Vec<(i32, Option<Vec<String>>)> {
    let items: Vec<(std::path::PathBuf, i32)> =
        pids.iter().map(|&p| (proc.path(p, "cmdline"), p)).collect();
    let reader = proc.clone();
    // Denied or vanished: an empty command line.
    let read = move |&pid: &i32| reader.cmdline(pid).unwrap_or_default();
    let out = crate::deadline::map(items, each, total, read);
    pids.into_iter()
        .zip(out)
        .map(|(p, r)| (p, r.ok()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our own listeners as one pass of discovery finds them, with `recent` as the
    /// daemon's shared dump.
    fn own_listeners(recent: Option<Arc<RecentDump>>) -> Vec<SocketAddr> {
        let proc = ProcFs::real();
        let mut table = ProcTable::read(
            &proc,
            DiscoveryCache::new(),
            &Prefilter::new(&[]),
            ProcDeadlines::default(),
        )
        .expect("read");
        table.recent_dump = recent;
        table.listen_of(std::process::id() as i32)
    }

    #[test]
    fn a_young_shared_dump_is_read_instead_of_the_kernel_and_an_old_one_is_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        assert!(own_listeners(None).contains(&addr), "the kernel's dump");
        // A young dump taken before the listener existed: discovery believes it.
        let recent = Arc::new(RecentDump::new(Duration::from_secs(60)));
        recent.offer(Instant::now(), &[]);
        assert!(!own_listeners(Some(Arc::clone(&recent))).contains(&addr));
        // Too old to be taken: the kernel is asked again.
        let stale = Arc::new(RecentDump::new(Duration::ZERO));
        stale.offer(Instant::now() - Duration::from_millis(50), &[]);
        assert!(own_listeners(Some(stale)).contains(&addr));
    }
}
