//! Every id of one node's snapshot prefixed by its node (`nodeb/decode@10.77.0.2:30001`,
//! `nodeb/x12`): components, exchanges, links, findings' components, threads, GPU
//! processes, edges, changes and outbound connections. Components get a `node` label.
//! What the merge names again (logical requests, the exchanges' `request` and `leg`, the
//! requests findings name) is left alone.

use crate::model::Snapshot;

/// The separator between a node and an id.
pub const SEP: char = '/';

/// `node/id`.
pub fn ns(node: &str, id: &str) -> String {
    let mut s = String::with_capacity(node.len() + 1 + id.len());
    s.push_str(node);
    s.push(SEP);
    s.push_str(id);
    s
}

/// The node of a namespaced id.
pub fn node_of(id: &str) -> &str {
    id.split_once(SEP).map_or("", |(n, _)| n)
}

/// Prefixes every id of `s` with `node`.
pub fn namespace(s: &mut Snapshot, node: &str) {
    let n = |id: &mut String| *id = ns(node, id);
    let o = |id: &mut Option<String>| {
        if let Some(i) = id {
            *i = ns(node, i);
        }
    };
    for c in &mut s.components {
        n(&mut c.id);
        o(&mut c.parent);
        c.labels.insert("node".to_string(), node.to_string());
    }
    for r in &mut s.requests {
        n(&mut r.id);
        n(&mut r.component);
        o(&mut r.client_component);
        r.links.iter_mut().for_each(n);
    }
    for f in &mut s.findings {
        o(&mut f.component);
    }
    for t in &mut s.threads {
        o(&mut t.component);
    }
    for g in &mut s.gpus {
        g.processes.iter_mut().for_each(|p| o(&mut p.component));
    }
    for e in &mut s.edges {
        n(&mut e.from);
        n(&mut e.to);
    }
    for c in &mut s.config_changed {
        n(&mut c.component);
    }
    for c in &mut s.connections {
        n(&mut c.component);
    }
}
