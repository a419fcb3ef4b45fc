//! The Prometheus exporter end to end (issue 14): `wedgewatch daemon --metrics-listen` on the
//! lab under the noon wedge (decode restarted with the tuning variable, the harness's
//! requests accepted and forgotten) serves the wedge as a stuck-request series at decode;
//! a real Prometheus (Debian's `prometheus`, which `tests/run-all.sh` installs) scrapes the
//! daemon with the shipped rules (their `for:` shortened) and fires
//! `WedgewatchRequestsStuck` for decode, read back through its HTTP API (`/api/v1/alerts`).
//!
//! Prometheus runs from its binary on a loopback port with a temporary data directory and a
//! generated configuration, killed (by its pid) on drop; never as a system service.

use wedgewatch_testkit::lab;

use lab::{Lab, LabOptions};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TUNING_VAR: &str = "SGLANG_DECODE_PREALLOC_SPLIT_TOKENS";
const PROMETHEUS: &str = "/usr/bin/prometheus";

/// A child process killed (by its pid) and reaped on drop.
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `wedgewatch daemon --metrics-listen 127.0.0.1:0` on the lab; the exporter's address
/// from its first log line.
fn start_daemon(lab: &Lab, dir: &Path) -> (Killed, String) {
    let log = dir.join("daemon.log");
    let child = crate::common::ww(lab)
        .env("RUST_LOG", "info")
        .arg("--thresholds")
        .arg(lab::repo_root().join("tests/fixtures/thresholds-fast.toml"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(["daemon", "--no-record", "--for", "300s"])
        .args(["--metrics-listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("daemon log"))
        .spawn()
        .expect("spawn wedgewatch daemon");
    let child = Killed(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let addr = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("metrics=http://"))
            .and_then(|u| u.strip_suffix("/metrics"));
        if let Some(a) = addr {
            return (child, a.to_string());
        }
        assert!(Instant::now() < deadline, "daemon did not start: {text}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Polls `/metrics` until a `wedgewatch_stuck_requests` series names a hop listening on
/// `port` (this lab's decode; other labs may run on the machine); that series' labels.
fn wait_stuck_at(
    addr: &str,
    port: u16,
    dir: &Path,
    bound: Duration,
) -> (wedgewatch::model::Series, String) {
    let url = format!("http://{addr}/metrics");
    let started = Instant::now();
    let suffix = format!(":{port}");
    loop {
        let (status, body) = lab::http_get(&url, Duration::from_secs(5)).expect("scrape");
        assert_eq!(status, 200, "{body}");
        let x = wedgewatch::prom::parse(&body);
        assert_eq!(x.bad_lines, 0, "{body}");
        let hit = x.series.iter().find(|s| {
            s.name == "wedgewatch_stuck_requests"
                && s.labels
                    .get("component")
                    .is_some_and(|c| c.ends_with(&suffix))
                && s.value >= 1.0
        });
        if let Some(s) = hit {
            return (s.clone(), body);
        }
        assert!(
            started.elapsed() < bound,
            "no stuck request at decode (:{port}) within {bound:?}:\n{body}\ndaemon log:\n{}",
            log_of(dir)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The shipped rules with every `for:` cut to 5 s (the test cannot wait minutes); what the
/// rules say is otherwise unchanged.
fn fast_rules(dir: &Path) -> PathBuf {
    let shipped = lab::repo_root().join("deploy/prometheus/wedgewatch-rules.yml");
    let text = std::fs::read_to_string(&shipped).expect("shipped rules");
    let fast: String = text
        .lines()
        .map(|l| match l.trim_start().strip_prefix("for: ") {
            Some(_) => format!("{}for: 5s", &l[..l.len() - l.trim_start().len()]),
            None => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        fast.contains("for: 5s") && !fast.contains("for: 1m"),
        "{fast}"
    );
    let p = dir.join("rules.yml");
    std::fs::write(&p, fast).expect("write rules");
    p
}

/// Prometheus from its binary: loopback port, temporary data directory, generated config
/// scraping `targets` every second as job `wedgewatch`.
fn start_prometheus(dir: &Path, targets: &[String]) -> (Killed, String) {
    assert!(
        Path::new(PROMETHEUS).is_file(),
        "{PROMETHEUS} missing: tests/run-all.sh installs it (apt-get install -y prometheus)"
    );
    let rules = fast_rules(dir);
    let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - '{}'\n\
         scrape_configs:\n  - job_name: wedgewatch\n    static_configs:\n      - targets: [{}]\n",
        rules.display(),
        list.join(", ")
    );
    let cfg = dir.join("prometheus.yml");
    std::fs::write(&cfg, config).expect("write config");
    let listen = format!("127.0.0.1:{}", free_port());
    let child = Command::new(PROMETHEUS)
        .arg(format!("--config.file={}", cfg.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={listen}"))
        .arg("--log.level=warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("prometheus.log")).expect("log"))
        .spawn()
        .expect("spawn prometheus");
    (Killed(child), listen)
}

/// GET of Prometheus' API, the `data` of a success.
fn api(listen: &str, path: &str) -> Option<Value> {
    let (status, body) =
        lab::http_get(&format!("http://{listen}{path}"), Duration::from_secs(5)).ok()?;
    let v: Value = serde_json::from_str(&body).ok()?;
    (status == 200 && v["status"] == "success").then(|| v["data"].clone())
}

/// Waits until `WedgewatchRequestsStuck` fires for `component`; the alert.
fn wait_alert(listen: &str, component: &str, dir: &Path, bound: Duration) -> Value {
    let started = Instant::now();
    let mut last = Value::Null;
    loop {
        if let Some(d) = api(listen, "/api/v1/alerts") {
            let hit = d["alerts"].as_array().into_iter().flatten().find(|a| {
                a["labels"]["alertname"] == "WedgewatchRequestsStuck"
                    && a["labels"]["component"] == component
                    && a["state"] == "firing"
            });
            if let Some(a) = hit {
                return a.clone();
            }
            last = d;
        }
        if started.elapsed() > bound {
            let targets = api(listen, "/api/v1/targets").unwrap_or_default();
            let log = std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default();
            panic!("no firing alert for {component} in {bound:?}; alerts: {last}\ntargets: {targets}\nlog: {log}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Lines of the daemon's log, for a failure message.
fn log_of(dir: &Path) -> String {
    let f = std::fs::File::open(dir.join("daemon.log"));
    f.map(|f| {
        BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
            .join("\n")
    })
    .unwrap_or_default()
}

#[test]
fn the_noon_wedge_is_a_stuck_request_series_and_prometheus_fires_the_alert() {
    let _lab = lab::exclusive();
    let dir = tempfile::Builder::new()
        .prefix("ww-exporter-")
        .tempdir()
        .expect("tmp");
    let lab = Lab::up(&LabOptions::pd().decode_env(TUNING_VAR, "100")).expect("lab up");
    let (_daemon, addr) = start_daemon(&lab, dir.path());
    let (_prom, listen) = start_prometheus(dir.path(), std::slice::from_ref(&addr));
    let _load = lab.load_background(3, 6, 120.0).expect("harness");

    // The daemon's own exposition: stuck at decode, entered at this lab's proxy.
    let decode_port = lab.decode().port;
    // Bounded generously: on a loaded 2-core machine (load 20+) the harness's requests take
    // a while to hang and the daemon's samples to show it (28-97 s measured).
    let (stuck, body) = wait_stuck_at(&addr, decode_port, dir.path(), Duration::from_secs(240));
    let component = stuck.labels["component"].clone();
    assert_eq!(stuck.labels["role"], "decode", "{body}");
    assert_eq!(stuck.labels["kind"], "no_response", "{body}");
    // Where it entered: this lab's proxy once the hops are linked; the router or decode
    // itself while a link is still ambiguous (several agents' requests at once).
    let ports = [lab.proxy().port, lab.router().port, decode_port];
    assert!(
        ports
            .iter()
            .any(|p| stuck.labels["entry"].ends_with(&format!(":{p}"))),
        "entered at one of this lab's components: {body}"
    );
    let age = lab::metric_value(
        &body,
        "wedgewatch_stuck_request_oldest_age_seconds",
        &[("component", &component)],
    )
    .expect("oldest age");
    assert!(
        age >= 8.0,
        "stuck after the fast 8 s threshold: {age}\n{body}"
    );
    let wedged = lab::metric_value(
        &body,
        "wedgewatch_findings",
        &[("kind", "wedged_request"), ("component", &component)],
    );
    assert!(
        wedged >= Some(1.0),
        "wedged_request open at decode:\n{body}"
    );
    // One status series at 1, and not `unavailable`. `degraded` is allowed: the daemon
    // watches the whole machine, and the other test lane's short-lived SGLang-shaped
    // processes (discovered, then gone) degrade its sources for a moment (seen once in a
    // full run: processes, sockets and metrics degraded together).
    let status = |s: &str| {
        lab::metric_value(
            &body,
            "wedgewatch_source_status",
            &[("source", "sockets"), ("status", s)],
        )
    };
    let ones = ["ok", "degraded", "unavailable"]
        .iter()
        .filter(|s| status(s) == Some(1.0))
        .count();
    assert_eq!(ones, 1, "{body}");
    assert_eq!(status("unavailable"), Some(0.0), "{body}");

    // Prometheus scrapes it and fires the shipped alert for that hop.
    let alert = wait_alert(&listen, &component, dir.path(), Duration::from_secs(90));
    assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
    assert_eq!(alert["labels"]["role"], "decode", "{alert}");
    assert!(
        alert["annotations"]["summary"]
            .as_str()
            .is_some_and(|s| s.contains(&component)),
        "{alert}\ndaemon log:\n{}",
        log_of(dir.path())
    );
}

/// A two-node lab (`lab.py up --two-node`, h-twonode's `tests/lab/two_node_lab.py`): node a
/// (10.77.0.1) proxy and router, node b (10.77.0.2) prefill and decode; `down` on drop
/// kills everything started inside the nodes.
struct TwoNode {
    run_dir: tempfile::TempDir,
}

impl TwoNode {
    fn up(fault: &str) -> TwoNode {
        let run_dir = tempfile::Builder::new()
            .prefix("ww-exporter-two-node")
            .tempdir()
            .expect("tempdir");
        let out = Command::new("python3")
            .arg(lab::lab_py())
            .args(["up", "--two-node", "--fault", fault, "--run-dir"])
            .arg(run_dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("lab.py up --two-node");
        let lab = TwoNode { run_dir };
        assert!(
            out.status.success(),
            "lab.py up --two-node (needs root and network namespaces): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        lab
    }

    fn lab_py(&self, verb: &str) -> Command {
        let mut c = Command::new("python3");
        c.arg(lab::lab_py())
            .args([verb, "--run-dir"])
            .arg(self.run_dir.path())
            .stdin(Stdio::null());
        c
    }

    /// `program args` inside `node` (its network, PID and mount namespaces).
    fn on_node(&self, node: &str, program: &str, args: &[String]) -> Command {
        let mut c = self.lab_py("exec");
        c.args([node, "--", program]).args(args);
        c
    }

    /// GET from inside node a (the nodes' addresses are not routed from the host).
    fn get_on_a(&self, url: &str) -> Option<String> {
        const PROBE: &str = "import sys, urllib.request\nprint(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())";
        let args = ["-c".to_string(), PROBE.to_string(), url.to_string()];
        let out = self.on_node("a", "python3", &args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).to_string())
    }
}

impl Drop for TwoNode {
    fn drop(&mut self) {
        let _ = self.lab_py("down").output();
    }
}

/// `wedgewatch daemon --metrics-listen ADDR:9466` inside `node`, logging to `dir`.
fn node_daemon(lab: &TwoNode, node: &str, addr: &str, dir: &Path) -> Killed {
    let state = dir.join(format!("state-{node}"));
    let fast = lab::repo_root().join("tests/fixtures/thresholds-fast.toml");
    let args: Vec<String> = vec![
        "--thresholds".into(),
        fast.display().to_string(),
        "--state-dir".into(),
        state.display().to_string(),
        "daemon".into(),
        "--no-record".into(),
        "--for".into(),
        "300s".into(),
        "--metrics-listen".into(),
        format!("{addr}:9466"),
    ];
    let log = std::fs::File::create(dir.join(format!("daemon-{node}.log"))).expect("log");
    let child = lab
        .on_node(node, env!("CARGO_BIN_EXE_wedgewatch"), &args)
        .env("WEDGEWATCH_NVML_LIB", env!("FAKE_NVML_PATH"))
        .env("WEDGEWATCH_PY_SPY", lab::venv_bin("py-spy"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn the node's daemon");
    Killed(child)
}

/// Waits until Prometheus (inside node a at `listen`) fires `WedgewatchRequestsStuck` for
/// a component of `instance`; the alert.
fn wait_alert_on_a(lab: &TwoNode, listen: &str, instance: &str, dir: &Path) -> Value {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < Duration::from_secs(150) {
        if let Some(body) = lab.get_on_a(&format!("http://{listen}/api/v1/alerts")) {
            let v: Value = serde_json::from_str(&body).unwrap_or_default();
            let hit = v["data"]["alerts"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| {
                    a["labels"]["alertname"] == "WedgewatchRequestsStuck"
                        && a["labels"]["instance"] == instance
                        && a["state"] == "firing"
                });
            if let Some(a) = hit {
                return a.clone();
            }
            last = body;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let logs: Vec<String> = ["daemon-a.log", "daemon-b.log", "prometheus.log"]
        .iter()
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap_or_default())
        .collect();
    panic!("no WedgewatchRequestsStuck from {instance}; alerts: {last}\nlogs: {logs:#?}");
}

/// Issue 14: one daemon per node of the two-node lab under the noon wedge; a real Prometheus
/// (on node a, where both daemons are reachable) scrapes both and fires
/// `WedgewatchRequestsStuck` for decode on node b. Node a's daemon sees only its side (the
/// router's upstream requests hanging, with no next hop it can see): that is what `merge`
/// is for; the exporter reports each node as it sees it, with `instance` naming the node.
#[test]
fn prometheus_scrapes_a_daemon_per_node_and_fires_for_decode_on_node_b() {
    let _lab = lab::exclusive();
    let dir = tempfile::Builder::new()
        .prefix("ww-exporter-2n-")
        .tempdir()
        .expect("tmp");
    let lab = TwoNode::up("accepted-and-forgotten");
    let _a = node_daemon(&lab, "a", "10.77.0.1", dir.path());
    let _b = node_daemon(&lab, "b", "10.77.0.2", dir.path());
    let rules = fast_rules(dir.path());
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
         rule_files:\n  - '{}'\n\
         scrape_configs:\n  - job_name: wedgewatch\n    static_configs:\n      - targets: ['10.77.0.1:9466', '10.77.0.2:9466']\n",
        rules.display()
    );
    let cfg = dir.path().join("prometheus.yml");
    std::fs::write(&cfg, config).expect("config");
    let listen = "10.77.0.1:9090";
    let prom_args = vec![
        format!("--config.file={}", cfg.display()),
        format!("--storage.tsdb.path={}", dir.path().join("data").display()),
        format!("--web.listen-address={listen}"),
        "--log.level=warn".to_string(),
    ];
    assert!(
        Path::new(PROMETHEUS).is_file(),
        "{PROMETHEUS} missing: tests/run-all.sh installs it"
    );
    let _prom = Killed(
        lab.on_node("a", PROMETHEUS, &prom_args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).expect("log"))
            .spawn()
            .expect("spawn prometheus on node a"),
    );
    let _load = Killed(
        lab.lab_py("load")
            .args(["--agents", "3", "--rounds", "6", "--timeout", "120"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("harness"),
    );

    let alert = wait_alert_on_a(&lab, listen, "10.77.0.2:9466", dir.path());
    assert_eq!(
        alert["labels"]["component"], "decode@10.77.0.2:30001",
        "{alert}"
    );
    assert_eq!(alert["labels"]["role"], "decode", "{alert}");
    // Both nodes' daemons are scraped.
    let up = lab
        .get_on_a(&format!("http://{listen}/api/v1/query?query=up"))
        .expect("query up");
    let v: Value = serde_json::from_str(&up).expect("json");
    let ups: Vec<(String, String)> = v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["metric"]["instance"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                r["value"][1].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    for node in ["10.77.0.1:9466", "10.77.0.2:9466"] {
        assert!(
            ups.contains(&(node.to_string(), "1".to_string())),
            "{node} up: {ups:?}"
        );
    }
    // Node b's decode is never on node a's side: node a's stuck series name its own hops.
    let q = "wedgewatch_stuck_requests{instance=\"10.77.0.1:9466\"}";
    let a_side = lab
        .get_on_a(&format!(
            "http://{listen}/api/v1/query?query={}",
            q.replace('"', "%22")
                .replace('{', "%7B")
                .replace('}', "%7D")
        ))
        .unwrap_or_default();
    assert!(!a_side.contains("decode@"), "{a_side}");
}
