//! The overview's channel lines: connections between two engines that are not requests (a PD
//! bootstrap session, KV transfer streams), with bytes and silence. Channels inside one engine
//! (its ranks' collectives) are left to the report.

use super::Theme;
use crate::model::{ChannelFlow, Snapshot};
use ratatui::text::{Line, Span};

/// The top-level component `id` belongs to (itself, or its parent's, up the chain).
fn top_level<'a>(s: &'a Snapshot, id: &'a str) -> &'a str {
    let mut at = id;
    // A bounded walk: a parent cycle in a hostile snapshot must not spin.
    for _ in 0..8 {
        match s
            .components
            .iter()
            .find(|c| c.id == at)
            .and_then(|c| c.parent.as_deref())
        {
            Some(p) => at = p,
            None => break,
        }
    }
    at
}

fn between_engines(s: &Snapshot, f: &ChannelFlow) -> bool {
    f.from
        .as_deref()
        .is_some_and(|from| top_level(s, from) != top_level(s, &f.to))
}

/// `"channel  prefill@.. -> decode@.. kv_transfer  8 conn  86592/4352 B  idle 16 s"`
pub(super) fn channel_lines(s: &Snapshot, theme: Theme) -> Vec<(Line<'static>, bool)> {
    s.channels
        .iter()
        .filter(|f| between_engines(s, f))
        .map(|f| {
            let idle = f
                .idle_ms
                .map(|ms| format!("  idle {} s", ms / 1000))
                .unwrap_or_default();
            let line = Line::from(vec![
                Span::styled(format!("{:<8}", "channel"), theme.bold()),
                Span::raw(format!(
                    "{} -> {} {}",
                    f.from.as_deref().unwrap_or("?"),
                    f.to,
                    f.kind
                )),
                Span::styled(
                    format!(
                        "  {} conn  {}/{} B{idle}",
                        f.connections, f.bytes_in, f.bytes_out
                    ),
                    theme.dim(),
                ),
            ]);
            (line, false)
        })
        .collect()
}
