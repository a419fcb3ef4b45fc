//! The terminal UI rendered into ratatui's `TestBackend` from fixed model fixtures
//! (`tests/fixtures/snapshots/{healthy,wedged,degraded}.json`), snapshotted with insta, plus
//! content assertions that must hold whatever the layout.
//!
//! Create/refresh snapshots: `INSTA_UPDATE=always cargo test --test tui_snapshots`.
#![cfg(feature = "tui")]

use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::style::Color;
use ratatui::Terminal;
use std::path::{Path, PathBuf};
use wedgewatch::model::Snapshot;
use wedgewatch::tui::{
    App, AppOptions, Feed, FeedFrame, FeedState, ReplayFeed, SamplerHealth, Tab,
};

const FIXTURES: [&str; 3] = ["healthy", "wedged", "degraded"];

fn fixture(name: &str) -> Snapshot {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/snapshots")
        .join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    serde_json::from_str(&text).expect("fixture is a Snapshot")
}

fn frame(name: &str) -> FeedFrame {
    FeedFrame {
        snapshot: fixture(name),
        sampler: SamplerHealth {
            lag_ms: Some(120),
            dropped_samples: if name == "degraded" { 3 } else { 0 },
            note: None,
        },
    }
}

fn app_with(name: &str, opts: AppOptions) -> App {
    let mut app = App::new(opts);
    app.ingest(frame(name));
    app
}

fn app(name: &str) -> App {
    app_with(name, AppOptions::default())
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn press(app: &mut App, c: char) {
    app.handle_key(key(KeyCode::Char(c)));
}

fn draw(app: &App, w: u16, h: u16) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(w, h)).expect("test terminal");
    t.draw(|f| app.render(f)).expect("draw");
    t
}

fn text(app: &App, w: u16, h: u16) -> String {
    draw(app, w, h).backend().to_string()
}

/// The buffer as plain rows (for content assertions).
fn rows(buf: &Buffer) -> Vec<String> {
    let w = buf.area.width as usize;
    buf.content
        .chunks(w.max(1))
        .map(|r| r.iter().map(|c| c.symbol()).collect::<String>())
        .collect()
}

fn screen_rows(app: &App, w: u16, h: u16) -> Vec<String> {
    rows(draw(app, w, h).backend().buffer())
}

fn tab_key(v: Tab) -> char {
    char::from(b'1' + v.index() as u8)
}

#[test]
fn every_view_every_fixture_at_80x24_and_200x50() {
    for name in FIXTURES {
        for v in Tab::ALL {
            let mut a = app(name);
            press(&mut a, tab_key(v));
            assert_eq!(a.tab(), v);
            for (w, h) in [(80u16, 24u16), (200, 50)] {
                let snap_name = format!("{name}_{}_{w}x{h}", v.title().to_lowercase());
                insta::assert_snapshot!(snap_name, text(&a, w, h));
            }
        }
    }
}

#[test]
fn tiny_and_zero_areas_do_not_panic() {
    for name in FIXTURES {
        for v in Tab::ALL {
            let mut a = app(name);
            press(&mut a, tab_key(v));
            press(&mut a, '?');
            for (w, h) in [
                (0, 0),
                (1, 1),
                (0, 10),
                (10, 0),
                (5, 3),
                (19, 5),
                (20, 6),
                (33, 9),
            ] {
                // TestBackend's Display cannot print a zero-width buffer; drawing is the test.
                let _ = draw(&a, w, h);
            }
            press(&mut a, '?');
            a.handle_key(key(KeyCode::Enter));
            for (w, h) in [(0, 0), (1, 1), (20, 6), (24, 7), (40, 8)] {
                let _ = draw(&a, w, h);
            }
        }
    }
    let empty = App::new(AppOptions::default());
    assert_eq!(text(&empty, 1, 1).trim(), "\"…\"");
}

