//! Channel flows: the latest socket table's connections to components' channels
//! (`model::channel`) summed per client, server and kind: bytes each way and silence. What a
//! KV transfer or a bootstrap session is, shown as itself instead of as a request.

use super::exchange::Obs;
use super::lookup::Lookup;
use super::sockets::client_pids;
use super::Correlator;
use crate::clock::Millis;
use crate::model::{ChannelFlow, ChannelKind};
use std::collections::BTreeMap;

impl Correlator {
    /// The flows of the latest socket table, idle times counted to `now`.
    pub(super) fn channel_flows(&self, now: Millis) -> Vec<ChannelFlow> {
        let (Some(table), Some(t)) = (&self.latest_sockets, self.last_sockets_ms) else {
            return Vec::new();
        };
        let lookup = Lookup::new(&self.topology);
        let clients = client_pids(table);
        let mut flows: BTreeMap<(Option<&str>, usize, ChannelKind), ChannelFlow> = BTreeMap::new();
        for e in &table.sockets {
            let Some(si) = self.server_side(e, &lookup) else {
                continue;
            };
            let (Some(kind), Some(obs)) = (
                e.local_port().and_then(|p| lookup.channel_at(si, p)),
                Obs::from_entry(t, e),
            ) else {
                continue;
            };
            let from = clients
                .get(&(e.netns, e.remote.as_str(), e.local.as_str()))
                .and_then(|p| lookup.of_pid(*p))
                .and_then(|i| self.topology.components.get(i))
                .map(|c| c.id.as_str());
            let Some(server) = self.topology.components.get(si) else {
                continue;
            };
            let flow = flows
                .entry((from, si, kind))
                .or_insert_with(|| ChannelFlow {
                    from: from.map(str::to_string),
                    to: server.id.clone(),
                    kind,
                    connections: 0,
                    bytes_in: 0,
                    bytes_out: 0,
                    idle_ms: None,
                });
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
        flows.into_values().collect()
    }
}
