//! The pipeline step above `detect`: a model at one instant -> the parts of a snapshot.
//!
//! `correlate` derives the view, `detect` turns model and view into findings, and this joins
//! them; neither of the lower layers calls the other upward.

use crate::clock::Millis;
use crate::correlate::Model;
use crate::detect;
use crate::model::SnapshotParts;

/// Everything a snapshot needs at `now`, findings included: the model's view, the detectors
/// run over it, and the parts the model assembles from both.
pub fn parts(model: &Model, now: Millis) -> SnapshotParts {
    let view = model.view(now);
    let findings = detect::run_all(model, &view);
    model.parts_with(now, &view, findings)
}
