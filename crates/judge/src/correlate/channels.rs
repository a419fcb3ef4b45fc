//! Channel flows: the latest socket table's connections to components' channels
//! (`model::channel`) summed per client engine, server engine and kind, so a KV transfer or
//! a bootstrap session is shown as itself, not as a request.
//!
//! An `internal` channel is a KV transfer once one of its connections from another engine
//! had that shape ([`is_kv_stream`]), and stays one while the port is listened on: a stream
//! that stops mid-transfer is still a KV stream.

use super::exchange::Obs;
use super::lookup::Lookup;
use super::sockets::{client_pids, ClientPids};
use super::Correlator;
use crate::clock::Millis;
use crate::model::{ChannelFlow, ChannelKind, KvSide, SocketEntry};
use std::collections::BTreeMap;

/// Fewest bytes a KV stream has carried into its receiver's port.
pub const KV_STREAM_MIN_BYTES: u64 = 4096;

/// A one-way stream with no answer at all is a KV stream only past this many bytes.
pub const KV_ONE_WAY_MIN_BYTES: u64 = 64 << 10;

/// What a receiver answers at most, per byte it received (Mooncake TCP: 8 bytes of status
/// per slice; docs/lab.md).
pub const KV_MAX_ANSWER_RATIO: u64 = 8;

/// Bytes of a ZMQ socket's handshake (ZMTP greeting and READY): a PULL socket answers this
/// once and then never again, so a stream answered with no more is a message queue.
pub const ZMTP_HANDSHAKE_BYTES: u64 = 128;

/// Whether `bytes_in`/`bytes_out` (the server side of a channel's connection from another
/// engine) are a KV transfer stream: pages written one way, the receiver answering a few
/// bytes per write or nothing. `server`/`client` are the engines' sides when their flags say.
pub fn is_kv_stream(
    server: Option<KvSide>,
    client: Option<KvSide>,
    bytes_in: u64,
    bytes_out: u64,
) -> bool {
    if server.is_some_and(|s| !s.receives()) || client.is_some_and(|c| !c.sends()) {
        return false;
    }
    let answered = bytes_out > ZMTP_HANDSHAKE_BYTES
        && bytes_in >= KV_STREAM_MIN_BYTES
        && bytes_in >= KV_MAX_ANSWER_RATIO * bytes_out;
    answered || (bytes_out == 0 && bytes_in >= KV_ONE_WAY_MIN_BYTES)
}

/// One channel connection of the latest table: its server and client (component indices),
/// the listen port, its kind, and its counters.
struct ChannelConn {
    server: usize,
    client: Option<usize>,
    kind: ChannelKind,
    obs: Obs,
}

impl Correlator {
    /// The flows of the latest socket table, per client engine, server engine and kind; idle
    /// times counted to `now`.
    pub(super) fn channel_flows(&self, now: Millis) -> Vec<ChannelFlow> {
        let topo = &self.topology;
        let id = |i: usize| topo.components.get(i).map(|c| topo.top_level(&c.id));
        let mut flows: BTreeMap<(Option<&str>, &str, ChannelKind), ChannelFlow> = BTreeMap::new();
        for c in self.channel_conns() {
            let Some(to) = id(c.server) else {
                continue;
            };
            let from = c.client.and_then(id);
            let flow = flows
                .entry((from, to, c.kind))
                .or_insert_with(|| ChannelFlow {
                    from: from.map(str::to_string),
                    to: to.to_string(),
                    kind: c.kind,
                    connections: 0,
                    bytes_in: 0,
                    bytes_out: 0,
                    idle_ms: None,
                });
            add(flow, &c.obs, now);
        }
        flows.into_values().collect()
    }

    /// The latest table's connections to channels, server side; an `internal` port seen
    /// carrying KV streams is a KV transfer.
    fn channel_conns(&self) -> Vec<ChannelConn> {
        let (Some(table), Some(t)) = (&self.latest_sockets, self.last_sockets_ms) else {
            return Vec::new();
        };
        let lookup = Lookup::new(&self.topology);
        let clients = client_pids(table);
        let one = |e: &SocketEntry| {
            let server = self.server_side(e, &lookup)?;
            let port = e.local_port()?;
            let mut kind = lookup.channel_at(server, port)?;
            let comp = self.topology.components.get(server)?;
            if kind == ChannelKind::Internal && self.kv_ports.contains(&(comp.id.clone(), port)) {
                kind = ChannelKind::KvTransfer;
            }
            let client = clients
                .get(&(e.netns, e.remote.as_str(), e.local.as_str()))
                .and_then(|p| lookup.of_pid(*p));
            Some(ChannelConn {
                server,
                client,
                kind,
                obs: Obs::from_entry(t, e)?,
            })
        };
        table.sockets.iter().filter_map(one).collect()
    }

