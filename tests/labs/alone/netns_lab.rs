//! Containers on one host (issue 11 item 5), against the namespaced lab (`lab.py up --netns`):
//! two pods (each its own network + PID namespace, each in a `docker-<id>.scope` cgroup when
//! the host's cgroups are writable) run an engine on the same port P, pod-a also the real
//! router; the host's own 127.0.0.1:P is held by a decoy whose `/metrics` says
//! `sglang:num_running_reqs{model_name="decoy"} 999`.
//!
//! Needs root (`unshare --net --pid`); skipped, saying so, without it.

use std::path::{Path, PathBuf};
use std::process::Command;
use wedgewatch::discover::{self, DiscoverOptions};
use wedgewatch::model::{Component, FetchOutcome, Role, Topology};
use wedgewatch::probes::ProbeSet;
use wedgewatch::sources::metrics::{MetricsConfig, MetricsSource};
use wedgewatch_testkit::lab;

struct Pod {
    netns: u64,
    container_id: Option<String>,
    engine_pid: i32,
}

struct NetnsLab {
    run_dir: tempfile::TempDir,
    port: u16,
    router_port: u16,
    a: Pod,
    b: Pod,
}

fn lab_py() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lab/lab.py")
}

impl NetnsLab {
    fn up() -> Option<NetnsLab> {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: the namespaced lab needs root (unshare --net --pid)");
            return None;
        }
        let run_dir = tempfile::Builder::new()
            .prefix("ww-netns-lab")
            .tempdir()
            .expect("tempdir");
        let out = Command::new("python3")
            .arg(lab_py())
            .args(["up", "--netns", "--run-dir"])
            .arg(run_dir.path())
            .output()
            .expect("run lab.py");
        let lab: serde_json::Value = std::fs::read(run_dir.path().join("lab.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let mut guard = NetnsLab {
            run_dir,
            port: 0,
            router_port: 0,
            a: Pod::empty(),
            b: Pod::empty(),
        };
        assert!(
            out.status.success(),
            "lab.py up --netns failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pod = |name: &str| Pod {
            netns: lab["components"][name]["netns"].as_u64().expect("netns"),
            container_id: lab["components"][name]["container_id"]
                .as_str()
                .map(String::from),
            engine_pid: lab["components"][name]["services"]["engine"]["pid"]
                .as_i64()
                .expect("engine pid") as i32,
        };
        guard.port = lab["engine_port"].as_u64().expect("port") as u16;
        guard.router_port = lab["router_port"].as_u64().expect("router port") as u16;
        guard.a = pod("pod-a");
        guard.b = pod("pod-b");
        Some(guard)
    }

    fn engine_id(&self, pod: &Pod) -> String {
        format!("engine@net:{}/127.0.0.1:{}", pod.netns, self.port)
    }
}

impl Pod {
    fn empty() -> Pod {
        Pod {
            netns: 0,
            container_id: None,
            engine_pid: 0,
        }
    }
}

impl Drop for NetnsLab {
    fn drop(&mut self) {
        let _ = Command::new("python3")
            .arg(lab_py())
            .args(["down", "--run-dir"])
            .arg(self.run_dir.path())
            .output();
    }
}

fn component<'a>(topo: &'a Topology, id: &str) -> &'a Component {
    topo.component(id).unwrap_or_else(|| {
        let ids: Vec<&str> = topo.components.iter().map(|c| c.id.as_str()).collect();
        panic!("no component {id}; have {ids:?}")
    })
}

/// Every thread of this process is still in our own network namespace.
fn all_threads_in_our_namespace() -> Result<(), String> {
    let own = std::fs::read_link("/proc/self/ns/net").map_err(|e| e.to_string())?;
    for t in std::fs::read_dir("/proc/self/task").map_err(|e| e.to_string())? {
        let t = t.map_err(|e| e.to_string())?.path();
        if let Ok(ns) = std::fs::read_link(t.join("ns/net")) {
            if ns != own {
                return Err(format!("{} is in {ns:?}, not {own:?}", t.display()));
            }
        }
    }
    Ok(())
}

