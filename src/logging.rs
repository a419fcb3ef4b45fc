//! Logs: `tracing` events on stderr, one line each, UTC timestamp and level, every line put
//! through the redaction pass before it is written: log lines end up in bug reports and shared
//! journals, and an error can quote a URL, an argv or a body, so the formatted line is scrubbed
//! whoever logged it. The daemon also teaches the redactor the secret values it sees
//! ([`learn_secrets`]).
//!
//! Under systemd (`$JOURNAL_STREAM`) each line starts with its `<N>` syslog priority. Lines go
//! through a bounded queue to a writer thread and are dropped (said) when it is full: sampling
//! never waits on a stalled journal. [`flush`] before exiting. Levels: `-v`/`-vv`/`--quiet`,
//! else `RUST_LOG`, else the verb's default ([`LogOptions::default_level`]).

use crate::model::ProcessFacts;
use crate::redact::{control, Redactor};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// What the command line says about logging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogOptions {
    /// Number of `-v`: 1 debug, 2 or more trace.
    pub verbose: u8,
    /// `--quiet`: warnings and errors only.
    pub quiet: bool,
    /// Without flags or `RUST_LOG`: `info` for the daemon (a service's log is its only
    /// voice), `warn` for verbs that print their own results.
    pub default_level: Level,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            verbose: 0,
            quiet: false,
            default_level: Level::WARN,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("RUST_LOG={value:?} is not a valid filter: {why}")]
    BadFilter { value: String, why: String },
    #[error("logging was already set up")]
    AlreadySet,
}

/// The filter directives for `opts` and the value of `RUST_LOG`. Flags pick a level for
/// wedgewatch's own events; other crates stay at `warn` either way.
pub fn directives(opts: &LogOptions, rust_log: Option<&str>) -> String {
    let flagged = match (opts.quiet, opts.verbose) {
        (_, v) if v >= 2 => Some(Level::TRACE),
        (_, 1) => Some(Level::DEBUG),
        (true, _) => Some(Level::WARN),
        _ => None,
    };
    if let Some(level) = flagged {
        return own_level(level);
    }
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        Some(s) => s.to_string(),
        None => own_level(opts.default_level),
    }
}

fn own_level(level: Level) -> String {
    // The binary's events come from the crate of the same name as the library's.
    format!("warn,wedgewatch={}", level.as_str().to_ascii_lowercase())
}

/// Installs the process-wide subscriber (once). The terminal UI must not call this: a log
/// line on stderr would land in the middle of its screen.
pub fn init(opts: &LogOptions) -> Result<(), LogError> {
    let rust_log = std::env::var("RUST_LOG").ok();
    let d = directives(opts, rust_log.as_deref());
    let filter = EnvFilter::builder()
        .parse(&d)
        .map_err(|e| LogError::BadFilter {
            value: d.clone(),
            why: e.to_string(),
        })?;
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Escape sequences would be escaped again by the redaction pass, and journald
        // stores them verbatim: plain text everywhere.
        .with_ansi(false)
        .with_target(false)
        .with_writer(RedactingStderr {
            journal: stderr_is_journal(),
        })
        .finish();
    tracing::subscriber::set_global_default(subscriber).map_err(|_| LogError::AlreadySet)
}

fn redactor() -> MutexGuard<'static, Redactor> {
    static R: OnceLock<Mutex<Redactor>> = OnceLock::new();
    // A panic while holding it cannot leave it half-updated in a way that matters: the set
    // of secrets only grows.
    R.get_or_init(|| Mutex::new(Redactor::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Teaches the log's redactor the secrets in these processes' env and argv, so their
/// values are scrubbed from every later line. The redactor's memory is bounded.
pub fn learn_secrets<'a>(facts: impl IntoIterator<Item = &'a ProcessFacts>) {
    let mut r = redactor();
    for f in facts {
        r.learn(f);
    }
}

/// One log line as written: secrets removed (by name, structure, shape, and every value
/// learned so far) and every control character escaped, newlines included, so one event
/// is one line.
pub fn redact_line(line: &str) -> String {
    let redacted = redactor().text(line);
    control::value(&redacted).into_owned()
}

/// The syslog priority journald reads from a `<N>` prefix.
fn priority(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

/// Whether stderr is the journal: `$JOURNAL_STREAM` names its device and inode (systemd
/// sets it for the service; a child whose stderr was redirected inherits it, hence the check).
fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Ok(st) = nix::sys::stat::fstat(std::io::stderr()) else {
        return false;
    };
    journal_matches(&v.to_string_lossy(), st.st_dev, st.st_ino)
}

fn journal_matches(stream: &str, dev: u64, ino: u64) -> bool {
    let mut it = stream.trim().split(':');
    let (Some(d), Some(i), None) = (it.next(), it.next(), it.next()) else {
        return false;
    };
    d.parse::<u64>().ok() == Some(dev) && i.parse::<u64>().ok() == Some(ino)
}

/// Hands the formatter a [`LineWriter`] per event.
struct RedactingStderr {
    journal: bool,
}

impl<'a> MakeWriter<'a> for RedactingStderr {
    type Writer = LineWriter;
    fn make_writer(&'a self) -> LineWriter {
        LineWriter::new(self.journal.then_some(6))
    }
    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> LineWriter {
        LineWriter::new(self.journal.then(|| priority(*meta.level())))
    }
}

/// Collects one formatted event, and writes it redacted when dropped (the formatter drops
/// its writer after each event).
pub struct LineWriter {
    buf: Vec<u8>,
    priority: Option<u8>,
}

impl LineWriter {
    fn new(priority: Option<u8>) -> Self {
        LineWriter {
            buf: Vec::new(),
            priority,
        }
    }
}

impl Write for LineWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.buf);
        let mut line = redact_line(text.trim_end_matches('\n'));
        if let Some(p) = self.priority {
            line.insert_str(0, &format!("<{p}>"));
        }
        line.push('\n');
        write_line(line, self.priority.is_some());
    }
}

