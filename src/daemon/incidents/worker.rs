//! The thread that keeps incidents: it follows the finding log's events
//! ([`super::super::log`]), writes a bundle when a critical finding opens and says how long it
//! lasted and what closed it when the incident's last finding closes. Fed through a bounded
//! queue, so writing a bundle never holds up the detector pass. One incident per component at a
//! time: critical findings of a component with an open incident join it (`joined`).

use super::bundle::{self, Source};
use super::names::dir_name;
use super::record::{ClosedBy, Incident};
use super::store::{self, Bounds};
use super::IncidentPolicy;
use crate::clock::{Clock, Millis};
use crate::daemon::log::Event;
use crate::daemon::{lock, Shared};
use crate::model::{FindingKind, Severity};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Passes of events waiting for the thread, at most (a pass sends one batch).
const QUEUE: usize = 64;
/// Incidents of one second, kind and component, at most (numbered `-2`, `-3`, ...).
const MAX_SAME_NAME: u32 = 100;

/// Where the worker sends its events (cheap to clone; the thread ends when every copy is
/// dropped, after closing what is open as `daemon_stopped`: [`Stopped`] says when).
#[derive(Debug, Clone)]
pub struct Incidents {
    tx: SyncSender<Vec<Event>>,
}

impl Incidents {
    /// Starts the thread keeping incidents in `dir` (verified by the caller), cut from the
    /// recording in `recording` when there is one.
    pub fn start(
        dir: PathBuf,
        policy: IncidentPolicy,
        recording: Option<PathBuf>,
        shared: Arc<Mutex<Shared>>,
        clock: Arc<dyn Clock>,
    ) -> std::io::Result<(Incidents, Stopped)> {
        let (tx, rx) = sync_channel(QUEUE);
        let (done, stopped) = sync_channel(0);
        let w = Worker {
            dir,
            policy,
            recording,
            shared,
            clock,
            open: BTreeMap::new(),
        };
        std::thread::Builder::new()
            .name("incidents".into())
            .spawn(move || {
                w.run(rx);
                drop(done);
            })?;
        Ok((Incidents { tx }, Stopped(stopped)))
    }

    /// Hands a pass's events to the thread; without a place in its queue they are dropped
    /// and said (a disk so slow that 64 passes wait must not stop the pass).
    pub fn tell(&self, events: &[Event]) {
        let findings: Vec<Event> = events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    Event::FindingOpened { .. }
                        | Event::FindingChanged { .. }
                        | Event::FindingClosed { .. }
                )
            })
            .cloned()
            .collect();
        if findings.is_empty() {
            return;
        }
        if let Err(TrySendError::Full(_)) = self.tx.try_send(findings) {
            tracing::warn!(
                "incidents: the bundle writer is behind; these findings' events were dropped"
            );
        }
    }
}

/// Says when the thread has ended (every [`Incidents`] dropped, what was open closed).
#[derive(Debug)]
pub struct Stopped(Receiver<()>);

impl Stopped {
    /// Waits for the thread's end, at most `bound` (blocking); whether it ended.
    pub fn wait(self, bound: std::time::Duration) -> bool {
        matches!(
            self.0.recv_timeout(bound),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) | Ok(())
        )
    }
}

/// An open incident: its record, where it is kept, and its findings still open.
struct Open {
    path: PathBuf,
    incident: Incident,
    kinds: BTreeSet<FindingKind>,
}

struct Worker {
    dir: PathBuf,
    policy: IncidentPolicy,
    recording: Option<PathBuf>,
    shared: Arc<Mutex<Shared>>,
    clock: Arc<dyn Clock>,
    /// By the component's id as the model knows it (unredacted: it is compared, never written).
    open: BTreeMap<Option<String>, Open>,
}

impl Worker {
    fn run(mut self, rx: Receiver<Vec<Event>>) {
        self.tidy();
        for events in rx {
            for e in &events {
                self.on(e);
            }
        }
        let now = self.clock.now_ms();
        for (_, o) in std::mem::take(&mut self.open) {
            self.finish(o, ClosedBy::DaemonStopped, Some(now), None);
        }
    }

