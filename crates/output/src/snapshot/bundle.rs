//! Writing a bundle (`snapshot.json`, `report.md`, `raw/<stem>.json`) without ever deleting
//! or overwriting what wedgewatch did not write.
//!
//! A bundle carries a manifest, [`MANIFEST`], listing its own files, and is built aside and
//! renamed into place. An existing non-empty directory is refused, unless it holds a previous
//! bundle and [`Overwrite::PreviousBundle`] (`--force`) is asked: then only the files the old
//! manifest lists are replaced or removed (docs/security.md).

use crate::error::{Error, Result};
use crate::model::Snapshot;
use crate::report;
use crate::safe_fs;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The manifest file in every bundle.
pub const MANIFEST: &str = "wedgewatch-bundle.json";
const MANIFEST_SCHEMA: &str = "wedgewatch.bundle/1";
const MAX_MANIFEST_BYTES: u64 = 1 << 20;

/// What may be done to an existing bundle directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overwrite {
    /// Refuse any non-empty directory.
    Refuse,
    /// Replace a previous bundle's own files (`--force`); refuse anything else.
    PreviousBundle,
}

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    schema: String,
    files: Vec<String>,
}

/// What is at the target path.
enum Target {
    Absent,
    EmptyDir,
    PreviousBundle(Manifest),
}

/// Whether `rel` is a name wedgewatch writes into a bundle; a manifest listing anything
/// else (`../x`, `/etc/passwd`) was not written by wedgewatch and is not believed.
fn is_bundle_file(rel: &str) -> bool {
    let stem_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    match rel {
        "snapshot.json" | "report.md" => true,
        _ => rel
            .strip_prefix("raw/")
            .and_then(|r| r.strip_suffix(".json"))
            .is_some_and(stem_ok),
    }
}

fn read_manifest(dir: &Path) -> Option<Manifest> {
    let f = safe_fs::open_input(&dir.join(MANIFEST)).ok()?;
    let mut text = String::new();
    f.take(MAX_MANIFEST_BYTES).read_to_string(&mut text).ok()?;
    let m: Manifest = serde_json::from_str(&text).ok()?;
    (m.schema == MANIFEST_SCHEMA && m.files.iter().all(|f| is_bundle_file(f))).then_some(m)
}

fn inspect(dir: &Path, overwrite: Overwrite) -> Result<Target> {
    let md = match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Target::Absent),
        Err(e) => return Err(Error::io(dir, e)),
        Ok(md) => md,
    };
    let refuse = |why: &str| Err(Error::Other(format!("{}: {why}", dir.display())));
    if md.file_type().is_symlink() {
        return refuse("is a symbolic link; wedgewatch does not write through it");
    }
    if !md.is_dir() {
        return refuse("exists and is not a directory");
    }
    let mut entries = std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))?;
    if entries.next().is_none() {
        return Ok(Target::EmptyDir);
    }
    match (read_manifest(dir), overwrite) {
        (None, _) => refuse(
            "exists, is not empty and is not a wedgewatch bundle; choose another -o directory",
        ),
        (Some(_), Overwrite::Refuse) => refuse(
            "holds a previous wedgewatch bundle; pass --force to replace its files \
             (nothing else in the directory is touched)",
        ),
        (Some(m), Overwrite::PreviousBundle) => {
            safe_fs::verify_private_dir(dir)?;
            Ok(Target::PreviousBundle(m))
        }
    }
}

/// Refuses early (before sampling) a target [`write_bundle`] would refuse.
pub fn check_bundle_target(dir: &Path, overwrite: Overwrite) -> Result<()> {
    inspect(dir, overwrite).map(drop)
}

/// The bundle's files by relative path (raw stems made file-name safe).
fn bundle_files(
    snapshot: &Snapshot,
    raw: &BTreeMap<String, serde_json::Value>,
) -> Result<BTreeMap<String, Vec<u8>>> {
    let mut files = BTreeMap::new();
    files.insert(
        "snapshot.json".to_string(),
        serde_json::to_vec_pretty(snapshot)?,
    );
    files.insert(
        "report.md".to_string(),
        report::render(snapshot).into_bytes(),
    );
    for (stem, v) in raw {
        let safe: String = stem
            .chars()
            .map(|c| match c {
                'a'..='z' | 'A'..='Z' | '0'..='9' | '-' | '_' => c,
                _ => '_',
            })
            .collect();
        let safe = if safe.is_empty() { "_".into() } else { safe };
        files.insert(format!("raw/{safe}.json"), serde_json::to_vec_pretty(v)?);
    }
    Ok(files)
}

