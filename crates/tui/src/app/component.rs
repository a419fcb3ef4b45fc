//! What the Components tab says about one component, as a list of lines that do not depend
//! on the screen width (each is cut, never wrapped, when drawn), so the app can scroll over
//! them without knowing the screen: its name, what changed against the baseline, identity,
//! versions, the environment the stack profile marks relevant, the command line one option a
//! line.
//!
//! The full environment is not listed: 40-odd variables (PATH, HOME, ...) would bury the one
//! that changed. It stays in `snapshot.json`.

use crate::model::{SnapComponent, Snapshot};
use std::collections::BTreeMap;

/// One line of a component's detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fact {
    /// A section title.
    Heading(String),
    /// `key  value`.
    Pair(String, String),
    /// A change against the baseline: field, key, before, after.
    Change {
        field: String,
        key: String,
        before: Option<String>,
        after: Option<String>,
    },
    /// Plain text (a command-line option, "none").
    Text(String),
}

/// A string map the snapshot may carry under `field` of `value`, read through JSON so the
/// tab works on snapshots with and without it: versions and relevant variables come from
/// newer snapshots (package metadata read on disk), and older ones have none.
fn carried_map(value: &serde_json::Value, field: &str) -> BTreeMap<String, String> {
    value
        .get(field)
        .and_then(|v| v.as_object())
        .map(|o| {
            o.iter()
                .map(|(k, v)| {
                    let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    (k.clone(), v)
                })
                .collect()
        })
        .unwrap_or_default()
}

fn carried_list(value: &serde_json::Value, field: &str) -> Vec<String> {
    value
        .get(field)
        .and_then(|v| v.as_array())
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The command line, one option with its value per line (`--tp 8`), so a long one is read
/// by scrolling instead of being cut at the screen's edge.
fn cmdline_lines(cmdline: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for arg in cmdline {
        let joins_previous = !arg.starts_with('-')
            && out
                .last()
                .is_some_and(|l| l.starts_with('-') && !l.contains(' ') && !l.contains('='));
        match out.last_mut() {
            Some(last) if joins_previous => {
                last.push(' ');
                last.push_str(arg);
            }
            _ => out.push(arg.clone()),
        }
    }
    out
}

/// Identity: role, stack, pids, start, executable, listening addresses, GPUs.
fn identity(c: &SnapComponent) -> Vec<Fact> {
    let pair = |k: &str, v: String| Fact::Pair(k.to_string(), v);
    let mut out = vec![
        Fact::Heading(format!("{} ({}, stack {})", c.id, c.role, c.stack)),
        pair(
            "pid",
            format!(
                "{} (all: {})",
                c.main_pid.map_or("-".into(), |p| p.to_string()),
                c.pids
                    .iter()
                    .map(i32::to_string)
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
        ),
        pair("started", c.started_at.clone().unwrap_or("-".into())),
    ];
    if let Some(exe) = &c.exe {
        out.push(pair("exe", exe.clone()));
    }
    if !c.listen.is_empty() {
        out.push(pair("listen", c.listen.join(" ")));
    }
    if let Some(p) = &c.parent {
        out.push(pair("parent", p.clone()));
    }
    if let Some(k) = &c.container {
        out.push(pair("container", k.clone()));
    }
    if !c.gpus.is_empty() {
        let gpus: Vec<String> = c.gpus.iter().map(|g| format!("GPU{g}")).collect();
        out.push(pair("gpus", gpus.join(" ")));
    }
    out
}

/// Every line of the detail of `c` in `s`.
pub fn component_facts(s: &Snapshot, c: &SnapComponent) -> Vec<Fact> {
    let json = serde_json::to_value(c).unwrap_or_default();
    let mut ident = identity(c).into_iter();
    // Its name, then what changed (the reason to open a component at 80x24), then the rest.
    let mut out: Vec<Fact> = ident.next().into_iter().collect();
    out.push(Fact::Heading("changes against the baseline".into()));
    let changes: Vec<Fact> = s
        .config_changed
        .iter()
        .filter(|ch| ch.component == c.id)
        .map(|ch| Fact::Change {
            field: ch.field.clone(),
            key: ch.key.clone().unwrap_or_default(),
            before: ch.before.clone(),
            after: ch.after.clone(),
        })
        .collect();
    if changes.is_empty() {
        out.push(Fact::Text("none (or no baseline was taken)".into()));
    }
    out.extend(changes);
    out.push(Fact::Heading("identity".into()));
    out.extend(ident);
    out.push(Fact::Heading("versions".into()));
    let versions = carried_map(&json, "versions");
    if versions.is_empty() {
        out.push(Fact::Text("not in this snapshot".into()));
    }
    out.extend(versions.into_iter().map(|(k, v)| Fact::Pair(k, v)));
    let relevant = carried_list(&json, "relevant_env");
    if !relevant.is_empty() {
        out.push(Fact::Heading(
            "environment the stack profile marks relevant".into(),
        ));
        for name in relevant {
            let value = c.env.get(&name).cloned().unwrap_or("(unset)".into());
            out.push(Fact::Pair(name, value));
        }
    }
    out.push(Fact::Heading(format!(
        "command line ({} variables in the environment: snapshot.json has them all)",
        c.env.len()
    )));
    out.extend(cmdline_lines(&c.cmdline).into_iter().map(Fact::Text));
    out
}

/// The host-wide versions a snapshot may carry (`wedgewatch`, kernel, driver, CUDA; see
/// `carried_map`), with the tool's own version when those are absent. Serializes the whole
/// snapshot: call once per frame, not per draw.
pub fn host_versions(s: &Snapshot) -> BTreeMap<String, String> {
    let json = serde_json::to_value(s).unwrap_or_default();
    let mut out = carried_map(&json, "versions");
    if let Some(v) = s.tool.get("version") {
        out.entry("wedgewatch".into()).or_insert_with(|| v.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_keep_their_values_on_one_line() {
        let args: Vec<String> = [
            "python3",
            "-m",
            "sglang.launch_server",
            "--tp",
            "8",
            "--enable-metrics",
            "--port=30000",
            "--host",
            "0.0.0.0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            cmdline_lines(&args),
            [
                "python3",
                "-m sglang.launch_server",
                "--tp 8",
                "--enable-metrics",
                "--port=30000",
                "--host 0.0.0.0"
            ]
        );
    }

    #[test]
    fn versions_show_when_the_snapshot_carries_them() {
        let json = serde_json::json!({"versions": {"sglang": "0.5.4", "python": "3.11.9"}});
        let v = carried_map(&json, "versions");
        assert_eq!(v.get("sglang").map(String::as_str), Some("0.5.4"));
        assert!(carried_map(&serde_json::json!({}), "versions").is_empty());
    }
}