    /// What a daemon that stopped left: staging directories, and incidents still open.
    fn tidy(&self) {
        let swept = store::sweep_staging(&self.dir);
        if swept > 0 {
            tracing::info!(
                swept,
                "incidents: removed bundles a stopped daemon left half written"
            );
        }
        let kept = store::list(&self.dir).unwrap_or_default();
        for k in kept.into_iter().filter(|k| k.incident.is_open()) {
            let o = Open {
                path: k.path,
                incident: k.incident,
                kinds: BTreeSet::new(),
            };
            let why = "the daemon that kept it stopped before it closed".to_string();
            self.finish(o, ClosedBy::DaemonStopped, None, Some(why));
        }
    }

    fn on(&mut self, e: &Event) {
        match e {
            Event::FindingOpened {
                kind,
                severity: Severity::Critical,
                component,
                summary,
                ..
            }
            | Event::FindingChanged {
                kind,
                to: Severity::Critical,
                component,
                summary,
                ..
            } => self.opened(FindingKind::from(kind.as_str()), component, summary),
            Event::FindingClosed {
                kind, component, ..
            } => self.closed(&FindingKind::from(kind.as_str()), component),
            _ => {}
        }
    }

    fn opened(&mut self, kind: FindingKind, component: &Option<String>, summary: &str) {
        if let Some(o) = self.open.get_mut(component) {
            if o.kinds.insert(kind.clone()) && kind != o.incident.kind {
                o.incident.joined.push(kind);
                save(&o.path, &o.incident, None);
            }
            return;
        }
        let now = self.clock.now_ms();
        let shown = component.as_deref().map(crate::logging::redact_line);
        let mut incident = Incident::opened(
            kind.clone(),
            shown.clone(),
            crate::logging::redact_line(summary),
            now,
        );
        match self.write(&mut incident, now) {
            Ok(path) => {
                let kinds = BTreeSet::from([kind]);
                self.open.insert(
                    component.clone(),
                    Open {
                        path,
                        incident,
                        kinds,
                    },
                );
            }
            Err(e) => tracing::error!(
                kind = %incident.kind,
                component = %shown.as_deref().unwrap_or("-"),
                "incident bundle not written: {e}"
            ),
        }
    }

    /// Writes a new incident's bundle, logs it, and keeps the bounds.
    fn write(&self, incident: &mut Incident, now: Millis) -> crate::error::Result<PathBuf> {
        let started = std::time::Instant::now();
        let snapshot = crate::daemon::answer::snapshot_now(&self.shared, None, now);
        let name = self.free_name(incident)?;
        let source = self.recording.as_deref().map(|dir| Source {
            dir,
            since_ms: now - self.policy.before_ms,
            until_ms: now,
            max_bytes: self.policy.max_bytes / 4,
        });
        let path = bundle::write_new(&self.dir, &name, incident, &snapshot, source)?;
        let bytes = store::list(&self.dir)?
            .iter()
            .find(|k| k.name == name)
            .map_or(0, |k| k.bytes);
        tracing::info!(
            kind = %incident.kind,
            component = %incident.component.as_deref().unwrap_or("-"),
            bytes,
            took_ms = started.elapsed().as_millis() as u64,
            "incident bundle written to {}",
            path.display()
        );
        self.prune(&name);
        Ok(path)
    }

    /// A name no incident in the directory has (incidents of one second, kind and component
    /// are numbered).
    fn free_name(&self, i: &Incident) -> crate::error::Result<String> {
        (1..=MAX_SAME_NAME)
            .map(|n| dir_name(i.opened_ms, &i.kind, i.component.as_deref(), n))
            .find(|n| std::fs::symlink_metadata(self.dir.join(n)).is_err())
            .ok_or_else(|| crate::error::Error::Other("no free incident name".into()))
    }

