//! Diff two snapshots: what changed since the baseline (env, cmdline, version, topology, process).
//!
//! Components are matched by id, which discovery builds from role + listen address (never
//! the pid), so a restarted engine is the same component. Changes a child inherits from its
//! parent (a scheduler's environment is its engine's) are reported once, on the parent.
//! Order: what someone changed on purpose comes first (env, cmdline, version, config), then
//! consequences (topology, process restarts), so an added variable on one engine is the
//! first line of the human output.

pub use crate::model::changes::render_change_plain;
use crate::model::{Change, DiffReport, Role, SnapComponent, Snapshot, DIFF_SCHEMA};
use std::collections::{BTreeMap, BTreeSet};

/// Field names of the contract, in reporting order.
const FIELD_ORDER: [&str; 6] = ["env", "cmdline", "version", "config", "topology", "process"];

fn field_rank(f: &str) -> usize {
    FIELD_ORDER
        .iter()
        .position(|x| *x == f)
        .unwrap_or(FIELD_ORDER.len())
}

fn change(
    c: &SnapComponent,
    field: &str,
    key: Option<String>,
    before: Option<String>,
    after: Option<String>,
) -> Change {
    Change {
        component: c.id.clone(),
        role: c.role,
        field: field.into(),
        key,
        before,
        after,
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

fn diff_component(a: &SnapComponent, b: &SnapComponent, out: &mut Vec<Change>) {
    // environment
    let keys: BTreeSet<&String> = a.env.keys().chain(b.env.keys()).collect();
    for k in keys {
        let (x, y) = (a.env.get(k), b.env.get(k));
        if x != y {
            out.push(change(b, "env", Some(k.clone()), x.cloned(), y.cloned()));
        }
    }
    // command line, flag by flag when both parse
    if a.cmdline != b.cmdline {
        let (fa, pa) = split_args(&a.cmdline);
        let (fb, pb) = split_args(&b.cmdline);
        let keys: BTreeSet<&String> = fa.keys().chain(fb.keys()).collect();
        let mut any = false;
        for k in keys {
            if fa.get(k) != fb.get(k) {
                any = true;
                out.push(change(
                    b,
                    "cmdline",
                    Some(k.clone()),
                    fa.get(k).cloned(),
                    fb.get(k).cloned(),
                ));
            }
        }
        if pa != pb {
            any = true;
            out.push(change(
                b,
                "cmdline",
                Some("positional".into()),
                Some(pa.join(" ")),
                Some(pb.join(" ")),
            ));
        }
        if !any {
            // same flags, different order or spacing
            out.push(change(
                b,
                "cmdline",
                None,
                Some(a.cmdline.join(" ")),
                Some(b.cmdline.join(" ")),
            ));
        }
    }
    if a.exe != b.exe {
        out.push(change(
            b,
            "version",
            Some("exe".into()),
            a.exe.clone(),
            b.exe.clone(),
        ));
    }
    // a version label, when a source provides one (model changes show as cmdline flags)
    for key in ["version"] {
        if a.labels.get(key) != b.labels.get(key) {
            out.push(change(
                b,
                "version",
                Some(key.into()),
                a.labels.get(key).cloned(),
                b.labels.get(key).cloned(),
            ));
        }
    }
    if a.role != b.role || a.stack != b.stack {
        out.push(change(
            b,
            "topology",
            Some("role".into()),
            Some(format!("{} ({})", a.role, a.stack)),
            Some(format!("{} ({})", b.role, b.stack)),
        ));
    }
    let (la, lb): (BTreeSet<&String>, BTreeSet<&String>) =
        (a.listen.iter().collect(), b.listen.iter().collect());
    if la != lb {
        out.push(change(
            b,
            "topology",
            Some("listen".into()),
            Some(a.listen.join(", ")),
            Some(b.listen.join(", ")),
        ));
    }
    if a.identity.is_some() && b.identity.is_some() && a.identity != b.identity {
        let show = |c: &SnapComponent| {
            format!(
                "pid {} started {}",
                c.main_pid.map(|p| p.to_string()).unwrap_or("?".into()),
                c.started_at.as_deref().unwrap_or("?")
            )
        };
        out.push(change(
            b,
            "process",
            Some("restarted".into()),
            Some(show(a)),
            Some(show(b)),
        ));
    }
}

type ChangeKey = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
);

fn change_key(c: &Change) -> ChangeKey {
    (
        c.component.clone(),
        c.field.clone(),
        c.key.clone(),
        c.before.clone(),
        c.after.clone(),
    )
}

/// Key for matching components that have no common id: role + listen set.
fn loose_key(c: &SnapComponent) -> Option<(Role, Vec<String>)> {
    if c.listen.is_empty() {
        return None;
    }
    let mut l = c.listen.clone();
    l.sort();
    Some((c.role, l))
}

/// Compares two snapshots. `before` is the baseline. Both go through today's redaction
/// again, with one redactor, when either was taken redacted (an older file may hold what
/// today's rules hide; a secret named in one is scrubbed from the other), and their strings
/// are neutralised, so both the JSON and the text of the diff are safe to post.
pub fn diff_snapshots(before: &Snapshot, after: &Snapshot) -> DiffReport {
    let redact = before.redacted || after.redacted;
    match crate::redact::for_output(&[before, after], redact).as_deref() {
        Some([b, a]) => diff_safe(b, a),
        _ => DiffReport {
            schema: DIFF_SCHEMA.to_string(),
            changes: Vec::new(),
            before_taken_at: None,
            after_taken_at: None,
        },
    }
}

fn diff_safe(before: &Snapshot, after: &Snapshot) -> DiffReport {
    let mut out: Vec<Change> = Vec::new();
    let by_id_b: BTreeMap<&str, &SnapComponent> = after
        .components
        .iter()
        .map(|c| (c.id.as_str(), c))
        .collect();
    let mut matched_b: BTreeSet<&str> = BTreeSet::new();
    let mut gone: Vec<&SnapComponent> = Vec::new();
    let mut pairs: Vec<(&SnapComponent, &SnapComponent)> = Vec::new();
    for a in &before.components {
        if let Some(b) = by_id_b.get(a.id.as_str()) {
            matched_b.insert(b.id.as_str());
            pairs.push((a, b));
        } else {
            gone.push(a);
        }
    }
    // second chance: same role and listen set under another id (an id scheme change)
    let mut still_gone = Vec::new();
    for a in gone {
        let found = after.components.iter().find(|b| {
            !matched_b.contains(b.id.as_str())
                && loose_key(a).is_some()
                && loose_key(a) == loose_key(b)
        });
        match found {
            Some(b) => {
                matched_b.insert(b.id.as_str());
                pairs.push((a, b));
            }
            None => still_gone.push(a),
        }
    }
    for (a, b) in &pairs {
        diff_component(a, b, &mut out);
    }
    for a in still_gone {
        out.push(change(
            a,
            "topology",
            Some("component".into()),
            Some(a.id.clone()),
            None,
        ));
    }
    for b in &after.components {
        if !matched_b.contains(b.id.as_str()) {
            out.push(change(
                b,
                "topology",
                Some("component".into()),
                None,
                Some(b.id.clone()),
            ));
        }
    }

    // a child's env/cmdline/version change that its parent has too is the parent's change
    let parent_of: BTreeMap<&str, &str> = after
        .components
        .iter()
        .chain(before.components.iter())
        .filter_map(|c| c.parent.as_deref().map(|p| (c.id.as_str(), p)))
        .collect();
    // (component, field, key, before, after) of every change, to spot inherited ones
    let parent_changes: BTreeSet<ChangeKey> = out.iter().map(change_key).collect();
    out.retain(|c| {
        if c.field == "process" || c.field == "topology" {
            return true;
        }
        match parent_of.get(c.component.as_str()) {
            Some(p) => {
                let mut k = change_key(c);
                k.0 = p.to_string();
                !parent_changes.contains(&k)
            }
            None => true,
        }
    });

    // what was changed on purpose first, consequences after; children after parents
    let depth = |id: &str| parent_of.contains_key(id) as u8;
    out.sort_by(|x, y| {
        (
            field_rank(&x.field),
            depth(&x.component),
            &x.component,
            &x.key,
        )
            .cmp(&(
                field_rank(&y.field),
                depth(&y.component),
                &y.component,
                &y.key,
            ))
    });
    DiffReport {
        schema: DIFF_SCHEMA.to_string(),
        changes: out,
        before_taken_at: Some(before.taken_at.clone()),
        after_taken_at: Some(after.taken_at.clone()),
    }
}

fn sign(c: &Change) -> char {
    match (&c.before, &c.after) {
        (None, Some(_)) => '+',
        (Some(_), None) => '-',
        _ => '~',
    }
}

/// Human output: a summary line, then changes grouped by component in report order.
/// `color`: ANSI colours (the caller decides: terminal and no `NO_COLOR`).
pub fn render_human(d: &DiffReport, color: bool) -> String {
    // The report may not come from `diff_snapshots` (a file, a test): neutralise its
    // strings here too; our own ANSI colours are added after.
    match crate::redact::for_output(&[d], false).and_then(|mut v| v.pop()) {
        Some(safe) => render_human_safe(&safe, color),
        None => "diff unavailable: it could not be made safe to print\n".into(),
    }
}

fn render_human_safe(d: &DiffReport, color: bool) -> String {
    let paint = |code: &str, s: &str| {
        if color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    };
    let mut o = String::new();
    if d.changes.is_empty() {
        o.push_str("no changes\n");
        return o;
    }
    let purposeful = d
        .changes
        .iter()
        .filter(|c| field_rank(&c.field) < 4)
        .count();
    o.push_str(&format!(
        "{} change(s): {} to configuration, {} to topology/processes ({} -> {})\n",
        d.changes.len(),
        purposeful,
        d.changes.len() - purposeful,
        d.before_taken_at.as_deref().unwrap_or("?"),
        d.after_taken_at.as_deref().unwrap_or("?")
    ));
    let mut last: Option<&str> = None;
    for c in &d.changes {
        if last != Some(c.component.as_str()) {
            o.push_str(&format!("{} ({})\n", paint("1", &c.component), c.role));
            last = Some(c.component.as_str());
        }
        let line = render_change_plain(c);
        let code = match sign(c) {
            '+' => "32",
            '-' => "31",
            _ => "33",
        };
        let code = if c.field == "env" {
            format!("1;{code}")
        } else {
            code.to_string()
        };
        o.push_str(&format!("  {}\n", paint(&code, &line)));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{REDACTED, SNAPSHOT_SCHEMA};

    fn comp(
        id: &str,
        role: Role,
        parent: Option<&str>,
        env: &[(&str, &str)],
        ident: &str,
    ) -> SnapComponent {
        SnapComponent {
            id: id.into(),
            role,
            stack: "sglang".into(),
            pids: vec![1],
            main_pid: Some(1),
            listen: vec![id.rsplit('@').next().unwrap_or("").to_string()],
            started_at: None,
            cmdline: vec![
                "python".into(),
                "-m".into(),
                "x".into(),
                "--port".into(),
                "1".into(),
            ],
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            gpus: vec![],
            parent: parent.map(str::to_string),
            title: None,
            exe: Some("/usr/bin/python3".into()),
            identity: Some(ident.into()),
            processes: vec![],
            sockets: Default::default(),
            metrics: Default::default(),
            gpu_activity: None,
            labels: Default::default(),
            versions: Default::default(),
            relevant_env: Vec::new(),
        }
    }

    fn snap(components: Vec<SnapComponent>) -> Snapshot {
        Snapshot {
            schema: SNAPSHOT_SCHEMA.into(),
            taken_at: "2026-11-29T12:00:00.000Z".into(),
            window_ms: 0.0,
            sources: Default::default(),
            components,
            requests: vec![],
            gpus: vec![],
            threads: vec![],
            findings: vec![],
            edges: vec![],
            redacted: true,
            config_changed: vec![],
            tool: Default::default(),
            versions: Default::default(),
        }
    }

    #[test]
    fn inherited_child_changes_are_reported_once_and_env_first() {
        let d = "decode@127.0.0.1:2";
        let s = "scheduler@decode@127.0.0.1:2";
        let a = snap(vec![
            comp(d, Role::Decode, None, &[("A", "1")], "1:10"),
            comp(s, Role::Scheduler, Some(d), &[("A", "1")], "2:11"),
            comp(
                "prefill@127.0.0.1:3",
                Role::Prefill,
                None,
                &[("A", "1")],
                "3:12",
            ),
            comp("proxy@127.0.0.1:4", Role::Proxy, None, &[], "4:1"),
        ]);
        let mut b = snap(vec![
            comp(d, Role::Decode, None, &[("A", "1"), ("KNOB", "1")], "5:20"),
            comp(
                s,
                Role::Scheduler,
                Some(d),
                &[("A", "1"), ("KNOB", "1")],
                "6:21",
            ),
            comp(
                "prefill@127.0.0.1:3",
                Role::Prefill,
                None,
                &[("A", "1")],
                "3:12",
            ),
            comp("router@127.0.0.1:9", Role::Router, None, &[], "9:1"),
        ]);
        b.components[2].cmdline[4] = "7".into();
        let r = diff_snapshots(&a, &b);
        let first = &r.changes[0];
        assert_eq!(
            (
                first.component.as_str(),
                first.field.as_str(),
                first.key.as_deref()
            ),
            (d, "env", Some("KNOB"))
        );
        assert_eq!(
            r.changes.iter().filter(|c| c.field == "env").count(),
            1,
            "{:#?}",
            r.changes
        );
        let cmd = r
            .changes
            .iter()
            .find(|c| c.field == "cmdline")
            .expect("cmdline change");
        assert_eq!(
            (
                cmd.key.as_deref(),
                cmd.before.as_deref(),
                cmd.after.as_deref()
            ),
            (Some("--port"), Some("1"), Some("7"))
        );
        assert!(r
            .changes
            .iter()
            .any(|c| c.field == "topology" && c.after.as_deref() == Some("router@127.0.0.1:9")));
        assert!(r
            .changes
            .iter()
            .any(|c| c.field == "topology" && c.before.as_deref() == Some("proxy@127.0.0.1:4")));
        let restarts: Vec<&str> = r
            .changes
            .iter()
            .filter(|c| c.field == "process")
            .map(|c| c.component.as_str())
            .collect();
        assert_eq!(restarts, vec![d, s]);
        // colour only when asked, env lines bold
        let human = render_human(&r, true);
        assert!(human.contains("\x1b[1;32m+ env KNOB=1"), "{human}");
        assert!(!render_human(&r, false).contains('\x1b'));
        let f = crate::detect::config_changed(&r.changes);
        assert_eq!(f.len(), 2, "decode env, prefill cmdline: {f:#?}");
    }

    #[test]
    fn redacted_values_do_not_count_as_changes_but_added_secrets_do() {
        let d = "decode@127.0.0.1:2";
        let a = snap(vec![comp(
            d,
            Role::Decode,
            None,
            &[("HF_TOKEN", REDACTED)],
            "1:1",
        )]);
        let b = snap(vec![comp(
            d,
            Role::Decode,
            None,
            &[("HF_TOKEN", REDACTED), ("API_KEY", REDACTED)],
            "1:1",
        )]);
        let r = diff_snapshots(&a, &b);
        assert_eq!(r.changes.len(), 1);
        assert_eq!(r.changes[0].key.as_deref(), Some("API_KEY"));
    }
}
