//! The pipeline step above `detect`: a model at one instant -> the parts of a snapshot.
//!
//! `correlate` derives the view, `detect` turns model and view into findings, and this joins
//! them; neither of the lower layers calls the other upward.

use crate::clock::Millis;
use crate::correlate::Model;
use crate::detect;
use crate::model::{RawFiles, SnapshotParts};

/// Everything a snapshot needs at `now`, findings included: the model's view, the detectors
/// run over it, and the parts the model assembles from both, with every raw payload (a
/// bundle's raw files).
pub fn parts(model: &Model, now: Millis) -> SnapshotParts {
    parts_for(model, now, RawFiles::All)
}

/// [`parts`] with only the raw payloads `raw` says (a snapshot printed as JSON needs none
/// of the bundle's raw files).
pub fn parts_for(model: &Model, now: Millis, raw: RawFiles) -> SnapshotParts {
    let view = model.view(now);
    let findings = detect::run_all(model, &view);
    model.parts_with(now, &view, findings, raw)
}
