//! Following a finding in the TUI (issue 37): from the finding, `enter` shows its request's
//! lanes (one row per hop, in 80 columns); from there `t`, `d`, `m` reach the blamed hop's
//! scheduler thread, its changes and its metrics, and esc comes back. Every changed tab at
//! 80x24 and 120x40 keeps its key facts, on `demo.json`: the bundle `wedgewatch demo
//! --no-tui` wrote (environment cut to the SGLang variables).
//!
//! Create/refresh snapshots: `INSTA_UPDATE=always cargo test --test tui_follow`.
#![cfg(feature = "tui")]

use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use std::path::Path;
use wedgewatch::model::Snapshot;
use wedgewatch::tui::{App, AppOptions, FeedFrame, Tab};

const DECODE: &str = "decode@127.0.0.1:30052";
const SCHED: &str = "scheduler@decode@127.0.0.1:30052";

fn fixture(name: &str) -> Snapshot {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/snapshots")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    serde_json::from_str(&text).expect("fixture is a Snapshot")
}

fn app_of(s: Snapshot) -> App {
    let mut app = App::new(AppOptions {
        no_color: true,
        ..AppOptions::default()
    });
    app.ingest(FeedFrame::new(s));
    app
}

fn demo() -> App {
    app_of(fixture("demo"))
}

fn press(app: &mut App, code: KeyCode) {
    app.handle_key(KeyEvent::new(code, KeyModifiers::NONE));
}

fn ch(app: &mut App, c: char) {
    press(app, KeyCode::Char(c));
}

fn screen(app: &App, w: u16, h: u16) -> Vec<String> {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("test terminal");
    t.draw(|f| app.render(f)).expect("draw");
    let buf = t.backend().buffer().clone();
    buf.content
        .chunks(w as usize)
        .map(|r| r.iter().map(|c| c.symbol()).collect::<String>())
        .collect()
}

fn text(app: &App, w: u16, h: u16) -> String {
    screen(app, w, h).join("\n")
}

/// The component of the thread under the Threads tab's cursor, and its tid.
fn selected_thread(app: &App) -> (String, i32) {
    let s = app.snapshot().expect("snapshot");
    let i = app.derived().threads[app.selected()];
    let t = &s.threads[i];
    (t.component.clone().unwrap_or_default(), t.tid)
}

#[test]
fn enter_on_a_finding_shows_its_requests_lanes_in_80_columns() {
    let mut a = demo();
    press(&mut a, KeyCode::Enter);
    let rows = screen(&a, 80, 24);
    let head = rows
        .iter()
        .position(|l| l.trim_start().starts_with("lanes of r36"))
        .unwrap_or_else(|| panic!("lanes of the 4-hop request:\n{}", rows.join("\n")));
    // One row per hop: the hop, its state, age, silence and bytes before anything cut.
    let hops: Vec<&str> = rows[head + 2..head + 6]
        .iter()
        .map(String::as_str)
        .collect();
    assert!(
        hops[0].starts_with("  proxy    wait   30.3s  30.3s     1.1KiB/0B"),
        "{hops:?}"
    );
    assert!(hops[1].starts_with("  router   wait   30.3s"), "{hops:?}");
    assert!(
        hops[2].starts_with("  prefill  done   30.3s  30.2s 3.3KiB/2.0KiB"),
        "{hops:?}"
    );
    // The stuck hop by a symbol, not only by colour (this screen has none).
    assert!(
        hops[3].starts_with("! decode   wait   30.3s  30.3s     1.4KiB/0B  x34"),
        "{hops:?}"
    );
    assert!(hops.iter().all(|l| l.chars().count() <= 80));
}

