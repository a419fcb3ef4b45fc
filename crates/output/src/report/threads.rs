//! Thread stacks, one folded block per component (the stuck ones are what matters; a block
//! too large for the cap is cut whole, never in the middle of a code block).

use super::md::{code, details, esc, fenced};
use crate::model::{SnapThread, Snapshot};
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

/// `(component, block)` for each component with threads, in snapshot order.
pub fn blocks(s: &Snapshot) -> Vec<(String, String)> {
    let mut by: BTreeMap<String, Vec<&SnapThread>> = BTreeMap::new();
    for t in &s.threads {
        let c = t
            .component
            .clone()
            .unwrap_or_else(|| "(no component)".into());
        by.entry(c).or_default().push(t);
    }
    by.into_iter()
        .map(|(c, ts)| {
            let body: String = ts.iter().map(|t| thread(t)).collect();
            let summary = format!("thread stacks of {c} ({})", ts.len());
            (c, details(&summary, &body))
        })
        .collect()
}
