//! `config_changed` (warning).
//!
//! Fires, one finding per component, when its environment, command line, executable or
//! configuration differs from the baseline (`--baseline FILE`, or the daemon's first
//! baseline). Children's changes are folded into their engine's finding by `run_all`.
//!
//! What to do: a change next to a wedge is the first suspect; compare the listed keys.
//!
//! Thresholds read: none.

use crate::correlate::{Model, View};
use crate::model::Finding;

pub(super) fn config_changed_detector(m: &Model, _v: &View) -> Vec<Finding> {
    config_changed(m.config_changes())
}

/// `config_changed`: one finding per component with changes against the baseline.
pub fn config_changed(changes: &[crate::model::Change]) -> Vec<Finding> {
    // One rendering of changes for `diff`, `snapshot --baseline` and the daemon's baseline:
    // env/cmdline/version/config only (restarts are `process_restarted`).
    crate::diff::findings_from_changes(changes)
}
