//! The head of the report: the verdict as its title, then five lines (what, where, since
//! when, the evidence one line per layer, what changed). Read from the most severe finding;
//! everything here is short and bounded, so the head always fits the size cap.

use super::md::{ago, clip, esc};
use crate::clock::{parse_rfc3339, rfc3339};
use crate::model::{Finding, FindingKind, Snapshot, StuckKind, Verdict, WaitReason};
use std::collections::HashSet;

/// Longest text taken from one host string into the head.
const MAX_FIELD: usize = 300;
/// Evidence layers, in the order a reader follows a request down the stack.
const LAYERS: [&str; 5] = ["sockets", "stacks", "gpu", "metrics", "processes"];

/// The verdict, in parts, for Markdown and plain text alike.
pub struct Head {
    pub title: String,
    pub what: String,
    pub place: String,
    pub since: String,
    /// `(layer, one line)`.
    pub evidence: Vec<(String, String)>,
    pub changed: String,
}

/// The finding the report is about: the most severe, the first of equals (findings come
/// sorted by severity; an old file may not be).
pub fn top(s: &Snapshot) -> Option<&Finding> {
    let max = s.findings.iter().map(|f| f.severity).max()?;
    s.findings.iter().find(|f| f.severity == max)
}

/// How many requests a finding is about and the age of the oldest, in ms: the correlator's
/// stuck requests at the finding's hop (one per logical request, whatever its hops), or in a
/// snapshot of an older version, the finding's exchanges at its own hop.
fn stuck_of(s: &Snapshot, f: &Finding) -> (usize, Option<f64>) {
    if !s.logical_requests.is_empty() {
        let kind = match f.kind {
            FindingKind::WedgedRequest | FindingKind::TokensUndelivered => {
                Some(StuckKind::NoResponse)
            }
            FindingKind::StalledStream => Some(StuckKind::StreamStalled),
            FindingKind::PdLegFailed => Some(StuckKind::NoResponse),
            FindingKind::KvTransferStalled => Some(StuckKind::KvTransfer),
            _ => None,
        };
        // pd_leg_failed names the prefill where the requests failed; they wait at decode.
        let by_ids = f.kind == FindingKind::PdLegFailed;
        let stuck: Vec<_> = s
            .logical_requests
            .iter()
            .filter(|l| l.verdict == Verdict::Stuck)
            .filter(|l| kind.is_none() || l.stuck_kind == kind)
            .filter(|l| {
                if by_ids {
                    f.requests.contains(&l.id)
                } else {
                    f.component.is_none() || l.stuck_at == f.component
                }
            })
            .collect();
        if !stuck.is_empty() {
            let oldest = stuck.iter().map(|l| l.age_ms).reduce(f64::max);
            return (stuck.len(), oldest);
        }
    }
    let ids: HashSet<&str> = f.requests.iter().map(String::as_str).collect();
    let at_hop: Vec<_> = s
        .requests
        .iter()
        .filter(|r| ids.contains(r.id.as_str()))
        .filter(|r| f.component.as_ref().is_none_or(|c| *c == r.component))
        .collect();
    let oldest = at_hop.iter().map(|r| r.age_ms).reduce(f64::max);
    let n = if at_hop.is_empty() {
        f.requests.len()
    } else {
        at_hop.len()
    };
    (n, oldest)
}

/// `, 1 more waiting 31 s`: the requests that hang as long as the wedge threshold without
/// being judged stuck (`WaitReason` other than young), so the title counts every request
/// that hangs.
fn hanging(s: &Snapshot) -> String {
    let held: Vec<f64> = s
        .logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Waiting && !l.probe)
        .filter(|l| l.waiting_reason.is_some_and(|w| w != WaitReason::Young))
        .map(|l| l.age_ms)
        .collect();
    match held.iter().copied().reduce(f64::max) {
        Some(oldest) => format!(
            ", {} more waiting up to {} (not judged stuck)",
            held.len(),
            ago(oldest)
        ),
        None => String::new(),
    }
}