#[test]
fn wedged_requests_view_lists_the_stuck_requests_first_blamed_on_decode() {
    let mut a = app("wedged");
    press(&mut a, '2');
    let ids = a.request_ids();
    assert_eq!(
        ids[..2],
        ["ex-0311-p", "ex-0312-p"],
        "stuck ones on top: {ids:?}"
    );
    assert_eq!(ids.len(), 4, "one row per request entering the stack");
    // Rows are named by logical request (one id per request, whatever its hops).
    let screen = screen_rows(&a, 200, 50);
    let first = screen
        .iter()
        .position(|l| l.contains("r0311 "))
        .expect("stuck request on screen");
    let second = screen
        .iter()
        .position(|l| l.contains("r0312 "))
        .expect("stuck request on screen");
    let done = screen
        .iter()
        .position(|l| l.contains("r0305 "))
        .expect("done request on screen");
    assert!(first < second && second < done);
    for row in [first, second] {
        assert!(screen[row].starts_with("! "), "{}", screen[row]);
        assert!(
            screen[row].contains("decode"),
            "stuck hop named: {}",
            screen[row]
        );
        assert!(screen[row].contains("1m34s") || screen[row].contains("1m33s"));
    }
    assert!(screen.iter().any(|l| l.contains("4 requests (2 stuck)")));
    // The narrow screen still names the hop.
    let narrow = screen_rows(&a, 80, 24);
    assert!(narrow
        .iter()
        .any(|l| l.contains("r0311") && l.contains("decode")));
}

#[test]
fn healthy_requests_view_has_nothing_stuck() {
    let mut a = app("healthy");
    press(&mut a, '2');
    let screen = screen_rows(&a, 200, 50);
    assert!(screen.iter().any(|l| l.contains("(0 stuck)")));
    assert!(!screen.iter().any(|l| l.starts_with("! ")));
}

#[test]
fn requests_drill_in_shows_every_hop_and_the_finding() {
    let mut a = app("wedged");
    press(&mut a, '2');
    a.handle_key(key(KeyCode::Enter));
    assert!(a.detail_open());
    let screen = screen_rows(&a, 160, 40);
    for hop in ["ex-0311-p", "ex-0311-r", "ex-0311-pf", "ex-0311-d"] {
        assert!(screen.iter().any(|l| l.contains(hop)), "{hop} missing");
    }
    assert!(screen.iter().any(|l| l.contains("CRIT wedged_request")));
    insta::assert_snapshot!("wedged_requests_detail_160x40", text(&a, 160, 40));
}

#[test]
fn diff_view_names_the_added_env_var() {
    let mut a = app("wedged");
    press(&mut a, '7');
    let screen = screen_rows(&a, 80, 24);
    // Below the header (whose cause line names it too).
    let row = screen
        .iter()
        .position(|l| l.contains("decode@127.0.0.1:31012   env"))
        .expect("env var named at 80x24");
    assert!(screen[row].contains("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS"));
    assert!(screen[row].contains("decode@127.0.0.1:31012"));
    assert!(
        screen[row + 1].contains("(absent) -> 1"),
        "{}",
        screen[row + 1]
    );
    let wide = screen_rows(&a, 200, 50);
    let row = wide
        .iter()
        .find(|l| l.starts_with("decode@") && l.contains("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS"))
        .expect("env var named at 200x50");
    assert!(
        row.contains("decode@127.0.0.1:31012") && row.contains("(absent) -> 1"),
        "{row}"
    );
    let mut healthy = app("healthy");
    press(&mut healthy, '7');
    let healthy = screen_rows(&healthy, 80, 24);
    assert!(healthy
        .iter()
        .any(|l| l.contains("no changes against the baseline")));
}

