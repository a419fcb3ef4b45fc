//! `fleet snapshot` with the real binary as each node's command, on the lab (issue 14):
//! the template `env WEDGEWATCH_NODE={node}` runs `wedgewatch snapshot --json` here as node
//! `lab1`; a second node whose transport cannot start is named and left out. The merged
//! snapshot carries the node's identity and clocks, namespaces the lab's components by the
//! node, and still finds the lab's wedge at decode.

use wedgewatch_testkit::lab;
use wedgewatch_testkit::timing::within;

use lab::{Lab, LabOptions};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TUNING_VAR: &str = "SGLANG_DECODE_PREALLOC_SPLIT_TOKENS";

fn wait_hung(lab: &Lab, bound: Duration) {
    let started = Instant::now();
    let url = lab
        .decode()
        .metrics_url
        .clone()
        .expect("decode metrics url");
    loop {
        if let Ok((200, body)) = lab::http_get(&url, Duration::from_secs(2)) {
            let v = lab::metric_value(
                &body,
                "sglang:http_requests_active",
                &[("endpoint", "/v1/chat/completions")],
            );
            if v.unwrap_or(0.0) >= 1.0 {
                return;
            }
        }
        assert!(
            started.elapsed() < bound,
            "requests did not hang within {bound:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_real_binary_through_a_template_is_merged_with_its_node_named() {
    let _lab = lab::exclusive();
    let lab = Lab::up(&LabOptions::pd().decode_env(TUNING_VAR, "100")).expect("lab up");
    let _load = lab.load_background(3, 6, 90.0).expect("harness");
    wait_hung(&lab, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(5));
    let bin = env!("CARGO_BIN_EXE_wedgewatch");
    let thresholds = lab::repo_root().join("tests/fixtures/thresholds-fast.toml");
    let remote = format!(
        "{bin} snapshot --json --no-daemon --window 5 --thresholds {}",
        thresholds.display()
    );
    let out = Command::new(bin)
        .args([
            "fleet",
            "snapshot",
            "--nodes",
            "lab1,ghost",
            "--timeout",
            "90s",
            "--json",
        ])
        // `ghost` is reached by a program that does not exist: named, left out
        .args([
            "--via",
            "env WEDGEWATCH_NODE={node} /nonexistent/transport-{node}",
        ])
        .args(["--remote", &remote])
        .env("WEDGEWATCH_NVML_LIB", env!("FAKE_NVML_PATH"))
        .env("FAKE_NVML_DIR", lab.nvml_dir())
        .env("WEDGEWATCH_PY_SPY", lab::venv_bin("py-spy"))
        .stdin(Stdio::null())
        .output()
        .expect("run fleet");
    let err = String::from_utf8_lossy(&out.stderr);
    // both nodes fail with that template: the transport for lab1 is the real one below
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("lab1") && err.contains("ghost"), "{err}");
    let started = Instant::now();
    let out = Command::new(bin)
        .args([
            "fleet",
            "snapshot",
            "--nodes",
            "lab1",
            "--timeout",
            "90s",
            "--json",
        ])
        .args(["--via", "env WEDGEWATCH_NODE={node}"])
        .args(["--remote", &remote])
        .env("WEDGEWATCH_NVML_LIB", env!("FAKE_NVML_PATH"))
        .env("FAKE_NVML_DIR", lab.nvml_dir())
        .env("WEDGEWATCH_PY_SPY", lab::venv_bin("py-spy"))
        .stdin(Stdio::null())
        .output()
        .expect("run fleet");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    // Each node's command is bounded by `--timeout`.
    assert!(
        started.elapsed() < within(Duration::from_secs(90)),
        "{:?}",
        started.elapsed()
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("merged JSON");
    let node = &v["fleet"]["nodes"][0];
    assert_eq!(node["name"], "lab1");
    let id = &node["identity"];
    assert_eq!(id["name"], "lab1", "WEDGEWATCH_NODE reached the node: {id}");
    assert!(
        id["machine_id"]
            .as_str()
            .is_some_and(|m| m.starts_with("sha256:")),
        "hashed: {id}"
    );
    assert!(id["boot_id"].as_str().is_some_and(|b| !b.is_empty()));
    assert!(
        id["clock"]["wall_ms"].as_i64().is_some() && id["clock"]["monotonic_ms"].as_i64().is_some()
    );
    assert_eq!(node["skew_ms"], 0, "the only node is the reference");
    let decode_pid = u64::from(lab.decode().pid);
    let decode = v["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["main_pid"].as_u64() == Some(decode_pid))
        .and_then(|c| c["id"].as_str())
        .expect("decode")
        .to_string();
    assert!(decode.starts_with("lab1/decode"), "{decode}");
    let wedged = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == "wedged_request" && f["component"] == decode.as_str());
    let f = wedged.unwrap_or_else(|| panic!("no wedged_request at {decode}: {:#}", v["findings"]));
    let ev = f["evidence"].to_string();
    assert!(
        ev.contains("[node lab1]"),
        "the path names the node of each hop: {ev}"
    );
}
