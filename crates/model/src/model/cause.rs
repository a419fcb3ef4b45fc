//! The cause joined to the effect: the changes, restarts and first stuck requests of a
//! snapshot on one time line, and the change named as the first suspect. Derived once from
//! the snapshot's own facts ([`of`]), stored in it (`Snapshot::cause`) when it is
//! assembled or merged, and read by every output (report, TUI, `report --json`).
//!
//! The rule for the suspect: the newest change on the blamed hop (the top finding's
//! component, or its engine for a child process) made at or before the first stuck request;
//! else the newest change anywhere before it. A change takes effect when its process
//! starts, so a component's changes are dated by its start (`started_at`).

use super::changes::{field_rank, is_config_change};
use super::snapshot::{Change, Finding, Snapshot, StuckKind, Verdict};
use crate::clock::{parse_rfc3339, rfc3339, Millis};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

/// Longest value of a change shown on the time line (the whole is in `config_changed`).
const MAX_VALUE: usize = 60;
/// Changes named per event; more are counted.
const MAX_CHANGES: usize = 3;

/// What happened, oldest first, and the suspect.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cause {
    /// Oldest first; events of unknown time last.
    pub events: Vec<CauseEvent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspect: Option<Suspect>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The component's process was replaced since the baseline (with its changes, if any).
    Restarted,
    /// Its configuration differs from the baseline, no restart seen.
    Changed,
    /// New since the baseline.
    Appeared,
    /// Gone since the baseline (time unknown).
    Gone,
    /// The first request that was never answered reached it.
    FirstNoResponse,
    /// The first response stream that stopped.
    FirstStreamStalled,
    /// The first PD request whose KV transfer stalled.
    FirstKvTransferStalled,
}

/// One point of the time line, at one component (a child process's changes are its
/// engine's: children inherit its environment and restart with it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CauseEvent {
    /// RFC 3339; absent when not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
    pub kind: EventKind,
    pub component: String,
    /// What the lines call it: its role when no other component has it, else its id.
    pub name: String,
    /// Changes in short form (`+SGLANG_X=100`), or the stuck requests' ids (`r21`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub detail: Vec<String>,
}

/// The change named first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suspect {
    pub component: String,
    pub name: String,
    /// Its changes, short form.
    pub changes: Vec<String>,
    /// Why this one, in one line.
    pub why: String,
}

/// What the lines call each component (id -> name): its role when no other component has
/// it, else its id.
pub fn short_names(s: &Snapshot) -> BTreeMap<String, String> {
    Names::of(s).name
}

/// The time line of `s`; `None` when it has neither a change nor a stuck request.
pub fn of(s: &Snapshot) -> Option<Cause> {
    let names = Names::of(s);
    let mut events = change_events(s, &names);
    let stuck = stuck_events(s, &names);
    let suspect = suspect(s, &events, &stuck, &names);
    events.extend(stuck);
    if events.is_empty() {
        return None;
    }
    // stable: at equal times a change comes before the request it may explain
    events.sort_by_key(|e| {
        (
            e.at.as_deref()
                .and_then(parse_rfc3339)
                .unwrap_or(Millis::MAX),
            stuck_last(e),
        )
    });
    Some(Cause { events, suspect })
}

fn stuck_last(e: &CauseEvent) -> bool {
    matches!(
        e.kind,
        EventKind::FirstNoResponse
            | EventKind::FirstStreamStalled
            | EventKind::FirstKvTransferStalled
    )
}

/// Short names and engines of the snapshot's components.
struct Names {
    name: BTreeMap<String, String>,
    /// A child process's engine (`parent`).
    engine: BTreeMap<String, String>,
    started: BTreeMap<String, Option<String>>,
}

impl Names {
    fn of(s: &Snapshot) -> Names {
        let mut by_role: BTreeMap<super::Role, usize> = BTreeMap::new();
        for c in &s.components {
            *by_role.entry(c.role).or_default() += 1;
        }
        let name = s
            .components
            .iter()
            .map(|c| {
                let n = if by_role.get(&c.role) == Some(&1) {
                    c.role.to_string()
                } else {
                    c.id.clone()
                };
                (c.id.clone(), n)
            })
            .collect();
        Names {
            name,
            engine: s
                .components
                .iter()
                .filter_map(|c| Some((c.id.clone(), c.parent.clone()?)))
                .collect(),
            started: s
                .components
                .iter()
                .map(|c| (c.id.clone(), c.started_at.clone()))
                .collect(),
        }
    }

    /// The component a change or request of `id` is told at: its engine for a child.
    fn top<'a>(&'a self, id: &'a str) -> &'a str {
        self.engine.get(id).map_or(id, String::as_str)
    }

    fn name(&self, id: &str) -> String {
        self.name.get(id).cloned().unwrap_or_else(|| id.to_string())
    }
}

