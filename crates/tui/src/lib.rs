//! The terminal UI (ratatui): it reads the contract (snapshots) only. The only crate that
//! depends on ratatui.
//!
//! Structure (tokio-console style): a [`Feed`] hands over [`FeedFrame`]s (snapshot + sampler
//! health) without ever blocking; [`App`] is the state (selection, filter, freeze, history
//! for sparklines) and turns keys into state changes; `render` draws the state. [`run`] ties
//! them to a real terminal.
//!
//! Wiring (integrator): live mode sends frames through [`ChannelFeed::channel`]; `--replay`
//! builds a [`ReplayFeed`] from recorded snapshots; `s` calls
//! [`AppOptions::snapshot_writer`] (plug `snapshot::write_bundle` there).

// No unwrap/expect in library code: a failed probe degrades, it never panics.
#![deny(clippy::unwrap_used, clippy::expect_used)]
// Rooms a reader can hold: thresholds in clippy.toml. Unit tests are exempt.
#![warn(clippy::too_many_lines, clippy::cognitive_complexity)]
#![cfg_attr(test, allow(clippy::too_many_lines, clippy::cognitive_complexity))]
// The signal handlers of `run` are installed through sigaction.
#![allow(unsafe_code)]

mod app;
mod feed;
mod render;

pub use app::{
    derive, lane_of, Action, App, AppOptions, Derived, GpuPoint, HistoryPoint, Lane, RequestRow,
    SnapshotWriter, SortKey, Tab, LANES,
};
pub use feed::{
    ChannelFeed, Feed, FeedFrame, FeedState, ReplayCommand, ReplayFeed, ReplayStatus,
    SamplerHealth, STILL_NOTE,
};
pub use render::{fmt_bytes, fmt_ms, sparkline, HELP, LEGEND};

use crate::error::{Error, Result};
use ratatui::crossterm::event::{self, Event, KeyEventKind};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use wedgewatch_model::{clock, error, model, redact};

impl App {
    /// Draws the current state. Never waits on anything; cost is bounded by what is visible.
    pub fn render(&self, frame: &mut ratatui::Frame) {
        render::render(self, frame);
    }
}

/// Set by SIGINT/SIGTERM/SIGHUP sent from outside (inside the UI, Ctrl-C is a key press
/// because raw mode turns ISIG off). The loop sees it within one tick and restores.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    STOP.store(true, Ordering::SeqCst);
}

/// The handlers that were in place before `run`, put back when it returns so the caller's
/// own Ctrl-C handling (e.g. the demo's teardown) works again afterwards.
struct StopSignals(Vec<(nix::sys::signal::Signal, nix::sys::signal::SigAction)>);

impl StopSignals {
    fn install() -> StopSignals {
        use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
        let action = SigAction::new(
            SigHandler::Handler(on_stop_signal),
            SaFlags::empty(),
            SigSet::empty(),
        );
        let mut previous = Vec::new();
        for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            // SAFETY: the handler only stores to an atomic.
            if let Ok(old) = unsafe { sigaction(sig, &action) } {
                previous.push((sig, old));
            }
        }
        StopSignals(previous)
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for (sig, old) in &self.0 {
            // SAFETY: restores the handler that was installed before.
            let _ = unsafe { nix::sys::signal::sigaction(*sig, old) };
        }
    }
}

/// `poll`, with a signal interrupting the wait counted as "no event" (the loop then sees STOP).
fn poll(timeout: Duration) -> Result<bool> {
    match event::poll(timeout) {
        Ok(ready) => Ok(ready),
        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(term_err(e)),
    }
}

fn term_err(e: std::io::Error) -> Error {
    Error::Other(format!("terminal: {e}"))
}

/// Runs the UI on the real terminal until `q`, Ctrl-C or a stop signal. The terminal is
/// restored on every exit path, including a panic (ratatui's panic hook).
pub fn run(feed: &mut dyn Feed, opts: AppOptions) -> Result<()> {
    let mut app = App::new(opts);
    STOP.store(false, Ordering::SeqCst);
    let _signals = StopSignals::install();
    let mut terminal = match ratatui::try_init() {
        Ok(t) => t,
        Err(e) => {
            restore_terminal();
            return Err(term_err(e));
        }
    };
    let _watchdog = HangupWatchdog::start();
    let result = event_loop(&mut terminal, feed, &mut app);
    restore_terminal();
    result
}

/// Leaves the alternate screen and raw mode. Never panics: `ratatui::restore` reports a
/// failure with `eprintln!`, which panics when the terminal is gone (a hang-up, the very
/// case where we restore from odd places), and a panic there skips every cleanup after it.
fn restore_terminal() {
    let _ = ratatui::try_restore();
}

