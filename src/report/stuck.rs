//! The stuck requests table, kept in its own file: which requests are stuck is the
//! correlator's verdict (`logical_requests`); this section only lists them.

use super::md::{code, esc, human_bytes, id_cell, join};
use crate::model::{LogicalRequest, Request, Snapshot, StuckKind, Verdict};
use std::collections::HashMap;
use std::fmt::Write;

pub fn section(s: &Snapshot) -> String {
    let mut o = String::new();
    stuck_requests(&mut o, s);
    if let Some(e) = s.elided {
        let _ = writeln!(
            o,
            "\n{} finished requests ({} exchanges) in the window are not listed: a busy node's \
             snapshot lists every unfinished request and the newest {} finished ones.",
            e.done_requests, e.exchanges, e.kept_done
        );
    }
    o
}

/// The requests the correlator judged stuck (the findings' requests, one row per logical
/// request, at the leg where it is stuck), then the ones merely waiting, apart.
fn stuck_requests(o: &mut String, s: &Snapshot) {
    // indexed once: a busy node has tens of thousands of stuck requests and exchanges
    let mut by_leg: HashMap<&str, &Request> = HashMap::with_capacity(s.requests.len());
    for r in &s.requests {
        if let Some(leg) = r.leg.as_deref() {
            by_leg.entry(leg).or_insert(r);
        }
    }
    let leg_of =
        |l: &LogicalRequest| -> Option<&Request> { by_leg.get(l.stuck_leg.as_deref()?).copied() };
    let stuck: Vec<&LogicalRequest> = s
        .logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Stuck)
        .collect();
    if !stuck.is_empty() {
        let _ = writeln!(o, "\n## Stuck requests\n");
        let _ = writeln!(
            o,
            "| request | stuck at | how | age | in / out | no output for | client -> server | hops |"
        );
        let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- | --- | --- |");
        for l in stuck {
            let how = match l.stuck_kind {
                Some(StuckKind::NoResponse) => "no response byte",
                Some(StuckKind::StreamStalled) => "stream stopped",
                Some(StuckKind::KvTransfer) => "KV transfer stalled",
                None => "",
            };
            let (age, io, quiet, ends) = match leg_of(l) {
                Some(r) => (
                    format!("{:.1} s", r.age_ms / 1000.0),
                    format!("{} / {}", human_bytes(r.bytes_in), human_bytes(r.bytes_out)),
                    format!("{:.1} s", r.idle_out_ms / 1000.0),
                    format!("{} -> {}", esc(&r.client), esc(&r.server)),
                ),
                None => (
                    format!("{:.1} s", l.age_ms / 1000.0),
                    "?".into(),
                    "?".into(),
                    "?".into(),
                ),
            };
            let _ = writeln!(
                o,
                "| {} | {} | {how} | {age} | {io} | {quiet} | {ends} | {} |",
                id_cell(l.stuck_leg.as_deref().unwrap_or(&l.id)),
                id_cell(l.stuck_at.as_deref().unwrap_or("?")),
                esc(&join(&l.legs))
            );
        }
    }
    let waiting: Vec<String> = s
        .logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Waiting && !l.probe)
        .map(|l| {
            format!(
                "{} at {} ({:.1} s)",
                code(&l.id),
                code(&l.component),
                l.age_ms / 1000.0
            )
        })
        .collect();
    if !waiting.is_empty() {
        let shown = waiting.len().min(20);
        let more = if waiting.len() > shown {
            format!(", and {} more", waiting.len() - shown)
        } else {
            String::new()
        };
        let _ = writeln!(
            o,
            "\n{} request(s) waiting for a first byte, not stuck (young, or queued at a busy engine): {}{more}",
            waiting.len(),
            waiting[..shown].join(", ")
        );
    }
}
