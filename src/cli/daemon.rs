//! `wedgewatch daemon`: sample continuously (bounded history, recording, baselines) and
//! serve the live state on an owner-only socket.

use super::duration;
use super::exit::{self, code};
use super::options::Sampling;
use anyhow::Context;
use clap::Args;
use std::sync::Arc;
use std::time::Duration;
use wedgewatch::clock::SystemClock;
use wedgewatch::daemon::incidents::IncidentPolicy;
use wedgewatch::daemon::Daemon;

/// How long a stopped daemon may take to wind down (socket removed, recording flushed).
const DAEMON_STOP: Duration = Duration::from_secs(2);

const EXAMPLES: &str = "\
Examples:
  wedgewatch daemon                       # until SIGINT/SIGTERM
  wedgewatch daemon --for 1h --no-record
  wedgewatch daemon --metrics-listen 127.0.0.1:9466   # Prometheus scrapes /metrics there
  wedgewatch daemon --incidents-keep 50 --incidents-max-mib 1024
  wedgewatch incidents                    # from another shell: the incident bundles kept
  wedgewatch snapshot --json              # from another shell: instant, from the daemon

Exit status: 0 stopped, 2 usage error (e.g. another daemon holds the state directory),
3 could not sample at all.";

#[derive(Debug, Args)]
#[command(after_help = EXAMPLES)]
pub struct DaemonArgs {
    /// Keep history in memory only (no recording on disk).
    #[arg(long)]
    pub no_record: bool,
    /// Stop after this long (500ms, 90s, 10m, 1h30m; a bare number is seconds);
    /// default: until SIGINT/SIGTERM.
    #[arg(long = "for", value_name = "DURATION", value_parser = duration::parse)]
    pub run_for: Option<Duration>,
    /// Serve `GET /metrics` in the Prometheus text format on this address (IP:PORT, e.g.
    /// 127.0.0.1:9466, or 0.0.0.0:9466 for a scraper on another host); empty or default: no
    /// exporter.
    #[arg(long, value_name = "ADDR", value_parser = listen_addr)]
    pub metrics_listen: Option<MetricsListen>,
    /// Incident bundles kept in the state directory's incidents/ at most, oldest removed
    /// first (default 16; 0: none written). One is written when a critical finding opens.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=10_000))]
    pub incidents_keep: Option<u32>,
    /// Mebibytes the kept incident bundles hold together at most (default 256).
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub incidents_max_mib: Option<u64>,
    #[command(flatten)]
    pub sampling: Sampling,
}

/// `--metrics-listen`'s value: an address, or none when given empty (a service's
/// environment file that clears the variable turns the exporter off; it does not stop the
/// service from starting).
#[derive(Debug, Clone, Copy)]
pub struct MetricsListen(Option<std::net::SocketAddr>);

fn listen_addr(s: &str) -> Result<MetricsListen, String> {
    if s.trim().is_empty() {
        return Ok(MetricsListen(None));
    }
    s.parse()
        .map(|a| MetricsListen(Some(a)))
        .map_err(|e| format!("{e} (expected IP:PORT, or empty for no exporter)"))
}

/// What `--incidents-keep` and `--incidents-max-mib` say (None: keep none).
fn incident_policy(keep: Option<u32>, max_mib: Option<u64>) -> Option<IncidentPolicy> {
    let d = IncidentPolicy::default();
    let keep = keep.map_or(d.keep, |n| n as usize);
    (keep > 0).then(|| IncidentPolicy {
        keep,
        max_bytes: max_mib.map_or(d.max_bytes, |m| m << 20),
        ..d
    })
}

/// Resolves on SIGINT/SIGTERM, or after `run_for`.
async fn stop_signal(run_for: Option<Duration>) {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    let timer = async {
        match run_for {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
        _ = timer => {}
    }
}

pub fn run(top: Sampling, a: DaemonArgs) -> anyhow::Result<i32> {
    let s = Sampling::merge(top, a.sampling);
    let opts = s.attach_options()?.sharing_socket_dumps();
    let mut cfg = s.daemon_config();
    cfg.thresholds = opts.thresholds.clone();
    if a.no_record {
        cfg.rotation = None;
    }
    cfg.metrics_listen = a.metrics_listen.and_then(|m| m.0);
    cfg.incidents = incident_policy(a.incidents_keep, a.incidents_max_mib);
    let rt = exit::runtime()?;
    let ran = rt.block_on(async {
        let mut d = Daemon::new(cfg.clone(), Arc::new(SystemClock), opts.discover_fn());
        for (src, every, timeout) in opts.daemon_sources(d.suspicion_fn())? {
            d.add_source(src, every, timeout);
        }
        // Where the socket and recording are is the daemon's first log line.
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut task = tokio::spawn(d.run(rx));
        // A daemon that cannot start (the state directory locked, the metrics address
        // taken) ends at once, with its error: not when it is told to stop.
        let ended = tokio::select! {
            _ = stop_signal(a.run_for) => None,
            joined = &mut task => Some(joined),
        };
        if let Some(joined) = ended {
            return joined.context("daemon task")?.map_err(anyhow::Error::from);
        }
        let _ = tx.send(true);
        // In-flight samples are cut short on stop; a daemon that still does not end
        // (a stuck write) is abandoned rather than waited for.
        match tokio::time::timeout(DAEMON_STOP, &mut task).await {
            Ok(joined) => joined.context("daemon task")??,
            Err(_) => {
                task.abort();
                tracing::warn!(
                    "daemon did not stop within {} ms; abandoned",
                    DAEMON_STOP.as_millis()
                );
            }
        }
        anyhow::Ok(())
    });
    exit::shut_down(rt);
    ran?;
    Ok(code::OK)
}
