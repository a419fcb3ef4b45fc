//! The incidents directory (`<state>/incidents/`): what is kept there, read back, updated and
//! removed. Only directories named as [`super::names`] names them and holding an
//! `incident.json` are incidents; only the files in [`FILES`] are ever removed from them,
//! each only as a regular file of our own (`safe_fs::staged::remove_own_dir`), so a file
//! someone else put there is never deleted and keeps its directory.

use super::names::is_incident_name;
use super::record::Incident;
use crate::error::{Error, Result};
use crate::safe_fs::staged::{self, Removed, STAGING_MARK};
use std::path::{Path, PathBuf};

/// The incidents' directory in the daemon's state directory.
pub const INCIDENTS_DIR: &str = "incidents";
pub const INCIDENT_FILE: &str = "incident.json";
pub const SNAPSHOT_FILE: &str = "snapshot.json";
pub const REPORT_FILE: &str = "report.md";
pub const RECORDING_FILE: &str = "recording.wwrec";
/// Every file an incident directory holds; nothing else in it is ours.
pub const FILES: [&str; 4] = [INCIDENT_FILE, SNAPSHOT_FILE, REPORT_FILE, RECORDING_FILE];
/// The largest `incident.json` read (ours are a few hundred bytes).
const MAX_INCIDENT_BYTES: u64 = 1 << 20;

/// One incident kept on disk.
#[derive(Debug, Clone)]
pub struct Kept {
    pub name: String,
    pub path: PathBuf,
    pub incident: Incident,
    /// Bytes of its files.
    pub bytes: u64,
}

/// How many incidents are kept, and how many bytes they may hold together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    pub keep: usize,
    pub max_bytes: u64,
}

/// The incidents kept in `dir`, oldest first (none when it does not exist). Anything that is
/// not an incident directory of ours (another name, a link, no readable `incident.json`) is
/// left out.
pub fn list(dir: &Path) -> Result<Vec<Kept>> {
    let rd = match std::fs::read_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        r => r.map_err(|e| Error::io(dir, e))?,
    };
    let mut kept: Vec<Kept> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            is_incident_name(&name).then_some(name)
        })
        .filter_map(|name| read_kept(dir, name))
        .collect();
    kept.sort_by(|a, b| (a.incident.opened_ms, &a.name).cmp(&(b.incident.opened_ms, &b.name)));
    Ok(kept)
}

fn read_kept(dir: &Path, name: String) -> Option<Kept> {
    let path = dir.join(&name);
    let (bytes, more) =
        crate::safe_fs::read_input_capped(&path.join(INCIDENT_FILE), MAX_INCIDENT_BYTES).ok()?;
    let incident: Incident = serde_json::from_slice(&bytes).ok().filter(|_| !more)?;
    Some(Kept {
        bytes: size_of(&path),
        name,
        path,
        incident,
    })
}

