//! report.md: the snapshot rendered as Markdown for a GitHub issue.
//!
//! The verdict as the title and five lines, then the findings, the changes and the stuck
//! requests, and the rest folded in `<details>` blocks. At most [`MAX_REPORT`] characters:
//! blocks that do not fit are left out whole and the end says which. One file per section;
//! `md` holds the escaping every host string goes through.

mod cap;
mod cause;
mod changes;
mod components;
mod findings;
mod md;
mod nodes;
mod path;
mod sources;
mod stuck;
mod threads;
mod topology;
mod verdict;
mod versions;

pub use cap::MAX_REPORT;

use crate::model::Snapshot;
use cap::Block;

/// The snapshot as every output shows it: redacted again with today's rules (it may be an
/// old file; not when it was taken with `--no-redact`) and every string neutralised.
fn safe(s: &Snapshot) -> Option<Snapshot> {
    crate::redact::for_output(&[s], s.redacted).and_then(|mut v| v.pop())
}

const UNREDACTABLE: &str =
    "# wedgewatch snapshot\n\nThis snapshot could not be redacted for the report.\n";

/// Renders report.md (at most [`MAX_REPORT`] characters). The rendered text gets a last
/// control-character pass, keeping only the newlines and tabs of our own layout.
pub fn render(s: &Snapshot) -> String {
    render_capped(s, MAX_REPORT)
}

/// [`render`] with another cap (tests).
pub fn render_capped(s: &Snapshot, max: usize) -> String {
    match safe(s) {
        Some(safe) => {
            let clean = |t: String| crate::redact::control::text(&t).into_owned();
            let head = clean(head(&safe));
            let blocks = blocks(&safe)
                .into_iter()
                .map(|b| Block::new(b.name, clean(b.text)))
                .collect();
            cap::fit(head, blocks, max)
        }
        None => UNREDACTABLE.into(),
    }
}

/// The verdict in plain text, the cause time line, one line per finding, then what changed
/// (`report --format text`).
pub fn render_text(s: &Snapshot) -> String {
    let Some(safe) = safe(s) else {
        return "wedgewatch: this snapshot could not be redacted\n".into();
    };
    let mut o = verdict::text(&verdict::verdict(&safe));
    if let Some(c) = cause::of(&safe) {
        o.push_str("\ntimeline:\n");
        for e in &c.events {
            o.push_str(&format!("  {}\n", e.line()));
        }
        if let Some(x) = &c.suspect {
            o.push_str(&format!("  suspect: {}\n", x.line()));
        }
    }
    if !safe.findings.is_empty() {
        o.push_str("\nfindings:\n");
    }
    for f in &safe.findings {
        let at = f.component.as_deref().unwrap_or("-");
        o.push_str(&format!(
            "  {:<8} {} at {at}: {}\n",
            f.severity.as_str(),
            f.kind,
            f.summary
        ));
    }
    o.push_str(&changes::text(&safe));
    crate::redact::control::text(&o).into_owned()
}

/// The schema of `report --json`.
pub const REPORT_SCHEMA: &str = "wedgewatch.report/1";

/// The verdict as data (`report --format json`, schema [`REPORT_SCHEMA`]): the top finding
/// by kind, severity and place, the stuck requests, the cause time line, the changes and
/// every finding; `title` and `evidence` are the head's lines.
pub fn render_json(s: &Snapshot) -> serde_json::Value {
    let Some(safe) = safe(s) else {
        return serde_json::json!({
            "schema": REPORT_SCHEMA,
            "error": "this snapshot could not be redacted",
        });
    };
    let v = verdict::verdict(&safe);
    let top = verdict::top(&safe);
    let evidence: Vec<serde_json::Value> = v
        .evidence
        .iter()
        .map(|(layer, line)| serde_json::json!({ "layer": layer, "line": line }))
        .collect();
    let stuck: Vec<serde_json::Value> = safe
        .logical_requests
        .iter()
        .filter(|l| l.verdict == crate::model::Verdict::Stuck)
        .map(|l| {
            serde_json::json!({
                "id": l.id, "at": l.stuck_at, "leg": l.stuck_leg,
                "kind": l.stuck_kind, "age_ms": l.age_ms,
            })
        })
        .collect();
    let changes: Vec<crate::model::Change> = crate::model::cause::folded_changes(&safe)
        .into_iter()
        .map(|f| f.change)
        .collect();
    serde_json::json!({
        "schema": REPORT_SCHEMA,
        "snapshot_schema": safe.schema,
        "taken_at": safe.taken_at,
        "title": v.title,
        "verdict": top.map(|f| serde_json::json!({
            "kind": f.kind, "severity": f.severity, "component": f.component, "role": f.role,
        })),
        "since": verdict::since_at(&safe),
        "stuck": stuck,
        "evidence": evidence,
        "cause": cause::of(&safe),
        "changes": changes,
        "findings": safe.findings,
    })
}

fn head(s: &Snapshot) -> String {
    let mut o = verdict::markdown(s, &verdict::verdict(s));
    o.push('\n');
    if s.redacted {
        o.push_str("Secrets redacted (values shown as `<redacted>`).");
    } else {
        o.push_str(
            "> **Warning: taken with `--no-redact`: secrets in environment and command lines \
             are NOT redacted. Do not paste this publicly.**",
        );
    }
    o.push_str(&format!(
        " Snapshot {} · window {} ms · {} components · schema `{}`.\n\n",
        md::esc(&s.taken_at),
        s.window_ms,
        s.components.len(),
        md::esc(&s.schema)
    ));
    o
}

/// Everything after the head, in order, each kept or cut whole. The blamed hop's stacks
/// (its scheduler's first) open the details: they decide a wedge.
fn blocks(s: &Snapshot) -> Vec<Block> {
    let (blamed, other): (Vec<_>, Vec<_>) =
        threads::blocks(s).into_iter().partition(|(_, _, b)| *b);
    let mut b = vec![
        Block::new("findings", findings::section(s)),
        Block::new("changes since the baseline", changes::section(s)),
        Block::new("stuck requests", stuck::section(s)),
        Block::new("nodes", nodes::section(s)),
        // a heading of its own: the stuck table ends where the next `## ` starts
        Block::new("details heading", "\n## Details\n\n".to_string()),
    ];
    for (c, text, _) in blamed {
        b.push(Block::new(format!("thread stacks of {c}"), text));
    }
    b.extend([
        Block::new("evidence of every finding", findings::evidence(s)),
        Block::new("versions", versions::section(s)),
        Block::new("sources", sources::section(s)),
        Block::new("topology", topology::section(s)),
        Block::new("GPUs", topology::gpus(s)),
        Block::new("components heading", components::heading(s)),
    ]);
    let ix = components::Index::new(s);
    for c in &s.components {
        b.push(Block::new(
            format!("component {}", c.id),
            components::component(&ix, c),
        ));
    }
    if !other.is_empty() {
        b.push(Block::new(
            "threads heading",
            format!("## Threads ({})\n\n", s.threads.len()),
        ));
    }
    for (c, text, _) in other {
        b.push(Block::new(format!("thread stacks of {c}"), text));
    }
    b
}

#[cfg(test)]
mod tests;
