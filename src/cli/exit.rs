//! How a verb's async work ends: a signal kills every child we spawned before the process
//! exits, and the runtime never waits at exit for a thread stuck in a read.
//!
//! py-spy children run in their own process groups, so a terminal's Ctrl-C does not reach
//! them and nothing else would stop them when we die: the handler here kills them
//! (`wedgewatch::children`), and each one also dies with us by `PR_SET_PDEATHSIG`.

use anyhow::Context;
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
    let rt = runtime()?;
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

/// The runtime every verb's async work runs on.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        // More workers than cores: a worker blocked on the model lock must not starve sampling.
        .worker_threads(4)
        .enable_all()
        .build()
        .context("starting the async runtime")
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

/// Exit codes, as `--help` and the README document them.
pub mod code {
    /// Nothing found (or, for `diff`, no differences); `check`: OK.
    pub const OK: i32 = 0;
    /// Found: findings at or above `--fail-on`, differences; `check`: WARNING.
    pub const FOUND: i32 = 1;
    /// Usage or input error; `check`: CRITICAL.
    pub const USAGE: i32 = 2;
    /// Could not sample at all; `check`: UNKNOWN (also for its usage errors).
    pub const UNSAMPLED: i32 = 3;
}

/// The error of a verb that could not sample at all (exit 3), as opposed to bad input
/// (exit 2): discovery, the runtime or every source failed.
#[derive(Debug, thiserror::Error)]
#[error("could not sample: {0:#}")]
pub struct CouldNotSample(pub anyhow::Error);

/// The exit code for an error that ended a verb.
pub fn code_of(e: &anyhow::Error) -> i32 {
    if e.downcast_ref::<CouldNotSample>().is_some() {
        code::UNSAMPLED
    } else {
        code::USAGE
    }
}

/// The error and its causes on one line, each cause once: an I/O error whose message
/// already quotes its OS error does not repeat it.
pub fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    // host text in an error (a path, a process name) must not carry live escapes or secrets
    wedgewatch::redact::log_line(&out).replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn a_cause_already_quoted_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let e: anyhow::Error = wedgewatch::error::Error::io("/x/missing.rec", io).into();
        let line = one_line(&e.context("opening the recording"));
        assert_eq!(line.matches("os error 2").count(), 1, "{line}");
        assert!(
            line.starts_with("opening the recording: /x/missing.rec"),
            "{line}"
        );
    }

    #[test]
    fn sampling_failures_are_exit_3() {
        let e = anyhow::Error::new(CouldNotSample(anyhow::anyhow!("no procfs")));
        assert_eq!(code_of(&e), code::UNSAMPLED);
        assert_eq!(code_of(&anyhow::anyhow!("bad flag")), code::USAGE);
        let wrapped: anyhow::Result<()> = Err(e);
        let wrapped = wrapped.context("snapshot").expect_err("err");
        assert_eq!(code_of(&wrapped), code::UNSAMPLED);
    }
}
