//! Socket tables -> connections and their exchanges (`exchange.rs` cuts the byte deltas),
//! hop links (`links.rs`), and per-component socket counts.
//!
//! The topology's answers come from a [`Lookup`] built once per table.

use super::exchange::{Conn, ConnKey, Obs};
use super::lookup::Lookup;
use super::FastMap;
use super::{links, Correlator, CountPoint};
use crate::clock::Millis;
use crate::model::addr::port_of;
use crate::model::{Component, SocketEntry, SocketTable, Status, TcpState};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

/// Most servers whose probe sizes are kept ([`super::probe_units`]).
const MAX_PROBE_SERVERS: usize = 1024;

/// Whether a socket is the stack's: owned by a component's process, or at an address a
/// component listens on, in its namespace.
fn is_ours(e: &SocketEntry, lookup: &Lookup) -> bool {
    let at = |addr: &str| {
        port_of(addr)
            .and_then(|p| lookup.listening_in(e.netns, p))
            .is_some_and(|c| lookup.listens_at(c, addr))
    };
    e.pid.is_some_and(|p| lookup.of_pid(p).is_some()) || at(&e.local) || at(&e.remote)
}

/// `kept` (of a table of `all` sockets) with a note of how many were left out.
fn with_omitted_note(mut kept: SocketTable, all: usize) -> SocketTable {
    let omitted = all - kept.sockets.len();
    if omitted > 0 {
        kept.notes.push(foreign_omitted_note(omitted));
    }
    kept
}

/// The note a kept table carries for the sockets it left out, so omissions are said.
fn foreign_omitted_note(omitted: usize) -> String {
    format!(
        "{omitted} sockets not of the stack omitted (neither owned by a component's process \
         nor at a component's listen address in its namespace)"
    )
}

/// Client pid of each connection by (netns, local, remote) of the client's socket.
pub(super) type ClientPids<'a> = FastMap<(Option<u64>, &'a str, &'a str), i32>;

/// The owner of each socket of `table` that has one, by (netns, local, remote).
pub(super) fn client_pids(table: &SocketTable) -> ClientPids<'_> {
    let mut pids: ClientPids =
        FastMap::with_capacity_and_hasher(table.sockets.len(), Default::default());
    for e in &table.sockets {
        if let Some(pid) = e.pid {
            pids.insert((e.netns, e.local.as_str(), e.remote.as_str()), pid);
        }
    }
    pids
}

/// Socket counts by TCP state, per component id, of the latest table.
pub(super) type SocketCounts = BTreeMap<String, BTreeMap<String, u32>>;

impl Correlator {
    /// A socket table, borrowed or handed over ([`Correlator::ingest_owned`]).
    pub(super) fn ingest_sockets(
        &mut self,
        t: Millis,
        table: Cow<'_, SocketTable>,
        status: Status,
    ) {
        let lookup = Lookup::new(&self.topology);
        self.track_table(t, &table, status, &lookup);
        self.latest_sockets = Some(self.stack_sockets(table, &lookup));
    }

    /// Connections, their exchanges and the components' socket counts from one table.
    fn track_table(&mut self, t: Millis, table: &SocketTable, status: Status, lookup: &Lookup) {
        // Client side of each connection, by (netns, local, remote): the outbound connection
        // of a proxy IS the router's inbound connection with the 4-tuple reversed.
        let client_pid = client_pids(table);
        self.tables += 1;
        // The key looked up for each socket, its buffers reused.
        let mut key = ConnKey::default();
        for e in &table.sockets {
            self.track_server_socket(t, e, &client_pid, lookup, &mut key);
        }
        self.forget_gone_kv_ports();
        let dumped: BTreeSet<Option<u64>> = table.sockets.iter().map(|e| e.netns).collect();
        self.retire_closed(t, &dumped, status);
        links::link(self, t);
        self.push_socket_counts(t, table, lookup);
    }

