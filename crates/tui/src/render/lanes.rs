//! A request's lanes: one row per hop (its exchange there), key facts first so that 80
//! columns keep them: the stuck mark, the hop, its state, age, silence and bytes; then the
//! exchange id, the component and the addresses, cut at the edge. Drawn in the Requests
//! tab's drill-in and under an expanded finding in the Overview.
//!
//! The hop a request is stuck at carries `!` as well as its colour: colour alone is lost
//! under `NO_COLOR`, on a monochrome terminal and in a pasted screen.

use super::{cut, fit, fmt_bytes, fmt_ms, rfit, Theme};
use crate::app::{lane_of, request_role, Derived, Lane, LANES};
use crate::model::{Request, RequestState, Snapshot, Verdict};
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};

/// The four-letter states of the lanes (the `?` legend explains them).
pub(super) fn short_state(s: RequestState) -> &'static str {
    match s {
        RequestState::WaitingFirstByte => "wait",
        RequestState::Streaming => "strm",
        RequestState::Stalled => "STAL",
        RequestState::Done => "done",
        RequestState::Idle => "idle",
        RequestState::Closed => "clsd",
    }
}

/// `1.4KiB/0B`: bytes in (the request) and out (the response) of one exchange.
pub(super) fn in_out(r: &Request) -> String {
    format!(
        "{}/{}",
        fmt_bytes(r.bytes_in as f64).replace(' ', ""),
        fmt_bytes(r.bytes_out as f64).replace(' ', "")
    )
}

/// Mark, hop, state, age, silence, in/out: what every width keeps (46 columns).
fn facts(mark: &str, hop: &str, state: &str, age: &str, silence: &str, bytes: &str) -> String {
    format!(
        "{}{} {} {} {} {}  ",
        fit(mark, 2),
        fit(hop, 8),
        fit(state, 5),
        rfit(age, 6),
        rfit(silence, 6),
        rfit(bytes, 13)
    )
}

/// The column heads of [`hop_rows`].
pub(super) fn heading(theme: Theme, w: usize) -> Line<'static> {
    let head = facts("", "HOP", "STATE", "AGE", "SILENT", "IN/OUT")
        + "EXCHANGE COMPONENT CLIENT -> SERVER";
    Line::styled(fit(&head, w), theme.head())
}

/// Whether `r` (in lane `lane`) is the leg its chain's logical request is stuck at: the
/// correlator's `stuck_leg`, else (snapshots that name only the role) its lane.
fn is_stuck_leg(s: &Snapshot, d: &Derived, chain: usize, r: &Request, lane: usize) -> bool {
    let Some(l) = d
        .chain_request
        .get(chain)
        .copied()
        .flatten()
        .and_then(|li| s.logical_requests.get(li))
    else {
        return false;
    };
    match &l.stuck_leg {
        Some(leg) => r.leg.as_ref() == Some(leg),
        None => l.verdict == Verdict::Stuck && l.stuck_role.map(lane_of) == Some(lane),
    }
}

/// One row per hop of `chain`, entry hop first.
pub(super) fn hop_rows(
    s: &Snapshot,
    d: &Derived,
    chain: usize,
    theme: Theme,
    w: usize,
) -> Vec<Line<'static>> {
    let members = d.chains.get(chain).map_or(&[][..], Vec::as_slice);
    members
        .iter()
        .filter_map(|&m| s.requests.get(m))
        .map(|r| hop_row(s, d, chain, r, theme, w))
        .collect()
}

fn hop_row(
    s: &Snapshot,
    d: &Derived,
    chain: usize,
    r: &Request,
    theme: Theme,
    w: usize,
) -> Line<'static> {
    let lane = lane_of(request_role(s, &d.component_index, r));
    let stuck = is_stuck_leg(s, d, chain, r, lane);
    let head = facts(
        if stuck { "!" } else { "" },
        LANES[lane],
        short_state(r.state),
        &fmt_ms(r.age_ms),
        &fmt_ms(r.idle_out_ms),
        &in_out(r),
    );
    let link = r
        .link_confidence
        .map_or(String::new(), |c| format!("  link {:.0}%", c * 100.0));
    let tail = format!(
        "{} {}  {} -> {}{link}",
        r.id, r.component, r.client, r.server
    );
    let style = theme.lane(&Lane {
        state: r.state,
        idle_out_ms: r.idle_out_ms,
        stuck,
    });
    let tail_w = w.saturating_sub(head.chars().count());
    Line::from(vec![
        Span::styled(cut(&head, w), style),
        Span::styled(fit(&tail, tail_w), style.remove_modifier(Modifier::BOLD)),
    ])
}
