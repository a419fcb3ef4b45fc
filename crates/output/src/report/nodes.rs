//! Which node(s) the snapshot is of. A merged snapshot (`merge`, `fleet snapshot`): every
//! node with its addresses, when it was taken and how its clock compares with the first
//! node's, the nodes left out and why, the hops joined across nodes and what could not be
//! joined. A one-node snapshot: the node in one line.

use super::md::{code, esc, table};
use crate::model::{FleetInfo, NodeIdentity, Snapshot};

pub fn section(s: &Snapshot) -> String {
    match (&s.fleet, &s.node) {
        (Some(f), _) => fleet(f),
        (None, Some(n)) => format!("Node: {}.\n\n", one_node(n)),
        (None, None) => String::new(),
    }
}

fn one_node(n: &NodeIdentity) -> String {
    let mut o = code(&n.name);
    if let Some(h) = n.hostname.as_deref().filter(|h| *h != n.name) {
        o.push_str(&format!(" (host {})", esc(h)));
    }
    if !n.addresses.is_empty() {
        o.push_str(&format!(", {}", esc(&n.addresses.join(" "))));
    }
    o
}

fn skew_text(n: &crate::model::FleetNode, first: bool) -> String {
    match (first, n.skew_ms, n.skew_error_ms) {
        (true, _, _) => "reference".to_string(),
        (false, Some(s), Some(e)) => format!("{s:+} ms ± {e} ms"),
        (false, Some(s), None) => format!("{s:+} ms"),
        _ => "unknown".to_string(),
    }
}

fn fleet(f: &FleetInfo) -> String {
    let rows: Vec<Vec<String>> = f
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let addrs = n
                .identity
                .as_ref()
                .map(|id| id.addresses.join(" "))
                .unwrap_or_default();
            vec![
                esc(&n.name),
                esc(&addrs),
                esc(&n.taken_at),
                esc(&skew_text(n, i == 0)),
                esc(n.skew_basis.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    let mut o = format!("\n## Nodes ({})\n\n", f.nodes.len());
    o.push_str(&table(
        &["node", "addresses", "taken at", "clock vs the first", "how"],
        &rows,
    ));
    for x in &f.failed {
        o.push_str(&format!(
            "- **left out:** {}: {}\n",
            code(&x.name),
            esc(&x.reason)
        ));
    }
    let joined: usize = f.links.iter().map(|l| l.exchanges.len()).sum();
    o.push_str(&format!(
        "- {} connection(s) joined across nodes by TCP 4-tuple ({joined} exchanges)\n",
        f.links.len()
    ));
    for n in &f.notes {
        o.push_str(&format!("- not joined: {}\n", esc(n)));
    }
    o.push('\n');
    o
}
