//! Discovery against live processes with SGLang's shapes, and against fixture /proc trees.

use wedgewatch_testkit::lab;
use wedgewatch_testkit::shapes;

use shapes::{fixture_proc, free_port, Shape};
use std::time::Duration;
use wedgewatch::discover::{
    self, DiscoverOptions, LABEL_ARGS_PID, LABEL_ENV_PID, LABEL_METRICS_UNSCRAPED,
};
use wedgewatch::model::{Channel, ChannelKind, EdgeOrigin, Role, Topology};
use wedgewatch::probes::ProbeSet;
use wedgewatch::sources::processes;
use wedgewatch::sys::sock_diag::{dump_netlink, RecentDump};

fn comp<'a>(t: &'a Topology, id: &str) -> &'a wedgewatch::model::Component {
    t.component(id).unwrap_or_else(|| {
        let ids: Vec<&str> = t.components.iter().map(|c| c.id.as_str()).collect();
        panic!("no component {id}; have {ids:?}")
    })
}

fn has_edge(t: &Topology, from: &str, to: &str, origin: EdgeOrigin) -> bool {
    t.edges
        .iter()
        .any(|e| e.from == from && e.to == to && e.origin == origin)
}

#[test]
fn live_pd_stack_roles_grouping_ports_edges() {
    let _lab = lab::exclusive();
    let (p, d, r, rm, x, r2, r2m, bp) = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    );
    let bps = bp.to_string();
    let prefill = Shape::engine(
        "prefill",
        p,
        1,
        &[
            "--host",
            "127.0.0.1",
            "--disaggregation-bootstrap-port",
            &bps,
        ],
        &[("CUDA_VISIBLE_DEVICES", "2")],
    );
    // decode without --host: the profile's default host applies
    let decode = Shape::engine("decode", d, 2, &[], &[("CUDA_VISIBLE_DEVICES", "0,1")]);
    let (rs, rms, xs, r2s, r2ms) = (
        r.to_string(),
        rm.to_string(),
        x.to_string(),
        r2.to_string(),
        r2m.to_string(),
    );
    let purl = format!("http://127.0.0.1:{p}");
    let durl = format!("http://127.0.0.1:{d}");
    // the router under a launcher that keeps its arguments (setproctitle clobbers its own)
    let router = Shape::start(
        &[
            "timeout",
            "60",
            "python3",
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            &rs,
            "--pd-disaggregation",
            "--prefill",
            &purl,
            &bps,
            "--decode",
            &durl,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &rms,
        ],
        &[],
    );
    // a router whose arguments survive nowhere: sockets + GET /workers
    let bare_router = Shape::start(
        &[
            "python3",
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--port",
            &r2s,
            "--worker-urls",
            &durl,
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            &r2ms,
        ],
        &[],
    );
    let proxy = Shape::start(
        &["python3", "proxy.py", "--listen", &xs, "--upstream", &rs],
        &[],
    );

    let probes = ProbeSet::builtin().expect("built-in probes");
    let topo = discover::discover(
        &probes,
        &DiscoverOptions {
            deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
            ..DiscoverOptions::default()
        },
    )
    .expect("discover");

    // engines: role refined by --disaggregation-mode, id from listen address, GPUs from env
    let pid_ = format!("prefill@127.0.0.1:{p}");
    let did = format!("decode@127.0.0.1:{d}");
    let pc = comp(&topo, &pid_);
    assert_eq!(pc.role, Role::Prefill);
    assert_eq!(pc.stack, "sglang");
    assert_eq!(pc.main_pid, Some(prefill.pid));
    assert_eq!(pc.pids, vec![prefill.pid]);
    assert_eq!(
        pc.listen.first().map(String::as_str),
        Some(format!("127.0.0.1:{p}").as_str())
    );
    assert_eq!(pc.http_url.as_deref(), Some(purl.as_str()));
    assert_eq!(pc.metrics_url, Some(format!("{purl}/metrics")));
    assert_eq!(pc.gpus, vec![2]);
    // its bootstrap server's port is a channel, its serving port is not
    assert_eq!(
        pc.channels,
        vec![Channel {
            addr: format!("127.0.0.1:{bp}"),
            kind: ChannelKind::Bootstrap
        }],
        "{:?}",
        pc.listen
    );
    let dc = comp(&topo, &did);
    assert_eq!(dc.role, Role::Decode);
    assert_eq!(dc.main_pid, Some(decode.pid));
    assert_eq!(dc.gpus, vec![0, 1]);

    // children: titled processes grouped under their engine, own components, GPU per rank
    let kids = decode.child_pids();
    assert_eq!(kids.len(), 3, "TP0, TP1, detokenizer: {:?}", decode.ready);
    for (i, title) in ["scheduler_TP0", "scheduler_TP1"].iter().enumerate() {
        let c = comp(&topo, &format!("{title}@{did}"));
        assert_eq!(c.role, Role::Scheduler);
        assert_eq!(c.parent.as_deref(), Some(did.as_str()));
        assert_eq!(c.main_pid, Some(kids[i]));
        assert_eq!(
            c.title.as_deref(),
            Some(format!("sglang::{title}").as_str())
        );
        assert_eq!(
            c.gpus,
            vec![i as u32],
            "GPU of {title} from the engine's CUDA_VISIBLE_DEVICES"
        );
        assert_eq!(c.labels.get(LABEL_ENV_PID), Some(&decode.pid.to_string()));
        assert!(dc.children.contains(&c.id));
    }
    let det = comp(&topo, &format!("detokenizer@{did}"));
    assert_eq!(det.role, Role::Detokenizer);
    assert_eq!(det.main_pid, Some(kids[2]));
    let psched = comp(&topo, &format!("scheduler@{pid_}"));
    assert_eq!(psched.gpus, vec![2]);
    // the titled child's own environ is gone, the engine's is used
    let kid_facts = processes::facts(std::path::Path::new("/proc"), kids[0]);
    assert!(
        kid_facts.env.as_ref().is_some_and(|e| e.is_empty()),
        "setproctitle shape clobbers environ"
    );
    assert_eq!(
        kid_facts.cmdline,
        Some(vec!["sglang::scheduler_TP0".to_string()])
    );

    // router: titled, arguments from its launcher, metrics on --prometheus-port, config edges
    let rid = format!("router@127.0.0.1:{r}");
    let rc = comp(&topo, &rid);
    assert_eq!(rc.role, Role::Router);
    assert_ne!(
        rc.main_pid,
        Some(router.pid),
        "the launcher is not the router"
    );
    assert_eq!(rc.labels.get(LABEL_ARGS_PID), Some(&router.pid.to_string()));
    assert_eq!(rc.title.as_deref(), Some("sglang::router"));
    assert_eq!(
        rc.metrics_url,
        Some(format!("http://127.0.0.1:{rm}/metrics"))
    );
    assert!(
        rc.listen.contains(&format!("127.0.0.1:{rm}")),
        "{:?}",
        rc.listen
    );
    assert!(has_edge(&topo, &rid, &pid_, EdgeOrigin::Config));
    assert!(has_edge(&topo, &rid, &did, EdgeOrigin::Config));
    assert!(
        topo.components
            .iter()
            .all(|c| c.main_pid != Some(router.pid)),
        "launcher is no component"
    );

    // bare router: API port found by asking /workers on its sockets; edges from the answer
    let r2id = format!("router@127.0.0.1:{r2}");
    let r2c = comp(&topo, &r2id);
    assert_eq!(r2c.main_pid, Some(bare_router.pid));
    assert_eq!(
        r2c.labels.get("workers_source").map(String::as_str),
        Some("GET /workers")
    );
    assert!(has_edge(&topo, &r2id, &did, EdgeOrigin::Config));

    // generic proxy: listens, holds an ESTABLISHED connection to the router
    let xid = format!("proxy@127.0.0.1:{x}");
    let xc = comp(&topo, &xid);
    assert_eq!(xc.role, Role::Proxy);
    assert_eq!(xc.main_pid, Some(proxy.pid));
    assert!(has_edge(&topo, &xid, &rid, EdgeOrigin::Sockets));
    drop((prefill, decode, router, bare_router, proxy));
}

