//! The pipeline step above `detect`: a model at one instant -> the parts of a snapshot.
//!
//! `correlate` derives the view, `detect` turns model and view into findings, and this joins
//! them; neither of the lower layers calls the other upward.

use crate::clock::{thread_cpu_ms, Millis};
use crate::correlate::Correlator;
use crate::detect;
use crate::model::{RawFiles, SnapshotParts};

/// Everything a snapshot needs at `now`, findings included: the model's view, the detectors
/// run over it, and the parts the model assembles from both, with every raw payload (a
/// bundle's raw files).
pub fn parts(model: &Correlator, now: Millis) -> SnapshotParts {
    parts_for(model, now, RawFiles::All)
}

/// [`parts`] with only the raw payloads `raw` says (a snapshot printed as JSON needs none
/// of the bundle's raw files).
pub fn parts_for(model: &Correlator, now: Millis, raw: RawFiles) -> SnapshotParts {
    let cpu = thread_cpu_ms();
    let view = model.view(now);
    let viewed = thread_cpu_ms();
    let findings = detect::run_all(model, &view);
    let detected = thread_cpu_ms();
    let parts = model.parts_with(now, &view, findings, raw);
    let done = thread_cpu_ms();
    let (in_view, logical) = (view.requests.len(), view.logical.len());
    drop(view);
    tracing::debug!(
        view_cpu_ms = viewed - cpu,
        detect_cpu_ms = detected - viewed,
        parts_with_cpu_ms = done - detected,
        drop_cpu_ms = thread_cpu_ms() - done,
        in_view,
        logical,
        listed = parts.requests.len(),
        "parts for a snapshot"
    );
    parts
}
