//! Live processes with SGLang's shapes (tests/fixtures/pyshapes), killed on drop.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

pub fn pyshapes() -> PathBuf {
    crate::repo_root().join("tests/fixtures/pyshapes")
}

pub fn fixture_proc(name: &str) -> PathBuf {
    crate::repo_root().join("tests/fixtures/proc").join(name)
}

/// A free loopback port (bound then released; the kernel does not hand it out again soon).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

/// A process group started for a test; the whole group is SIGKILLed on drop.
pub struct Shape {
    child: Child,
    pub pid: i32,
    /// The words after `READY` on its first stdout line.
    pub ready: Vec<String>,
}

impl Shape {
    /// Starts `argv` in its own process group with PYTHONPATH at pyshapes, waits for READY.
    pub fn start(argv: &[&str], env: &[(&str, &str)]) -> Shape {
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .current_dir(pyshapes())
            .env("PYTHONPATH", pyshapes())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0);
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
        let pid = child.id() as i32;
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let mut shape = Shape {
            child,
            pid,
            ready: Vec::new(),
        };
        let line = rx
            .recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("{argv:?} did not get ready in 20 s"));
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("READY"), "{argv:?} said {line:?}");
        shape.ready = words.map(str::to_string).collect();
        shape
    }

    /// Starts `argv` in its own process group without waiting for READY and without the
    /// pyshapes on PYTHONPATH (for real programs such as the real router).
    pub fn spawn_real(argv: &[&str], env: &[(&str, &str)]) -> Shape {
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .current_dir(std::env::temp_dir())
            .env_remove("PYTHONPATH")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {argv:?}: {e}"));
        let pid = child.id() as i32;
        Shape {
            child,
            pid,
            ready: Vec::new(),
        }
    }

    /// An SGLang engine shape.
    pub fn engine(mode: &str, port: u16, tp: u32, extra: &[&str], env: &[(&str, &str)]) -> Shape {
        let port = port.to_string();
        let tp = tp.to_string();
        let mut argv = vec![
            "python3",
            "-m",
            "sglang.launch_server",
            "--disaggregation-mode",
            mode,
            "--port",
            &port,
            "--tp-size",
            &tp,
        ];
        argv.extend_from_slice(extra);
        Shape::start(&argv, env)
    }

    /// Pids of the children it reported (schedulers, detokenizer), in title order.
    pub fn child_pids(&self) -> Vec<i32> {
        self.ready
            .iter()
            .skip(1)
            .filter_map(|w| w.parse().ok())
            .collect()
    }
}

impl Drop for Shape {
    fn drop(&mut self) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lab venv's python when the real router (sglang-router) is installed there
/// (`WEDGEWATCH_LAB_VENV` or `tests/lab/.venv`; created by `python3 tests/lab/lab.py setup`).
pub fn lab_python_with_router() -> Option<PathBuf> {
    let venv = std::env::var_os("WEDGEWATCH_LAB_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::repo_root().join("tests/lab/.venv"));
    let py = venv.join("bin/python");
    let has_router = std::fs::read_dir(venv.join("lib"))
        .ok()?
        .flatten()
        .any(|d| d.path().join("site-packages/sglang_router").is_dir());
    (py.is_file() && has_router).then_some(py)
}

/// The wedgewatch binary under test: beside the test binary's `deps/` folder, where cargo
/// builds it for every integration test.
pub fn wedgewatch() -> Command {
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>");
    Command::new(dir.join("wedgewatch"))
}

/// A snapshot (processes only) of the components whose main pid is one of `pids`, and their
/// children: tests on a shared machine must not depend on other people's processes.
pub fn snapshot_of(pids: &[i32], redact: bool) -> wedgewatch::model::Snapshot {
    use wedgewatch::discover::{self, DiscoverOptions};
    use wedgewatch::snapshot::{self, AssembleOptions};
    use wedgewatch::sources::processes::ProcessesSource;
    let probes = wedgewatch::probes::ProbeSet::builtin().expect("probes");
    let mut topo = discover::discover(&probes, &DiscoverOptions::default()).expect("discover");
    let ours: Vec<String> = topo
        .components
        .iter()
        .filter(|c| c.main_pid.is_some_and(|p| pids.contains(&p)))
        .map(|c| c.id.clone())
        .collect();
    topo.components
        .retain(|c| ours.contains(&c.id) || c.parent.as_ref().is_some_and(|p| ours.contains(p)));
    topo.edges
        .retain(|e| ours.contains(&e.from) && ours.contains(&e.to));
    let (facts, status) = ProcessesSource::new("/proc").collect(&topo.pids());
    let parts = snapshot::process_only_parts(
        topo,
        facts,
        status,
        wedgewatch::clock::Clock::now_ms(&wedgewatch::clock::SystemClock),
    );
    snapshot::assemble(
        parts,
        &AssembleOptions {
            redact,
            ..AssembleOptions::default()
        },
    )
}