/// Bytes of an incident directory's own files (regular files only, links not followed).
fn size_of(path: &Path) -> u64 {
    FILES
        .iter()
        .filter_map(|f| std::fs::symlink_metadata(path.join(f)).ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum()
}

/// Writes an incident's record again (and its report, when given), each file replaced
/// atomically; the record last, so it never describes a report not yet there.
pub fn update(kept_dir: &Path, incident: &Incident, report: Option<&str>) -> Result<()> {
    if let Some(r) = report {
        staged::replace_file(kept_dir, REPORT_FILE, r.as_bytes())?;
    }
    let json = serde_json::to_vec_pretty(incident)?;
    Ok(staged::replace_file(kept_dir, INCIDENT_FILE, &json)?)
}

/// Removes the oldest incidents until at most `bounds.keep` remain holding at most
/// `bounds.max_bytes` together; `spare` (the one just written) is never removed. Returns what
/// was removed, oldest first.
pub fn prune(dir: &Path, bounds: Bounds, spare: &str) -> Result<Vec<(Kept, Removed)>> {
    let kept = list(dir)?;
    let mut count = kept.len();
    let mut bytes: u64 = kept.iter().map(|k| k.bytes).sum();
    let mut removed = Vec::new();
    for k in kept {
        if count <= bounds.keep && bytes <= bounds.max_bytes {
            break;
        }
        if k.name == spare {
            continue;
        }
        let r = staged::remove_own_dir(dir, &k.name, &FILES)?;
        count -= 1;
        bytes = bytes.saturating_sub(k.bytes);
        removed.push((k, r));
    }
    Ok(removed)
}

/// Removes what a daemon that stopped mid-write left: staging directories (`.NAME.tmp-*`
/// beside an incident name), holding only incident files. Returns how many.
pub fn sweep_staging(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.strip_prefix('.')
                .and_then(|n| n.split_once(STAGING_MARK))
                .is_some_and(|(name, _)| is_incident_name(name))
        })
        .filter(|n| matches!(staged::remove_own_dir(dir, n, &FILES), Ok(Removed::All)))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::incidents::names::dir_name;
    use crate::model::FindingKind;

    /// An incident of `bytes` bytes opened at `t` s, written as the daemon writes one.
    fn kept(dir: &Path, t: i64, bytes: usize) -> String {
        let name = dir_name(t * 1_000, &FindingKind::WedgedRequest, Some("decode"), 1);
        let inc = Incident::opened(
            FindingKind::WedgedRequest,
            Some("decode".into()),
            "x".into(),
            t * 1_000,
        );
        let s = staged::StagedDir::beside(&dir.join(&name)).expect("stage");
        s.write_file(REPORT_FILE, &vec![b'r'; bytes])
            .expect("report");
        s.write_file(INCIDENT_FILE, &serde_json::to_vec(&inc).expect("json"))
            .expect("incident");
        s.commit().expect("commit");
        name
    }

    fn names(dir: &Path) -> Vec<String> {
        list(dir)
            .expect("list")
            .into_iter()
            .map(|k| k.name)
            .collect()
    }

    #[test]
    fn the_oldest_go_first_until_the_count_and_the_bytes_fit() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path();
        let all: Vec<String> = (0..5).map(|i| kept(d, 1_000 + i, 10_000)).collect();
        assert_eq!(names(d), all, "listed oldest first");
        let per = list(d).expect("list")[0].bytes;
        assert!(per > 10_000, "{per}");
        // At most 3: the two oldest go.
        let r = prune(
            d,
            Bounds {
                keep: 3,
                max_bytes: u64::MAX,
            },
            &all[4],
        )
        .expect("prune");
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|(_, how)| *how == Removed::All));
        assert_eq!(names(d), all[2..].to_vec());
        // At most two incidents' bytes: one more goes.
        prune(
            d,
            Bounds {
                keep: 10,
                max_bytes: 2 * per,
            },
            &all[4],
        )
        .expect("prune");
        assert_eq!(names(d), all[3..].to_vec());
        // The one just written stays even when it alone is over the bound.
        prune(
            d,
            Bounds {
                keep: 0,
                max_bytes: 0,
            },
            &all[4],
        )
        .expect("prune");
        assert_eq!(names(d), vec![all[4].clone()]);
    }

    #[test]
    fn pruning_never_removes_what_the_daemon_did_not_write() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path();
        let old = kept(d, 1_000, 10);
        let new = kept(d, 2_000, 10);
        // Someone's notes in the old incident, a look-alike directory without a record, a
        // link named like an incident, and a file of another name.
        std::fs::write(d.join(&old).join("notes.txt"), "mine").expect("notes");
        let lookalike = dir_name(0, &FindingKind::WedgedRequest, Some("x"), 1);
        std::fs::create_dir(d.join(&lookalike)).expect("mkdir");
        std::fs::write(d.join(&lookalike).join(REPORT_FILE), "not an incident").expect("w");
        let outside = tempfile::tempdir().expect("outside");
        std::fs::write(outside.path().join(REPORT_FILE), "precious").expect("w");
        let link = dir_name(1, &FindingKind::WedgedRequest, Some("y"), 1);
        std::os::unix::fs::symlink(outside.path(), d.join(&link)).expect("ln");
        std::fs::write(d.join("README"), "keep").expect("w");
        assert_eq!(
            names(d),
            vec![old.clone(), new.clone()],
            "only incidents are listed"
        );
        let r = prune(
            d,
            Bounds {
                keep: 1,
                max_bytes: u64::MAX,
            },
            &new,
        )
        .expect("prune");
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1, Removed::KeptForeign);
        assert_eq!(
            std::fs::read_to_string(d.join(&old).join("notes.txt")).expect("kept"),
            "mine"
        );
        assert!(
            !d.join(&old).join(REPORT_FILE).exists(),
            "our own files went"
        );
        assert_eq!(names(d), vec![new], "no longer listed: its record is gone");
        assert!(d.join(&lookalike).join(REPORT_FILE).exists());
        assert!(outside.path().join(REPORT_FILE).exists());
        assert!(d.join("README").exists());
    }

    #[test]
    fn a_half_written_incident_is_never_listed_and_is_swept_on_start() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path();
        let name = dir_name(5_000, &FindingKind::WedgedRequest, Some("decode"), 1);
        let s = staged::StagedDir::beside(&d.join(&name)).expect("stage");
        s.write_file(SNAPSHOT_FILE, b"{}").expect("w");
        // The daemon dies here: the staging directory is left, never renamed.
        let left = s.path().to_path_buf();
        std::mem::forget(s);
        assert!(names(d).is_empty(), "not an incident until renamed");
        let other = d.join(".notes.tmp-1-2");
        std::fs::create_dir(&other).expect("mkdir");
        assert_eq!(sweep_staging(d), 1);
        assert!(!left.exists());
        assert!(
            other.exists(),
            "not a staging directory of an incident name"
        );
    }

    #[test]
    fn an_update_replaces_the_record_whole() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = tmp.path();
        let name = kept(d, 1_000, 10);
        let mut k = list(d).expect("list").remove(0);
        k.incident.close(
            super::super::record::ClosedBy::RequestsFinished,
            Some(1_060_000),
            None,
        );
        update(&k.path, &k.incident, Some("# closed\n")).expect("update");
        let back = list(d).expect("list").remove(0);
        assert_eq!(back.name, name);
        assert_eq!(back.incident, k.incident);
        assert_eq!(
            std::fs::read_to_string(k.path.join(REPORT_FILE)).expect("report"),
            "# closed\n"
        );
        let files: Vec<_> = std::fs::read_dir(&k.path).expect("ls").flatten().collect();
        assert_eq!(files.len(), 2, "no temporary file left: {files:?}");
    }
}
