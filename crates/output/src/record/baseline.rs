//! Baselines: every component's facts ([`ComponentFacts`]), taken by the daemon on start
//! and whenever a component appears or restarts, and written into the recording, so "what
//! changed since noon" needs no saved snapshot. What changed between two baselines is
//! [`crate::model::changes::changes`], the comparison `diff` uses too.

use crate::clock::Millis;
use crate::model::{Change, ComponentFacts, ProcessFacts, Topology};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A snapshot-like record of every component's facts (a `Record::Baseline` line).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    pub t_ms: Millis,
    /// Why it was taken (`start`, `new component decode@...`, `restart of ...`).
    pub reason: String,
    pub components: Vec<ComponentFacts>,
    /// Facts that ran healthy (`daemon::known_good`): what `config_changed` compares
    /// against. Absent (false) in the baselines taken at start, restarts and new components.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub known_good: bool,
}

impl Baseline {
    /// Takes the facts of every component's main process from the latest process facts.
    /// Components whose main process has no facts yet are left out (taken next time).
    pub fn take(
        t_ms: Millis,
        topo: &Topology,
        procs: &[ProcessFacts],
        reason: impl Into<String>,
    ) -> Baseline {
        Baseline {
            t_ms,
            reason: reason.into(),
            components: topo
                .components
                .iter()
                .filter_map(|c| facts_of(c, procs))
                .collect(),
            known_good: false,
        }
    }

    pub fn component(&self, id: &str) -> Option<&ComponentFacts> {
        self.components.iter().find(|c| c.id == id)
    }

    /// What changed from `self` (older) to `newer`: env, cmdline, exe, process identity,
    /// role and listen set, and components that appeared or vanished (field `topology`).
    pub fn changes_to(&self, newer: &Baseline) -> Vec<Change> {
        crate::model::changes::changes(&self.components, &newer.components)
    }

    /// Merges `newer` over `self`: components seen in either, newest facts win. Used to
    /// keep "the latest known facts of every component".
    pub fn merged(&self, newer: &Baseline) -> Baseline {
        let mut comps: BTreeMap<String, ComponentFacts> = self
            .components
            .iter()
            .map(|c| (c.id.clone(), c.clone()))
            .collect();
        for c in &newer.components {
            comps.insert(c.id.clone(), c.clone());
        }
        Baseline {
            t_ms: newer.t_ms,
            reason: newer.reason.clone(),
            components: comps.into_values().collect(),
            known_good: newer.known_good,
        }
    }
}

/// One component's facts from its main process's, secrets masked; `None` until they can be
/// taken whole.
fn facts_of(c: &crate::model::Component, procs: &[ProcessFacts]) -> Option<ComponentFacts> {
    let p = c.main_pid.and_then(|m| procs.iter().find(|p| p.pid == m))?;
    // setproctitle wipes a titled process's args and env: read them where discovery
    // found they survive (a launcher or the engine parent).
    let by_pid = |pid: i32| procs.iter().find(|f| f.pid == pid).unwrap_or(p);
    let env_facts = by_pid(c.env_pid().unwrap_or(p.pid));
    let args_facts = by_pid(c.args_pid().unwrap_or(p.pid));
    // A process whose environment could not be read (vanished mid-sample, permission)
    // is baselined next time: an empty env would read as "every variable removed".
    let mut env = env_facts.env.clone()?;
    // Secrets are stored as keyed masks (see `redact::mask`): comparable within one
    // daemon run, meaningless without the key, which is never written.
    let mut masker = crate::redact::Redactor::masking(crate::redact::MaskKey::process());
    masker.env(&mut env);
    Some(ComponentFacts {
        id: c.id.clone(),
        role: c.role,
        stack: c.stack.clone(),
        main_pid: c.main_pid,
        identity: Some(match p.start_ticks {
            Some(st) => format!("{}:{st}", p.pid),
            None => p.pid.to_string(),
        }),
        started_at_ms: p.started_at_ms,
        exe: p.exe.clone(),
        // Recordings travel: secrets in arguments are never stored in clear.
        cmdline: masker.args(&args_facts.cmdline.clone().unwrap_or_default()),
        env,
        listen: c.listen.clone(),
        version: c.labels.get("version").cloned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A baseline line without a `version`.
    const WRITTEN_BEFORE: &str = r#"{"t_ms":1795963857073,"reason":"start","components":[{"id":"decode@127.0.0.1:2","role":"decode","stack":"sglang","main_pid":7,"identity":"7:100","started_at_ms":1795963850000,"exe":"/usr/bin/python3","cmdline":["python","-m","sglang.launch_server","--api-key","<redacted:0000abcd:0123456789abcdef>"],"env":{"HF_TOKEN":"<redacted:0000abcd:0123456789abcdef>","PATH":"/bin"},"listen":["127.0.0.1:2"]}]}"#;

    #[test]
    fn baselines_on_disk_read_and_write_the_same() {
        let b: Baseline = serde_json::from_str(WRITTEN_BEFORE).expect("reads");
        assert_eq!(b.components[0].version, None);
        assert_eq!(serde_json::to_string(&b).expect("writes"), WRITTEN_BEFORE);
    }
}
