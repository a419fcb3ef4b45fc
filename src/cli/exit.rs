//! How a verb's async work ends: a signal kills every child we spawned before the process
//! exits, and the runtime never waits at exit for a thread stuck in a read.
//!
//! py-spy children run in their own process groups, so a terminal's Ctrl-C does not reach
//! them and nothing else would stop them when we die: the handler here kills them
//! (`wedgewatch::children`), and each one also dies with us by `PR_SET_PDEATHSIG`.

use std::future::Future;
use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};
use wedgewatch::children;

/// How long the runtime's shutdown waits for its tasks and blocking threads. Every blocking
/// read is under its own deadline, so this only matters for one that is not; past it the
/// thread is abandoned (the process exit ends it).
const RUNTIME_EXIT: Duration = Duration::from_millis(500);

/// The exit status for a signal, as a shell reports it.
fn status(sig: i32) -> i32 {
    128 + sig
}

/// The signals that end a verb, with their handlers installed (None: could not install).
struct Signals([(Option<Signal>, i32); 3]);

impl Signals {
    /// Installs the handlers now: a signal that arrives before the first poll is not lost.
    fn install() -> Signals {
        let one = |k: SignalKind, n: i32| (signal(k).ok(), n);
        Signals([
            one(SignalKind::interrupt(), libc::SIGINT),
            one(SignalKind::terminate(), libc::SIGTERM),
            one(SignalKind::hangup(), libc::SIGHUP),
        ])
    }

    /// The number of the first signal received.
    async fn first(&mut self) -> i32 {
        async fn recv(s: &mut (Option<Signal>, i32)) -> i32 {
            match &mut s.0 {
                Some(sig) => {
                    sig.recv().await;
                    s.1
                }
                None => std::future::pending().await,
            }
        }
        let [a, b, c] = &mut self.0;
        tokio::select! {
            n = recv(a) => n,
            n = recv(b) => n,
            n = recv(c) => n,
        }
    }
}

/// Runs `work` on a fresh runtime. A SIGINT, SIGTERM or SIGHUP ends it at once: every child
/// is killed and the process exits with 128 + the signal.
pub fn block_on<F: Future>(work: F) -> anyhow::Result<F::Output> {
    let rt = crate::runtime()?;
    let out = rt.block_on(async {
        let mut signals = Signals::install();
        tokio::select! {
            r = work => Ok(r),
            n = signals.first() => Err(n),
        }
    });
    match out {
        Ok(v) => {
            shut_down(rt);
            Ok(v)
        }
        Err(sig) => exit_on_signal(rt, sig),
    }
}

/// Kills what we spawned and stops the runtime without waiting on stuck threads.
pub fn shut_down(rt: tokio::runtime::Runtime) {
    children::kill_all();
    rt.shutdown_timeout(RUNTIME_EXIT);
}

fn exit_on_signal(rt: tokio::runtime::Runtime, sig: i32) -> ! {
    let n = children::kill_all();
    eprintln!("wedgewatch: stopped by signal {sig}; killed {n} child process group(s)");
    rt.shutdown_background();
    std::process::exit(status(sig));
}
