//! The TUI on the smallest screen it promises (80x24), on the committed fixtures: the
//! evidence of a finding is read by scrolling, every tab's header names the most severe
//! finding, threads sort stuck-first, metric series keep what tells them apart, and
//! sparklines are scaled to capacity (counters drawn as rates).
//!
//! Create/refresh snapshots: `INSTA_UPDATE=always cargo test --test tui_80x24`.
#![cfg(feature = "tui")]

use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use std::path::Path;
use wedgewatch::model::Snapshot;
use wedgewatch::tui::{App, AppOptions, FeedFrame, Tab};

fn fixture(name: &str) -> Snapshot {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/snapshots")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    serde_json::from_str(&text).expect("fixture is a Snapshot")
}

fn app_of(s: Snapshot) -> App {
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame::new(s));
    app
}

fn press(app: &mut App, code: KeyCode) {
    app.handle_key(KeyEvent::new(code, KeyModifiers::NONE));
}

fn screen(app: &App) -> Vec<String> {
    let mut t = Terminal::new(TestBackend::new(80, 24)).expect("test terminal");
    t.draw(|f| app.render(f)).expect("draw");
    let buf = t.backend().buffer().clone();
    buf.content
        .chunks(80)
        .map(|r| r.iter().map(|c| c.symbol()).collect::<String>())
        .collect()
}

#[test]
fn the_evidence_of_a_finding_is_read_by_scrolling() {
    let mut a = app_of(fixture("wedged"));
    press(&mut a, KeyCode::Enter);
    let mut seen = String::new();
    let mut frames = Vec::new();
    for _ in 0..10 {
        let s = screen(&a).join("\n");
        seen.push_str(&s);
        frames.push(s);
        press(&mut a, KeyCode::Char('j'));
    }
    // At 80x24 these sat below the bottom of the pane and never showed.
    for needle in [
        "[gpu] GPU1 util 0 %",
        "[stacks] scheduler@decode",
        "[metrics]",
        "why:",
    ] {
        assert!(seen.contains(needle), "{needle} never on screen");
    }
    assert!(
        frames.windows(2).any(|w| w[0] != w[1]),
        "j changes the pane"
    );
    // The first screen cannot hold it all: the scrollbar says so.
    assert!(frames[0].contains('█'), "{}", frames[0]);
    let mut b = app_of(fixture("wedged"));
    press(&mut b, KeyCode::Enter);
    for _ in 0..6 {
        press(&mut b, KeyCode::Char('j'));
    }
    let scrolled = screen(&b).join("\n");
    // The topology gives way to the evidence, but keeps the hop with the finding.
    assert!(
        scrolled.contains("decode  CRIT decode@127.0.0.1:31012"),
        "{scrolled}"
    );
    insta::assert_snapshot!("wedged_overview_evidence_scrolled_80x24", scrolled);
}

#[test]
fn every_view_names_the_most_severe_finding_in_its_header() {
    for v in Tab::ALL {
        let mut a = app_of(fixture("wedged"));
        press(&mut a, KeyCode::Char(char::from(b'1' + v.index() as u8)));
        assert_eq!(a.tab(), v);
        let rows = screen(&a);
        assert!(
            rows[1].starts_with("CRIT wedged_request at decode@127.0.0.1:31012 (+1 more)"),
            "{v:?}: {}",
            rows[1]
        );
        // The cause line under it: the restart, then the first request left unanswered.
        assert!(
            rows[2].starts_with("12:01:40 decode restarted (+SG")
                && rows[2].ends_with("-> 12:12:33 first request never answered"),
            "{v:?}: {}",
            rows[2]
        );
        let tabs = rows
            .iter()
            .find(|l| l.contains("1 Overview"))
            .expect("tabs");
        assert!(tabs.contains("8 Components"), "every tab fits: {tabs}");
    }
    let healthy = screen(&app_of(fixture("healthy")));
    assert!(healthy[1].starts_with("no findings"), "{}", healthy[1]);
}

