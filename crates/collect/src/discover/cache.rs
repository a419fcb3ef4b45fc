//! What discovery remembers between passes, per process incarnation (pid, start time): its
//! command line once read, network namespace, socket fds, and for components' processes a few
//! environment variables and the installed versions (`memo.rs`).
//!
//! A pass reads the `stat` line of every new, changed or related pid and of a rotating slice
//! of the unrelated ones (at most [`ROTATION_BUDGET`] a pass; kernel threads never). A known
//! process is read in full again only when its start time, comm or exec mark (`stat`'s
//! start_code and start_stack) differs: an exec is seen at its turn, or on the next pass when
//! a candidate descends from it. For the proxy search (`holders.rs`) it keeps past holders
//! and the sockets no readable process held. Bounded: absent pids are dropped, at most
//! [`MAX_ENTRIES`] kept. The long version: docs/probes.md.

use super::memo::{EnvMemo, VersionsMemo};
use super::profiles::CompiledSet;
use crate::probes::Profile;
use crate::sys::{Comm, PidEntry};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// Most processes remembered (a few hundred bytes each; far above a real host's count).
pub const MAX_ENTRIES: usize = 65_536;

/// A known unrelated process's `stat` line is read every this many passes on a small host:
/// the longest an exec into a stack's program goes unseen.
pub const STAT_ROTATION: u64 = 6;

/// Most `stat` lines of known unrelated processes a pass reads while the rotation can still
/// grow (the rotation's reads dominate a cached pass).
pub const ROTATION_BUDGET: u64 = 100;

/// The longest rotation, in passes: beyond [`ROTATION_BUDGET`] x this many unrelated processes
/// a pass reads more of them instead.
pub const MAX_ROTATION: u64 = 48;

/// The rotation's length for `unrelated` known unrelated processes: [`STAT_ROTATION`]
/// doubled until a pass's slice fits [`ROTATION_BUDGET`], at most [`MAX_ROTATION`]. Each
/// length divides the next, so a change of length never delays a turn past the longer one.
pub fn rotation_len(unrelated: usize) -> u64 {
    let mut len = STAT_ROTATION;
    while (unrelated as u64).div_ceil(len) > ROTATION_BUDGET && len * 2 <= MAX_ROTATION {
        len *= 2;
    }
    len
}

/// One process incarnation as its `stat` line shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    /// Start time, in clock ticks after boot.
    pub start: u64,
    pub comm: Comm,
    /// (start_code, start_stack): moved by every exec.
    pub exec_mark: (u64, u64),
}

/// Socket fds of a process, and its open-fd count when they were read.
#[derive(Debug, Clone)]
pub(super) struct FdMemo {
    pub fd_count: u64,
    pub sockets: Arc<Vec<u64>>,
}

#[derive(Debug, Clone)]
pub(super) struct Entry {
    pub id: Identity,
    /// Its directory's inode number in the last listing.
    pub ino: u64,
    /// Its parent when its `stat` line was last read.
    pub ppid: i32,
    /// A kernel thread (never in the table).
    pub kernel: bool,
    /// The pre-filter's verdict on its comm.
    pub candidate: bool,
    /// None: not read (not a candidate, nor needed on demand yet).
    pub cmdline: Option<Arc<Vec<String>>>,
    /// None: not read yet; Some(None): unreadable (not tried again for this incarnation).
    pub netns: Option<Option<u64>>,
    pub fds: Option<FdMemo>,
    /// The few environment variables discovery uses (`memo.rs`).
    pub env: Option<EnvMemo>,
    /// Installed versions, once read in full (`memo.rs`).
    pub versions: Option<VersionsMemo>,
}

impl Entry {
    /// Neither a candidate nor read in full: only its `stat` line matters, at its turn.
    fn unrelated(&self) -> bool {
        !self.candidate && self.cmdline.is_none()
    }

    pub fn new(id: Identity, candidate: bool) -> Entry {
        Entry {
            id,
            ino: 0,
            ppid: 0,
            kernel: false,
            candidate,
            cmdline: None,
            netns: None,
            fds: None,
            env: None,
            versions: None,
        }
    }
}

/// Reads done through the cache, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// `stat` lines read (new, changed and related pids, and the rotation's slice).
    pub stat_reads: u64,
    /// `stat` lines not read: known unrelated processes out of the rotation's slice.
    pub stat_skips: u64,
    /// Command lines read (the full reads).
    pub full_reads: u64,
    /// Fd directories scanned for sockets.
    pub fd_scans: u64,
    /// Open-fd counts checked (`st_size` of `fd/`: is a remembered socket list still good).
    pub fd_checks: u64,
    /// Environments read (components' processes only).
    pub env_reads: u64,
    /// Installed-versions reads (`maps` and site-packages; top-level components only).
    pub versions_reads: u64,
    /// Probe sets compiled (once per cache while its profiles stay the same).
    pub profile_compiles: u64,
}

/// Discovery's memory between passes (see the module doc). `Default` is an empty cache; a
/// one-shot discovery uses a fresh one, the daemon keeps one for its rediscoveries.
#[derive(Debug, Default)]
pub struct DiscoveryCache {
    entries: HashMap<i32, Entry>,
    stats: CacheStats,
    /// Pids that held a client socket towards a known component in an earlier pass.
    socket_holders: BTreeSet<i32>,
    /// Such sockets no readable process held: not searched for again.
    given_up: HashSet<u64>,
    /// The profiles compiled, kept while a pass's profiles are the same.
    compiled: Option<Arc<CompiledSet>>,
    /// Passes started: which slice of the unrelated processes is read (`rotation_len`).
    passes: u64,
    /// This pass's rotation length (0 before the first pass).
    rotation: u64,
    /// Peer mode: every process is a candidate and nothing is kept between passes.
    uncached: bool,
}

