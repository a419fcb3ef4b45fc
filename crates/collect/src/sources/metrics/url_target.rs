//! `--url` targets: what an exposition says it is, for a target no process explains.

use crate::model::{Component, FetchOutcome, Role, Series};
use crate::prom::{self, ParseLimits};
use crate::sys::http::{self, Limits};

/// Name prefixes that say which exporter wrote an exposition: routers first (their
/// expositions never carry engine names; an engine's never carry `smg_`).
const EXPORTERS: [(&str, &str, Role); 6] = [
    ("smg_", "sglang", Role::Router),
    ("sgl_router_", "sglang", Role::Router),
    ("vllm_router_", "vllm", Role::Router),
    ("sglang:", "sglang", Role::Engine),
    ("vllm:", "vllm", Role::Engine),
    // the `sglang:` names as the router's /engine_metrics and some pipelines rewrite them
    ("sglang_", "sglang", Role::Engine),
];

/// What an exposition's own names say its exporter is: (stack, role, evidence). For a
/// `--url` target no process explains. An SGLang engine's `engine_type` label refines the
/// role to prefill or decode.
pub fn infer_exporter(series: &[Series]) -> Option<(&'static str, Role, String)> {
    for (prefix, stack, role) in EXPORTERS {
        let Some(s) = series.iter().find(|s| s.name.starts_with(prefix)) else {
            continue;
        };
        let mode = s.labels.get("engine_type").map(String::as_str);
        let role = match (role, mode) {
            (Role::Engine, Some("prefill")) => Role::Prefill,
            (Role::Engine, Some("decode")) => Role::Decode,
            _ => role,
        };
        let why = match mode {
            Some(m) if role != Role::Router => {
                format!("metric names {prefix}* (engine_type={m})")
            }
            _ => format!("metric names {prefix}*"),
        };
        return Some((stack, role, why));
    }
    None
}

/// Whether a component is a `--url` target (no process behind it).
pub fn is_url_target(c: &Component) -> bool {
    c.labels
        .get(crate::model::topology::labels::LABEL_FOUND_BY)
        .is_some_and(|f| f.starts_with("--url"))
}

/// Label: what a `--url` target's stack and role were inferred from.
pub const LABEL_INFERRED_FROM: &str = "inferred_from";

/// Discovery's look at a `--url` target that no process explains: GET its metrics (bounded)
/// and, when the names say whose exposition it is, give it that stack and role. Only for an
/// IP literal or `localhost` (no DNS wait); else it stays `other`, mapped at each scrape.
pub fn infer_url_component(c: &mut Component, timeout: std::time::Duration) {
    if c.role != Role::Other || !is_url_target(c) {
        return;
    }
    let Some(url) = c.metrics_url.clone() else {
        return;
    };
    let literal = crate::sys::Url::parse(&url).is_ok_and(|u| match u.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(_) | url::Host::Ipv6(_)) => true,
        None => false,
    });
    if !literal {
        return;
    }
    let limits = Limits {
        connect: timeout,
        total: timeout,
        cap: 1 << 20,
    };
    let r = http::get_blocking(&url, limits);
    if r.body.is_empty() || r.status.is_some_and(|s| s != 200) {
        return;
    }
    let parse = ParseLimits {
        max_series: 64,
        raw_sample: 0,
        ..ParseLimits::default()
    };
    let known = |n: &str| EXPORTERS.iter().any(|(p, _, _)| n.starts_with(p));
    let e = prom::parse_limited(&r.body, r.outcome != FetchOutcome::Ok, &parse, &known);
    let Some((stack, role, why)) = infer_exporter(&e.series) else {
        return;
    };
    c.stack = stack.to_string();
    c.role = role;
    if let Some(addr) = c.listen.first() {
        c.id = format!("{role}@{addr}");
    }
    c.labels.insert(LABEL_INFERRED_FROM.into(), why);
}
