//! The command line's contract, through the real binary on committed fixtures (issue 13,
//! items 2-5, 9, 11): exit codes, `check`, machine output, `-` as stdout, loud bad input,
//! one duration grammar, quiet progress, completions and man pages, help.

// libc calls (tcp_info, rusage, ptys, a counting allocator) that std does not wrap.
#![allow(unsafe_code)]

use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, wedgewatch};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

fn recording() -> PathBuf {
    fixture("recordings/wedged-decode.rec")
}

/// Thresholds under which the recording's 8-23 s old requests are wedged.
fn short_hang() -> PathBuf {
    fixture("recordings/short-hang-thresholds.toml")
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run_in<I, S>(dir: Option<&Path>, args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut cmd = wedgewatch();
    cmd.args(args).stdin(std::process::Stdio::null());
    if let Some(d) = dir {
        cmd.current_dir(d);
    }
    let out = cmd.output().expect("run wedgewatch");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn run<I, S>(args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_in(None, args)
}

/// Exit 2 with one line on stderr containing every `want`, nothing on stdout.
fn assert_usage(case: &str, o: &Out, want: &[&str]) {
    assert_eq!(o.code, 2, "{case}: exit code; stderr: {}", o.stderr);
    assert!(o.stdout.is_empty(), "{case}: stdout: {}", o.stdout);
    assert_eq!(
        o.stderr.trim_end().lines().count(),
        1,
        "{case}: one line: {}",
        o.stderr
    );
    assert!(!o.stderr.contains("panicked"), "{case}: {}", o.stderr);
    for w in want {
        assert!(o.stderr.contains(w), "{case}: wants {w:?}: {}", o.stderr);
    }
}

fn os(p: &Path) -> &OsStr {
    p.as_os_str()
}

#[test]
fn check_follows_the_monitoring_plugin_convention() {
    // wedged under the short thresholds: CRITICAL, one line per finding after the status
    let o = run([
        OsStr::new("check"),
        "--thresholds".as_ref(),
        os(&short_hang()),
        "--from".as_ref(),
        os(&recording()),
    ]);
    assert_eq!(o.code, 2, "{}{}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(
        lines[0].starts_with("WEDGEWATCH CRITICAL - "),
        "{}",
        o.stdout
    );
    assert!(lines[0].contains("| findings="), "perfdata: {}", o.stdout);
    assert!(
        lines[1..]
            .iter()
            .any(|l| l.starts_with("CRITICAL wedged_request at decode@")),
        "{}",
        o.stdout
    );
    let n: usize = lines[0]
        .split("findings=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("findings=N");
    let unseen = lines
        .iter()
        .filter(|l| l.starts_with("UNAVAILABLE "))
        .count();
    assert_eq!(
        lines.len(),
        1 + n + unseen,
        "one line per finding, then per source not seen: {}",
        o.stdout
    );

    // the same moment as JSON
    let o = run([
        OsStr::new("check"),
        "--json".as_ref(),
        "--thresholds".as_ref(),
        os(&short_hang()),
        "--from".as_ref(),
        os(&recording()),
    ]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("check --json");
    assert_eq!(v["schema"], "wedgewatch.check/1");
    assert_eq!(v["status"], "CRITICAL");
    assert_eq!(v["exit_code"], 2);
    assert!(v["findings"]
        .as_array()
        .is_some_and(|f| f.iter().any(|f| f["kind"] == "wedged_request")));

    // the first second of the recording, default thresholds: nothing wedged yet
    let o = run([
        OsStr::new("check"),
        "--fail-on".as_ref(),
        "critical".as_ref(),
        "--from".as_ref(),
        os(&recording()),
        "--at".as_ref(),
        "1s".as_ref(),
    ]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    assert!(o.stdout.starts_with("WEDGEWATCH OK - "), "{}", o.stdout);
}

/// The fixture recording with every decode component id replaced by `id` (a look-alike
/// started with such a `--host`), each line's checksum recomputed.
fn recording_with_decode_id(dir: &Path, id: &str) -> PathBuf {
    let text = std::fs::read_to_string(recording()).expect("fixture");
    let json_id = serde_json::to_string(id).expect("json");
    let json_id = &json_id[1..json_id.len() - 1];
    let mut out = String::new();
    for line in text.lines() {
        let json = line
            .get(9..)
            .expect("crc, space, JSON")
            .replace("decode@127.0.0.1:", json_id);
        let crc = wedgewatch::record::crc32(json.as_bytes());
        out.push_str(&format!("{crc:08x} {json}\n"));
    }
    let path = dir.join("hostile.rec");
    std::fs::write(&path, out).expect("write");
    path
}

/// Whatever host text `check` quotes, its output keeps the plugin grammar (issue 34 item 6):
/// one status line with the only `|` (perfdata, our labels only), then one line per finding,
/// each starting with its severity; an UNKNOWN naming a hostile path is one line too.
#[test]
fn check_output_cannot_be_injected_by_host_text() {
    let tmp = tempfile::tempdir().expect("tmp");
    let evil = "decode\nOK injected | evil=1;2;3 'x'=4\rCRITICAL more @127.0.0.1:";
    let rec = recording_with_decode_id(tmp.path(), evil);
    let o = run([
        OsStr::new("check"),
        "--thresholds".as_ref(),
        os(&short_hang()),
        "--from".as_ref(),
        os(&rec),
    ]);
    assert_eq!(o.code, 2, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.contains("injected"),
        "the finding quotes the id: {}",
        o.stdout
    );
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert!(!o.stdout.contains('\r'), "{:?}", o.stdout);
    assert!(
        lines[0].starts_with("WEDGEWATCH CRITICAL - "),
        "{}",
        o.stdout
    );
    assert_eq!(
        o.stdout.matches('|').count(),
        1,
        "only the perfdata bar: {}",
        o.stdout
    );
    let perf = lines[0].split('|').nth(1).unwrap_or_default();
    let labels: Vec<&str> = perf
        .split_whitespace()
        .map(|p| p.split('=').next().unwrap_or_default())
        .collect();
    assert_eq!(
        labels,
        ["findings", "critical", "warning", "info", "unavailable"],
        "{}",
        o.stdout
    );
    let count = |label: &str| -> usize {
        perf.split(&format!("{label}="))
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .expect("label=N")
    };
    let (n, unseen) = (count("findings"), count("unavailable"));
    assert_eq!(
        lines.len(),
        1 + n + unseen,
        "one line per finding and per source not seen: {}",
        o.stdout
    );
    for (i, l) in lines[1..].iter().enumerate() {
        let want: &[&str] = if i < n {
            &["CRITICAL ", "WARNING ", "INFO "]
        } else {
            &["UNAVAILABLE "]
        };
        assert!(
            want.iter().any(|w| l.starts_with(w)),
            "a line that is neither a finding nor a source not seen: {l:?}"
        );
    }

    let bad = tmp.path().join("no\nOK fine | evil=1");
    let o = run([OsStr::new("check"), "--from".as_ref(), os(&bad)]);
    assert_eq!(o.code, 3, "{}{}", o.stdout, o.stderr);
    assert_eq!(o.stdout.lines().count(), 1, "{:?}", o.stdout);
    assert!(!o.stdout.contains('|'), "{:?}", o.stdout);
}

#[test]
fn check_that_cannot_run_is_unknown_not_critical() {
    // a usage error: exit 3 and UNKNOWN on stdout, where the monitoring system looks
    let o = run(["check", "--bogus"]);
    assert_eq!(o.code, 3, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.starts_with("WEDGEWATCH UNKNOWN - "),
        "{}",
        o.stdout
    );
    // bad input: the same
    let o = run(["check", "--from", "/etc/passwd"]);
    assert_eq!(o.code, 3, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.starts_with("WEDGEWATCH UNKNOWN - "),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("does not start with a recording header"),
        "{}",
        o.stdout
    );
    let o = run(["check", "--json", "--from", "/etc/passwd"]);
    assert_eq!(o.code, 3);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["status"], "UNKNOWN");
    assert!(
        v["error"].as_str().is_some_and(|e| e.contains("passwd")),
        "{v}"
    );
    // help is still help
    let o = run(["check", "--help"]);
    assert_eq!(o.code, 0);
    assert!(o.stdout.contains("3 UNKNOWN"), "{}", o.stdout);
}

#[test]
fn snapshot_exits_1_only_when_asked_to_fail_on_findings() {
    let base = |extra: &[&str]| {
        let mut args: Vec<std::ffi::OsString> = vec![
            "snapshot".into(),
            "--json".into(),
            "--thresholds".into(),
            short_hang().into(),
            "--from".into(),
            recording().into(),
        ];
        args.extend(extra.iter().map(|s| s.into()));
        run(args)
    };
    let o = base(&[]);
    assert_eq!(o.code, 0, "default: findings do not fail: {}", o.stderr);
    serde_json::from_str::<serde_json::Value>(&o.stdout).expect("json");
    assert_eq!(base(&["--fail-on", "critical"]).code, 1);
    assert_eq!(base(&["--fail-on", "warning"]).code, 1);
    // early in the recording with the default thresholds nothing is critical
    let mut early: Vec<&OsStr> = vec!["snapshot".as_ref(), "--json".as_ref()];
    let rec = recording();
    early.extend([
        OsStr::new("--from"),
        os(&rec),
        OsStr::new("--at"),
        OsStr::new("1s"),
    ]);
    early.extend([OsStr::new("--fail-on"), OsStr::new("critical")]);
    let o = run(early);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn diff_exits_like_diff_1() {
    let (h, w) = (
        fixture("snapshots/healthy.json"),
        fixture("snapshots/wedged.json"),
    );
    let o = run([OsStr::new("diff"), os(&h), os(&w)]);
    assert_eq!(o.code, 1, "differences: {}", o.stderr);
    assert!(!o.stdout.is_empty());
    let o = run([OsStr::new("diff"), os(&w), os(&w)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout.trim(), "no changes");
    let o = run([OsStr::new("diff"), os(&h), os(&w), "--json".as_ref()]);
    assert_eq!(o.code, 1);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("diff --json");
    assert!(v["changes"].as_array().is_some_and(|c| !c.is_empty()));
    let o = run([OsStr::new("diff"), os(&h), "/etc/passwd".as_ref()]);
    assert_eq!(o.code, 2, "{}", o.stderr);
}

#[test]
fn files_that_are_not_recordings_fail_loudly() {
    let tmp = tempfile::tempdir().expect("tmp");
    let random = tmp.path().join("random.bin");
    std::fs::write(
        &random,
        (0..4096u32)
            .map(|i| (i * 7919 % 251) as u8)
            .collect::<Vec<_>>(),
    )
    .expect("write");
    let snap = fixture("snapshots/wedged.json");
    for (file, want) in [
        (
            PathBuf::from("/etc/passwd"),
            "does not start with a recording header",
        ),
        (random.clone(), "does not start with a recording header"),
        (snap.clone(), "a wedgewatch snapshot, not a recording"),
    ] {
        let o = run([
            OsStr::new("snapshot"),
            "--json".as_ref(),
            "--from".as_ref(),
            os(&file),
        ]);
        assert_usage("snapshot --from", &o, &[want, &file.display().to_string()]);
    }
    let trace = tmp.path().join("trace.json");
    let o = run([
        OsStr::new("export"),
        "--perfetto".as_ref(),
        os(&trace),
        "--from".as_ref(),
        os(&random),
    ]);
    assert_usage("export garbage", &o, &["random.bin"]);
    assert!(!trace.exists());
    // a missing file: one line, the OS error once
    let missing = tmp.path().join("missing.wwrec");
    let o = run([
        OsStr::new("snapshot"),
        "--json".as_ref(),
        "--from".as_ref(),
        os(&missing),
    ]);
    assert_usage("missing", &o, &["missing.wwrec", "No such file"]);
    assert_eq!(o.stderr.matches("No such file").count(), 1, "{}", o.stderr);
}

#[test]
fn at_takes_the_duration_grammar_and_stays_inside_the_recording() {
    let at = |t: &str| {
        run([
            OsStr::new("snapshot"),
            "--json".as_ref(),
            "--from".as_ref(),
            os(&recording()),
            "--at".as_ref(),
            t.as_ref(),
        ])
    };
    let taken = |o: &Out| -> String {
        let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
        v["taken_at"].as_str().unwrap_or_default().to_string()
    };
    let (a, b, c) = (at("5s"), at("+5"), at("5000ms"));
    assert_eq!(a.code, 0, "{}", a.stderr);
    assert_eq!(taken(&a), taken(&b), "a bare number is seconds");
    assert_eq!(taken(&a), taken(&c));
    let end = at("-0s");
    assert_eq!(end.code, 0, "{}", end.stderr);
    assert!(taken(&end) > taken(&a));
    for outside in ["1h", "-1h", "2020-01-01T00:00:00Z"] {
        let o = at(outside);
        assert_usage(
            outside,
            &o,
            &["--at", outside, "outside the recording", "span"],
        );
    }
    let o = at("soon");
    assert_eq!(o.code, 2);
    assert!(
        o.stderr.contains("+1m30s") && o.stderr.contains("RFC 3339"),
        "says the grammar: {}",
        o.stderr
    );
}

#[test]
fn every_duration_flag_takes_one_grammar() {
    let proc = fixture_proc("container");
    for w in ["0", "500ms", "0.2", "1s"] {
        let o = run([
            OsStr::new("snapshot"),
            "--json".as_ref(),
            "--no-daemon".as_ref(),
            "--window".as_ref(),
            w.as_ref(),
            "--proc-root".as_ref(),
            os(&proc),
        ]);
        assert_eq!(o.code, 0, "--window {w}: {}", o.stderr);
    }
    for (args, bad) in [
        (vec!["snapshot", "--json", "--window"], "-3"),
        (vec!["snapshot", "--json", "--window"], "2h"),
        (vec!["snapshot", "--json", "--window"], "3 parsecs"),
        (vec!["record", "-o", "/nonexistent/x", "--for"], "forever"),
        (vec!["daemon", "--for"], "5x"),
        (vec!["demo", "--no-tui", "--for"], "soon"),
    ] {
        let mut a = args.clone();
        a.push(bad);
        let o = run(&a);
        assert_eq!(o.code, 2, "{a:?}: {}", o.stderr);
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn dash_is_stdout() {
    let tmp = tempfile::tempdir().expect("tmp");
    let o = run_in(
        Some(tmp.path()),
        [
            OsStr::new("snapshot"),
            "-o".as_ref(),
            "-".as_ref(),
            "--from".as_ref(),
            os(&recording()),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("snapshot -o -");
    assert_eq!(v["schema"], "wedgewatch.snapshot/1");
    let o = run_in(
        Some(tmp.path()),
        [
            OsStr::new("export"),
            "--perfetto".as_ref(),
            "-".as_ref(),
            "--from".as_ref(),
            os(&recording()),
        ],
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("export --perfetto -");
    assert!(
        v["traceEvents"].is_array() || v.is_array(),
        "{}",
        &o.stdout[..200.min(o.stdout.len())]
    );
    assert!(
        !tmp.path().join("-").exists(),
        "no file or directory named -"
    );
}

#[test]
fn record_to_stdout_is_a_recording() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = wedgewatch()
        .args(["record", "-o", "-", "--for", "1s", "--proc-root"])
        .arg(fixture_proc("container"))
        .current_dir(tmp.path())
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!tmp.path().join("-").exists());
    let rec = tmp.path().join("back.wwrec");
    std::fs::write(&rec, &out.stdout).expect("write");
    assert!(
        wedgewatch::record::Recording::open(&rec).is_ok(),
        "stdout holds a recording"
    );
    // --json says what was recorded
    let o = run([
        OsStr::new("record"),
        "--json".as_ref(),
        "-o".as_ref(),
        os(&tmp.path().join("r.wwrec")),
        "--for".as_ref(),
        "500ms".as_ref(),
        "--proc-root".as_ref(),
        os(&fixture_proc("container")),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("record --json");
    assert!(v["samples"].as_u64().is_some(), "{v}");
}

#[test]
fn doctor_speaks_json_and_urls_are_checked_when_parsed() {
    let o = run(["doctor", "--json"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("doctor --json");
    assert_eq!(v["fatal"], false);
    assert!(v["checks"]
        .as_array()
        .is_some_and(|c| c.iter().any(|c| c["name"] == "procfs")));
    // no procfs: nothing can be sampled, exit 3
    let o = run(["doctor", "--json", "--proc-root", "/nonexistent/proc"]);
    assert_eq!(o.code, 3, "{}", o.stdout);
    for args in [
        vec!["doctor", "--url", "notaurl"],
        vec!["snapshot", "--json", "--url", "http://host:99999"],
        vec!["--url", "ftp://x", "snapshot", "--json"],
    ] {
        let o = run(&args);
        assert_eq!(o.code, 2, "{args:?}: {}", o.stderr);
        assert!(o.stderr.contains("--url"), "{}", o.stderr);
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn a_pid_that_does_not_exist_is_refused() {
    for args in [
        vec!["snapshot", "--json", "--window", "0", "--pid", "999999999"],
        vec!["doctor", "--pid", "999999999"],
    ] {
        let o = run(&args);
        assert_usage(
            &format!("{args:?}"),
            &o,
            &["--pid 999999999", "no such process"],
        );
    }
    // a scope whose root does not exist would discover nothing: refused, not an empty look
    for args in [
        vec![
            "snapshot",
            "--json",
            "--window",
            "0",
            "--within",
            "999999999",
        ],
        vec!["--within", "999999999", "doctor"],
    ] {
        let o = run(&args);
        assert_usage(
            &format!("{args:?}"),
            &o,
            &["--within 999999999", "no such process"],
        );
    }
}

#[test]
fn the_live_ui_needs_a_terminal() {
    for args in [
        vec![],
        vec!["tui"],
        vec!["tui", "--no-daemon"],
        vec!["demo"],
    ] {
        let o = run(&args);
        assert_usage(&format!("{args:?}"), &o, &["not a terminal", "wedgewatch"]);
        assert!(!o.stderr.contains('\x1b'));
    }
    // a recording is checked first, then the terminal
    let o = run([OsStr::new("tui"), "--replay".as_ref(), os(&recording())]);
    assert_usage("replay", &o, &["not a terminal", "snapshot --from"]);
}

#[test]
fn progress_is_silent_off_a_terminal_and_quiet_silences_notes() {
    let tmp = tempfile::tempdir().expect("tmp");
    let proc = fixture_proc("container");
    let o = run([
        OsStr::new("snapshot"),
        "--window".as_ref(),
        "1s".as_ref(),
        "--no-daemon".as_ref(),
        "-o".as_ref(),
        os(&tmp.path().join("b")),
        "--proc-root".as_ref(),
        os(&proc),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        !o.stderr.contains('\r') && !o.stderr.contains('\x1b'),
        "{:?}",
        o.stderr
    );
    assert!(o.stderr.contains("bundle written"), "a note: {}", o.stderr);
    let o = run([
        OsStr::new("-q"),
        "snapshot".as_ref(),
        "--window".as_ref(),
        "1s".as_ref(),
        "--no-daemon".as_ref(),
        "-o".as_ref(),
        os(&tmp.path().join("c")),
        "--proc-root".as_ref(),
        os(&proc),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.is_empty(), "--quiet: {}", o.stderr);
}

#[test]
fn completions_and_man_pages_know_every_verb() {
    let verbs = [
        "snapshot",
        "check",
        "daemon",
        "record",
        "export",
        "diff",
        "doctor",
        "demo",
        "merge",
        "fleet",
        "incidents",
    ];
    for shell in ["bash", "zsh", "fish"] {
        let o = run(["completions", shell]);
        assert_eq!(o.code, 0, "{shell}: {}", o.stderr);
        for v in verbs {
            assert!(o.stdout.contains(v), "{shell} completions lack {v}");
        }
    }
    assert_eq!(run(["completions", "tcsh"]).code, 2);
    let o = run(["man"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.starts_with(".ie") || o.stdout.contains(".TH"),
        "roff"
    );
    for v in verbs {
        assert!(o.stdout.contains(v), "man page lacks {v}");
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let o = run([OsStr::new("man"), "--dir".as_ref(), os(tmp.path())]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(tmp.path().join("wedgewatch.1").is_file());
    assert!(tmp.path().join("wedgewatch-snapshot.1").is_file());
    assert!(tmp.path().join("wedgewatch-incidents-latest.1").is_file());
}

#[test]
fn help_shows_examples_exit_codes_and_only_options_that_apply() {
    let o = run(["--help"]);
    assert!(
        o.stdout.contains("Exit status") && o.stdout.contains("could not sample"),
        "{}",
        o.stdout
    );
    assert!(o.stdout.contains("Sampling options"), "{}", o.stdout);
    for verb in [
        "snapshot",
        "check",
        "daemon",
        "record",
        "export",
        "diff",
        "doctor",
        "demo",
        "tui",
        "merge",
        "fleet",
        "incidents",
        "incidents latest",
    ] {
        let o = run(verb.split(' ').chain(["--help"]));
        assert_eq!(o.code, 0, "{verb}");
        assert!(
            o.stdout.contains("Examples:"),
            "{verb} --help: {}",
            o.stdout
        );
        assert!(
            o.stdout.contains("Exit status"),
            "{verb} --help: {}",
            o.stdout
        );
    }
    let o = run(["snapshot", "--help"]);
    assert!(o.stdout.contains("Sampling options:") && o.stdout.contains("--native"));
    let o = run(["diff", "--help"]);
    assert!(
        !o.stdout.contains("--native") && !o.stdout.contains("--pid"),
        "{}",
        o.stdout
    );
    let (h, w) = (
        fixture("snapshots/healthy.json"),
        fixture("snapshots/wedged.json"),
    );
    let o = run([OsStr::new("diff"), "--native".as_ref(), os(&h), os(&w)]);
    assert_eq!(o.code, 2, "{}", o.stderr);
    let o = run([OsStr::new("--native"), "diff".as_ref(), os(&h), os(&w)]);
    assert_usage("--native diff", &o, &["--native", "diff"]);
    // options before the verb still apply to it
    let o = run([
        OsStr::new("--proc-root"),
        os(&fixture_proc("container")),
        "snapshot".as_ref(),
        "--json".as_ref(),
        "--window".as_ref(),
        "0".as_ref(),
        "--no-daemon".as_ref(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
}

#[test]
fn nothing_to_sample_is_exit_3() {
    let none = [
        "--no-daemon",
        "--window",
        "0",
        "--proc-root",
        "/nonexistent/proc",
    ];
    let o = run(["snapshot", "--json"].iter().chain(none.iter()));
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(o.stdout.is_empty());
    assert!(o.stderr.contains("could not sample"), "{}", o.stderr);
    let o = run(["check"].iter().chain(none.iter()));
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(
        o.stdout
            .starts_with("WEDGEWATCH UNKNOWN - could not sample"),
        "{}",
        o.stdout
    );
}

#[test]
fn check_against_a_baseline_warns_of_changes() {
    // the recording's own first second, with a variable the decode engine did not have
    let tmp = tempfile::tempdir().expect("tmp");
    let o = run([
        OsStr::new("snapshot"),
        "--json".as_ref(),
        "--from".as_ref(),
        os(&recording()),
        "--at".as_ref(),
        "1s".as_ref(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let mut base: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    let decode = base["components"]
        .as_array_mut()
        .and_then(|c| c.iter_mut().find(|c| c["role"] == "decode"))
        .expect("a decode component");
    decode["env"]["WEDGEWATCH_TEST_ONLY_VAR"] = "1".into();
    let path = tmp.path().join("noon.json");
    std::fs::write(&path, serde_json::to_vec(&base).expect("ser")).expect("write");
    let check = |base: &Path| {
        run([
            OsStr::new("check"),
            "--baseline".as_ref(),
            os(base),
            "--from".as_ref(),
            os(&recording()),
            "--at".as_ref(),
            "1s".as_ref(),
        ])
    };
    let o = check(&path);
    assert_eq!(o.code, 1, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout.starts_with("WEDGEWATCH WARNING - "),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout.contains("\nWARNING config_changed"),
        "{}",
        o.stdout
    );
    let o = check(Path::new("/etc/passwd"));
    assert_eq!(o.code, 3, "a bad baseline is UNKNOWN: {}", o.stdout);
}

/// Runs the binary with stderr on a pseudo-terminal (stdout a pipe); what the terminal got.
fn stderr_on_a_terminal(args: &[&OsStr]) -> (i32, String) {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two fresh descriptors into the out-pointers; the null name,
    // termios and window size pointers are allowed.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty");
    // SAFETY: both descriptors were just opened by openpty and are owned here only.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut child = wedgewatch()
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::from(slave))
        .spawn()
        .expect("spawn");
    // read on a thread: the terminal's buffer must not fill while the child runs
    let reader = std::thread::spawn(move || {
        let mut f = std::fs::File::from(master);
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf); // ends with EIO once the child closed the slave
        String::from_utf8_lossy(&buf).into_owned()
    });
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_string(&mut out);
    }
    let code = child.wait().expect("wait").code().unwrap_or(-1);
    (code, reader.join().expect("reader"))
}

#[test]
fn progress_is_drawn_on_a_terminal_unless_quiet() {
    let proc = fixture_proc("container");
    let args = |quiet: bool| {
        let mut a: Vec<&OsStr> = Vec::new();
        if quiet {
            a.push("--quiet".as_ref());
        }
        a.extend(
            [
                "snapshot",
                "--json",
                "--no-daemon",
                "--window",
                "2s",
                "--proc-root",
            ]
            .map(OsStr::new),
        );
        a.push(proc.as_os_str());
        a
    };
    let (code, term) = stderr_on_a_terminal(&args(false));
    assert_eq!(code, 0, "{term}");
    assert!(
        term.contains("wedgewatch: sampling:") && term.contains("s left)"),
        "{term:?}"
    );
    assert!(
        term.contains("\x1b[2K"),
        "the line is cleared at the end: {term:?}"
    );
    let (code, term) = stderr_on_a_terminal(&args(true));
    assert_eq!(code, 0, "{term}");
    assert!(!term.contains("sampling"), "--quiet: {term:?}");
}

#[test]
fn usage_errors_are_one_line_with_the_hint() {
    let o = run(["snapshot", "--jsno"]);
    assert_usage(
        "typo",
        &o,
        &["--jsno", "tip: a similar argument exists: '--json'"],
    );
    let o = run(["snapshot", "--json", "--fail-on", "sometimes"]);
    assert_usage(
        "value",
        &o,
        &[
            "sometimes",
            "[possible values: never, info, warning, critical]",
        ],
    );
}

/// An incident as the daemon keeps one (issue 36), with a hostile component name holding a
/// token: `snapshot.json` from a fixture, its report, its record.
fn plant_incident(state: &Path, component: &str) -> PathBuf {
    use wedgewatch::daemon::incidents::{names, Incident};
    use wedgewatch::model::FindingKind;
    let dir = state.join("incidents");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let t = 1_773_285_302_000;
    let i = Incident::opened(
        FindingKind::WedgedRequest,
        Some(component.into()),
        "s".into(),
        t,
    );
    let path = dir.join(names::dir_name(t, &i.kind, Some(component), 1));
    let staged = wedgewatch::safe_fs::staged::StagedDir::beside(&path).expect("stage");
    let snap = std::fs::read(fixture("snapshots/wedged.json")).expect("fixture");
    staged.write_file("snapshot.json", &snap).expect("snapshot");
    staged
        .write_file("report.md", b"# wedged\n")
        .expect("report");
    let json = serde_json::to_vec(&i).expect("json");
    staged.write_file("incident.json", &json).expect("record");
    staged.commit().expect("commit")
}

#[test]
fn incidents_list_copy_out_and_refuse_bad_input() {
    let tmp = tempfile::tempdir().expect("tmp");
    let state = tmp.path().join("state");
    let o = run([OsStr::new("incidents"), "--state-dir".as_ref(), os(&state)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.starts_with("no incidents kept in"), "{}", o.stdout);
    let hostile =
        "decode@h:1';rm -rf ~;'$(id)`x`\u{1b}]52;c;aGk=\u{7} hf_abcdefghijklmnopqrstuvwxyz0123";
    let kept = plant_incident(&state, hostile);
    let o = run([OsStr::new("incidents"), "--state-dir".as_ref(), os(&state)]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("wedged_request") && o.stdout.contains("open"),
        "{}",
        o.stdout
    );
    assert!(
        !o.stdout.contains('\u{1b}') && !o.stdout.contains('\u{7}'),
        "{}",
        o.stdout
    );
    let o = run([
        OsStr::new("incidents"),
        "--json".as_ref(),
        "--state-dir".as_ref(),
        os(&state),
    ]);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("incidents --json");
    assert_eq!(v["schema"], "wedgewatch.incidents/1");
    assert_eq!(v["incidents"][0]["path"], kept.display().to_string());
    assert_eq!(v["incidents"][0]["state"], "open");

    // Copied out: the files, and one shell line whose title carries no secret.
    let out = tmp.path().join("out");
    let latest = |out: &Path| {
        run([
            OsStr::new("incidents"),
            "latest".as_ref(),
            "--state-dir".as_ref(),
            os(&state),
            "-o".as_ref(),
            os(out),
        ])
    };
    let o = latest(&out);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(o.stdout.lines().count(), 1, "{}", o.stdout);
    let words = shlex::split(&o.stdout).expect("a shell line");
    assert_eq!(words.len(), 7, "{words:?}");
    assert_eq!(&words[..4], ["gh", "issue", "create", "--title"]);
    assert!(
        !words[4].contains("hf_abcdefghij") && !words[4].contains('\u{1b}'),
        "{}",
        words[4]
    );
    assert!(
        words[4].contains("';rm -rf ~;'$(id)"),
        "the name stays text: {}",
        words[4]
    );
    assert_eq!(words[6], out.join("report.md").display().to_string());
    for f in ["snapshot.json", "report.md", "incident.json"] {
        assert_eq!(
            std::fs::read(out.join(f)).ok(),
            std::fs::read(kept.join(f)).ok(),
            "{f}"
        );
    }
    let o = run([OsStr::new("report"), os(&out)]);
    assert_eq!(o.code, 0, "report of the copy: {}", o.stderr);
    let o = run([OsStr::new("diff"), os(&out), os(&kept)]);
    assert_eq!(o.code, 0, "diff of the copy and the kept one: {}", o.stderr);

    // Bad input: one line, exit 2, nothing written.
    assert_usage("-o not empty", &latest(&out), &["not empty"]);
    assert_usage("no -o", &run(["incidents", "latest"]), &["--output"]);
    assert_usage(
        "-o -",
        &run(["incidents", "latest", "-o", "-"]),
        &["stdout"],
    );
    assert_usage(
        "--pid",
        &run(["--pid", "1", "incidents"]),
        &["--pid", "incidents"],
    );
    let o = run(["daemon", "--incidents-keep", "many"]);
    assert_usage("keep", &o, &["--incidents-keep"]);
    let o = run(["daemon", "--incidents-max-mib", "0"]);
    assert_usage("max", &o, &["--incidents-max-mib"]);

    // None kept and nothing to sample: exit 3.
    let empty = tmp.path().join("empty");
    let o = run([
        OsStr::new("incidents"),
        "latest".as_ref(),
        "--state-dir".as_ref(),
        os(&empty),
        "--proc-root".as_ref(),
        "/nonexistent/proc".as_ref(),
        "-o".as_ref(),
        os(&tmp.path().join("none")),
    ]);
    assert_eq!(o.code, 3, "{}", o.stderr);
    assert!(
        o.stderr.contains("took a fresh snapshot instead"),
        "{}",
        o.stderr
    );
}

#[test]
fn incidents_latest_without_an_incident_takes_a_fresh_snapshot_and_says_so() {
    let tmp = tempfile::tempdir().expect("tmp");
    let out = tmp.path().join("fresh");
    let o = run([
        OsStr::new("incidents"),
        "latest".as_ref(),
        "--state-dir".as_ref(),
        os(&tmp.path().join("state")),
        "--proc-root".as_ref(),
        os(&fixture_proc("container")),
        "-o".as_ref(),
        os(&out),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stderr.contains("took a fresh snapshot instead"),
        "{}",
        o.stderr
    );
    let words = shlex::split(&o.stdout).expect("a shell line");
    assert_eq!(words[6], out.join("report.md").display().to_string());
    assert!(words[4].starts_with("wedgewatch: "), "{}", words[4]);
    assert!(out.join("snapshot.json").is_file() && out.join("report.md").is_file());
}

/// `fixture` with its sources set as `unavailable` says, and no finding: a host where the
/// check looked at nothing but what `unavailable` leaves out.
fn blind_snapshot(dir: &Path, unavailable: &[&str]) -> PathBuf {
    let mut v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("snapshots/healthy.json")).expect("fixture"),
    )
    .expect("json");
    v["findings"] = serde_json::json!([]);
    for s in ["processes", "sockets", "stacks", "gpu", "metrics"] {
        v["sources"][s] = if unavailable.contains(&s) {
            serde_json::json!({"status": "unavailable", "reason": format!("no {s} here")})
        } else {
            serde_json::json!({"status": "ok"})
        };
    }
    let path = dir.join(format!("blind-{}.json", unavailable.join("-")));
    std::fs::write(&path, v.to_string()).expect("write");
    path
}

/// Green means looked and found nothing (issue 37): a check that could not see stacks,
/// GPU and metrics says so on its status line, in a line each and in the perfdata; blind
/// to processes or sockets it is UNKNOWN; `--require` makes a missing source CRITICAL.
#[test]
fn check_says_what_it_could_not_see() {
    let tmp = tempfile::tempdir().expect("tmp");
    let partly = blind_snapshot(tmp.path(), &["stacks", "gpu", "metrics"]);
    let o = run([OsStr::new("check"), "--from".as_ref(), os(&partly)]);
    assert_eq!(o.code, 0, "{}{}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        lines[0],
        "WEDGEWATCH OK - no findings; not seen: gpu, metrics, stacks | findings=0 critical=0 warning=0 info=0 unavailable=3",
        "{}",
        o.stdout
    );
    assert_eq!(
        lines[1..],
        [
            "UNAVAILABLE gpu: no gpu here",
            "UNAVAILABLE metrics: no metrics here",
            "UNAVAILABLE stacks: no stacks here"
        ]
    );

    let o = run([
        OsStr::new("check"),
        "--require".as_ref(),
        "stacks,metrics".as_ref(),
        "--from".as_ref(),
        os(&partly),
    ]);
    assert_eq!(o.code, 2, "{}", o.stdout);
    assert!(
        o.stdout.starts_with(
            "WEDGEWATCH CRITICAL - required source unavailable: metrics, stacks; no findings"
        ),
        "{}",
        o.stdout
    );
    assert!(
        o.stdout
            .contains("UNAVAILABLE stacks (required): no stacks here"),
        "{}",
        o.stdout
    );
    let o = run([
        OsStr::new("check"),
        "--require".as_ref(),
        "processes,sockets".as_ref(),
        "--from".as_ref(),
        os(&partly),
    ]);
    assert_eq!(o.code, 0, "what it needs it saw: {}", o.stdout);

    let blind = blind_snapshot(tmp.path(), &["sockets"]);
    let o = run([
        OsStr::new("check"),
        "--json".as_ref(),
        "--from".as_ref(),
        os(&blind),
    ]);
    assert_eq!(o.code, 3, "{}", o.stdout);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["status"], "UNKNOWN");
    assert_eq!(v["unavailable"][0]["source"], "sockets", "{v}");
    assert_eq!(v["unavailable"][0]["required"], false, "{v}");

    let o = run(["check", "--require", "disks", "--from", "x"]);
    assert_eq!(o.code, 3, "a usage error of check is UNKNOWN: {}", o.stdout);
    assert!(
        o.stdout.contains("unknown source \"disks\""),
        "{}",
        o.stdout
    );
}

/// `check --from` takes what `export --from` takes: a recording, a snapshot file, a bundle.
#[test]
fn check_from_takes_a_snapshot_file_or_bundle() {
    let snap = fixture("snapshots/demo-wedge.json");
    let o = run([OsStr::new("check"), "--from".as_ref(), os(&snap)]);
    assert_eq!(o.code, 2, "{}{}", o.stdout, o.stderr);
    assert!(
        o.stdout
            .starts_with("WEDGEWATCH CRITICAL - 3 findings, worst: wedged_request"),
        "{}",
        o.stdout
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let bundle = tmp.path().join("bundle");
    std::fs::create_dir(&bundle).expect("dir");
    std::fs::copy(&snap, bundle.join("snapshot.json")).expect("copy");
    let o = run([OsStr::new("check"), "--from".as_ref(), os(&bundle)]);
    assert_eq!(o.code, 2, "{}{}", o.stdout, o.stderr);
    let o = run([
        OsStr::new("export"),
        "--perfetto".as_ref(),
        "-".as_ref(),
        "--from".as_ref(),
        os(&bundle),
    ]);
    assert_eq!(o.code, 0, "the same input export takes: {}", o.stderr);
    let o = run([
        OsStr::new("check"),
        "--from".as_ref(),
        os(&snap),
        "--at".as_ref(),
        "5s".as_ref(),
    ]);
    assert_eq!(o.code, 3, "{}", o.stdout);
    assert!(o.stdout.contains("--at needs a recording"), "{}", o.stdout);
}

/// The man page has its examples and exit codes in sections of their own, ENVIRONMENT,
/// FILES and the UI's keys (issue 37); a verb's page too; completions never offer a hidden
/// option; `--help` shows examples and lists `report` right after `snapshot`.
#[test]
fn man_pages_completions_and_help_read_as_a_user_expects() {
    let o = run(["man"]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let heads: Vec<&str> = o.stdout.lines().filter(|l| l.starts_with(".SH")).collect();
    for want in [
        ".SH EXAMPLES",
        ".SH EXIT STATUS",
        ".SH ENVIRONMENT",
        ".SH FILES",
        ".SH KEYS (tui)",
    ] {
        assert!(heads.contains(&want), "{want} in {heads:?}");
    }
    assert!(!heads.iter().any(|h| h.contains("EXTRA")), "{heads:?}");
    for var in [
        "WEDGEWATCH_PY_SPY",
        "WEDGEWATCH_NVML_LIB",
        "RUST_LOG",
        "known\\-good.json",
    ] {
        assert!(o.stdout.contains(var), "man page lacks {var}");
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let o = run([OsStr::new("man"), "--dir".as_ref(), os(tmp.path())]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let check = std::fs::read_to_string(tmp.path().join("wedgewatch-check.1")).expect("page");
    assert!(
        check.contains(".SH EXAMPLES") && check.contains(".SH EXIT STATUS"),
        "{check}"
    );
    assert!(
        !check.contains(".SH EXTRA") && !check.contains(".SH ENVIRONMENT"),
        "{check}"
    );

    for shell in ["bash", "zsh", "fish"] {
        let o = run(["completions", shell]);
        assert_eq!(o.code, 0, "{shell}: {}", o.stderr);
        assert!(
            !o.stdout.contains("proc-root"),
            "{shell} offers the hidden --proc-root"
        );
        let (window, require) = match shell {
            "fish" => ("-l window", "-l require"),
            _ => ("--window", "--require"),
        };
        assert!(
            o.stdout.contains(window) && o.stdout.contains(require),
            "{shell}"
        );
    }

    let o = run(["--help"]);
    assert!(
        o.stdout.contains("Examples:\n  wedgewatch "),
        "{}",
        o.stdout
    );
    let verbs: Vec<&str> = o
        .stdout
        .lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        &verbs[..4],
        ["tui", "snapshot", "report", "check"],
        "{verbs:?}"
    );
}

/// `report --format text` lists what it says is below; `report --json` is data with a
/// schema, the cause time line and the changes, not prose.
#[test]
fn report_text_and_json_keep_their_word() {
    let snap = fixture("snapshots/demo-wedge.json");
    let o = run([
        OsStr::new("report"),
        os(&snap),
        "--format".as_ref(),
        "text".as_ref(),
    ]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(!o.stdout.contains("see below"), "{}", o.stdout);
    let below = o
        .stdout
        .split("changed since the baseline:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{}", o.stdout));
    assert!(
        below.contains("decode: env SGLANG_DECODE_PREALLOC_SPLIT_TOKENS: (absent) -> 100"),
        "{below}"
    );
    assert!(o.stdout.contains("timeline:\n  09:29:48 proxy appeared\n  09:29:52 decode restarted with +SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100"), "{}", o.stdout);

    let o = run([OsStr::new("report"), os(&snap), "--json".as_ref()]);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let v: serde_json::Value = serde_json::from_str(&o.stdout).expect("json");
    assert_eq!(v["schema"], "wedgewatch.report/1");
    assert_eq!(v["verdict"]["kind"], "wedged_request");
    assert_eq!(v["verdict"]["severity"], "critical");
    assert_eq!(v["stuck"].as_array().map(Vec::len), Some(3), "{v}");
    assert_eq!(v["cause"]["suspect"]["name"], "decode", "{v}");
    assert_eq!(
        v["changes"].as_array().map(Vec::len),
        Some(3),
        "children folded: {v}"
    );
    assert_eq!(v["since"], "2026-12-05T09:29:56.701Z", "{v}");
    assert_eq!(
        v["cause"]["events"][2]["at"], v["since"],
        "one moment for the first stuck request: {v}"
    );
}
