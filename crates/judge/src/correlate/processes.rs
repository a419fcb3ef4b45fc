//! Process samples -> restarts (process identity changes) and fd / thread counts.

use super::{Correlator, CountPoint, RestartEvent};
use crate::clock::Millis;
use crate::model::{Component, ProcessFacts};

impl Correlator {
    pub(super) fn ingest_processes(&mut self, t: Millis, procs: &[ProcessFacts]) {
        let comps: Vec<Component> = self.topology.components.clone();
        for c in &comps {
            let Some(main) = c.main_pid else { continue };
            let facts = procs.iter().find(|p| p.pid == main);
            let ident = facts.map(|p| match p.start_ticks {
                Some(st) => format!("{}:{}", p.pid, st),
                None => p.pid.to_string(),
            });
            match (self.identities.get(&c.id).cloned(), ident) {
                // The start time could not be read this time (a transient /proc error): the
                // same pid is the same process until a readable start time says otherwise.
                (Some(before), Some(after))
                    if !after.contains(':') && before.starts_with(&format!("{after}:")) => {}
                (Some(before), Some(after)) if before != after => {
                    // "123" (pid only, from a topology change) -> "123:456" is no restart.
                    if !after.starts_with(&format!("{before}:")) {
                        self.push_restart(RestartEvent {
                            t_ms: t,
                            component: c.id.clone(),
                            role: c.role,
                            before,
                            after: Some(after.clone()),
                        });
                    }
                    self.identities.insert(c.id.clone(), after);
                }
                (None, Some(after)) => {
                    self.identities.insert(c.id.clone(), after);
                }
                // Main process gone. Report once; discovery will bring the successor.
                (Some(before), None) if facts.is_none() && !before.ends_with(":gone") => {
                    self.push_restart(RestartEvent {
                        t_ms: t,
                        component: c.id.clone(),
                        role: c.role,
                        before: before.clone(),
                        after: None,
                    });
                    self.identities
                        .insert(c.id.clone(), format!("{before}:gone"));
                }
                _ => {}
            }
            let mut fds = 0u32;
            let mut threads = 0u32;
            let mut any = false;
            for p in procs.iter().filter(|p| c.pids.contains(&p.pid)) {
                if let Some(f) = p.fd_count {
                    fds += f;
                    any = true;
                }
                if let Some(th) = &p.threads {
                    threads += th.len() as u32;
                }
            }
            let q = self.counts.entry(c.id.clone()).or_default();
            q.push_back(CountPoint {
                t_ms: t,
                established: None,
                close_wait: None,
                fds: any.then_some(fds),
                threads: (threads > 0).then_some(threads),
            });
        }
        self.latest_processes = procs.to_vec();
    }
}
