//! `report -o FILE` and `export --perfetto FILE` as root on a shared host (issue 34, item 1):
//! never through a symbolic link another user planted (as the file, or as a directory on the
//! way, in a sticky directory like `/tmp`), never over a file another user owns; a new file
//! is created exclusively and a file of our own is replaced whole. "Another user" is uid
//! 65534 (nobody): links and files chowned to it.

use std::os::unix::fs::{lchown, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;

const NOBODY: u32 = 65534;

fn not_root() -> bool {
    let skip = !nix::unistd::geteuid().is_root();
    if skip {
        eprintln!("skipped: needs root to play another user");
    }
    skip
}

fn snapshot_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots/wedged.json")
}

/// A sticky, world-writable directory (like `/tmp`) and root's file an attacker aims at.
struct Shared {
    _tmp: tempfile::TempDir,
    sticky: PathBuf,
    victim: PathBuf,
}

fn shared() -> Shared {
    let tmp = tempfile::tempdir().expect("tmp");
    let sticky = tmp.path().join("sticky");
    std::fs::create_dir(&sticky).expect("mkdir");
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    let victim = tmp.path().join("root-owned");
    std::fs::write(&victim, "keep\n").expect("write");
    Shared {
        _tmp: tmp,
        sticky,
        victim,
    }
}

/// `name` in the sticky directory: a symbolic link to `target` owned by nobody.
fn plant_link(dir: &Path, name: &str, target: &Path) -> PathBuf {
    let link = dir.join(name);
    std::os::unix::fs::symlink(target, &link).expect("ln");
    lchown(&link, Some(NOBODY), Some(NOBODY)).expect("chown the link");
    link
}

/// Both writing verbs, each writing to `out`.
fn write_verbs(out: &Path) -> Vec<(&'static str, Output)> {
    let run = |args: Vec<std::ffi::OsString>| {
        std::process::Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
            .args(args)
            .output()
            .expect("run wedgewatch")
    };
    let snap = snapshot_file();
    vec![
        (
            "report -o",
            run(vec![
                "report".into(),
                snap.clone().into(),
                "-o".into(),
                out.into(),
            ]),
        ),
        (
            "export --perfetto",
            run(vec![
                "export".into(),
                "--perfetto".into(),
                out.into(),
                "--from".into(),
                snap.into(),
            ]),
        ),
    ]
}

fn assert_refused(verb: &str, out: &Output, says: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{verb}: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{verb}: one line: {err}");
    assert!(err.contains(says), "{verb}: {err}");
}

#[test]
fn a_link_planted_by_another_user_is_not_written_through() {
    if not_root() {
        return;
    }
    let s = shared();
    let out = plant_link(&s.sticky, "out.json", &s.victim);
    for (verb, o) in write_verbs(&out) {
        assert_refused(verb, &o, "symbolic link");
        assert_eq!(std::fs::read_to_string(&s.victim).expect("read"), "keep\n");
        assert!(std::fs::symlink_metadata(&out).expect("kept").is_symlink());
    }
}

#[test]
fn a_directory_link_planted_by_another_user_is_not_followed() {
    if not_root() {
        return;
    }
    let s = shared();
    let target_dir = s.victim.with_file_name("root-dir");
    std::fs::create_dir(&target_dir).expect("mkdir");
    let reports = plant_link(&s.sticky, "reports", &target_dir);
    for (verb, o) in write_verbs(&reports.join("out.json")) {
        assert_refused(verb, &o, "owned by uid 65534");
        let made: Vec<_> = std::fs::read_dir(&target_dir).expect("ls").collect();
        assert!(made.is_empty(), "{verb} wrote into the link's target");
    }
}

#[test]
fn man_dir_does_not_write_through_a_planted_page_link() {
    if not_root() {
        return;
    }
    let s = shared();
    let page = plant_link(&s.sticky, "wedgewatch.1", &s.victim);
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(["man", "--dir"])
        .arg(&s.sticky)
        .output()
        .expect("run wedgewatch");
    assert_refused("man --dir", &o, "symbolic link");
    assert_eq!(std::fs::read_to_string(&s.victim).expect("read"), "keep\n");
    assert!(std::fs::symlink_metadata(&page).expect("kept").is_symlink());
}

/// `record -o FILE` for half a second of a fixture tree.
fn record_to(out: &Path) -> Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(["record", "--for", "500ms", "--proc-root"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/proc/container"))
        .arg("-o")
        .arg(out)
        .output()
        .expect("run wedgewatch")
}

#[test]
fn record_o_does_not_follow_a_planted_directory_nor_append_to_anothers_file() {
    if not_root() {
        return;
    }
    let s = shared();
    let target_dir = s.victim.with_file_name("root-dir");
    std::fs::create_dir(&target_dir).expect("mkdir");
    let recs = plant_link(&s.sticky, "recs", &target_dir);
    assert_refused(
        "record -o",
        &record_to(&recs.join("r.wwrec")),
        "owned by uid 65534",
    );
    assert_eq!(std::fs::read_dir(&target_dir).expect("ls").count(), 0);
    let theirs = s.sticky.join("theirs.wwrec");
    std::fs::write(&theirs, "theirs\n").expect("write");
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).expect("chown");
    assert_refused("record -o", &record_to(&theirs), "belongs to uid 65534");
    assert_eq!(std::fs::read_to_string(&theirs).expect("read"), "theirs\n");
}

#[test]
fn a_file_another_user_owns_is_not_overwritten() {
    if not_root() {
        return;
    }
    let s = shared();
    let theirs = s.sticky.join("theirs.json");
    std::fs::write(&theirs, "theirs\n").expect("write");
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).expect("chown");
    for (verb, o) in write_verbs(&theirs) {
        assert_refused(verb, &o, "belongs to uid 65534");
        assert_eq!(std::fs::read_to_string(&theirs).expect("read"), "theirs\n");
    }
}

#[test]
fn a_new_file_is_owner_only_and_our_own_is_replaced_whole() {
    let s = shared();
    let out = s.sticky.join("mine.json");
    for (verb, o) in write_verbs(&out) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{verb}: {err}");
        let md = std::fs::symlink_metadata(&out).expect("written");
        assert!(md.is_file() && md.len() > 100, "{verb}");
        assert_eq!(md.mode() & 0o777, 0o600, "{verb}");
        assert_eq!(md.uid(), nix::unistd::geteuid().as_raw());
    }
    let left: Vec<_> = std::fs::read_dir(&s.sticky)
        .expect("ls")
        .flatten()
        .collect();
    assert_eq!(left.len(), 1, "no temporary file left: {left:?}");
}
