//! Discovery: /proc + probe profiles -> [`Topology`]. One pass matches top-level profiles (a
//! launcher ancestor yields to its descendant, unless both have the same command line: a fork
//! not titled yet), builds each component (role, arguments, listen addresses, metrics URL, GPU
//! hints), matches children among its descendants, then adds config edges, generic proxies
//! and the `--pid`/`--url` targets it missed. Ids are stable across restarts:
//! `role@listen-address`, children `name@parent-id`. The long version: docs/probes.md.

mod build;
mod cache;
mod edges;
mod endpoints;
mod holders;
mod kv_transfer;
mod memo;
mod prefilter;
mod profiles;
mod table;
mod targets;
#[cfg(test)]
mod tests;

pub use cache::{
    rotation_len, CacheStats, DiscoveryCache, MAX_ROTATION, ROTATION_BUDGET, STAT_ROTATION,
};
pub use endpoints::{loopback_get, scrape_addr};
pub use profiles::{flag_value, flag_values};
pub use table::ProcDeadlines;

use crate::error::{Error, Result};
use crate::model::addr::split_host_port;
use crate::model::{Component, Topology};
use crate::probes::ProbeSet;
use crate::sys::sock_diag::RecentDump;
use crate::sys::ProcFs;
use endpoints::hosts_equivalent;
use profiles::{Compiled, Match};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use table::{Proc, ProcTable};

// The component labels discovery writes live in the model layer (sources read them too).
pub use crate::model::topology::labels::*;

/// Backstop for one whole discovery (run on a detached thread by the binary's `attach`).
pub const DISCOVERY_DEADLINE: Duration = Duration::from_secs(5);

/// What to discover and where.
#[derive(Debug, Clone)]
pub struct DiscoverOptions {
    /// procfs root (`/proc`; a fixture tree in tests).
    pub proc_root: PathBuf,
    /// `--pid`: processes to include even if no profile matches.
    pub extra_pids: Vec<i32>,
    /// `--url`: endpoints to include even if no process was found for them.
    pub extra_urls: Vec<String>,
    /// `--within`: only these processes and their descendants are discovered (a pod's
    /// shim, a launcher, a unit's main process) and the `--pid` targets; empty: every
    /// process on the host.
    pub within: Vec<i32>,
    /// Ask components' HTTP endpoints (router `/workers`) when arguments did not survive.
    pub query_endpoints: bool,
    /// Hard timeout of each such request.
    pub http_timeout: Duration,
    /// Pids never to report (the tool itself).
    pub exclude_pids: Vec<i32>,
    /// `--router-key-env NAME` (see `sources::router_key`).
    pub router_key_env: Option<String>,
    /// The daemon's sockets source's latest dump of our own namespace: taken instead of a
    /// dump of discovery's own while it is young enough (see `sys::sock_diag::RecentDump`).
    pub recent_dump: Option<Arc<RecentDump>>,
    /// How long a pass waits on /proc.
    pub deadlines: ProcDeadlines,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        DiscoverOptions {
            proc_root: PathBuf::from(crate::sys::PROC_ROOT),
            extra_pids: Vec::new(),
            extra_urls: Vec::new(),
            within: Vec::new(),
            query_endpoints: true,
            http_timeout: Duration::from_millis(500),
            exclude_pids: vec![std::process::id() as i32],
            router_key_env: None,
            recent_dump: None,
            deadlines: ProcDeadlines::default(),
        }
    }
}

/// One discovery in progress: the process table, the compiled profiles, the topology so far.
struct Builder<'a> {
    table: ProcTable,
    /// The profiles compiled, kept by the cache across passes.
    compiled: Arc<Vec<Compiled>>,
    opts: &'a DiscoverOptions,
    topo: Topology,
    /// The environment variables a build reads (`memo.rs`): the profiles' GPU variables and
    /// what the versions reader looks at.
    env_names: Arc<Vec<String>>,
}

/// Builds the topology. Fails only when the procfs root cannot be listed at all.
/// A one-shot discovery: nothing is remembered (see [`discover_cached`]).
pub fn discover(probes: &ProbeSet, opts: &DiscoverOptions) -> Result<Topology> {
    discover_cached(probes, opts, &mut DiscoveryCache::new())
}

