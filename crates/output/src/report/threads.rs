//! Thread stacks, one folded block per component (the stuck ones are what matters; a block
//! too large for the cap is cut whole, never in the middle of a code block).

use super::md::{code, details, esc, fenced};
use crate::model::{Role, SnapThread, Snapshot};
use std::collections::BTreeMap;

fn thread(t: &SnapThread) -> String {
    let mut o = format!(
        "**pid {} tid {}** {} {}",
        t.pid,
        t.tid,
        esc(t.name.as_deref().unwrap_or("")),
        code(t.state.as_str())
    );
    if let Some(r) = &t.rule {
        o.push_str(&format!(" (rule {})", code(r)));
    }
    o.push_str("\n\n");
    o.push_str(&fenced(&t.frames.join("\n")));
    o.push('\n');
    o
}

/// How early a component's stacks come: the blamed hop's scheduler first (where a wedge
/// is decided), then the blamed hop and its other processes, then the rest by id.
fn rank(s: &Snapshot, blamed: Option<&str>, c: &str) -> u8 {
    let Some(b) = blamed else { return 2 };
    let comp = s.components.iter().find(|x| x.id == c);
    let child_of_blamed = comp.is_some_and(|x| x.parent.as_deref() == Some(b));
    match comp.map(|x| x.role) {
        Some(Role::Scheduler) if child_of_blamed => 0,
        _ if c == b || child_of_blamed => 1,
        _ => 2,
    }
}

/// The hop the report blames: the most severe finding's component, or its engine.
fn blamed(s: &Snapshot) -> Option<&str> {
    let c = super::verdict::top(s)?.component.as_deref()?;
    let parent = s
        .components
        .iter()
        .find(|x| x.id == c)
        .and_then(|x| x.parent.as_deref());
    Some(parent.unwrap_or(c))
}

/// `(component, block, blamed)` for each component with threads, the blamed hop's
/// scheduler first ([`rank`]); `blamed` marks the blamed hop's blocks.
pub fn blocks(s: &Snapshot) -> Vec<(String, String, bool)> {
    let mut by: BTreeMap<String, Vec<&SnapThread>> = BTreeMap::new();
    for t in &s.threads {
        let c = t
            .component
            .clone()
            .unwrap_or_else(|| "(no component)".into());
        by.entry(c).or_default().push(t);
    }
    let b = blamed(s);
    let mut v: Vec<(u8, String, Vec<&SnapThread>)> = by
        .into_iter()
        .map(|(c, ts)| (rank(s, b, &c), c, ts))
        .collect();
    v.sort_by(|x, y| (x.0, &x.1).cmp(&(y.0, &y.1)));
    v.into_iter()
        .map(|(r, c, ts)| {
            let body: String = ts.iter().map(|t| thread(t)).collect();
            let summary = format!("thread stacks of {c} ({})", ts.len());
            (c, details(&summary, &body), r < 2)
        })
        .collect()
}