#[test]
fn t_d_m_follow_the_blamed_hop_and_esc_comes_back() {
    let mut a = demo();
    press(&mut a, KeyCode::Enter);
    ch(&mut a, 'j');
    let cursor = a.selected();
    ch(&mut a, 't');
    assert_eq!(a.tab(), Tab::Threads);
    assert_eq!(
        selected_thread(&a),
        (SCHED.to_string(), 13166),
        "its scheduler's loop"
    );
    let rows = text(&a, 80, 24);
    assert!(rows.contains("frames of MainThread tid 13166"), "{rows}");
    assert!(
        rows.contains(&format!("{DECODE}: its scheduler thread · esc back")),
        "{rows}"
    );
    press(&mut a, KeyCode::Esc);
    assert_eq!(a.tab(), Tab::Overview);
    assert_eq!(a.selected(), cursor, "back on the same item");
    assert!(a.focus().is_none(), "the trail ends where it began");

    ch(&mut a, 'd');
    assert_eq!(a.tab(), Tab::Diff);
    let s = a.snapshot().expect("snapshot").clone();
    let first = &s.config_changed[a.derived().changes[a.selected()]];
    assert_eq!(first.component, DECODE);
    assert_eq!(
        first.key.as_deref(),
        Some("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS")
    );
    // Its scheduler's and detokenizer's repeats are folded into decode's rows.
    assert!(a
        .derived()
        .changes
        .iter()
        .all(|&i| !s.config_changed[i].component.contains("@decode@")));
    let rows = text(&a, 80, 24);
    assert!(rows.contains("(and its detokenizer, scheduler)"), "{rows}");
    // The restart's values do not fit 80 columns with the arrow: a line each, uncut.
    assert!(
        rows.contains("    + pid 13145 started 2026-12-05T09:29:10.120Z"),
        "{rows}"
    );

    ch(&mut a, 'm');
    assert_eq!(a.tab(), Tab::Metrics);
    let (ci, name) = &a.derived().metric_lines[a.selected()];
    assert_eq!(
        (s.components[*ci].id.as_str(), name.as_str()),
        (DECODE, "running")
    );
    press(&mut a, KeyCode::Esc);
    assert_eq!(a.tab(), Tab::Diff, "esc walks back one tab at a time");
    press(&mut a, KeyCode::Esc);
    assert_eq!(a.tab(), Tab::Overview);
    press(&mut a, KeyCode::Esc);
    assert_eq!(a.tab(), Tab::Overview, "nothing left to go back to");
}

#[test]
fn from_a_request_t_goes_to_the_scheduler_of_the_hop_it_is_stuck_at() {
    let mut a = demo();
    ch(&mut a, '2');
    assert_eq!(a.request_ids()[..2], ["x25", "x36"]);
    ch(&mut a, 'j');
    press(&mut a, KeyCode::Enter);
    let rows = screen(&a, 80, 24);
    let title = rows
        .iter()
        .position(|l| l.starts_with("hops of r36, stuck at decode"))
        .unwrap_or_else(|| panic!("{}", rows.join("\n")));
    assert!(rows[title + 1].starts_with("  HOP      STATE    AGE SILENT"));
    // Before: `proxy    r36@proxy (x36) proxy@… 127.0.0.1:33224 -> 127.0.0.1:301…`, the
    // state past the edge.
    assert!(
        rows[title + 2].starts_with("  proxy    wait   30.3s"),
        "{}",
        rows[title + 2]
    );
    assert!(
        rows[title + 5].starts_with("! decode   wait   30.3s"),
        "{}",
        rows[title + 5]
    );
    ch(&mut a, 't');
    assert_eq!(selected_thread(&a), (SCHED.to_string(), 13166));
    press(&mut a, KeyCode::Esc);
    assert_eq!(a.tab(), Tab::Requests);
    assert!(a.detail_open() || a.selected() == 1, "back on r36");
    // A tab chosen by hand leaves the trail.
    ch(&mut a, 'm');
    ch(&mut a, '1');
    press(&mut a, KeyCode::Esc);
    assert_eq!(a.tab(), Tab::Overview);
    assert!(a.focus().is_none());
}

#[test]
fn the_threads_view_opens_on_the_blamed_engines_scheduler_not_its_http_thread() {
    let mut a = demo();
    ch(&mut a, '3');
    assert_eq!(selected_thread(&a), (SCHED.to_string(), 13166));
    let rows = screen(&a, 80, 24);
    let head = rows
        .iter()
        .position(|l| l.starts_with("COMPONENT"))
        .expect("column heads");
    assert!(
        rows[head + 1].starts_with("scheduler@decode@…:30052 "),
        "{}",
        rows[head + 1]
    );
    assert!(rows[head + 1].contains("iiiiiii"), "idle in 7 of 7 dumps");
    assert!(
        rows[head + 2].starts_with("decode@127.0.0.1:30052")
            && rows[head + 2].contains("MainThread")
    );
}

