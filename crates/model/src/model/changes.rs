//! What changed between two sets of component facts, below every layer that reports it:
//! [`changes`] (the one comparison: `diff` of two snapshots, the daemon's and a replay's
//! baselines, and through those the `config_changed` detector), which changes are
//! configuration changes, and the one plain rendering of a change.
//!
//! Components are matched by id, which discovery builds from role + listen address (never
//! the pid), so a restarted engine is the same component. Stored values are compared as
//! `model::masked` says: masks of secrets made under different keys are not a change, and
//! no mask leaves in a `Change` (it shows as `<redacted>`).

use super::facts::ComponentFacts;
use super::masked::{same, unmask};
use super::{Change, Role};
use std::collections::{BTreeMap, BTreeSet};

/// Field names of the contract, in reporting order: what someone changed on purpose
/// (env, cmdline, version, config), then consequences (topology, process restarts).
pub const FIELD_ORDER: [&str; 6] = ["env", "cmdline", "version", "config", "topology", "process"];

/// A field's place in [`FIELD_ORDER`] (unknown fields last).
pub fn field_rank(f: &str) -> usize {
    FIELD_ORDER
        .iter()
        .position(|x| *x == f)
        .unwrap_or(FIELD_ORDER.len())
}

/// Whether a change is a configuration change: env, cmdline, version or config (restarts and
/// topology changes are consequences, reported elsewhere).
pub fn is_config_change(c: &Change) -> bool {
    field_rank(&c.field) < 4
}

/// One change as a line without colour: `+ env SGLANG_X=1`.
pub fn render_change_plain(c: &Change) -> String {
    let key = c.key.as_deref().unwrap_or("");
    match (c.field.as_str(), &c.before, &c.after) {
        ("topology", None, Some(_)) if key == "component" => "+ component appeared".into(),
        ("topology", Some(_), None) if key == "component" => "- component gone".into(),
        ("process", Some(b), Some(a)) => format!("~ process restarted: {b} -> {a}"),
        (f, None, Some(a)) => format!("+ {f} {key}={a}"),
        (f, Some(b), None) => format!("- {f} {key} (was {b})"),
        (f, Some(b), Some(a)) => format!("~ {f} {key}: {b} -> {a}"),
        (f, None, None) => format!("? {f} {key}"),
    }
}

/// Every change from `before` (the baseline) to `after`: per matched component its env,
/// command line (flag by flag), executable and version, role and listen set, and a restart
/// (process identity); components that appeared, then those gone (field `topology`, key
/// `component`). In `after`'s order; callers that report choose their own order.
pub fn changes(before: &[ComponentFacts], after: &[ComponentFacts]) -> Vec<Change> {
    let before_of = match_components(before, after);
    let mut out = Vec::new();
    for (a, matched) in after.iter().zip(&before_of) {
        match matched {
            Some(b) => compare(&before[*b], a, &mut out),
            None => out.push(presence(a, None, Some(a.id.clone()))),
        }
    }
    let matched: BTreeSet<usize> = before_of.iter().flatten().copied().collect();
    for (i, b) in before.iter().enumerate() {
        if !matched.contains(&i) {
            out.push(presence(b, Some(b.id.clone()), None));
        }
    }
    out
}

/// For each `after` component, the index of the `before` component it is: the one with its
/// id, else (an id scheme change) an unmatched one with the same role and listen set.
fn match_components(before: &[ComponentFacts], after: &[ComponentFacts]) -> Vec<Option<usize>> {
    let mut before_of: Vec<Option<usize>> = vec![None; after.len()];
    let by_id: BTreeMap<&str, usize> = after
        .iter()
        .enumerate()
        .rev() // the first of equal ids wins
        .map(|(i, c)| (c.id.as_str(), i))
        .collect();
    let mut unmatched = Vec::new();
    for (i, b) in before.iter().enumerate() {
        match by_id.get(b.id.as_str()) {
            Some(&a) if before_of[a].is_none() => before_of[a] = Some(i),
            _ => unmatched.push(i),
        }
    }
    for i in unmatched {
        let Some(key) = loose_key(&before[i]) else {
            continue;
        };
        let found = (0..after.len())
            .find(|&a| before_of[a].is_none() && loose_key(&after[a]).as_ref() == Some(&key));
        if let Some(a) = found {
            before_of[a] = Some(i);
        }
    }
    before_of
}

/// Key for matching components that have no common id: role + listen set.
fn loose_key(c: &ComponentFacts) -> Option<(Role, Vec<String>)> {
    if c.listen.is_empty() {
        return None;
    }
    let mut l = c.listen.clone();
    l.sort();
    Some((c.role, l))
}