    fn prune(&self, spare: &str) {
        let bounds = Bounds {
            keep: self.policy.keep,
            max_bytes: self.policy.max_bytes,
        };
        match store::prune(&self.dir, bounds, spare) {
            Ok(removed) => {
                for (k, how) in removed {
                    let kept_foreign = how == crate::safe_fs::staged::Removed::KeptForeign;
                    tracing::info!(
                        keep = bounds.keep,
                        max_bytes = bounds.max_bytes,
                        "incident removed to stay within bounds: {}{}",
                        k.path.display(),
                        if kept_foreign {
                            " (its directory stays: it holds files wedgewatch did not write)"
                        } else {
                            ""
                        }
                    );
                }
            }
            Err(e) => tracing::warn!("incidents: pruning failed: {e}"),
        }
    }

    fn closed(&mut self, kind: &FindingKind, component: &Option<String>) {
        let Some(o) = self.open.get_mut(component) else {
            return;
        };
        if !o.kinds.remove(kind) || !o.kinds.is_empty() {
            return;
        }
        let Some(o) = self.open.remove(component) else {
            return;
        };
        let now = self.clock.now_ms();
        self.await_processes_after(now);
        let (by, detail) = self.why_closed(component.as_deref(), &o.incident);
        self.finish(o, by, Some(now), detail);
    }

    /// Waits (bounded) for a process sample taken after `t`: the requests of a killed
    /// engine vanish at once, but its absence is read at the process source's calm pace
    /// (seconds once nothing is suspected), and what closed the incident is that restart.
    fn await_processes_after(&self, t: Millis) {
        let seen = |sh: &Shared| {
            sh.model
                .sources_seen()
                .get(&crate::model::SourceKind::Processes)
                .map(|s| s.last_t_ms)
        };
        let calm_ms = {
            let sh = lock(&self.shared);
            if seen(&sh).is_none() {
                return; // no process source: nothing to wait for
            }
            sh.model.thresholds.sampling.processes_calm_ms
        };
        let bound =
            std::time::Duration::from_millis(u64::try_from(2 * calm_ms).unwrap_or(0) + 2_000);
        let started = std::time::Instant::now();
        while started.elapsed() < bound {
            if seen(&lock(&self.shared)).is_some_and(|last| last >= t) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// What closed an incident of `component`: a restart of its process since it opened,
    /// its leaving the topology, or else its findings going away.
    fn why_closed(&self, component: Option<&str>, i: &Incident) -> (ClosedBy, Option<String>) {
        let sh = lock(&self.shared);
        let m = &sh.model;
        let restart = m
            .restarts()
            .filter(|r| Some(r.component.as_str()) == component)
            // read after the close, at most one process sample later (above)
            .filter(|r| r.t_ms >= i.opened_ms)
            .last();
        if let Some(r) = restart {
            let what = match &r.after {
                Some(a) => format!("process {} was replaced by {a}", r.before),
                None => format!("process {} is gone", r.before),
            };
            return (ClosedBy::ProcessRestarted, Some(what));
        }
        if component.is_some_and(|c| m.topology().component(c).is_none()) {
            return (ClosedBy::ComponentGone, None);
        }
        if i.kind.judged_from_sockets() {
            (ClosedBy::RequestsFinished, None)
        } else {
            (ClosedBy::Cleared, None)
        }
    }

    /// Closes an incident, writes it (its report again) and logs it.
    fn finish(&self, mut o: Open, by: ClosedBy, at: Option<Millis>, detail: Option<String>) {
        o.incident.close(by, at, detail);
        let report = bundle::report_again(&o.path, &o.incident);
        save(&o.path, &o.incident, report.as_deref());
        let lasted = o
            .incident
            .closed
            .as_ref()
            .and_then(|c| c.lasted_ms)
            .map_or_else(|| "?".into(), super::super::log::human_ms);
        tracing::info!(
            kind = %o.incident.kind,
            component = %o.incident.component.as_deref().unwrap_or("-"),
            closed_by = by.as_str(),
            "incident closed after {lasted}: {}",
            o.path.display()
        );
    }
}

fn save(path: &Path, incident: &Incident, report: Option<&str>) {
    if let Err(e) = store::update(path, incident, report) {
        tracing::error!("incident {} not updated: {e}", path.display());
    }
}
