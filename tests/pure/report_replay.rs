//! The bug-report loop in the UI: a bundle (as `snapshot -o` writes it, as a bug report
//! carries it) opened as a still frame, the way `wedgewatch tui --replay DIR` does, rendered
//! through `TestBackend` at 80x24: every view shows the incident, the header says it is a
//! replay of one frame and a snapshot, and the frame stays (no timeline to run out of).
#![cfg(feature = "tui")]

use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use std::path::Path;
use wedgewatch::tui::{App, AppOptions, Feed, ReplayFeed, STILL_NOTE};

fn bundle(dir: &Path) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/snapshots/wedged.json");
    let snap = wedgewatch::snapshot::read_snapshot(&path).expect("fixture");
    wedgewatch::snapshot::write_bundle(
        &snap,
        &Default::default(),
        dir,
        wedgewatch::snapshot::Overwrite::Refuse,
    )
    .expect("bundle");
}

fn screen(app: &App) -> String {
    let mut t = Terminal::new(TestBackend::new(80, 24)).expect("terminal");
    t.draw(|f| app.render(f)).expect("draw");
    let buf = t.backend().buffer().clone();
    buf.content
        .chunks(buf.area.width as usize)
        .map(|r| r.iter().map(|c| c.symbol()).collect::<String>())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_bundle_opens_as_a_still_frame_with_every_view() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("bundle");
    bundle(&dir);
    // what `tui --replay DIR` reads: the bundle's snapshot.json
    let snap = wedgewatch::snapshot::read_snapshot(&dir).expect("bundle readable");
    let mut feed = ReplayFeed::still(snap);
    let mut app = App::new(AppOptions::default());
    let frame = feed.latest(0).expect("the one frame");
    assert_eq!(frame.sampler.note.as_deref(), Some(STILL_NOTE));
    app.ingest(frame);
    app.set_feed_state(feed.state());
    assert!(feed.latest(3_600_000).is_none(), "a still frame stays");

    let overview = screen(&app);
    let header = overview.lines().next().unwrap_or_default();
    assert!(header.contains("REPLAY 1/1"), "{header}");
    assert!(overview.contains("wedged_request"), "{overview}");
    // each view of the incident: requests, threads, GPU, sockets, metrics, diff
    let want = [
        ('2', "r0311"),
        ('3', "scheduler"),
        ('4', "GPU"),
        ('5', "decode"),
        ('6', "decode"),
        ('7', "SGLANG_DECODE_PREALLOC"),
    ];
    for (key, text) in want {
        app.handle_key(KeyEvent::new(KeyCode::Char(key), KeyModifiers::NONE));
        let s = screen(&app);
        assert!(s.contains(text), "view {key} lacks {text:?}:\n{s}");
        assert!(s.lines().next().unwrap_or_default().contains("REPLAY 1/1"));
    }
}
