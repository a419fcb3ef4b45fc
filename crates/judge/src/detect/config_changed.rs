//! `config_changed` (warning): one finding per component whose environment, command line,
//! executable or configuration differs from the baseline; children's changes fold into their
//! engine's. Its input is the one comparison, `model::changes::changes`; this detector only
//! filters and words it. See `config_changed` in docs/findings.md.
//!
//! Thresholds read: none.

use crate::correlate::{Correlator, View};
use crate::model::changes::{is_config_change, render_change_plain};
use crate::model::{Change, Evidence, Finding, FindingKind, Role, Severity};
use std::collections::BTreeMap;

pub(super) fn config_changed_detector(m: &Correlator, _v: &View) -> Vec<Finding> {
    config_changed(m.config_changes())
}

/// `config_changed`: one finding per component with changes against the baseline (env,
/// cmdline, version, config; restarts are `process_restarted`), naming the changed keys.
/// The one rendering of changes for `diff`, `snapshot --baseline` and the daemon's baseline.
pub fn config_changed(changes: &[Change]) -> Vec<Finding> {
    let mut by_comp: BTreeMap<(&str, Role), Vec<&Change>> = BTreeMap::new();
    for c in changes {
        if is_config_change(c) {
            by_comp
                .entry((c.component.as_str(), c.role))
                .or_default()
                .push(c);
        }
    }
    by_comp
        .into_iter()
        .map(|((comp, role), cs)| {
            // The change itself in the summary: an added variable must be readable at once.
            let mut shown: Vec<String> = cs.iter().take(3).map(|c| render_change_plain(c)).collect();
            if cs.len() > 3 {
                shown.push(format!("{} more", cs.len() - 3));
            }
            Finding {
                kind: FindingKind::ConfigChanged,
                severity: Severity::Warning,
                component: Some(comp.to_string()),
                role: Some(role),
                summary: format!("{comp} changed since the baseline: {}", shown.join("; ")),
                requests: Vec::new(),
                evidence: cs
                    .iter()
                    .map(|c| Evidence::new("diff", render_change_plain(c)))
                    .collect(),
                explanation: Some(
                    "A configuration change since the baseline is the first suspect when behaviour changed.".into(),
                ),
            }
        })
        .collect()
}