/// A change of `c`'s presence: appeared (`before` None) or gone (`after` None).
fn presence(c: &ComponentFacts, before: Option<String>, after: Option<String>) -> Change {
    Change {
        component: c.id.clone(),
        role: c.role,
        field: "topology".into(),
        key: Some("component".into()),
        before,
        after,
    }
}

/// A change of component `c` (the newer side); stored masks leave as `<redacted>`.
fn change(
    c: &ComponentFacts,
    field: &str,
    key: Option<&str>,
    before: Option<&str>,
    after: Option<&str>,
) -> Change {
    Change {
        component: c.id.clone(),
        role: c.role,
        field: field.into(),
        key: key.map(str::to_string),
        before: before.map(unmask),
        after: after.map(unmask),
    }
}

/// Whether two stored values differ (masks under different keys do not).
fn differs(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => !same(a, b),
        (a, b) => a != b,
    }
}

fn lists_differ(a: &[String], b: &[String]) -> bool {
    a.len() != b.len() || a.iter().zip(b).any(|(x, y)| !same(x, y))
}

/// All changes of one component present on both sides (`a` before, `b` after). A side that
/// read empty is unknown, not changed: an exiting process's cmdline and environ read empty
/// and its exe link is gone, and no running process has an empty command line.
fn compare(a: &ComponentFacts, b: &ComponentFacts, out: &mut Vec<Change>) {
    if !a.env.is_empty() && !b.env.is_empty() {
        env_changes(a, b, out);
    }
    if !a.cmdline.is_empty() && !b.cmdline.is_empty() {
        cmdline_changes(a, b, out);
    }
    let exe_known = a.exe.is_some() && b.exe.is_some();
    if exe_known && differs(a.exe.as_deref(), b.exe.as_deref()) {
        out.push(change(
            b,
            "version",
            Some("exe"),
            a.exe.as_deref(),
            b.exe.as_deref(),
        ));
    }
    // a version label, when a source provides one (model changes show as cmdline flags)
    if differs(a.version.as_deref(), b.version.as_deref()) {
        let (x, y) = (a.version.as_deref(), b.version.as_deref());
        out.push(change(b, "version", Some("version"), x, y));
    }
    topology_changes(a, b, out);
    if a.identity.is_some() && b.identity.is_some() && a.identity != b.identity {
        let (x, y) = (started(a), started(b));
        out.push(change(b, "process", Some("restarted"), Some(&x), Some(&y)));
    }
}

/// How a restart names the process on each side.
fn started(c: &ComponentFacts) -> String {
    format!(
        "pid {} started {}",
        c.main_pid.map_or("?".into(), |p| p.to_string()),
        c.started_at_ms.map_or("?".into(), crate::clock::rfc3339)
    )
}

fn env_changes(a: &ComponentFacts, b: &ComponentFacts, out: &mut Vec<Change>) {
    let keys: BTreeSet<&String> = a.env.keys().chain(b.env.keys()).collect();
    for k in keys {
        let (x, y) = (
            a.env.get(k).map(String::as_str),
            b.env.get(k).map(String::as_str),
        );
        if differs(x, y) {
            out.push(change(b, "env", Some(k), x, y));
        }
    }
}

/// The command line flag by flag (`--flag value`, `--flag=value`) and its positional
/// arguments; the whole line when only order or spacing changed.
fn cmdline_changes(a: &ComponentFacts, b: &ComponentFacts, out: &mut Vec<Change>) {
    if !lists_differ(&a.cmdline, &b.cmdline) {
        return;
    }
    let (fa, pa) = split_args(&a.cmdline);
    let (fb, pb) = split_args(&b.cmdline);
    let keys: BTreeSet<&String> = fa.keys().chain(fb.keys()).collect();
    let mut any = false;
    for k in keys {
        let (x, y) = (fa.get(k).map(String::as_str), fb.get(k).map(String::as_str));
        if differs(x, y) {
            any = true;
            out.push(change(b, "cmdline", Some(k), x, y));
        }
    }
    if lists_differ(&pa, &pb) {
        any = true;
        let (x, y) = (pa.join(" "), pb.join(" "));
        out.push(change(b, "cmdline", Some("positional"), Some(&x), Some(&y)));
    }
    if !any {
        let (x, y) = (a.cmdline.join(" "), b.cmdline.join(" "));
        out.push(change(b, "cmdline", None, Some(&x), Some(&y)));
    }
}

/// `--flag value` / `--flag=value` pairs and positional arguments of a command line.
fn split_args(args: &[String]) -> (BTreeMap<String, String>, Vec<String>) {
    let mut flags = BTreeMap::new();
    let mut positional = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if a.starts_with("--") && a.len() > 2 {
            if let Some((k, v)) = a.split_once('=') {
                flags.insert(k.to_string(), v.to_string());
                i += 1;
                continue;
            }
            let mut vals = Vec::new();
            let mut j = i + 1;
            while j < args.len() && !args[j].starts_with("--") {
                vals.push(args[j].clone());
                j += 1;
            }
            flags.insert(a.clone(), vals.join(" "));
            i = j;
        } else {
            positional.push(a.clone());
            i += 1;
        }
    }
    (flags, positional)
}

