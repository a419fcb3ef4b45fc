//! The report's order and escaping on a hand-made snapshot.

use super::*;
use crate::model::{
    Change, Evidence, Finding, FindingKind, LogicalRequest, Request, RequestState, Role, Severity,
    SourceStatus, StuckKind, Verdict, SNAPSHOT_SCHEMA,
};

/// A wedge at decode with a config change, taken with `--no-redact`.
fn sample() -> Snapshot {
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
    Snapshot {
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
            waiting_reason: None,
            waiting_leg: None,
        }],
        gpus: vec![],
        threads: vec![],
        findings: vec![
            finding(Severity::Critical, FindingKind::WedgedRequest),
            finding(Severity::Warning, FindingKind::ConfigChanged),
        ],
        edges: vec![],
        node: None,
        connections: vec![],
        channels: vec![],
        fleet: None,
        elided: None,
        cause: None,
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
        versions: Default::default(),
    }
}

#[test]
fn finished_requests_left_out_are_said() {
    let mut s = sample();
    assert!(!render(&s).contains("are not listed"));
    s.elided = Some(crate::model::Elided {
        done_requests: 1234,
        exchanges: 3702,
        kept_done: 500,
    });
    let md = render(&s);
    assert!(
        md.contains("1234 finished requests (3702 exchanges) in the window are not listed"),
        "{md}"
    );
}

#[test]
fn what_is_wrong_comes_first() {
    let s = sample();
    let md = render(&s);
    let pos = |needle: &str| {
        md.find(needle)
            .unwrap_or_else(|| panic!("{needle} missing:\n{md}"))
    };
    assert!(pos("--no-redact") < pos("## Findings"));
    assert!(pos("## Findings") < pos("## Changed since the baseline"));
    assert!(pos("**CRITICAL** `wedged_request`") < pos("**WARNING** `config_changed`"));
    assert!(pos("## Changed since the baseline") < pos("## Stuck requests"));
    assert!(pos("## Stuck requests") < pos("<summary>Sources"));
    assert!(pos("<summary>Sources") < pos("<summary>Topology"));
    assert!(
        md.starts_with("# wedged_request at decode: 1 request accepted and forgotten\n"),
        "the title is the verdict:\n{md}"
    );
    assert!(md.contains("a&#124;b"), "table cells are escaped");
    assert!(md.contains("bytes_in=100"));
    assert!(md.contains("| gpu | unavailable | no NVML |"));
}
