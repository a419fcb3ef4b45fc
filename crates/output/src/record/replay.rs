//! Replaying recordings through the correlator, up to a time (`--at`, [`parse_at`]).

use super::{Baseline, ReadStats, Record, Recording};
use crate::clock::Millis;
use crate::correlate::Correlator;
use crate::detect::Thresholds;
use crate::error::{Error, Result};
use crate::model::SourceKind;
use std::collections::BTreeMap;

/// A model rebuilt from a recording.
#[derive(Debug, Clone)]
pub struct Replayed {
    pub model: Correlator,
    /// Baselines in the recording up to the replay time, oldest first.
    pub baselines: Vec<Baseline>,
    pub stats: ReadStats,
    /// The time the model was replayed to.
    pub at_ms: Millis,
    /// The node recorded (the newest header's up to the replay time; None: an older
    /// recording).
    pub node: Option<crate::model::NodeIdentity>,
    /// The recording's cadence per kind at the replay time, as its newest sample of the kind
    /// says (see `Record::Sample::every_ms`; kinds whose samples do not say are absent).
    pub every_ms: BTreeMap<SourceKind, i64>,
}

/// Feeds a recording through the correlator up to `at` (inclusive; None: the end), so
/// `snapshot --from FILE --at TIME` sees what a live snapshot would have seen then.
/// `config_changed` is set from the known-good facts (else the oldest baseline) to the
/// newest ones up to `at`.
pub fn replay(rec: &Recording, at: Option<Millis>, thresholds: Thresholds) -> Result<Replayed> {
    let mut records = rec.records();
    let mut r = Replayer::new(thresholds);
    for rec in records.by_ref() {
        let rec = rec?;
        if at.is_some_and(|a| rec.t_ms() > a) {
            // Headers/context re-written at rotation carry the rotation time; only samples
            // define the timeline, so stop at the first sample past `at`.
            if matches!(rec, Record::Sample { .. }) {
                break;
            }
            continue;
        }
        r.apply(rec);
    }
    let at_ms = at.or(r.last_sample_ms).unwrap_or(0);
    Ok(Replayed {
        model: r.model,
        baselines: r.baselines,
        stats: records.stats(),
        at_ms,
        node: r.node,
        every_ms: r.every_ms,
    })
}

/// Feeds records through the correlator one at a time: what `replay` and the UI's
/// `--replay` share. `config_changed` compares the newest known-good facts (else the oldest
/// baseline) with the newest facts seen so far.
#[derive(Debug)]
pub struct Replayer {
    pub model: Correlator,
    pub baselines: Vec<Baseline>,
    pub last_sample_ms: Option<Millis>,
    /// The node of the newest header applied.
    pub node: Option<crate::model::NodeIdentity>,
    /// The cadence per kind of the newest sample applied, when it said.
    pub every_ms: BTreeMap<SourceKind, i64>,
    /// Re-scrubs every record on read, so recordings made before a redaction rule existed
    /// replay clean, and a value learned in one record goes from every later one.
    redactor: crate::redact::Redactor,
    /// The newest known-good facts the daemon recorded (`daemon::known_good`).
    pub known_good: Option<Baseline>,
}

impl Replayer {
    pub fn new(thresholds: Thresholds) -> Replayer {
        let mut model = Correlator::new(thresholds);
        // The recorder's own pid comes from the recording's header, not from this process.
        model.ignore_client_pids.clear();
        Replayer {
            model,
            baselines: Vec::new(),
            last_sample_ms: None,
            node: None,
            every_ms: BTreeMap::new(),
            redactor: crate::redact::Redactor::new(),
            known_good: None,
        }
    }

    /// `config_changed` as the daemon had it: from the known-good facts (else the oldest
    /// baseline) to the newest facts of every component.
    fn compare(&mut self) {
        let Some(first) = self.baselines.first() else {
            return;
        };
        let merged = self
            .baselines
            .iter()
            .skip(1)
            .fold(first.clone(), |acc, b| acc.merged(b));
        let reference = self.known_good.as_ref().unwrap_or(first);
        self.model.set_config_changes(reference.changes_to(&merged));
    }

