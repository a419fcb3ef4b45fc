//! report.md: the snapshot rendered as Markdown for a bug report.
//!
//! Made to be pasted into a GitHub issue: what is wrong comes first (findings, most severe
//! first, with their evidence; then what changed since the baseline; then stuck requests),
//! then the topology and per-component facts; long parts (environment, command lines, stacks)
//! are folded in `<details>`.

use crate::model::{LogicalRequest, Request, Snapshot, Status, StuckKind, Verdict};
use std::fmt::Write;

/// Escapes text for a Markdown table cell.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// A fenced block that cannot be closed early by its content.
fn fenced(body: &str) -> String {
    let mut fence = "```".to_string();
    while body.contains(&fence) {
        fence.push('`');
    }
    format!("{fence}text\n{body}\n{fence}\n")
}

fn join<T: ToString>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn human_bytes(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = b as f64;
    let mut i = 0;
    while x >= 1024.0 && i + 1 < U.len() {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{x:.1} {}", U[i])
    }
}

/// The requests the correlator judged stuck (the findings' requests, one row per logical
/// request, at the leg where it is stuck), then the ones merely waiting, apart.
fn stuck_requests(o: &mut String, s: &Snapshot) {
    let leg_of = |l: &LogicalRequest| -> Option<&Request> {
        let leg = l.stuck_leg.as_deref()?;
        s.requests.iter().find(|r| r.leg.as_deref() == Some(leg))
    };
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
                None => "",
            };
            let (age, io, quiet, ends) = match leg_of(l) {
                Some(r) => (
                    format!("{:.1} s", r.age_ms / 1000.0),
                    format!("{} / {}", human_bytes(r.bytes_in), human_bytes(r.bytes_out)),
                    format!("{:.1} s", r.idle_out_ms / 1000.0),
                    format!("{} -> {}", r.client, r.server),
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
                "| `{}` | `{}` | {how} | {age} | {io} | {quiet} | {ends} | {} |",
                cell(l.stuck_leg.as_deref().unwrap_or(&l.id)),
                cell(l.stuck_at.as_deref().unwrap_or("?")),
                cell(&join(&l.legs))
            );
        }
    }
    let waiting: Vec<String> = s
        .logical_requests
        .iter()
        .filter(|l| l.verdict == Verdict::Waiting && !l.probe)
        .map(|l| {
            format!(
                "`{}` at `{}` ({:.1} s)",
                l.id,
                cell(&l.component),
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

/// Renders the whole report. The snapshot goes through today's redaction again (it may be
/// an old file) and every string from the host is neutralised; the rendered text gets a
/// last control-character pass, keeping only the newlines and tabs of our own layout.
pub fn render(s: &Snapshot) -> String {
    match crate::redact::for_output(&[s], s.redacted).and_then(|mut v| v.pop()) {
        Some(safe) => crate::redact::control::text(&render_safe(&safe)).into_owned(),
        None => {
            "# wedgewatch snapshot\n\nThis snapshot could not be redacted for the report.\n".into()
        }
    }
}

fn render_safe(s: &Snapshot) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "# wedgewatch snapshot {}", s.taken_at);
    let _ = writeln!(o);
    let _ = writeln!(
        o,
        "Window {} ms · {} components · {} requests · {} findings · schema `{}`",
        s.window_ms,
        s.components.len(),
        s.requests.len(),
        s.findings.len(),
        s.schema
    );
    if s.redacted {
        let _ = writeln!(o, "\nSecrets redacted (values shown as `<redacted>`).");
    } else {
        let _ = writeln!(
            o,
            "\n> **Warning: taken with `--no-redact`: secrets in environment and command lines are NOT redacted. Do not paste this publicly.**"
        );
    }

    // findings first
    let _ = writeln!(o, "\n## Findings\n");
    if s.findings.is_empty() {
        let missing: Vec<&str> = s
            .sources
            .iter()
            .filter(|(_, st)| st.status == Status::Unavailable)
            .map(|(k, _)| k.as_str())
            .collect();
        if missing.is_empty() {
            let _ = writeln!(o, "No findings.");
        } else {
            let _ = writeln!(
                o,
                "No findings. Not sampled, so not checked: {} (see Sources).",
                missing.join(", ")
            );
        }
    }
    for (i, f) in s.findings.iter().enumerate() {
        let who = match (&f.component, &f.role) {
            (Some(c), Some(r)) => format!(" on `{c}` ({r})"),
            (Some(c), None) => format!(" on `{c}`"),
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "{}. **{}** `{}`{}: {}",
            i + 1,
            f.severity.as_str().to_uppercase(),
            f.kind,
            who,
            f.summary
        );
        if !f.requests.is_empty() {
            let _ = writeln!(o, "   - requests: {}", join(&f.requests));
        }
        for e in &f.evidence {
            let _ = writeln!(o, "   - {}: {}", e.source, e.detail.replace('\n', " "));
        }
        if let Some(x) = &f.explanation {
            let _ = writeln!(o, "   - why it matters: {}", x.replace('\n', " "));
        }
    }

    if !s.config_changed.is_empty() {
        let _ = writeln!(o, "\n## Changed since the baseline (`config_changed`)\n");
        let _ = writeln!(o, "| component | role | field | key | before | after |");
        let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- |");
        for c in &s.config_changed {
            let _ = writeln!(
                o,
                "| `{}` | {} | {} | {} | {} | {} |",
                cell(&c.component),
                c.role,
                c.field,
                cell(c.key.as_deref().unwrap_or("")),
                cell(c.before.as_deref().unwrap_or("(absent)")),
                cell(c.after.as_deref().unwrap_or("(absent)"))
            );
        }
    }

    stuck_requests(&mut o, s);

    let _ = writeln!(o, "\n## Sources\n");
    let _ = writeln!(o, "| source | status | reason |");
    let _ = writeln!(o, "| --- | --- | --- |");
    for (k, st) in &s.sources {
        let status = match st.status {
            Status::Ok => "ok",
            Status::Degraded => "degraded",
            Status::Unavailable => "unavailable",
        };
        let _ = writeln!(
            o,
            "| {k} | {status} | {} |",
            cell(st.reason.as_deref().unwrap_or(""))
        );
    }

    let _ = writeln!(o, "\n## Topology\n");
    let _ = writeln!(
        o,
        "| component | role | stack | pids | listen | GPUs | parent |"
    );
    let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- | --- |");
    for c in &s.components {
        let _ = writeln!(
            o,
            "| `{}` | {} | {} | {} | {} | {} | {} |",
            cell(&c.id),
            c.role,
            cell(&c.stack),
            join(&c.pids),
            cell(&join(&c.listen)),
            join(&c.gpus),
            c.parent
                .as_deref()
                .map(|p| format!("`{p}`"))
                .unwrap_or_default()
        );
    }
    if !s.edges.is_empty() {
        let _ = writeln!(o, "\nEdges:\n");
        for e in &s.edges {
            let conns = e
                .connections
                .map(|n| format!(", {n} connections"))
                .unwrap_or_default();
            let _ = writeln!(o, "- `{}` -> `{}` ({:?}{conns})", e.from, e.to, e.origin);
        }
    }

    if !s.gpus.is_empty() {
        let _ = writeln!(o, "\n## GPUs\n");
        let _ = writeln!(o, "| GPU | name | util | power | activity | processes |");
        let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- |");
        for g in &s.gpus {
            let procs: Vec<String> = g
                .processes
                .iter()
                .map(|p| match &p.component {
                    Some(c) => format!("{} ({c})", p.pid),
                    None => p.pid.to_string(),
                })
                .collect();
            let _ = writeln!(
                o,
                "| {} | {} | {} | {} | {} | {} |",
                g.index,
                cell(&g.name),
                g.util_pct
                    .map(|u| format!("{u:.0} %"))
                    .unwrap_or("?".into()),
                g.power_w.map(|p| format!("{p:.0} W")).unwrap_or("?".into()),
                g.activity.as_deref().unwrap_or(""),
                cell(&procs.join(", "))
            );
        }
    }

    let _ = writeln!(o, "\n## Components\n");
    for c in &s.components {
        let _ = writeln!(o, "### `{}`\n", c.id);
        let _ = writeln!(o, "- role **{}**, stack {}", c.role, c.stack);
        if let Some(t) = &c.title {
            let _ = writeln!(o, "- title `{t}`");
        }
        let _ = writeln!(
            o,
            "- main pid {}, started {}",
            c.main_pid.map(|p| p.to_string()).unwrap_or("?".into()),
            c.started_at.as_deref().unwrap_or("?")
        );
        if let Some(e) = &c.exe {
            let _ = writeln!(o, "- executable `{e}`");
        }
        // netns (issue 11 item 5): where a containerised component lives and is scraped.
        if let Some(k) = &c.container {
            let _ = writeln!(o, "- container `{}`", cell(k));
        }
        if let Some(ns) = c.netns {
            let _ = writeln!(
                o,
                "- network namespace `net:[{ns}]` (its listen addresses are inside it; scraped there)"
            );
        }
        if let Some(a) = &c.gpu_activity {
            let _ = writeln!(o, "- GPU activity: {a}");
        }
        if !c.sockets.is_empty() {
            let socks: Vec<String> = c.sockets.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(o, "- sockets: {}", socks.join(", "));
        }
        if !c.metrics.is_empty() {
            let m: Vec<String> = c.metrics.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(o, "- metrics: {}", m.join(", "));
        }
        for p in &c.processes {
            let g = |k: &str| p.get(k).cloned().unwrap_or(serde_json::Value::Null);
            let threads = g("threads").as_array().map(|a| a.len());
            let _ = writeln!(
                o,
                "- pid {}: state {}, {} threads, {} fds, cpu {} ms, rss {}{}",
                g("pid"),
                g("state").as_str().unwrap_or("?"),
                threads.map(|n| n.to_string()).unwrap_or("?".into()),
                g("fd_count"),
                g("cpu_time_ms"),
                g("rss_bytes")
                    .as_u64()
                    .map(human_bytes)
                    .unwrap_or("?".into()),
                g("nspid")
                    .as_array()
                    .filter(|a| a.len() > 1)
                    .map(|a| format!(
                        ", NSpid {}",
                        join(&a.iter().map(|x| x.to_string()).collect::<Vec<_>>())
                    ))
                    .unwrap_or_default()
            );
            if let Some(errs) = g("errors").as_array().filter(|a| !a.is_empty()) {
                for e in errs {
                    let _ = writeln!(
                        o,
                        "  - could not read {}: {}",
                        e.get("field").and_then(|x| x.as_str()).unwrap_or("?"),
                        e.get("reason").and_then(|x| x.as_str()).unwrap_or("?")
                    );
                }
            }
        }
        if !c.labels.is_empty() {
            let l: Vec<String> = c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = writeln!(o, "- labels: `{}`", cell(&l.join(" ")));
        }
        if !c.cmdline.is_empty() {
            let _ = writeln!(o, "\n<details><summary>command line</summary>\n");
            let _ = write!(o, "{}", fenced(&c.cmdline.join(" ")));
            let _ = writeln!(o, "\n</details>");
        }
        let parent = c
            .parent
            .as_deref()
            .and_then(|p| s.components.iter().find(|x| x.id == p));
        if let Some(p) = parent.filter(|p| !c.env.is_empty() && p.env == c.env) {
            let _ = writeln!(o, "- environment: the same as `{}`'s", p.id);
        } else if !c.env.is_empty() {
            let _ = writeln!(
                o,
                "\n<details><summary>environment ({} variables)</summary>\n",
                c.env.len()
            );
            let body: Vec<String> = c.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = write!(o, "{}", fenced(&body.join("\n")));
            let _ = writeln!(o, "\n</details>");
        }
        let _ = writeln!(o);
    }

    if !s.threads.is_empty() {
        let _ = writeln!(o, "## Threads\n");
        let _ = writeln!(
            o,
            "<details><summary>{} thread stacks</summary>\n",
            s.threads.len()
        );
        for t in &s.threads {
            let _ = writeln!(
                o,
                "**pid {} tid {}** {} `{}`{}{}",
                t.pid,
                t.tid,
                t.name.as_deref().unwrap_or(""),
                t.state,
                t.component
                    .as_deref()
                    .map(|c| format!(" in `{c}`"))
                    .unwrap_or_default(),
                t.rule
                    .as_deref()
                    .map(|r| format!(" (rule `{r}`)"))
                    .unwrap_or_default()
            );
            let _ = write!(o, "{}", fenced(&t.frames.join("\n")));
        }
        let _ = writeln!(o, "\n</details>");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{
        Change, Evidence, Finding, FindingKind, RequestState, Role, Severity, SourceStatus,
        SNAPSHOT_SCHEMA,
    };

    #[test]
    fn what_is_wrong_comes_first() {
        let finding = |sev, kind: FindingKind| Finding {
            kind: kind.clone(),
            severity: sev,
            component: Some("decode@127.0.0.1:2".into()),
            role: Some(Role::Decode),
            summary: format!("{kind} summary"),
            requests: vec!["r1".into()],
            evidence: vec![Evidence::new(
                "sockets",
                "bytes_in=100 bytes_out=0 for 60 s",
            )],
            explanation: None,
        };
        let mut sources = std::collections::BTreeMap::new();
        sources.insert("gpu".to_string(), SourceStatus::unavailable("no NVML"));
        let s = Snapshot {
            schema: SNAPSHOT_SCHEMA.into(),
            taken_at: "t".into(),
            window_ms: 3000.0,
            sources,
            components: vec![],
            requests: vec![Request {
                id: "x1".into(),
                component: "decode@127.0.0.1:2".into(),
                client: "127.0.0.1:5".into(),
                server: "127.0.0.1:2".into(),
                state: RequestState::WaitingFirstByte,
                age_ms: 60000.0,
                bytes_in: 100,
                bytes_out: 0,
                idle_out_ms: 60000.0,
                links: vec![],
                role: None,
                client_component: None,
                link_confidence: None,
                started_at: None,
                request: Some("r1".into()),
                leg: Some("r1@decode".into()),
            }],
            logical_requests: vec![LogicalRequest {
                id: "r1".into(),
                legs: vec!["x1".into()],
                verdict: Verdict::Stuck,
                component: "decode@127.0.0.1:2".into(),
                age_ms: 60000.0,
                probe: false,
                stuck_leg: Some("r1@decode".into()),
                stuck_at: Some("decode@127.0.0.1:2".into()),
                stuck_role: Some(Role::Decode),
                stuck_kind: Some(StuckKind::NoResponse),
            }],
            gpus: vec![],
            threads: vec![],
            findings: vec![
                finding(Severity::Critical, FindingKind::WedgedRequest),
                finding(Severity::Warning, FindingKind::ConfigChanged),
            ],
            edges: vec![],
            redacted: false,
            config_changed: vec![Change {
                component: "decode@127.0.0.1:2".into(),
                role: Role::Decode,
                field: "env".into(),
                key: Some("KNOB".into()),
                before: None,
                after: Some("a|b".into()),
            }],
            tool: Default::default(),
        };
        let md = render(&s);
        let pos = |needle: &str| {
            md.find(needle)
                .unwrap_or_else(|| panic!("{needle} missing:\n{md}"))
        };
        assert!(pos("--no-redact") < pos("## Findings"));
        assert!(pos("## Findings") < pos("## Changed since the baseline"));
        assert!(pos("**CRITICAL** `wedged_request`") < pos("**WARNING** `config_changed`"));
        assert!(pos("## Changed since the baseline") < pos("## Stuck requests"));
        assert!(pos("## Stuck requests") < pos("## Sources"));
        assert!(pos("## Sources") < pos("## Topology"));
        assert!(md.contains("a\\|b"), "table cells are escaped");
        assert!(md.contains("bytes_in=100"));
        assert!(md.contains("| gpu | unavailable | no NVML |"));
    }
}
