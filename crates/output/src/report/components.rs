//! One folded block per component: its facts, processes, command line and the part of its
//! environment worth reading (changes against the baseline and the variables its stack
//! profile marks relevant; the whole environment stays in `snapshot.json`).

use super::md::{code, details, esc, fenced, human_bytes};
use crate::model::{Change, SnapComponent, Snapshot};
use serde_json::Value;
use std::collections::HashMap;

/// What the blocks look up, indexed once: a snapshot may hold many components.
pub struct Index<'a> {
    by_id: HashMap<&'a str, &'a SnapComponent>,
    env_changes: HashMap<&'a str, Vec<&'a Change>>,
}

impl<'a> Index<'a> {
    pub fn new(s: &'a Snapshot) -> Self {
        let mut by_id = HashMap::with_capacity(s.components.len());
        for c in &s.components {
            by_id.entry(c.id.as_str()).or_insert(c);
        }
        let mut env_changes: HashMap<&str, Vec<&Change>> = HashMap::new();
        for x in s.config_changed.iter().filter(|x| x.field == "env") {
            env_changes.entry(x.component.as_str()).or_default().push(x);
        }
        Index { by_id, env_changes }
    }
}

fn facts(c: &SnapComponent) -> String {
    let mut o = format!("- role **{}**, stack {}\n", c.role, esc(&c.stack));
    if let Some(t) = &c.title {
        o.push_str(&format!("- title {}\n", code(t)));
    }
    o.push_str(&format!(
        "- main pid {}, started {}\n",
        c.main_pid.map(|p| p.to_string()).unwrap_or("?".into()),
        esc(c.started_at.as_deref().unwrap_or("?"))
    ));
    if let Some(e) = &c.exe {
        o.push_str(&format!("- executable {}\n", code(e)));
    }
    // where a containerised component lives and is scraped
    if let Some(k) = &c.container {
        o.push_str(&format!("- container {}\n", code(k)));
    }
    if let Some(ns) = c.netns {
        o.push_str(&format!(
            "- network namespace `net:[{ns}]` (its listen addresses are inside it; scraped there)\n"
        ));
    }
    if let Some(a) = &c.gpu_activity {
        o.push_str(&format!("- GPU activity: {}\n", esc(a)));
    }
    if !c.sockets.is_empty() {
        let v: Vec<String> = c.sockets.iter().map(|(k, v)| format!("{k} {v}")).collect();
        o.push_str(&format!("- sockets: {}\n", esc(&v.join(", "))));
    }
    if !c.metrics.is_empty() {
        let v: Vec<String> = c.metrics.iter().map(|(k, v)| format!("{k}={v}")).collect();
        o.push_str(&format!("- metrics: {}\n", esc(&v.join(", "))));
    }
    if !c.labels.is_empty() {
        let l: Vec<String> = c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        o.push_str(&format!("- labels: {}\n", code(&l.join(" "))));
    }
    o
}

/// A number of a process's facts (untyped in the snapshot, so possibly anything): a number
/// as is, anything else escaped.
fn fact(v: &Value) -> String {
    match v {
        Value::Number(n) => n.to_string(),
        Value::Null => "?".into(),
        other => esc(&other.to_string()),
    }
}

fn process_line(p: &Value) -> String {
    let g = |k: &str| p.get(k).cloned().unwrap_or(Value::Null);
    let threads = g("threads").as_array().map(|a| a.len());
    let nspid = g("nspid")
        .as_array()
        .filter(|a| a.len() > 1)
        .map(|a| a.iter().map(fact).collect::<Vec<_>>().join(", "))
        .map(|ids| format!(", NSpid {ids}"))
        .unwrap_or_default();
    let mut o = format!(
        "- pid {}: state {}, {} threads, {} fds, cpu {} ms, rss {}{nspid}\n",
        fact(&g("pid")),
        esc(g("state").as_str().unwrap_or("?")),
        threads.map(|n| n.to_string()).unwrap_or("?".into()),
        fact(&g("fd_count")),
        fact(&g("cpu_time_ms")),
        g("rss_bytes")
            .as_u64()
            .map(human_bytes)
            .unwrap_or("?".into()),
    );
    for e in g("errors").as_array().into_iter().flatten() {
        let f = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("?").to_string();
        o.push_str(&format!(
            "  - could not read {}: {}\n",
            esc(&f("field")),
            esc(&f("reason"))
        ));
    }
    o
}

/// The environment worth showing: changed variables and the relevant ones.
fn environment(ix: &Index, c: &SnapComponent) -> String {
    if c.env.is_empty() {
        return String::new();
    }
    let changed: Vec<String> = ix
        .env_changes
        .get(c.id.as_str())
        .into_iter()
        .flatten()
        .filter_map(|x| {
            let k = x.key.as_deref()?;
            let b = x.before.as_deref().unwrap_or("(absent)");
            let a = x.after.as_deref().unwrap_or("(absent)");
            Some(format!("{k}: {b} -> {a}"))
        })
        .collect();
    let relevant: Vec<String> = c
        .relevant_env
        .iter()
        .filter_map(|k| c.env.get(k).map(|v| format!("{k}={v}")))
        .collect();
    let mut o = format!(
        "\n- environment: {} variables (all in `snapshot.json`)",
        c.env.len()
    );
    if changed.is_empty() && relevant.is_empty() {
        o.push_str("; none changed, none marked relevant by its stack profile\n");
        return o;
    }
    o.push_str("\n\n");
    if !changed.is_empty() {
        o.push_str("Changed since the baseline:\n\n");
        o.push_str(&fenced(&changed.join("\n")));
        o.push('\n');
    }
    if !relevant.is_empty() {
        o.push_str("Relevant to its stack:\n\n");
        o.push_str(&fenced(&relevant.join("\n")));
    }
    o
}

/// A component's block.
pub fn component(ix: &Index, c: &SnapComponent) -> String {
    let mut body = facts(c);
    for p in &c.processes {
        body.push_str(&process_line(p));
    }
    if !c.cmdline.is_empty() {
        body.push_str("\nCommand line:\n\n");
        body.push_str(&fenced(&c.cmdline.join(" ")));
    }
    let parent = c.parent.as_deref().and_then(|p| ix.by_id.get(p));
    match parent.filter(|p| !c.env.is_empty() && p.env == c.env) {
        Some(p) => body.push_str(&format!("\n- environment: the same as {}'s\n", code(&p.id))),
        None => body.push_str(&environment(ix, c)),
    }
    details(&format!("{} ({})", c.id, c.role), &body)
}

/// The heading of the components' blocks (alone, so each block can be cut on its own).
pub fn heading(s: &Snapshot) -> String {
    if s.components.is_empty() {
        return String::new();
    }
    format!("## Components ({})\n\n", s.components.len())
}
