//! Which inputs can be merged with the others: a merged snapshot cannot be merged again,
//! and two snapshots of one node (same machine-id, boot-id, addresses and name; without a
//! node identity, one snapshot twice) cannot both be. `merge` refuses such inputs; `fleet snapshot` leaves the node out and names it.

use super::load::NodeInput;

/// Why one input cannot be merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmergeable {
    /// A merged snapshot (of that many nodes).
    AlreadyMerged { nodes: usize },
    /// The same node as the input from `kept` (that one is merged), named `name`.
    SameNode { kept: String, name: String },
    /// Without a node identity, a copy of the snapshot from `kept`: taken at the same time, of
    /// the same components and processes (one incident counted twice).
    SameSnapshot { kept: String },
}

impl Unmergeable {
    /// Why the node is left out, in words (for `fleet.failed`).
    pub fn reason(&self) -> String {
        match self {
            Unmergeable::AlreadyMerged { nodes } => {
                format!("answered with a merged snapshot (of {nodes} nodes), not its own")
            }
            Unmergeable::SameNode { kept, name } => format!(
                "answered as node {name:?}, the same node as {kept} (same machine-id, boot-id and addresses)"
            ),
            Unmergeable::SameSnapshot { kept } => format!(
                "answered with a copy of {kept}'s snapshot (same time taken, components and processes)"
            ),
        }
    }
}

/// The inputs that can be merged, in order, and the others with why not. Of inputs that
/// are one node, the one whose requested name (`NodeInput::name`) is the name its snapshot
/// gives is kept (a node answering with another's identity is the one left out), else the
/// first.
pub fn screen(inputs: Vec<NodeInput>) -> (Vec<NodeInput>, Vec<(NodeInput, Unmergeable)>) {
    let mut bad = Vec::new();
    let mut own: Vec<(usize, NodeInput)> = Vec::with_capacity(inputs.len());
    for (i, inp) in inputs.into_iter().enumerate() {
        match &inp.snapshot.fleet {
            Some(f) => {
                let nodes = f.nodes.len();
                bad.push((inp, Unmergeable::AlreadyMerged { nodes }));
            }
            None => own.push((i, inp)),
        }
    }
    // those that answer as the node asked for first: they win a tie
    own.sort_by_key(|(i, inp)| (!answers_as_asked(inp), *i));
    let mut kept: Vec<(usize, NodeInput)> = Vec::with_capacity(own.len());
    for (i, inp) in own {
        match kept.iter().find(|(_, k)| same_node(k, &inp)) {
            Some((_, k)) => {
                let kept = k.source.clone();
                let why = match k.snapshot.node {
                    Some(_) => Unmergeable::SameNode {
                        kept,
                        name: node_name(k),
                    },
                    None => Unmergeable::SameSnapshot { kept },
                };
                bad.push((inp, why));
            }
            None => kept.push((i, inp)),
        }
    }
    kept.sort_by_key(|(i, _)| *i);
    (kept.into_iter().map(|(_, k)| k).collect(), bad)
}

fn node_name(inp: &NodeInput) -> String {
    inp.snapshot
        .node
        .as_ref()
        .map_or_else(String::new, |n| n.name.clone())
}

/// Whether its snapshot names the node it was asked of (always, when nobody asked).
fn answers_as_asked(inp: &NodeInput) -> bool {
    inp.name.as_ref().is_none_or(|n| *n == node_name(inp))
}

/// One node by identity; without one on either side (a one-shot bundle), one snapshot
/// twice: the same time taken, components and processes.
fn same_node(a: &NodeInput, b: &NodeInput) -> bool {
    let (x, y) = (&a.snapshot, &b.snapshot);
    match (&x.node, &y.node) {
        (Some(m), Some(n)) => m.same_node(n),
        (None, None) => {
            x.taken_at == y.taken_at
                && x.components.len() == y.components.len()
                && x.components
                    .iter()
                    .zip(&y.components)
                    .all(|(c, d)| c.id == d.id && c.pids == d.pids)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{FleetInfo, NodeIdentity, Snapshot};

    fn input(asked: &str, answers_as: &str, merged: bool) -> NodeInput {
        let mut s: Snapshot = serde_json::from_value(serde_json::json!({
            "schema": "wedgewatch.snapshot/1", "taken_at": "t", "window_ms": 1.0,
            "sources": {}, "components": [], "requests": [], "gpus": [], "threads": [],
            "findings": []}))
        .unwrap();
        s.node = Some(NodeIdentity {
            name: answers_as.into(),
            hostname: None,
            machine_id: Some(format!("m-{answers_as}")),
            boot_id: Some(format!("b-{answers_as}")),
            addresses: Vec::new(),
            clock: None,
        });
        if merged {
            s.fleet = Some(FleetInfo::default());
        }
        NodeInput {
            source: format!("node {asked}"),
            snapshot: s,
            name: Some(asked.into()),
            collected: None,
        }
    }

    #[test]
    fn the_node_answering_as_asked_is_kept_and_the_order_too() {
        let (kept, bad) = screen(vec![
            input("imp", "a", false),
            input("a", "a", false),
            input("m", "m", true),
            input("b", "b", false),
        ]);
        let names: Vec<_> = kept.iter().map(|k| k.source.as_str()).collect();
        assert_eq!(names, ["node a", "node b"]);
        let bad: Vec<_> = bad.iter().map(|(i, w)| (i.source.as_str(), w)).collect();
        assert_eq!(
            bad,
            [
                ("node m", &Unmergeable::AlreadyMerged { nodes: 0 }),
                (
                    "node imp",
                    &Unmergeable::SameNode {
                        kept: "node a".into(),
                        name: "a".into()
                    }
                ),
            ]
        );
        // nobody asked (merge of files): the first is kept
        let mut x = input("x", "a", false);
        let mut y = input("y", "a", false);
        (x.name, y.name) = (None, None);
        let (kept, bad) = screen(vec![x, y]);
        assert_eq!(kept[0].source, "node x");
        assert_eq!(bad[0].0.source, "node y");
    }
}
