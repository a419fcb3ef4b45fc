//! The topology (components, config edges) and the GPUs.

use super::md::{code, details, esc, id_cell, join, table};
use crate::model::Snapshot;

fn components(s: &Snapshot) -> String {
    let rows: Vec<Vec<String>> = s
        .components
        .iter()
        .map(|c| {
            vec![
                id_cell(&c.id),
                c.role.to_string(),
                esc(&c.stack),
                join(&c.pids),
                esc(&join(&c.listen)),
                join(&c.gpus),
                c.parent.as_deref().map(id_cell).unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &[
            "component",
            "role",
            "stack",
            "pids",
            "listen",
            "GPUs",
            "parent",
        ],
        &rows,
    )
}

fn edges(s: &Snapshot) -> String {
    if s.edges.is_empty() {
        return String::new();
    }
    let mut o = String::from("\nEdges:\n\n");
    for e in &s.edges {
        let conns = e
            .connections
            .map(|n| format!(", {n} connections"))
            .unwrap_or_default();
        o.push_str(&format!(
            "- {} -> {} ({}{conns})\n",
            code(&e.from),
            code(&e.to),
            esc(&format!("{:?}", e.origin))
        ));
    }
    o
}

/// Connections to the components' channels: KV transfer streams and bootstrap sessions,
/// which are not requests.
fn channels(s: &Snapshot) -> String {
    if s.channels.is_empty() {
        return String::new();
    }
    let mut o = String::from("\nChannels (connections that are not requests):\n\n");
    for f in &s.channels {
        let from = f.from.as_deref().map(code).unwrap_or_else(|| "?".into());
        let idle = f
            .idle_ms
            .map(|ms| format!(", idle {:.1} s", ms as f64 / 1000.0))
            .unwrap_or_default();
        o.push_str(&format!(
            "- {from} -> {} {}: {} connections, {} B in, {} B out{idle}\n",
            code(&f.to),
            f.kind,
            f.connections,
            f.bytes_in,
            f.bytes_out,
        ));
    }
    o
}

pub fn section(s: &Snapshot) -> String {
    let body = format!("{}{}{}", components(s), edges(s), channels(s));
    details(
        &format!("Topology: {} components", s.components.len()),
        &body,
    )
}

pub fn gpus(s: &Snapshot) -> String {
    if s.gpus.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = s
        .gpus
        .iter()
        .map(|g| {
            let procs: Vec<String> = g
                .processes
                .iter()
                .map(|p| match &p.component {
                    Some(c) => format!("{} ({c})", p.pid),
                    None => p.pid.to_string(),
                })
                .collect();
            vec![
                g.index.to_string(),
                esc(&g.name),
                g.util_pct
                    .map(|u| format!("{u:.0} %"))
                    .unwrap_or("?".into()),
                g.power_w.map(|p| format!("{p:.0} W")).unwrap_or("?".into()),
                esc(g.activity.as_deref().unwrap_or("")),
                esc(&procs.join(", ")),
            ]
        })
        .collect();
    details(
        &format!("GPUs: {}", s.gpus.len()),
        &table(
            &["GPU", "name", "util", "power", "activity", "processes"],
            &rows,
        ),
    )
}