    /// Remembers the port of `e` (server side of a connection to component `si`'s `internal`
    /// channel) when the connection is a KV stream from another engine.
    pub(super) fn note_kv_stream(
        &mut self,
        t: Millis,
        e: &SocketEntry,
        si: usize,
        kind: ChannelKind,
        clients: &ClientPids,
        lookup: &Lookup,
    ) {
        let (Some(port), Some(obs)) = (e.local_port(), Obs::from_entry(t, e)) else {
            return;
        };
        if kind != ChannelKind::Internal {
            return;
        }
        let topo = &self.topology;
        let engine = |i: usize| {
            let c = topo.components.get(i)?;
            topo.component(topo.top_level(&c.id))
        };
        let Some(s) = engine(si).filter(|s| s.role.is_engine()) else {
            return;
        };
        let client = clients
            .get(&(e.netns, e.remote.as_str(), e.local.as_str()))
            .and_then(|p| lookup.of_pid(*p));
        let kv = match client.and_then(engine) {
            Some(c) => {
                s.id != c.id
                    && c.role.is_engine()
                    && is_kv_stream(s.kv_side(), c.kv_side(), obs.bytes_in, obs.bytes_out)
            }
            // A client on another node: only into an engine that receives KV.
            None => {
                s.kv_side().is_some_and(KvSide::receives)
                    && is_kv_stream(s.kv_side(), None, obs.bytes_in, obs.bytes_out)
            }
        };
        if kv {
            if let Some(c) = topo.components.get(si) {
                self.kv_ports.insert((c.id.clone(), port));
            }
        }
    }

    /// Forgets the KV ports no component lists as a channel any more.
    pub(super) fn forget_gone_kv_ports(&mut self) {
        if self.kv_ports.is_empty() {
            return;
        }
        let topo = &self.topology;
        self.kv_ports.retain(|(id, port)| {
            topo.component(id).is_some_and(|c| {
                c.channels
                    .iter()
                    .any(|ch| crate::model::addr::port_of(&ch.addr) == Some(*port))
            })
        });
    }
}

/// One connection into its flow: a connection more, its bytes, and the flow's silence the
/// shortest of its connections'.
fn add(flow: &mut ChannelFlow, obs: &Obs, now: Millis) {
    flow.connections += 1;
    flow.bytes_in = flow.bytes_in.saturating_add(obs.bytes_in);
    flow.bytes_out = flow.bytes_out.saturating_add(obs.bytes_out);
    let last = obs.last_in_at.max(obs.last_out_at);
    let idle = last.map(|l| (now - l).max(0) as u64);
    flow.idle_ms = match (flow.idle_ms, idle) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Server-side counters of the real 0.5.23 pair (`tests/fixtures/sglang-real/`).
    #[test]
    fn the_real_pairs_connections_by_shape() {
        let (rx, tx) = (Some(KvSide::Receiver), Some(KvSide::Sender));
        // Mooncake TCP into decode rank 0, one of its 4 pooled connections: at the start
        // and end of the recording.
        assert!(is_kv_stream(rx, tx, 16_600, 904));
        assert!(is_kv_stream(rx, tx, 86_592, 4_352));
        // One request's worth over a rank's 4 connections.
        assert!(is_kv_stream(rx, tx, 12_800, 656));
        // ZMQ PULL on prefill (decode pushes TransferInfos): 92 bytes of handshake back.
        assert!(!is_kv_stream(tx, rx, 2_881, 92));
        assert!(!is_kv_stream(None, None, 1 << 20, 92));
        // The same stream in the wrong direction for the engines' sides.
        assert!(!is_kv_stream(tx, rx, 86_592, 4_352));
        // An HTTP exchange (the bootstrap route: 221 in, 203 out) and gloo (both ways).
        assert!(!is_kv_stream(None, None, 221, 203));
        assert!(!is_kv_stream(None, None, 7_100_000, 14_300_000));
        // One way, no answer at all: only in bulk.
        assert!(is_kv_stream(None, None, 1 << 20, 0));
        assert!(!is_kv_stream(None, None, 2_000, 0));
    }
}