impl DiscoveryCache {
    pub fn new() -> DiscoveryCache {
        DiscoveryCache::default()
    }

    /// No pre-filter and no memory: every pass reads every process in full.
    pub fn uncached() -> DiscoveryCache {
        DiscoveryCache {
            uncached: true,
            ..DiscoveryCache::default()
        }
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    /// Processes remembered now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(super) fn is_uncached(&self) -> bool {
        self.uncached
    }

    /// `profiles` compiled: this cache's set when it was compiled from the same profiles,
    /// else compiled now (and kept).
    pub(super) fn compiled(&mut self, profiles: &[Profile]) -> Arc<CompiledSet> {
        if let Some(set) = self.compiled.as_ref().filter(|s| s.is_of(profiles)) {
            return Arc::clone(set);
        }
        let set = Arc::new(CompiledSet::new(profiles));
        self.stats.profile_compiles += 1;
        self.compiled = Some(Arc::clone(&set));
        set
    }

    /// `n` skipped processes read after all (ancestors of new candidates).
    pub(super) fn count_refreshed(&mut self, n: usize) {
        self.stats.stat_reads += n as u64;
        self.stats.stat_skips = self.stats.stat_skips.saturating_sub(n as u64);
    }

    pub(super) fn count_stat_reads(&mut self, n: usize) {
        self.stats.stat_reads += n as u64;
    }

    pub(super) fn count_full_read(&mut self) {
        self.stats.full_reads += 1;
    }

    pub(super) fn count_fd_scan(&mut self) {
        self.stats.fd_scans += 1;
    }

    pub(super) fn count_fd_check(&mut self) {
        self.stats.fd_checks += 1;
    }

    pub(super) fn count_env_read(&mut self) {
        self.stats.env_reads += 1;
    }

    pub(super) fn count_versions_read(&mut self) {
        self.stats.versions_reads += 1;
    }

    /// What this pass can take of `e` without reading its `stat` line: a known unrelated
    /// process or kernel thread in the same directory, out of its turn. None: read it.
    pub(super) fn unchanged(&mut self, e: PidEntry) -> Option<&Entry> {
        if self.uncached || self.socket_holders.contains(&e.pid) {
            return None;
        }
        let len = self.rotation.max(STAT_ROTATION);
        let turn = u64::from(e.pid.unsigned_abs()) % len == self.passes % len;
        let entry = self.entries.get(&e.pid)?;
        if !entry.unrelated() || entry.ino != e.ino || (turn && !entry.kernel) {
            return None;
        }
        self.stats.stat_skips += 1;
        Some(entry)
    }

    /// This pass's rotation length (see [`rotation_len`]).
    pub fn rotation(&self) -> u64 {
        self.rotation.max(STAT_ROTATION)
    }

    /// The entry of `pid` if it is still the same incarnation; a stale one is dropped.
    pub(super) fn known(&mut self, pid: i32, id: &Identity) -> Option<&mut Entry> {
        let same = self.entries.get(&pid).is_some_and(|e| e.id == *id);
        if !same {
            self.entries.remove(&pid);
            return None;
        }
        self.entries.get_mut(&pid)
    }

    /// The entry of `pid`, whatever its identity (only after this pass's [`Self::known`]).
    pub(super) fn get_mut(&mut self, pid: i32) -> Option<&mut Entry> {
        self.entries.get_mut(&pid)
    }

    /// Remembers a new incarnation (unless the cache is full).
    pub(super) fn insert(&mut self, pid: i32, entry: Entry) {
        if self.entries.len() >= MAX_ENTRIES {
            return;
        }
        self.entries.insert(pid, entry);
    }

    /// Starts a pass: drops the entries of processes not listed (`alive` sorted by pid) and
    /// moves the rotation on. Uncached: forgets everything (entries then only live for one
    /// pass).
    pub(super) fn start_pass(&mut self, alive: &[PidEntry]) {
        self.passes += 1;
        let listed = |pid: &i32| alive.binary_search_by_key(pid, |e| e.pid).is_ok();
        if self.uncached {
            self.entries.clear();
            self.socket_holders.clear();
            self.given_up.clear();
            return;
        }
        self.entries.retain(|pid, _| listed(pid));
        self.socket_holders.retain(|pid| listed(pid));
        let rotating = self
            .entries
            .values()
            .filter(|e| e.unrelated() && !e.kernel)
            .count();
        self.rotation = rotation_len(rotating);
    }

    pub(super) fn socket_holders(&self) -> Vec<i32> {
        self.socket_holders.iter().copied().collect()
    }

    pub(super) fn remember_socket_holders(&mut self, pids: impl Iterator<Item = i32>) {
        for pid in pids {
            if self.socket_holders.len() >= MAX_ENTRIES {
                return;
            }
            self.socket_holders.insert(pid);
        }
    }

    pub(super) fn give_up_sockets(&mut self, inodes: &[u64]) {
        for &i in inodes {
            if self.given_up.len() >= MAX_ENTRIES {
                return;
            }
            self.given_up.insert(i);
        }
    }

    pub(super) fn given_up_socket(&self, inode: u64) -> bool {
        self.given_up.contains(&inode)
    }

    /// Keeps the given-up sockets still towards a known component (`wanted`: this pass's).
    pub(super) fn retain_given_up(&mut self, wanted: &BTreeSet<u64>) {
        self.given_up.retain(|i| wanted.contains(i));
    }
}
