//! The TUI as a test reads it: a snapshot fed to the app, drawn once in a `TestBackend`.

use ratatui::backend::TestBackend;
use ratatui::Terminal;
use wedgewatch::model::Snapshot;
use wedgewatch::tui::{App, AppOptions, FeedFrame, SamplerHealth};

/// The first view's screen of `width` x `height` showing `snapshot`, as text.
pub fn overview(snapshot: &Snapshot, width: u16, height: u16) -> String {
    let mut app = App::new(AppOptions::default());
    app.ingest(FeedFrame {
        snapshot: snapshot.clone(),
        sampler: SamplerHealth::default(),
    });
    let mut t = Terminal::new(TestBackend::new(width, height)).expect("test terminal");
    t.draw(|f| app.render(f)).expect("draw");
    t.backend().to_string()
}