#[test]
fn t_without_a_thread_dump_says_so() {
    let mut a = app_of(fixture("degraded"));
    ch(&mut a, 't');
    assert_eq!(a.tab(), Tab::Threads);
    assert!(
        a.status()
            .is_some_and(|m| m.starts_with("no thread dump of ")),
        "{:?}",
        a.status()
    );
    let mut empty = App::new(AppOptions::default());
    ch(&mut empty, 'd');
    assert_eq!(empty.tab(), Tab::Overview);
    assert_eq!(
        empty.status(),
        Some("nothing to follow: no hop is named here")
    );
}

#[test]
fn the_overview_keeps_the_schedulers_loop_at_80x24() {
    let mut a = demo();
    let rows = text(&a, 80, 24);
    assert!(
        rows.lines()
            .any(|l| l.contains("scheduler@decode@127.0.0.1:30052  loop idle 7/7")),
        "{rows}"
    );
    // Evidence open, the tree is cut to a third: the wedged engine and its scheduler stay.
    press(&mut a, KeyCode::Enter);
    let rows = text(&a, 80, 24);
    assert!(rows.contains("loop idle 7/7"), "{rows}");
    assert!(
        rows.contains("decode  CRIT decode@127.0.0.1:30052"),
        "{rows}"
    );
}

#[test]
fn the_header_joins_the_restart_to_the_first_request_never_answered() {
    let a = demo();
    let wide = screen(&a, 120, 40);
    assert_eq!(
        wide[2].trim_end(),
        "09:29:10 decode restarted (+SGLANG_DECODE_PREALLOC_SPLIT_TOKENS) -> 09:29:14 first request never answered"
    );
    let wider = screen(&a, 200, 50);
    assert!(
        wider[2].starts_with(
            "09:29:10 decode restarted (+SGLANG_DECODE_PREALLOC_SPLIT_TOKENS=100) -> 09:29:14 first request never answered (2 stuck at decode)"
        ),
        "{}",
        wider[2]
    );
    let narrow = screen(&a, 80, 24);
    assert!(
        narrow[2].starts_with("09:29:10 decode restarted (+SG"),
        "{}",
        narrow[2]
    );
    assert!(narrow[2]
        .trim_end()
        .ends_with("-> 09:29:14 first request never answered"));
    // Nothing stuck, no cause line.
    let healthy = screen(&app_of(fixture("healthy")), 120, 40);
    assert!(healthy[2].starts_with("sources:"), "{}", healthy[2]);
}

#[test]
fn the_gpu_view_puts_each_verdict_on_its_own_line() {
    let mut a = demo();
    ch(&mut a, '4');
    let rows = screen(&a, 80, 24);
    let at = rows
        .iter()
        .position(|l| l.starts_with("activity verdicts"))
        .expect("verdicts");
    for (k, id) in [
        "prefill@127.0.0.1:26180",
        DECODE,
        SCHED,
        "scheduler@prefill@127.0.0.1:26180",
    ]
    .iter()
    .enumerate()
    {
        let l = &rows[at + 1 + k];
        assert!(
            l.starts_with(&format!("  {id} ")) && l.trim_end().ends_with(" idle"),
            "{l}"
        );
    }
    assert!(
        rows[at + 5].starts_with("  unknown: proxy@127.0.0.1:30123, router@"),
        "{}",
        rows[at + 5]
    );
    assert!(
        rows.iter().any(|l| l.starts_with("GPU1 NVIDIA H200")),
        "both GPUs in 80x24"
    );
}

