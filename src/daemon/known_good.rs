//! The last known-good baseline: besides its start baseline, the daemon keeps the newest
//! facts of every component that ran healthy, and `config_changed` compares against them.
//! A daemon started after a bad change would otherwise compare bad with bad.
//!
//! The rule: each baseline the daemon takes (merged with the facts it knew) is a candidate;
//! it becomes known good once it has run for [`KnownGood::probation_ms`] (the longest a
//! request needs to be judged stuck or stalled) through detector passes of which none had a
//! health finding open (any but `config_changed` and `process_restarted`, which are about
//! the comparison itself). A health finding rejects the candidate until the next baseline.
//! The known-good facts are kept in `known-good.json` in the state directory, so a daemon
//! restarted after a bad change still compares against the good state of its last run.

use crate::clock::Millis;
use crate::model::{Finding, FindingKind};
use crate::record::Baseline;
use std::path::{Path, PathBuf};

/// The file in the state directory.
pub const FILE: &str = "known-good.json";
/// The largest known-good file read back (a big stack's facts are a few hundred KiB).
const MAX_FILE: u64 = 32 << 20;

/// The candidate and the known-good facts.
#[derive(Debug, Clone, Default)]
pub struct KnownGood {
    /// The facts proven healthy, newest; `None` until one has been.
    pub good: Option<Baseline>,
    /// The facts on trial: the newest merged baseline, while no health finding was seen.
    candidate: Option<Baseline>,
    /// How long a candidate must run without a health finding.
    pub probation_ms: Millis,
}

/// A finding about the stack's health, as opposed to one about what changed.
fn is_health(f: &Finding) -> bool {
    !matches!(
        f.kind,
        FindingKind::ConfigChanged | FindingKind::ProcessRestarted
    )
}

impl KnownGood {
    pub fn new(probation_ms: Millis) -> KnownGood {
        KnownGood {
            probation_ms,
            ..KnownGood::default()
        }
    }

    /// A new baseline was taken: `merged` (every component's newest facts) goes on trial.
    pub fn on_baseline(&mut self, merged: &Baseline) {
        self.candidate = Some(merged.clone());
    }

    /// One detector pass at `now`: a health finding rejects the candidate; a candidate that
    /// ran its probation without one is known good. Returns the newly known-good facts.
    pub fn on_pass(&mut self, now: Millis, findings: &[Finding]) -> Option<Baseline> {
        if findings.iter().any(is_health) {
            self.candidate = None;
            return None;
        }
        let ready = self
            .candidate
            .as_ref()
            .is_some_and(|c| now - c.t_ms >= self.probation_ms);
        if !ready {
            return None;
        }
        let mut good = self.candidate.take()?;
        good.reason = format!("known good at {}", crate::clock::rfc3339(now));
        good.known_good = true;
        self.good = Some(good.clone());
        Some(good)
    }

    /// What `config_changed` compares against: the known-good facts, else `first`.
    pub fn reference<'a>(&'a self, first: Option<&'a Baseline>) -> Option<&'a Baseline> {
        self.good.as_ref().or(first)
    }
}

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join(FILE)
}

/// Writes the known-good facts (0600, replaced atomically; secrets are keyed masks).
pub fn save(state_dir: &Path, good: &Baseline) -> crate::error::Result<()> {
    let bytes = serde_json::to_vec(good)?;
    crate::safe_fs::write_output(&path(state_dir), &bytes)?;
    Ok(())
}

/// The known-good facts of an earlier run, if its file is there and reads whole.
pub fn load(state_dir: &Path) -> Option<Baseline> {
    let p = path(state_dir);
    if std::fs::symlink_metadata(&p).is_err() {
        return None;
    }
    let read = crate::safe_fs::read_input_capped(&p, MAX_FILE);
    match read {
        Ok((bytes, false)) => match serde_json::from_slice::<Baseline>(&bytes) {
            Ok(mut b) => {
                b.known_good = true;
                Some(b)
            }
            Err(e) => {
                tracing::warn!("{}: not a known-good baseline ({e}); ignored", p.display());
                None
            }
        },
        Ok((_, true)) => {
            tracing::warn!("{}: larger than {MAX_FILE} bytes; ignored", p.display());
            None
        }
        Err(e) => {
            tracing::warn!("{}: {e}; ignored", p.display());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Role, Severity};

    fn baseline(t: Millis, reason: &str) -> Baseline {
        Baseline {
            t_ms: t,
            reason: reason.into(),
            components: Vec::new(),
            known_good: false,
        }
    }

    fn finding(kind: FindingKind) -> Finding {
        Finding {
            kind,
            severity: Severity::Critical,
            component: Some("decode".into()),
            role: Some(Role::Decode),
            summary: String::new(),
            requests: Vec::new(),
            evidence: Vec::new(),
            explanation: None,
        }
    }

    #[test]
    fn a_baseline_is_known_good_after_its_probation_without_a_health_finding() {
        let mut k = KnownGood::new(30_000);
        k.on_baseline(&baseline(1_000, "start"));
        assert!(k.on_pass(20_000, &[]).is_none(), "still on probation");
        // a change finding is about the comparison, not health
        let changed = [finding(FindingKind::ConfigChanged)];
        let good = k.on_pass(31_000, &changed).expect("known good");
        assert!(good.known_good && good.reason.starts_with("known good at"));
        assert_eq!(k.reference(None).map(|b| b.t_ms), Some(1_000));

        // a bad restart: on trial, and a wedge shows before the probation ends
        k.on_baseline(&baseline(40_000, "restart of decode"));
        assert!(k.on_pass(50_000, &[]).is_none());
        assert!(k
            .on_pass(60_000, &[finding(FindingKind::WedgedRequest)])
            .is_none());
        // rejected: never known good, however long after
        assert!(k.on_pass(200_000, &[]).is_none());
        assert_eq!(
            k.reference(None).map(|b| b.t_ms),
            Some(1_000),
            "still the good one"
        );
    }

    #[test]
    fn without_a_known_good_state_the_first_baseline_is_the_reference() {
        let k = KnownGood::new(30_000);
        let first = baseline(5, "start");
        assert_eq!(k.reference(Some(&first)).map(|b| b.t_ms), Some(5));
        assert!(k.reference(None).is_none());
    }
}
