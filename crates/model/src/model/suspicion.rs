//! `Suspicion`: which engines look suspicious right now, and why. Derived from the last
//! correlated view (`policy::suspicion`) and read by the adaptive sampling
//! (`sampler::adaptive`); the runtime hands it to the sources, so data still flows one way.

use super::FindingKind;
use std::collections::BTreeMap;
use std::fmt;

/// The request a reason is about, as the log names it: a suspicion that nobody can trace to
/// a request cannot be checked (a health check read as a waiting request looks the same).
#[derive(Debug, Clone, PartialEq)]
pub struct RequestNote {
    /// Its exchange id (`x<n>`), as snapshots name it.
    pub id: String,
    /// The client's address.
    pub client: String,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl fmt::Display for RequestNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} from {} ({} B in, {} B out)",
            self.id, self.client, self.bytes_in, self.bytes_out
        )
    }
}

/// Why an engine is suspected.
#[derive(Debug, Clone, PartialEq)]
pub enum SuspicionReason {
    /// A request at the engine has sent no response byte for this long (a fraction of the
    /// wedge or stall threshold).
    SilentRequest {
        request: RequestNote,
        silent_ms: i64,
    },
    /// Its GPU is idle and nothing shows work while a request has been open this long.
    GpuIdleWithOpenRequests { request: RequestNote, open_ms: i64 },
    /// Requests queued and none running, with no sign of work.
    QueueNotDraining { queued: f64 },
    /// A finding of a kind that implicates the engine's schedulers is open on it.
    FindingOpen(FindingKind),
}

impl SuspicionReason {
    /// How bad a reason of its kind is: of two of one kind, an engine keeps the worse (the
    /// longest silence, the oldest open request, the longest queue). `None` for a kind whose
    /// reasons are all kept (findings of different kinds).
    fn severity(&self) -> Option<f64> {
        match self {
            SuspicionReason::SilentRequest { silent_ms, .. } => Some(*silent_ms as f64),
            SuspicionReason::GpuIdleWithOpenRequests { open_ms, .. } => Some(*open_ms as f64),
            SuspicionReason::QueueNotDraining { queued } => Some(*queued),
            SuspicionReason::FindingOpen(_) => None,
        }
    }
}

impl fmt::Display for SuspicionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SuspicionReason::SilentRequest { request, silent_ms } => {
                write!(f, "request {request} silent for {silent_ms} ms")
            }
            SuspicionReason::GpuIdleWithOpenRequests { request, open_ms } => {
                write!(f, "GPU idle with request {request} open for {open_ms} ms")
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

    /// Adds a reason to suspect `engine`: one reason of each kind, the worst, and each open
    /// finding's kind once.
    pub fn add(&mut self, engine: &str, reason: SuspicionReason) {
        let rs = self.engines.entry(engine.to_string()).or_default();
        let same_kind = rs
            .iter()
            .position(|r| std::mem::discriminant(r) == std::mem::discriminant(&reason));
        match (same_kind, reason.severity()) {
            (Some(i), Some(new)) => {
                if rs[i].severity().is_some_and(|old| new > old) {
                    rs[i] = reason;
                }
            }
            _ if rs.contains(&reason) => {}
            _ => rs.push(reason),
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

    fn note(id: &str) -> RequestNote {
        RequestNote {
            id: id.into(),
            client: "127.0.0.1:40000".into(),
            bytes_in: 240,
            bytes_out: 222,
        }
    }

    #[test]
    fn an_engine_keeps_the_worst_request_of_each_kind_and_names_it() {
        let mut s = Suspicion::none();
        for (id, ms) in [("x1", 3_000), ("x2", 9_000), ("x3", 4_000)] {
            s.add(
                "decode",
                SuspicionReason::GpuIdleWithOpenRequests {
                    request: note(id),
                    open_ms: ms,
                },
            );
            s.add(
                "decode",
                SuspicionReason::SilentRequest {
                    request: note(id),
                    silent_ms: ms + 1,
                },
            );
        }
        s.add(
            "decode",
            SuspicionReason::FindingOpen(FindingKind::StalledStream),
        );
        s.add(
            "decode",
            SuspicionReason::FindingOpen(FindingKind::WedgedRequest),
        );
        assert_eq!(s.reasons("decode").len(), 4, "{}", s.describe());
        assert_eq!(
            s.describe(),
            "decode: GPU idle with request x2 from 127.0.0.1:40000 (240 B in, 222 B out) open \
             for 9000 ms, request x2 from 127.0.0.1:40000 (240 B in, 222 B out) silent for \
             9001 ms, stalled_stream open, wedged_request open"
        );
    }
}
