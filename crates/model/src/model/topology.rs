//! What the stack looks like: components (a role played by one or more processes) and the
//! edges between them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The role a component plays in the stack (the snapshot contract's `role` enum).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Proxy,
    Router,
    Prefill,
    Decode,
    Engine,
    Scheduler,
    Detokenizer,
    Client,
    Other,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Proxy => "proxy",
            Role::Router => "router",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Engine => "engine",
            Role::Scheduler => "scheduler",
            Role::Detokenizer => "detokenizer",
            Role::Client => "client",
            Role::Other => "other",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Some(match s {
            "proxy" => Role::Proxy,
            "router" => Role::Router,
            "prefill" => Role::Prefill,
            "decode" => Role::Decode,
            "engine" => Role::Engine,
            "scheduler" => Role::Scheduler,
            "detokenizer" => Role::Detokenizer,
            "client" => Role::Client,
            "other" => Role::Other,
            _ => return None,
        })
    }

    /// Serving engines: the components that own schedulers and GPUs.
    pub fn is_engine(self) -> bool {
        matches!(self, Role::Prefill | Role::Decode | Role::Engine)
    }

    /// How deep in the request path this role sits; the deepest hop is blamed for a wedge.
    pub fn depth(self) -> u8 {
        match self {
            Role::Client => 0,
            Role::Proxy | Role::Other => 1,
            Role::Router => 2,
            Role::Prefill | Role::Engine => 3,
            Role::Decode => 4,
            Role::Scheduler | Role::Detokenizer => 5,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One component of the stack: an engine with its scheduler children, the router, a proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Component {
    /// Stable across restarts: role + listen address (e.g. `decode@127.0.0.1:31012`), or
    /// `scheduler_TP0@decode@127.0.0.1:31012` for children.
    pub id: String,
    pub role: Role,
    /// `sglang`, `vllm`, `generic`, ...
    pub stack: String,
    /// Name of the probe profile that recognised it.
    pub profile: String,
    pub pids: Vec<i32>,
    pub main_pid: Option<i32>,
    /// Listen addresses as `ip:port`.
    pub listen: Vec<String>,
    /// GPU indices from `CUDA_VISIBLE_DEVICES` (hint) or NVML's process list (fact).
    pub gpus: Vec<u32>,
    /// Component id of the parent (a scheduler's engine).
    pub parent: Option<String>,
    pub children: Vec<String>,
    /// Base URL of its HTTP API (`http://127.0.0.1:31012`), if any.
    pub http_url: Option<String>,
    /// Full URL of its Prometheus endpoint, if any.
    pub metrics_url: Option<String>,
    /// Title set by setproctitle (`sglang::scheduler_TP0`), when it differs from the cmdline.
    pub title: Option<String>,
    /// Free-form facts from the profile (mode, tp size, ...).
    pub labels: BTreeMap<String, String>,
    /// Installed versions (package -> version, `python`, `kernel`) read by discovery from
    /// the package metadata on disk (`sources::versions`); engines and routers only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub versions: BTreeMap<String, String>,
    /// The profile's `relevant_env` patterns (regexes over variable names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relevant_env: Vec<String>,
    /// Inode of its network namespace when that is not wedgewatch's own (a container): its
    /// listen addresses mean something only in there, and it is scraped in there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<u64>,
    /// The container it runs in, named from its cgroup (`docker 3601745b3bd5`,
    /// `k8s pod 1f2e.. cri-containerd 4c7a..`, `systemd sglang.service`), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// Listen addresses that carry no requests, and what they are for (`model::channel`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<super::Channel>,
}

impl Component {
    pub fn new(id: impl Into<String>, role: Role, stack: impl Into<String>) -> Self {
        Component {
            id: id.into(),
            role,
            stack: stack.into(),
            profile: String::new(),
            pids: Vec::new(),
            main_pid: None,
            listen: Vec::new(),
            gpus: Vec::new(),
            parent: None,
            children: Vec::new(),
            http_url: None,
            metrics_url: None,
            title: None,
            labels: BTreeMap::new(),
            versions: BTreeMap::new(),
            relevant_env: Vec::new(),
            netns: None,
            container: None,
            channels: Vec::new(),
        }
    }

    /// Which way its KV cache moves in a PD pair, as discovery read its flags (`kv_side`).
    pub fn kv_side(&self) -> Option<super::KvSide> {
        self.labels
            .get(labels::LABEL_KV_SIDE)
            .and_then(|s| super::KvSide::parse(s))
    }

    /// The listen ports that carry requests: all but its channels'.
    pub fn serving_ports(&self) -> Vec<u16> {
        let channel_ports: Vec<u16> = self
            .channels
            .iter()
            .filter_map(|ch| super::addr::port_of(&ch.addr))
            .collect();
        self.listen_ports()
            .into_iter()
            .filter(|p| !channel_ports.contains(p))
            .collect()
    }

    /// Listen ports, parsed from `listen`.
    pub fn listen_ports(&self) -> Vec<u16> {
        self.listen
            .iter()
            .filter_map(|a| super::addr::port_of(a))
            .collect()
    }

    /// The pid whose environ stands for this component (`env_pid` label, else its main pid).
    pub fn env_pid(&self) -> Option<i32> {
        self.label_pid(labels::LABEL_ENV_PID).or(self.main_pid)
    }

    /// The pid whose cmdline holds this component's arguments (`args_pid` label, else main pid).
    pub fn args_pid(&self) -> Option<i32> {
        self.label_pid(labels::LABEL_ARGS_PID).or(self.main_pid)
    }

    fn label_pid(&self, key: &str) -> Option<i32> {
        self.labels.get(key).and_then(|v| v.parse().ok())
    }
}

/// How an edge was learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeOrigin {
    /// From a component's configuration (router flags, `/workers`).
    Config,
    /// From live TCP connections.
    Sockets,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub origin: EdgeOrigin,
    /// Established connections seen from -> to in the latest socket sample.
    pub connections: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    pub components: Vec<Component>,
    pub edges: Vec<Edge>,
}

impl Topology {
    pub fn component(&self, id: &str) -> Option<&Component> {
        self.components.iter().find(|c| c.id == id)
    }

    /// The top-level component `id` belongs to: itself, or its parent's, up the chain (a
    /// scheduler's engine). Bounded: a parent cycle in a hostile topology ends after 8 steps.
    pub fn top_level<'a>(&'a self, id: &'a str) -> &'a str {
        let mut at = id;
        for _ in 0..8 {
            match self.component(at).and_then(|c| c.parent.as_deref()) {
                Some(p) => at = p,
                None => break,
            }
        }
        at
    }

    /// The component a pid belongs to (the most specific one: a scheduler before its engine).
    pub fn component_of_pid(&self, pid: i32) -> Option<&Component> {
        self.components
            .iter()
            .filter(|c| c.pids.contains(&pid))
            .max_by_key(|c| c.role.depth())
    }

    /// Every pid of the topology, plus the pids whose cmdline/environ stand in for titled
    /// components (`env_pid`/`args_pid` labels), deduplicated and sorted.
    pub fn pids(&self) -> Vec<i32> {
        let mut pids: std::collections::BTreeSet<i32> = std::collections::BTreeSet::new();
        for c in &self.components {
            pids.extend(c.pids.iter().copied());
            for key in [labels::LABEL_ENV_PID, labels::LABEL_ARGS_PID] {
                pids.extend(c.label_pid(key));
            }
        }
        pids.into_iter().collect()
    }

    /// The component listening on `port` (any address).
    pub fn component_listening_on(&self, port: u16) -> Option<&Component> {
        self.components
            .iter()
            .find(|c| c.listen_ports().contains(&port))
    }

    /// The component listening on `port` in network namespace `netns` (None: the host's):
    /// two pods listening on one port are two components, told apart by their namespace.
    pub fn component_listening_in(&self, netns: Option<u64>, port: u16) -> Option<&Component> {
        self.components
            .iter()
            .find(|c| c.netns == netns && c.listen_ports().contains(&port))
    }

    /// Adds an edge unless one with the same ends exists; updates its connection count.
    pub fn upsert_edge(&mut self, edge: Edge) {
        if let Some(e) = self
            .edges
            .iter_mut()
            .find(|e| e.from == edge.from && e.to == edge.to)
        {
            if edge.connections.is_some() {
                e.connections = edge.connections;
            }
        } else {
            self.edges.push(edge);
        }
    }
}

/// The labels discovery writes on a component and sources read back (model layer, so that
/// neither `discover` nor `sources` imports the other for them).
pub mod labels {
    /// Label: pid whose environ stands for this component (its own was clobbered by setproctitle).
    pub const LABEL_ENV_PID: &str = "env_pid";
    /// Label: pid whose cmdline holds this component's original arguments (a launcher).
    pub const LABEL_ARGS_PID: &str = "args_pid";
    /// Label: where the arguments came from (`own`, `launcher pid N`, `unavailable`).
    pub const LABEL_ARGS_SOURCE: &str = "args_source";
    /// Label: how the component was found (`profile`, `--pid`, `--url`, `sockets`).
    pub const LABEL_FOUND_BY: &str = "found_by";
    /// Label: the process trees discovery was kept to (`--within`: `pid 4711`, ...), on every
    /// component it found then; a reader of the snapshot knows other stacks were left out.
    pub const LABEL_WITHIN: &str = "within";
    /// Label: why the component's HTTP API or metrics endpoint is not scraped (the address its
    /// flags name is not one of its own listening sockets on this host).
    pub const LABEL_METRICS_UNSCRAPED: &str = "metrics_unscraped";
    /// Label: the KV transfer backend an engine's flags name (`mooncake`, `NixlConnector`).
    pub const LABEL_KV_BACKEND: &str = "kv_backend";
    /// Label: which way its KV cache moves (`model::channel::KvSide`: sender, receiver, both).
    pub const LABEL_KV_SIDE: &str = "kv_side";
}
