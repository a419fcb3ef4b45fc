//! Issue 11 item 3: the real router (sglang-router 0.3.2 from PyPI) started with `--api-key`,
//! the production norm, through the wedgewatch binary.
//!
//! - The lab's router (`lab.py up --router-api-key`) is started directly, so setproctitle
//!   leaves no trace of its key in `/proc`: without `--router-key-env`, its `/workers` alone
//!   says exactly why it is unreadable and its metrics stay ok; with `--router-key-env NAME`
//!   (the key in wedgewatch's environment) it still gets no key, since nothing left in `/proc`
//!   shows it asked for `NAME` (issue 34 item 2), and its `/workers` says so.
//! - A second real router under a launcher (`timeout 120 python -m ... --api-key K`), as
//!   production launch scripts leave it: its key is read from the launcher's arguments.
//! - Neither key appears anywhere in a snapshot bundle or a recording.

use wedgewatch_testkit::lab;

use wedgewatch_testkit::written;

use lab::{Lab, LabOptions};
use serde_json::Value;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use written::{contains, files_under};

const LAB_KEY: &str = "ww-lab-router-key-7f3e9a";
const LAUNCHED_KEY: &str = "ww-launched-router-key-c41d";
const KEY_ENV: &str = "WW_TEST_ROUTER_KEY";

/// [`crate::common::ww`] without the operator's key variable, watching the launched router
/// (below `launcher`) too.
fn ww(lab: &Lab, launcher: u32) -> Command {
    let mut c = crate::common::ww(lab);
    c.env_remove(KEY_ENV)
        .arg("--within")
        .arg(launcher.to_string());
    c
}

/// Runs to completion within `bound`; stdout, or a panic with stderr.
fn run(mut cmd: Command, bound: Duration) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out_p, err_p) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out_p).expect("out"))
        .stderr(std::fs::File::create(&err_p).expect("err"))
        .spawn()
        .expect("spawn wedgewatch");
    let started = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break st;
        }
        if started.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} did not finish within {bound:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = std::fs::read_to_string(&out_p).unwrap_or_default();
    let err = std::fs::read_to_string(&err_p).unwrap_or_default();
    assert!(status.success(), "{cmd:?} failed ({status}): {err}");
    out
}

/// Killed (with its process group) on drop.
struct Launched(Child);