/// A change in short form: `+SGLANG_X=100`, `-SGLANG_X`, `SGLANG_X: 1 -> 2`, `+--flag v`.
pub fn short(c: &Change) -> String {
    let key = c.key.as_deref().unwrap_or(&c.field);
    match (c.field.as_str(), c.before.as_deref(), c.after.as_deref()) {
        ("process", ..) => "restarted".into(),
        ("topology", None, Some(_)) if key == "component" => "appeared".into(),
        ("topology", Some(_), None) if key == "component" => "gone".into(),
        ("env" | "cmdline", None, Some(a)) => format!("+{key}={}", clip(a)),
        ("env" | "cmdline", Some(_), None) => format!("-{key}"),
        (f, a, b) => {
            let label = if f == "env" || f == "cmdline" {
                key.to_string()
            } else {
                format!("{f} {key}")
            };
            format!(
                "{label}: {} -> {}",
                clip(a.unwrap_or("(absent)")),
                clip(b.unwrap_or("(absent)"))
            )
        }
    }
}

/// At most [`MAX_VALUE`] characters of `v`, saying so with `…`.
fn clip(v: &str) -> String {
    match v.char_indices().nth(MAX_VALUE) {
        Some((i, _)) => format!("{}…", &v[..i]),
        None => v.to_string(),
    }
}

/// A change told at its engine: `top` is the engine's id (the component's own for an
/// engine), `name` what the lines call it.
#[derive(Debug, Clone, PartialEq)]
pub struct Folded {
    pub top: String,
    pub name: String,
    pub change: Change,
}

/// The changes of the snapshot folded onto engines: a child's change that repeats its
/// engine's is dropped (children inherit its environment and restart with it), one of its
/// own stays. By engine, then in contract order (env, cmdline, version, config, topology,
/// process).
pub fn folded_changes(s: &Snapshot) -> Vec<Folded> {
    let names = Names::of(s);
    folded(s, &names)
}

/// One fact of a change, at its engine: what a child's repeat of it is told apart by.
type Fact<'a> = (
    &'a str,
    &'a str,
    Option<&'a str>,
    Option<&'a str>,
    Option<&'a str>,
);

fn fact<'a>(top: &'a str, c: &'a Change) -> Fact<'a> {
    (
        top,
        &c.field,
        c.key.as_deref(),
        c.before.as_deref(),
        c.after.as_deref(),
    )
}

fn folded(s: &Snapshot, names: &Names) -> Vec<Folded> {
    let mut sorted: Vec<&Change> = s.config_changed.iter().collect();
    // engines before their children, so a child's repeat finds its engine's change
    sorted.sort_by_key(|c| {
        (
            names.engine.contains_key(&c.component),
            field_rank(&c.field),
        )
    });
    let mut seen: HashSet<Fact> = HashSet::new();
    let mut restarted: HashSet<&str> = HashSet::new();
    let mut out: Vec<Folded> = Vec::new();
    for c in sorted {
        let top = names.top(&c.component);
        // a child repeats its engine's change, or restarts with it
        let repeat = top != c.component
            && (seen.contains(&fact(top, c)) || (c.field == "process" && restarted.contains(top)));
        if repeat {
            continue;
        }
        seen.insert(fact(top, c));
        if c.field == "process" {
            restarted.insert(top);
        }
        out.push(Folded {
            name: names.name(top),
            top: top.to_string(),
            change: c.clone(),
        });
    }
    out.sort_by(|a, b| {
        (&a.top, field_rank(&a.change.field)).cmp(&(&b.top, field_rank(&b.change.field)))
    });
    out
}

/// One event per component with changes: a restart (dated by its start), a change, an
/// appearance, a disappearance.
fn change_events(s: &Snapshot, names: &Names) -> Vec<CauseEvent> {
    let mut by_top: BTreeMap<String, Vec<Change>> = BTreeMap::new();
    for f in folded(s, names) {
        by_top.entry(f.top).or_default().push(f.change);
    }
    by_top
        .into_iter()
        .map(|(top, cs)| {
            let has = |f: &str, k: &str| {
                cs.iter()
                    .any(|c| c.field == f && c.key.as_deref() == Some(k))
            };
            let appeared = cs.iter().any(|c| {
                c.field == "topology" && c.key.as_deref() == Some("component") && c.after.is_some()
            });
            let gone = has("topology", "component") && !appeared;
            let restarted = cs.iter().any(|c| c.field == "process");
            let kind = match (gone, appeared, restarted) {
                (true, ..) => EventKind::Gone,
                (_, true, _) => EventKind::Appeared,
                (_, _, true) => EventKind::Restarted,
                _ => EventKind::Changed,
            };
            let at = match kind {
                EventKind::Gone => None,
                _ => names.started.get(&top).cloned().flatten(),
            };
            CauseEvent {
                at,
                kind,
                name: names.name(&top),
                component: top,
                detail: cs
                    .iter()
                    .filter(|c| is_config_change(c))
                    .map(short)
                    .collect(),
            }
        })
        .collect()
}

