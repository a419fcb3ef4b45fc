//! Issue 11 item 6: routers that run as their own Rust binary (`sglang-router` / `sgl-router`
//! from sgl-project/sglang's sgl-router, `vllm-router` from vllm-project/router) are
//! discovered as routers, with their HTTP API and Prometheus port from their own flags, and
//! their workers as config edges. Live processes whose argv[0] is the binary's name (no such
//! binary is installed here; `exec -a` gives a stdlib server that name) and that listen where
//! the flags say.

use wedgewatch_testkit::shapes;

use shapes::{free_port, Shape};
use wedgewatch::discover::{self, DiscoverOptions};
use wedgewatch::model::{EdgeOrigin, Role, Topology};
use wedgewatch::probes::ProbeSet;

/// A stdlib stand-in that serves `/workers` on --port and an exposition on --prometheus-port.
const SERVER: &str = r#"
import argparse, wwshape
p = argparse.ArgumentParser()
p.add_argument('--host', default='127.0.0.1')
p.add_argument('--port', type=int)
p.add_argument('--prometheus-port', type=int)
p.add_argument('--worker-urls', nargs='*', default=[])
a, _ = p.parse_known_args()
wwshape.watch_parent(60)
wwshape.serve(a.host, a.port, {'/workers': (200, 'application/json', wwshape.json_body({'workers': [{'url': u} for u in a.worker_urls]}))})
wwshape.serve(a.host, a.prometheus_port, {'/metrics': (200, 'text/plain', lambda: 'sgl_router_requests_total{route="/generate"} 1\n')})
wwshape.ready(a.port)
wwshape.sleep_forever()
"#;

/// The interpreter itself, not a launcher shim (pyenv's `python3` is a script that would
/// exec the interpreter again and lose the argv[0] we give it).
fn real_python() -> String {
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .expect("python3");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn start_as(argv0: &str, port: u16, mport: u16, worker: &str) -> Shape {
    let (ps, ms) = (port.to_string(), mport.to_string());
    let py = real_python();
    Shape::start(
        &[
            "bash",
            "-c",
            &format!("exec -a {argv0} {py} -c \"$0\" \"$@\""),
            SERVER,
            "--host",
            "127.0.0.1",
            "--port",
            &ps,
            "--prometheus-port",
            &ms,
            "--worker-urls",
            worker,
        ],
        &[],
    )
}

fn router_of(t: &Topology, pid: i32) -> &wedgewatch::model::Component {
    t.components
        .iter()
        .find(|c| c.main_pid == Some(pid))
        .unwrap_or_else(|| {
            let ids: Vec<(&str, Option<i32>)> = t
                .components
                .iter()
                .map(|c| (c.id.as_str(), c.main_pid))
                .collect();
            panic!("no component for pid {pid}; have {ids:?}")
        })
}

#[test]
fn rust_sgl_router_and_vllm_router_binaries_are_routers() {
    // An "engine" for the edges: anything discovery knows listening on a port.
    let ep = free_port();
    let engine = Shape::engine("decode", ep, 1, &["--host", "127.0.0.1"], &[]);
    let worker = format!("http://127.0.0.1:{ep}");
    let (p1, m1, p2, m2) = (free_port(), free_port(), free_port(), free_port());
    let sgl = start_as("/opt/sgl/bin/sglang-router", p1, m1, &worker);
    let vllm = start_as("vllm-router", p2, m2, &worker);
    let topo = discover::discover(
        &ProbeSet::builtin().expect("probes"),
        &DiscoverOptions {
            deadlines: wedgewatch_testkit::timing::roomy_deadlines(),
            ..DiscoverOptions::default()
        },
    )
    .expect("discover");

    for (shape, port, mport, profile, stack) in [
        (&sgl, p1, m1, "sgl-router-rust", "sglang"),
        (&vllm, p2, m2, "vllm-router", "vllm"),
    ] {
        let c = router_of(&topo, shape.pid);
        assert_eq!(c.role, Role::Router, "{c:?}");
        assert_eq!(c.profile, profile);
        assert_eq!(c.stack, stack);
        assert_eq!(c.id, format!("router@127.0.0.1:{port}"));
        assert_eq!(
            c.http_url.as_deref(),
            Some(&*format!("http://127.0.0.1:{port}"))
        );
        assert_eq!(
            c.metrics_url.as_deref(),
            Some(&*format!("http://127.0.0.1:{mport}/metrics"))
        );
        let to = topo
            .components
            .iter()
            .find(|x| x.main_pid == Some(engine.pid))
            .map(|x| x.id.clone())
            .expect("the engine");
        assert!(
            topo.edges
                .iter()
                .any(|e| e.from == c.id && e.to == to && e.origin == EdgeOrigin::Config),
            "{:?}",
            topo.edges
        );
    }
}