#[test]
fn overview_shows_topology_and_findings_most_severe_first() {
    let a = app("wedged");
    let screen = screen_rows(&a, 200, 50);
    let joined = screen.join("\n");
    for c in [
        "proxy@127.0.0.1:8080",
        "router@127.0.0.1:30000",
        "prefill@127.0.0.1:31001",
        "decode@127.0.0.1:31012",
        "scheduler@decode@127.0.0.1:31012",
        "GPU1 NVIDIA H100",
    ] {
        assert!(joined.contains(c), "{c} missing from topology");
    }
    // The decode scheduler: loop idle in every dump.
    assert!(screen
        .iter()
        .any(|l| l.contains("scheduler@decode@127.0.0.1:31012") && l.contains("loop idle 3/3")));
    let crit = screen
        .iter()
        .position(|l| l.contains("CRIT wedged_request"));
    let warn = screen
        .iter()
        .position(|l| l.contains("WARN config_changed"));
    assert!(crit.is_some() && warn.is_some() && crit < warn, "{joined}");
}

/// A PD pair's channels (decode's bootstrap session to prefill, prefill's KV stream into
/// decode's scheduler) show in the topology as themselves; a channel inside one engine (its
/// ranks' collective) does not.
#[test]
fn overview_shows_the_channels_between_engines() {
    use wedgewatch::model::{ChannelFlow, ChannelKind};
    let mut s = fixture("wedged");
    let flow = |from: &str, to: &str, kind, bytes_in, bytes_out, idle_ms| ChannelFlow {
        from: Some(from.into()),
        to: to.into(),
        kind,
        connections: 1,
        bytes_in,
        bytes_out,
        idle_ms: Some(idle_ms),
    };
    s.channels = vec![
        flow(
            "scheduler@decode@127.0.0.1:31012",
            "prefill@127.0.0.1:31001",
            ChannelKind::Bootstrap,
            221,
            203,
            283_000,
        ),
        flow(
            "scheduler@decode@127.0.0.1:31012",
            "decode@127.0.0.1:31012",
            ChannelKind::Internal,
            7_100_000,
            14_300_000,
            4,
        ),
    ];
    let mut a = App::new(AppOptions::default());
    a.ingest(FeedFrame {
        snapshot: s,
        sampler: SamplerHealth {
            lag_ms: Some(120),
            dropped_samples: 0,
            note: None,
        },
    });
    let joined = screen_rows(&a, 200, 50).join("\n");
    assert!(
        joined.contains(
            "channel scheduler@decode@127.0.0.1:31012 -> prefill@127.0.0.1:31001 bootstrap  1 conn  221/203 B  idle 283 s"
        ),
        "{joined}"
    );
    assert!(!joined.contains("internal"), "{joined}");
}

#[test]
fn enter_expands_a_finding_to_its_evidence_and_explanation() {
    let mut a = app("wedged");
    let before = screen_rows(&a, 120, 40).join("\n");
    assert!(!before.contains("[gpu] GPU1 util 0 %"));
    a.handle_key(key(KeyCode::Enter));
    let after = screen_rows(&a, 120, 40).join("\n");
    assert!(after.contains("[gpu] GPU1 util 0 %"), "{after}");
    assert!(after.contains("why: The decode engine holds"));
    insta::assert_snapshot!("wedged_overview_expanded_120x40", text(&a, 120, 40));
    a.handle_key(key(KeyCode::Esc));
    a.handle_key(key(KeyCode::Enter));
    assert!(!screen_rows(&a, 120, 40).join("\n").contains("[gpu] GPU1"));
}

#[test]
fn degraded_sources_are_named_with_their_reason() {
    let a = app("degraded");
    let header = screen_rows(&a, 200, 50)[..6].join("\n");
    assert!(
        header.contains("stacks unavailable: py-spy not found"),
        "{header}"
    );
    assert!(header.contains("gpu unavailable: NVML not loaded"));
    assert!(header.contains("metrics degraded: decode@127.0.0.1:31012 /metrics timed out"));
    assert!(header.contains("dropped 3"));
    let mut a = a;
    press(&mut a, '4');
    let gpu = screen_rows(&a, 80, 24).join("\n");
    assert!(gpu.contains("gpu source unavailable: NVML not loaded"));
    assert!(
        gpu.contains("unknown"),
        "verdict unknown, never idle: {gpu}"
    );
    assert!(!gpu.contains(" idle"));
    press(&mut a, '3');
    let threads = screen_rows(&a, 80, 24).join("\n");
    assert!(threads.contains("stacks unavailable: py-spy not found"));
    press(&mut a, '6');
    let metrics = screen_rows(&a, 120, 30).join("\n");
    assert!(metrics.contains("WARN decode /metrics did not answer within 2000 ms"));
    assert!(metrics.contains("no metrics this window from: decode@127.0.0.1:31012"));
}

