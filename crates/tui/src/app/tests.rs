//! App state and key handling tests.

use super::*;
use crate::clock::FakeClock;
use crate::model::{
    LogicalRequest, Request, RequestState, Role, Severity, StuckKind, Verdict, SNAPSHOT_SCHEMA,
};
use ratatui::crossterm::event::KeyEventKind;
use std::collections::BTreeMap;
use std::sync::Mutex;

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}
fn ch(c: char) -> KeyEvent {
    key(KeyCode::Char(c))
}

fn req(id: &str, comp: &str, role: Role, state: RequestState, idle: f64) -> Request {
    Request {
        id: id.into(),
        component: comp.into(),
        client: "127.0.0.1:50000".into(),
        server: "127.0.0.1:8080".into(),
        state,
        age_ms: idle + 100.0,
        bytes_in: 100,
        bytes_out: 0,
        idle_out_ms: idle,
        links: vec![],
        role: Some(role),
        client_component: None,
        link_confidence: None,
        started_at: None,
        request: None,
        leg: None,
    }
}

/// A logical request over `legs` (the correlator's verdict), its legs named after it.
fn logical(s: &mut Snapshot, id: &str, legs: &[&str], verdict: Verdict, stuck: Option<&str>) {
    for r in s
        .requests
        .iter_mut()
        .filter(|r| legs.contains(&r.id.as_str()))
    {
        r.request = Some(id.into());
        r.leg = Some(format!("{id}@{}", r.role.unwrap_or(Role::Other)));
    }
    let leg_of = |x: &str| {
        s.requests
            .iter()
            .find(|r| r.id == x)
            .and_then(|r| r.leg.clone())
    };
    let stuck_req = stuck.and_then(|x| s.requests.iter().find(|r| r.id == x));
    s.logical_requests.push(LogicalRequest {
        id: id.into(),
        legs: legs.iter().map(|l| l.to_string()).collect(),
        verdict,
        component: String::new(),
        age_ms: 0.0,
        probe: false,
        stuck_leg: stuck.and_then(leg_of),
        stuck_at: stuck_req.map(|r| r.component.clone()),
        stuck_role: stuck_req.and_then(|r| r.role),
        stuck_kind: stuck.map(|_| StuckKind::NoResponse),
        waiting_reason: None,
        waiting_leg: None,
    });
}

fn snap(taken_at: &str, requests: Vec<Request>) -> Snapshot {
    Snapshot {
        schema: SNAPSHOT_SCHEMA.to_string(),
        taken_at: taken_at.into(),
        window_ms: 3000.0,
        sources: BTreeMap::new(),
        components: vec![],
        requests,
        gpus: vec![],
        threads: vec![],
        findings: vec![],
        edges: vec![],
        redacted: true,
        config_changed: vec![],
        tool: BTreeMap::new(),
        versions: BTreeMap::new(),
        logical_requests: vec![],
        node: None,
        connections: vec![],
        channels: vec![],
        fleet: None,
        elided: None,
        cause: None,
    }
}

fn chain_snapshot() -> Snapshot {
    let mut a = req(
        "a-proxy",
        "proxy",
        Role::Proxy,
        RequestState::WaitingFirstByte,
        94_000.0,
    );
    a.links = vec!["a-router".into()];
    let mut b = req(
        "a-router",
        "router",
        Role::Router,
        RequestState::WaitingFirstByte,
        94_000.0,
    );
    b.links = vec!["a-decode".into()];
    let c = req(
        "a-decode",
        "decode",
        Role::Decode,
        RequestState::WaitingFirstByte,
        94_000.0,
    );
    let ok = req(
        "b-proxy",
        "proxy",
        Role::Proxy,
        RequestState::Streaming,
        20.0,
    );
    let done = req(
        "c-proxy",
        "proxy",
        Role::Proxy,
        RequestState::Done,
        50_000.0,
    );
    let mut s = snap("2026-11-29T12:00:00.000Z", vec![ok, done, a, b, c]);
    let chain = ["a-proxy", "a-router", "a-decode"];
    logical(&mut s, "ra", &chain, Verdict::Stuck, Some("a-decode"));
    logical(&mut s, "rb", &["b-proxy"], Verdict::Active, None);
    logical(&mut s, "rc", &["c-proxy"], Verdict::Done, None);
    s
}

