//! Which processes hold the client sockets towards known components (the proxy search), at a
//! cost that does not grow with unrelated processes. Cheapest first: sockets known processes
//! hold; past holders (remembered in the [`DiscoveryCache`]) while their fd count is
//! unchanged; only sockets still missing, still open and not given up on make every other
//! process be looked at. What no readable process holds is given up on while it stays.

use super::table::ProcTable;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Proxies found per round: proxy pid -> (target component id -> connection count).
pub(super) type Holders = BTreeMap<i32, BTreeMap<String, u32>>;

/// One search: the wanted sockets (inode -> the component they point at) and what is known.
pub(super) struct Search<'a> {
    pub table: &'a ProcTable,
    pub wanted: &'a BTreeMap<u64, String>,
    /// Component pids, their ancestors and excluded pids: not proxies.
    pub known_pids: &'a BTreeSet<i32>,
    /// Our own process (the excluded pids): its sockets are read afresh every pass. It
    /// scrapes the components, so a new connection of ours at an unchanged fd count is
    /// the rule, and a remembered list would send the search to every process for it.
    pub own_pids: &'a [i32],
}

/// Sockets of each looked-at process, the inodes seen so far, and wanted ones closed since
/// the table that listed them.
#[derive(Default)]
struct Looked {
    held: BTreeMap<i32, Arc<Vec<u64>>>,
    seen: BTreeSet<u64>,
    closed: BTreeSet<u64>,
}

impl Looked {
    fn add(&mut self, pid: i32, sockets: Arc<Vec<u64>>) {
        self.seen.extend(sockets.iter());
        self.held.insert(pid, sockets);
    }
}

impl Search<'_> {
    /// The unknown processes holding wanted sockets, and how many towards each component.
    pub fn run(&self) -> Holders {
        let mut known_seen: BTreeSet<u64> = BTreeSet::new();
        for &pid in self.known_pids.iter().filter(|p| self.alive(**p)) {
            let fresh = self.own_pids.contains(&pid);
            known_seen.extend(self.table.socket_inodes_memo(pid, fresh).iter());
        }
        let mut looked = Looked::default();
        if self.missing(&known_seen, &looked).next().is_some() {
            for pid in self.table.socket_holders() {
                if self.unknown(pid) {
                    looked.add(pid, self.table.socket_inodes_memo(pid, false));
                }
            }
        }
        let missing: Vec<u64> = self.missing(&known_seen, &looked).collect();
        if !missing.is_empty() {
            let open = self.table.open_now(&missing);
            looked
                .closed
                .extend(missing.iter().filter(|i| !open.contains(i)));
        }
        let missing = self.missing(&known_seen, &looked).count();
        if missing > 0 {
            tracing::debug!(
                missing,
                wanted = self.wanted.len(),
                processes = self.table.procs.len(),
                "proxy search: open sockets no known process holds; looking at every process"
            );
            self.search_everyone(&mut looked, &known_seen);
        }
        let given_up: Vec<u64> = self.missing(&known_seen, &looked).collect();
        self.table.give_up_sockets(&given_up);
        self.holders(looked)
    }

    fn alive(&self, pid: i32) -> bool {
        self.table.procs.contains_key(&pid)
    }

    fn unknown(&self, pid: i32) -> bool {
        self.alive(pid) && !self.known_pids.contains(&pid)
    }

    /// Wanted sockets not seen yet, not closed since, and not given up on in an earlier
    /// pass.
    fn missing<'s>(
        &'s self,
        known_seen: &'s BTreeSet<u64>,
        looked: &'s Looked,
    ) -> impl Iterator<Item = u64> + 's {
        self.wanted
            .keys()
            .copied()
            .filter(|i| !known_seen.contains(i) && !looked.seen.contains(i))
            .filter(|i| !looked.closed.contains(i))
            .filter(|i| !self.table.given_up_socket(*i))
    }

    /// The last resort of the module doc: every other process, remembered sockets then afresh.
    fn search_everyone(&self, looked: &mut Looked, known_seen: &BTreeSet<u64>) {
        let pids: Vec<i32> = self.table.procs.keys().copied().collect();
        for pid in pids {
            if self.unknown(pid) && !looked.held.contains_key(&pid) {
                looked.add(pid, self.table.socket_inodes_memo(pid, false));
            }
        }
        if self.missing(known_seen, looked).next().is_none() {
            return;
        }
        let with_sockets: Vec<i32> = looked
            .held
            .iter()
            .filter(|(_, s)| !s.is_empty())
            .map(|(p, _)| *p)
            .collect();
        for pid in with_sockets {
            looked.add(pid, self.table.socket_inodes_memo(pid, true));
        }
    }

    /// Counts per holder and target; remembers the holders for the next pass.
    fn holders(&self, looked: Looked) -> Holders {
        let mut found = Holders::new();
        for (pid, sockets) in looked.held {
            for i in sockets.iter() {
                if let Some(t) = self.wanted.get(i) {
                    *found.entry(pid).or_default().entry(t.clone()).or_insert(0) += 1;
                }
            }
        }
        self.table.remember_socket_holders(found.keys().copied());
        found
    }
}
