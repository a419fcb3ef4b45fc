//! The suspicion summary the adaptive stack policy reads ([`crate::model::Suspicion`]),
//! derived from one correlated view and its findings: which engines have a request silent
//! for a fraction of the wedge threshold, an idle GPU while requests are open, a queue that
//! does not drain, or a finding open that implicates their schedulers. The daemon derives it
//! once per detector pass (`daemon::pass`, with the view and findings the log and the
//! exporter read) and its stacks ticks read the newest; the sources never see the model.

use crate::config::Thresholds;
use crate::correlate::{ComponentState, Correlator, LegWitnesses, RequestView, View};
use crate::model::{
    Finding, FindingKind, RequestNote, RequestState, Role, Suspicion, SuspicionReason, Topology,
};

/// Findings that say an engine's schedulers are worth a look.
const IMPLICATING: [FindingKind; 9] = [
    FindingKind::WedgedRequest,
    FindingKind::KvTransferStalled,
    FindingKind::StalledStream,
    FindingKind::PdLegFailed,
    FindingKind::TokensUndelivered,
    FindingKind::BusyWithoutProgress,
    FindingKind::QueueNotDraining,
    FindingKind::SchedulerStuck,
    FindingKind::RanksDiverged,
];

/// The suspicion of the model at `now`: its view, the detectors over it, and [`derive`].
pub fn of_model(model: &Correlator, now: crate::clock::Millis) -> Suspicion {
    let view = model.view(now);
    let findings = crate::detect::run_all(model, &view);
    derive(model, &view, &findings)
}

/// Which engines are suspect in `view` of `model` (with `findings` run over it), and why.
pub fn derive(model: &Correlator, view: &View, findings: &[Finding]) -> Suspicion {
    let (topo, th) = (model.topology(), &model.thresholds);
    let mut s = Suspicion::none();
    silent_requests(model, view, &mut s);
    for (id, cs) in &view.components {
        let Some(engine) = engine_of(topo, id) else {
            continue;
        };
        idle_with_work_waiting(topo, view, engine, cs, th, &mut s);
    }
    for f in findings.iter().filter(|f| IMPLICATING.contains(&f.kind)) {
        if let Some(engine) = f.component.as_deref().and_then(|c| engine_of(topo, c)) {
            s.add(engine, SuspicionReason::FindingOpen(f.kind.clone()));
        }
    }
    s
}

/// Requests at an engine with no response byte for `suspect_silent_pct` of the wedge
/// threshold, or already of the soonest wedge verdict (`wedged_unanimous_ms`) while no
/// witness of the stuck kind it heads for saw work on it (`correlate::kind_witnesses`: a
/// wedge, a KV transfer stall, a failed prefill leg, undelivered tokens; its second dump is
/// due by that verdict; a busy engine is judged at the wedge threshold and need not be
/// dumped sooner); once the response started, likewise of the stall thresholds
/// (`stall_unanimous_ms`, `stall_after_ms`). Only while request states are current: a stale
/// socket table makes every request look silent.
fn silent_requests(model: &Correlator, view: &View, s: &mut Suspicion) {
    if !view.sockets_fresh {
        return;
    }
    let (topo, th) = (model.topology(), &model.thresholds);
    let soonest = th.sampling.silent_after(th.correlate.wedged_soonest_ms());
    let wedge = th.sampling.silent_after(th.correlate.wedged_after_ms);
    let stall_soonest = th.sampling.silent_after(th.correlate.stall_soonest_ms());
    let stall = th.sampling.silent_after(th.correlate.stall_after_ms);
    let witnesses = LegWitnesses::new(model, view);
    for (i, r) in view.requests.iter().enumerate() {
        let (limit, slow) = match r.state {
            RequestState::WaitingFirstByte => (soonest, wedge),
            RequestState::Stalled | RequestState::Streaming => (stall_soonest, stall),
            _ => continue,
        };
        if r.idle_out_ms < limit || view.logical_of(r).probe || waits_for_decode(view, r) {
            continue;
        }
        let Some(engine) = engine_of(topo, &r.x.component) else {
            continue;
        };
        if r.idle_out_ms < slow && saw_work(&witnesses, i, r.state) {
            continue;
        }
        let (request, silent_ms) = (note(r), r.idle_out_ms);
        s.add(
            engine,
            SuspicionReason::SilentRequest { request, silent_ms },
        );
    }
}

