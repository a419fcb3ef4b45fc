//! Synthetic node snapshots for merge tests and the merge benchmark: node A holds the
//! proxy and the router, node B the prefill and decode engines (the two-node PD layout,
//! docs/lab.md), each as its own `wedgewatch snapshot --json` would say it, with B's clock
//! `skew_ms` ahead of A's.

use serde_json::{json, Value};

pub const T0: i64 = 1_795_000_000_000;
pub const A_IP: &str = "10.77.0.1";
pub const B_IP: &str = "10.77.0.2";

pub fn rfc(ms: i64) -> String {
    wedgewatch::clock::rfc3339(ms)
}

fn sources() -> Value {
    let ok = json!({"status": "ok"});
    json!({"processes": ok, "sockets": ok, "stacks": ok, "gpu": {"status": "unavailable", "reason": "no NVML"}, "metrics": ok})
}

fn component(id: &str, role: &str, listen: &str, pid: i64) -> Value {
    json!({"id": id, "role": role, "stack": "sglang", "pids": [pid], "main_pid": pid,
           "listen": [listen], "started_at": null, "cmdline": [], "env": {}, "gpus": []})
}

fn identity(name: &str, ip: &str, mid: &str, wall: i64) -> Value {
    json!({"name": name, "hostname": name, "machine_id": mid, "boot_id": format!("boot-{name}"),
           "addresses": [ip], "clock": {"wall_ms": wall, "monotonic_ms": 7_000_000}})
}

#[allow(clippy::too_many_arguments)]
fn exchange(
    id: &str,
    comp: &str,
    role: &str,
    client: &str,
    server: &str,
    state: &str,
    started: i64,
    now: i64,
    bytes_in: u64,
    links: &[&str],
    lr: &str,
    leg: &str,
) -> Value {
    json!({"id": id, "component": comp, "client": client, "server": server, "state": state,
           "age_ms": (now - started) as f64, "bytes_in": bytes_in,
           "bytes_out": if state == "waiting_first_byte" { 0 } else { 200 },
           "idle_out_ms": (now - started) as f64, "links": links, "role": role,
           "started_at": rfc(started), "request": lr, "leg": leg})
}

pub const PROXY: &str = "proxy@10.77.0.1:8000";
pub const ROUTER: &str = "router@10.77.0.1:30000";
pub const PREFILL: &str = "prefill@10.77.0.2:30001";
pub const DECODE: &str = "decode@10.77.0.2:30002";

/// Node A: `n` requests through proxy -> router; the first waits (A's correlator judged
/// it stuck at the router: it cannot see where the router sent it), the rest are done.
/// Each router exchange has an outbound connection per engine on node B.
pub fn node_a(n: usize) -> Value {
    let now = T0;
    let mut reqs = Vec::new();
    let mut logical = Vec::new();
    let mut conns = Vec::new();
    for i in 0..n {
        let started = now - 60_000 + (i as i64) * 5;
        let (px, rx) = (format!("x{}", 2 * i + 1), format!("x{}", 2 * i + 2));
        let lr = format!("r{}", 2 * i + 1);
        let state = if i == 0 { "waiting_first_byte" } else { "done" };
        let port = 20_000 + (i % 40_000) as u64;
        reqs.push(exchange(
            &px,
            PROXY,
            "proxy",
            &format!("10.77.0.9:{port}"),
            &format!("{A_IP}:8000"),
            state,
            started,
            now,
            900,
            &[&rx],
            &lr,
            &format!("{lr}@proxy"),
        ));
        let mut r = exchange(
            &rx,
            ROUTER,
            "router",
            &format!("{A_IP}:{port}"),
            &format!("{A_IP}:30000"),
            state,
            started + 2,
            now,
            900,
            &[],
            &lr,
            &format!("{lr}@router"),
        );
        r["client_component"] = json!(PROXY);
        reqs.push(r);
        let stuck = i == 0;
        logical.push(
            json!({"id": lr, "legs": [px, rx], "verdict": if stuck {"stuck"} else {"done"},
            "component": PROXY, "age_ms": 60_000.0, "probe": false,
            "stuck_leg": if stuck { json!(format!("{lr}@router")) } else { Value::Null },
            "stuck_at": if stuck { json!(ROUTER) } else { Value::Null },
            "stuck_role": if stuck { json!("router") } else { Value::Null },
            "stuck_kind": if stuck { json!("no_response") } else { Value::Null }}),
        );
        for (k, eng) in [(0, 30_001), (1, 30_002)] {
            let local = 40_000 + 2 * (i % 12_000) as u64 + k;
            conns.push(
                json!({"component": ROUTER, "local": format!("{A_IP}:{local}"),
                "remote": format!("{B_IP}:{eng}"), "state": "ESTABLISHED",
                "last_send_at_ms": started + 4, "last_recv_at_ms": started + 4}),
            );
        }
    }
    conns.push(json!({"component": ROUTER, "local": format!("{A_IP}:39999"), "remote": "10.96.0.10:80", "state": "ESTABLISHED"}));
    let finding = json!({"kind": "wedged_request", "severity": "critical", "component": ROUTER, "role": "router",
        "summary": format!("1 request accepted 60 s ago is stuck at {ROUTER}: no request forwarded to the next hop"),
        "requests": ["r1"], "evidence": [{"source": "sockets", "detail": "r1@router waits"}]});
    json!({"schema": "wedgewatch.snapshot/1", "taken_at": rfc(now), "window_ms": 3000.0, "sources": sources(),
        "components": [component(PROXY, "proxy", &format!("{A_IP}:8000"), 100), component(ROUTER, "router", &format!("{A_IP}:30000"), 200)],
        "requests": reqs, "logical_requests": logical, "gpus": [], "threads": [], "findings": [finding],
        "node": identity("nodea", A_IP, "sha256:aaaa", now), "connections": conns})
}

