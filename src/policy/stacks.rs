//! Adaptive stack sampling: py-spy where something is suspicious, a slow round-robin elsewhere.
//! [`StackPolicy::plan`] picks each stacks tick's processes: every scheduler of each suspected
//! engine ([`Suspicion`], [`super::suspicion`]) first, then one more process of the stack,
//! round-robin by pid (nothing suspected: one a tick). Dumps of one scheduler accumulate across
//! ticks, so its evidence spans the window. [`snapshot_order`] orders a one-shot's full window:
//! suspected engines' schedulers, other schedulers, the rest.

use super::suspicion::engine_of;
use crate::model::{Role, Suspicion, Topology};
use crate::sources::stacks::{targets_from_topology, StackTarget};

/// What one tick dumps: `targets` in priority order, `rounds` dumps of each.
#[derive(Debug, Clone, PartialEq)]
pub struct StackPlan {
    pub targets: Vec<StackTarget>,
    pub rounds: u32,
}

impl StackPlan {
    pub fn pids(&self) -> Vec<i32> {
        self.targets.iter().map(|t| t.pid).collect()
    }
}

/// The round-robin's memory between ticks: the pid it dumped last.
#[derive(Debug, Clone, Default)]
pub struct StackPolicy {
    last: Option<i32>,
}

impl StackPolicy {
    pub fn new() -> StackPolicy {
        StackPolicy::default()
    }

    /// This tick's dumps: the suspected engines' schedulers, then the round-robin's next.
    pub fn plan(&mut self, topo: &Topology, suspicion: &Suspicion) -> StackPlan {
        let all = targets_from_topology(topo);
        let mut targets = suspected_schedulers(topo, &all, suspicion);
        let mut rest: Vec<&StackTarget> = all
            .iter()
            .filter(|t| !targets.iter().any(|s| s.pid == t.pid))
            .collect();
        rest.sort_by_key(|t| t.pid);
        // The next pid after the last one dumped, wrapping: a pid that vanished does not
        // reset the rotation, a new one joins it in pid order.
        let next = match self.last {
            Some(last) => rest.iter().find(|t| t.pid > last).or(rest.first()),
            None => rest.first(),
        };
        if let Some(t) = next {
            self.last = Some(t.pid);
            targets.push((*t).clone());
        }
        StackPlan { targets, rounds: 1 }
    }
}

/// Every scheduler of each suspected engine (an engine without scheduler processes: its
/// own), in the suspicion's engine order, then by pid.
fn suspected_schedulers(
    topo: &Topology,
    all: &[StackTarget],
    suspicion: &Suspicion,
) -> Vec<StackTarget> {
    let mut out = Vec::new();
    for engine in suspicion.engines() {
        let mut of_engine: Vec<(bool, &StackTarget)> = all
            .iter()
            .filter_map(|t| {
                let owner = topo.component(t.component.as_deref()?)?;
                (engine_of(topo, &owner.id) == Some(engine))
                    .then_some((owner.role == Role::Scheduler, t))
            })
            .collect();
        if of_engine.iter().any(|(sched, _)| *sched) {
            of_engine.retain(|(sched, _)| *sched);
        }
        of_engine.sort_by_key(|(_, t)| t.pid);
        for (_, t) in of_engine {
            if !out.iter().any(|o: &StackTarget| o.pid == t.pid) {
                out.push(t.clone());
            }
        }
    }
    out
}

