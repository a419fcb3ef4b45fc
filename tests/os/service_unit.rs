//! `deploy/wedgewatch.service`: systemd accepts it (`systemd-analyze verify`, when installed),
//! every flag it uses or suggests is one `wedgewatch daemon` takes, and its command line,
//! run with the environment systemd gives it, puts the socket and state where clients look.

use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, wedgewatch};
use std::collections::BTreeMap;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const INSTALLED_BINARY: &str = "/usr/local/bin/wedgewatch";

fn unit_text() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/wedgewatch.service");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The settings of a unit file: (section, key) -> values in order (keys may repeat).
/// Enough of systemd's syntax for our own file: no line continuations, no quoting.
fn parse_unit(text: &str) -> BTreeMap<(String, String), Vec<String>> {
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut section = String::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        assert!(
            !line.ends_with('\\'),
            "line {}: no continuations here",
            n + 1
        );
        if let Some(s) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = s.to_string();
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("line {}: not key=value: {line}", n + 1));
        out.entry((section.clone(), k.trim().to_string()))
            .or_default()
            .push(v.trim().to_string());
    }
    out
}

fn one<'a>(unit: &'a BTreeMap<(String, String), Vec<String>>, section: &str, key: &str) -> &'a str {
    match unit
        .get(&(section.to_string(), key.to_string()))
        .map(Vec::as_slice)
    {
        Some([v]) => v,
        other => panic!("[{section}] {key}: expected one value, got {other:?}"),
    }
}

/// The unit's `Environment=` assignments.
fn environment(unit: &BTreeMap<(String, String), Vec<String>>) -> BTreeMap<String, String> {
    unit.get(&("Service".to_string(), "Environment".to_string()))
        .into_iter()
        .flatten()
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("Environment=KEY=VALUE");
            (k.to_string(), v.to_string())
        })
        .collect()
}

/// ExecStart's words after the binary, expanded as systemd does.
fn exec_args(unit: &BTreeMap<(String, String), Vec<String>>) -> Vec<String> {
    exec_args_with(unit, environment(unit))
}

/// [`exec_args`] with the environment systemd would have (the unit's, maybe overridden as
/// /etc/default/wedgewatch would). systemd.service(5), "Command lines": `$VAR` as a word of
/// its own becomes the value split at whitespace (zero or more words); `${VAR}` (a word of its
/// own or part of one) becomes the exact value, always within one word.
fn exec_args_with(
    unit: &BTreeMap<(String, String), Vec<String>>,
    env: BTreeMap<String, String>,
) -> Vec<String> {
    let exec = one(unit, "Service", "ExecStart");
    let value = |var: &str| -> String {
        env.get(var)
            .unwrap_or_else(|| panic!("${var} has no Environment= default"))
            .clone()
    };
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some(INSTALLED_BINARY), "{exec}");
    words
        .flat_map(|w| {
            if let Some(var) = w.strip_prefix('$').filter(|v| !v.starts_with('{')) {
                return value(var)
                    .split_whitespace()
                    .map(str::to_string)
                    .collect::<Vec<_>>();
            }
            let mut out = String::new();
            let mut rest = w;
            while let Some(at) = rest.find("${") {
                out.push_str(&rest[..at]);
                let end = rest[at..].find('}').expect("${VAR} closed") + at;
                out.push_str(&value(&rest[at + 2..end]));
                rest = &rest[end + 1..];
            }
            out.push_str(rest);
            vec![out]
        })
        .collect()
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// Creates each directory (and its parents) 0700, as systemd's StateDirectory= and
/// RuntimeDirectory= would.
fn private_dirs(dirs: &[&Path]) {
    for d in dirs {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(d)
            .expect("mkdir");
    }
}