/// [`discover`] with what earlier passes read (the daemon's rediscovery): known processes
/// are not read again, unrelated ones only at their turn in a rotation ([`rotation_len`],
/// `cache.rs`). `cache` is updated for the next pass.
pub fn discover_cached(
    probes: &ProbeSet,
    opts: &DiscoverOptions,
    cache: &mut DiscoveryCache,
) -> Result<Topology> {
    let set = cache.compiled(&probes.profiles);
    let proc = ProcFs::new(&opts.proc_root);
    let mut table = ProcTable::read(&proc, std::mem::take(cache), &set.prefilter, opts.deadlines)?;
    table.recent_dump = opts.recent_dump.clone();
    if !opts.within.is_empty() {
        if !opts.within.iter().any(|p| table.procs.contains_key(p)) {
            // a scope whose roots all ended (a pod replaced): said, not an empty stack
            *cache = table.into_cache();
            return Err(Error::Other(format!(
                "--within: no process {} any more: nothing left to watch",
                pid_list(&opts.within)
            )));
        }
        // a `--pid` target is watched even outside the scope, with what it started
        table.keep_within(&[opts.within.as_slice(), opts.extra_pids.as_slice()].concat());
    }
    let env_names = env_names(probes);
    let mut b = Builder {
        table,
        compiled: Arc::clone(&set.compiled),
        opts,
        topo: Topology::default(),
        env_names,
    };
    b.top_level();
    b.children();
    b.config_edges();
    b.proxies();
    b.extra_pids();
    b.extra_urls();
    if !opts.within.is_empty() {
        mark_within(&mut b.topo, &opts.within);
    }
    b.topo.components.sort_by(|a, c| {
        (a.role.depth(), a.parent.is_some(), &a.id).cmp(&(
            c.role.depth(),
            c.parent.is_some(),
            &c.id,
        ))
    });
    *cache = b.table.into_cache();
    Ok(b.topo)
}

/// Writes the scope on every component (`LABEL_WITHIN`), so a snapshot says what it left out.
fn mark_within(topo: &mut Topology, within: &[i32]) {
    let roots = pid_list(within);
    for c in &mut topo.components {
        c.labels.insert(LABEL_WITHIN.into(), roots.clone());
    }
}

/// `pid 1, pid 2`.
fn pid_list(pids: &[i32]) -> String {
    let named: Vec<String> = pids.iter().map(|p| format!("pid {p}")).collect();
    named.join(", ")
}

/// The environment variables component builds read (see `Builder::env_names`).
fn env_names(probes: &ProbeSet) -> Arc<Vec<String>> {
    let mut names: BTreeSet<String> = crate::sources::versions::ENV_VARS
        .iter()
        .map(|s| s.to_string())
        .collect();
    names.extend(probes.profiles.iter().filter_map(|p| p.gpu_env.clone()));
    Arc::new(names.into_iter().collect())
}

impl<'a> Builder<'a> {
    fn excluded(&self, pid: i32) -> bool {
        self.opts.exclude_pids.contains(&pid)
    }