#[test]
fn wedged_gpu_and_threads_views_show_idle_evidence() {
    let mut a = app("wedged");
    press(&mut a, '4');
    let gpu = screen_rows(&a, 120, 40).join("\n");
    assert!(
        gpu.contains("GPU1 NVIDIA H100 80GB HBM3  activity idle"),
        "{gpu}"
    );
    // Each engine's verdict on its own line.
    assert!(
        gpu.lines()
            .any(|l| l.starts_with("  decode@127.0.0.1:31012 ") && l.trim_end().ends_with(" idle")),
        "{gpu}"
    );
    press(&mut a, '3');
    let screen = screen_rows(&a, 120, 40);
    let row = screen
        .iter()
        .find(|l| l.contains("scheduler@decode") && l.contains("MainThread"))
        .expect("decode scheduler main thread listed");
    assert!(
        row.contains("idle") && row.trim_end().ends_with("iii"),
        "{row}"
    );
    // Select it and see its frames.
    let pos = a.derived().threads.iter().position(|&i| {
        let t = &a
            .snapshot()
            .map(|s| s.threads[i].clone())
            .expect("snapshot");
        t.tid == 4330
    });
    for _ in 0..pos.expect("thread listed") {
        press(&mut a, 'j');
    }
    let screen = screen_rows(&a, 120, 40).join("\n");
    assert!(screen
        .contains("event_loop_overlap_disagg_decode (sglang/srt/disaggregation/decode.py:911)"));
}

#[test]
fn metrics_and_sockets_views_show_rates_and_silence() {
    let mut a = app("wedged");
    press(&mut a, '6');
    let m = screen_rows(&a, 120, 50);
    let fwd = m
        .iter()
        .find(|l| l.contains("forward_seconds_total"))
        .expect("forward seconds listed");
    assert!(
        fwd.contains("812.5") && fwd.contains(" 0 "),
        "value and rate: {fwd}"
    );
    assert!(!m
        .iter()
        .any(|l| l.trim_start().starts_with("forward_seconds_total_rate")));
    press(&mut a, '5');
    let s = screen_rows(&a, 160, 40);
    let first_conn = s
        .iter()
        .position(|l| l.contains("waiting_first_byte"))
        .expect("connections listed");
    assert!(
        s[first_conn].contains("1m34s"),
        "most silent first: {}",
        s[first_conn]
    );
    assert!(s
        .iter()
        .any(|l| l.contains("ESTABLISHED 3") && l.contains("decode@")));
}

#[test]
fn no_color_means_no_colour_at_all() {
    let has_colour = |buf: &Buffer| {
        buf.content
            .iter()
            .any(|c| c.fg != Color::Reset || c.bg != Color::Reset)
    };
    for name in FIXTURES {
        for v in Tab::ALL {
            let mut coloured = app(name);
            let mut plain = app_with(
                name,
                AppOptions {
                    no_color: true,
                    ..AppOptions::default()
                },
            );
            press(&mut coloured, tab_key(v));
            press(&mut plain, tab_key(v));
            press(&mut plain, 'f');
            let t = draw(&plain, 120, 40);
            assert!(
                !has_colour(t.backend().buffer()),
                "{name} {v:?} has colour under NO_COLOR"
            );
            // Same text either way.
            press(&mut plain, 'f');
            press(&mut coloured, 'f');
            press(&mut coloured, 'f');
            assert_eq!(text(&plain, 120, 40), text(&coloured, 120, 40));
        }
    }
    let t = draw(&app("wedged"), 120, 40);
    assert!(has_colour(t.backend().buffer()), "colours on by default");
}

