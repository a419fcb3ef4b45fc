//! Blame past the hop a request waits at: two causes the correlator can prove for a leg that
//! waits for its first byte, each read by its own detector instead of `wedged_request`.
//!
//! - A PD decode leg waits for KV its prefill leg will never send: that leg already ended
//!   with an error (`pd_leg_failed`).
//! - The engine's scheduler generated tokens since the request arrived and not one byte left
//!   its HTTP server on any inference request (`tokens_undelivered`).
//!
//! Both stand whatever the engine's load: these requests cannot move at all. The rules are
//! `pd_leg_failed` and `tokens_undelivered` in docs/findings.md.

use super::exchange::{Exchange, HEADERS_BURST_MS};
use super::metrics::MetricsPoint;
use super::view::{is_probe_sized, View, MIN_INFERENCE_REQUEST_BYTES};
use super::Correlator;
use crate::clock::Millis;
use crate::model::{RequestState, Role};

/// Largest answer, in bytes, that can be an error (headers and a JSON error body). Only a
/// bound: what says "error" is the engine's own count of error statuses.
pub const ERROR_ANSWER_MAX_BYTES: u64 = 4096;

/// The engine's count of inference answers with an error status (4xx, 5xx).
pub const HTTP_ERRORS_KEY: &str = "http_errors_total";
/// The scheduler's own count of generated tokens (SGLang `realtime_tokens_total{mode=decode}`).
pub const SCHEDULER_TOKENS_KEY: &str = "scheduler_tokens_total";
/// The tokens the HTTP server's tokenizer manager received (SGLang `generation_tokens_total`).
pub const RECEIVED_TOKENS_KEY: &str = "generation_tokens_total";

/// Whom a stuck leg's finding blames.
#[derive(Debug, Clone, PartialEq)]
pub enum Blame {
    /// The hop it waits at (`wedged_request`, `stalled_stream`).
    Here,
    /// PD: the decode leg waits for KV from a prefill leg that failed (`pd_leg_failed`).
    PrefillFailed(FailedLeg),
    /// Tokens generated for it never left its engine's HTTP server (`tokens_undelivered`).
    Undelivered(Undelivered),
}

/// The prefill leg of a waiting decode leg, and how it failed.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedLeg {
    /// The prefill engine's component id.
    pub prefill: String,
    /// Index into `View::requests`; None when no socket sample saw the leg.
    pub leg: Option<usize>,
    pub how: LegFailure,
}

/// How a leg is known to have failed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LegFailure {
    /// Its connection closed before any answer.
    Closed,
    /// The engine counted this many more inference answers with an error status since the
    /// leg's request.
    ErrorStatus { n: f64 },
    /// The engine has answered this many inference requests with an error status since it
    /// started (the metrics do not reach back to the leg's request).
    ErrorsSinceStart { n: f64 },
}

/// Tokens an engine generated that its HTTP server never sent.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Undelivered {
    /// Tokens its scheduler generated since the request arrived.
    pub tokens: f64,
    /// Tokens its tokenizer manager received meanwhile, when counted.
    pub received: Option<f64>,
    /// The scrape that first showed the newest count: the scheduler generated none since.
    pub last_rise_ms: Millis,
}

/// The cause past its own hop of leaf `leg`, waiting for its first byte: a failed prefill
/// leg, else tokens generated and never sent (`last_sent`: the newest response byte of an
/// inference request at the leg's component, [`last_answer_byte`]).
pub(super) fn past_hop(
    m: &Correlator,
    v: &View,
    leg: usize,
    last_sent: Option<Millis>,
) -> Option<Blame> {
    if let Some(f) = failed_prefill_leg(m, v, leg) {
        return Some(Blame::PrefillFailed(f));
    }
    let r = &v.requests[leg];
    if !r.x.role.is_engine() {
        return None;
    }
    undelivered_since(m, &r.x.component, r.x.request_ms, v.now, last_sent).map(Blame::Undelivered)
}

/// The newest response byte an inference request at `comp` got (a request of inference
/// size, or an answer seen streaming).
pub(super) fn last_answer_byte(m: &Correlator, comp: &str) -> Option<Millis> {
    m.exchanges()
        .filter(|x| x.component == comp && is_inference_answer(x))
        .filter_map(|x| x.last_out_ms)
        .max()
}

fn is_inference_answer(x: &Exchange) -> bool {
    (x.bytes_in >= MIN_INFERENCE_REQUEST_BYTES && !is_probe_sized(x)) || x.seen_streaming()
}

/// A decode leg's prefill sibling (the leg the same router exchange sent to prefill) that
/// ended without a usable answer: closed before any byte, or a short answer in one burst
/// while the prefill engine counted error statuses. A leg seen closed while the engine
/// counted an error answered it: the real prefill answers a 400 in milliseconds and the real
/// router then closes the connection, often between two socket samples (no byte seen), so
/// the count says what the sockets missed.
pub fn failed_prefill_leg(m: &Correlator, v: &View, leg: usize) -> Option<FailedLeg> {
    let x = &v.requests[leg].x;
    if x.role != Role::Decode || x.answered() {
        return None;
    }
    let parent = v.request_by_num(x.parent?)?;
    let sibling = parent
        .x
        .links
        .iter()
        .filter_map(|&n| v.index_of_num(n))
        .map(|i| (i, &v.requests[i]))
        .find(|(_, c)| c.x.role == Role::Prefill);
    let Some((p, pr)) = sibling else {
        return unseen_prefill_leg(m, &parent.x.component, x.request_ms);
    };
    if View::is_outstanding(pr) {
        return None;
    }
    let how = match pr.state {
        RequestState::Closed => error_status(m, &pr.x).unwrap_or(LegFailure::Closed),
        RequestState::Done if error_sized(&pr.x) => error_status(m, &pr.x)?,
        _ => return None,
    };
    Some(FailedLeg {
        prefill: pr.x.component.clone(),
        leg: Some(p),
        how,
    })
}