    /// The table's sockets that belong to the stack (`is_ours`), even from a
    /// source that kept every socket; all of them without a topology. An owned table is
    /// filtered in place.
    fn stack_sockets(&self, table: Cow<'_, SocketTable>, lookup: &Lookup) -> SocketTable {
        if self.topology.components.is_empty() {
            return table.into_owned();
        }
        match table {
            Cow::Borrowed(t) => {
                let kept = SocketTable {
                    sockets: t
                        .sockets
                        .iter()
                        .filter(|e| is_ours(e, lookup))
                        .cloned()
                        .collect(),
                    notes: t.notes.clone(),
                };
                with_omitted_note(kept, t.sockets.len())
            }
            Cow::Owned(mut t) => {
                let all = t.sockets.len();
                t.sockets.retain(|e| is_ours(e, lookup));
                with_omitted_note(t, all)
            }
        }
    }

    /// Feeds one socket to its connection when it is the server side of a hop, and marks
    /// the connection as in this table. `key` is a scratch key.
    fn track_server_socket(
        &mut self,
        t: Millis,
        e: &SocketEntry,
        client_pid: &ClientPids,
        lookup: &Lookup,
        key: &mut ConnKey,
    ) -> Option<()> {
        let si = self.server_side(e, lookup)?;
        // A channel's connections (a KV stream, a bootstrap session) are no requests.
        if let Some(kind) = lookup.channel_at(si, e.local_port()?) {
            self.note_kv_stream(t, e, si, kind, client_pid, lookup);
            return None;
        }
        let server = self.topology.components.get(si)?;
        let cpid = client_pid
            .get(&(e.netns, e.remote.as_str(), e.local.as_str()))
            .copied();
        if cpid.is_some_and(|p| self.ignore_client_pids.contains(&p)) {
            return None;
        }
        let obs = Obs::from_entry(t, e)?;
        key.refill(e);
        let client_component = cpid
            .and_then(|p| lookup.of_pid(p))
            .and_then(|i| self.topology.components.get(i));
        if !self.probe_units.contains_key(server.id.as_str()) {
            // Bounded by the components a topology names; a host that churns them starts over.
            if self.probe_units.len() >= MAX_PROBE_SERVERS {
                self.probe_units.clear();
            }
            self.probe_units
                .insert(server.id.clone(), Default::default());
        }
        let known = self.probe_units.get_mut(server.id.as_str())?;
        let tables = self.tables;
        let next_x = &mut self.next_x;
        let mut idgen = || {
            *next_x += 1;
            *next_x
        };
        match self.conns.get_mut(key) {
            Some(conn) => {
                if let (None, Some(c)) = (&conn.client_component, client_component) {
                    conn.client_component = Some(c.id.clone());
                    for x in conn.exchanges.iter_mut() {
                        Arc::make_mut(x).client_component = Some(c.id.clone());
                    }
                }
                conn.client_pid = conn.client_pid.or(cpid);
                conn.in_table = tables;
                conn.observe(&obs, &mut idgen, known);
            }
            None => {
                self.next_conn += 1;
                let mut conn = Conn {
                    id: self.next_conn,
                    key: key.clone(),
                    component: server.id.clone(),
                    role: server.role,
                    client_pid: cpid,
                    client_component: client_component.map(|c| c.id.clone()),
                    first_seen_ms: t,
                    last_seen_ms: t,
                    closed_ms: None,
                    tcp_state: e.state,
                    in_total: 0,
                    out_total: 0,
                    last_in_ms: None,
                    last_out_ms: None,
                    in_table: tables,
                    exchanges: VecDeque::new(),
                };
                conn.first_observation(&obs, &mut idgen);
                conn.note_repeated_probe(known);
                self.conns.insert(key.clone(), conn);
            }
        }
        Some(())
    }