#[test]
fn header_shows_frozen_and_replay_position() {
    let mut a = app("wedged");
    press(&mut a, 'f');
    a.ingest(frame("healthy"));
    a.set_feed_state(FeedState::Replay(wedgewatch::tui::ReplayStatus {
        position: 1,
        len: 40,
        paused: true,
        speed: 2.0,
    }));
    let screen = screen_rows(&a, 120, 30);
    assert!(screen[0].contains("REPLAY 2/40 paused x2"), "{}", screen[0]);
    assert!(screen[0].contains("FROZEN (+1 held)"));
    assert!(screen[0].contains("at 12:14:07"), "still the frozen frame");
    insta::assert_snapshot!("wedged_frozen_replay_header_120x30", text(&a, 120, 30));
    a.set_feed_state(FeedState::Disconnected("sampler stopped sending".into()));
    assert!(screen_rows(&a, 120, 30)[0].contains("DISCONNECTED"));
}

#[test]
fn help_overlay_lists_every_key() {
    let mut a = app("wedged");
    press(&mut a, '?');
    let screen = screen_rows(&a, 80, 24).join("\n");
    for k in [
        "tab / shift-tab",
        "1 … 8",
        "enter",
        "esc",
        "/",
        "freeze",
        "snapshot",
        "quit",
        "+ -",
    ] {
        assert!(screen.contains(k), "{k} missing from help");
    }
    insta::assert_snapshot!("help_80x24", text(&a, 80, 24));
}

#[test]
fn snapshot_key_writes_a_bundle_and_shows_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().to_path_buf();
    let opts = AppOptions {
        snapshot_writer: Some(Box::new(move |s: &Snapshot| {
            let path = out.join("wedgewatch-snapshot.json");
            let json = serde_json::to_string_pretty(s).map_err(|e| e.to_string())?;
            std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok::<PathBuf, String>(path)
        })),
        ..AppOptions::default()
    };
    let mut a = app_with("wedged", opts);
    press(&mut a, 's');
    let written = dir.path().join("wedgewatch-snapshot.json");
    let back: Snapshot =
        serde_json::from_str(&std::fs::read_to_string(&written).expect("bundle written"))
            .expect("bundle is a snapshot");
    assert_eq!(back, fixture("wedged"));
    let screen = text(&a, 100, 24);
    assert!(screen.contains("snapshot written: "));
    let dir_str = dir.path().display().to_string();
    insta::with_settings!({filters => vec![(regex_escape(&dir_str).as_str(), "[TMPDIR]")]}, {
        insta::assert_snapshot!("wedged_snapshot_written_100x24", screen);
    });
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if "\\.+*?()|[]{}^$".contains(c) {
                vec!['\\', c]
            } else {
                vec![c]
            }
        })
        .collect()
}

#[test]
fn sparklines_follow_the_history() {
    let mut a = App::new(AppOptions::default());
    for (util, power) in [
        (0.0, 70.0),
        (30.0, 200.0),
        (60.0, 350.0),
        (90.0, 520.0),
        (0.0, 71.0),
    ] {
        let mut s = fixture("healthy");
        s.gpus[1].util_pct = Some(util);
        let decode = s
            .components
            .iter_mut()
            .find(|c| c.id == "decode@127.0.0.1:31012")
            .expect("decode component");
        decode
            .sockets
            .insert("CLOSE_WAIT".to_string(), (power / 100.0) as u32);
        s.gpus[1].power_w = Some(power);
        a.ingest(FeedFrame::new(s));
    }
    press(&mut a, '4');
    let screen = screen_rows(&a, 120, 40);
    let gpu1 = screen
        .iter()
        .position(|l| l.starts_with("GPU1"))
        .expect("GPU1");
    let util = &screen[gpu1 + 1];
    assert!(util.contains("▁▃▅▇▁"), "util sparkline: {util}");
    insta::assert_snapshot!("healthy_gpu_history_120x40", text(&a, 120, 40));
    press(&mut a, '5');
    let screen = screen_rows(&a, 140, 40);
    let decode = screen
        .iter()
        .find(|l| l.contains("decode@127.0.0.1:31012") && l.contains("CLOSE_WAIT"))
        .expect("decode socket counts");
    assert!(decode.contains("CLOSE_WAIT 0 ▁▄▅█▁"), "{decode}");
}

