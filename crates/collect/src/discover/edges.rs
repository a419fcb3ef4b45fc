//! Edges between components: config edges from a router's worker flags (or its `/workers`
//! endpoint when the arguments did not survive), and generic proxies found by their
//! ESTABLISHED connections to a known component's port.

use super::endpoints::{connect_host, endpoint_of, loopback_get_in, worker_urls_from_json};
use super::holders::{Holders, Search};
use super::profiles::flag_values;
use super::Builder;
use crate::model::topology::labels::*;
use crate::model::{Component, Edge, EdgeOrigin, Role, TcpState};
use crate::probes::Profile;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

impl Builder<'_> {
    pub(super) fn config_edges(&mut self) {
        let comps: Vec<Component> = self.topo.components.clone();
        for c in comps {
            let Some(prof) = self
                .compiled
                .iter()
                .find(|x| x.p.name == c.profile)
                .map(|x| Arc::clone(&x.p))
            else {
                continue;
            };
            if prof.worker_flags.is_empty() {
                continue;
            }
            let (urls, source) = self.worker_urls(&c, &prof);
            self.add_worker_edges(&c, &urls, source);
        }
    }

    /// (kind, url) of each worker a router names, and where they came from.
    fn worker_urls(&self, c: &Component, prof: &Profile) -> (Vec<(String, String)>, String) {
        let args_unavailable = c
            .labels
            .get(LABEL_ARGS_SOURCE)
            .is_some_and(|s| s.starts_with("unavailable"));
        let args: Vec<String> = if args_unavailable {
            Vec::new()
        } else {
            c.args_pid()
                .map(|p| self.table.cmdline(p))
                .unwrap_or_default()
        };
        let mut urls: Vec<(String, String)> = Vec::new();
        for flag in &prof.worker_flags {
            for v in flag_values(&args, flag).into_iter().flatten() {
                if v.contains("://") {
                    urls.push((flag.trim_start_matches('-').to_string(), v));
                }
            }
        }
        if !urls.is_empty() || !self.opts.query_endpoints {
            return (urls, "flags".to_string());
        }
        let (Some(path), Some(base)) = (&prof.workers_endpoint, &c.http_url) else {
            return (urls, "flags".to_string());
        };
        let Some((host, port)) = endpoint_of(base) else {
            return (urls, "flags".to_string());
        };
        let key = crate::sources::router_key::discovery_key(
            c,
            &self.opts.proc_root,
            self.opts.router_key_env.as_deref(),
        );
        let ns = c.main_pid.and_then(|p| self.table.netns_ref(p));
        match loopback_get_in(&host, port, path, self.opts.http_timeout, key, ns) {
            Ok(body) => {
                let urls = worker_urls_from_json(&body)
                    .into_iter()
                    .map(|u| ("workers".to_string(), u))
                    .collect();
                (urls, format!("GET {path}"))
            }
            Err(e) => (urls, format!("GET {path} failed: {e}")),
        }
    }

    /// Config edges to the components the worker URLs point at; labels saying which URLs
    /// there were, from where, and which point at nothing known.
    fn add_worker_edges(&mut self, c: &Component, urls: &[(String, String)], source: String) {
        let mut unresolved = Vec::new();
        let mut edges = Vec::new();
        for (_, url) in urls {
            // A worker URL means an address in the router's own namespace.
            match endpoint_of(url).and_then(|(h, p)| self.component_at_in(c.netns, &h, p)) {
                Some(to) if to != c.id => edges.push(Edge {
                    from: c.id.clone(),
                    to,
                    origin: EdgeOrigin::Config,
                    connections: None,
                }),
                Some(_) => {}
                None => unresolved.push(url.clone()),
            }
        }
        for e in edges {
            self.topo.upsert_edge(e);
        }
        let Some(comp) = self.topo.components.iter_mut().find(|x| x.id == c.id) else {
            return;
        };
        if !urls.is_empty() {
            let all: Vec<&str> = urls.iter().map(|(_, u)| u.as_str()).collect();
            comp.labels.insert("workers".into(), all.join(","));
        }
        comp.labels.insert("workers_source".into(), source);
        if !unresolved.is_empty() {
            comp.labels
                .insert("workers_unresolved".into(), unresolved.join(","));
        }
    }

    pub(super) fn proxies(&mut self) {
        let proxy_profiles: Vec<usize> = self
            .compiled
            .iter()
            .enumerate()
            .filter(|(_, c)| c.p.connects_to_known)
            .map(|(i, _)| i)
            .collect();
        let mut all_wanted: BTreeSet<u64> = BTreeSet::new();
        if !proxy_profiles.is_empty() && !self.topo.components.is_empty() {
            self.proxy_rounds(&proxy_profiles, &mut all_wanted);
        }
        // sockets given up on stay so only while they point at a known component
        self.table.retain_given_up(&all_wanted);
    }

    /// Proxies in front of proxies: a few rounds, each adding the new listen ports.
    fn proxy_rounds(&mut self, proxy_profiles: &[usize], all_wanted: &mut BTreeSet<u64>) {
        for _round in 0..3 {
            let known_ports = self.known_ports();
            let wanted = self.client_sockets_towards(&known_ports);
            all_wanted.extend(wanted.keys());
            if wanted.is_empty() {
                return;
            }
            let found = self.holders_of(&wanted);
            let mut added = false;
            for (pid, targets) in found {
                added |= self.add_proxy(pid, targets, proxy_profiles);
            }
            if !added {
                return;
            }
        }
    }

    /// (network namespace, serving port) -> the top-level component listening there: two
    /// pods can listen on one port. A client of a channel (a KV transfer peer) is no proxy.
    fn known_ports(&self) -> BTreeMap<(Option<u64>, u16), String> {
        let mut known: BTreeMap<(Option<u64>, u16), String> = BTreeMap::new();
        for c in self.topo.components.iter().filter(|c| c.parent.is_none()) {
            for p in c.serving_ports() {
                known.entry((c.netns, p)).or_insert_with(|| c.id.clone());
            }
        }
        known
    }

    /// Client-side sockets towards a known port, by inode, in every namespace: inode ->
    /// the component they point at.
    fn client_sockets_towards(
        &self,
        known_ports: &BTreeMap<(Option<u64>, u16), String>,
    ) -> BTreeMap<u64, String> {
        let mut pids_by_ns: BTreeMap<u64, i32> = BTreeMap::new();
        for &pid in self.table.procs.keys() {
            if let Some(ns) = self.table.netns(pid) {
                pids_by_ns.entry(ns).or_insert(pid);
            }
        }
        let mut wanted: BTreeMap<u64, String> = BTreeMap::new();
        for &rep in pids_by_ns.values() {
            let ns = self.table.foreign_netns(rep);
            for e in self.table.tcp_of(rep).iter() {
                // CLOSE_WAIT too: a proxy that leaks its upstream connections (the
                // upstream hung up, the proxy never closed) is still that upstream's
                // client, and exactly the proxy worth finding.
                let client_state = matches!(e.state, TcpState::Established | TcpState::CloseWait);
                if !client_state || e.inode == 0 {
                    continue;
                }
                if e.local_port()
                    .is_some_and(|p| known_ports.contains_key(&(ns, p)))
                {
                    continue; // the server side of a known component
                }
                if let Some(target) = e.remote_port().and_then(|p| known_ports.get(&(ns, p))) {
                    wanted.insert(e.inode, target.clone());
                }
            }
        }
        wanted
    }

    /// Which unknown processes hold the wanted sockets (`holders.rs`).
    fn holders_of(&self, wanted: &BTreeMap<u64, String>) -> Holders {
        let mut known_pids: BTreeSet<i32> = BTreeSet::new();
        for c in &self.topo.components {
            for &p in &c.pids {
                known_pids.insert(p);
                known_pids.extend(self.table.ancestors(p));
            }
        }
        known_pids.extend(self.opts.exclude_pids.iter().copied());
        let search = Search {
            table: &self.table,
            wanted,
            known_pids: &known_pids,
            own_pids: &self.opts.exclude_pids,
        };
        search.run()
    }

    /// Adds (or extends) the proxy component of `pid` and its socket edges; true when a new
    /// component was added.
    fn add_proxy(
        &mut self,
        pid: i32,
        targets: BTreeMap<String, u32>,
        proxy_profiles: &[usize],
    ) -> bool {
        let listen = self.table.listen_of(pid);
        let Some(first) = listen.first().copied() else {
            return false;
        };
        let Some(proc) = self.table.full(pid) else {
            return false;
        };
        let Some(&ci) = proxy_profiles.iter().find(|&&ci| {
            let c = &self.compiled[ci];
            let has_rules = !c.cmdline.is_empty() || !c.comm.is_empty() || !c.title.is_empty();
            !has_rules || c.matches(&proc).is_some()
        }) else {
            return false;
        };
        let prof = Arc::clone(&self.compiled[ci].p);
        let role = Role::parse(&prof.role).unwrap_or(Role::Proxy);
        let id = format!("{role}@{}", self.table.keyed(pid, &first.to_string()));
        let mut added = false;
        if let Some(existing) = self.topo.components.iter_mut().find(|c| c.id == id) {
            // another process of the same proxy (worker of a master)
            if !existing.pids.contains(&pid) {
                existing.pids.push(pid);
            }
        } else {
            let mut c = Component::new(id.clone(), role, prof.stack.clone());
            c.profile = prof.name.clone();
            c.pids = vec![pid];
            c.main_pid = Some(pid);
            c.listen = listen.iter().map(|a| a.to_string()).collect();
            c.http_url = Some(format!(
                "http://{}:{}",
                connect_host(&first.ip().to_string()),
                first.port()
            ));
            c.labels.insert(LABEL_FOUND_BY.into(), "sockets".into());
            c.labels.insert("comm".into(), proc.comm.to_string());
            self.table.place(&mut c, pid);
            self.topo.components.push(c);
            added = true;
        }
        for (to, n) in targets {
            self.topo.upsert_edge(Edge {
                from: id.clone(),
                to,
                origin: EdgeOrigin::Sockets,
                connections: Some(n),
            });
        }
        added
    }
}
