//! What a merged snapshot (`wedgewatch merge`, `wedgewatch fleet snapshot`) says about its
//! nodes: who they are, how their clocks compare, which hops were joined across them, and
//! which nodes could not be read. The additive `fleet` field of `wedgewatch.snapshot/1`.

use super::node::NodeIdentity;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetInfo {
    /// Every node merged, in input order.
    pub nodes: Vec<FleetNode>,
    /// Hops joined across nodes (a client socket on one node, the server's on another).
    #[serde(default)]
    pub links: Vec<CrossLink>,
    /// Nodes that could not be read, each with its reason (`fleet snapshot`).
    #[serde(default)]
    pub failed: Vec<FailedNode>,
    /// What the merge could not see through (outbound connections to addresses no merged
    /// node serves: a VIP, a NAT, a node not in the merge).
    #[serde(default)]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetNode {
    /// The namespace of its components (`nodeb/decode@30001`).
    pub name: String,
    /// Where its snapshot came from (a file, a bundle, `fleet` for a transport).
    pub source: String,
    pub taken_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<NodeIdentity>,
    /// This node's clock minus the reference node's (the first), in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew_ms: Option<i64>,
    /// How well the skew is known (± ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew_error_ms: Option<i64>,
    /// How the skew was estimated, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew_basis: Option<String>,
}

/// One hop joined across nodes by the TCP 4-tuple.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossLink {
    /// The client component (namespaced) and its socket as its node sees it.
    pub client_component: String,
    pub client: String,
    /// The server component (namespaced) and its socket as its node sees it.
    pub server_component: String,
    pub server: String,
    /// The server-side exchanges (namespaced ids) on this connection.
    pub exchanges: Vec<String>,
    /// The parent exchange on the client node, when one was found by timing and size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// 0..1: 1.0 for the exact 4-tuple match of the connection; lower for the parent
    /// exchange chosen by timing and size.
    pub confidence: f64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailedNode {
    pub name: String,
    pub reason: String,
}