/// Node B, its clock `skew_ms` ahead: the engines' legs of A's requests. The first
/// request's decode leg is in `decode_state` (`waiting_first_byte`: stuck at decode, as B's
/// correlator judged; `streaming`: being answered); `client_ip` is A's address as B sees
/// it (another one: a NAT in between).
pub fn node_b(n: usize, skew_ms: i64, decode_state: &str, client_ip: &str) -> Value {
    let now = T0 + skew_ms;
    let mut reqs = Vec::new();
    let mut logical = Vec::new();
    for i in 0..n {
        let started = now - 60_000 + (i as i64) * 5 + 5;
        for (k, (comp, role, port)) in [(PREFILL, "prefill", 30_001), (DECODE, "decode", 30_002)]
            .into_iter()
            .enumerate()
        {
            let id = format!("x{}", 2 * i + k + 1);
            let lr = format!("r{}", 2 * i + k + 1);
            let state = if i == 0 && role == "decode" {
                decode_state
            } else {
                "done"
            };
            let local = 40_000 + 2 * (i % 12_000) as u64 + k as u64;
            reqs.push(exchange(
                &id,
                comp,
                role,
                &format!("{client_ip}:{local}"),
                &format!("{B_IP}:{port}"),
                state,
                started,
                now,
                1000,
                &[],
                &lr,
                &format!("{lr}@{role}"),
            ));
            let stuck = state == "waiting_first_byte";
            logical.push(json!({"id": lr, "legs": [id], "verdict": if stuck {"stuck"} else if state == "done" {"done"} else {"active"},
                "component": comp, "age_ms": 60_000.0, "probe": false,
                "stuck_leg": if stuck { json!(format!("{lr}@{role}")) } else { Value::Null },
                "stuck_at": if stuck { json!(comp) } else { Value::Null },
                "stuck_role": if stuck { json!(role) } else { Value::Null },
                "stuck_kind": if stuck { json!("no_response") } else { Value::Null }}));
        }
    }
    let mut findings = vec![
        json!({"kind": "config_changed", "severity": "warning", "component": DECODE, "role": "decode",
        "summary": "SGLANG_TUNING added", "requests": [], "evidence": [{"source": "processes", "detail": "env SGLANG_TUNING=100"}]}),
        json!({"kind": "queue_not_draining", "severity": "warning", "component": DECODE, "role": "decode",
        "summary": "1 request queued, none drained", "requests": ["r2"], "evidence": [{"source": "metrics", "detail": "num_queue_reqs 1"}]}),
    ];
    if decode_state == "waiting_first_byte" {
        findings.insert(0, json!({"kind": "wedged_request", "severity": "critical", "component": DECODE, "role": "decode",
            "summary": format!("1 request accepted 60 s ago is stuck at {DECODE}: no response byte, GPU idle"),
            "requests": ["r2"], "evidence": [{"source": "sockets", "detail": "r2@decode waits"}, {"source": "gpu", "detail": "GPU 0 idle (0 % SM)"}],
            "explanation": "Look at decode."}));
    }
    json!({"schema": "wedgewatch.snapshot/1", "taken_at": rfc(now), "window_ms": 3000.0, "sources": sources(),
        "components": [component(PREFILL, "prefill", &format!("{B_IP}:30001"), 300), component(DECODE, "decode", &format!("{B_IP}:30002"), 400)],
        "requests": reqs, "logical_requests": logical, "gpus": [], "threads": [], "findings": findings,
        "node": identity("nodeb", B_IP, "sha256:bbbb", now)})
}

/// A snapshot with its addresses and node name moved elsewhere (`10.77.0.1` -> `a_ip`,
/// `nodea` -> `name`): one pair of nodes of a bigger fleet.
pub fn moved(v: &Value, from_ip: &str, to_ip: &str, from_name: &str, to_name: &str) -> Value {
    let text = v
        .to_string()
        .replace(from_ip, to_ip)
        .replace(from_name, to_name);
    serde_json::from_str(&text).expect("still JSON")
}