impl Drop for Launched {
    fn drop(&mut self) {
        let pid = self.0.id() as i32;
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// The scrape of the component whose pids include `pid`, from a bundle's raw/metrics.json
/// and snapshot.json.
fn scrape_of(bundle: &Path, pid: u32) -> Value {
    let snap: Value = serde_json::from_str(
        &std::fs::read_to_string(bundle.join("snapshot.json")).expect("snapshot.json"),
    )
    .expect("snapshot json");
    let id = snap["components"]
        .as_array()
        .expect("components")
        .iter()
        .find(|c| {
            c["pids"]
                .as_array()
                .is_some_and(|p| p.iter().any(|x| x.as_u64() == Some(u64::from(pid))))
                && c["role"] == "router"
        })
        .unwrap_or_else(|| panic!("no router component with pid {pid}: {snap}"))["id"]
        .as_str()
        .expect("id")
        .to_string();
    let raw: Value = serde_json::from_str(
        &std::fs::read_to_string(bundle.join("raw/metrics.json")).expect("raw/metrics.json"),
    )
    .expect("raw json");
    // raw/metrics.json: the latest scrape of each component, by component id.
    raw.get(id.as_str())
        .unwrap_or_else(|| panic!("no scrape of {id}"))
        .clone()
}

fn workers_probe(scrape: &Value) -> Value {
    scrape["extra_probes"]
        .as_array()
        .expect("extra_probes")
        .iter()
        .find(|p| p["url"].as_str().is_some_and(|u| u.ends_with("/workers")))
        .unwrap_or_else(|| panic!("no /workers probe: {scrape}"))
        .clone()
}

#[test]
fn routers_with_api_keys_are_read_with_their_own_key_and_the_key_is_never_written() {
    let lab = match Lab::up(&LabOptions::regular().router_api_key(LAB_KEY)) {
        Ok(l) => l,
        Err(e) => panic!("lab up: {e}"),
    };
    let router = lab.router().clone();
    let engine_url = lab.engine().url.clone();

    // A second real router, launched the way scripts launch it: its arguments (and key)
    // survive in the launcher, `timeout`.
    let (rport, mport) = (free_port(), free_port());
    let launched = Command::new("timeout")
        .args(["120"])
        .arg(lab::venv_bin("python"))
        .args([
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
        ])
        .arg(rport.to_string())
        .args(["--worker-urls", &engine_url])
        .args(["--prometheus-host", "127.0.0.1", "--prometheus-port"])
        .arg(mport.to_string())
        .args(["--api-key", LAUNCHED_KEY])
        .args(["--shutdown-grace-period-secs", "1", "--log-level", "warn"])
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("spawn launched router");
    let launcher_pid = launched.id();
    let _launched = Launched(launched);
    let deadline = Instant::now() + Duration::from_secs(40);
    let launched_pid = loop {
        let ready = lab::http_get(
            &format!("http://127.0.0.1:{rport}/readiness"),
            Duration::from_secs(1),
        )
        .is_ok_and(|(st, _)| st == 200);
        let child =
            std::fs::read_to_string(format!("/proc/{launcher_pid}/task/{launcher_pid}/children"))
                .ok()
                .and_then(|s| {
                    s.split_whitespace()
                        .next()
                        .and_then(|p| p.parse::<u32>().ok())
                });
        if let (true, Some(c)) = (ready, child) {
            break c;
        }
        assert!(Instant::now() < deadline, "launched router not ready");
        std::thread::sleep(Duration::from_millis(250));
    };
    let thresholds = lab::repo_root().join("tests/fixtures/thresholds-fast.toml");

    // 1. No --router-key-env: the lab router's /workers says exactly why; its metrics are fine;
    //    the launched router's key comes from its launcher.
    let b1 = tempfile::tempdir().expect("tempdir");
    let bundle1 = b1.path().join("bundle");
    let mut c = ww(&lab, launcher_pid);
    c.arg("--thresholds")
        .arg(&thresholds)
        .args(["snapshot", "--no-daemon", "--window", "2", "-o"])
        .arg(&bundle1);
    run(c, Duration::from_secs(60));
    let s = scrape_of(&bundle1, router.pid);
    let p = workers_probe(&s);
    assert_eq!(p["http_status"], 401, "{p}");
    let detail = p["detail"].as_str().unwrap_or_default();
    assert_eq!(
        detail,
        format!(
            "needs the router's API key (HTTP 401; the arguments of pid {} were overwritten by \
             its process title and no launcher kept them; no key variable named with \
             --router-key-env)",
            router.pid
        )
    );
    assert_eq!(
        s["metrics"]["outcome"], "ok",
        "the router's metrics stay readable: {s}"
    );
    assert!(s["series"].as_array().is_some_and(|a| !a.is_empty()), "{s}");
    let snap: Value = serde_json::from_str(
        &std::fs::read_to_string(bundle1.join("snapshot.json")).expect("snapshot.json"),
    )
    .expect("json");
    let status = snap["sources"]["metrics"].to_string();
    assert!(
        !status.contains(&format!("127.0.0.1:{}/workers", router.port)),
        "the refused /workers does not degrade the source: {status}"
    );
    let s2 = scrape_of(&bundle1, launched_pid);
    let p2 = workers_probe(&s2);
    assert_eq!(
        p2["outcome"], "ok",
        "launched router read with its own key: {p2}"
    );
    assert!(
        s2["extra"]["workers"].to_string().contains(&engine_url),
        "{s2}"
    );

    // 2. --router-key-env with the lab router's key in wedgewatch's own environment. The lab
    //    router, started directly, lost its arguments and environment to its process title:
    //    nothing shows it ever asked for that variable, so it does not get it (issue 34
    //    item 2; a router that names it gets it: tests/labs/alone/router_key_lookalikes.rs), and its
    //    /workers says why. The launched router is still read with its own key.
    let b2 = tempfile::tempdir().expect("tempdir");
    let bundle2 = b2.path().join("bundle");
    let mut c = ww(&lab, launcher_pid);
    c.env(KEY_ENV, LAB_KEY)
        .arg("--thresholds")
        .arg(&thresholds)
        .args(["--router-key-env", KEY_ENV])
        .args(["snapshot", "--no-daemon", "--window", "2", "-o"])
        .arg(&bundle2);
    run(c, Duration::from_secs(60));
    let s = scrape_of(&bundle2, router.pid);
    let p = workers_probe(&s);
    assert_eq!(p["http_status"], 401, "{p}");
    let detail = p["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&format!(
            "${KEY_ENV} of wedgewatch not sent: neither the arguments of pid {0} nor the \
             environment of pid {0} name it",
            router.pid
        )),
        "{detail}"
    );
    // Discovery read the launched router's /workers with its key: config edge to the engine.
    let snap: Value = serde_json::from_str(
        &std::fs::read_to_string(bundle2.join("snapshot.json")).expect("snapshot.json"),
    )
    .expect("json");
    let id_of = |pid: u32| {
        snap["components"]
            .as_array()
            .expect("components")
            .iter()
            .find(|c| c["main_pid"].as_u64() == Some(u64::from(pid)))
            .and_then(|c| c["id"].as_str())
            .unwrap_or_else(|| panic!("no component with main pid {pid}"))
            .to_string()
    };
    let (rid, eid) = (id_of(launched_pid), id_of(lab.engine().pid));
    assert!(
        snap["edges"]
            .as_array()
            .is_some_and(|es| es.iter().any(|e| e["from"] == rid.as_str()
                && e["to"] == eid.as_str()
                && e["origin"] == "config")),
        "no config edge {rid} -> {eid}: {}",
        snap["edges"]
    );

    // 3. A recording with the key in use.
    let rec = b2.path().join("rec.wwrec");
    let mut c = ww(&lab, launcher_pid);
    c.env(KEY_ENV, LAB_KEY)
        .args(["--router-key-env", KEY_ENV, "record", "-o"])
        .arg(&rec)
        .args(["--for", "3s"]);
    run(c, Duration::from_secs(60));
    let mut gz = Vec::new();
    {
        use std::io::Read;
        let f = std::fs::File::open(&rec).expect("recording");
        flate2::read::MultiGzDecoder::new(f)
            .read_to_end(&mut gz)
            .expect("gunzip recording");
    }
    assert!(contains(&gz, "/workers"), "the recording has the scrapes");

    // Neither key anywhere.
    let mut all = files_under(&bundle1);
    all.extend(files_under(&bundle2));
    all.push((rec.clone(), std::fs::read(&rec).expect("rec")));
    all.push((rec.with_extension("gunzipped"), gz));
    for (path, bytes) in &all {
        for key in [LAB_KEY, LAUNCHED_KEY] {
            assert!(
                !contains(bytes, key),
                "{} contains a router key",
                path.display()
            );
        }
    }
}
