//! `kv_transfer_stalled` (critical): PD requests wait at decode for a KV cache prefill has
//! computed while the transfer between the pair is silent. Which requests are stuck is the
//! correlator's verdict (`correlate::kv_stall`); this detector groups them by pair and words
//! the finding. Rule and what to do: `kv_transfer_stalled` in docs/findings.md.
//!
//! Thresholds read: none directly (the verdict reads `wedged_unanimous_ms`,
//! `wedged_after_ms`).

use super::{logical_ids, secs};
use crate::correlate::{ComponentState, KvStall, RequestView, View};
use crate::model::{ChannelFlow, Evidence, Finding, FindingKind, Role, Severity, StuckKind};
use std::collections::BTreeMap;

/// One stuck request: its decode leg, the pair's facts, its other waiting legs.
type Stuck<'a> = (&'a RequestView, &'a KvStall, Vec<&'a RequestView>);

/// `kv_transfer_stalled`: one finding per (prefill, decode) pair with requests stuck in
/// their KV transfer.
pub fn kv_transfer_stalled(m: &crate::correlate::Correlator, v: &View) -> Vec<Finding> {
    let mut pairs: BTreeMap<(&str, &str), Vec<Stuck>> = BTreeMap::new();
    for s in v.stuck().filter_map(|l| l.stuck.as_ref()) {
        let (StuckKind::KvTransfer, Some(kv)) = (s.kind, &s.kv) else {
            continue;
        };
        let others = s.consequences.iter().map(|&i| &v.requests[i]).collect();
        pairs
            .entry((kv.prefill.as_str(), kv.decode.as_str()))
            .or_default()
            .push((&v.requests[s.leg], kv, others));
    }
    pairs
        .into_values()
        .map(|stuck| finding(m, v, &stuck))
        .collect()
}

/// The finding of one pair.
fn finding(m: &crate::correlate::Correlator, v: &View, stuck: &[Stuck]) -> Finding {
    let kv = stuck[0].1;
    let legs: Vec<&RequestView> = stuck.iter().map(|(d, _, _)| *d).collect();
    let (judged_on, verdict_evidence) = super::wedged_request::verdicts(m, v, &legs);
    let n = legs.len();
    let oldest = legs.iter().map(|r| r.age_ms).max().unwrap_or(0);
    let transfer = transfer_words(kv);
    let summary = format!(
        "{n} request{} at {} wait{} for {} KV cache from {} ({}): {transfer}; decode holds {} \
         waiting for KV, prefill {}{judged_on}",
        if n == 1 { "" } else { "s" },
        kv.decode,
        if n == 1 { "s" } else { "" },
        if n == 1 { "its" } else { "their" },
        kv.prefill,
        secs(oldest),
        kv.decode_held.0,
        prefill_words(kv, stuck),
    );
    let mut evidence: Vec<Evidence> = Vec::new();
    for (d, _, others) in stuck {
        evidence.push(leg_evidence(d, "waits for its first byte"));
        for o in others {
            evidence.push(leg_evidence(
                o,
                "waits too (its answer follows the transfer)",
            ));
        }
    }
    evidence.extend(transfer_evidence(kv));
    evidence.push(Evidence::new(
        "metrics",
        format!(
            "{}: {} request(s) in its prealloc/transfer queues (from {})",
            kv.decode, kv.decode_held.0, kv.decode_held.1
        ),
    ));
    if let Some(n) = kv.prefill_inflight {
        evidence.push(Evidence::new(
            "metrics",
            format!(
                "{}: {n} request(s) in its inflight queue (forward done, KV being sent; v1_loads)",
                kv.prefill
            ),
        ));
    }
    for id in [&kv.decode, &kv.prefill] {
        if let Some(cs) = v.components.get(id) {
            evidence.extend(engine_evidence(cs));
        }
    }
    evidence.extend(verdict_evidence);
    Finding {
        kind: FindingKind::KvTransferStalled,
        severity: Severity::Critical,
        component: Some(kv.decode.clone()),
        role: Some(Role::Decode),
        summary,
        requests: logical_ids(v, &legs),
        evidence,
        explanation: Some(format!(
            "The requests reached both engines; {prefill} did their forward and {decode} waits for their KV cache, but nothing moves between them: the KV transfer is stalled. They were not forgotten by either scheduler. Look at the transfer between the pair: the backend's connectivity (Mooncake's TCP transport port on {decode}, reachable from {prefill} at the address it advertises), {prefill}'s transfer threads in its stacks, and the receivers' timeouts (a receiver stuck in Transferring never times out before sglang PR 31800). Aborting the requests frees decode's slots; restarting the pair clears the transfer engine.",
            prefill = kv.prefill,
            decode = kv.decode,
        )),
    }
}

