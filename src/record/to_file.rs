//! `wedgewatch record -o FILE --for DURATION`: a sampler's samples, the topology and a
//! baseline written into one recording file.

use super::{Baseline, Record, RecordingWriter};
use crate::clock::Clock;
use crate::error::Result;
use crate::model::Topology;
use std::path::Path;

/// `wedgewatch record -o FILE --for DURATION` in one call: runs the sampler for
/// `duration_ms` (tokio time), writes every sample to `path` (appending), plus the topology
/// and a baseline from the first processes sample. Returns the samples written.
pub async fn record_to_file(
    sampler: crate::sampler::Sampler,
    path: &Path,
    duration_ms: u64,
    topology: &Topology,
    clock: std::sync::Arc<dyn Clock>,
) -> Result<u64> {
    let mut w = RecordingWriter::create_file(path, clock.now_ms())?;
    w.write(&Record::Topology {
        t_ms: clock.now_ms(),
        topology: topology.clone(),
    })?;
    let (tx, mut rx) = tokio::sync::mpsc::channel(4096);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(sampler.run(tx, stop_rx));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(duration_ms);
    let mut n = 0;
    let mut baselined = false;
    let mut result = Ok(());
    while let Ok(Some(s)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        if let (false, crate::model::Payload::Processes(p)) = (baselined, &s.payload) {
            let b = Baseline::take(s.t_ms, topology, p, "start");
            if !b.components.is_empty() {
                baselined = true;
                if let Err(e) = w.write(&Record::Baseline { baseline: b }) {
                    result = Err(e);
                    break;
                }
            }
        }
        match w.write_sample(&s) {
            Ok(true) => n += 1,
            Ok(false) => {}
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    let _ = stop_tx.send(true);
    drop(rx);
    let _ = task.await;
    result.map(|()| n)
}
