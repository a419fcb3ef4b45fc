//! Bad configuration (`--thresholds FILE`, probe TOML) never panics: the real binary exits 2
//! with one line naming the file and the key (issue 10, item 8).

use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, wedgewatch};
use std::path::{Path, PathBuf};

fn recording() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/wedged-decode.rec")
}

/// Runs the binary; (exit code, stderr).
fn run(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let out = wedgewatch().args(args).output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

/// Exit 2, one line, naming the file and every word of `want`, and no panic.
fn assert_rejected(case: &str, (code, stderr): (i32, String), file: &str, want: &[&str]) {
    assert_eq!(code, 2, "{case}: exit code; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{case}: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "{case}: one line: {stderr}"
    );
    assert!(stderr.contains(file), "{case}: names the file: {stderr}");
    for w in want {
        assert!(stderr.contains(w), "{case}: names {w:?}: {stderr}");
    }
}

fn snapshot_with_thresholds(path: &Path) -> (i32, String) {
    run(&[
        "--thresholds".as_ref(),
        path.as_os_str(),
        "snapshot".as_ref(),
        "--json".as_ref(),
        "--from".as_ref(),
        recording().as_os_str(),
    ])
}

#[test]
fn bad_thresholds_exit_2_naming_the_key() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cases = [
        ("link_window_ms = -1000", "link_window_ms"),
        ("link_slack_ms = -5", "link_slack_ms"),
        ("link_window_ms = 9223372036854775807", "link_window_ms"),
        ("wedged_after_ms = 0", "wedged_after_ms"),
        ("stall_after_ms = -1", "stall_after_ms"),
        ("done_quiet_ms = 0", "done_quiet_ms"),
        ("busy_after_ms = 99999999999999", "busy_after_ms"),
        ("queue_after_ms = -30000", "queue_after_ms"),
        ("accumulate_window_ms = 0", "accumulate_window_ms"),
        (
            "restart_recent_ms = -9223372036854775808",
            "restart_recent_ms",
        ),
        ("rate_window_ms = 0", "rate_window_ms"),
        ("stale_after_ms = 9223372036854775807", "stale_after_ms"),
        (
            "endpoint_slow_ms = 18446744073709551615",
            "endpoint_slow_ms",
        ),
        ("endpoint_slow_ms = -1", "endpoint_slow_ms"),
        ("wedged_overtaken_min = 0", "wedged_overtaken_min"),
        ("wedged_overtaken_min = -3", "wedged_overtaken_min"),
        ("scheduler_min_dumps = 0", "scheduler_min_dumps"),
        ("endpoint_failures = 0", "endpoint_failures"),
        ("accumulate_min_fds = 4294967296", "accumulate_min_fds"),
        ("accumulate_min_threads = 0", "accumulate_min_threads"),
        (
            "accumulate_close_wait_silent_min = 0",
            "accumulate_close_wait_silent_min",
        ),
        (
            "accumulate_close_wait_silent_ms = -1",
            "accumulate_close_wait_silent_ms",
        ),
        ("busy_util_pct = 101", "busy_util_pct"),
        ("busy_sm_pct = 0", "busy_sm_pct"),
        ("spin_util_pct = 1000", "spin_util_pct"),
        ("spin_power_frac = nan", "spin_power_frac"),
        ("spin_power_frac = inf", "spin_power_frac"),
        ("spin_power_frac = 0.0", "spin_power_frac"),
        ("wedged_after_ms = \"30s\"", "wedged_after_ms"),
        ("wedge_after = 1", "wedge_after"),
        ("wedged_after_ms = ", "line 2"),
    ];
    for (i, (text, key)) in cases.iter().enumerate() {
        let name = format!("th{i}.toml");
        let p = tmp.path().join(&name);
        std::fs::write(&p, format!("# bad\n{text}\n")).expect("write");
        assert_rejected(text, snapshot_with_thresholds(&p), &name, &[key]);
    }
}

#[test]
fn thresholds_at_their_limits_replay_without_panic() {
    let tmp = tempfile::tempdir().expect("tmp");
    let durations = [
        "wedged_after_ms",
        "stall_after_ms",
        "done_quiet_ms",
        "busy_after_ms",
        "queue_after_ms",
        "accumulate_window_ms",
        "accumulate_close_wait_silent_ms",
        "restart_recent_ms",
        "link_window_ms",
        "rate_window_ms",
        "stale_after_ms",
        "endpoint_slow_ms",
    ];
    let counts = [
        "wedged_overtaken_min",
        "scheduler_min_dumps",
        "endpoint_failures",
        "accumulate_min_connections",
        "accumulate_min_close_wait",
        "accumulate_min_fds",
        "accumulate_min_threads",
        "accumulate_close_wait_silent_min",
    ];
    let pcts = ["busy_util_pct", "busy_sm_pct", "spin_util_pct"];
    let edge = |d: &str, s: &str, c: &str, p: &str, f: &str| {
        let mut t = String::new();
        durations.iter().for_each(|k| t += &format!("{k} = {d}\n"));
        t += &format!("link_slack_ms = {s}\n");
        counts.iter().for_each(|k| t += &format!("{k} = {c}\n"));
        pcts.iter().for_each(|k| t += &format!("{k} = {p}\n"));
        t + &format!("spin_power_frac = {f}\n")
    };
    let highest = edge("2592000000", "2592000000", "1000000", "100", "1.0");
    let lowest = edge("1", "0", "1", "1", "0.001");
    for (name, text) in [("highest.toml", highest), ("lowest.toml", lowest)] {
        let p = tmp.path().join(name);
        std::fs::write(&p, text).expect("write");
        let (code, stderr) = snapshot_with_thresholds(&p);
        assert_eq!(code, 0, "{name}: {stderr}");
    }
}

