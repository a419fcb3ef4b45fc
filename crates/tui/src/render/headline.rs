//! The headline: the most severe finding, on every tab's header, so a critical finding is
//! on screen whichever tab is open.

use super::{cut, fit, sev_tag, Theme};
use crate::model::{Finding, Snapshot};
use ratatui::style::Color;
use ratatui::text::{Line, Span};

/// The most severe finding; of equally severe ones the first (detectors list the finding
/// that explains the others first).
pub(super) fn most_severe(s: &Snapshot) -> Option<&Finding> {
    let worst = s.findings.iter().map(|f| f.severity).max()?;
    s.findings.iter().find(|f| f.severity == worst)
}

/// `CRIT wedged_request at decode@127.0.0.1:31012 (+2 more): <summary>`, cut to `width`.
/// Severity, kind and hop come first so a narrow screen keeps them.
pub(super) fn headline(s: &Snapshot, theme: Theme, width: usize) -> Line<'static> {
    let Some(f) = most_severe(s) else {
        return Line::styled(
            fit("no findings: no detector fired on this window", width),
            theme.fg(Color::Green),
        );
    };
    let hop = f.component.as_deref().unwrap_or("the stack");
    let others = s.findings.len() - 1;
    let more = if others > 0 {
        format!(" (+{others} more)")
    } else {
        String::new()
    };
    let head = format!("{} {} at {hop}{more}", sev_tag(f.severity), f.kind);
    let rest = width.saturating_sub(head.chars().count());
    let summary = if rest > 4 {
        fit(&format!(": {}", f.summary), rest)
    } else {
        String::new()
    };
    Line::from(vec![
        Span::styled(cut(&head, width), theme.severity(f.severity)),
        Span::raw(summary),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Severity;

    fn finding(kind: &str, severity: Severity, component: &str) -> Finding {
        serde_json::from_value(serde_json::json!({
            "kind": kind, "severity": severity, "component": component,
            "summary": "s", "evidence": [], "requests": []
        }))
        .expect("finding")
    }

    #[test]
    fn the_most_severe_finding_wins_and_the_first_of_equals() {
        let mut s: Snapshot = serde_json::from_str(include_str!(
            "../../../../tests/fixtures/snapshots/healthy.json"
        ))
        .expect("fixture");
        s.findings = vec![
            finding("config_changed", Severity::Warning, "decode"),
            finding("wedged_request", Severity::Critical, "decode"),
            finding("scheduler_stuck", Severity::Critical, "sched"),
        ];
        let line = headline(&s, Theme { no_color: true }, 80);
        let text: String = line.spans.iter().map(|s| s.content.as_ref()).collect();
        assert!(
            text.starts_with("CRIT wedged_request at decode (+2 more): s"),
            "{text}"
        );
        assert_eq!(text.chars().count(), 80);
        s.findings.clear();
        assert!(most_severe(&s).is_none());
    }
}
