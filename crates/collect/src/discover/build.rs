//! Component building: one matched process (and its profile) -> a [`Component`] with its
//! arguments, environment source, role, listen addresses, id, scrape URLs and GPU hints.

use super::endpoints::{
    endpoint_urls, hosts_equivalent, loopback_get_in, parse_gpu_list, EndpointFacts,
};
use super::profiles::{flag_value, Compiled, Match};
use super::table::Proc;
use super::Builder;
use crate::model::addr::port_of;
use crate::model::addr::{host_port, split_host_port};
use crate::model::topology::labels::*;
use crate::model::{Channel, ChannelKind, Component, RequestsOn, Role};
use crate::probes::Profile;
use std::collections::BTreeMap;
use std::net::SocketAddr;

type Labels = BTreeMap<String, String>;

/// Where a component listens: the primary address (from flags, probing, defaults or its
/// sockets), its port, all listen addresses, and its own listening sockets.
struct Listen {
    primary: Option<String>,
    port: Option<u16>,
    addrs: Vec<String>,
    sockets: Vec<SocketAddr>,
}

impl Builder<'_> {
    /// Builds the component of `pid`, matched by profile `ci` (`parent`: for children).
    pub(super) fn build_component(
        &self,
        pid: i32,
        ci: usize,
        m: Match,
        parent: Option<&Component>,
    ) -> Component {
        let comp = &self.compiled[ci];
        let prof: &Profile = &comp.p;
        let proc = self.table.full(pid).unwrap_or(Proc {
            pid,
            ..Proc::default()
        });
        let mut labels = Labels::new();
        labels.insert(LABEL_FOUND_BY.to_string(), "profile".to_string());
        let args = self.arguments(&proc, ci, m, &mut labels);
        let env_source = env_source(m, parent, &labels);
        if let Some(e) = env_source {
            labels.insert(LABEL_ENV_PID.into(), e.to_string());
        }
        let env = self
            .table
            .env_vars(env_source.unwrap_or(pid), &self.env_names);
        let role = role_and_flag_labels(prof, &args, &mut labels);
        super::kv_transfer::kv_labels(prof, &args, role, &mut labels);
        let listen = self.listen(pid, prof, &args, m);
        let title = comp.title_of(&proc);
        let id = component_id(comp, role, title.as_deref(), parent, &listen, pid);
        let id = self.keyed_id(id, parent, pid);

        let mut c = Component::new(id, role, prof.stack.clone());
        c.profile = prof.name.clone();
        c.pids = vec![pid];
        c.main_pid = Some(pid);
        c.parent = parent.map(|p| p.id.clone());
        c.title = title;
        self.table.place(&mut c, pid);
        c.listen = listen.addrs.clone();
        c.channels = channels(prof, &args, &listen);
        self.scrape_urls(&mut c, prof, &args, &listen, &mut labels);
        gpu_hints(&mut c, comp, &env, &mut labels);
        if !args.is_empty() {
            labels.insert("argc".into(), args.len().to_string());
        }
        c.labels = labels;
        // what a report shows: installed versions (top-level components only: children run
        // their engine's Python) and which variables matter
        if parent.is_none() && !prof.packages.is_empty() {
            c.versions = self.table.versions(pid, &args, &env, &prof.packages);
        }
        c.relevant_env = prof.relevant_env.clone();
        c
    }

    /// Its arguments: its own, or the launcher's when setproctitle hid them.
    fn arguments(&self, proc: &Proc, ci: usize, m: Match, labels: &mut Labels) -> Vec<String> {
        if m.own_args {
            labels.insert(LABEL_ARGS_SOURCE.into(), "own".into());
            return proc.cmdline.clone();
        }
        if !m.titled {
            return proc.cmdline.clone();
        }
        if !self.compiled[ci].p.args_from_ancestor {
            return Vec::new();
        }
        match self.launcher_of(proc.pid, ci) {
            Some(l) => {
                labels.insert(LABEL_ARGS_PID.into(), l.to_string());
                labels.insert(LABEL_ARGS_SOURCE.into(), format!("launcher pid {l}"));
                self.table.cmdline(l)
            }
            None => {
                labels.insert(
                    LABEL_ARGS_SOURCE.into(),
                    "unavailable (titled, no launcher keeps them); sockets used".into(),
                );
                Vec::new()
            }
        }
    }

    /// Its listen addresses: flags, else (arguments lost) the socket that answers the
    /// workers endpoint, else the profile's default or its sockets.
    fn listen(&self, pid: i32, prof: &Profile, args: &[String], m: Match) -> Listen {
        let sockets = if prof.ports_from_sockets {
            self.table.listen_of(pid)
        } else {
            Vec::new()
        };
        let flag_host = prof.host_flag.as_ref().and_then(|f| flag_value(args, f));
        let flag_port = prof
            .port_flag
            .as_ref()
            .and_then(|f| flag_value(args, f))
            .and_then(|v| v.parse::<u16>().ok());
        let probed_port = if args.is_empty() && m.titled && flag_port.is_none() {
            self.probe_api_port(prof, &sockets, pid)
        } else {
            None
        };
        let port = flag_port
            .or(probed_port)
            .or_else(|| default_port(prof, args, &sockets));
        let primary = port.map(|port| {
            let host = flag_host
                .clone()
                .or_else(|| {
                    sockets
                        .iter()
                        .find(|s| s.port() == port)
                        .map(|s| s.ip().to_string())
                })
                .or_else(|| prof.default_host.clone())
                .unwrap_or_else(|| "0.0.0.0".into());
            host_port(&host, port)
        });
        let addrs = merge_listen(primary.as_deref(), &sockets);
        Listen {
            primary,
            port,
            addrs,
            sockets,
        }
    }

    /// netns: a top-level id `role@addr` of a process in another network namespace becomes
    /// `role@net:<inode>/addr`: two pods can listen on one address.
    fn keyed_id(&self, id: String, parent: Option<&Component>, pid: i32) -> String {
        match (parent, id.split_once('@')) {
            (None, Some((role, addr))) if !addr.starts_with("pid") => {
                format!("{role}@{}", self.table.keyed(pid, addr))
            }
            _ => id,
        }
    }

    /// Arguments lost (titled, no launcher): asks each listen socket for the workers
    /// endpoint; the one that answers JSON is the HTTP API (the other is metrics).
    fn probe_api_port(&self, prof: &Profile, sockets: &[SocketAddr], pid: i32) -> Option<u16> {
        if !self.opts.query_endpoints {
            return None;
        }
        let path = prof.workers_endpoint.as_ref()?;
        sockets.iter().take(4).find_map(|s| {
            let host = s.ip().to_string();
            let ns = self.table.netns_ref(pid);
            match loopback_get_in(&host, s.port(), path, self.opts.http_timeout, None, ns) {
                Ok(body) => serde_json::from_str::<serde_json::Value>(&body)
                    .ok()
                    .map(|_| s.port()),
                // A router started with --api-key refuses /workers without its key: the
                // refusal still marks its HTTP API (the metrics port says 404).
                Err(e) if crate::sources::router_key::is_auth_refusal(&e) => Some(s.port()),
                Err(_) => None,
            }
        })
    }

    /// HTTP and metrics URLs: only the process's own listening sockets (`scrape_addr`).
    fn scrape_urls(
        &self,
        c: &mut Component,
        prof: &Profile,
        args: &[String],
        listen: &Listen,
        labels: &mut Labels,
    ) {
        let pid = c.main_pid.unwrap_or(0);
        let own = if prof.ports_from_sockets {
            listen.sockets.clone()
        } else {
            self.table.listen_of(pid)
        };
        let (http_url, metrics_url, unscraped) = endpoint_urls(&EndpointFacts {
            prof,
            args,
            primary: listen.primary.as_deref(),
            port: listen.port,
            listen: &c.listen,
            own: &own,
            top_level: c.parent.is_none(),
        });
        c.http_url = http_url;
        c.metrics_url = metrics_url;
        if !unscraped.is_empty() {
            labels.insert(LABEL_METRICS_UNSCRAPED.into(), unscraped.join("; "));
        }
    }
}

