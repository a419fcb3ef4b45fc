//! `ThreadState`: what a sampled Python thread is doing, as a type. Its JSON form is the
//! contract's snake_case string; an unknown state is kept verbatim as `Other`, so reading
//! never fails on a name added later.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;

/// The state the stack rules give a thread (see `docs/findings.md`, "Thread states").
/// Serialized as its [`as_str`](Self::as_str) string; compared by that string, so
/// `Other("idle")` (never built by [`From`]) equals `Idle`.
#[derive(Clone, Default)]
pub enum ThreadState {
    /// Waiting for requests (a scheduler loop, a vLLM worker on its broadcast queue).
    Idle,
    /// Running a forward pass or stepping the scheduler.
    RunningBatch,
    /// Waiting for the GPU to finish a batch (sync, result copy).
    WaitingGpuResult,
    /// Inside a GPU collective (NCCL, custom all-reduce).
    NcclCollective,
    /// Inside a CPU (gloo) collective; on TP ranks > 0 also how idle looks.
    GlooCollective,
    /// Polling PD bootstrap/prealloc/transfer queues, or waiting on a KV transfer.
    PdQueuePolling,
    /// A serving process's main thread outside its loop.
    StuckOutsideLoop,
    /// Inside a torch.distributed collective whose backend the frames do not show; the
    /// rule's name says which collective (`collective.all_reduce`).
    Collective,
    /// A point-to-point receive/send (pipeline-parallel stage hand-off).
    P2pWait,
    /// An engine core waiting for its workers' output.
    WaitingWorkers,
    /// Start-up: loading, profiling memory, capturing graphs, warming up.
    Startup,
    /// The main thread left its loop; the interpreter is exiting.
    Shutdown,
    /// A helper thread (tqdm monitor, queue or socket poller) waiting for work.
    HelperIdle,
    /// Blocked in a wait its leaf frames name (a queue, a lock or condition, a child process,
    /// a sleep, a socket or ZMQ receive) where no role rule says more; the rule names the wait.
    Waiting,
    /// No rule matched: read the frames.
    #[default]
    Unknown,
    /// A state this build does not know, kept as written.
    Other(String),
}

impl ThreadState {
    /// Every state this build assigns, `Unknown` last.
    pub const KNOWN: [ThreadState; 15] = [
        ThreadState::Idle,
        ThreadState::RunningBatch,
        ThreadState::WaitingGpuResult,
        ThreadState::NcclCollective,
        ThreadState::GlooCollective,
        ThreadState::PdQueuePolling,
        ThreadState::StuckOutsideLoop,
        ThreadState::Collective,
        ThreadState::P2pWait,
        ThreadState::WaitingWorkers,
        ThreadState::Startup,
        ThreadState::Shutdown,
        ThreadState::HelperIdle,
        ThreadState::Waiting,
        ThreadState::Unknown,
    ];

    /// The contract's name of the state: `"idle"`, ...
    pub fn as_str(&self) -> &str {
        match self {
            ThreadState::Idle => "idle",
            ThreadState::RunningBatch => "running_batch",
            ThreadState::WaitingGpuResult => "waiting_gpu_result",
            ThreadState::NcclCollective => "nccl_collective",
            ThreadState::GlooCollective => "gloo_collective",
            ThreadState::PdQueuePolling => "pd_queue_polling",
            ThreadState::StuckOutsideLoop => "stuck_outside_loop",
            ThreadState::Collective => "collective",
            ThreadState::P2pWait => "p2p_wait",
            ThreadState::WaitingWorkers => "waiting_workers",
            ThreadState::Startup => "startup",
            ThreadState::Shutdown => "shutdown",
            ThreadState::HelperIdle => "helper_idle",
            ThreadState::Waiting => "waiting",
            ThreadState::Unknown => "unknown",
            ThreadState::Other(s) => s,
        }
    }