#[test]
fn stuck_chain_first_and_blamed_on_its_deepest_hop() {
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame::new(chain_snapshot()));
    assert_eq!(app.request_ids(), vec!["a-proxy", "b-proxy", "c-proxy"]);
    let row = &app.derived().rows[app.derived().request_order[0]];
    assert_eq!(row.stuck_at, Some(3));
    assert!(row.lanes[1].is_some_and(|l| l.stuck));
    assert!(row.lanes[2].is_none());
    // `a` shows every hop, stuck first and deepest first.
    app.handle_key(ch('a'));
    assert_eq!(app.request_ids()[..3], ["a-decode", "a-router", "a-proxy"]);
}

#[test]
fn sort_cycles_and_filter_edits() {
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame::new(chain_snapshot()));
    app.handle_key(ch('2'));
    assert_eq!(app.tab(), Tab::Requests);
    app.handle_key(ch('o'));
    assert_eq!(app.sort(), SortKey::Age);
    app.handle_key(ch('o'));
    app.handle_key(ch('o'));
    app.handle_key(ch('o'));
    assert_eq!(app.sort(), SortKey::Id);
    assert_eq!(app.request_ids(), vec!["a-proxy", "b-proxy", "c-proxy"]);
    app.handle_key(ch('o'));
    assert_eq!(app.sort(), SortKey::Stuck);

    app.handle_key(ch('/'));
    assert!(app.is_editing_filter());
    for c in "strEAM".chars() {
        app.handle_key(ch(c));
    }
    // `q` while typing a filter is text, not quit.
    assert_eq!(app.handle_key(ch('q')), Action::None);
    app.handle_key(key(KeyCode::Backspace));
    app.handle_key(key(KeyCode::Enter));
    assert!(!app.is_editing_filter());
    assert_eq!(app.filter(), "strEAM");
    assert_eq!(app.request_ids(), vec!["b-proxy"]);
    app.handle_key(key(KeyCode::Esc));
    assert_eq!(app.filter(), "");
    assert_eq!(app.request_ids().len(), 3);
}

#[test]
fn tabs_by_tab_backtab_and_numbers() {
    let mut app = App::new(AppOptions::default());
    assert_eq!(app.tab(), Tab::Overview);
    app.handle_key(key(KeyCode::Tab));
    assert_eq!(app.tab(), Tab::Requests);
    app.handle_key(key(KeyCode::BackTab));
    app.handle_key(key(KeyCode::BackTab));
    assert_eq!(app.tab(), Tab::Components, "the last tab");
    app.handle_key(key(KeyCode::BackTab));
    assert_eq!(app.tab(), Tab::Diff);
    app.handle_key(ch('8'));
    assert_eq!(app.tab(), Tab::Components);
    app.handle_key(ch('4'));
    assert_eq!(app.tab(), Tab::Gpu);
    app.handle_key(ch('9'));
    assert_eq!(app.tab(), Tab::Gpu);
}

#[test]
fn selection_moves_and_clamps() {
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame::new(chain_snapshot()));
    app.handle_key(ch('2'));
    app.handle_key(ch('j'));
    app.handle_key(key(KeyCode::Down));
    assert_eq!(app.selected(), 2);
    app.handle_key(ch('j'));
    assert_eq!(app.selected(), 2, "clamped to the last row");
    app.handle_key(ch('k'));
    assert_eq!(app.selected(), 1);
    app.handle_key(key(KeyCode::Home));
    assert_eq!(app.selected(), 0);
    app.handle_key(key(KeyCode::End));
    assert_eq!(app.selected(), 2);
    app.handle_key(key(KeyCode::Enter));
    assert!(app.detail_open());
    app.handle_key(key(KeyCode::Esc));
    assert!(!app.detail_open());
}

#[test]
fn help_overlay_swallows_keys_until_closed() {
    let mut app = App::new(AppOptions::default());
    app.handle_key(ch('?'));
    assert!(app.help_open());
    app.handle_key(ch('3'));
    assert_eq!(app.tab(), Tab::Overview, "keys go to the help overlay");
    app.handle_key(key(KeyCode::Esc));
    assert!(!app.help_open());
    app.handle_key(ch('?'));
    assert_eq!(app.handle_key(ch('q')), Action::Quit);
}

