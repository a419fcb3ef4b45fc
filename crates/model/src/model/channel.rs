//! Channels: listen addresses of a component that carry no requests (a PD bootstrap server,
//! a KV transfer engine's port, a collective's rendezvous, internal RPC). Their connections are
//! not exchanges: a one-way KV stream or a kept-alive control session is not a request that got
//! no answer.

use serde::{Deserialize, Serialize};

/// What a channel is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChannelKind {
    /// The PD bootstrap server (`--disaggregation-bootstrap-port`): decode asks prefill where
    /// to fetch a request's KV cache.
    Bootstrap,
    /// A KV cache transfer engine's port (Mooncake, NIXL): pages written one way.
    KvTransfer,
    /// Any other port of an engine's processes (ZMQ, a collective's store, RPC).
    Internal,
}

impl ChannelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChannelKind::Bootstrap => "bootstrap",
            ChannelKind::KvTransfer => "kv_transfer",
            ChannelKind::Internal => "internal",
        }
    }

    pub fn parse(s: &str) -> Option<ChannelKind> {
        Some(match s {
            "bootstrap" => ChannelKind::Bootstrap,
            "kv_transfer" => ChannelKind::KvTransfer,
            "internal" => ChannelKind::Internal,
            _ => return None,
        })
    }
}

impl std::fmt::Display for ChannelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which way an engine's KV cache moves in a PD pair, from its flags as its profile's
/// `kv_transfer` reads them (label `kv_side`): a prefill sends, a decode receives, a vLLM
/// `kv_both` engine does both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvSide {
    Sender,
    Receiver,
    Both,
}

impl KvSide {
    pub fn as_str(self) -> &'static str {
        match self {
            KvSide::Sender => "sender",
            KvSide::Receiver => "receiver",
            KvSide::Both => "both",
        }
    }

    pub fn parse(s: &str) -> Option<KvSide> {
        Some(match s {
            "sender" => KvSide::Sender,
            "receiver" => KvSide::Receiver,
            "both" => KvSide::Both,
            _ => return None,
        })
    }

    /// From whether it sends and whether it receives; neither: no side.
    pub fn of(sends: bool, receives: bool) -> Option<KvSide> {
        match (sends, receives) {
            (true, true) => Some(KvSide::Both),
            (true, false) => Some(KvSide::Sender),
            (false, true) => Some(KvSide::Receiver),
            (false, false) => None,
        }
    }

    pub fn sends(self) -> bool {
        self != KvSide::Receiver
    }

    pub fn receives(self) -> bool {
        self != KvSide::Sender
    }
}

/// One listen address of a component that is a channel, and what for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Channel {
    /// `ip:port`, one of the component's `listen` addresses.
    pub addr: String,
    pub kind: ChannelKind,
}

/// Which of a component's listen addresses carry requests (a profile's `requests_on`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestsOn {
    /// Every listen address (proxies, routers: all their ports serve).
    #[default]
    All,
    /// Only the serving address (`--port`): an engine's other ports are channels.
    Serving,
    /// None: a child process (a scheduler, a detokenizer) serves no client.
    None,
}

/// The traffic of one kind of channel between two components over the latest sockets: what
/// a KV transfer or a bootstrap session looks like instead of a request (snapshot `channels`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelFlow {
    /// The client's component, when its socket's owner is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The component whose channel it is (the server side).
    pub to: String,
    pub kind: ChannelKind,
    /// Open connections.
    pub connections: u32,
    /// Bytes the server received and sent since the connections were first seen.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Since the last byte either way, at the snapshot's time (none: no byte seen move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ms: Option<u64>,
}