fn snapshot_with_probe(tmp: &Path, name: &str, text: &str) -> (i32, String) {
    let dir = tmp.join(name.replace(".toml", ""));
    std::fs::create_dir(&dir).expect("mkdir");
    std::fs::write(dir.join(name), text).expect("write");
    run(&[
        "--probes".as_ref(),
        dir.as_os_str(),
        "snapshot".as_ref(),
        "--json".as_ref(),
        "--proc-root".as_ref(),
        fixture_proc("container").as_os_str(),
    ])
}

const PROFILE: &str =
    "[[profile]]\nname = \"p\"\nstack = \"s\"\nrole = \"engine\"\nmatch_comm = [\"x\"]\n";
const RULE: &str = "[[stack_rule]]\nname = \"r\"\nstate = \"idle\"\ninnermost = [\"f\"]\n";
const MAP: &str = "[[metric_map]]\nstack = \"s\"\nkind = \"gauge\"\nseries = [\"x\"]\n";

#[test]
fn bad_probe_files_exit_2_naming_the_key() {
    let tmp = tempfile::tempdir().expect("tmp");
    let cases: Vec<(String, &[&str])> = vec![
        (format!("{PROFILE}default_port = 0\n"), &["default_port"]),
        (format!("{PROFILE}default_port = -1\n"), &["default_port"]),
        (
            format!("{PROFILE}default_port = 70000\n"),
            &["default_port"],
        ),
        (
            format!("{PROFILE}metrics_default_port = 0\n"),
            &["metrics_default_port"],
        ),
        (format!("{PROFILE}priority = 99999999999\n"), &["priority"]),
        (
            format!("{PROFILE}metrics_path = \"metrics\"\n"),
            &["metrics_path"],
        ),
        (
            format!("{PROFILE}workers_endpoint = \"w\"\n"),
            &["workers_endpoint"],
        ),
        (
            format!("{PROFILE}match_cmdlin = [\"x\"]\n"),
            &["match_cmdlin"],
        ),
        (
            format!("{PROFILE}match_title = [\"(\"]\n"),
            &["match_title"],
        ),
        (PROFILE.replace("\"p\"", "\"\""), &["empty name"]),
        (format!("{RULE}innermost_depth = 0\n"), &["innermost_depth"]),
        (
            format!("{RULE}innermost_depth = -2\n"),
            &["innermost_depth"],
        ),
        (
            format!("{RULE}innermost_depth = 100000000\n"),
            &["innermost_depth"],
        ),
        (format!("{RULE}priority = \"high\"\n"), &["priority"]),
        (format!("{RULE}frame = [\"x\"]\n"), &["frame"]),
        (
            format!("{MAP}roles = [\"engine\"]\nname = \"queue_total\"\n"),
            &["queue_total", "_total"],
        ),
        (format!("{MAP}name = \"q\"\nroles = []\n"), &["roles"]),
        (
            format!("{MAP}roles = [\"engine\"]\nname = \"q\"\naggregate = \"mean\"\n"),
            &["mean"],
        ),
        ("[[profile]]\nname = 3\n".into(), &["name"]),
        ("[profile\n".into(), &["line 1"]),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let name = format!("probe{i}.toml");
        let got = snapshot_with_probe(tmp.path(), &name, text);
        assert_rejected(text, got, &name, want);
    }
}

#[test]
fn endless_or_special_config_files_are_refused() {
    let (code, stderr) = snapshot_with_thresholds(Path::new("/dev/zero"));
    assert_rejected("/dev/zero", (code, stderr), "/dev/zero", &["larger than"]);
    let tmp = tempfile::tempdir().expect("tmp");
    let fifo = tmp.path().join("fifo.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
    let got = run(&[
        "--probes".as_ref(),
        tmp.path().as_os_str(),
        "snapshot".as_ref(),
        "--json".as_ref(),
        "--proc-root".as_ref(),
        fixture_proc("container").as_os_str(),
    ]);
    assert_rejected("fifo", got, "fifo.toml", &["not a regular file"]);
}

#[test]
fn an_at_offset_past_the_end_of_time_is_a_bad_at() {
    for at in [
        "+9223372036854775807s",
        "+9223372036854775807h",
        "+99999999999999999999",
    ] {
        let got = run(&[
            "snapshot".as_ref(),
            "--json".as_ref(),
            "--from".as_ref(),
            recording().as_os_str(),
            "--at".as_ref(),
            at.as_ref(),
        ]);
        assert_rejected(at, got, at, &["--at"]);
    }
}
