//! Plays snapshot JSON files in the terminal UI: `cargo run --example tui_replay --
//! tests/fixtures/snapshots/wedged.json [more.json ...]`. `s` writes the snapshot on screen
//! as JSON into `$TMPDIR` (the real bundle writer is `wedgewatch`'s job). Used by the
//! pseudo-terminal smoke test (`tests/os/tui_pty.rs`).

use std::path::PathBuf;
use wedgewatch::model::Snapshot;
use wedgewatch::tui::{self, AppOptions, ReplayFeed};

fn main() -> anyhow::Result<()> {
    let mut snapshots = Vec::new();
    for arg in std::env::args().skip(1) {
        let text = std::fs::read_to_string(&arg).map_err(|e| anyhow::anyhow!("{arg}: {e}"))?;
        let s: Snapshot = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{arg}: not a snapshot: {e}"))?;
        snapshots.push(s);
    }
    if snapshots.is_empty() {
        anyhow::bail!("usage: tui_replay SNAPSHOT.json [SNAPSHOT.json ...]");
    }
    let mut feed = ReplayFeed::from_snapshots(snapshots);
    let opts = AppOptions {
        snapshot_writer: Some(Box::new(|s: &Snapshot| {
            let path: PathBuf = std::env::temp_dir().join("wedgewatch-tui-replay-snapshot.json");
            let json = serde_json::to_string_pretty(s).map_err(|e| e.to_string())?;
            std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path)
        })),
        ..AppOptions::from_env()
    };
    tui::run(&mut feed, opts)?;
    Ok(())
}
