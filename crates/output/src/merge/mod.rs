//! `wedgewatch merge`: one snapshot of several nodes.
//!
//! [`merge`] runs [`load`](mod@load), [`screen`](mod@screen), [`namespace`], [`links`],
//! [`skew`], [`judge`] and [`findings`] in that order and returns a `wedgewatch.snapshot/1`
//! whose `fleet` field says which nodes, how their clocks compare, which hops were joined and
//! what could not be seen through (docs/fleet.md "Merge").

mod findings;
mod flat;
mod judge;
pub mod links;
pub mod load;
pub mod namespace;
pub mod screen;
mod skew;

pub use load::{load, name_from_source, Collected, MergeError, NodeInput};
pub use screen::{screen, Unmergeable};

use crate::model::{FailedNode, FleetInfo, FleetNode, Snapshot, SourceStatus, SNAPSHOT_SCHEMA};
use flat::Flat;
use std::collections::BTreeMap;

/// Merges one snapshot per node into one; `failed` names nodes that could not be read.
pub fn merge(inputs: Vec<NodeInput>, failed: Vec<FailedNode>) -> Result<Snapshot, MergeError> {
    if inputs.is_empty() {
        return Err(MergeError::NoInput);
    }
    let inputs = check_inputs(inputs)?;
    let names = node_names(&inputs);
    let mut snaps: Vec<Snapshot> = Vec::with_capacity(inputs.len());
    let mut fleet_nodes = Vec::with_capacity(inputs.len());
    let mut collected = Vec::with_capacity(inputs.len());
    for (inp, name) in inputs.into_iter().zip(&names) {
        let s = inp.snapshot;
        fleet_nodes.push(FleetNode {
            name: name.clone(),
            source: inp.source,
            taken_at: s.taken_at.clone(),
            identity: s.node.clone(),
            skew_ms: None,
            skew_error_ms: None,
            skew_basis: None,
        });
        collected.push(inp.collected);
        snaps.push(s);
    }
    let mut flat = Flat::take(&mut snaps, &names);
    let (matches, notes) = links::match_connections(&snaps, &flat);
    let skews = skew::estimate(&snaps, &flat, &matches, &collected);
    let offsets: Vec<i64> = skews
        .iter()
        .map(|s| s.as_ref().map_or(0, |s| s.offset_ms))
        .collect();
    let tolerance = skews
        .iter()
        .map(|s| s.as_ref().map_or(1_000, |s| s.error_ms))
        .max()
        .unwrap_or(0);
    let cross = links::link(&snaps, &mut flat, &matches, &offsets, tolerance);
    set_skews(&mut fleet_nodes, skews);
    let (logical, blamed) = judge::regroup(&mut flat);
    let node_findings = carried_findings(&mut snaps, &names, &flat);
    let found = findings::findings(&flat, &logical, &blamed, node_findings);
    let fleet = FleetInfo {
        nodes: fleet_nodes,
        links: cross,
        failed,
        notes,
    };
    Ok(assemble(snaps, flat, logical, found, fleet))
}

/// Each node's clock against the reference's, as estimated.
fn set_skews(nodes: &mut [FleetNode], skews: Vec<Option<skew::Skew>>) {
    for (n, s) in nodes.iter_mut().zip(skews) {
        match s {
            Some(s) => {
                n.skew_ms = Some(s.offset_ms);
                n.skew_error_ms = Some(s.error_ms);
                n.skew_basis = Some(s.basis);
            }
            None => {
                n.skew_basis = Some(
                    "unknown: no connection joined with the reference node and no collector times"
                        .to_string(),
                )
            }
        }
    }
}

/// The nodes' own findings, moved out, each naming merged requests.
fn carried_findings(
    snaps: &mut [Snapshot],
    names: &[String],
    flat: &Flat,
) -> Vec<crate::model::Finding> {
    let mut out = Vec::new();
    for (n, (s, name)) in snaps.iter_mut().zip(names).enumerate() {
        let merged = |r: &str| {
            let &i = flat.named.get(n)?.get(r)?;
            flat.requests[i].request.clone()
        };
        out.extend(
            std::mem::take(&mut s.findings)
                .into_iter()
                .map(|f| renamed(f, name, merged)),
        );
    }
    out
}

/// A node's finding with the requests it names as merged requests (`merged`: the merged
/// request a node's own logical request id is now part of), or prefixed with its node.
fn renamed(
    mut f: crate::model::Finding,
    node: &str,
    merged: impl Fn(&str) -> Option<String> + Copy,
) -> crate::model::Finding {
    for r in &mut f.requests {
        *r = merged(r).unwrap_or_else(|| namespace::ns(node, r));
    }
    f
}

