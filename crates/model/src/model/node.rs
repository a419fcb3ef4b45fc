//! Which machine a snapshot was taken on, and its clocks at that moment: what
//! `merge` namespaces components by and aligns nodes with. Additive fields of
//! `wedgewatch.snapshot/1` (`node`, `connections`, `fleet`): documents without them stay valid.

use serde::{Deserialize, Serialize};

/// The node a snapshot was taken on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    /// The name merge namespaces this node's components by: `WEDGEWATCH_NODE` when set
    /// (a DaemonSet sets it from `spec.nodeName`), else the hostname.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// `/etc/machine-id`; in a redacted snapshot an app-specific hash of it
    /// (`sha256:<32 hex>`), stable per machine but not the identifier itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    /// `/proc/sys/kernel/random/boot_id`: changes at every boot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// Non-loopback interface addresses of wedgewatch's network namespace (`10.77.0.2`,
    /// `fd00::2`), sorted.
    #[serde(default)]
    pub addresses: Vec<String>,
    /// The node's clocks read together when the snapshot was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<NodeClock>,
}

impl NodeIdentity {
    /// Whether two identities are of one node: one kernel boot of one machine seen from one
    /// set of addresses, or one declared name with the same machine-id (names alone may
    /// collide).
    pub fn same_node(&self, other: &NodeIdentity) -> bool {
        let known = |a: &Option<String>, b: &Option<String>| a.is_some() && a == b;
        known(&self.machine_id, &other.machine_id)
            && known(&self.boot_id, &other.boot_id)
            && self.addresses == other.addresses
            && self.name == other.name
    }
}

/// Wall and monotonic clocks of a node read back to back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeClock {
    /// Unix epoch milliseconds (`CLOCK_REALTIME`).
    pub wall_ms: i64,
    /// `CLOCK_MONOTONIC` in milliseconds (since boot, not counting suspend).
    pub monotonic_ms: i64,
}

/// The client side of a TCP connection a component opened to a server that is not on this
/// node (no local socket is its other end): what merge matches, by 4-tuple, with the
/// server's socket in another node's snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapConnection {
    /// The component owning the client socket.
    pub component: String,
    /// `ip:port` of the client socket, as this node sees it.
    pub local: String,
    /// `ip:port` of the server, as this node sees it (a VIP or a NAT address when there is one).
    pub remote: String,
    /// TCP state (`ESTABLISHED`, ...).
    pub state: String,
    /// Bytes sent and acknowledged (tcp_info), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_sent: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_received: Option<u64>,
    /// When the last byte was sent on it (tcp_info), in Unix epoch ms on this node's clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_send_at_ms: Option<i64>,
    /// When the last byte was received on it, likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_recv_at_ms: Option<i64>,
}