#[test]
fn the_wedged_scheduler_is_the_first_thread() {
    let mut a = app_of(fixture("wedged"));
    press(&mut a, KeyCode::Char('3'));
    let rows = screen(&a);
    let head = rows
        .iter()
        .position(|l| l.starts_with("COMPONENT"))
        .expect("column heads");
    assert!(
        rows[head + 1].starts_with("scheduler@decode") && rows[head + 1].contains("MainThread"),
        "{}",
        rows[head + 1]
    );
}

#[test]
fn open_frames_scroll_to_the_outermost_frame() {
    let mut s = fixture("wedged");
    // A deep stack: the loop's frame is the outermost, far below an 80x24 pane.
    let t = s
        .threads
        .iter_mut()
        .find(|t| t.tid == 4330)
        .expect("decode main thread");
    let outer = t.frames.last().cloned().expect("frames");
    let mut deep: Vec<String> = (0..30)
        .map(|k| format!("helper_{k} (lib.py:{k})"))
        .collect();
    deep.append(&mut t.frames);
    t.frames = deep;
    let mut a = app_of(s);
    press(&mut a, KeyCode::Char('3'));
    press(&mut a, KeyCode::Enter);
    assert!(!screen(&a).join("\n").contains(&outer));
    press(&mut a, KeyCode::Char('G'));
    let rows = screen(&a);
    assert!(rows.join("\n").contains(&outer), "{}", rows.join("\n"));
    assert!(
        rows.iter().any(|l| l.starts_with("scheduler@decode")),
        "the thread stays in sight"
    );
}

#[test]
fn metric_series_show_their_labels_not_a_cut_name() {
    let mut s = fixture("wedged");
    let router = s
        .components
        .iter_mut()
        .find(|c| c.id.starts_with("router@"))
        .expect("router");
    for port in ["31001", "31012"] {
        router.metrics.insert(
            format!("worker_requests_active{{worker=\"http://127.0.0.1:{port}\"}}"),
            1.0,
        );
    }
    let mut a = app_of(s);
    press(&mut a, KeyCode::Char('6'));
    let rows = screen(&a);
    for port in ["31001", "31012"] {
        assert!(
            rows.iter()
                .any(|l| l.contains(&format!("127.0.0.1:{port}}}"))),
            "{port}: {}",
            rows.join("\n")
        );
    }
}

#[test]
fn sparklines_are_scaled_to_capacity_and_counters_drawn_as_rates() {
    let mut a = App::new(AppOptions::default());
    for k in 0..6 {
        let mut s = fixture("healthy");
        for g in &mut s.gpus {
            // A steady 70 W on a 700 W card: low, not a full bar.
            g.power_w = Some(70.0);
            g.power_limit_w = Some(700.0);
        }
        let decode = s
            .components
            .iter_mut()
            .find(|c| c.id == "decode@127.0.0.1:31012")
            .expect("decode");
        // A counter growing at a steady rate: a flat line, not a ramp.
        decode
            .metrics
            .insert("forward_seconds_total".into(), 1000.0 + 10.0 * f64::from(k));
        decode
            .metrics
            .insert("forward_seconds_total_rate".into(), 0.5);
        a.ingest(FeedFrame::new(s));
    }
    press(&mut a, KeyCode::Char('4'));
    let gpu = screen(&a);
    let power = gpu
        .iter()
        .find(|l| l.trim_start().starts_with("power"))
        .expect("power line");
    assert!(power.contains("▂▂▂▂▂▂ of 700 W"), "{power}");
    press(&mut a, KeyCode::Char('6'));
    press(&mut a, KeyCode::Char('/'));
    for c in "decode".chars() {
        press(&mut a, KeyCode::Char(c));
    }
    press(&mut a, KeyCode::Enter);
    let rows = screen(&a);
    let fwd = rows
        .iter()
        .find(|l| l.contains("forward_seconds_total"))
        .expect("counter listed");
    assert!(fwd.contains("0.500 ██████"), "drawn as its rate: {fwd}");
}

