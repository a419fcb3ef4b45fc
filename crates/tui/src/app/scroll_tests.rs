//! Scrolling and ordering by key events, on the committed fixtures: the evidence of a
//! finding, thread frames and a component's detail are read with j/k/PgDn; threads sort
//! stuck-first.

use super::*;
use crate::model::Snapshot;

fn fixture(name: &str) -> Snapshot {
    let text = match name {
        "wedged" => include_str!("../../../../tests/fixtures/snapshots/wedged.json"),
        _ => include_str!("../../../../tests/fixtures/snapshots/healthy.json"),
    };
    serde_json::from_str(text).expect("fixture is a snapshot")
}

fn app(name: &str) -> App {
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame::new(fixture(name)));
    app
}

fn press(app: &mut App, code: KeyCode) {
    app.handle_key(KeyEvent::new(code, KeyModifiers::NONE));
}

fn row(app: &App) -> FindingRow {
    app.finding_rows()[app.selected()]
}

#[test]
fn j_reads_through_an_expanded_findings_evidence_then_moves_on() {
    let mut a = app("wedged");
    let s = fixture("wedged");
    let first = row(&a);
    assert_eq!(first.item, None);
    let f = &s.findings[first.finding];
    let lanes = a.derived().finding_chains[first.finding];
    assert!(
        lanes.is_some(),
        "a wedged_request shows its request's lanes"
    );
    let n = items(f, lanes).len();
    assert_eq!(
        n,
        1 + 1 + f.evidence.len() + 1,
        "requests, lanes, evidence, why"
    );
    // Folded: j goes to the next finding.
    press(&mut a, KeyCode::Char('j'));
    assert_ne!(row(&a).finding, first.finding);
    press(&mut a, KeyCode::Char('k'));
    press(&mut a, KeyCode::Enter);
    assert_eq!(row(&a), first, "enter keeps the cursor on the finding");
    for k in 0..n {
        press(&mut a, KeyCode::Char('j'));
        assert_eq!(row(&a).item, Some(k), "item {k}");
        assert_eq!(row(&a).finding, first.finding);
    }
    assert!(matches!(items(f, lanes)[1], Item::Lanes(_)));
    assert!(matches!(items(f, lanes)[n - 1], Item::Explanation(_)));
    press(&mut a, KeyCode::Char('j'));
    assert_ne!(
        row(&a).finding,
        first.finding,
        "past the evidence: next finding"
    );
    press(&mut a, KeyCode::Char('g'));
    press(&mut a, KeyCode::PageDown);
    assert_eq!(a.selected(), (a.finding_rows().len() - 1).min(10));
    press(&mut a, KeyCode::Char('k'));
    assert_eq!(row(&a).item, Some(n - 1));
    // Enter on an evidence item folds its finding and goes back to its line.
    press(&mut a, KeyCode::Enter);
    assert_eq!(row(&a), first);
    assert_eq!(a.finding_rows().len(), s.findings.len());
}

#[test]
fn the_cursor_stays_on_its_finding_when_a_new_frame_reorders_them() {
    let mut a = app("wedged");
    press(&mut a, KeyCode::Enter);
    press(&mut a, KeyCode::Char('j'));
    press(&mut a, KeyCode::Char('j'));
    let before = row(&a);
    let key = |a: &App, r: FindingRow| a.snapshot().map(|s| s.findings[r.finding].kind.clone());
    let kind = key(&a, before);
    let mut s = fixture("wedged");
    s.findings.reverse();
    a.ingest(FeedFrame::new(s));
    let after = row(&a);
    assert_eq!(key(&a, after), kind);
    assert_eq!(after.item, before.item);
}

#[test]
fn open_frames_scroll_with_j_and_stop_at_their_last_page() {
    let mut a = app("wedged");
    press(&mut a, KeyCode::Char('3'));
    let sel = a.selected();
    press(&mut a, KeyCode::Enter);
    assert!(a.detail_open());
    a.set_detail_viewport(4);
    press(&mut a, KeyCode::Char('j'));
    assert_eq!(a.detail_scroll(), 1);
    assert_eq!(a.selected(), sel, "j scrolls the frames, not the list");
    press(&mut a, KeyCode::Char('G'));
    let s = fixture("wedged");
    let t = &s.threads[a.derived().threads[sel]];
    let len = 1 + usize::from(t.rule.is_some()) + t.frames.len().max(1);
    assert_eq!(a.detail_scroll(), len - 4, "the last page, not past it");
    press(&mut a, KeyCode::Char('k'));
    assert_eq!(a.detail_scroll(), len - 5, "k moves at once after G");
    press(&mut a, KeyCode::Esc);
    assert!(!a.detail_open());
    assert_eq!(a.detail_scroll(), 0);
    press(&mut a, KeyCode::Char('j'));
    assert_eq!(a.selected(), sel + 1, "closed, j moves the selection again");
}