/// Run by the hang-up watchdog just before it ends the process, where no destructor runs:
/// e.g. the demo's lab teardown, so a killed terminal does not leave the lab behind.
static ON_FORCED_EXIT: std::sync::Mutex<Option<Box<dyn FnOnce() + Send>>> =
    std::sync::Mutex::new(None);

/// Registers what to clean up if the UI has to end the process on a dead terminal.
pub fn on_forced_exit(cleanup: impl FnOnce() + Send + 'static) {
    if let Ok(mut slot) = ON_FORCED_EXIT.lock() {
        *slot = Some(Box::new(cleanup));
    }
}

/// Ends the process when the loop has not returned 2 s after STOP (SIGHUP/SIGTERM/SIGINT) was
/// set, or when stdout stopped being a terminal (a hung-up tty answers every ioctl with EIO,
/// and only the session leader gets SIGHUP): crossterm's `poll` can spin forever on a dead tty,
/// and a UI must never outlive its terminal burning a core.
struct HangupWatchdog(Arc<AtomicBool>);

impl HangupWatchdog {
    fn start() -> HangupWatchdog {
        let done = Arc::new(AtomicBool::new(false));
        let seen = done.clone();
        let on_a_terminal = std::io::stdout().is_terminal();
        let _ = std::thread::Builder::new()
            .name("tui-hangup-watchdog".into())
            .spawn(move || {
                let mut stopped_for = 0u32;
                while !seen.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(100));
                    if on_a_terminal && !std::io::stdout().is_terminal() {
                        STOP.store(true, Ordering::SeqCst);
                    }
                    if STOP.load(Ordering::SeqCst) {
                        stopped_for += 1;
                        if stopped_for >= 20 && !seen.load(Ordering::SeqCst) {
                            restore_terminal();
                            let cleanup = ON_FORCED_EXIT.lock().ok().and_then(|mut c| c.take());
                            if let Some(cleanup) = cleanup {
                                cleanup();
                            }
                            std::process::exit(129);
                        }
                    }
                }
            });
        HangupWatchdog(done)
    }
}

impl Drop for HangupWatchdog {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

fn event_loop(
    terminal: &mut ratatui::DefaultTerminal,
    feed: &mut dyn Feed,
    app: &mut App,
) -> Result<()> {
    let tick = Duration::from_millis(app.options().tick_ms.max(10));
    // A hung-up terminal (its window closed, the pty gone) makes poll return at once with
    // nothing to read, forever: without this the UI would spin on a dead terminal.
    let mut empty_wakeups = 0u32;
    // Likewise an endless stream of non-key events (a dead terminal, not a person).
    let mut events_without_key = 0u32;
    loop {
        let now = app.options().clock.now_ms();
        if let Some(frame) = feed.latest(now) {
            app.ingest(frame);
        }
        app.set_feed_state(feed.state());
        terminal.draw(|f| app.render(f)).map_err(term_err)?;
        if STOP.load(Ordering::SeqCst) {
            return Ok(());
        }
        let waited = std::time::Instant::now();
        if !poll(tick)? {
            if waited.elapsed() < tick / 2 {
                empty_wakeups += 1;
                if empty_wakeups >= 50 {
                    return Err(Error::Other("terminal: hung up (no input, no wait)".into()));
                }
            } else {
                empty_wakeups = 0;
            }
            continue;
        }
        empty_wakeups = 0;
        // Everything already queued, so a burst of keys costs one redraw; bounded, and
        // re-checking the stop flag, so an endless stream of events from a dead terminal
        // can neither spin here nor outlive a SIGTERM.
        for _ in 0..256 {
            if STOP.load(Ordering::SeqCst) {
                return Ok(());
            }
            let ev = event::read().map_err(term_err)?;
            if matches!(ev, Event::Key(_)) {
                events_without_key = 0;
            } else {
                events_without_key += 1;
                if events_without_key >= 10_000 {
                    return Err(Error::Other(
                        "terminal: hung up (endless events, no keys)".into(),
                    ));
                }
            }
            if let Event::Key(key) = ev {
                if key.kind == KeyEventKind::Press {
                    match app.handle_key(key) {
                        Action::Quit => return Ok(()),
                        Action::Replay(cmd) => {
                            let now = app.options().clock.now_ms();
                            if !feed.control(cmd, now) {
                                app.set_status("replay keys work only with --replay");
                            }
                        }
                        Action::None => {}
                    }
                }
            }
            if !poll(Duration::ZERO)? {
                break;
            }
        }
    }
}