/// Lines queued for stderr at most; past that they are dropped and counted.
const QUEUE: usize = 1024;

enum Msg {
    Line(String),
    /// Answered once every line queued before it is written.
    Flush(SyncSender<()>),
}

struct Sink {
    tx: SyncSender<Msg>,
    dropped: AtomicU64,
}

static SINK: OnceLock<Option<Sink>> = OnceLock::new();

fn sink() -> Option<&'static Sink> {
    SINK.get_or_init(|| {
        let (tx, rx) = sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("wedgewatch-log".into())
            .spawn(move || write_all(rx))
            .ok()?;
        Some(Sink {
            tx,
            dropped: AtomicU64::new(0),
        })
    })
    .as_ref()
}

fn write_all(rx: Receiver<Msg>) {
    for m in rx {
        match m {
            // Not eprintln!: it panics when stderr is gone (a closed pipe, a stopped
            // journal), and a daemon must outlive its log.
            Msg::Line(l) => {
                let _ = std::io::stderr().lock().write_all(l.as_bytes());
            }
            Msg::Flush(done) => {
                let _ = done.try_send(());
            }
        }
    }
}

fn write_line(line: String, journal: bool) {
    let Some(s) = sink() else {
        // no thread could be started: write in place rather than not at all
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        return;
    };
    let n = s.dropped.swap(0, Ordering::Relaxed);
    if n > 0 {
        let now = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let note = format!(
            "{}{now}  WARN {n} log lines dropped: stderr did not keep up\n",
            if journal { "<4>" } else { "" }
        );
        if s.tx.try_send(Msg::Line(note)).is_err() {
            s.dropped.fetch_add(n, Ordering::Relaxed);
        }
    }
    if s.tx.try_send(Msg::Line(line)).is_err() {
        s.dropped.fetch_add(1, Ordering::Relaxed);
    }
}

/// Waits (at most `within`) until the lines logged so far are written: call it before the
/// process exits.
pub fn flush(within: Duration) {
    // Nothing was logged (or no logging, as in the TUI): no thread to wait for.
    let Some(s) = SINK.get().and_then(Option::as_ref) else {
        return;
    };
    let deadline = Instant::now() + within;
    let (done_tx, done_rx) = sync_channel(1);
    let mut msg = Msg::Flush(done_tx);
    loop {
        match s.tx.try_send(msg) {
            Ok(()) => break,
            Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                msg = m;
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(_) => return,
        }
    }
    let _ = done_rx.recv_timeout(deadline.saturating_duration_since(Instant::now()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(verbose: u8, quiet: bool, default_level: Level) -> LogOptions {
        LogOptions {
            verbose,
            quiet,
            default_level,
        }
    }

    #[test]
    fn flags_before_rust_log_before_the_verbs_default() {
        let daemon = opts(0, false, Level::INFO);
        assert_eq!(directives(&daemon, None), "warn,wedgewatch=info");
        assert_eq!(directives(&daemon, Some("  ")), "warn,wedgewatch=info");
        assert_eq!(directives(&daemon, Some("warn")), "warn");
        let v = opts(1, false, Level::INFO);
        assert_eq!(directives(&v, Some("warn")), "warn,wedgewatch=debug");
        assert_eq!(
            directives(&opts(3, false, Level::WARN), None),
            "warn,wedgewatch=trace"
        );
        assert_eq!(
            directives(&opts(0, true, Level::INFO), Some("debug")),
            "warn,wedgewatch=warn"
        );
        assert_eq!(
            directives(&opts(2, true, Level::INFO), None),
            "warn,wedgewatch=trace",
            "-v wins over --quiet: asking for more is deliberate"
        );
        for d in [
            directives(&daemon, None),
            directives(&opts(2, false, Level::INFO), None),
        ] {
            assert!(EnvFilter::builder().parse(&d).is_ok(), "{d}");
        }
    }

    #[test]
    fn a_line_is_scrubbed_of_shapes_learned_values_and_control_characters() {
        let f = ProcessFacts {
            env: Some(
                [("WW_LOG_TEST_PASSWORD", "no-shape-at-all-42")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ProcessFacts::default()
        };
        learn_secrets([&f]);
        let line = redact_line(
            "finding opened: said no-shape-at-all-42 with hf_abcdefghijklmnopqrstuvwxyz012345\x1b]52;c;x\x07\nnext",
        );
        assert!(!line.contains("no-shape-at-all-42"), "{line}");
        assert!(!line.contains("hf_abcdefghijklmnop"), "{line}");
        assert!(!line.contains('\x1b') && !line.contains('\n'), "{line}");
        assert!(
            line.starts_with("finding opened: said <redacted>"),
            "{line}"
        );
    }

    #[test]
    fn journal_stream_must_name_stderr() {
        assert!(journal_matches("8:12345", 8, 12345));
        assert!(!journal_matches("8:12345", 8, 1));
        assert!(!journal_matches("8", 8, 12345));
        assert!(!journal_matches("8:1:2", 8, 1));
        assert_eq!(priority(Level::ERROR), 3);
        assert_eq!(priority(Level::TRACE), 7);
    }
}