#[test]
fn the_components_view_shows_what_changed_on_a_component() {
    let mut a = app_of(fixture("wedged"));
    press(&mut a, KeyCode::Char('8'));
    let decode = a
        .snapshot()
        .and_then(|s| {
            s.components
                .iter()
                .position(|c| c.id == "decode@127.0.0.1:31012")
        })
        .expect("decode");
    assert_eq!(a.selected(), decode, "opens on the wedged hop");
    press(&mut a, KeyCode::Enter);
    let rows = screen(&a).join("\n");
    assert!(
        rows.contains("env      SGLANG_DECODE_PREALLOC_SPLIT_TOKENS: (absent) -> 1"),
        "{rows}"
    );
    insta::assert_snapshot!("wedged_components_decode_detail_80x24", rows);
}

/// Colours read on dark and light themes: only the six ANSI hues the theme itself defines
/// against its background (red, green, yellow, magenta, cyan; no blue, near-invisible on
/// many dark themes), never colour 8 / grey, black, white or the bright variants, and never
/// a background colour. Secondary text is the DIM attribute instead.
#[test]
fn colours_are_theme_relative_hues_only() {
    use ratatui::style::Color;
    let allowed = [
        Color::Reset,
        Color::Red,
        Color::Green,
        Color::Yellow,
        Color::Magenta,
        Color::Cyan,
    ];
    for name in ["healthy", "wedged", "degraded"] {
        for v in Tab::ALL {
            let mut a = app_of(fixture(name));
            press(&mut a, KeyCode::Char(char::from(b'1' + v.index() as u8)));
            press(&mut a, KeyCode::Enter);
            for (w, h) in [(80u16, 24u16), (200, 50)] {
                let mut t = Terminal::new(TestBackend::new(w, h)).expect("test terminal");
                t.draw(|f| a.render(f)).expect("draw");
                for c in &t.backend().buffer().content {
                    assert!(
                        allowed.contains(&c.fg) && c.bg == Color::Reset,
                        "{name} {v:?}: {:?} on {:?} at {:?}",
                        c.fg,
                        c.bg,
                        c.symbol()
                    );
                }
            }
        }
    }
}

#[test]
fn a_cut_socket_summary_scrolls_with_the_cursor() {
    let mut s = fixture("wedged");
    let decode = s
        .components
        .iter()
        .find(|c| c.id == "decode@127.0.0.1:31012")
        .cloned()
        .expect("decode");
    for k in 0..10 {
        let mut c = decode.clone();
        c.id = format!("decode{k}@127.0.0.1:{}", 32000 + k);
        s.components.push(c);
    }
    let mut a = app_of(s);
    press(&mut a, KeyCode::Char('5'));
    assert_eq!(
        a.selected_connection(),
        Some(0),
        "opens on the first connection"
    );
    let rows = screen(&a);
    let text = rows.join("\n");
    assert!(!text.contains("decode9@"), "below the fold: {text}");
    let title = rows
        .iter()
        .position(|l| l.starts_with("per component"))
        .expect("summary title");
    // The summary hides lines: its scrollbar says so.
    assert!(rows[title + 1].ends_with('█'), "{text}");
    assert!(
        text.contains("CLIENT"),
        "the connection list keeps its half: {text}"
    );
    // Up from the first connection: the summary's last component, brought into sight.
    press(&mut a, KeyCode::Char('k'));
    assert_eq!(a.selected_connection(), None);
    assert_eq!(a.selected_socket_component(), Some(13));
    let up = screen(&a).join("\n");
    assert!(up.contains("decode9@127.0.0.1:32009"), "{up}");
    assert!(!up.contains("per component"), "scrolled: {up}");
    assert!(up.contains("CLIENT"), "the list stays: {up}");
    // g: back to the top of the summary.
    press(&mut a, KeyCode::Char('g'));
    assert_eq!(a.selected_socket_component(), Some(0));
    let top = screen(&a).join("\n");
    assert!(top.contains("per component"), "{top}");
    assert!(!top.contains("decode9@"), "{top}");
    // Enter does nothing on a summary line.
    press(&mut a, KeyCode::Enter);
    assert!(!a.detail_open());
}

