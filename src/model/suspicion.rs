//! `Suspicion`: which engines look suspicious right now, and why. A small plain value derived
//! from the last correlated view (`sampler::suspicion`) and read by the adaptive stack
//! sampling policy (`sampler::adaptive`): suspected engines get their schedulers dumped every
//! stacks tick, the rest of the stack a slow round-robin. Data still flows one way: the
//! sources never call the correlator or the detectors; the runtime hands them this value.

use super::FindingKind;
use std::collections::BTreeMap;
use std::fmt;

/// Why an engine is suspected.
#[derive(Debug, Clone, PartialEq)]
pub enum SuspicionReason {
    /// A request at the engine has sent no response byte for this long (a fraction of the
    /// wedge or stall threshold).
    SilentRequest { silent_ms: i64 },
    /// Its GPU is idle and nothing shows work while a request has been open this long.
    GpuIdleWithOpenRequests { open_ms: i64 },
    /// Requests queued and none running, with no sign of work.
    QueueNotDraining { queued: f64 },
    /// A finding of a kind that implicates the engine's schedulers is open on it.
    FindingOpen(FindingKind),
}

impl fmt::Display for SuspicionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SuspicionReason::SilentRequest { silent_ms } => {
                write!(f, "a request silent for {} ms", silent_ms)
            }
            SuspicionReason::GpuIdleWithOpenRequests { open_ms } => {
                write!(f, "GPU idle with a request open for {} ms", open_ms)
            }
            SuspicionReason::QueueNotDraining { queued } => {
                write!(f, "{queued} queued and nothing running")
            }
            SuspicionReason::FindingOpen(k) => write!(f, "{} open", k.as_str()),
        }
    }
}

/// The suspected engines (by component id) with their reasons; empty when all is quiet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Suspicion {
    engines: BTreeMap<String, Vec<SuspicionReason>>,
}

impl Suspicion {
    /// Nothing suspected.
    pub fn none() -> Suspicion {
        Suspicion::default()
    }

    /// Adds a reason to suspect `engine` (each distinct reason kept once).
    pub fn add(&mut self, engine: &str, reason: SuspicionReason) {
        let rs = self.engines.entry(engine.to_string()).or_default();
        if !rs.contains(&reason) {
            rs.push(reason);
        }
    }

    /// With `reason` added for `engine` (tests, builders).
    pub fn with(mut self, engine: &str, reason: SuspicionReason) -> Suspicion {
        self.add(engine, reason);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.engines.is_empty()
    }

    pub fn contains(&self, engine: &str) -> bool {
        self.engines.contains_key(engine)
    }

    /// The suspected engines' ids, in order.
    pub fn engines(&self) -> impl Iterator<Item = &str> {
        self.engines.keys().map(String::as_str)
    }

    pub fn reasons(&self, engine: &str) -> &[SuspicionReason] {
        self.engines.get(engine).map(Vec::as_slice).unwrap_or(&[])
    }

    /// `decode: a request silent for 12000 ms, GPU idle ...; prefill: ...` (for the log).
    pub fn describe(&self) -> String {
        self.engines
            .iter()
            .map(|(e, rs)| {
                let rs: Vec<String> = rs.iter().map(ToString::to_string).collect();
                format!("{e}: {}", rs.join(", "))
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_kept_once_per_engine() {
        let mut s = Suspicion::none();
        assert!(s.is_empty());
        s.add("decode", SuspicionReason::QueueNotDraining { queued: 2.0 });
        s.add("decode", SuspicionReason::QueueNotDraining { queued: 2.0 });
        s.add(
            "decode",
            SuspicionReason::FindingOpen(FindingKind::WedgedRequest),
        );
        assert!(s.contains("decode") && !s.contains("prefill"));
        assert_eq!(s.reasons("decode").len(), 2);
        assert_eq!(
            s.describe(),
            "decode: 2 queued and nothing running, wedged_request open"
        );
    }
}
