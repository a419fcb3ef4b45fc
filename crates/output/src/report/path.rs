//! The stuck requests' path, hop by hop: as a readable line (`proxy -> router -> prefill +
//! decode`) and as one Mermaid flowchart (GitHub draws it) of every hop they cross, what
//! each hop is doing for them and for how long, the hop they are stuck at marked.
//!
//! Labels hold host text (component ids) only through [`label`], which leaves nothing
//! Mermaid or Markdown could read as syntax: every character but letters, digits, spaces
//! and `.:@/+-_,()` becomes a Mermaid entity code (`#35;`).

use crate::model::{LogicalRequest, Request, RequestState, Snapshot, StuckKind, Verdict};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Hops drawn at most: past that the picture would not be read (the table lists them all).
const MAX_HOPS: usize = 24;

/// The snapshot's legs by exchange id, and the short name of each component.
pub struct Legs<'a> {
    by_id: BTreeMap<&'a str, &'a Request>,
    pub names: BTreeMap<String, String>,
}

impl<'a> Legs<'a> {
    pub fn of(s: &'a Snapshot) -> Legs<'a> {
        Legs {
            by_id: s.requests.iter().map(|r| (r.id.as_str(), r)).collect(),
            names: crate::model::cause::short_names(s),
        }
    }

    fn name(&self, component: &str) -> String {
        self.names
            .get(component)
            .cloned()
            .unwrap_or_else(|| component.to_string())
    }

    /// `l`'s legs in the snapshot, entry hop first.
    fn legs(&self, l: &LogicalRequest) -> Vec<&'a Request> {
        l.legs
            .iter()
            .filter_map(|id| self.by_id.get(id.as_str()).copied())
            .collect()
    }

    /// `proxy -> router -> prefill + decode`: each leg, then the legs it sent on together.
    pub fn path(&self, l: &LogicalRequest) -> String {
        let legs = self.legs(l);
        let Some(entry) = legs.first() else {
            return self.name(&l.component);
        };
        let mut o = self.name(&entry.component);
        let mut at: Vec<&Request> = vec![entry];
        // breadth by breadth down the links (bounded by the legs: a cycle ends it)
        for _ in 0..legs.len() {
            let mut next: Vec<&Request> = at
                .iter()
                .flat_map(|r| r.links.iter())
                .filter_map(|id| legs.iter().find(|x| &x.id == id).copied())
                .collect();
            // one order for every request: by depth in the stack (prefill before decode)
            next.sort_by_key(|r| (r.role.map(|x| x.depth()), self.name(&r.component)));
            if next.is_empty() {
                break;
            }
            let names: Vec<String> = next.iter().map(|r| self.name(&r.component)).collect();
            let _ = write!(o, " -> {}", names.join(" + "));
            at = next;
        }
        o
    }
}

impl Legs<'_> {
    /// `` `r24` at proxy, 30.9 s`` (Markdown): where a waiting request waits, for how long.
    pub fn waiting_at(&self, l: &LogicalRequest) -> String {
        let legs = self.legs(l);
        let at = legs
            .iter()
            .find(|r| r.leg.is_some() && r.leg == l.waiting_leg)
            .or(legs.first());
        match at {
            Some(r) => format!(
                "{} at {}, {:.1} s",
                super::md::code(&l.id),
                super::md::esc(&self.name(&r.component)),
                r.age_ms / 1000.0
            ),
            None => format!("{}, {:.1} s", super::md::code(&l.id), l.age_ms / 1000.0),
        }
    }

    /// ` (below it: router answered 10.2 KiB, decode closed 0 B out)`: the legs under the
    /// one it waits at, as the evidence of why it waits; empty when there are none.
    pub fn below(&self, l: &LogicalRequest) -> String {
        let legs = self.legs(l);
        let Some(i) = legs
            .iter()
            .position(|r| r.leg.is_some() && r.leg == l.waiting_leg)
        else {
            return String::new();
        };
        let shown: Vec<String> = legs[i + 1..]
            .iter()
            .map(|r| {
                format!(
                    "{} {} ({} out)",
                    self.name(&r.component),
                    r.state.as_str(),
                    super::md::human_bytes(r.bytes_out)
                )
            })
            .collect();
        match shown.is_empty() {
            true => String::new(),
            false => format!(" (below it: {})", shown.join(", ")),
        }
    }
}