/// Whose environ stands for a titled process (setproctitle clobbers its own): its parent
/// component's main process for children, else its launcher.
fn env_source(m: Match, parent: Option<&Component>, labels: &Labels) -> Option<i32> {
    if !m.titled {
        return None;
    }
    match parent {
        Some(p) => p.main_pid,
        None => labels.get(LABEL_ARGS_PID).and_then(|v| v.parse().ok()),
    }
}

/// The profile's role, refined by its `mode_flag`; labels from `labels_from_flags`.
fn role_and_flag_labels(prof: &Profile, args: &[String], labels: &mut Labels) -> Role {
    let mut role = Role::parse(&prof.role).unwrap_or(Role::Other);
    if let Some(flag) = &prof.mode_flag {
        if let Some(mode) = flag_value(args, flag) {
            labels.insert("mode".into(), mode.clone());
            if let Some(r) = prof.mode_roles.get(&mode).and_then(|r| Role::parse(r)) {
                role = r;
            }
        }
    }
    for (label, flag) in &prof.labels_from_flags {
        if let Some(v) = flag_value(args, flag) {
            labels.insert(label.clone(), v);
        }
    }
    role
}

/// The listen addresses that carry no requests: those at a port a `channel_flags` flag
/// names, then, as the profile's `requests_on` says, every address but the serving one
/// (engines) or every address (children). The serving address is never a channel, and
/// without a known one an engine's unflagged sockets cannot be told apart: none is.
fn channels(prof: &Profile, args: &[String], listen: &Listen) -> Vec<Channel> {
    let flagged = flagged_ports(prof, args);
    let serving = listen.port.filter(|_| prof.requests_on != RequestsOn::None);
    let unflagged_is_channel = match prof.requests_on {
        RequestsOn::All => false,
        RequestsOn::Serving => serving.is_some(),
        RequestsOn::None => true,
    };
    listen
        .addrs
        .iter()
        .filter_map(|a| {
            let port = port_of(a).filter(|p| Some(*p) != serving)?;
            let kind = flagged
                .iter()
                .find(|(p, _)| *p == port)
                .map(|(_, k)| *k)
                .or(unflagged_is_channel.then_some(ChannelKind::Internal))?;
            Some(Channel {
                addr: a.clone(),
                kind,
            })
        })
        .collect()
}