#[test]
fn quit_keys_and_replay_keys() {
    let mut app = App::new(AppOptions::default());
    assert_eq!(app.handle_key(ch('q')), Action::Quit);
    let ctrl_c = KeyEvent::new_with_kind(
        KeyCode::Char('c'),
        KeyModifiers::CONTROL,
        KeyEventKind::Press,
    );
    assert_eq!(app.handle_key(ctrl_c), Action::Quit);
    app.handle_key(ch('/'));
    assert_eq!(
        app.handle_key(ctrl_c),
        Action::Quit,
        "Ctrl-C quits even mid-filter"
    );
    let mut app = App::new(AppOptions::default());
    let expected = [
        (' ', ReplayCommand::TogglePause),
        ('.', ReplayCommand::Step(1)),
        (',', ReplayCommand::Step(-1)),
        (']', ReplayCommand::Seek(10)),
        ('[', ReplayCommand::Seek(-10)),
        ('+', ReplayCommand::Faster),
        ('-', ReplayCommand::Slower),
    ];
    for (c, cmd) in expected {
        assert_eq!(app.handle_key(ch(c)), Action::Replay(cmd), "key {c:?}");
    }
}

#[test]
fn freeze_holds_frames_and_resumes_with_the_newest() {
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame::new(snap("t1", vec![])));
    app.handle_key(ch('f'));
    assert!(app.is_frozen());
    app.ingest(FeedFrame::new(snap("t2", vec![])));
    app.ingest(FeedFrame::new(snap("t3", vec![])));
    assert_eq!(app.snapshot().map(|s| s.taken_at.as_str()), Some("t1"));
    assert_eq!(app.held_frames(), 2);
    assert_eq!(app.history().len(), 1, "display history frozen too");
    app.handle_key(ch('f'));
    assert!(!app.is_frozen());
    assert_eq!(app.snapshot().map(|s| s.taken_at.as_str()), Some("t3"));
    assert_eq!(app.history().len(), 3, "collection went on while frozen");
    assert_eq!(app.frames_received(), 3);
}

#[test]
fn snapshot_key_calls_the_writer_and_reports() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen_in = seen.clone();
    let opts = AppOptions {
        snapshot_writer: Some(Box::new(move |s: &Snapshot| {
            if let Ok(mut v) = seen_in.lock() {
                v.push(s.taken_at.clone());
            }
            if s.taken_at == "bad" {
                Err("disk full".to_string())
            } else {
                Ok(PathBuf::from("/tmp/ww-bundle"))
            }
        })),
        clock: Arc::new(FakeClock::new(0)),
        ..AppOptions::default()
    };
    let mut app = App::new(opts);
    app.handle_key(ch('s'));
    assert_eq!(app.status(), Some("snapshot: nothing received yet"));
    app.ingest(FeedFrame::new(snap("t1", vec![])));
    app.handle_key(ch('f'));
    app.ingest(FeedFrame::new(snap("t2", vec![])));
    app.handle_key(ch('s'));
    assert_eq!(app.status(), Some("snapshot written: /tmp/ww-bundle"));
    assert_eq!(
        seen.lock().map(|v| v.clone()).unwrap_or_default(),
        vec!["t1".to_string()],
        "writes what is on screen (the frozen frame), not the held one"
    );
    app.handle_key(ch('f'));
    app.ingest(FeedFrame::new(snap("bad", vec![])));
    app.handle_key(ch('s'));
    assert_eq!(app.status(), Some("snapshot failed: disk full"));

    let mut plain = App::new(AppOptions::default());
    plain.ingest(FeedFrame::new(snap("t1", vec![])));
    plain.handle_key(ch('s'));
    assert!(plain
        .status()
        .is_some_and(|s| s.contains("no bundle writer")));
}

#[test]
fn enter_expands_the_selected_finding() {
    let mut s = chain_snapshot();
    let f = |kind: &str, sev| Finding {
        kind: kind.into(),
        severity: sev,
        component: Some("decode".into()),
        role: Some(Role::Decode),
        summary: kind.into(),
        requests: vec![],
        evidence: vec![],
        explanation: None,
    };
    s.findings = vec![
        f("info_one", Severity::Info),
        f("wedged_request", Severity::Critical),
    ];
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame::new(s));
    assert_eq!(app.derived().findings, vec![1, 0], "most severe first");
    app.handle_key(key(KeyCode::Enter));
    let snap = app.snapshot().cloned();
    let snap = snap.as_ref();
    assert!(snap.is_some_and(|s| app.is_expanded(&s.findings[1])));
    assert!(snap.is_some_and(|s| !app.is_expanded(&s.findings[0])));
    app.handle_key(key(KeyCode::Enter));
    assert!(snap.is_some_and(|s| !app.is_expanded(&s.findings[1])));
    // The filter narrows the findings too.
    app.handle_key(ch('/'));
    for c in "info".chars() {
        app.handle_key(ch(c));
    }
    assert_eq!(app.derived().findings, vec![0]);
}
