//! The merged picture's findings. `wedged_request` and `stalled_stream` are made again from
//! the merged verdicts (`judge`): one finding per hop requests are stuck at, naming its
//! node, with the path of every stuck request hop by hop and the node of each hop. The
//! evidence a node's own detector found at that hop (idle GPU, scheduler stacks, metrics)
//! is kept. Every other finding is about one node's components and is carried over as its
//! node said it, with its node named.

use super::flat::Flat;
use super::namespace::node_of;
use crate::detect::secs;
use crate::model::{Evidence, Finding, FindingKind, LogicalRequest, Severity, StuckKind};
use std::collections::{BTreeMap, HashMap};

/// At most this many stuck legs are listed one by one in a finding's evidence.
const MAX_LEG_EVIDENCE: usize = 50;

/// The findings of the merged picture, most severe first.
pub fn findings(
    flat: &Flat,
    logical: &[LogicalRequest],
    node_findings: Vec<Finding>,
) -> Vec<Finding> {
    let parents = parent_map(flat);
    let leg_index: HashMap<&str, usize> = flat
        .requests
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.leg.as_deref().map(|l| (l, i)))
        .collect();
    let ctx = Ctx {
        flat,
        parents: &parents,
        leg_index: &leg_index,
    };
    let mut groups: BTreeMap<(StuckKind, String), Vec<&LogicalRequest>> = BTreeMap::new();
    for l in logical {
        if let (Some(k), Some(at)) = (l.stuck_kind, &l.stuck_at) {
            groups.entry((k, at.clone())).or_default().push(l);
        }
    }
    let mut out: Vec<Finding> = groups
        .into_iter()
        .map(|((kind, at), ls)| {
            let local = node_findings
                .iter()
                .find(|f| f.kind == finding_kind(kind) && f.component.as_deref() == Some(&at));
            stuck_finding(&ctx, kind, &at, &ls, local)
        })
        .collect();
    out.extend(
        node_findings
            .into_iter()
            .filter(|f| {
                !matches!(
                    f.kind,
                    FindingKind::WedgedRequest | FindingKind::StalledStream
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

/// Child exchange index -> parent index.
fn parent_map(flat: &Flat) -> HashMap<usize, usize> {
    let mut m = HashMap::new();
    for (i, c) in flat.children.iter().enumerate() {
        for &j in c {
            m.entry(j).or_insert(i);
        }
    }
    m
}

/// "nodea/proxy@:8000 [nodea] -> nodea/router@:30000 [nodea] -> nodeb/decode@:30002 [nodeb]".
fn path_text(flat: &Flat, parents: &HashMap<usize, usize>, leg: usize) -> String {
    let mut chain = vec![leg];
    while let Some(&p) = chain.last().and_then(|c| parents.get(c)) {
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
    parents: &'a HashMap<usize, usize>,
    leg_index: &'a HashMap<&'a str, usize>,
}

fn stuck_finding(
    ctx: &Ctx,
    kind: StuckKind,
    at: &str,
    ls: &[&LogicalRequest],
    local: Option<&Finding>,
) -> Finding {
    let legs: Vec<usize> = ls
        .iter()
        .filter_map(|l| ctx.leg_index.get(l.stuck_leg.as_deref()?).copied())
        .collect();
    let mut evidence: Vec<Evidence> = legs
        .iter()
        .take(MAX_LEG_EVIDENCE)
        .map(|&i| leg_evidence(ctx.flat, ctx.parents, i))
        .collect();
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
fn leg_evidence(flat: &Flat, parents: &HashMap<usize, usize>, i: usize) -> Evidence {
    let r = &flat.requests[i];
    Evidence::new(
        "sockets",
        format!(
            "{} ({}) {} -> {}: {} bytes in, {} bytes out, waiting {}; path: {}",
            r.leg.as_deref().unwrap_or("?"),
            r.id,
            r.client,
            r.server,
            r.bytes_in,
            r.bytes_out,
            secs(r.age_ms as i64),
            path_text(flat, parents, i)
        ),
    )
}
