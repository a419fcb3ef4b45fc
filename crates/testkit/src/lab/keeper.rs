//! The lab's parent process (`tests/lab/keeper.py`): the commands that start, restart and
//! stop a lab's components run under it, so the lab, restarts included, is its process tree
//! and a test's wedgewatch watches that lab alone (`--within` [`Keeper::pid`]).

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a keeper that was told to end may take before it is killed.
const END_GRACE: Duration = Duration::from_secs(5);

pub struct Keeper {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl Keeper {
    /// Starts `keeper.py` from the lab directory `lab_dir` and waits for its ready line.
    pub fn start(lab_dir: &Path) -> Result<Keeper, String> {
        let mut child = Command::new("python3")
            .arg(lab_dir.join("keeper.py"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start the lab's keeper: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err("the keeper's pipes were not opened".into());
        };
        let pid = child.id();
        let mut keeper = Keeper {
            child,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
        };
        let ready = keeper.answer()?;
        if ready["ready"].as_u64() != Some(u64::from(pid)) {
            return Err(format!("the keeper said {ready} instead of its pid {pid}"));
        }
        Ok(keeper)
    }

    /// The root of the lab's process tree.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Runs `argv` under the keeper to its end: its stdout, or an error with its stderr.
    pub fn run(&mut self, argv: &[String]) -> Result<String, String> {
        self.send(&serde_json::json!(argv), argv)
    }

    /// [`Keeper::run`], its process group killed past `bound` (an error then).
    pub fn run_bounded(&mut self, argv: &[String], bound: Duration) -> Result<String, String> {
        let cmd = serde_json::json!({ "argv": argv, "timeout": bound.as_secs_f64() });
        self.send(&cmd, argv)
    }

    fn send(&mut self, cmd: &Value, argv: &[String]) -> Result<String, String> {
        let line = cmd.to_string();
        let stdin = self.stdin.as_mut().ok_or("the keeper has ended")?;
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("the keeper is gone ({e}) before {argv:?}"))?;
        let done = self.answer()?;
        let text = |k: &str| done[k].as_str().unwrap_or_default().to_string();
        match done["rc"].as_i64() {
            Some(0) => Ok(text("out")),
            rc => Err(format!("{argv:?} failed ({rc:?}):\n{}", text("err"))),
        }
    }

    /// The keeper's next line, as JSON.
    fn answer(&mut self) -> Result<Value, String> {
        let mut line = String::new();
        match self.stdout.read_line(&mut line) {
            Ok(0) => Err("the keeper ended without answering".into()),
            Ok(_) => serde_json::from_str(&line).map_err(|e| format!("keeper said {line:?}: {e}")),
            Err(e) => Err(format!("reading the keeper: {e}")),
        }
    }
}

impl Drop for Keeper {
    /// Ends the keeper (its stdin closed), killed if it does not end within [`END_GRACE`].
    fn drop(&mut self) {
        self.stdin = None;
        let started = Instant::now();
        while started.elapsed() < END_GRACE {
            if matches!(self.child.try_wait(), Ok(Some(_)) | Err(_)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