/// Per component and way of being stuck, when its first stuck request was sent.
fn stuck_events(s: &Snapshot, names: &Names) -> Vec<CauseEvent> {
    let taken = parse_rfc3339(&s.taken_at);
    let mut first: BTreeMap<(String, StuckKind), (f64, Vec<String>)> = BTreeMap::new();
    for l in s
        .logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Stuck)
    {
        let (Some(at), Some(kind)) = (&l.stuck_at, l.stuck_kind) else {
            continue;
        };
        // the request's age, as the verdict's "since" counts it
        let age = l.age_ms;
        let e = first.entry((at.clone(), kind)).or_insert((age, Vec::new()));
        e.0 = e.0.max(age);
        e.1.push(l.id.clone());
    }
    first
        .into_iter()
        .map(|((comp, kind), (age, ids))| CauseEvent {
            at: taken.map(|t| rfc3339(t - age.max(0.0) as Millis)),
            kind: match kind {
                StuckKind::NoResponse => EventKind::FirstNoResponse,
                StuckKind::StreamStalled => EventKind::FirstStreamStalled,
                StuckKind::KvTransfer => EventKind::FirstKvTransferStalled,
            },
            name: names.name(&comp),
            component: comp,
            detail: ids,
        })
        .collect()
}

/// The hop the report is about: the most severe finding's (an engine for a child).
fn blamed<'a>(s: &'a Snapshot, names: &'a Names) -> Option<&'a str> {
    let worst = s.findings.iter().map(|f| f.severity).max()?;
    let f: &Finding = s.findings.iter().find(|f| f.severity == worst)?;
    Some(names.top(f.component.as_deref()?))
}

fn suspect(
    s: &Snapshot,
    changes: &[CauseEvent],
    stuck: &[CauseEvent],
    names: &Names,
) -> Option<Suspect> {
    let t = |e: &CauseEvent| e.at.as_deref().and_then(parse_rfc3339);
    let first_stuck = stuck.iter().filter_map(t).min()?;
    let blamed = blamed(s, names);
    let before: Vec<&CauseEvent> = changes
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Restarted | EventKind::Changed))
        .filter(|e| !e.detail.is_empty())
        .filter(|e| t(e).is_none_or(|at| at <= first_stuck))
        .collect();
    let newest = |on: Option<&str>| {
        before
            .iter()
            .filter(|e| on.is_none_or(|c| e.component == c))
            .max_by_key(|e| t(e).unwrap_or(Millis::MIN))
            .copied()
    };
    let (e, where_) = match blamed.and_then(|b| newest(Some(b))) {
        Some(e) => (e, "on the hop where requests are stuck"),
        None => (newest(None)?, "the newest change before it"),
    };
    let gap = t(e).map_or(String::new(), |at| {
        format!("{} s ", ((first_stuck - at).max(0) + 500) / 1000)
    });
    Some(Suspect {
        component: e.component.clone(),
        name: e.name.clone(),
        changes: e.detail.clone(),
        why: format!(
            "{} {gap}before the first stuck request, {where_}",
            if e.kind == EventKind::Restarted {
                "restarted with it"
            } else {
                "changed"
            }
        ),
    })
}

impl CauseEvent {
    /// `09:29:52 decode restarted with +SGLANG_X=100`.
    pub fn line(&self) -> String {
        let at = self
            .at
            .as_deref()
            .and_then(|a| a.get(11..19))
            .unwrap_or("--:--:--");
        format!("{at} {}", self.what())
    }

    /// The event without its time.
    pub fn what(&self) -> String {
        let n = &self.name;
        let changes = || {
            let mut v: Vec<String> = self.detail.iter().take(MAX_CHANGES).cloned().collect();
            if self.detail.len() > MAX_CHANGES {
                v.push(format!("{} more", self.detail.len() - MAX_CHANGES));
            }
            v.join(", ")
        };
        let ids = || {
            let more = self.detail.len().saturating_sub(1);
            let first = self.detail.first().map(String::as_str).unwrap_or("?");
            match more {
                0 => format!("({first})"),
                _ => format!("({first}; {} stuck)", self.detail.len()),
            }
        };
        match self.kind {
            EventKind::Restarted if self.detail.is_empty() => format!("{n} restarted"),
            EventKind::Restarted => format!("{n} restarted with {}", changes()),
            EventKind::Changed => format!("{n} changed: {}", changes()),
            EventKind::Appeared => format!("{n} appeared"),
            EventKind::Gone => format!("{n} gone"),
            EventKind::FirstNoResponse => {
                format!("first request never answered at {n} {}", ids())
            }
            EventKind::FirstStreamStalled => {
                format!("first response stream stopped at {n} {}", ids())
            }
            EventKind::FirstKvTransferStalled => {
                format!("first request stuck in its KV transfer at {n} {}", ids())
            }
        }
    }
}

impl Cause {
    /// The events on one line, joined by arrows (those of unknown time left out).
    pub fn line(&self) -> String {
        self.events
            .iter()
            .filter(|e| e.at.is_some())
            .map(CauseEvent::line)
            .collect::<Vec<_>>()
            .join(" -> ")
    }
}

impl Suspect {
    /// `decode: +SGLANG_X=100 (restarted with it 3 s before ...)`.
    pub fn line(&self) -> String {
        format!("{}: {} ({})", self.name, self.changes.join(", "), self.why)
    }
}
