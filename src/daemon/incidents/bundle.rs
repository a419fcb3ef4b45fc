//! A new incident's bundle: `snapshot.json` (the moment the finding opened), `report.md`
//! (that snapshot's report under a few lines about the incident), `recording.wwrec` (the
//! recording of the minutes before) and `incident.json`, built in a staging directory and
//! renamed into place whole (`safe_fs::staged`).

use super::record::{Incident, RecordingPart};
use super::store::{INCIDENT_FILE, RECORDING_FILE, REPORT_FILE, SNAPSHOT_FILE};
use crate::clock::{rfc3339, Millis};
use crate::error::Result;
use crate::model::Snapshot;
use crate::safe_fs::staged::StagedDir;
use std::path::{Path, PathBuf};

/// Room the incident's lines take at the top of `report.md`.
const PREAMBLE_ROOM: usize = 2_000;
/// Tries at an excerpt that fits its bound, each starting halfway to the incident.
const EXCERPT_TRIES: u32 = 3;

/// The daemon's recording an incident's excerpt is cut from.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The recording directory (`<state>/recording`).
    pub dir: &'a Path,
    /// The span: from `since_ms` to `until_ms` (the incident).
    pub since_ms: Millis,
    pub until_ms: Millis,
    pub max_bytes: u64,
}

/// Writes incident `name` in `dir` whole (it appears at once or not at all); fills in
/// `incident.recording`. Returns its path.
pub fn write_new(
    dir: &Path,
    name: &str,
    incident: &mut Incident,
    snapshot: &Snapshot,
    recording: Option<Source<'_>>,
) -> Result<PathBuf> {
    let staged = StagedDir::beside(&dir.join(name))?;
    staged.write_file(SNAPSHOT_FILE, &serde_json::to_vec_pretty(snapshot)?)?;
    incident.recording = match recording {
        Some(src) => excerpt(&staged.path().join(RECORDING_FILE), src),
        None => RecordingPart::Missing {
            why: "the daemon keeps no recording (--no-record)".into(),
        },
    };
    staged.write_file(REPORT_FILE, report(incident, snapshot).as_bytes())?;
    staged.write_file(INCIDENT_FILE, &serde_json::to_vec_pretty(incident)?)?;
    Ok(staged.commit()?)
}

/// The recording of the span into `to`; when it does not fit its bound, the span's later
/// half (the incident is at its end) is tried instead.
fn excerpt(to: &Path, src: Source<'_>) -> RecordingPart {
    let mut since = src.since_ms;
    for tried in 1..=EXCERPT_TRIES {
        // `to` is in our own staging directory: a file of an earlier try, ours to remove
        let _ = std::fs::remove_file(to);
        match crate::record::write_excerpt(src.dir, since, src.until_ms, to, src.max_bytes) {
            Ok(e) if e.cut && tried < EXCERPT_TRIES => since += (src.until_ms - since) / 2,
            Ok(e) => {
                return RecordingPart::Kept {
                    file: RECORDING_FILE.into(),
                    first_at: e.first_ms.map(rfc3339),
                    last_at: e.last_ms.map(rfc3339),
                    samples: e.samples,
                    bytes: e.bytes,
                    cut: e.cut || since > src.since_ms,
                }
            }
            Err(e) => {
                let _ = std::fs::remove_file(to);
                let why = crate::redact::log_line(&e.to_string());
                return RecordingPart::Missing {
                    why: format!("the recording could not be read: {why}"),
                };
            }
        }
    }
    RecordingPart::Missing {
        why: "no excerpt fit its bound".into(),
    }
}

/// `report.md`: a few lines about the incident, then the snapshot's report.
pub fn report(incident: &Incident, snapshot: &Snapshot) -> String {
    let body = crate::report::render_capped(snapshot, crate::report::MAX_REPORT - PREAMBLE_ROOM);
    format!("{}\n{body}", preamble(incident))
}

/// A value in a Markdown code span: inert, whatever the host named it.
fn code(s: &str) -> String {
    let clean = crate::redact::control::value(s).replace('`', "'");
    let short: String = clean.chars().take(200).collect();
    format!("`{short}`")
}

fn preamble(i: &Incident) -> String {
    let at = i
        .component
        .as_deref()
        .map(code)
        .unwrap_or_else(|| "-".into());
    let state = match &i.closed {
        None => "still open when this was written".to_string(),
        Some(c) => {
            let lasted = c
                .lasted_ms
                .map_or_else(|| "an unknown time".into(), super::super::log::human_ms);
            let detail = c.detail.as_deref().map(|d| format!(" ({})", code(d)));
            format!(
                "closed after {lasted}: {}{}",
                c.by.as_str(),
                detail.unwrap_or_default()
            )
        }
    };
    let recording = match &i.recording {
        RecordingPart::Kept {
            first_at, last_at, ..
        } => format!(
            "`{RECORDING_FILE}` the recording from {} to {} (`wedgewatch tui --replay {RECORDING_FILE}`)",
            first_at.as_deref().unwrap_or("-"),
            last_at.as_deref().unwrap_or("-")
        ),
        RecordingPart::Missing { why } => format!("no recording: {}", code(why)),
    };
    format!(
        "> **Incident** kept by the wedgewatch daemon: {} at {at}, opened {}; {state}.\n\
         > This bundle: `{SNAPSHOT_FILE}` and this report are the moment it opened; {recording}.\n",
        code(i.kind.as_str()),
        i.opened_at
    )
}

/// The report of a kept incident again, for its record as it is now (after it closed):
/// `None` when its snapshot cannot be read back.
pub fn report_again(kept_dir: &Path, incident: &Incident) -> Option<String> {
    let snap = crate::snapshot::read_snapshot(&kept_dir.join(SNAPSHOT_FILE)).ok()?;
    Some(report(incident, &snap))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::incidents::record::ClosedBy;
    use crate::model::FindingKind;

    #[test]
    fn the_preamble_says_what_closed_it_and_keeps_hostile_names_inert() {
        let mut i = Incident::opened(
            FindingKind::WedgedRequest,
            Some("decode`\n# injected\u{1b}[2J".into()),
            "s".into(),
            1_000,
        );
        let open = preamble(&i);
        assert!(open.contains("still open"), "{open}");
        assert_eq!(open.lines().count(), 2, "{open}");
        assert!(
            !open.contains('\u{1b}') && !open.contains("\n# injected"),
            "{open}"
        );
        i.close(
            ClosedBy::ProcessRestarted,
            Some(73_000),
            Some("1:2 is gone".into()),
        );
        let closed = preamble(&i);
        assert!(
            closed.contains("closed after 72s: process_restarted (`1:2 is gone`)"),
            "{closed}"
        );
    }
}