/// Role or stack, and the listen set, of a component present on both sides.
fn topology_changes(a: &ComponentFacts, b: &ComponentFacts, out: &mut Vec<Change>) {
    if a.role != b.role || a.stack != b.stack {
        let (x, y) = (
            format!("{} ({})", a.role, a.stack),
            format!("{} ({})", b.role, b.stack),
        );
        out.push(change(b, "topology", Some("role"), Some(&x), Some(&y)));
    }
    let (la, lb): (BTreeSet<&String>, BTreeSet<&String>) =
        (a.listen.iter().collect(), b.listen.iter().collect());
    if la != lb {
        let (x, y) = (a.listen.join(", "), b.listen.join(", "));
        out.push(change(b, "topology", Some("listen"), Some(&x), Some(&y)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(id: &str, env: &[(&str, &str)], cmdline: &[&str], identity: &str) -> ComponentFacts {
        ComponentFacts {
            id: id.into(),
            role: Role::Decode,
            stack: "sglang".into(),
            main_pid: Some(7),
            identity: Some(identity.into()),
            started_at_ms: Some(1_795_963_857_073),
            exe: Some("/usr/bin/python3".into()),
            cmdline: cmdline.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            listen: vec![id.rsplit('@').next().unwrap_or("").to_string()],
            version: None,
        }
    }

    #[test]
    fn flags_env_restart_and_presence() {
        let d = "decode@127.0.0.1:2";
        let a = vec![
            facts(d, &[("A", "1")], &["x", "--port", "1"], "7:1"),
            facts("decode@127.0.0.1:3", &[], &[], "8:1"),
        ];
        let b = vec![
            facts(d, &[("A", "1"), ("B", "2")], &["x", "--port", "9"], "7:2"),
            facts("decode@127.0.0.1:4", &[], &[], "9:1"),
        ];
        let lines: Vec<String> = changes(&a, &b).iter().map(render_change_plain).collect();
        assert_eq!(
            lines,
            vec![
                "+ env B=2",
                "~ cmdline --port: 1 -> 9",
                "~ process restarted: pid 7 started 2026-11-29T14:50:57.073Z -> pid 7 started 2026-11-29T14:50:57.073Z",
                "+ component appeared",
                "- component gone",
            ]
        );
    }

    #[test]
    fn masks_under_other_keys_are_no_change_and_never_leave() {
        let d = "decode@127.0.0.1:2";
        let (m1, m2) = (
            "<redacted:00000001:0000000000000001>",
            "<redacted:00000002:0000000000000002>",
        );
        let m3 = "<redacted:00000001:0000000000000003>";
        let a = vec![facts(
            d,
            &[("HF_TOKEN", m1)],
            &["x", "--api-key", m1],
            "7:1",
        )];
        let other_key = vec![facts(
            d,
            &[("HF_TOKEN", m2)],
            &["x", "--api-key", m2],
            "7:1",
        )];
        assert!(changes(&a, &other_key).is_empty());
        let changed = vec![facts(
            d,
            &[("HF_TOKEN", m3)],
            &["x", "--api-key", m3],
            "7:1",
        )];
        let ch = changes(&a, &changed);
        assert_eq!(ch.len(), 2, "{ch:#?}");
        assert!(ch
            .iter()
            .all(|c| c.before.as_deref() == Some(super::super::REDACTED)
                && c.after.as_deref() == Some(super::super::REDACTED)));
    }

    #[test]
    fn an_exiting_process_read_empty_is_unknown_not_changed() {
        let d = "decode@127.0.0.1:2";
        let a = vec![facts(d, &[("A", "1")], &["VLLM::EngineCore"], "7:1")];
        let mut exiting = facts(d, &[], &[], "7:1");
        exiting.exe = None;
        assert!(changes(&a, &[exiting.clone()]).is_empty());
        assert!(changes(&[exiting], &a).is_empty());
        let changed = vec![facts(d, &[("A", "2")], &["VLLM::EngineCore", "x"], "7:1")];
        assert_eq!(changes(&a, &changed).len(), 2, "both sides read: compared");
    }

    #[test]
    fn an_id_scheme_change_matches_by_role_and_listen() {
        let a = vec![facts("old-id@127.0.0.1:2", &[], &[], "7:1")];
        let b = vec![facts("decode@127.0.0.1:2", &[], &[], "7:1")];
        assert!(changes(&a, &b).is_empty());
    }
}