    /// Best top-level profile for a process (highest priority, then file order).
    fn best_top_level(&self, proc: &Proc) -> Option<(usize, Match)> {
        self.compiled
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_top_level())
            .filter_map(|(i, c)| c.matches(proc).map(|m| (i, m, c.p.priority, c.order)))
            .max_by(|a, b| a.2.cmp(&b.2).then(b.3.cmp(&a.3)))
            .map(|(i, m, _, _)| (i, m))
    }

    /// Every process matching a top-level profile, launchers dropped (see the module doc).
    fn top_level(&mut self) {
        let mut matched: BTreeMap<i32, (usize, Match)> = BTreeMap::new();
        for p in self.table.procs.values() {
            // not a candidate: no profile can match it (`prefilter.rs`)
            if self.excluded(p.pid) || !p.candidate {
                continue;
            }
            if let Some(m) = self.best_top_level(p) {
                matched.insert(p.pid, m);
            }
        }
        // launchers vs forks: see the module doc
        let mut dropped: BTreeSet<i32> = BTreeSet::new();
        for (&pid, &(ci, _)) in &matched {
            for anc in self.table.ancestors(pid) {
                if let Some(&(aci, _)) = matched.get(&anc) {
                    if aci != ci {
                        continue;
                    }
                    let same_cmdline = self.table.procs.get(&anc).map(|p| &p.cmdline)
                        == self.table.procs.get(&pid).map(|p| &p.cmdline);
                    if same_cmdline {
                        dropped.insert(pid);
                    } else {
                        dropped.insert(anc);
                    }
                }
            }
        }
        for (pid, (ci, m)) in matched {
            if dropped.contains(&pid) {
                continue;
            }
            let c = self.build_component(pid, ci, m, None);
            self.push_unique(c);
        }
    }

    fn push_unique(&mut self, mut c: Component) {
        if self.topo.components.iter().any(|o| o.id == c.id) {
            c.id = format!("{}#{}", c.id, c.main_pid.unwrap_or(0));
        }
        self.topo.components.push(c);
    }

    /// Nearest ancestor whose cmdline matches the profile's `match_cmdline`.
    fn launcher_of(&self, pid: i32, ci: usize) -> Option<i32> {
        let comp = &self.compiled[ci];
        self.table.ancestors(pid).into_iter().find(|&a| {
            let j = self.table.cmdline(a).join(" ");
            comp.cmdline.iter().any(|r| r.is_match(&j))
        })
    }

    /// Children (`parent = ...` profiles) among each component's descendants.
    fn children(&mut self) {
        let parents: Vec<Component> = self.topo.components.clone();
        let mut claimed: BTreeSet<i32> = parents.iter().flat_map(|c| c.pids.clone()).collect();
        for parent in &parents {
            let child_profiles: Vec<usize> = self
                .compiled
                .iter()
                .enumerate()
                .filter(|(_, c)| c.p.parent.as_deref() == Some(parent.profile.as_str()))
                .map(|(i, _)| i)
                .collect();
            if child_profiles.is_empty() {
                continue;
            }
            let Some(main) = parent.main_pid else {
                continue;
            };
            let mut kids = Vec::new();
            for d in self.table.descendants(main) {
                if claimed.contains(&d) || self.excluded(d) {
                    continue;
                }
                // read on demand: a child need not pass the pre-filter
                let Some(proc) = self.table.full(d) else {
                    continue;
                };
                let best = child_profiles
                    .iter()
                    .filter_map(|&ci| self.compiled[ci].matches(&proc).map(|m| (ci, m)))
                    .max_by_key(|(ci, _)| (self.compiled[*ci].p.priority, usize::MAX - *ci));
                if let Some((ci, m)) = best {
                    claimed.insert(d);
                    kids.push(self.build_component(d, ci, m, Some(parent)));
                }
            }
            let mut ids = Vec::new();
            for k in kids {
                let before = self.topo.components.len();
                self.push_unique(k);
                if self.topo.components.len() > before {
                    if let Some(last) = self.topo.components.last() {
                        ids.push(last.id.clone());
                    }
                }
            }
            if let Some(p) = self.topo.components.iter_mut().find(|c| c.id == parent.id) {
                p.children.extend(ids);
            }
        }
    }

    /// The component listening on (host, port) in our own network namespace, top-level first.
    fn component_at(&self, host: &str, port: u16) -> Option<String> {
        self.component_at_in(None, host, port)
    }

    /// [`Self::component_at`] in network namespace `netns` (None: ours): two pods can listen
    /// on one address.
    fn component_at_in(&self, netns: Option<u64>, host: &str, port: u16) -> Option<String> {
        self.topo
            .components
            .iter()
            .filter(|c| c.parent.is_none() && c.netns == netns)
            .find(|c| {
                c.listen.iter().any(|l| {
                    split_host_port(l).is_some_and(|(h, p)| p == port && hosts_equivalent(h, host))
                })
            })
            .map(|c| c.id.clone())
    }
}