    /// Applies one record; returns the sample time when it was a sample.
    pub fn apply(&mut self, r: Record) -> Option<Millis> {
        let r = self.redactor.redact_typed(&r)?;
        match r {
            Record::Header { pid, node, .. } => {
                self.node = node.or(self.node.take());
                if !self.model.ignore_client_pids.contains(&pid) {
                    self.model.ignore_client_pids.push(pid);
                }
                None
            }
            Record::Topology { topology, .. } => {
                self.model.set_topology(topology);
                None
            }
            Record::Baseline { baseline } if baseline.known_good => {
                self.known_good = Some(baseline);
                self.compare();
                None
            }
            Record::Baseline { baseline } => {
                if self.baselines.last() != Some(&baseline) {
                    self.baselines.push(baseline);
                    self.compare();
                }
                None
            }
            // Decoded into samples by `read`.
            Record::Delta { .. } => None,
            Record::Sample { sample, every_ms } => {
                let t = sample.t_ms;
                match every_ms {
                    Some(ms) => self.every_ms.insert(sample.kind(), ms),
                    None => self.every_ms.remove(&sample.kind()),
                };
                self.last_sample_ms = Some(self.last_sample_ms.map_or(t, |l| l.max(t)));
                self.model.ingest(&sample);
                Some(t)
            }
        }
    }
}

/// Parses `--at TIME` for a replay: RFC 3339 (`2026-11-29T12:00:00Z`), epoch milliseconds,
/// or an offset from the recording's first record (`+90s`, `+5m`, `+1h`, `+1500ms`).
pub fn parse_at(s: &str, recording_start_ms: Millis) -> Result<Millis> {
    let bad = || {
        Error::Other(format!(
            "--at {s:?}: expected RFC 3339 time, epoch ms, or +N[ms|s|m|h] from the recording start"
        ))
    };
    let s = s.trim();
    if let Some(off) = s.strip_prefix('+') {
        let split = off.find(|c: char| !c.is_ascii_digit()).unwrap_or(off.len());
        let (num, unit) = off.split_at(split);
        let n: i64 = num.parse().map_err(|_| bad())?;
        let mult = match unit {
            "ms" => 1,
            "" | "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        // Checked: `+9223372036854775807s` must be a bad --at, not an overflow panic.
        return n
            .checked_mul(mult)
            .and_then(|off| recording_start_ms.checked_add(off))
            .ok_or_else(bad);
    }
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    crate::clock::parse_rfc3339(s).ok_or_else(bad)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ComponentFacts, Role};

    fn baseline(t: Millis, env: &[&str], known_good: bool) -> Record {
        let facts = ComponentFacts {
            id: "decode@127.0.0.1:2".into(),
            role: Role::Decode,
            stack: "sglang".into(),
            main_pid: Some(7),
            identity: Some(format!("7:{t}")),
            started_at_ms: Some(t),
            exe: None,
            cmdline: Vec::new(),
            env: env
                .iter()
                .map(|k| (k.to_string(), "1".to_string()))
                .collect(),
            listen: vec!["127.0.0.1:2".into()],
            version: None,
        };
        Record::Baseline {
            baseline: Baseline {
                t_ms: t,
                reason: "test".into(),
                components: vec![facts],
                known_good,
            },
        }
    }

    /// A replay compares as the daemon did: against the known-good facts it recorded.
    #[test]
    fn a_replay_compares_against_the_recorded_known_good_facts() {
        let mut r = Replayer::new(Thresholds::default());
        r.apply(baseline(1, &["A"], false));
        r.apply(baseline(2, &["A", "B"], false));
        r.apply(baseline(2, &["A", "B"], true));
        r.apply(baseline(3, &["A", "B", "C"], false));
        let keys: Vec<_> = r
            .model
            .config_changes()
            .iter()
            .filter(|c| c.field == "env")
            .filter_map(|c| c.key.clone())
            .collect();
        assert_eq!(keys, ["C"], "B was known good: {keys:?}");
        assert_eq!(
            r.baselines.len(),
            3,
            "the known-good line is no baseline of its own"
        );
    }
}
