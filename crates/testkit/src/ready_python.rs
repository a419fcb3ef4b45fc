//! A `python3 -c CODE ARGS...` that prints `ready` once it has set itself up, killed on drop:
//! a real process in the state a test needs (files mapped, a chroot entered).

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

pub struct ReadyPython(Child);

impl ReadyPython {
    /// Starts it and waits for its `ready` line; `what` names the set-up in the failure.
    pub fn start(code: &str, args: &[&std::ffi::OsStr], what: &str) -> ReadyPython {
        let mut child = Command::new("python3")
            .args(["-c", code])
            .args(args)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        let out = child.stdout.take().expect("stdout");
        std::io::BufReader::new(out)
            .read_line(&mut line)
            .expect("ready");
        let process = ReadyPython(child);
        assert_eq!(line.trim(), "ready", "the process could not {what}");
        process
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for ReadyPython {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