/// Refuses a merged snapshot as input and two snapshots of one node.
fn check_inputs(inputs: Vec<NodeInput>) -> Result<Vec<NodeInput>, MergeError> {
    let (kept, bad) = screen::screen(inputs);
    match bad.into_iter().next() {
        None => Ok(kept),
        Some((inp, Unmergeable::AlreadyMerged { nodes })) => Err(MergeError::AlreadyMerged {
            input: inp.source,
            nodes,
        }),
        Some((inp, Unmergeable::SameNode { kept, name })) => Err(MergeError::SameNode {
            a: kept,
            b: inp.source,
            name,
        }),
        Some((inp, Unmergeable::SameSnapshot { kept })) => Err(MergeError::SameSnapshot {
            a: kept,
            b: inp.source,
        }),
    }
}

/// Each input's node name, made unique (`b`, `b-2`) when two nodes share one.
fn node_names(inputs: &[NodeInput]) -> Vec<String> {
    let mut used: BTreeMap<String, usize> = BTreeMap::new();
    inputs
        .iter()
        .map(|inp| {
            let base = inp
                .name
                .clone()
                .or_else(|| inp.snapshot.node.as_ref().map(|n| n.name.clone()))
                .filter(|n| crate::sys::node::is_node_name(n))
                .unwrap_or_else(|| name_from_source(&inp.source));
            let k = used.entry(base.clone()).or_default();
            *k += 1;
            if *k == 1 {
                base
            } else {
                format!("{base}-{k}")
            }
        })
        .collect()
}

/// The merged snapshot from the namespaced parts.
fn assemble(
    snaps: Vec<Snapshot>,
    flat: Flat,
    logical: Vec<crate::model::LogicalRequest>,
    findings: Vec<crate::model::Finding>,
    fleet: FleetInfo,
) -> Snapshot {
    let taken_at = snaps
        .iter()
        .map(|s| s.taken_at.clone())
        .max()
        .unwrap_or_default();
    let mut out = Snapshot {
        schema: SNAPSHOT_SCHEMA.to_string(),
        taken_at,
        window_ms: snaps.iter().map(|s| s.window_ms).fold(0.0, f64::max),
        sources: BTreeMap::new(),
        components: Vec::new(),
        requests: flat.requests,
        gpus: Vec::new(),
        threads: Vec::new(),
        findings,
        edges: Vec::new(),
        redacted: snaps.iter().all(|s| s.redacted),
        config_changed: Vec::new(),
        tool: merged_tool(&fleet),
        versions: BTreeMap::new(),
        logical_requests: logical,
        node: None,
        connections: Vec::new(),
        channels: Vec::new(),
        fleet: None,
        elided: None,
        cause: None,
    };
    for (s, n) in snaps.into_iter().zip(&fleet.nodes) {
        let node = &n.name;
        for (k, v) in s.sources {
            let named = SourceStatus {
                reason: v.reason.as_ref().map(|r| format!("{node}: {r}")),
                ..v.clone()
            };
            let all = out
                .sources
                .remove(&k)
                .map_or(named.clone(), |a| a.worst(named));
            out.sources.insert(k.clone(), all);
            out.sources.insert(namespace::ns(node, &k), v);
        }
        out.versions.extend(
            s.versions
                .into_iter()
                .map(|(k, v)| (namespace::ns(node, &k), v)),
        );
        out.components.extend(s.components);
        out.gpus.extend(s.gpus);
        out.threads.extend(s.threads);
        out.edges.extend(s.edges);
        out.config_changed.extend(s.config_changed);
        out.connections.extend(s.connections);
    }
    out.versions
        .extend(shared_versions(&out.versions, fleet.nodes.len()));
    out.fleet = Some(fleet);
    // the nodes' own time lines are replaced by one over the merged requests and changes
    out.cause = crate::model::cause::of(&out);
    out
}

/// Host-wide versions every node agrees on, under their plain names (`kernel`), beside
/// each node's own (`nodeb/kernel`).
fn shared_versions(per_node: &BTreeMap<String, String>, nodes: usize) -> BTreeMap<String, String> {
    let mut seen: BTreeMap<&str, (usize, Option<&str>)> = BTreeMap::new();
    for (k, v) in per_node {
        let Some((_, plain)) = k.split_once(namespace::SEP) else {
            continue;
        };
        let e = seen.entry(plain).or_insert((0, Some(v.as_str())));
        e.0 += 1;
        if e.1 != Some(v.as_str()) {
            e.1 = None;
        }
    }
    seen.into_iter()
        .filter_map(|(k, (n, v))| Some((k.to_string(), v.filter(|_| n == nodes)?.to_string())))
        .collect()
}

fn merged_tool(fleet: &FleetInfo) -> BTreeMap<String, String> {
    let mut t = BTreeMap::new();
    t.insert("name".to_string(), "wedgewatch".to_string());
    t.insert("version".to_string(), env!("CARGO_PKG_VERSION").to_string());
    t.insert("merged_nodes".to_string(), fleet.nodes.len().to_string());
    t
}