#[test]
fn pods_on_one_port_are_two_components_scraped_inside_their_namespaces() {
    let _lab = lab::exclusive();
    let Some(lab) = NetnsLab::up() else { return };
    let probes = ProbeSet::builtin().expect("probes");
    let topo = discover::discover(
        &probes,
        &DiscoverOptions {
            deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
            ..DiscoverOptions::default()
        },
    )
    .expect("discover");

    // discovery: two engines on one port, told apart by namespace, each in its container
    for pod in [&lab.a, &lab.b] {
        let c = component(&topo, &lab.engine_id(pod));
        assert_eq!(c.netns, Some(pod.netns));
        assert_eq!(c.main_pid, Some(pod.engine_pid));
        assert_eq!(
            c.metrics_url.as_deref(),
            Some(format!("http://127.0.0.1:{}/metrics", lab.port).as_str())
        );
        if let Some(id) = &pod.container_id {
            assert_eq!(
                c.container.as_deref(),
                Some(format!("docker {}", &id[..12]).as_str())
            );
            let sched = topo
                .components
                .iter()
                .find(|k| k.parent.as_deref() == Some(c.id.as_str()) && k.role == Role::Scheduler)
                .expect("scheduler child");
            assert_eq!(sched.container, c.container, "children share the container");
        } else {
            eprintln!("cgroups not writable here: container names not checked");
        }
    }
    // the router in pod-a: its --worker-urls 127.0.0.1:P is pod-a's engine, not pod-b's
    let router_id = format!("router@net:{}/127.0.0.1:{}", lab.a.netns, lab.router_port);
    component(&topo, &router_id);
    let to: Vec<&str> = topo
        .edges
        .iter()
        .filter(|e| e.from == router_id)
        .map(|e| e.to.as_str())
        .collect();
    assert_eq!(to, vec![lab.engine_id(&lab.a).as_str()]);

    // metrics: each engine's own exposition (its served model), never the decoy's
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let source = MetricsSource::new(probes.metric_maps.clone(), MetricsConfig::default())
        .expect("metrics source");
    for (pod, model) in [(&lab.a, "pod-a"), (&lab.b, "pod-b")] {
        let c = component(&topo, &lab.engine_id(pod));
        let s = rt.block_on(source.scrape_component(c));
        let probe = s.metrics.as_ref().expect("metrics probe");
        assert_eq!(probe.outcome, FetchOutcome::Ok, "{probe:?}");
        let models: Vec<&str> = s
            .series
            .iter()
            .filter(|x| x.name == "sglang:num_running_reqs")
            .filter_map(|x| x.labels.get("model_name").map(String::as_str))
            .collect();
        assert!(!models.is_empty(), "no running series from {}", c.id);
        assert!(
            models.iter().all(|m| *m == model),
            "{} read {models:?}",
            c.id
        );
        assert_ne!(s.mapped.get("running"), Some(&999.0));
        for p in &s.extra_probes {
            assert_eq!(p.outcome, FetchOutcome::Ok, "{p:?}");
        }
    }
    let router = component(&topo, &router_id);
    let s = rt.block_on(source.scrape_component(router));
    assert_eq!(
        s.metrics.as_ref().map(|p| p.outcome.clone()),
        Some(FetchOutcome::Ok)
    );
    assert!(s.extra.contains_key("workers"), "{:?}", s.extra_probes);
    // the namespace threads never leaked into this process's other threads
    all_threads_in_our_namespace().expect("threads");

    // a request held open at pod-b's engine (sent inside pod-b, never answered: its headers
    // never end) is that engine's, not pod-a's on the same port
    let held = wedgewatch::sys::netns::connect_blocking(
        wedgewatch::sys::netns::Netns {
            pid: lab.b.engine_pid,
            inode: lab.b.netns,
        },
        format!("127.0.0.1:{}", lab.port).parse().expect("addr"),
        std::time::Duration::from_secs(1),
    )
    .expect("connect inside pod-b");
    std::io::Write::write_all(&mut &held, b"GET /v1/models HTTP/1.1\r\nHost: pod-b\r\n")
        .expect("send");

    // snapshot through the CLI: no false endpoint_unresponsive, the fields in the contract
    let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(["snapshot", "--json", "--window", "2"])
        .env_remove("WEDGEWATCH_PY_SPY")
        .output()
        .expect("snapshot");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let ours: Vec<String> = snap["components"]
        .as_array()
        .expect("components")
        .iter()
        .filter(|c| {
            let ns = c["netns"].as_u64();
            ns == Some(lab.a.netns) || ns == Some(lab.b.netns)
        })
        .filter_map(|c| c["id"].as_str().map(String::from))
        .collect();
    assert!(ours.contains(&lab.engine_id(&lab.a)), "{ours:?}");
    assert!(ours.contains(&lab.engine_id(&lab.b)), "{ours:?}");
    assert!(ours.contains(&router_id), "{ours:?}");
    let false_alarms: Vec<&serde_json::Value> = snap["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["kind"] == "endpoint_unresponsive")
        .filter(|f| {
            let txt = f.to_string();
            ours.iter().any(|id| txt.contains(id.as_str()))
        })
        .collect();
    assert!(false_alarms.is_empty(), "{false_alarms:#?}");
    let engine_a = snap["components"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .find(|c| c["id"].as_str() == Some(lab.engine_id(&lab.a).as_str()))
        })
        .expect("engine a in the snapshot");
    assert_eq!(engine_a["metrics"]["running"], 0.0);
    if let Some(id) = &lab.a.container_id {
        assert_eq!(engine_a["container"], format!("docker {}", &id[..12]));
    }
    let client = held.local_addr().expect("local addr").to_string();
    let at: Vec<&str> = snap["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .filter(|r| r["client"].as_str() == Some(client.as_str()))
        .filter_map(|r| r["component"].as_str())
        .filter(|c| ours.iter().any(|o| o == c))
        .collect();
    assert!(!at.is_empty(), "{client}: {:#}", snap["requests"]);
    assert!(at.iter().all(|c| *c == lab.engine_id(&lab.b)), "{at:?}");
    drop(held);
    validate_snapshot(&snap);
}

fn validate_snapshot(v: &serde_json::Value) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/schema/snapshot-1.schema.json");
    let schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("schema")).expect("json");
    let validator = jsonschema::validator_for(&schema).expect("schema compiles");
    let errors: Vec<String> = validator
        .iter_errors(v)
        .map(|e| format!("{e} at {}", e.instance_path))
        .collect();
    assert!(errors.is_empty(), "{errors:#?}");
}