/// `12:14` (UTC) of `taken_at - age_ms`, with seconds when `long`.
fn clock_time(s: &Snapshot, age_ms: f64, long: bool) -> Option<String> {
    let t = parse_rfc3339(&s.taken_at)? - age_ms.max(0.0) as i64;
    let r = rfc3339(t);
    let hm = r.get(11..if long { 19 } else { 16 })?;
    Some(format!("{hm}{}", if long { " UTC" } else { "" }))
}

fn place_of(f: &Finding) -> String {
    match (&f.role, &f.component) {
        (Some(r), _) => r.to_string(),
        (None, Some(c)) => c.clone(),
        _ => "the stack".into(),
    }
}

fn title(s: &Snapshot, f: &Finding) -> String {
    let (n, oldest) = stuck_of(s, f);
    let since = oldest
        .and_then(|a| clock_time(s, a, false))
        .map(|t| format!(" since {t}"))
        .unwrap_or_default();
    let plural = if n == 1 { "request" } else { "requests" };
    let what = match f.kind {
        FindingKind::WedgedRequest => {
            format!("{n} {plural} accepted and forgotten{since}{}", hanging(s))
        }
        FindingKind::StalledStream => format!("{n} response streams stopped{since}"),
        FindingKind::PdLegFailed => {
            format!("{n} PD {plural} failed at prefill, decode waits for their KV{since}")
        }
        FindingKind::TokensUndelivered => {
            format!("{n} {plural} generated but never sent{since}")
        }
        FindingKind::KvTransferStalled => {
            format!("{n} {plural} waiting for their KV cache, the transfer silent{since}")
        }
        _ => clip(&f.summary, 120),
    };
    format!("{} at {}: {what}", f.kind, place_of(f))
}

fn place(s: &Snapshot, f: &Finding) -> String {
    let Some(id) = &f.component else {
        return "not tied to one component".into();
    };
    let Some(c) = s.components.iter().find(|c| &c.id == id) else {
        return id.clone();
    };
    let mut o = format!("{} ({}, {}", c.id, c.role, c.stack);
    if let Some(v) = c.versions.get(&c.stack) {
        o.push_str(&format!(" {v}"));
    }
    o.push(')');
    if let Some(p) = c.main_pid {
        o.push_str(&format!(", pid {p}"));
    }
    if !c.gpus.is_empty() {
        let g: Vec<String> = c.gpus.iter().map(|g| format!("GPU{g}")).collect();
        o.push_str(&format!(", {}", g.join(" ")));
    }
    if let Some(k) = &c.container {
        o.push_str(&format!(", in container {k}"));
    }
    o
}

fn since(s: &Snapshot, f: &Finding) -> String {
    match stuck_of(s, f).1 {
        Some(age) => match clock_time(s, age, true) {
            Some(t) => format!("{t}, {} before the snapshot", ago(age)),
            None => format!("{} before the snapshot", ago(age)),
        },
        None => format!("seen in the snapshot of {}", s.taken_at),
    }
}

/// Since when, as an RFC 3339 time: the oldest stuck request of the top finding.
pub fn since_at(s: &Snapshot) -> Option<String> {
    let age = stuck_of(s, top(s)?).1?;
    Some(rfc3339(parse_rfc3339(&s.taken_at)? - age.max(0.0) as i64))
}

/// One line per layer: the first piece of evidence, and how many more there are.
fn evidence(f: &Finding) -> Vec<(String, String)> {
    let mut layers: Vec<&str> = LAYERS.to_vec();
    for e in &f.evidence {
        if !layers.contains(&e.source.as_str()) {
            layers.push(&e.source);
        }
    }
    layers
        .into_iter()
        .filter_map(|l| {
            let mut it = f.evidence.iter().filter(|e| e.source == l);
            let first = it.next()?;
            let more = it.count();
            let tail = if more > 0 {
                format!(" (and {more} more)")
            } else {
                String::new()
            };
            Some((
                l.to_string(),
                format!("{}{tail}", clip(&first.detail, MAX_FIELD)),
            ))
        })
        .collect()
}

