//! What discovery remembers between passes: per process incarnation, keyed by (pid, start
//! time), the command line once it was read, its network namespace, its socket fds, and for
//! components' processes a few environment variables and the installed versions (`memo.rs`).
//!
//! A pass lists `/proc` (one getdents: pids and their directories' inode numbers) and reads
//! the `stat` line (pid reuse, ppid, comm, the exec mark) of
//! - every pid it does not know, and every pid whose directory's inode number changed (a new
//!   process at a reused pid gets a new directory on the kernel's procfs);
//! - every known process that matters: a candidate of the pre-filter, a process read in full
//!   (a launcher, a component's child, a proxy, a `--pid` target), a socket holder;
//! - a rotating slice of the other known processes, the unrelated ones: those whose pid is
//!   the pass number modulo the rotation's length, so each is read once a rotation. The
//!   length is [`STAT_ROTATION`] passes (a minute at the daemon's 10 s rediscovery) on a host
//!   of up to [`ROTATION_BUDGET`] x 6 unrelated processes, and doubles as they grow so that a
//!   pass reads at most [`ROTATION_BUDGET`] of them, up to [`MAX_ROTATION`] passes (see
//!   [`rotation_len`]): the cost of a pass stays flat, the backstop below gets slower.
//!   Kernel threads are not in the rotation: a kernel thread never exec's a program;
//!
//! and nothing else of a process it already knows: a known process, candidate or not, is
//! never read in full again. An entry is dropped and its process read afresh when
//! - the pid's start time differs (the pid was reused);
//! - its comm differs (an exec of another program, or setproctitle, which on Linux also sets
//!   comm: a forked scheduler that sets its title after we first read it);
//! - its exec mark differs: `stat`'s start_code and start_stack, which an exec moves (address
//!   space randomization), so `python` exec'ing `python -m sglang.launch_server` is seen even
//!   though comm stays `python3`.
//!
//! An unrelated process that exec's a stack's program (same pid, same directory) is seen when
//! its turn in the rotation comes, within a rotation's length, or on the next pass when
//! a new candidate descends from it (an engine forks its schedulers at once); a new process
//! (a new pid, or a new directory at a reused one) and a known one's death (its pid gone from
//! the listing) on the very next pass. The parent of an unrelated process is as its last
//! `stat` read showed (a re-parented orphan is seen at its turn). Kernel threads are
//! remembered too, so that they are not read every pass either.
//!
//! What is not seen: a process rewriting its argv in place without changing comm (not what
//! setproctitle does on Linux), and an exec that keeps comm while the kernel hides the exec
//! mark (another user's process, read without root: the kernel shows 1/1/0), or with address
//! space randomization off. Such a process is read again when it restarts.
//!
//! For the proxy search (`holders.rs`) it also keeps which processes held client sockets
//! towards known components, and which such sockets no readable process held (given up on
//! while they stay).
//!
//! Bounded: entries of pids absent from a pass are dropped, and at most [`MAX_ENTRIES`] are
//! kept (beyond it, processes are simply read every pass, as without a cache); given-up
//! sockets are only those still towards a known component.

use super::memo::{EnvMemo, VersionsMemo};
use super::profiles::CompiledSet;
use crate::probes::Profile;
use crate::sys::{Comm, PidEntry};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

/// Most processes remembered (a few hundred bytes each; far above a real host's count).
pub const MAX_ENTRIES: usize = 65_536;

/// A known unrelated process's `stat` line is read every this many passes on a host of up
/// to 6 x [`ROTATION_BUDGET`] of them (see the module doc): the longest an exec of one into a
/// stack's program goes unseen, in passes.
pub const STAT_ROTATION: u64 = 6;

/// Most `stat` lines of known unrelated processes a pass reads while the rotation can still
/// grow: ~1 ms of a pass (a `stat` read is ~10 us). Profiled with 2,000 extra processes, the
/// rotation's reads were half of a cached pass; the rest is the listing, one entry each.
pub const ROTATION_BUDGET: u64 = 100;

/// The longest rotation, in passes (8 minutes at the daemon's 10 s rediscovery): beyond
/// [`ROTATION_BUDGET`] x this many unrelated processes a pass reads more of them instead.
pub const MAX_ROTATION: u64 = 48;

/// The rotation's length for `unrelated` known unrelated processes: [`STAT_ROTATION`]
/// doubled until a pass's slice fits [`ROTATION_BUDGET`], at most [`MAX_ROTATION`]. Each
/// length divides the next (turns are `pid % len == pass % len`), so a change of length never
/// puts a process's next turn further than the longer length away.
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
    /// Bench/peer mode: every process is a candidate and nothing is kept between passes
    /// (what discovery did before the cache).
    uncached: bool,
}

impl DiscoveryCache {
    pub fn new() -> DiscoveryCache {
        DiscoveryCache::default()
    }

    /// No pre-filter and no memory: every pass reads every process in full (a peer for
    /// benchmarks).
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

    /// What this pass can take of `e` without reading its `stat` line: the entry of a known
    /// unrelated process (see the module doc) whose directory is the same and whose turn in
    /// the rotation it is not, or of a known kernel thread in the same directory. None: read
    /// it.
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
