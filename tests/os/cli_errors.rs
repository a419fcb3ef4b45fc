//! Bad input gets a clear message naming the file, and a non-zero exit.

use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, wedgewatch};

fn run(args: &[&std::ffi::OsStr]) -> (i32, String, String) {
    let out = wedgewatch().args(args).output().expect("run");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn good_snapshot(dir: &std::path::Path) -> std::path::PathBuf {
    let out = wedgewatch()
        .args(["snapshot", "--json", "--proc-root"])
        .arg(fixture_proc("container"))
        .output()
        .expect("run");
    assert!(out.status.success());
    let p = dir.join("good.json");
    std::fs::write(&p, &out.stdout).expect("write");
    p
}

#[test]
fn diff_rejects_bad_files() {
    let tmp = tempfile::tempdir().expect("tmp");
    let good = good_snapshot(tmp.path());
    let text = std::fs::read_to_string(&good).expect("read");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "truncated.json",
            text[..text.len() / 2].to_string(),
            "truncated JSON",
        ),
        ("notjson.json", "hello world".into(), "invalid JSON"),
        (
            "other.json",
            r#"{"schema": "something.else/2", "x": 1}"#.into(),
            "schema is \"something.else/2\"",
        ),
        (
            "noschema.json",
            r#"{"components": []}"#.into(),
            "no \"schema\" field",
        ),
        (
            "shape.json",
            r#"{"schema": "wedgewatch.snapshot/1", "components": 3}"#.into(),
            "does not match the contract",
        ),
    ];
    for (name, body, want) in cases {
        let p = tmp.path().join(name);
        std::fs::write(&p, body).expect("write");
        for args in [
            [good.as_os_str(), p.as_os_str()],
            [p.as_os_str(), good.as_os_str()],
        ] {
            let (code, stdout, stderr) = run(&[std::ffi::OsStr::new("diff"), args[0], args[1]]);
            assert_ne!(code, 0, "{name}");
            assert!(stdout.is_empty(), "{name}: {stdout}");
            assert!(
                stderr.contains(name),
                "{name}: message must name the file: {stderr}"
            );
            assert!(stderr.contains(want), "{name}: {stderr}");
        }
    }
    let missing = tmp.path().join("missing.json");
    let (code, _, stderr) = run(&["diff".as_ref(), good.as_os_str(), missing.as_os_str()]);
    assert_ne!(code, 0);
    assert!(stderr.contains("missing.json"), "{stderr}");
}

#[test]
fn unknown_probe_key_names_file_and_key() {
    let tmp = tempfile::tempdir().expect("tmp");
    let probes = tmp.path().join("probes");
    std::fs::create_dir(&probes).expect("mkdir");
    std::fs::write(
        probes.join("mystack.toml"),
        "[[profile]]\nname = \"mine\"\nstack = \"mine\"\nrole = \"engine\"\nmatch_cmdline = ['my-server']\nlisten_port_flag = \"--port\"\n",
    )
    .expect("write");
    let (code, stdout, stderr) = run(&[
        "--probes".as_ref(),
        probes.as_os_str(),
        "snapshot".as_ref(),
        "--json".as_ref(),
    ]);
    assert_ne!(code, 0);
    assert!(stdout.is_empty());
    assert!(stderr.contains("mystack.toml"), "{stderr}");
    assert!(stderr.contains("listen_port_flag"), "{stderr}");
}

#[test]
fn new_stack_needs_only_a_toml_file() {
    // a profile for a stack wedgewatch has never heard of, recognised without new code
    let tmp = tempfile::tempdir().expect("tmp");
    let probes = tmp.path().join("probes");
    std::fs::create_dir(&probes).expect("mkdir");
    std::fs::write(
        probes.join("tgi.toml"),
        "[[profile]]\nname = \"tgi\"\nstack = \"tgi\"\nrole = \"engine\"\nmatch_cmdline = ['some\\.other\\.tool']\nport_flag = \"--port\"\ndefault_port = 8080\n",
    )
    .expect("write");
    let out = wedgewatch()
        .arg("--probes")
        .arg(&probes)
        .args(["snapshot", "--json", "--proc-root"])
        .arg(fixture_proc("container"))
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let c = v["components"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["stack"] == "tgi"))
        .expect("tgi component from the new profile");
    assert_eq!(c["id"], "engine@0.0.0.0:8080", "no default_host: wildcard");
    assert_eq!(c["main_pid"], 103);
}

#[test]
fn snapshot_needs_a_destination_and_a_sane_window() {
    let (code, _, stderr) = run(&["snapshot".as_ref()]);
    assert_ne!(code, 0);
    assert!(stderr.contains("--json"), "{stderr}");
    let (code, _, stderr) = run(&[
        "snapshot".as_ref(),
        "--json".as_ref(),
        "--window".as_ref(),
        "-3".as_ref(),
    ]);
    assert_ne!(code, 0, "{stderr}");
}

#[test]
fn doctor_fails_without_procfs() {
    let (code, stdout, _) = run(&[
        "--proc-root".as_ref(),
        "/nonexistent/proc".as_ref(),
        "doctor".as_ref(),
    ]);
    // nothing can be sampled here: exit 3
    assert_eq!(code, 3, "{stdout}");
    assert!(
        stdout.contains("FAIL") && stdout.contains("procfs"),
        "{stdout}"
    );
    let (code, stdout, _) = run(&["doctor".as_ref()]);
    assert_eq!(code, 0, "{stdout}");
    for check in ["procfs", "ptrace", "py-spy", "nvml", "sock_diag"] {
        assert!(stdout.contains(check), "{check} missing: {stdout}");
    }
    // an NVML library that cannot load is a reason, not a crash; the env var works too
    let out = wedgewatch()
        .arg("doctor")
        .env("WEDGEWATCH_NVML_LIB", "/nonexistent/libnvidia-ml.so.1")
        .output()
        .expect("run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.contains("nvml"))
        .expect("nvml line");
    assert!(
        line.starts_with("[warn]") && line.contains("/nonexistent/libnvidia-ml.so.1"),
        "{line}"
    );
}

/// A snapshot file from a stranger may be huge: it is refused at the cap (exit 2, the file
/// named), not read to its end. The file is sparse, so the test costs no disk.
#[test]
fn diff_refuses_an_oversized_snapshot_without_reading_it_all() {
    let tmp = tempfile::tempdir().expect("tmp");
    let good = good_snapshot(tmp.path());
    let huge = tmp.path().join("huge.json");
    let f = std::fs::File::create(&huge).expect("create");
    f.set_len(wedgewatch::snapshot::MAX_SNAPSHOT_BYTES + 1)
        .expect("sparse");
    let (code, _, err) = run(&["diff".as_ref(), good.as_os_str(), huge.as_os_str()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("huge.json") && err.contains("larger than 256 MiB"),
        "{err}"
    );
}
