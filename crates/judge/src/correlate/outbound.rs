//! Client sockets of components to servers that are not on this node: the latest socket
//! table's connections whose other end is no socket of this table. `merge` joins them, by
//! their 4-tuple, with the server's socket in another node's snapshot.

use super::Correlator;
use crate::clock::Millis;
use crate::model::{SnapConnection, SocketEntry, TcpState};
use std::collections::BTreeSet;

/// At most this many are kept (a router holds a few per engine; a runaway client more).
const MAX_CONNECTIONS: usize = 4096;

impl Correlator {
    /// The components' open client sockets to servers not on this node.
    pub(super) fn outbound_connections(&self) -> Vec<SnapConnection> {
        let (Some(table), Some(t)) = (&self.latest_sockets, self.last_sockets_ms) else {
            return Vec::new();
        };
        // Across namespaces too: a container's server on this node is no other node's.
        let ends: BTreeSet<(&str, &str)> = table
            .sockets
            .iter()
            .map(|e| (e.local.as_str(), e.remote.as_str()))
            .collect();
        let mut out: Vec<SnapConnection> = table
            .sockets
            .iter()
            .filter(|e| is_open(e.state))
            // the other end is here: a local hop, correlated already
            .filter(|e| !ends.contains(&(e.remote.as_str(), e.local.as_str())))
            .filter(|e| !is_loopback(&e.remote))
            .filter_map(|e| self.client_side(e, t))
            .take(MAX_CONNECTIONS)
            .collect();
        out.sort_by(|a, b| (&a.component, &a.local).cmp(&(&b.component, &b.local)));
        out
    }

    /// The socket as a component's client connection, unless it is a server's (on a
    /// listen port of a component in its namespace) or nobody's.
    fn client_side(&self, e: &SocketEntry, t: Millis) -> Option<SnapConnection> {
        let comp = self.topology.component_of_pid(e.pid?)?;
        let port = e.local_port()?;
        if self
            .topology
            .component_listening_in(e.netns, port)
            .is_some()
        {
            return None;
        }
        let ti = e.tcp_info.as_ref();
        Some(SnapConnection {
            component: comp.id.clone(),
            local: e.local.clone(),
            remote: e.remote.clone(),
            state: e.state.as_str().to_string(),
            bytes_sent: ti.map(|t| t.bytes_acked),
            bytes_received: ti.map(|t| t.bytes_received),
            last_send_at_ms: ti.map(|i| t - Millis::from(i.last_data_sent_ms)),
            last_recv_at_ms: ti.map(|i| t - Millis::from(i.last_data_recv_ms)),
        })
    }
}

/// A loopback peer is on this node whatever the table holds.
fn is_loopback(addr: &str) -> bool {
    crate::model::addr::parse_socket_addr(addr).is_some_and(|(ip, _)| ip.is_loopback())
}

fn is_open(s: TcpState) -> bool {
    !matches!(s, TcpState::Listen | TcpState::TimeWait | TcpState::Close)
}