    /// Whether this build knows the state (probe rules may only assign known ones).
    pub fn is_known(&self) -> bool {
        !matches!(ThreadState::from(self.as_str()), ThreadState::Other(_))
    }

    /// Positive evidence that the engine works on a batch: running it, waiting for the GPU
    /// to finish it, or (vLLM) waiting for the workers that run it.
    pub fn is_working(&self) -> bool {
        matches!(
            self,
            ThreadState::RunningBatch | ThreadState::WaitingGpuResult | ThreadState::WaitingWorkers
        )
    }

    /// Blocked on other ranks or stages: a thread here waits for a peer, which is where a
    /// distributed hang shows (never reported as idle).
    pub fn is_peer_wait(&self) -> bool {
        matches!(
            self,
            ThreadState::Collective
                | ThreadState::NcclCollective
                | ThreadState::GlooCollective
                | ThreadState::P2pWait
        )
    }

    /// A state that says nothing about the engine's work: no rule matched, or a helper
    /// thread waiting for work.
    pub fn is_uninformative(&self) -> bool {
        matches!(self, ThreadState::Unknown | ThreadState::HelperIdle)
    }
}

impl From<&str> for ThreadState {
    fn from(s: &str) -> Self {
        ThreadState::KNOWN
            .into_iter()
            .find(|k| k.as_str() == s)
            .unwrap_or_else(|| ThreadState::Other(s.to_string()))
    }
}

impl From<String> for ThreadState {
    fn from(s: String) -> Self {
        match ThreadState::from(s.as_str()) {
            ThreadState::Other(_) => ThreadState::Other(s),
            known => known,
        }
    }
}

impl fmt::Display for ThreadState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `pad`, so width and alignment work as they did on the string.
        f.pad(self.as_str())
    }
}

impl fmt::Debug for ThreadState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl PartialEq for ThreadState {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for ThreadState {}

impl PartialOrd for ThreadState {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ThreadState {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl std::hash::Hash for ThreadState {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

/// `state == "idle"` compares with the contract's string.
impl PartialEq<str> for ThreadState {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ThreadState {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for ThreadState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ThreadState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(ThreadState::from)
    }
}

#[cfg(test)]
mod tests {
    use super::ThreadState;

    #[test]
    fn json_names_are_the_contract_strings() {
        let names = [
            "idle",
            "running_batch",
            "waiting_gpu_result",
            "nccl_collective",
            "gloo_collective",
            "pd_queue_polling",
            "stuck_outside_loop",
            "collective",
            "p2p_wait",
            "waiting_workers",
            "startup",
            "shutdown",
            "helper_idle",
            "waiting",
            "unknown",
        ];
        for (k, name) in ThreadState::KNOWN.iter().zip(names) {
            assert_eq!(serde_json::to_string(k).unwrap(), format!("\"{name}\""));
            let back: ThreadState = serde_json::from_str(&format!("\"{name}\"")).unwrap();
            assert_eq!(&back, k);
            assert!(back.is_known());
            assert_eq!(format!("{k}"), name);
        }
    }

    #[test]
    fn unknown_states_round_trip_verbatim() {
        let s: ThreadState = serde_json::from_str("\"napping\"").unwrap();
        assert_eq!(s, ThreadState::Other("napping".into()));
        assert!(!s.is_known());
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"napping\"");
        assert_eq!(ThreadState::Other("idle".into()), ThreadState::Idle);
        assert_eq!(format!("[{:<6}]", ThreadState::Idle), "[idle  ]");
        assert_eq!(ThreadState::default(), ThreadState::Unknown);
    }

    #[test]
    fn groups() {
        assert!(ThreadState::WaitingWorkers.is_working());
        assert!(!ThreadState::Idle.is_working());
        assert!(ThreadState::P2pWait.is_peer_wait());
        assert!(!ThreadState::Startup.is_peer_wait());
        assert!(ThreadState::HelperIdle.is_uninformative());
        assert!(!ThreadState::Idle.is_uninformative());
    }
}
