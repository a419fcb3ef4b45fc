//! Every finding, most severe first: one line each, then their evidence folded.

use super::md::{code, details, esc};
use crate::model::{Finding, Snapshot, Status};

fn who(f: &Finding) -> String {
    match (&f.component, &f.role) {
        (Some(c), Some(r)) => format!(" on {} ({r})", code(c)),
        (Some(c), None) => format!(" on {}", code(c)),
        _ => String::new(),
    }
}

/// What an empty list means: nothing found, or nothing looked at.
fn none_found(s: &Snapshot) -> String {
    let missing: Vec<&str> = s
        .sources
        .iter()
        .filter(|(_, st)| st.status == Status::Unavailable)
        .map(|(k, _)| k.as_str())
        .collect();
    if missing.is_empty() {
        "No findings.\n".into()
    } else {
        format!(
            "No findings. Not sampled, so not checked: {} (see Sources).\n",
            esc(&missing.join(", "))
        )
    }
}

/// Most severe first (snapshots are written so; an old or hand-made file may not be).
fn by_severity(s: &Snapshot) -> Vec<&Finding> {
    let mut v: Vec<&Finding> = s.findings.iter().collect();
    v.sort_by_key(|f| std::cmp::Reverse(f.severity));
    v
}

pub fn section(s: &Snapshot) -> String {
    let mut o = String::from("## Findings\n\n");
    if s.findings.is_empty() {
        o.push_str(&none_found(s));
        return o;
    }
    for (i, f) in by_severity(s).into_iter().enumerate() {
        o.push_str(&format!(
            "{}. **{}** {}{}: {}\n",
            i + 1,
            f.severity.as_str().to_uppercase(),
            code(&f.kind.to_string()),
            who(f),
            esc(&f.summary)
        ));
    }
    o.push('\n');
    o
}

/// The evidence, explanation and request ids of every finding, folded.
pub fn evidence(s: &Snapshot) -> String {
    if s.findings.is_empty() {
        return String::new();
    }
    let mut body = String::new();
    for (i, f) in by_severity(s).into_iter().enumerate() {
        body.push_str(&format!(
            "{}. {}{}\n",
            i + 1,
            code(&f.kind.to_string()),
            who(f)
        ));
        if !f.requests.is_empty() {
            let ids: Vec<String> = f.requests.iter().map(|r| code(r)).collect();
            body.push_str(&format!("   - requests: {}\n", ids.join(", ")));
        }
        for e in &f.evidence {
            body.push_str(&format!("   - {}: {}\n", esc(&e.source), esc(&e.detail)));
        }
        if let Some(x) = &f.explanation {
            body.push_str(&format!("   - why it matters: {}\n", esc(x)));
        }
    }
    details("Evidence of every finding", &body)
}