/// The profile's default port, unless the process listens elsewhere (then its sockets win,
/// but never a channel's: taken for the serving port, it would hide every request).
pub(super) fn default_port(prof: &Profile, args: &[String], sockets: &[SocketAddr]) -> Option<u16> {
    let flagged = flagged_ports(prof, args);
    let mut serving = sockets
        .iter()
        .filter(|s| !flagged.iter().any(|(p, _)| *p == s.port()));
    match prof.default_port {
        Some(d) if sockets.is_empty() || sockets.iter().any(|s| s.port() == d) => Some(d),
        Some(_) => serving.next().map(|s| s.port()),
        None => None,
    }
}

/// The ports the profile's `channel_flags` name in `args`, with their kinds, and the KV
/// transfer port its `kv_transfer` config names.
fn flagged_ports(prof: &Profile, args: &[String]) -> Vec<(u16, ChannelKind)> {
    prof.channel_flags
        .iter()
        .filter_map(|(kind, flag)| {
            let port = flag_value(args, flag)?.parse::<u16>().ok()?;
            Some((port, ChannelKind::parse(kind)?))
        })
        .chain(super::kv_transfer::kv_port(prof, args).map(|p| (p, ChannelKind::KvTransfer)))
        .collect()
}

/// The primary address first, then every socket not already named by it.
fn merge_listen(primary: Option<&str>, sockets: &[SocketAddr]) -> Vec<String> {
    let mut listen: Vec<String> = primary.into_iter().map(str::to_string).collect();
    for s in sockets {
        let s = s.to_string();
        let dup = listen
            .iter()
            .any(|l| match (split_host_port(l), split_host_port(&s)) {
                (Some((h1, p1)), Some((h2, p2))) => p1 == p2 && hosts_equivalent(h1, h2),
                _ => *l == s,
            });
        if !dup {
            listen.push(s);
        }
    }
    listen
}

/// `role@address` (top level), `name@parent-id` (children), `role@pid<N>` without either.
fn component_id(
    comp: &Compiled,
    role: Role,
    title: Option<&str>,
    parent: Option<&Component>,
    listen: &Listen,
    pid: i32,
) -> String {
    let name = match (&comp.child_name, title) {
        (Some(re), Some(t)) => re
            .captures(t)
            .and_then(|c| c.get(1))
            .map(|m| m.as_str().to_string())
            .unwrap_or_else(|| role.to_string()),
        _ => role.to_string(),
    };
    match (parent, &listen.primary, listen.sockets.first()) {
        (Some(p), _, _) => format!("{name}@{}", p.id),
        (None, Some(a), _) => format!("{role}@{a}"),
        (None, None, Some(s)) => format!("{role}@{s}"),
        (None, None, None) => format!("{role}@pid{pid}"),
    }
}

/// GPUs: from the visible-devices variable of the untitled process, picked by the rank in
/// the title when the profile says how to read it.
fn gpu_hints(c: &mut Component, comp: &Compiled, env: &Labels, labels: &mut Labels) {
    let Some(var) = &comp.p.gpu_env else {
        return;
    };
    let visible = env.get(var).map(|v| parse_gpu_list(v));
    let rank = comp
        .gpu_index
        .as_ref()
        .zip(c.title.as_ref())
        .and_then(|(re, t)| re.captures(t))
        .and_then(|cap| cap.get(1))
        .and_then(|m| m.as_str().parse::<usize>().ok());
    c.gpus = match (visible, rank) {
        (Some(v), Some(r)) => v.get(r).copied().into_iter().collect(),
        (Some(v), None) => v,
        (None, Some(r)) => vec![r as u32],
        (None, None) => Vec::new(),
    };
    if let Some(v) = env.get(var) {
        labels.insert(var.to_lowercase(), v.clone());
    }
}