#[test]
fn metrics_put_the_blamed_hops_key_facts_first_and_buckets_in_numeric_order() {
    let mut a = demo();
    ch(&mut a, '6');
    let rows = screen(&a, 80, 24);
    let head = rows
        .iter()
        .position(|l| l.trim_start().starts_with("SERIES"))
        .expect("column heads");
    assert!(
        rows[head + 1].starts_with("decode@127.0.0.1:30052 (decode)"),
        "{}",
        rows[head + 1]
    );
    for (k, name) in ["running", "queued", "forward_seconds_total"]
        .iter()
        .enumerate()
    {
        assert!(
            rows[head + 2 + k].starts_with(&format!("  {name} ")),
            "{}",
            rows[head + 2 + k]
        );
    }
    let all: Vec<String> = a
        .derived()
        .metric_lines
        .iter()
        .filter(|(_, n)| n.starts_with("http_inflight_aged{"))
        .map(|(_, n)| n.clone())
        .collect();
    let gt: Vec<&str> = all
        .iter()
        .map(|n| n.split('"').nth(1).unwrap_or(""))
        .collect();
    assert_eq!(
        gt,
        ["0", "30", "60", "180", "300", "600", "1200", "3600", "7200", "14400", "28800", "86400"]
    );
}

#[test]
fn three_requests_on_one_path_are_told_apart() {
    let mut a = demo();
    ch(&mut a, '2');
    let rows = screen(&a, 80, 24);
    let row = |id: &str| {
        rows.iter()
            .find(|l| l[2..].starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("{id}:\n{}", rows.join("\n")))
            .clone()
    };
    let (r36, r41, r26) = (row("r36"), row("r41"), row("r26"));
    assert!(
        r36.starts_with("! r36") && !r41.starts_with('!'),
        "{r36}\n{r41}"
    );
    // Where each entered, by role and port: the host part is the same for all.
    for r in [&r36, &r41, &r26] {
        assert!(r.contains("proxy@…:30123"), "{r}");
    }
}

#[test]
fn the_legend_in_help_explains_states_and_ids() {
    let mut a = demo();
    ch(&mut a, '?');
    let rows = text(&a, 80, 24);
    for needle in [
        "wait  strm",
        "waiting for the first response byte",
        "STAL  done",
        "idle  clsd",
        "r36  r36@decode",
        "x34  c8",
        "an idle connection",
        "!  [wait]",
        "t d m",
        "freeze the display",
        "space . , ] [ + -",
    ] {
        assert!(rows.contains(needle), "{needle}:\n{rows}");
    }
    // The whole box, its bottom border too, fits 24 rows.
    assert!(
        rows.lines().any(|l| l.contains('└') && l.contains('┘')),
        "{rows}"
    );
}

/// Every tab the issue named, on the demo's bundle, at 80x24 and 120x40.
#[test]
fn changed_views_at_80x24_and_120x40() {
    let cases: [(&str, &[KeyCode]); 8] = [
        ("overview", &[]),
        ("overview_lanes", &[KeyCode::Enter]),
        (
            "requests_hops",
            &[KeyCode::Char('2'), KeyCode::Char('j'), KeyCode::Enter],
        ),
        ("threads", &[KeyCode::Char('3')]),
        ("gpu", &[KeyCode::Char('4')]),
        ("metrics", &[KeyCode::Char('6')]),
        ("diff_followed", &[KeyCode::Char('d')]),
        ("help", &[KeyCode::Char('?')]),
    ];
    for (name, keys) in cases {
        let mut a = demo();
        for k in keys {
            press(&mut a, *k);
        }
        for (w, h) in [(80u16, 24u16), (120, 40)] {
            insta::assert_snapshot!(format!("demo_{name}_{w}x{h}"), text(&a, w, h));
        }
    }
}

/// A snapshot that names only the role a request is stuck at (no `stuck_leg`) still marks
/// that hop.
#[test]
fn the_stuck_hop_is_marked_from_its_role_when_the_leg_is_not_named() {
    let mut s = fixture("demo");
    for l in &mut s.logical_requests {
        l.stuck_leg = None;
    }
    let mut a = app_of(s);
    ch(&mut a, '2');
    ch(&mut a, 'j');
    press(&mut a, KeyCode::Enter);
    let rows = screen(&a, 80, 24);
    let marked: Vec<&String> = rows.iter().filter(|l| l.starts_with("! ")).collect();
    assert!(
        marked.iter().any(|l| l.starts_with("! decode   wait")),
        "{}",
        rows.join("\n")
    );
    assert!(!marked.iter().any(|l| l.starts_with("! proxy ")));
}