/// A prefill leg no socket sample saw (answered and closed between two samples: a 400 takes
/// milliseconds): the one prefill engine `router` is configured with that counted an error
/// since `since`. Errors counted only since it started are too weak without the leg.
fn unseen_prefill_leg(m: &Correlator, router: &str, since: Millis) -> Option<FailedLeg> {
    let topo = m.topology();
    let mut failed = topo
        .edges
        .iter()
        .filter(|e| e.from == router && e.origin == crate::model::EdgeOrigin::Config)
        .filter(|e| {
            topo.component(&e.to)
                .is_some_and(|c| c.role == Role::Prefill)
        })
        .filter_map(|e| match errors_since(m, &e.to, since)? {
            how @ LegFailure::ErrorStatus { .. } => Some((e.to.clone(), how)),
            _ => None,
        });
    let (prefill, how) = failed.next()?;
    // Two prefills that both failed something: which one was this request's is unknown.
    if failed.next().is_some() {
        return None;
    }
    Some(FailedLeg {
        prefill,
        leg: None,
        how,
    })
}

/// An answer that can be an error: in one burst (not a stream), and no larger than an
/// error (its size is unknown when it was under way when first seen).
fn error_sized(x: &Exchange) -> bool {
    let one_burst = match (x.first_byte_ms, x.last_out_ms) {
        (Some(first), Some(last)) => last - first <= HEADERS_BURST_MS,
        _ => true,
    };
    one_burst && (answer_size_unknown(x) || x.bytes_out <= ERROR_ANSWER_MAX_BYTES)
}

/// First seen with its answer already sent: its sizes count only what came after
/// (`Conn::first_observation`), nothing here.
pub fn answer_size_unknown(x: &Exchange) -> bool {
    x.seen_mid_flight && x.bytes_in == 0
}

/// What the engine's error count says about the answer of `x`: the errors counted from its
/// last scrape before the request to its newest, else since it started; `None` when none.
fn error_status(m: &Correlator, x: &Exchange) -> Option<LegFailure> {
    errors_since(m, &x.component, x.request_ms)
}

/// The error answers engine `comp` counted from its last scrape at or before `since` to its
/// newest (or since it started, with no scrape that old); `None` when none.
fn errors_since(m: &Correlator, comp: &str, since: Millis) -> Option<LegFailure> {
    let hist = m.metrics_history(comp)?;
    // The count appears with the first error answered: its absence says none yet.
    if !hist.iter().any(|p| p.mapped.contains_key(HTTP_ERRORS_KEY)) {
        return None;
    }
    let mut scraped = hist.iter().filter(|p| !p.mapped.is_empty());
    let value = |p: &MetricsPoint| p.mapped.get(HTTP_ERRORS_KEY).copied().unwrap_or(0.0);
    let newest = value(scraped.next_back()?);
    let failure = match scraped.rfind(|p| p.t_ms <= since) {
        Some(before) => LegFailure::ErrorStatus {
            n: newest - value(before),
        },
        None => LegFailure::ErrorsSinceStart { n: newest },
    };
    match failure {
        LegFailure::ErrorStatus { n } | LegFailure::ErrorsSinceStart { n } if n >= 1.0 => {
            Some(failure)
        }
        _ => None,
    }
}

/// How many tokens engine `comp`'s scheduler generated after `since` that never left it: its
/// count rose from the baseline scrape (its last at or before `since`, else its first after:
/// a one-shot started after the request arrived) to the newest at `now`, no inference answer
/// left after the baseline (`last_sent`, [`last_answer_byte`]), and its tokenizer manager,
/// when it counts, received none since the baseline. `None` without a scrape of the count.
pub fn undelivered_since(
    m: &Correlator,
    comp: &str,
    since: Millis,
    now: Millis,
    last_sent: Option<Millis>,
) -> Option<Undelivered> {
    let hist = m.metrics_history(comp)?;
    let upto = |t: Millis, key: &str| {
        hist.iter()
            .rev()
            .filter(|p| p.t_ms <= t)
            .find_map(|p| p.mapped.get(key).map(|v| (p.t_ms, *v)))
    };
    let first_after = |t: Millis, key: &str| {
        hist.iter()
            .filter(|p| p.t_ms > t && p.t_ms <= now)
            .find_map(|p| p.mapped.get(key).map(|v| (p.t_ms, *v)))
    };
    let (baseline_ms, before) =
        upto(since, SCHEDULER_TOKENS_KEY).or_else(|| first_after(since, SCHEDULER_TOKENS_KEY))?;
    if last_sent.is_some_and(|t| t >= baseline_ms) {
        return None;
    }
    let (_, newest) = upto(now, SCHEDULER_TOKENS_KEY)?;
    let tokens = newest - before;
    let last_rise_ms = hist
        .iter()
        .filter(|p| p.t_ms > baseline_ms && p.t_ms <= now)
        .find(|p| p.mapped.get(SCHEDULER_TOKENS_KEY) == Some(&newest))
        .map_or(baseline_ms, |p| p.t_ms);
    let received = match (
        upto(now, RECEIVED_TOKENS_KEY),
        upto(baseline_ms, RECEIVED_TOKENS_KEY),
    ) {
        (Some((_, a)), Some((_, b))) => Some(a - b),
        _ => None,
    };
    // Tokens the tokenizer manager received were delivered (an answer the sockets missed).
    if received.is_some_and(|r| r >= 1.0) {
        return None;
    }
    (tokens >= 1.0).then_some(Undelivered {
        tokens,
        received,
        last_rise_ms,
    })
}