#[test]
fn replay_feed_drives_the_app() {
    let frames = vec![frame("healthy"), frame("wedged"), frame("degraded")];
    let mut feed = ReplayFeed::new(frames);
    let mut a = App::new(AppOptions::default());
    let mut now = 1_000_000;
    // The recorded gaps are ~33 min and ~48 min; at 64x they pass in under a minute.
    for _ in 0..6 {
        feed.control(wedgewatch::tui::ReplayCommand::Faster, now);
    }
    let mut seen = Vec::new();
    for _ in 0..200 {
        if let Some(f) = feed.latest(now) {
            seen.push(f.snapshot.taken_at.clone());
            a.ingest(f);
        }
        a.set_feed_state(feed.state());
        now += 1000;
    }
    assert_eq!(seen.len(), 3, "{seen:?}");
    let screen = screen_rows(&a, 120, 30);
    assert!(
        screen[0].contains("REPLAY 3/3 playing x64"),
        "{}",
        screen[0]
    );
    // Step back pauses and shows the previous frame.
    feed.control(wedgewatch::tui::ReplayCommand::Step(-1), now);
    if let Some(f) = feed.latest(now) {
        a.ingest(f);
    }
    a.set_feed_state(feed.state());
    let screen = screen_rows(&a, 120, 30);
    assert!(screen[0].contains("REPLAY 2/3 paused"), "{}", screen[0]);
    assert!(screen[0].contains("at 12:14:07"));
}

#[test]
fn fixtures_are_the_story_they_claim() {
    let w = fixture("wedged");
    let waiting: Vec<_> = w
        .requests
        .iter()
        .filter(|r| r.state == wedgewatch::model::RequestState::WaitingFirstByte)
        .collect();
    assert_eq!(waiting.len(), 8, "2 requests at each of 4 hops");
    assert!(waiting.iter().all(|r| r.idle_out_ms > 90_000.0));
    assert!(w.gpus.iter().all(|g| g.util_pct == Some(0.0)));
    assert!(w
        .threads
        .iter()
        .filter(|t| t.name.as_deref() == Some("MainThread"))
        .all(|t| t.states_over_window.iter().all(|s| s == "idle")));
    assert!(w
        .config_changed
        .iter()
        .any(|c| c.key.as_deref() == Some("SGLANG_DECODE_PREALLOC_SPLIT_TOKENS")));
    let d = fixture("degraded");
    assert!(d.gpus.is_empty() && d.threads.is_empty());
    assert_eq!(
        d.sources.get("metrics").map(|s| s.status),
        Some(wedgewatch::model::Status::Degraded)
    );
}

#[test]
fn replay_header_says_what_reading_the_recording_skipped() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/recordings/wedged-decode.rec");
    let mut bytes = std::fs::read(fixture).expect("fixture");
    // Damage one record in the middle (its checksum no longer matches).
    let mid = bytes.len() / 2;
    bytes[mid] = if bytes[mid] == b'0' { b'1' } else { b'0' };
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("damaged.rec");
    std::fs::write(&path, &bytes).expect("write");
    let rec = wedgewatch::record::Recording::open(&path).expect("open");
    let (frames, stats) =
        wedgewatch::attach::replay_frames_counted(&rec, 1000, Default::default()).expect("replay");
    let snaps = frames
        .into_iter()
        .map(|p| wedgewatch::snapshot::assemble(p, &Default::default()))
        .collect();
    let mut feed = ReplayFeed::with_note(snaps, stats.brief());
    let mut a = App::new(AppOptions::default());
    a.ingest(feed.latest(0).expect("a frame"));
    let header = &screen_rows(&a, 200, 30)[0];
    assert!(
        header.contains("recording damaged: skipped 1 record(s)"),
        "{header}"
    );
}
