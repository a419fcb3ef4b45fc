//! Issue 34 item 4: what a hostile snapshot becomes once parsed is bounded, not only its
//! bytes. 16 MiB of small objects (`{"a":0},` in a component's free-form process facts)
//! took 1.5 GB in `merge`/`fleet --json`, 2.9 GB in `diff`, 3.2 GB in `report`. Every
//! reader of snapshots is the real binary here, its peak RSS read with `wait4`: each
//! refuses the text with one line and exit 2 (`fleet snapshot` leaves the node out and
//! merges the rest) and stays small. Alone in its test binary: a child's peak RSS counts the
//! pages it shared with the test process before `exec`, so a big test process would
//! inflate it.

// libc calls (tcp_info, rusage, ptys, a counting allocator) that std does not wrap.
#![allow(unsafe_code)]

use wedgewatch_testkit::fleet;

use fleet::*;
use serde_json::Value;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Peak RSS allowed to a reader refusing a 16 MiB text (the text, the binary, one pass).
const REFUSING_RSS_KIB: i64 = 192 * 1024;

/// A snapshot of node B whose first component's `processes` is `n` small objects.
fn small_objects(n: usize) -> String {
    let mut v = node_b(1, 0, "waiting_first_byte", A_IP);
    v["components"][0]["processes"] = Value::Array(Vec::new());
    let text = v.to_string();
    let at = text.find("\"processes\":[]").expect("the field") + "\"processes\":[".len();
    let mut out = String::with_capacity(text.len() + 8 * n);
    out.push_str(&text[..at]);
    for i in 0..n {
        out.push_str(if i == 0 { "{\"a\":0}" } else { ",{\"a\":0}" });
    }
    out.push_str(&text[at..]);
    out
}

/// Runs the binary: exit code, stderr, peak RSS in KiB (`wait4`'s `ru_maxrss`).
fn run(args: &[&str], env: &[(&str, &Path)]) -> (Option<i32>, String, i64) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn wedgewatch");
    let mut err = String::new();
    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
    let mut status = 0;
    // SAFETY: zeroed rusage is a valid value; wait4 fills it for our own unreaped child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on the pid of a child we spawned and have not waited for.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    assert!(pid > 0, "wait4");
    let _ = child.wait();
    let code = libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status));
    (code, err, ru.ru_maxrss)
}

struct Files {
    _dir: tempfile::TempDir,
    hostile: PathBuf,
    good: PathBuf,
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    // 16 MiB of small objects, as the repro
    let text = small_objects(16 << 20 >> 3);
    assert!(text.len() >= 16 << 20);
    let hostile = dir.path().join("hostile.json");
    std::fs::write(&hostile, text).unwrap();
    let good = dir.path().join("nodea.json");
    std::fs::write(&good, node_a(2).to_string()).unwrap();
    Files {
        _dir: dir,
        hostile,
        good,
    }
}

fn assert_refused(what: &str, (code, err, rss): (Option<i32>, String, i64)) {
    assert_eq!(code, Some(2), "{what}: {err}");
    assert_eq!(err.lines().count(), 1, "{what}: one line: {err}");
    assert!(err.contains("too big to read"), "{what}: {err}");
    assert!(
        rss < REFUSING_RSS_KIB,
        "{what}: peak RSS {} MiB refusing 16 MiB",
        rss >> 10
    );
    eprintln!("{what}: refused, peak RSS {} MiB", rss >> 10);
}

#[test]
fn every_reader_refuses_16_mib_of_small_objects_in_bounded_memory() {
    let f = files();
    let (h, g) = (f.hostile.to_str().unwrap(), f.good.to_str().unwrap());
    assert_refused("report", run(&["report", h], &[]));
    assert_refused("diff", run(&["diff", g, h], &[]));
    assert_refused("merge", run(&["merge", g, h, "--json"], &[]));
    let out = f._dir.path().join("trace.json");
    let out = out.to_str().unwrap();
    assert_refused(
        "export --from",
        run(&["export", "--perfetto", out, "--from", h], &[]),
    );
    assert_refused("tui --replay", run(&["tui", "--replay", h], &[]));
}

#[test]
fn fleet_leaves_out_a_node_answering_with_16_mib_of_small_objects() {
    let f = files();
    let dir = f._dir.path();
    std::fs::copy(&f.hostile, dir.join("bad-1.json")).unwrap();
    let fake = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fleet/fake-node.sh");
    let via = format!("{} {{node}}", fake.display());
    let args = ["fleet", "snapshot", "--nodes", "nodea,bad-1", "--via", &via];
    let (code, err, rss) = run(
        &[&args[..], &["--json"]].concat(),
        &[("FAKE_FLEET_DIR", dir)],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.lines()
            .any(|l| l.contains("node bad-1 left out") && l.contains("too big to read")),
        "{err}"
    );
    assert!(rss < REFUSING_RSS_KIB, "peak RSS {} MiB", rss >> 10);
    eprintln!("fleet: bad-1 left out, peak RSS {} MiB", rss >> 10);
}

#[test]
fn a_real_snapshot_still_reads() {
    let f = files();
    let (code, err, _) = run(&["report", f.good.to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{err}");
}

/// Just under the limits (480,000 small objects, 4 MB): read, and what `report` becomes
/// stays bounded (it was 1.5 GB for this before the limits; the bound is about twice the
/// 360 MiB the objects take parsed, for the report's own copies).
#[test]
fn just_under_the_limits_a_report_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("under.json");
    std::fs::write(&path, small_objects(480_000)).unwrap();
    let (code, err, rss) = run(&["report", path.to_str().unwrap()], &[]);
    assert_eq!(code, Some(0), "{err}");
    assert!(rss < 1 << 20, "peak RSS {} MiB", rss >> 10);
    eprintln!("report just under the limits: peak RSS {} MiB", rss >> 10);
}