    /// The component whose server side `e` is: a socket with counters on a component's listen
    /// port in its namespace, owned by that component (or, without an owner, at one of its
    /// listen addresses).
    pub(super) fn server_side(&self, e: &SocketEntry, lookup: &Lookup) -> Option<usize> {
        // A listener carries no exchange; a socket without tcp_info has no counters.
        if e.state == TcpState::Listen || e.tcp_info.is_none() {
            return None;
        }
        // By namespace too: two pods listening on one port are two servers.
        let si = lookup.listening_in(e.netns, e.local_port()?)?;
        let server = self.topology.components.get(si)?;
        // A socket on the listen port owned by another component's pid is that other
        // component's outbound connection, not this server's inbound one.
        if let (Some(pid), false) = (e.pid, server.pids.is_empty()) {
            if !server.pids.contains(&pid) {
                return None;
            }
        }
        // Without an owner, only one at an address the component listens on, not one that
        // merely shares the port number.
        if e.pid.is_none() && !lookup.listens_at(si, &e.local) {
            return None;
        }
        Some(si)
    }

    /// Moves closed connections out of the open set. A complete table proves a connection
    /// not in it closed; a degraded one only for the namespaces it holds sockets of.
    fn retire_closed(&mut self, t: Millis, dumped: &BTreeSet<Option<u64>>, status: Status) {
        let proven = |k: &ConnKey| status == Status::Ok || dumped.contains(&k.netns);
        let present = |c: &Conn| c.in_table == self.tables;
        let gone: Vec<ConnKey> = self
            .conns
            .iter()
            .filter(|(k, c)| !present(c) && proven(k))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            if let Some(mut c) = self.conns.remove(&k) {
                c.close(t);
                self.closed.push_back(c);
            }
        }
        let closed_now: Vec<ConnKey> = self
            .conns
            .iter()
            .filter(|(_, c)| c.closed_ms.is_some() && !present(c))
            .map(|(k, _)| k.clone())
            .collect();
        for k in closed_now {
            if let Some(c) = self.conns.remove(&k) {
                self.closed.push_back(c);
            }
        }
    }

    /// ESTABLISHED and CLOSE_WAIT counts of every component at `t`, for
    /// `accumulating_state`; and every state's count of each component's own sockets, for
    /// [`Correlator::socket_counts`].
    fn push_socket_counts(&mut self, t: Millis, table: &SocketTable, lookup: &Lookup) {
        let mut per_comp: FastMap<usize, BTreeMap<TcpState, u32>> = FastMap::default();
        for e in &table.sockets {
            if let Some(c) = e.pid.and_then(|pid| lookup.of_pid(pid)) {
                *per_comp.entry(c).or_default().entry(e.state).or_default() += 1;
            }
        }
        let mut latest = SocketCounts::new();
        for (i, c) in self.topology.components.iter().enumerate() {
            let counts = per_comp.get(&i);
            let count = |s: TcpState| Some(counts.and_then(|m| m.get(&s)).copied().unwrap_or(0));
            let pt = CountPoint {
                t_ms: t,
                established: count(TcpState::Established),
                close_wait: count(TcpState::CloseWait),
                fds: None,
                threads: None,
            };
            self.counts.entry(c.id.clone()).or_default().push_back(pt);
            if let Some(m) = counts {
                let by_state = latest.entry(c.id.clone()).or_default();
                for (s, n) in m {
                    *by_state.entry(s.as_str().to_string()).or_default() += n;
                }
            }
        }
        self.latest_socket_counts = latest;
    }

    /// Socket counts by TCP state of a component's own sockets in the latest table (taken
    /// when the table was ingested, and again when the topology changes).
    pub(super) fn socket_counts(&self, c: &Component) -> BTreeMap<String, u32> {
        self.latest_socket_counts
            .get(&c.id)
            .cloned()
            .unwrap_or_default()
    }

    /// The components' socket counts of the latest table again, under a new topology.
    pub(super) fn recount_sockets(&mut self) {
        let lookup = Lookup::new(&self.topology);
        let mut latest = SocketCounts::new();
        if let Some(t) = &self.latest_sockets {
            for e in &t.sockets {
                let Some(c) = e.pid.and_then(|p| lookup.of_pid(p)) else {
                    continue;
                };
                if let Some(c) = self.topology.components.get(c) {
                    *latest
                        .entry(c.id.clone())
                        .or_default()
                        .entry(e.state.as_str().to_string())
                        .or_default() += 1;
                }
            }
        }
        self.latest_socket_counts = latest;
    }
}