#[test]
fn extra_pid_and_url_are_added() {
    let _lab = lab::exclusive();
    let port = free_port();
    let l = std::net::TcpListener::bind(("127.0.0.1", port)).expect("bind");
    let sleeper = Shape::start(
        &[
            "python3",
            "-c",
            "print('READY', flush=True)\nimport time\ntime.sleep(60)",
        ],
        &[],
    );
    let opts = DiscoverOptions {
        extra_pids: vec![sleeper.pid],
        extra_urls: vec![format!("http://127.0.0.1:{port}")],
        deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
        ..DiscoverOptions::default()
    };
    let topo = discover::discover(&ProbeSet::builtin().expect("probes"), &opts).expect("discover");
    let c = comp(&topo, &format!("other@pid{}", sleeper.pid));
    assert_eq!(c.role, Role::Other);
    assert_eq!(c.labels.get("found_by").map(String::as_str), Some("--pid"));
    let u = comp(&topo, &format!("other@127.0.0.1:{port}"));
    assert_eq!(
        u.metrics_url,
        Some(format!("http://127.0.0.1:{port}/metrics"))
    );
    drop(l);
}

/// Issue 10 item 13: a `--host` naming another machine is never scraped. An engine that says
/// `--host 10.1.2.3` but listens on 0.0.0.0 is scraped on loopback; one that says so and does
/// not listen on its port here is not scraped at all, and its metrics status says why.
#[test]
fn remote_host_flags_are_not_scraped() {
    let _lab = lab::exclusive();
    let (p, q) = (free_port(), free_port());
    let (ps, qs) = (p.to_string(), q.to_string());
    let wildcard = Shape::engine(
        "decode",
        p,
        1,
        &["--host", "10.1.2.3", "--shape-bind", "0.0.0.0"],
        &[],
    );
    let remote = Shape::engine(
        "prefill",
        q,
        1,
        &["--host", "10.1.2.3", "--shape-bind", "none"],
        &[],
    );
    let probes = ProbeSet::builtin().expect("built-in probes");
    let topo = discover::discover(
        &probes,
        &DiscoverOptions {
            deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
            ..DiscoverOptions::default()
        },
    )
    .expect("discover");

    let w = comp(&topo, &format!("decode@10.1.2.3:{ps}"));
    assert_eq!(w.main_pid, Some(wildcard.pid));
    assert_eq!(w.http_url, Some(format!("http://127.0.0.1:{p}")));
    assert_eq!(w.metrics_url, Some(format!("http://127.0.0.1:{p}/metrics")));
    assert!(!w.labels.contains_key(LABEL_METRICS_UNSCRAPED), "{w:?}");

    let r = comp(&topo, &format!("prefill@10.1.2.3:{qs}"));
    assert_eq!(r.main_pid, Some(remote.pid));
    assert_eq!(r.metrics_url, None, "a remote --host is never scraped");
    assert_eq!(r.http_url, None);
    let why = r
        .labels
        .get(LABEL_METRICS_UNSCRAPED)
        .expect("why not scraped");
    assert!(
        why.contains(&format!("10.1.2.3:{q}")) && why.contains("not on this host"),
        "{why}"
    );

    // The metrics source says why in its status.
    let src = wedgewatch::sources::metrics::MetricsSource::new(
        probes.metric_maps.clone(),
        Default::default(),
    )
    .expect("source");
    let only = wedgewatch::model::Topology {
        components: vec![r.clone()],
        ..Default::default()
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let s = rt.block_on(wedgewatch::sources::Source::sample(
        &src,
        &only,
        &wedgewatch::clock::SystemClock,
    ));
    let reason = s.status.reason.unwrap_or_default();
    assert!(reason.contains("not on this host"), "{reason}");
    drop((wildcard, remote));
}

fn fixture_opts(name: &str) -> DiscoverOptions {
    DiscoverOptions {
        proc_root: fixture_proc(name),
        query_endpoints: false,
        exclude_pids: Vec::new(),
        http_timeout: Duration::from_millis(100),
        deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
        ..DiscoverOptions::default()
    }
}

#[test]
fn fixture_container_tree() {
    let _lab = lab::exclusive();
    let root = fixture_proc("container");
    let topo = discover::discover(
        &ProbeSet::builtin().expect("probes"),
        &fixture_opts("container"),
    )
    .expect("discover");
    let d = comp(&topo, "decode@127.0.0.1:31012");
    assert_eq!(d.main_pid, Some(100));
    assert_eq!(d.gpus, vec![3, 4]);
    let s = comp(&topo, "scheduler_TP1@decode@127.0.0.1:31012");
    assert_eq!(s.main_pid, Some(101));
    assert_eq!(
        s.gpus,
        vec![4],
        "TP1 -> second entry of CUDA_VISIBLE_DEVICES=3,4"
    );
    assert_eq!(s.parent.as_deref(), Some("decode@127.0.0.1:31012"));
    // the router's launcher (pid 110, `timeout`) keeps the args of the titled router (111)
    let r = comp(&topo, "router@127.0.0.1:30000");
    assert_eq!(r.main_pid, Some(111));
    assert!(topo
        .edges
        .iter()
        .any(|e| e.from == "router@127.0.0.1:30000" && e.to == "decode@127.0.0.1:31012"));
    assert!(r
        .labels
        .get("workers_unresolved")
        .is_some_and(|u| u.contains("127.0.0.1:31011")));

    // NSpid and namespaces of a containerised process
    let f = processes::facts(&root, 100);
    assert_eq!(f.nspid, Some(vec![100, 1]));
    assert_eq!(f.netns, Some(4026532001));
    assert_eq!(f.pidns, Some(4026532002));
    assert_eq!(f.exe.as_deref(), Some("/usr/bin/python3.11"));
    let boot_ms = 1_795_900_000_000i64;
    let tps = procfs::ticks_per_second() as i64;
    assert_eq!(f.started_at_ms, Some(boot_ms + 123_456 * 1000 / tps));
    assert_eq!(f.threads.as_ref().map(|t| t.len()), Some(2));
    assert_eq!(f.fd_count, Some(3));
    assert!(f.errors.is_empty(), "{:?}", f.errors);
}

#[test]
fn fixture_vanished_and_unreadable() {
    let _lab = lab::exclusive();
    let root = fixture_proc("container");
    // 102 is listed but its files are gone (exited mid-scan): discovery skips it, facts say so
    let topo = discover::discover(
        &ProbeSet::builtin().expect("probes"),
        &fixture_opts("container"),
    )
    .expect("discover");
    assert!(topo.components.iter().all(|c| !c.pids.contains(&102)));
    let f = processes::facts(&root, 102);
    assert!(f.cmdline.is_none() && f.env.is_none());
    for field in ["stat", "cmdline", "env"] {
        let e = f
            .errors
            .iter()
            .find(|e| e.field == field)
            .unwrap_or_else(|| panic!("no error for {field}: {:?}", f.errors));
        assert!(e.reason.contains("vanished"), "{field}: {}", e.reason);
    }
    // 103's environ cannot be read: that field has the reason, nothing else is lost
    let f = processes::facts(&root, 103);
    assert!(f.env.is_none());
    assert!(f.errors.iter().any(|e| e.field == "env"), "{:?}", f.errors);
    assert_eq!(f.errors.len(), 1, "{:?}", f.errors);
    assert!(f.cmdline.as_ref().is_some_and(|c| c.len() > 1));
    assert!(f.start_ticks.is_some() && f.threads.is_some());
    // and a pid that does not exist at all
    let f = processes::facts(&root, 999);
    assert!(f.errors.iter().all(|e| e.reason.contains("vanished")));
}

#[test]
fn live_permission_denied_is_per_field() {
    let _lab = lab::exclusive();
    // a process of root read by an unprivileged user: environ is refused, the rest is there
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP live_permission_denied_is_per_field: needs root to switch users");
        return;
    }
    let sleeper = Shape::start(
        &[
            "python3",
            "-c",
            "print('READY', flush=True)\nimport time\ntime.sleep(60)",
        ],
        &[("WW_SECRET_TOKEN", "x")],
    );
    let out = shapes::wedgewatch()
        .args(["snapshot", "--json", "--pid", &sleeper.pid.to_string()])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run wedgewatch as nobody");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snap: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let c = snap["components"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["main_pid"] == sleeper.pid))
        .expect("component for --pid");
    let procs = c["processes"].as_array().expect("processes");
    let errors = procs[0]["errors"].as_array().expect("errors");
    assert!(
        errors.iter().any(|e| e["field"] == "env"
            && e["reason"]
                .as_str()
                .is_some_and(|r| r.contains("permission denied"))),
        "{errors:?}"
    );
    assert!(procs[0]["cmdline"]
        .as_array()
        .is_some_and(|a| !a.is_empty()));
    assert!(procs[0]["state"].is_string());
    assert_eq!(snap["sources"]["processes"]["status"], "degraded");
}

