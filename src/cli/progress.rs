//! What a verb says on stderr while it works. Progress (a sampling window counting down,
//! `record --for`, the demo's steps) is drawn only when stderr is a terminal: a log or a
//! pipe gets none of it. Notes (where a bundle went, which daemon answered) are one line
//! each wherever stderr goes. `--quiet` silences both; errors are always printed.

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static QUIET: AtomicBool = AtomicBool::new(false);

/// How often the progress line is redrawn.
const TICK: Duration = Duration::from_millis(250);

/// `--quiet`: no progress, no notes.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// Whether progress is drawn: stderr is a terminal and `--quiet` was not given.
pub fn shown() -> bool {
    !quiet() && std::io::stderr().is_terminal()
}

/// A one-line note on stderr, unless `--quiet`.
pub fn note(msg: &str) {
    if !quiet() {
        // Not eprintln!: it panics when stderr is gone (a closed terminal).
        let _ = writeln!(std::io::stderr(), "wedgewatch: {msg}");
    }
}

/// A step of a longer job (the demo's), shown only as progress.
pub fn step(prefix: &str, msg: &str) {
    if shown() {
        let _ = writeln!(std::io::stderr(), "{prefix}: {msg}");
    }
}

/// The progress line for `elapsed` of `total`.
fn line(what: &str, elapsed: Duration, total: Duration) -> String {
    let left = total.saturating_sub(elapsed).as_secs_f64();
    let pct = if total.is_zero() {
        100.0
    } else {
        (elapsed.as_secs_f64() / total.as_secs_f64() * 100.0).min(100.0)
    };
    format!("wedgewatch: {what}: {pct:3.0}% ({left:.0} s left)")
}

/// Runs `work`, drawing a progress line for a job expected to take `total`; the line is
/// cleared when the work ends. Without a terminal this is just `work.await`.
pub async fn during<F: Future>(what: &str, total: Duration, work: F) -> F::Output {
    if !shown() || total < Duration::from_secs(1) {
        return work.await;
    }
    let start = Instant::now();
    tokio::pin!(work);
    loop {
        // \r and erase-line: the line is redrawn in place, and cleared at the end
        let l = line(what, start.elapsed(), total);
        let _ = write!(std::io::stderr(), "\r\x1b[2K{l}");
        tokio::select! {
            out = &mut work => {
                let _ = write!(std::io::stderr(), "\r\x1b[2K");
                return out;
            }
            _ = tokio::time::sleep(TICK) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_line_counts_down() {
        let l = line("sampling", Duration::from_secs(1), Duration::from_secs(4));
        assert_eq!(l, "wedgewatch: sampling:  25% (3 s left)");
        let l = line("recording", Duration::from_secs(9), Duration::from_secs(4));
        assert!(l.contains("100%") && l.contains("(0 s left)"), "{l}");
    }
}
