//! The stuck requests table, kept in its own file: which requests count as stuck is the
//! correlator's business (this section only lists them).

use super::md::{human_bytes, join, plain_cell as cell};
use crate::model::{RequestState, Snapshot};
use std::fmt::Write;

pub fn section(s: &Snapshot) -> String {
    let mut o = String::new();
    stuck_requests(&mut o, s);
    o
}

fn stuck_requests(o: &mut String, s: &Snapshot) {
    let stuck: Vec<_> = s
        .requests
        .iter()
        .filter(|r| {
            matches!(
                r.state,
                RequestState::Stalled | RequestState::WaitingFirstByte
            )
        })
        .collect();
    if !stuck.is_empty() {
        let _ = writeln!(o, "\n## Stuck requests\n");
        let _ = writeln!(
            o,
            "| request | component | state | age | in / out | no output for | client -> server | next hop |"
        );
        let _ = writeln!(o, "| --- | --- | --- | --- | --- | --- | --- | --- |");
        for r in stuck {
            let _ = writeln!(
                o,
                "| `{}` | `{}` | {} | {:.1} s | {} / {} | {:.1} s | {} -> {} | {} |",
                cell(&r.id),
                cell(&r.component),
                r.state.as_str(),
                r.age_ms / 1000.0,
                human_bytes(r.bytes_in),
                human_bytes(r.bytes_out),
                r.idle_out_ms / 1000.0,
                r.client,
                r.server,
                cell(&join(&r.links))
            );
        }
    }
}
