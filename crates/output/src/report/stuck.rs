//! The stuck requests table, kept in its own file: which requests are stuck is the
//! correlator's verdict (`logical_requests`); this section only lists them.

use super::md::{code, esc, human_bytes, id_cell};
use crate::model::{LogicalRequest, Request, Snapshot, StuckKind, Verdict, WaitReason};
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
        let legs = super::path::Legs::of(s);
        let _ = writeln!(o, "\n## Stuck requests\n");
        o.push_str(&super::path::diagram(s, &legs));
        let _ = writeln!(o, "\n| request | path | stuck at | how | for | in / out |");
        let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- |");
        for l in stuck {
            let how = match l.stuck_kind {
                Some(StuckKind::NoResponse) => "no response byte",
                Some(StuckKind::StreamStalled) => "stream stopped",
                Some(StuckKind::KvTransfer) => "KV transfer stalled",
                None => "",
            };
            let (quiet, io) = match leg_of(l) {
                Some(r) => (
                    format!("{:.1} s", r.idle_out_ms / 1000.0),
                    format!("{} / {}", human_bytes(r.bytes_in), human_bytes(r.bytes_out)),
                ),
                None => (format!("{:.1} s", l.age_ms / 1000.0), "?".into()),
            };
            let at = l.stuck_at.as_deref().unwrap_or("?");
            let _ = writeln!(
                o,
                "| {} | {} | {} | {how} | {quiet} | {io} |",
                id_cell(&l.id),
                esc(&legs.path(l)),
                esc(legs.names.get(at).map_or(at, String::as_str)),
            );
        }
    }
    waiting_requests(o, s);
}

/// Requests waiting for a first byte, not judged stuck, each with the correlator's reason
/// (`LogicalRequest::waiting_reason`) and what its legs below did; young ones on one line.
fn waiting_requests(o: &mut String, s: &Snapshot) {
    let waiting: Vec<&LogicalRequest> = s
        .logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Waiting && !l.probe)
        .collect();
    if waiting.is_empty() {
        return;
    }
    let legs = super::path::Legs::of(s);
    let (young, held): (Vec<&LogicalRequest>, Vec<&LogicalRequest>) = waiting
        .iter()
        .partition(|l| l.waiting_reason == Some(WaitReason::Young));
    let _ = writeln!(o, "\nWaiting for a first byte, not judged stuck:\n");
    for l in held.iter().take(SHOWN) {
        let why = l
            .waiting_reason
            .map_or("no reason recorded (a snapshot of an older version)", |w| {
                w.text()
            });
        let _ = writeln!(
            o,
            "- {}: {}{}",
            legs.waiting_at(l),
            esc(why),
            esc(&legs.below(l))
        );
    }
    more(o, held.len());
    if !young.is_empty() {
        let ids: Vec<String> = young
            .iter()
            .take(SHOWN)
            .map(|l| format!("{} ({:.1} s)", code(&l.id), l.age_ms / 1000.0))
            .collect();
        let _ = writeln!(
            o,
            "- {} young (not yet waiting for the wedge threshold): {}",
            young.len(),
            ids.join(", ")
        );
    }
}

/// Requests listed one by one at most; the rest are counted.
const SHOWN: usize = 20;

fn more(o: &mut String, n: usize) {
    if n > SHOWN {
        let _ = writeln!(o, "- and {} more", n - SHOWN);
    }
}