/// Mermaid label text: see the module's rule.
pub fn label(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for ch in s.chars() {
        if ch.is_ascii_alphanumeric() || " .:@/+-_,()".contains(ch) {
            o.push(ch);
        } else {
            let _ = write!(o, "#{};", u32::from(ch));
        }
    }
    o
}

/// What one hop does for the stuck requests crossing it.
#[derive(Default)]
struct Hop {
    waiting: usize,
    streaming: usize,
    answered: usize,
    /// The longest time without a response byte out, in ms.
    quiet_ms: f64,
    /// Stuck here, and how.
    stuck: usize,
    kind: Option<StuckKind>,
}

fn seconds(ms: f64) -> String {
    format!("{:.0} s", (ms / 1000.0).max(0.0))
}

impl Hop {
    fn add(&mut self, r: &Request) {
        match r.state {
            RequestState::WaitingFirstByte => self.waiting += 1,
            RequestState::Streaming | RequestState::Stalled => self.streaming += 1,
            _ => self.answered += 1,
        }
        if matches!(
            r.state,
            RequestState::WaitingFirstByte | RequestState::Stalled
        ) {
            self.quiet_ms = self.quiet_ms.max(r.idle_out_ms);
        }
    }

    fn lines(&self, name: &str) -> Vec<String> {
        let mut v = vec![label(name)];
        if self.stuck > 0 {
            let how = match self.kind {
                Some(StuckKind::StreamStalled) => "stream stopped",
                _ => "no response byte",
            };
            v.push(format!(
                "STUCK HERE: {} requests, {how} for {}",
                self.stuck,
                seconds(self.quiet_ms)
            ));
        } else if self.waiting > 0 {
            v.push(format!(
                "{} waiting on the next hop for {}",
                self.waiting,
                seconds(self.quiet_ms)
            ));
        }
        if self.streaming > 0 {
            v.push(format!("{} streaming", self.streaming));
        }
        if self.answered > 0 {
            v.push(format!("{} answered or closed", self.answered));
        }
        v
    }
}

/// The Mermaid block of the stuck requests' hops; empty when none is stuck or they cross
/// more hops than [`MAX_HOPS`].
pub fn diagram(s: &Snapshot, legs: &Legs) -> String {
    let stuck: Vec<&LogicalRequest> = s
        .logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Stuck)
        .collect();
    let mut hops: BTreeMap<&str, Hop> = BTreeMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut edges: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for l in &stuck {
        let ls = legs.legs(l);
        for r in &ls {
            if !hops.contains_key(r.component.as_str()) {
                order.push(&r.component);
            }
            let h = hops.entry(&r.component).or_default();
            h.add(r);
            if l.stuck_leg.as_deref() == r.leg.as_deref() {
                h.stuck += 1;
                h.kind = l.stuck_kind;
            }
            for c in r
                .links
                .iter()
                .filter_map(|id| ls.iter().find(|x| &x.id == id))
            {
                *edges.entry((&r.component, &c.component)).or_default() += 1;
            }
        }
    }
    if hops.is_empty() || hops.len() > MAX_HOPS {
        return String::new();
    }
    let node = |c: &str| order.iter().position(|o| *o == c).unwrap_or(0);
    let mut o = String::from("```mermaid\nflowchart LR\n");
    for (i, c) in order.iter().enumerate() {
        let lines = hops[c].lines(&legs.name(c));
        let _ = writeln!(o, "  h{i}[\"{}\"]", lines.join("<br/>"));
    }
    for ((a, b), n) in &edges {
        let plural = if *n == 1 { "request" } else { "requests" };
        let _ = writeln!(o, "  h{} -->|\"{n} {plural}\"| h{}", node(a), node(b));
    }
    o.push_str("  classDef blamed fill:#fdd,stroke:#c00,stroke-width:3px\n");
    for (i, c) in order.iter().enumerate() {
        if hops[c].stuck > 0 {
            let _ = writeln!(o, "  class h{i} blamed");
        }
    }
    o.push_str("```\n");
    o
}