/// A component in a container says so in the Overview and in report.md (fixture snapshot, no
/// lab needed); one on the host shows nothing new.
#[cfg(feature = "tui")]
#[test]
fn the_container_is_shown_in_the_overview_and_the_report() {
    let _lab = lab::exclusive();
    use ratatui::backend::TestBackend;
    use wedgewatch::tui::{App, AppOptions, FeedFrame, SamplerHealth};
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots/wedged.json");
    let mut snap: wedgewatch::model::Snapshot =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("snapshot");
    let decode = snap
        .components
        .iter_mut()
        .find(|c| c.id == "decode@127.0.0.1:31012")
        .expect("decode in the fixture");
    decode.container =
        Some("k8s pod 3d274242-8ee0-11e9-a8a6-1e68d864ef1a containerd 3e74d3fd9db4".into());
    decode.netns = Some(4026532180);
    let md = wedgewatch::report::render(&snap);
    assert!(
        md.contains(
            "- container `k8s pod 3d274242-8ee0-11e9-a8a6-1e68d864ef1a containerd 3e74d3fd9db4`"
        ),
        "{md}"
    );
    assert!(
        md.contains("- network namespace `net:[4026532180]`"),
        "{md}"
    );
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame {
        snapshot: snap,
        sampler: SamplerHealth {
            lag_ms: None,
            dropped_samples: 0,
            note: None,
        },
    });
    let mut t = ratatui::Terminal::new(TestBackend::new(200, 50)).expect("terminal");
    t.draw(|f| app.render(f)).expect("draw");
    let screen = t.backend().to_string();
    // The topology's line of decode carries its container (the header's headline and the
    // finding list name decode too, without it).
    assert!(
        screen.lines().any(|l| l.contains("decode@127.0.0.1:31012")
            && !l.contains("scheduler@")
            && l.contains("[k8s pod 3d274242")),
        "no decode line with its container:\n{screen}"
    );
    assert!(!screen.contains("[docker"), "{screen}");
}

/// Inside another namespace only IP literals are connected to: a name would be resolved by
/// the host's resolver for the host's network. (Our own namespace stands in for a pod's.)
#[test]
fn names_are_not_resolved_inside_another_namespace() {
    let _lab = lab::exclusive();
    use wedgewatch::sys::http::{self, Limits};
    use wedgewatch::sys::netns::{own_inode, route, Netns};
    let ns = Netns {
        pid: std::process::id() as i32,
        inode: own_inode().expect("own netns"),
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let r = rt.block_on(http::get_routed(
        "http://localhost:1/metrics",
        Limits::default(),
        route(Some(ns)),
        None,
    ));
    assert_eq!(r.outcome, FetchOutcome::Error);
    assert!(
        r.detail
            .as_deref()
            .unwrap_or("")
            .contains("not an IP address"),
        "{:?}",
        r.detail
    );
    // a pid whose namespace is not the one discovery saw is refused, not entered
    let moved = Netns { inode: 1, ..ns };
    let r = rt.block_on(http::get_routed(
        "http://127.0.0.1:1/metrics",
        Limits::default(),
        route(Some(moved)),
        None,
    ));
    assert_eq!(r.outcome, FetchOutcome::Error);
    assert!(
        r.detail.as_deref().unwrap_or("").contains("not entered"),
        "{:?}",
        r.detail
    );
}
