//! Issue 34 items 2 and 8: the operator's router key (`--router-key-env NAME`, in
//! wedgewatch's own environment) against router look-alikes: real processes titled like a
//! router (`... -m sglang_router.launch_router --port P`), running as root like us, serving
//! HTTP, logging the `Authorization` header of every request they get and echoing the key in
//! it back (in a `/workers` worker URL and as a metric label).
//!
//! - `asks`: our namespace, `NAME` in its environment (empty there): it gets the key;
//! - `never_asked`: our namespace, names nothing: no key;
//! - `contained`: `NAME` in its environment, but in a network namespace of its own (a root
//!   container's, `unshare -n`): no key, though it is scraped in there.
//!
//! The key `asks` echoes appears nowhere in the snapshot bundle (`raw/metrics.json` held it
//! before). Look-alikes are seen by every discovery on the machine: run under the lab lock.

use wedgewatch_testkit::lab;
use wedgewatch_testkit::written;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use written::files_under;

const KEY: &str = "ww-operator-router-key-5d2e81";
const KEY_ENV: &str = "WW_TEST_OPERATOR_ROUTER_KEY";

/// A router look-alike: answers `/workers` (401 without a key, else the key echoed in a
/// worker URL) and `/metrics` (the key echoed in a label), logging `PATH AUTH` per request.
const LOOKALIKE: &str = r#"
import http.server, sys, threading
args = sys.argv[1:]
flag = lambda n: args[args.index(n) + 1]
log = open(flag("--log-file"), "a", buffering=1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        auth = self.headers.get("Authorization", "-")
        log.write(f"{self.path} {auth}\n")
        # The key alone, as a router may echo it (a "Bearer KEY" pair is redacted by shape).
        key = auth.removeprefix("Bearer ")
        if self.path.startswith("/workers"):
            if auth == "-":
                body, status, ctype = b"unauthorized", 401, "text/plain"
            else:
                body = ('{"workers":[{"url":"http://127.0.0.1:9/%s"}]}' % key).encode()
                status, ctype = 200, "application/json"
        elif self.path.startswith("/metrics"):
            body = ('sgl_router_running_requests{echo="%s"} 1\n' % key).encode()
            status, ctype = 200, "text/plain; version=0.0.4"
        else:
            body, status, ctype = b"", 404, "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
servers = [http.server.ThreadingHTTPServer(("127.0.0.1", int(flag(f))), H)
           for f in ("--port", "--prometheus-port")]
for s in servers[1:]:
    threading.Thread(target=s.serve_forever, daemon=True).start()
log.write("ready -\n")
servers[0].serve_forever()
"#;

/// Killed with its process group on drop.
struct Lookalike {
    child: Child,
    log: PathBuf,
}

impl Drop for Lookalike {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Lookalike {
    /// `PATH AUTH` lines of the requests it got.
    fn requests(&self) -> Vec<(String, String)> {
        let f = std::fs::File::open(&self.log).expect("look-alike log");
        std::io::BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .filter_map(|l| {
                let (p, a) = l.split_once(' ')?;
                (p != "ready").then(|| (p.to_string(), a.to_string()))
            })
            .collect()
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// Starts a look-alike (in a network namespace of its own with `own_netns`), with `env`
/// added to an empty environment, and waits until it serves.
fn start(dir: &Path, name: &str, own_netns: bool, env: &[(&str, &str)]) -> Lookalike {
    let script = dir.join("lookalike.py");
    std::fs::write(&script, LOOKALIKE).expect("script");
    let log = dir.join(format!("{name}.log"));
    let (port, mport) = (free_port(), free_port());
    let mut argv: Vec<String> = vec!["python3".into(), script.display().to_string()];
    argv.extend(
        [
            "-m",
            "sglang_router.launch_router",
            "--host",
            "127.0.0.1",
            "--prometheus-host",
            "127.0.0.1",
        ]
        .map(String::from),
    );
    argv.extend([
        "--port".into(),
        port.to_string(),
        "--prometheus-port".into(),
        mport.to_string(),
        "--log-file".into(),
        log.display().to_string(),
    ]);
    let mut cmd = if own_netns {
        // A root container's network: a namespace of its own with only its loopback up.
        let mut c = Command::new("unshare");
        c.args(["-n", "sh", "-c", r#"ip link set lo up && exec "$@""#, "sh"]);
        c.args(&argv);
        c
    } else {
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..]);
        c
    };
    use std::os::unix::process::CommandExt;
    let child = cmd
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("spawn look-alike");
    let l = Lookalike { child, log };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&l.log).is_ok_and(|t| t.contains("ready -")) {
        assert!(Instant::now() < deadline, "{name} did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
    l
}

#[test]
fn the_operators_key_goes_only_to_a_router_that_asks_in_our_namespace_and_never_leaves() {
    let _lab = lab::exclusive();
    let tmp = tempfile::tempdir().expect("tmp");
    let asks = start(tmp.path(), "asks", false, &[(KEY_ENV, "")]);
    let never_asked = start(tmp.path(), "never_asked", false, &[]);
    let contained = start(tmp.path(), "contained", true, &[(KEY_ENV, "")]);

    let bundle = tmp.path().join("bundle");
    let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(["--router-key-env", KEY_ENV])
        .args(["snapshot", "--no-daemon", "--window", "2", "-o"])
        .arg(&bundle)
        .args(["--nvml-lib", "/nonexistent/libnvidia-ml.so.1"])
        .env(KEY_ENV, KEY)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run wedgewatch");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "snapshot: {}: {err}",
        out.status
    );

    // Each was scraped (so a missing key is a refusal, not a look-alike never asked).
    let key_header = format!("Bearer {KEY}");
    for (name, l) in [
        ("asks", &asks),
        ("never_asked", &never_asked),
        ("contained", &contained),
    ] {
        let reqs = l.requests();
        assert!(
            reqs.iter().any(|(p, _)| p.starts_with("/workers")),
            "{name} was never asked for /workers: {reqs:?}"
        );
        let got_key = reqs.iter().any(|(_, a)| a == &key_header);
        assert_eq!(got_key, name == "asks", "{name}: {reqs:?}");
    }
    // Whatever it echoed, the key is in no file of the bundle.
    for (path, bytes) in files_under(&bundle) {
        assert!(
            !bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes()),
            "{} holds the operator's key",
            path.display()
        );
    }
    assert!(!err.contains(KEY), "stderr holds the key: {err}");
}
