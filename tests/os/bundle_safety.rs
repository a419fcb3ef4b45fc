//! `snapshot -o DIR` never deletes or overwrites what wedgewatch did not write: a non-empty
//! directory is refused (exit 2), `--force` replaces only a previous bundle's own files (its
//! manifest's), and bundle files are owner-only.

use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, wedgewatch};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use wedgewatch::snapshot::{self, AssembleOptions, Overwrite, SnapshotParts};

fn snapshot_into(dir: &Path, force: bool) -> std::process::Output {
    let mut cmd = wedgewatch();
    cmd.args(["snapshot", "--no-daemon", "--window", "0", "--proc-root"])
        .arg(fixture_proc("container"))
        .arg("-o")
        .arg(dir);
    if force {
        cmd.arg("--force");
    }
    cmd.output().expect("run wedgewatch")
}

fn snap(taken_at_ms: i64) -> wedgewatch::model::Snapshot {
    let parts = SnapshotParts {
        taken_at_ms,
        ..SnapshotParts::default()
    };
    snapshot::assemble(parts, &AssembleOptions::default())
}

fn raw(stems: &[&str]) -> BTreeMap<String, serde_json::Value> {
    stems
        .iter()
        .map(|s| (s.to_string(), serde_json::json!({ "stem": s })))
        .collect()
}

#[test]
fn a_directory_with_user_files_is_refused_and_left_alone() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("work");
    std::fs::create_dir_all(dir.join("notes")).expect("mkdir");
    // a user's own snapshot.json is not a bundle wedgewatch wrote
    std::fs::write(dir.join("snapshot.json"), "{\"mine\": true}").expect("write");
    std::fs::write(dir.join("notes/todo.txt"), "keep me").expect("write");
    for force in [false, true] {
        let out = snapshot_into(&dir, force);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "force={force}: {err}");
        assert!(err.contains("not a wedgewatch bundle"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert_eq!(
            std::fs::read_to_string(dir.join("notes/todo.txt")).expect("kept"),
            "keep me"
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("snapshot.json")).expect("kept"),
            "{\"mine\": true}"
        );
    }
}

#[test]
fn force_replaces_only_a_previous_bundles_own_files() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("bundle");
    snapshot::write_bundle(&snap(1_000), &raw(&["a", "b"]), &dir, Overwrite::Refuse)
        .expect("first bundle");
    std::fs::write(dir.join("notes.txt"), "mine").expect("write");
    std::fs::write(dir.join("raw/mine.json"), "{}").expect("write");
    let before = std::fs::read_to_string(dir.join("snapshot.json")).expect("read");

    let e = snapshot::write_bundle(&snap(2_000), &raw(&["a"]), &dir, Overwrite::Refuse)
        .expect_err("no --force");
    assert!(e.to_string().contains("--force"), "{e}");
    snapshot::write_bundle(&snap(2_000), &raw(&["a"]), &dir, Overwrite::PreviousBundle)
        .expect("--force");

    let after = std::fs::read_to_string(dir.join("snapshot.json")).expect("read");
    assert_ne!(before, after, "the bundle's files were replaced");
    assert!(dir.join("raw/a.json").is_file());
    assert!(
        !dir.join("raw/b.json").exists(),
        "the old bundle's own file is gone"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("notes.txt")).expect("kept"),
        "mine"
    );
    assert!(dir.join("raw/mine.json").is_file(), "not listed: kept");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .expect("ls")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "no temporary files left: {left:?}");
}

fn assert_owner_only(path: &Path) {
    let md = std::fs::symlink_metadata(path).expect("stat");
    let mode = md.permissions().mode() & 0o777;
    let want = if md.is_dir() { 0o700 } else { 0o600 };
    assert_eq!(mode, want, "{}: {mode:o}", path.display());
    if md.is_dir() {
        for e in std::fs::read_dir(path).expect("ls").flatten() {
            assert_owner_only(&e.path());
        }
    }
}

#[test]
fn bundle_files_are_owner_only() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("bundle");
    let out = snapshot_into(&dir, false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.join("raw/processes.json").is_file());
    assert!(dir.join(snapshot::MANIFEST).is_file());
    assert_owner_only(&dir);
}

#[test]
fn a_symlink_as_the_bundle_directory_is_not_followed() {
    let tmp = tempfile::tempdir().expect("tmp");
    let elsewhere = tmp.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).expect("mkdir");
    let link = tmp.path().join("bundle");
    std::os::unix::fs::symlink(&elsewhere, &link).expect("ln");
    let out = snapshot_into(&link, true);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("symbolic link"));
    assert_eq!(std::fs::read_dir(&elsewhere).expect("ls").count(), 0);
}