use std::os::unix::process::CommandExt;

/// Polls discovery until `ready` holds (the real router needs a moment to bind), bounded.
fn discover_until(ready: impl Fn(&Topology) -> bool) -> Topology {
    let probes = ProbeSet::builtin().expect("probes");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let topo = discover::discover(
            &probes,
            &DiscoverOptions {
                deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
                ..DiscoverOptions::default()
            },
        )
        .expect("discover");
        if ready(&topo) || std::time::Instant::now() > deadline {
            return topo;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn real_sglang_router_is_discovered() {
    let _lab = lab::exclusive();
    let Some(py) = shapes::lab_python_with_router() else {
        eprintln!(
            "SKIP real_sglang_router_is_discovered: no sglang-router in tests/lab/.venv \
             (run `python3 tests/lab/lab.py setup` or pip install sglang-router==0.3.2 there)"
        );
        return;
    };
    let py = py.to_string_lossy().into_owned();
    let (p, d, r, rm, r2, r2m) = (
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
        free_port(),
    );
    let prefill = Shape::engine("prefill", p, 1, &[], &[]);
    let decode = Shape::engine("decode", d, 1, &[], &[]);
    let (purl, durl) = (
        format!("http://127.0.0.1:{p}"),
        format!("http://127.0.0.1:{d}"),
    );
    let (rs, rms, r2s, r2ms) = (
        r.to_string(),
        rm.to_string(),
        r2.to_string(),
        r2m.to_string(),
    );
    let common = [
        "--prometheus-host",
        "127.0.0.1",
        "--shutdown-grace-period-secs",
        "1",
    ];
    let env = [("HF_ENDPOINT", "http://127.0.0.1:9")];
    // PD mode under `timeout` (its launcher keeps the arguments)
    let mut argv = vec![
        "timeout",
        "60",
        &py,
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        &rs,
        "--pd-disaggregation",
        "--prefill",
        &purl,
        "38998",
        "--decode",
        &durl,
        "--prometheus-port",
        &rms,
    ];
    argv.extend_from_slice(&common);
    let router = Shape::spawn_real(&argv, &env);
    // regular mode started directly: arguments survive nowhere, /workers answers
    let mut argv = vec![
        &py as &str,
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        &r2s,
        "--worker-urls",
        &durl,
        "--prometheus-port",
        &r2ms,
    ];
    argv.extend_from_slice(&common);
    let bare = Shape::spawn_real(&argv, &env);

    let rid = format!("router@127.0.0.1:{r}");
    let r2id = format!("router@127.0.0.1:{r2}");
    let did = format!("decode@127.0.0.1:{d}");
    let topo = discover_until(|t| {
        t.component(&rid)
            .is_some_and(|c| c.listen.len() >= 2 && c.title.is_some())
            && t.component(&r2id).is_some_and(|c| {
                c.labels.get("workers_source").map(String::as_str) == Some("GET /workers")
            })
            // The router adds its workers a moment after it answers /workers at all.
            && has_edge(t, &r2id, &did, EdgeOrigin::Config)
    });
    let rc = comp(&topo, &rid);
    assert_eq!(rc.role, Role::Router);
    assert_eq!(
        rc.title.as_deref(),
        Some("sglang::router"),
        "the real router retitles itself"
    );
    assert_eq!(rc.labels.get(LABEL_ARGS_PID), Some(&router.pid.to_string()));
    assert_eq!(
        rc.metrics_url,
        Some(format!("http://127.0.0.1:{rm}/metrics"))
    );
    assert!(has_edge(
        &topo,
        &rid,
        &format!("prefill@127.0.0.1:{p}"),
        EdgeOrigin::Config
    ));
    assert!(has_edge(&topo, &rid, &did, EdgeOrigin::Config));
    let bc = comp(&topo, &r2id);
    assert_eq!(bc.main_pid, Some(bare.pid));
    assert_eq!(
        bc.labels.get("workers_source").map(String::as_str),
        Some("GET /workers")
    );
    assert!(has_edge(&topo, &r2id, &did, EdgeOrigin::Config));
    drop((prefill, decode, router, bare));
}

#[test]
fn live_vllm_shape_children_and_gpus() {
    let _lab = lab::exclusive();
    let port = free_port();
    let ps = port.to_string();
    let api = Shape::start(
        &[
            "python3",
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            "m",
            "--port",
            &ps,
            "--tensor-parallel-size",
            "2",
        ],
        &[("CUDA_VISIBLE_DEVICES", "4,5")],
    );
    let topo = discover::discover(
        &ProbeSet::builtin().expect("probes"),
        &DiscoverOptions {
            deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
            ..DiscoverOptions::default()
        },
    )
    .expect("discover");
    // --host absent: vLLM's default is 0.0.0.0; the URL still goes to loopback
    let id = format!("engine@0.0.0.0:{port}");
    let e = comp(&topo, &id);
    assert_eq!((e.role, e.stack.as_str()), (Role::Engine, "vllm"));
    assert_eq!(e.main_pid, Some(api.pid));
    assert_eq!(
        e.metrics_url,
        Some(format!("http://127.0.0.1:{port}/metrics"))
    );
    assert_eq!(e.labels.get("tp").map(String::as_str), Some("2"));
    let pids = api.child_pids(); // EngineCore, Worker_TP0, Worker_TP1
    let core = comp(&topo, &format!("EngineCore_DP0@{id}"));
    assert_eq!((core.role, core.main_pid), (Role::Scheduler, Some(pids[0])));
    assert_eq!(core.gpus, vec![4, 5]);
    for (i, pid) in pids[1..].iter().enumerate() {
        let w = comp(&topo, &format!("Worker_TP{i}@{id}"));
        assert_eq!(w.main_pid, Some(*pid));
        assert_eq!(w.gpus, vec![4 + i as u32]);
        assert_eq!(
            w.parent.as_deref(),
            Some(id.as_str()),
            "grouped under the engine, not its EngineCore"
        );
    }
    drop(api);
}

/// `sleep` processes, killed on drop.
struct Sleepers(Vec<std::process::Child>);

impl Sleepers {
    fn spawn(n: usize) -> Sleepers {
        let spawn = |_| {
            std::process::Command::new("sleep")
                .arg("120")
                .stdin(std::process::Stdio::null())
                .spawn()
                .expect("sleep")
        };
        Sleepers((0..n).map(spawn).collect())
    }
}

impl Drop for Sleepers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn proxy_at(t: &Topology, port: &str) -> bool {
    let end = format!(":{port}");
    t.components
        .iter()
        .any(|c| c.role == Role::Proxy && c.listen.iter().any(|l| l.ends_with(&end)))
}

/// Issue 15, item 3: once the proxy search knows who holds the stack's client sockets, a
/// rediscovery pass checks the fds of no unrelated process (here 200 `sleep`s); a new proxy,
/// a process never seen holding one, is still found.
#[test]
fn rediscovery_leaves_unrelated_processes_fds_alone() {
    let _lab = lab::exclusive();
    const SLEEPERS: usize = 200;
    let e = free_port();
    let _engine = Shape::engine("decode", e, 1, &["--host", "127.0.0.1"], &[]);
    let (es, x1, x2) = (
        e.to_string(),
        free_port().to_string(),
        free_port().to_string(),
    );
    let proxy = ["python3", "proxy.py", "--listen", &x1, "--upstream", &es];
    let _proxy = Shape::start(&proxy, &[]);
    let sleepers = Sleepers::spawn(SLEEPERS);
    let probes = ProbeSet::builtin().expect("probes");
    let opts = DiscoverOptions {
        query_endpoints: false,
        deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
        ..DiscoverOptions::default()
    };
    let mut cache = discover::DiscoveryCache::new();
    let first = discover::discover_cached(&probes, &opts, &mut cache).expect("discover");
    assert!(proxy_at(&first, &x1), "{:?}", first.components);
    let before = cache.stats();
    let second = discover::discover_cached(&probes, &opts, &mut cache).expect("discover");
    let checks = cache.stats().fd_checks - before.fd_checks;
    let scans = cache.stats().fd_scans - before.fd_scans;
    assert!(proxy_at(&second, &x1), "{:?}", second.components);
    // known processes and the remembered holders only (other labs on this host included)
    assert!(checks < SLEEPERS as u64, "{checks} fd counts checked");
    assert!(scans < SLEEPERS as u64, "{scans} fd scans");
    let proxy2 = ["python3", "proxy.py", "--listen", &x2, "--upstream", &es];
    let _proxy2 = Shape::start(&proxy2, &[]);
    let third = discover::discover_cached(&probes, &opts, &mut cache).expect("discover");
    assert!(proxy_at(&third, &x1) && proxy_at(&third, &x2), "{third:?}");
    drop(sleepers);
}

/// The proxy search looks at every process only for a client socket that is still open and
/// that no known process holds: not for one closed since the table that listed it (a
/// scrape, a churning client's request; the daemon's table may be a second old), nor for
/// our own (read afresh: we open and close scrapes at an unchanged fd count).
#[test]
fn rediscovery_searches_no_process_for_a_closed_socket_or_our_own() {
    let _lab = lab::exclusive();
    const SLEEPERS: usize = 200;
    let e = free_port();
    let _engine = Shape::engine("decode", e, 1, &["--host", "127.0.0.1"], &[]);
    let sleepers = Sleepers::spawn(SLEEPERS);
    let probes = ProbeSet::builtin().expect("probes");
    let recent = std::sync::Arc::new(RecentDump::new(Duration::from_secs(600)));
    let opts = DiscoverOptions {
        query_endpoints: false,
        recent_dump: Some(std::sync::Arc::clone(&recent)),
        deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
        ..DiscoverOptions::default()
    };
    let mut cache = discover::DiscoveryCache::new();
    let port = format!(":{e}");
    let engine = |c: &&wedgewatch::model::Component| c.listen.iter().any(|l| l.ends_with(&port));
    let connect = || std::net::TcpStream::connect(("127.0.0.1", e)).expect("connect");
    // Discovery sees the whole machine: a client socket of another test's process (the
    // other lane's shapes) sends a pass to every process. Such a pass is tried again.
    let mut counts = Vec::new();
    for _ in 0..3 {
        let earlier = connect();
        let first = discover::discover_cached(&probes, &opts, &mut cache).expect("discover");
        assert!(first.components.iter().any(|c| engine(&c)));
        // A scrape of ours, in the table and closed before the pass, and one open in place
        // of the earlier one (our fd count is the one the first pass saw, its list stale).
        let scrape = connect();
        drop(earlier);
        let ours = connect();
        let dump = dump_netlink(Duration::from_secs(2), false).expect("dump");
        recent.offer(std::time::Instant::now(), &dump.sockets);
        drop(scrape);
        let before = cache.stats();
        let second = discover::discover_cached(&probes, &opts, &mut cache).expect("discover");
        counts.push(cache.stats().fd_checks - before.fd_checks);
        assert!(second.components.iter().any(|c| engine(&c)));
        drop(ours);
        if counts.last().is_some_and(|&n| n < SLEEPERS as u64) {
            break;
        }
    }
    assert!(
        counts.iter().any(|&n| n < SLEEPERS as u64),
        "fd counts checked in each try: {counts:?}"
    );
    drop(sleepers);
}
