//! How each source fared: ok, degraded or unavailable, and why.

use super::md::{details, esc, table};
use crate::model::{Snapshot, Status};

pub fn section(s: &Snapshot) -> String {
    let rows: Vec<Vec<String>> = s
        .sources
        .iter()
        .map(|(k, st)| {
            let status = match st.status {
                Status::Ok => "ok",
                Status::Degraded => "degraded",
                Status::Unavailable => "unavailable",
            };
            vec![
                esc(k),
                status.to_string(),
                esc(st.reason.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    let bad = s
        .sources
        .values()
        .filter(|st| st.status != Status::Ok)
        .count();
    let summary = if bad == 0 {
        "Sources: all ok".to_string()
    } else {
        format!("Sources: {bad} not ok")
    };
    details(&summary, &table(&["source", "status", "reason"], &rows))
}
