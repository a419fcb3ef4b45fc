//! One `py-spy dump` of one pid: the command line, a hard timeout that kills py-spy's whole
//! process group, capped output, and what a failure means (not Python, exited, ptrace
//! refused, a race with the running interpreter).

use crate::children::Spawned;
use crate::model::ThreadStack;
use crate::sources::pyspy_json::parse_dump;
use crate::sys::ProcFs;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::AsyncReadExt;

pub(super) fn ptrace_hint(proc: &ProcFs) -> String {
    let scope = proc
        .ptrace_scope()
        .map_or_else(|| "absent".to_string(), |s| s.to_string());
    format!(
        "permission denied attaching with ptrace: run as the target's user or root with \
         CAP_SYS_PTRACE (containers: --cap-add SYS_PTRACE), or lower kernel.yama.ptrace_scope \
         (now {scope})"
    )
}

/// What a failed py-spy run means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum DumpFailure {
    NotPython(String),
    Exited(String),
    Permission(String),
    Timeout(String),
    /// `--nonblocking` read the target while it changed (py-spy: "Failed to get stack
    /// traces"): worth one immediate retry.
    Race(String),
    Other(String),
}

impl DumpFailure {
    /// The failure's text, as a capture's error or skip reason says it.
    pub(super) fn reason(&self) -> &str {
        match self {
            DumpFailure::NotPython(r)
            | DumpFailure::Exited(r)
            | DumpFailure::Permission(r)
            | DumpFailure::Timeout(r)
            | DumpFailure::Race(r)
            | DumpFailure::Other(r) => r,
        }
    }
}

fn interpret_failure(proc: &ProcFs, pid: i32, stderr: &str, code: Option<i32>) -> DumpFailure {
    let first = excerpt(stderr);
    let lower = stderr.to_lowercase();
    let alive = proc.exists(pid).is_ok();
    if lower.contains("failed to find python version") {
        DumpFailure::NotPython(format!("not a Python process (py-spy: {first})"))
    } else if !alive || lower.contains("no such process") {
        DumpFailure::Exited(format!("process exited during the dump (py-spy: {first})"))
    } else if lower.contains("permission denied") || lower.contains("operation not permitted") {
        DumpFailure::Permission(format!("{} (py-spy: {first})", ptrace_hint(proc)))
    } else if lower.contains("failed to get stack traces") {
        DumpFailure::Race(format!(
            "py-spy read the process while it changed, twice (py-spy: {first})"
        ))
    } else {
        DumpFailure::Other(format!(
            "py-spy exited with {}: {first}",
            code.map_or("a signal".to_string(), |c| format!("code {c}"))
        ))
    }
}

pub(super) struct DumpOutcome {
    pub(super) threads: Vec<ThreadStack>,
    pub(super) failure: Option<DumpFailure>,
}

/// py-spy's JSON for one process is a few MB even with hundreds of deep threads; more is not
/// a stack dump, and reading it whole would cost us its size in memory.
pub const MAX_PY_SPY_STDOUT: usize = 16 << 20;
/// py-spy's errors are a few lines; more is noise we must not carry into a snapshot.
pub const MAX_PY_SPY_STDERR: usize = 64 << 10;
/// How much of py-spy's error output a status quotes.
const EXCERPT_CHARS: usize = 200;

/// The start of `text` on one line, at most [`EXCERPT_CHARS`] characters.
fn excerpt(text: &str) -> String {
    let one_line: String = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take(2)
        .collect::<Vec<_>>()
        .join(" / ");
    let mut out: String = one_line.chars().take(EXCERPT_CHARS).collect();
    if out.len() < one_line.len() {
        out.push_str("...");
    }
    out
}

/// Reads at most `cap` bytes; true when there was more (the rest is left unread).
async fn read_capped<R>(r: Option<&mut R>, cap: usize) -> (Vec<u8>, bool)
where
    R: tokio::io::AsyncRead + Unpin,
{
    let mut buf = Vec::new();
    if let Some(r) = r {
        let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
        let _ = r.take(limit).read_to_end(&mut buf).await;
    }
    let over = buf.len() > cap;
    buf.truncate(cap);
    (buf, over)
}