#[test]
fn threads_of_the_wedged_engine_come_first_main_thread_on_top() {
    let a = app("wedged");
    let s = fixture("wedged");
    let t = &s.threads[a.derived().threads[0]];
    assert_eq!(
        t.component.as_deref(),
        Some("scheduler@decode@127.0.0.1:31012")
    );
    assert_eq!(t.name.as_deref(), Some("MainThread"));
    // Without a finding, unclassified threads go after the loops' main threads.
    let mut quiet = fixture("wedged");
    quiet.findings.clear();
    let mut b = App::new(AppOptions::default());
    b.ingest(FeedFrame::new(quiet.clone()));
    let states: Vec<_> = b
        .derived()
        .threads
        .iter()
        .map(|&i| quiet.threads[i].state.as_str().to_string())
        .collect();
    let last_idle = states.iter().rposition(|x| x == "idle");
    let first_other = states.iter().position(|x| x != "idle");
    assert!(last_idle < first_other, "{states:?}");
}

#[test]
fn component_detail_names_the_changed_variable_and_scrolls() {
    let mut a = app("wedged");
    press(&mut a, KeyCode::Char('8'));
    let s = fixture("wedged");
    let decode = s
        .components
        .iter()
        .position(|c| c.id == "decode@127.0.0.1:31012")
        .expect("decode");
    assert_eq!(
        a.selected(),
        decode,
        "opens on the hop of the worst finding"
    );
    let facts = component_facts(&s, &s.components[decode]);
    assert!(facts
        .iter()
        .any(|f| matches!(f, Fact::Change { key, after, .. }
        if key == "SGLANG_DECODE_PREALLOC_SPLIT_TOKENS" && after.as_deref() == Some("1"))));
    assert!(facts.contains(&Fact::Text("--disaggregation-mode decode".into())));
    press(&mut a, KeyCode::Enter);
    a.set_detail_viewport(3);
    press(&mut a, KeyCode::PageDown);
    assert_eq!(a.detail_scroll(), 10.min(facts.len() - 3));
    assert_eq!(a.selected(), decode);
}

#[test]
fn open_hops_scroll_with_j_and_stop_at_their_last_page() {
    let mut a = app("wedged");
    press(&mut a, KeyCode::Char('2'));
    press(&mut a, KeyCode::Enter);
    assert!(a.detail_open());
    let s = fixture("wedged");
    let row = a.derived().rows[a.derived().request_order[0]].clone();
    // Title, column heads, one line per hop, one per finding that names the request.
    let len = a.derived().hop_detail_len(&s, row.chain);
    assert_eq!(len, 2 + 4 + 1, "four hops and the wedged_request finding");
    a.set_detail_viewport(3);
    press(&mut a, KeyCode::Char('j'));
    assert_eq!(a.detail_scroll(), 1);
    assert_eq!(a.selected(), 0, "j scrolls the hops, not the list");
    press(&mut a, KeyCode::Char('G'));
    assert_eq!(a.detail_scroll(), len - 3, "the last page, not past it");
    press(&mut a, KeyCode::PageUp);
    assert_eq!(a.detail_scroll(), 0);
    press(&mut a, KeyCode::Esc);
    assert_eq!(a.detail_scroll(), 0);
    press(&mut a, KeyCode::Char('j'));
    assert_eq!(a.selected(), 1, "closed, j moves the selection again");
}

#[test]
fn the_sockets_cursor_runs_from_the_summary_into_the_connections() {
    let mut a = app("wedged");
    press(&mut a, KeyCode::Char('5'));
    let n = a.derived().socket_components.len();
    let conns = a.derived().connections.len();
    assert_eq!(n, 4, "proxy, router, prefill, decode");
    assert_eq!(a.tab_len(Tab::Sockets), n + conns);
    assert_eq!(a.selected(), n, "opens on the first connection");
    assert_eq!(a.selected_connection(), Some(0));
    press(&mut a, KeyCode::Char('k'));
    assert_eq!(a.selected_connection(), None);
    assert_eq!(a.selected_socket_component(), Some(n - 1));
    press(&mut a, KeyCode::Enter);
    assert!(!a.detail_open(), "a summary line has no detail");
    press(&mut a, KeyCode::Char('g'));
    assert_eq!(a.selected_socket_component(), Some(0));
    press(&mut a, KeyCode::PageDown);
    assert_eq!(a.selected_connection(), Some(10 - n));
    press(&mut a, KeyCode::Char('G'));
    assert_eq!(a.selected_connection(), Some(conns - 1));
    press(&mut a, KeyCode::Enter);
    assert!(a.detail_open());
    press(&mut a, KeyCode::PageUp);
    assert_eq!(
        a.selected_connection(),
        Some(conns - 11),
        "open, pgup still moves"
    );
    // Left and come back: the cursor stays where it was moved to.
    press(&mut a, KeyCode::Char('1'));
    press(&mut a, KeyCode::Char('5'));
    assert_eq!(a.selected_connection(), Some(conns - 11));
}
