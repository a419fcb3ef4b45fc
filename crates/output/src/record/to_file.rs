//! `wedgewatch record -o FILE --for DURATION`: a stream of samples, the topology and a
//! baseline written into one recording file. The sampler producing the stream is run by
//! `attach::record_to_file` (runtime layer): a recording only ever sees samples.

use super::{Baseline, Record, RecordingWriter};
use crate::clock::Clock;
use crate::error::Result;
use crate::model::{Sample, Topology};
use std::path::Path;
use tokio::sync::mpsc;

/// Writes to `path` (appending) the topology, then every sample received from `rx` until
/// `until` (tokio time) or until the stream ends, plus a baseline from the first processes
/// sample. Returns the samples written; stops at the first write error.
pub async fn record_samples(
    rx: &mut mpsc::Receiver<Sample>,
    path: &Path,
    until: tokio::time::Instant,
    topology: &Topology,
    clock: &dyn Clock,
) -> Result<u64> {
    let mut w = RecordingWriter::create_file(path, clock.now_ms())?;
    w.write(&Record::Topology {
        t_ms: clock.now_ms(),
        topology: topology.clone(),
    })?;
    let mut n = 0;
    let mut baselined = false;
    while let Ok(Some(s)) = tokio::time::timeout_at(until, rx.recv()).await {
        if let (false, crate::model::Payload::Processes(p)) = (baselined, &s.payload) {
            let b = Baseline::take(s.t_ms, topology, p, "start");
            if !b.components.is_empty() {
                baselined = true;
                w.write(&Record::Baseline { baseline: b })?;
            }
        }
        if w.write_sample(&s)? {
            n += 1;
        }
    }
    Ok(n)
}
