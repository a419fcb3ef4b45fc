//! Diff two snapshots: what changed since the baseline (env, cmdline, version, topology,
//! process), by [`crate::model::changes::changes`] over both snapshots' component facts, as the
//! daemon's baselines compare them. A child's inherited change is reported once, on its parent;
//! deliberate changes (env, cmdline, version, config) come before their consequences (topology,
//! restarts).

use crate::model::changes::render_change_plain;
use crate::model::changes::{changes, field_rank};
use crate::model::{Change, ComponentFacts, DiffReport, Snapshot, DIFF_SCHEMA};
use std::collections::{BTreeMap, BTreeSet};

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
    let facts = |s: &Snapshot| -> Vec<ComponentFacts> {
        s.components.iter().map(ComponentFacts::from).collect()
    };
    let mut out = changes(&facts(before), &facts(after));
    let parent_of: BTreeMap<&str, &str> = after
        .components
        .iter()
        .chain(before.components.iter())
        .filter_map(|c| c.parent.as_deref().map(|p| (c.id.as_str(), p)))
        .collect();
    drop_inherited(&mut out, &parent_of);

    // what was changed on purpose first, consequences after; children after parents
    let depth = |id: &str| u8::from(parent_of.contains_key(id));
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

/// Drops a child's env/cmdline/version change that its parent has too (same field, key and
/// values): it is the parent's change, reported there.
fn drop_inherited(out: &mut Vec<Change>, parent_of: &BTreeMap<&str, &str>) {
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
    use crate::model::{Role, SnapComponent, REDACTED, SNAPSHOT_SCHEMA};

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
            netns: None,
            container: None,
            channels: Vec::new(),
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
            logical_requests: vec![],
            node: None,
            connections: vec![],
            channels: vec![],
            fleet: None,
            elided: None,
            cause: None,
        }
    }

    const D: &str = "decode@127.0.0.1:2";
    const S: &str = "scheduler@decode@127.0.0.1:2";

    /// Decode (and its scheduler) restarted with one more variable, prefill's port flag
    /// changed, the proxy gone and a router new.
    fn decode_restarted_with_knob() -> (Snapshot, Snapshot) {
        let (d, s) = (D, S);
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
        (a, b)
    }

    #[test]
    fn inherited_child_changes_are_reported_once_and_env_first() {
        let (d, s) = (D, S);
        let (a, b) = decode_restarted_with_knob();
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