#[test]
fn the_connection_list_scrolls_to_its_last_row() {
    let s = fixture("wedged");
    let mut a = app_of(s.clone());
    press(&mut a, KeyCode::Char('5'));
    let conns = a.derived().connections.clone();
    let last = &s.requests[*conns.last().expect("connections")];
    let needle = format!("{:<23}", last.client);
    let first = screen(&a);
    let head = first
        .iter()
        .position(|l| l.starts_with("CLIENT"))
        .expect("column heads");
    let listed = |rows: &[String]| rows[head + 1..].iter().any(|l| l.starts_with(&needle));
    assert!(!listed(&first), "below the fold: {}", first.join("\n"));
    assert!(
        first[head + 1].ends_with('█'),
        "scrollbar: {}",
        first[head + 1]
    );
    press(&mut a, KeyCode::Char('G'));
    assert_eq!(a.selected_connection(), Some(conns.len() - 1));
    let end = screen(&a);
    assert!(listed(&end), "{}", end.join("\n"));
    // Open, the detail sits below the rows, not pushed off the screen.
    press(&mut a, KeyCode::Enter);
    let open = screen(&a).join("\n");
    assert!(open.contains(&format!("{}: ", last.id)), "{open}");
    press(&mut a, KeyCode::Esc);
    for _ in 1..conns.len() {
        press(&mut a, KeyCode::Char('k'));
    }
    assert_eq!(a.selected_connection(), Some(0));
    press(&mut a, KeyCode::PageDown);
    assert_eq!(a.selected_connection(), Some(10));
}

/// A wedged request whose chain many findings name: its hop detail runs past the pane.
fn many_findings_on_one_request() -> Snapshot {
    let mut s = fixture("wedged");
    let f = s
        .findings
        .iter()
        .find(|f| f.requests.iter().any(|r| r == "r0311"))
        .cloned()
        .expect("a finding names r0311");
    for k in 0..6 {
        let mut g = f.clone();
        g.kind = format!("extra_finding_{k}").into();
        s.findings.push(g);
    }
    s
}

#[test]
fn the_hops_of_a_request_are_read_by_scrolling() {
    let mut a = app_of(many_findings_on_one_request());
    press(&mut a, KeyCode::Char('2'));
    press(&mut a, KeyCode::Enter);
    let first = screen(&a);
    let hops = first
        .iter()
        .position(|l| l.starts_with("hops of r0311, stuck at decode"))
        .expect("hop detail open");
    let detail = first[hops..].join("\n");
    // The stuck hop marked, its state and age before its exchange id.
    assert!(
        detail.contains("! decode   wait   1m34s  1m34s     1.9KiB/0B  ex-0311-d"),
        "{detail}"
    );
    assert!(
        !detail.contains("extra_finding_5"),
        "below the fold: {detail}"
    );
    // The pane hides lines: its scrollbar says so.
    assert!(first[hops + 1].ends_with('█'), "{}", first[hops + 1]);
    press(&mut a, KeyCode::Char('j'));
    assert_eq!(a.detail_scroll(), 1, "j scrolls the hops, not the list");
    assert_eq!(a.selected(), 0);
    press(&mut a, KeyCode::Char('G'));
    let last = screen(&a).join("\n");
    assert!(last.contains("extra_finding_5"), "{last}");
    press(&mut a, KeyCode::Char('g'));
    assert_eq!(a.detail_scroll(), 0);
    press(&mut a, KeyCode::PageDown);
    assert_eq!(screen(&a).join("\n"), last, "pgdn reaches the last page");
}
