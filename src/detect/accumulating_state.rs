//! `accumulating_state` (warning).
//!
//! Fires when, over `accumulate_window_ms` (at least half of it covered, at least 6 points), a
//! component's established connections, CLOSE_WAIT sockets, open fds or threads grew by at
//! least their minimum (the last third's minimum exceeds the first third's maximum by that
//! much) and at least 80 % of the steps did not go down.
//!
//! What to do: something is opened and never released. CLOSE_WAIT means the peer hung up and
//! this process never closed: each leaked connection may be a forgotten request.
//!
//! Thresholds read: `accumulate_window_ms`, `accumulate_min_connections`,
//! `accumulate_min_close_wait`, `accumulate_min_fds`, `accumulate_min_threads`.

use super::secs;
use crate::clock::Millis;
use crate::correlate::{Model, View};
use crate::model::{Evidence, Finding, FindingKind, Severity};

/// `accumulating_state`: connections, CLOSE_WAIT sockets, fds or threads keep growing.
pub fn accumulating_state(m: &Model, v: &View) -> Vec<Finding> {
    let th = &m.thresholds;
    let mut out = Vec::new();
    for c in &m.topology().components {
        let Some(q) = m.counts(&c.id) else { continue };
        let from = v.now - th.detect.accumulate_window_ms;
        type Pick = fn(&crate::correlate::CountPoint) -> Option<u32>;
        let metrics: [(&str, Pick, u32); 4] = [
            (
                "established connections",
                |p| p.established,
                th.detect.accumulate_min_connections,
            ),
            (
                "CLOSE_WAIT sockets",
                |p| p.close_wait,
                th.detect.accumulate_min_close_wait,
            ),
            ("open fds", |p| p.fds, th.detect.accumulate_min_fds),
            ("threads", |p| p.threads, th.detect.accumulate_min_threads),
        ];
        for (what, pick, min_growth) in metrics {
            let pts: Vec<(Millis, u32)> = q
                .iter()
                .filter(|p| p.t_ms >= from && p.t_ms <= v.now)
                .filter_map(|p| pick(p).map(|x| (p.t_ms, x)))
                .collect();
            if pts.len() < 6 || pts[pts.len() - 1].0 - pts[0].0 < th.detect.accumulate_window_ms / 2
            {
                continue;
            }
            let third = pts.len() / 3;
            let early_max = pts[..third].iter().map(|p| p.1).max().unwrap_or(0);
            let late_min = pts[pts.len() - third..]
                .iter()
                .map(|p| p.1)
                .min()
                .unwrap_or(0);
            let rises = pts.windows(2).filter(|w| w[1].1 >= w[0].1).count();
            if late_min < early_max.saturating_add(min_growth) || rises * 10 < (pts.len() - 1) * 8 {
                continue;
            }
            let (t0, v0) = pts[0];
            let (t1, v1) = pts[pts.len() - 1];
            out.push(Finding {
                kind: FindingKind::AccumulatingState,
                severity: Severity::Warning,
                component: Some(c.id.clone()),
                role: Some(c.role),
                summary: format!("{} {what} grew from {v0} to {v1} in {} and keep growing", c.id, secs(t1 - t0)),
                requests: Vec::new(),
                evidence: vec![Evidence::new(
                    if what.contains("fds") || what == "threads" { "processes" } else { "sockets" },
                    format!("{what}: {v0} at start, {early_max} max early, {late_min} min late, {v1} now ({} points)", pts.len()),
                )],
                explanation: Some("Something is opened and never released: leaked connections (CLOSE_WAIT means the peer hung up and this process never closed), fds or threads. Each leaked connection may be a forgotten request.".into()),
            });
        }
    }
    out
}
