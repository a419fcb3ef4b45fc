//! The verdict as a GitHub alert block (`> [!CAUTION]` for a critical finding), holding the
//! cause time line and the suspect (`model::cause`, computed once with the snapshot).

use super::md::esc;
use crate::model::cause::Cause;
use crate::model::{Severity, Snapshot};

/// The snapshot's time line: the one it carries, or for a snapshot of an older version the
/// same rule over its facts.
pub fn of(s: &Snapshot) -> Option<Cause> {
    s.cause.clone().or_else(|| crate::model::cause::of(s))
}

/// GitHub's alert kind for the worst severity (none: nothing found).
fn alert(worst: Option<Severity>) -> &'static str {
    match worst {
        Some(Severity::Critical) => "CAUTION",
        Some(Severity::Warning) => "WARNING",
        Some(Severity::Info) | None => "NOTE",
    }
}

/// The alert block: the verdict's one line, then the time line and the suspect.
pub fn block(s: &Snapshot, verdict: &str) -> String {
    let worst = s.findings.iter().map(|f| f.severity).max();
    let mut o = format!("> [!{}]\n> **{}**\n", alert(worst), esc(verdict));
    if let Some(c) = of(s) {
        let line = c.line();
        if !line.is_empty() {
            o.push_str(&format!(">\n> **Timeline:** {}\n", esc(&line)));
        }
        if let Some(x) = &c.suspect {
            o.push_str(&format!(">\n> **Suspect:** {}\n", esc(&x.line())));
        }
    }
    o.push('\n');
    o
}