/// Whether a witness of the stuck kind leg `i` heads for saw work on it: not suspect before
/// the slow rule's threshold.
fn saw_work(witnesses: &LegWitnesses, i: usize, state: RequestState) -> bool {
    if state == RequestState::WaitingFirstByte {
        witnesses.of(i).saw_work()
    } else {
        witnesses.of_stream(i).is_some_and(|w| w.saw_work())
    }
}

/// An engine showing no work at all (no GPU work, forward time, tokens or busy scheduler)
/// while work waits at it: an idle GPU with a request open `suspect_gpu_idle_ms`, or
/// requests queued and none running.
fn idle_with_work_waiting(
    topo: &Topology,
    view: &View,
    engine: &str,
    cs: &ComponentState,
    th: &Thresholds,
    s: &mut Suspicion,
) {
    if cs.shows_work() {
        return;
    }
    if let Some((queued, _)) = cs.queued {
        // Held in a prefill's bootstrap queue, they wait for decode, not for this engine.
        let queued = queued - cs.pd_bootstrap.unwrap_or(0.0);
        if queued > 0.0 && cs.running.is_some_and(|(r, _)| r <= 0.0) {
            s.add(engine, SuspicionReason::QueueNotDraining { queued });
        }
    }
    if cs.gpu_activity != crate::correlate::GpuActivity::Idle || !view.sockets_fresh {
        return;
    }
    let oldest_open = view
        .requests
        .iter()
        .filter(|r| {
            matches!(
                r.state,
                RequestState::WaitingFirstByte | RequestState::Stalled
            )
        })
        // A health check or a scrape (ours too) is no work waiting.
        .filter(|r| !view.logical_of(r).probe && !waits_for_decode(view, r))
        .filter(|r| engine_of(topo, &r.x.component) == Some(engine))
        .max_by_key(|r| r.age_ms)
        .filter(|r| r.age_ms >= th.sampling.suspect_gpu_idle_ms);
    if let Some(r) = oldest_open {
        let (request, open_ms) = (note(r), r.age_ms);
        s.add(
            engine,
            SuspicionReason::GpuIdleWithOpenRequests { request, open_ms },
        );
    }
}

/// A prefill leg at a prefill that holds requests in its bootstrap queue: it waits for its
/// decode side to connect (the correlator's PD rule, `correlate::requests`), so it says
/// nothing against this engine.
fn waits_for_decode(view: &View, r: &RequestView) -> bool {
    r.x.role == Role::Prefill
        && view
            .components
            .get(&r.x.component)
            .and_then(|cs| cs.pd_bootstrap)
            .is_some_and(|n| n > 0.0)
}

/// How the log names `r`.
fn note(r: &RequestView) -> RequestNote {
    RequestNote {
        id: r.x.id.clone(),
        client: r.x.client.clone(),
        bytes_in: r.x.bytes_in,
        bytes_out: r.x.bytes_out,
    }
}

/// The engine a component belongs to: itself when it is one (prefill, decode, engine), else
/// the nearest engine among its parents (a scheduler's, a detokenizer's).
pub fn engine_of<'a>(topo: &'a Topology, id: &str) -> Option<&'a str> {
    let mut c = topo.component(id)?;
    // Parents form a short chain; a cycle in a hostile topology ends here.
    for _ in 0..8 {
        if matches!(c.role, Role::Prefill | Role::Decode | Role::Engine) {
            return Some(&c.id);
        }
        c = topo.component(c.parent.as_deref()?)?;
    }
    None
}