/// What one py-spy run printed, each stream capped, and how it ended.
struct Captured {
    out: Vec<u8>,
    err: Vec<u8>,
    /// The stream that went over its cap (the child was killed then).
    overflow: Option<(&'static str, usize)>,
    status: std::io::Result<std::process::ExitStatus>,
}

/// Reads both streams of `child` (each capped: past its cap the group is killed at once,
/// not when the timeout comes) and reaps it.
async fn capture(child: &mut tokio::process::Child, group: &Spawned) -> Captured {
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    // Past its cap a stream is left unread and the group killed: the other stream then ends.
    let capped = |name: &'static str, cap: usize, (buf, over): (Vec<u8>, bool)| {
        if over {
            group.kill();
        }
        (buf, over.then_some((name, cap)))
    };
    let ((out, o1), (err, o2)) = tokio::join!(
        async {
            let r = read_capped(stdout.as_mut(), MAX_PY_SPY_STDOUT).await;
            capped("stdout", MAX_PY_SPY_STDOUT, r)
        },
        async {
            let r = read_capped(stderr.as_mut(), MAX_PY_SPY_STDERR).await;
            capped("stderr", MAX_PY_SPY_STDERR, r)
        },
    );
    Captured {
        out,
        err,
        overflow: o1.or(o2),
        status: child.wait().await,
    }
}

/// The py-spy command line for one dump.
fn py_spy_command(py_spy: &Path, pid: i32, native: bool) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(py_spy);
    cmd.arg("dump").arg("--json");
    if native {
        cmd.arg("--native");
    } else {
        cmd.arg("--nonblocking");
    }
    cmd.arg("--pid")
        .arg(pid.to_string())
        // Backtraces in py-spy's error output would only make them harder to read.
        .env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    crate::children::die_with_parent(&mut cmd);
    cmd
}

/// Runs one `py-spy dump` in its own process group under a hard timeout; on timeout the
/// whole group is killed (py-spy stops ptrace on exit, so the target resumes).
pub(super) async fn run_py_spy(
    proc: &ProcFs,
    py_spy: &Path,
    pid: i32,
    native: bool,
    timeout: Duration,
) -> DumpOutcome {
    let fail = |f| DumpOutcome {
        threads: Vec::new(),
        failure: Some(f),
    };
    let mut child = match py_spy_command(py_spy, pid, native).spawn() {
        Ok(c) => c,
        Err(e) => {
            return fail(DumpFailure::Other(format!(
                "cannot run {}: {e}",
                py_spy.display()
            )))
        }
    };
    let Some(pgid) = child.id().and_then(|id| i32::try_from(id).ok()) else {
        return fail(DumpFailure::Other(
            "py-spy exited before it could be tracked".into(),
        ));
    };
    // Killed on every early exit of this function, by a timeout or by the future being
    // dropped (a signal, the end of a window).
    let mut group = Spawned::register(pgid);
    let Ok(c) = tokio::time::timeout(timeout, capture(&mut child, &group)).await else {
        group.kill();
        return fail(DumpFailure::Timeout(format!(
            "py-spy did not finish within {} ms and was killed",
            timeout.as_millis()
        )));
    };
    group.reaped();
    interpret_run(proc, pid, c)
}

/// What a finished py-spy run means.
fn interpret_run(proc: &ProcFs, pid: i32, c: Captured) -> DumpOutcome {
    let fail = |f| DumpOutcome {
        threads: Vec::new(),
        failure: Some(f),
    };
    let stderr = String::from_utf8_lossy(&c.err);
    if let Some((stream, cap)) = c.overflow {
        let shown = if stream == "stdout" {
            String::from_utf8_lossy(&c.out[..c.out.len().min(EXCERPT_CHARS)]).into_owned()
        } else {
            stderr.to_string()
        };
        return fail(DumpFailure::Other(format!(
            "py-spy wrote more than {} KiB to {stream} and was killed (starts: {})",
            cap >> 10,
            excerpt(&shown)
        )));
    }
    match c.status {
        Ok(s) if s.success() => match parse_dump(&c.out) {
            Ok(threads) => DumpOutcome {
                threads,
                failure: None,
            },
            Err(e) => fail(DumpFailure::Other(format!(
                "unreadable py-spy output: {}",
                excerpt(&e.to_string())
            ))),
        },
        Ok(s) => fail(interpret_failure(proc, pid, &stderr, s.code())),
        Err(e) => fail(DumpFailure::Other(format!("waiting for py-spy: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_interpreted() {
        let proc = ProcFs::real();
        let proc = &proc;
        let me = std::process::id() as i32;
        assert!(matches!(
            interpret_failure(
                proc,
                me,
                "Error: Failed to find python version from target process",
                Some(1)
            ),
            DumpFailure::NotPython(_)
        ));
        assert!(matches!(
            interpret_failure(proc, me, "Error: Permission denied (os error 13)", Some(1)),
            DumpFailure::Permission(r) if r.contains("CAP_SYS_PTRACE") && r.contains("ptrace_scope")
        ));
        assert!(matches!(
            interpret_failure(
                proc,
                i32::MAX,
                "Error: Failed to get process executable name",
                Some(1)
            ),
            DumpFailure::Exited(_)
        ));
        assert!(matches!(
            interpret_failure(
                proc,
                me,
                "Error: Failed to get stack traces\nCaused by: bad address",
                Some(1)
            ),
            DumpFailure::Race(_)
        ));
    }
}