/// "the transfer between them silent for 42 s (8 connections, 3.1 MB so far)", or that
/// none is on TCP.
fn transfer_words(kv: &KvStall) -> String {
    if kv.transfer.is_empty() {
        return "no transfer connection between them on TCP (RDMA, or never connected)".into();
    }
    let conns: u32 = kv.transfer.iter().map(|f| f.connections).sum();
    let bytes: u64 = kv.transfer.iter().map(|f| f.bytes_in).sum();
    let silent = match kv.transfer_idle_ms() {
        Some(ms) => format!("silent for {}", secs(ms as i64)),
        None => "silent since it was first seen".into(),
    };
    format!("the transfer between them {silent} ({conns} connections, {bytes} B so far)")
}

/// What prefill shows: it answered, or holds them in flight.
fn prefill_words(kv: &KvStall, stuck: &[Stuck]) -> String {
    let waiting = stuck.iter().filter(|(_, _, o)| !o.is_empty()).count();
    match (waiting, kv.prefill_inflight) {
        (0, _) => "answered them (their forward done)".into(),
        (_, Some(n)) => format!("holds {n} in flight (forward done, KV not sent)"),
        (_, None) => "did their forward".into(),
    }
}

/// One leg: its socket, bytes and age.
fn leg_evidence(r: &RequestView, what: &str) -> Evidence {
    Evidence::new(
        "sockets",
        format!(
            "{} ({}) {} -> {} at {}: {} bytes in, {}, {what}, {}",
            r.leg,
            r.x.id,
            r.x.client,
            r.x.server,
            r.x.component,
            r.x.bytes_in,
            r.x.out_text(),
            secs(r.age_ms)
        ),
    )
}

/// The flows from prefill to decode, each with its bytes and silence.
fn transfer_evidence(kv: &KvStall) -> Vec<Evidence> {
    if kv.transfer.is_empty() {
        return vec![Evidence::new(
            "sockets",
            format!(
                "no TCP connection from {} to {}'s transfer ports in the socket table",
                kv.prefill, kv.decode
            ),
        )];
    }
    kv.transfer.iter().map(flow_evidence).collect()
}

fn flow_evidence(f: &ChannelFlow) -> Evidence {
    let idle = f
        .idle_ms
        .map(|ms| format!("idle {}", secs(ms as i64)))
        .unwrap_or_else(|| "no byte seen move".into());
    Evidence::new(
        "sockets",
        format!(
            "{} {} -> {}: {} connections, {} B in, {} B out, {idle}",
            f.kind,
            f.from.as_deref().unwrap_or("?"),
            f.to,
            f.connections,
            f.bytes_in,
            f.bytes_out
        ),
    )
}

/// An engine's GPU and scheduler threads.
fn engine_evidence(cs: &ComponentState) -> Vec<Evidence> {
    let mut ev = vec![Evidence::new(
        "gpu",
        format!("{}: GPU activity {}", cs.id, cs.gpu_activity),
    )];
    if let Some(s) = cs.thread_summary() {
        ev.push(Evidence::new("stacks", format!("{}: {s}", cs.id)));
    }
    ev
}