#[test]
fn systemd_analyze_verify_accepts_the_unit() {
    let Some(analyze) = find_in_path("systemd-analyze") else {
        eprintln!(
            "skipped: systemd-analyze not found in PATH (Debian/Ubuntu: apt-get install systemd)"
        );
        return;
    };
    // verify also checks that ExecStart's binary exists: point it at the one under test.
    let tmp = tempfile::tempdir().expect("tmp");
    let unit = tmp.path().join("wedgewatch.service");
    let text = unit_text().replace(INSTALLED_BINARY, env!("CARGO_BIN_EXE_wedgewatch"));
    std::fs::write(&unit, text).expect("write unit");
    let out = Command::new(&analyze)
        .args(["verify", "--man=no"])
        .arg(&unit)
        .output()
        .expect("run systemd-analyze");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "systemd-analyze verify: {}\n{err}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn every_flag_the_unit_uses_or_suggests_is_one_the_daemon_takes() {
    let text = unit_text();
    let unit = parse_unit(&text);
    let args = exec_args(&unit);
    assert_eq!(args.first().map(String::as_str), Some("daemon"), "{args:?}");
    // The flags in ExecStart, and those the header suggests for /etc/default/wedgewatch.
    let mut suggested: Vec<String> = args[1..].to_vec();
    for line in text.lines() {
        let line = line.trim_start_matches('#').trim();
        if let Some(rest) = line.strip_prefix("WEDGEWATCH_ARGS=") {
            suggested.extend(rest.split_whitespace().map(str::to_string));
        }
    }
    let flags: Vec<&str> = suggested
        .iter()
        .filter(|w| w.starts_with('-'))
        .map(|w| w.split('=').next().unwrap_or_default())
        .collect();
    assert!(flags.len() >= 2, "the header suggests flags: {suggested:?}");

    let help = wedgewatch()
        .args(["daemon", "--help"])
        .output()
        .expect("daemon --help");
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    let words: Vec<&str> = help
        .split(|c: char| c.is_whitespace() || matches!(c, ',' | '=' | '[' | ']'))
        .collect();
    for f in &flags {
        assert!(words.contains(f), "{f} is not in `daemon --help`:\n{help}");
    }
    // clap parses them with their values (an unknown flag before --help is an error)
    let parsed = wedgewatch()
        .arg("daemon")
        .args(&suggested)
        .arg("--help")
        .stdout(Stdio::null())
        .output()
        .expect("daemon ... --help");
    assert!(
        parsed.status.success(),
        "daemon {suggested:?}: {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
}

#[test]
fn the_units_directories_are_where_clients_look_and_its_command_line_uses_them() {
    let unit = parse_unit(&unit_text());
    let state_name = one(&unit, "Service", "StateDirectory");
    let runtime_name = one(&unit, "Service", "RuntimeDirectory");
    // A root client (`sudo wedgewatch snapshot`) has no $STATE_DIRECTORY: it must still
    // land on the service's directories.
    let (state, runtime) = wedgewatch::daemon::dirs::defaults_for(0, |_| None);
    assert_eq!(state, Path::new("/var/lib").join(state_name));
    assert_eq!(runtime, Path::new("/run").join(runtime_name));
    for key in ["StateDirectoryMode", "RuntimeDirectoryMode"] {
        assert_eq!(
            one(&unit, "Service", key),
            "0700",
            "{key}: the daemon wants 0700"
        );
    }
    assert_eq!(one(&unit, "Service", "Restart"), "on-failure");

    // The command line, with the environment systemd gives it (directories made as
    // systemd makes them), in a scratch root.
    let tmp = tempfile::tempdir().expect("tmp");
    let (state, runtime) = (
        tmp.path().join("var/lib").join(state_name),
        tmp.path().join("run").join(runtime_name),
    );
    private_dirs(&[&state, &runtime]);
    let log = tmp.path().join("stderr");
    let mut child = start_as_systemd_would(&unit, &state, &runtime, &log);
    let sock = runtime.join("daemon.sock");
    let deadline = Instant::now() + Duration::from_secs(20);
    let pong = loop {
        if let Ok(v) = wedgewatch::daemon::query_blocking(&sock, "ping", 2_000) {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "no daemon at {}: {}",
            sock.display(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(pong["ok"], true);
    let metrics = exporter_url(&log);
    let (status, body) = http_get(&metrics);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    assert!(
        body.contains("wedgewatch_build_info{version="),
        "the unit's exporter serves /metrics: {body}"
    );
    assert!(
        state.join("daemon.lock").exists(),
        "the lock in StateDirectory"
    );
    assert!(
        state.join("recording").is_dir(),
        "the recording in StateDirectory"
    );

    let status = stop_as_systemctl_would(&mut child);
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status}: {stderr}");
    assert!(!sock.exists(), "socket removed on stop");
    assert!(
        stderr.contains("INFO daemon started"),
        "the unit's RUST_LOG: {stderr}"
    );
}

/// The unit's command line (on the fixture /proc tree, without NVML) with the environment
/// systemd gives it: the unit's `Environment=` and the two directories.
fn start_as_systemd_would(
    unit: &BTreeMap<(String, String), Vec<String>>,
    state: &Path,
    runtime: &Path,
    log: &Path,
) -> std::process::Child {
    // The exporter on a port of the kernel's choosing, as /etc/default/wedgewatch could set
    // it: the suite must not take the unit's fixed port.
    start_with_metrics(unit, "127.0.0.1:0", state, runtime, log)
}

/// [`start_as_systemd_would`] with `WEDGEWATCH_METRICS` set as /etc/default/wedgewatch
/// would set it.
fn start_with_metrics(
    unit: &BTreeMap<(String, String), Vec<String>>,
    metrics: &str,
    state: &Path,
    runtime: &Path,
    log: &Path,
) -> std::process::Child {
    let mut env = environment(unit);
    env.insert("WEDGEWATCH_METRICS".into(), metrics.into());
    wedgewatch()
        .args(exec_args_with(unit, env))
        .arg("--proc-root")
        .arg(fixture_proc("container"))
        .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(environment(unit))
        .env("STATE_DIRECTORY", state)
        .env("RUNTIME_DIRECTORY", runtime)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("spawn")
}

/// The exporter's URL from the daemon's first log line (`metrics=http://ADDR/metrics`).
fn exporter_url(log: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let url = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("metrics=http://"));
        if let Some(u) = url {
            return u.to_string();
        }
        assert!(Instant::now() < deadline, "no metrics= in the log: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One `GET` of `addr_path` (`127.0.0.1:PORT/metrics`): the status line and the body.
fn http_get(addr_path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let (addr, path) = addr_path.split_once('/').expect("ADDR/PATH");
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the exporter");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(s, "GET /{path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("answer");
    let (head, body) = out.split_once("\r\n\r\n").expect("head and body");
    (
        head.lines().next().unwrap_or_default().to_string(),
        body.to_string(),
    )
}

/// `systemctl stop`: SIGTERM, then the exit status, which must come well within the unit's
/// TimeoutStopSec.
fn stop_as_systemctl_would(child: &mut std::process::Child) -> std::process::ExitStatus {
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the daemon did not stop within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 34 item 17: `WEDGEWATCH_METRICS=` (empty) in /etc/default/wedgewatch. With the flag
/// and `$WEDGEWATCH_METRICS` as separate words, systemd dropped the empty word and the daemon
/// got `--metrics-listen` without a value: a usage error (2), which RestartPreventExitStatus
/// keeps down. Now the service starts, with no exporter, and stops cleanly.
#[test]
fn an_empty_metrics_address_in_the_environment_file_leaves_the_service_up() {
    let unit = parse_unit(&unit_text());
    let tmp = tempfile::tempdir().expect("tmp");
    let (state, runtime) = (tmp.path().join("state"), tmp.path().join("run"));
    private_dirs(&[&state, &runtime]);
    let log = tmp.path().join("stderr");
    let mut env = environment(&unit);
    env.insert("WEDGEWATCH_METRICS".into(), String::new());
    let args = exec_args_with(&unit, env);
    assert!(args.contains(&"--metrics-listen=".to_string()), "{args:?}");
    let mut child = start_with_metrics(&unit, "", &state, &runtime, &log);
    let sock = runtime.join("daemon.sock");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if wedgewatch::daemon::query_blocking(&sock, "ping", 2_000).is_ok() {
            break;
        }
        if let Some(st) = child.try_wait().expect("wait") {
            panic!(
                "the service exited ({st}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "no daemon at {}", sock.display());
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = stop_as_systemctl_would(&mut child);
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(status.success(), "{status}: {stderr}");
    assert!(stderr.contains("metrics=off"), "no exporter: {stderr}");
}