fn manifest_bytes(files: &BTreeMap<String, Vec<u8>>) -> Result<Vec<u8>> {
    let m = Manifest {
        schema: MANIFEST_SCHEMA.to_string(),
        files: files.keys().cloned().collect(),
    };
    Ok(serde_json::to_vec_pretty(&m)?)
}

fn create_private_subdir(path: &Path) -> Result<()> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(|e| Error::io(path, e))
}

fn write_new_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = safe_fs::create_new_private_file(path).map_err(|e| Error::io(path, e))?;
    f.write_all(bytes).map_err(|e| Error::io(path, e))?;
    f.sync_all().map_err(|e| Error::io(path, e))
}

/// Replaces one file atomically: a new file beside it, renamed over it (a rename replaces a
/// link at the target, it never writes through it).
fn replace_file(path: &Path, bytes: &[u8]) -> Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.unwrap_or_default(),
        std::process::id()
    ));
    write_new_file(&tmp, bytes)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}

/// Writes `snapshot.json`, `report.md`, `raw/<stem>.json` and the manifest into `dir`. See the
/// module documentation for what happens to an existing directory.
pub fn write_bundle(
    snapshot: &Snapshot,
    raw: &BTreeMap<String, serde_json::Value>,
    dir: &Path,
    overwrite: Overwrite,
) -> Result<()> {
    let target = inspect(dir, overwrite)?;
    // The bundle writer is a choke point too: whatever a caller assembled, the files get
    // today's redaction (unless taken with `--no-redact`), raw files included.
    let (mut snapshot, mut raw) = (snapshot.clone(), raw.clone());
    if snapshot.redacted {
        super::redact_outputs(&mut crate::redact::Redactor::new(), &mut snapshot, &mut raw);
    }
    let files = bundle_files(&snapshot, &raw)?;
    match target {
        Target::Absent | Target::EmptyDir => write_fresh(&files, dir),
        Target::PreviousBundle(old) => replace_previous(&files, &old, dir),
    }
}

fn temp_beside(dir: &Path) -> Result<PathBuf> {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .ok_or_else(|| Error::Other(format!("{}: not a directory name", dir.display())))?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| Error::io(&parent, e))?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    Ok(parent.join(format!(".{name}.tmp-{}-{stamp}", std::process::id())))
}

/// A new bundle: written whole in a fresh temporary directory, then renamed into place. The
/// rename replaces nothing but an empty directory (it fails on a non-empty one).
fn write_fresh(files: &BTreeMap<String, Vec<u8>>, dir: &Path) -> Result<()> {
    let tmp = temp_beside(dir)?;
    create_private_subdir(&tmp)?;
    let result = (|| -> Result<()> {
        create_private_subdir(&tmp.join("raw"))?;
        for (rel, bytes) in files {
            write_new_file(&tmp.join(rel), bytes)?;
        }
        write_new_file(&tmp.join(MANIFEST), &manifest_bytes(files)?)?;
        std::fs::rename(&tmp, dir).map_err(|e| Error::io(dir, e))
    })();
    if result.is_err() {
        // created exclusively above and 0700: it holds only what we just wrote
        let _ = std::fs::remove_dir_all(&tmp);
    }
    result
}

/// `--force` over a previous bundle: its listed files are replaced or removed; anything else
/// stays. The manifest is written last, so it never lists a file not yet there.
fn replace_previous(files: &BTreeMap<String, Vec<u8>>, old: &Manifest, dir: &Path) -> Result<()> {
    let raw = dir.join("raw");
    match std::fs::symlink_metadata(&raw) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_private_subdir(&raw)?,
        _ => safe_fs::verify_private_dir(&raw)?,
    }
    for (rel, bytes) in files {
        replace_file(&dir.join(rel), bytes)?;
    }
    for stale in old.files.iter().filter(|f| !files.contains_key(*f)) {
        let path = dir.join(stale);
        let is_file = std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_dir());
        if is_file {
            std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
        }
    }
    replace_file(&dir.join(MANIFEST), &manifest_bytes(files)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_names_wedgewatch_writes_are_believed_from_a_manifest() {
        for ok in [
            "snapshot.json",
            "report.md",
            "raw/processes.json",
            "raw/a_b-1.json",
        ] {
            assert!(is_bundle_file(ok), "{ok}");
        }
        for bad in [
            "../x",
            "/etc/passwd",
            "raw/../../x.json",
            "raw/.json",
            "notes.txt",
            "raw/a/b.json",
            "raw",
        ] {
            assert!(!is_bundle_file(bad), "{bad}");
        }
    }
}