/// A full window's targets (a one-shot snapshot): all of them, the suspected engines'
/// schedulers first, then the other schedulers, then the rest (each group by pid), so a
/// window cut short by its budget or `max_pids` keeps what matters.
pub fn snapshot_order(topo: &Topology, suspicion: &Suspicion) -> Vec<StackTarget> {
    let all = targets_from_topology(topo);
    let mut out: Vec<StackTarget> = suspected_schedulers(topo, &all, suspicion)
        .into_iter()
        .map(|mut t| {
            t.whole_window = true;
            t
        })
        .collect();
    let mut rest: Vec<StackTarget> = all
        .into_iter()
        .filter(|t| !out.iter().any(|o| o.pid == t.pid))
        .collect();
    rest.sort_by_key(|t| (!t.whole_window, t.pid));
    out.extend(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Component, SuspicionReason};
    use std::collections::{BTreeMap, BTreeSet};

    fn comp(id: &str, role: Role, pids: &[i32], parent: Option<&str>) -> Component {
        Component {
            id: id.into(),
            role,
            stack: "sglang".into(),
            profile: "test".into(),
            pids: pids.to_vec(),
            main_pid: pids.first().copied(),
            listen: Vec::new(),
            gpus: Vec::new(),
            parent: parent.map(str::to_string),
            children: Vec::new(),
            http_url: None,
            metrics_url: None,
            title: None,
            labels: BTreeMap::new(),
            versions: BTreeMap::new(),
            relevant_env: Vec::new(),
            netns: None,
            container: None,
            channels: Vec::new(),
        }
    }

    /// A PD node: proxy, router, prefill and decode engines with `tp` schedulers each
    /// (prefill's pids 200.., decode's 300..), and a client (never dumped).
    fn pd_node(tp: i32) -> Topology {
        let mut components = vec![
            comp("proxy", Role::Proxy, &[10], None),
            comp("router", Role::Router, &[20], None),
            comp("client", Role::Client, &[5], None),
        ];
        for (engine, role, base) in [
            ("prefill", Role::Prefill, 200),
            ("decode", Role::Decode, 300),
        ] {
            let scheds: Vec<i32> = (1..=tp).map(|i| base + i).collect();
            let mut pids = vec![base];
            pids.extend(&scheds);
            components.push(comp(engine, role, &pids, None));
            for (i, p) in scheds.iter().enumerate() {
                let id = format!("scheduler_TP{i}@{engine}");
                components.push(comp(&id, Role::Scheduler, &[*p], Some(engine)));
            }
        }
        Topology {
            components,
            edges: Vec::new(),
        }
    }

    fn silent(engine: &str) -> Suspicion {
        let request = crate::model::RequestNote {
            id: "x1".into(),
            client: "127.0.0.1:40000".into(),
            bytes_in: 900,
            bytes_out: 0,
        };
        let reason = SuspicionReason::SilentRequest {
            request,
            silent_ms: 12_000,
        };
        Suspicion::none().with(engine, reason)
    }

    #[test]
    fn nothing_suspected_dumps_one_process_per_tick() {
        let topo = pd_node(8);
        let mut p = StackPolicy::new();
        for _ in 0..40 {
            let plan = p.plan(&topo, &Suspicion::none());
            assert_eq!(plan.targets.len(), 1, "{:?}", plan.pids());
            assert_eq!(plan.rounds, 1);
        }
    }

    #[test]
    fn round_robin_covers_every_process_in_n_ticks() {
        let topo = pd_node(8);
        let n = targets_from_topology(&topo).len();
        assert_eq!(
            n,
            2 + 2 * 9,
            "proxy, router, two engines of 1 + 8 (no client)"
        );
        let mut p = StackPolicy::new();
        let seen: Vec<i32> = (0..n)
            .flat_map(|_| p.plan(&topo, &Suspicion::none()).pids())
            .collect();
        let distinct: BTreeSet<i32> = seen.iter().copied().collect();
        assert_eq!(distinct.len(), n, "each once in {n} ticks: {seen:?}");
        assert!(!distinct.contains(&5), "the client is never dumped");
        // And then again from the start, in the same order.
        let again: Vec<i32> = (0..n)
            .flat_map(|_| p.plan(&topo, &Suspicion::none()).pids())
            .collect();
        assert_eq!(again, seen);
    }

    #[test]
    fn a_suspected_engine_has_all_its_schedulers_dumped_first_every_tick() {
        let topo = pd_node(8);
        let mut p = StackPolicy::new();
        let decode_scheds: Vec<i32> = (301..=308).collect();
        for _ in 0..5 {
            let plan = p.plan(&topo, &silent("decode"));
            assert_eq!(&plan.pids()[..8], &decode_scheds[..], "{:?}", plan.pids());
            // Plus the round-robin's one, never a decode scheduler twice.
            assert_eq!(plan.targets.len(), 9, "{:?}", plan.pids());
            assert!(!decode_scheds.contains(&plan.pids()[8]));
        }
    }

    #[test]
    fn the_round_robin_goes_on_beside_a_suspicion() {
        let topo = pd_node(2);
        let mut p = StackPolicy::new();
        let n = targets_from_topology(&topo).len() - 2;
        let extra: BTreeSet<i32> = (0..n)
            .map(|_| *p.plan(&topo, &silent("decode")).pids().last().unwrap_or(&0))
            .collect();
        let expected: BTreeSet<i32> = [10, 20, 200, 201, 202, 300].into_iter().collect();
        assert_eq!(extra, expected);
    }

    #[test]
    fn an_engine_without_scheduler_processes_is_dumped_itself() {
        let topo = Topology {
            components: vec![
                comp("proxy", Role::Proxy, &[10], None),
                comp("engine", Role::Engine, &[40], None),
            ],
            edges: Vec::new(),
        };
        let plan = StackPolicy::new().plan(&topo, &silent("engine"));
        assert_eq!(plan.pids(), vec![40, 10]);
    }

    #[test]
    fn a_snapshot_window_puts_the_suspected_engines_schedulers_first() {
        let topo = pd_node(2);
        let order: Vec<i32> = snapshot_order(&topo, &silent("decode"))
            .iter()
            .map(|t| t.pid)
            .collect();
        assert_eq!(order, vec![301, 302, 201, 202, 10, 20, 200, 300]);
        let quiet: Vec<i32> = snapshot_order(&topo, &Suspicion::none())
            .iter()
            .map(|t| t.pid)
            .collect();
        assert_eq!(quiet, vec![201, 202, 301, 302, 10, 20, 200, 300]);
        assert!(snapshot_order(&topo, &silent("decode"))[..4]
            .iter()
            .all(|t| t.whole_window));
    }

    #[test]
    fn a_vanished_pid_does_not_restart_the_rotation() {
        let topo = pd_node(2);
        let mut p = StackPolicy::new();
        let first: Vec<i32> = (0..3)
            .flat_map(|_| p.plan(&topo, &Suspicion::none()).pids())
            .collect();
        assert_eq!(first, vec![10, 20, 200]);
        let mut smaller = topo.clone();
        smaller
            .components
            .retain(|c| matches!(c.id.as_str(), "proxy" | "client" | "decode"));
        let next = p.plan(&smaller, &Suspicion::none()).pids();
        assert_eq!(next, vec![300], "after 200, the next pid still there");
    }
}
