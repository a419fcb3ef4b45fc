//! The merged picture's findings: the stuck findings made again from the merged verdicts
//! (`judge`), one per hop, with each stuck request's path and the evidence the hop's own node
//! found; every other finding carried over as its node said it (docs/fleet.md "Merge").

use super::flat::Flat;
use super::namespace::node_of;
use crate::detect::secs;
use crate::model::{Evidence, Finding, FindingKind, LogicalRequest, Severity, StuckKind};
use std::collections::BTreeMap;

/// At most this many stuck legs are listed one by one in a finding's evidence.
const MAX_LEG_EVIDENCE: usize = 50;

/// The findings of the merged picture, most severe first (`blamed`: each logical
/// request's stuck leg, from `judge::regroup`).
pub fn findings(
    flat: &Flat,
    logical: &[LogicalRequest],
    blamed: &[Option<usize>],
    node_findings: Vec<Finding>,
) -> Vec<Finding> {
    let parents = parent_map(flat);
    let ctx = Ctx {
        flat,
        parents: &parents,
    };
    let mut groups: BTreeMap<(StuckKind, &str), Vec<(&LogicalRequest, usize)>> = BTreeMap::new();
    for (l, b) in logical.iter().zip(blamed) {
        if let (Some(k), Some(at), Some(b)) = (l.stuck_kind, &l.stuck_at, b) {
            groups.entry((k, at.as_str())).or_default().push((l, *b));
        }
    }
    let mut out: Vec<Finding> = groups
        .into_iter()
        .map(|((kind, at), ls)| {
            let local = node_findings
                .iter()
                .find(|f| f.kind == finding_kind(kind) && f.component.as_deref() == Some(at));
            stuck_finding(&ctx, kind, at, &ls, local)
        })
        .collect();
    out.extend(
        node_findings
            .into_iter()
            .filter(|f| {
                !matches!(
                    f.kind,
                    FindingKind::WedgedRequest
                        | FindingKind::StalledStream
                        | FindingKind::KvTransferStalled
                )
            })
            .map(carried),
    );
    out.sort_by_key(|f| std::cmp::Reverse(f.severity));
    out
}

fn finding_kind(k: StuckKind) -> FindingKind {
    match k {
        StuckKind::NoResponse => FindingKind::WedgedRequest,
        StuckKind::StreamStalled => FindingKind::StalledStream,
        StuckKind::KvTransfer => FindingKind::KvTransferStalled,
    }
}

/// A node's finding as it said it, its node named.
fn carried(mut f: Finding) -> Finding {
    if let Some(c) = &f.component {
        let node = node_of(c);
        if !node.is_empty() {
            f.summary = format!("[{node}] {}", f.summary);
        }
    }
    f
}

/// Each exchange's parent index (the first exchange linking to it; `NONE`: none).
fn parent_map(flat: &Flat) -> Vec<usize> {
    let mut m = vec![NONE; flat.requests.len()];
    for (i, c) in flat.children.iter().enumerate() {
        for &j in c {
            if m[j] == NONE {
                m[j] = i;
            }
        }
    }
    m
}

const NONE: usize = usize::MAX;

/// "nodea/proxy@:8000 [nodea] -> nodea/router@:30000 [nodea] -> nodeb/decode@:30002 [nodeb]".
fn path_text(flat: &Flat, parents: &[usize], leg: usize) -> String {
    let mut chain = vec![leg];
    while let Some(&p) = chain.last().map(|&c| &parents[c]).filter(|&&p| p != NONE) {
        if chain.contains(&p) || chain.len() > 32 {
            break;
        }
        chain.push(p);
    }
    chain
        .iter()
        .rev()
        .map(|&i| {
            let c = &flat.requests[i].component;
            format!("{c} [node {}]", node_of(c))
        })
        .collect::<Vec<_>>()
        .join(" -> ")
}

/// What the finding builders look things up in.
struct Ctx<'a> {
    flat: &'a Flat,
    parents: &'a [usize],
}

fn stuck_finding(
    ctx: &Ctx,
    kind: StuckKind,
    at: &str,
    stuck: &[(&LogicalRequest, usize)],
    local: Option<&Finding>,
) -> Finding {
    let mut evidence: Vec<Evidence> = stuck
        .iter()
        .take(MAX_LEG_EVIDENCE)
        .map(|&(_, i)| leg_evidence(ctx.flat, ctx.parents, i))
        .collect();
    let ls: Vec<&LogicalRequest> = stuck.iter().map(|&(l, _)| l).collect();
    if let Some(f) = local {
        evidence.extend(f.evidence.iter().filter(|e| e.source != "sockets").cloned());
    }
    let entry_nodes: Vec<&str> = ls.iter().map(|l| node_of(&l.component)).collect();
    let node = node_of(at);
    let n = ls.len();
    let oldest = ls.iter().map(|l| l.age_ms as i64).max().unwrap_or(0);
    let what = match kind {
        StuckKind::NoResponse => "no response byte",
        StuckKind::StreamStalled => "the response stream stopped",
        StuckKind::KvTransfer => "waiting for its KV cache, the transfer silent",
    };
    let across = entry_nodes.iter().any(|e| *e != node);
    let summary = format!(
        "{n} request{} stuck at {at} on node {node} ({what}; oldest entered {} ago{})",
        if n == 1 { "" } else { "s" },
        secs(oldest),
        if across {
            format!(" at {}, on node {}", ls[0].component, entry_nodes[0])
        } else {
            String::new()
        }
    );
    Finding {
        kind: finding_kind(kind),
        severity: local.map_or(Severity::Warning, |f| f.severity),
        component: Some(at.to_string()),
        role: ls[0].stuck_role,
        summary,
        requests: ls.iter().map(|l| l.id.clone()).collect(),
        evidence,
        explanation: local.and_then(|f| f.explanation.clone()),
    }
}

/// One stuck leg: its socket, bytes, age, and its path hop by hop with each hop's node.
fn leg_evidence(flat: &Flat, parents: &[usize], i: usize) -> Evidence {
    let r = &flat.requests[i];
    // an open exchange with no byte in was first seen mid-flight: its size is not known
    let size = if r.bytes_in == 0 {
        "size unknown (seen mid-flight)".to_string()
    } else {
        format!("{} bytes in", r.bytes_in)
    };
    Evidence::new(
        "sockets",
        format!(
            "{} ({}) {} -> {}: {size}, {} bytes out, waiting {}; path: {}",
            r.leg.as_deref().unwrap_or("?"),
            r.id,
            r.client,
            r.server,
            r.bytes_out,
            secs(r.age_ms as i64),
            path_text(flat, parents, i)
        ),
    )
}
