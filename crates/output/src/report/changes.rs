//! What changed since the baseline (`config_changed`): one row per fact, two columns that fit
//! a GitHub issue's width. Child processes are folded onto their engine
//! (`model::cause::folded_changes`); long values are clipped in the table and given whole
//! in a folded block after it.

use super::md::{clip, details, esc, fenced, table};
use crate::model::cause::{folded_changes, Folded};
use crate::model::{Change, Snapshot};

/// Longest value shown in a table cell: with a key of [`KEY`], a row fits the ~100
/// characters of a GitHub issue's width.
const CELL: usize = 24;
/// Longest key shown in a table cell.
const KEY: usize = 40;

/// `pid 15436 started 2026-12-05T09:29:52.390Z` -> `pid 15436 (09:29:52)`.
fn short_value(v: &str) -> String {
    match v.split_once(" started ") {
        Some((pid, at)) if at.get(10..11) == Some("T") => match at.get(11..19) {
            Some(t) => format!("{pid} ({t})"),
            None => v.to_string(),
        },
        _ => v.to_string(),
    }
}

/// The change without its component: `env X: (absent) -> 100`, `restarted: pid 1 ... -> ...`.
fn fact(c: &Change, max: usize) -> String {
    let v = |x: Option<&str>| clip(&short_value(x.unwrap_or("(absent)")), max);
    let key = c
        .key
        .as_deref()
        .map(|k| clip(k, if max == usize::MAX { max } else { KEY }))
        .unwrap_or_default();
    match (c.field.as_str(), key.as_str()) {
        ("process", _) => format!(
            "restarted: {} -> {}",
            v(c.before.as_deref()),
            v(c.after.as_deref())
        ),
        ("topology", "component") if c.after.is_some() => "appeared".into(),
        ("topology", "component") => "gone".into(),
        (f, k) => format!(
            "{f} {k}: {} -> {}",
            v(c.before.as_deref()),
            v(c.after.as_deref())
        ),
    }
}

/// Who the change is on: the engine, and a child's own role when it is the child's.
fn hop(f: &Folded) -> String {
    if f.change.component == f.top {
        f.name.clone()
    } else {
        format!("{} ({})", f.name, f.change.role)
    }
}

fn clipped(c: &Change) -> bool {
    fact(c, CELL) != fact(c, usize::MAX)
}

pub fn section(s: &Snapshot) -> String {
    let cs = folded_changes(s);
    if cs.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = cs
        .iter()
        .map(|f| vec![esc(&hop(f)), esc(&fact(&f.change, CELL))])
        .collect();
    let mut o = format!(
        "## Changed since the baseline (`config_changed`)\n\n{}\n",
        table(&["hop", "change"], &rows)
    );
    if s.config_changed.len() > cs.len() {
        o.push_str("Child processes (scheduler, detokenizer) share their engine's changes: not repeated.\n\n");
    }
    let whole: Vec<String> = cs
        .iter()
        .filter(|f| clipped(&f.change))
        .map(|f| format!("{}: {}", hop(f), fact(&f.change, usize::MAX)))
        .collect();
    if !whole.is_empty() {
        o.push_str(&details("Whole values", &fenced(&whole.join("\n"))));
    }
    o
}

/// The same list as plain lines (`report --format text`).
pub fn text(s: &Snapshot) -> String {
    let cs = folded_changes(s);
    if cs.is_empty() {
        return String::new();
    }
    let mut o = String::from("\nchanged since the baseline:\n");
    for f in &cs {
        o.push_str(&format!("  {}: {}\n", hop(f), fact(&f.change, usize::MAX)));
    }
    o
}