/// What changed since the baseline, the finding's component first, child processes folded
/// onto their engine (`model::cause::folded_changes`); the whole list follows in every format.
fn changed(s: &Snapshot, f: &Finding) -> String {
    let mut cs = crate::model::cause::folded_changes(s);
    if cs.is_empty() {
        return NO_CHANGE.into();
    }
    let top = f.component.as_deref().map(|c| {
        s.components
            .iter()
            .find(|x| x.id == c)
            .and_then(|x| x.parent.clone())
            .unwrap_or_else(|| c.to_string())
    });
    cs.sort_by_key(|c| Some(&c.top) != top.as_ref());
    let shown: Vec<String> = cs
        .iter()
        .take(3)
        .map(|c| format!("{} {}", c.name, crate::model::cause::short(&c.change)))
        .collect();
    let more = cs.len().saturating_sub(shown.len());
    let tail = if more > 0 {
        format!("; and {more} more (listed below)")
    } else {
        String::new()
    };
    format!("{}{tail}", shown.join("; "))
}

const NO_CHANGE: &str = "nothing against the baseline (or no baseline was taken)";

/// What is in flight: the correlator's requests not done (probes apart), or in an older
/// snapshot the open exchanges.
fn in_flight(s: &Snapshot) -> String {
    if s.logical_requests.is_empty() {
        return format!("{} open exchanges", s.requests.len());
    }
    let open = s
        .logical_requests
        .iter()
        .filter(|l| l.verdict != Verdict::Done && !l.probe)
        .count();
    format!("{open} requests in flight")
}

pub fn verdict(s: &Snapshot) -> Head {
    let Some(f) = top(s) else {
        let n = s.components.len();
        return Head {
            title: format!("No findings on {n} components at {}", s.taken_at),
            what: "nothing wrong was found in this snapshot".into(),
            place: format!("{n} components, {}", in_flight(s)),
            since: String::new(),
            evidence: Vec::new(),
            changed: match crate::model::cause::folded_changes(s).len() {
                0 => NO_CHANGE.into(),
                n => format!("{n} changes against the baseline (listed below)"),
            },
        };
    };
    Head {
        title: clip(&title(s, f), 200),
        what: format!("{}: {}", f.severity.as_str(), clip(&f.summary, MAX_FIELD)),
        place: place(s, f),
        since: since(s, f),
        evidence: evidence(f),
        changed: changed(s, f),
    }
}

/// The head as plain text (`report --format text`).
pub fn text(v: &Head) -> String {
    let mut o = format!(
        "{}\n\n  what:     {}\n  where:    {}\n",
        v.title, v.what, v.place
    );
    if !v.since.is_empty() {
        o.push_str(&format!("  since:    {}\n", v.since));
    }
    for (i, (layer, line)) in v.evidence.iter().enumerate() {
        let label = if i == 0 { "evidence:" } else { "" };
        o.push_str(&format!("  {label:<9} {layer}: {line}\n"));
    }
    o.push_str(&format!("  changed:  {}\n", v.changed));
    o
}

/// The head in Markdown: `# title`, the verdict as an alert block with the cause time
/// line ([`super::cause::block`]), then where, since when, the evidence and what changed.
pub fn markdown(s: &Snapshot, v: &Head) -> String {
    let mut o = format!("# {}\n\n", esc(&v.title));
    o.push_str(&super::cause::block(s, &v.what));
    o.push_str(&format!("- **Where:** {}\n", esc(&v.place)));
    if !v.since.is_empty() {
        o.push_str(&format!("- **Since:** {}\n", esc(&v.since)));
    }
    if v.evidence.is_empty() {
        o.push_str("- **Evidence:** none recorded\n");
    } else {
        o.push_str("- **Evidence:**\n");
        for (layer, line) in &v.evidence {
            o.push_str(&format!("  - {}: {}\n", esc(layer), esc(line)));
        }
    }
    o.push_str(&format!("- **Changed:** {}\n", esc(&v.changed)));
    o
}
