//! doctor: what can be sampled here and why not.
//!
//! Each check is independent, bounded in time, and read-only: procfs, ptrace permission
//! (CAP_SYS_PTRACE, Yama `ptrace_scope`), py-spy (found and its version), NVML (loadable and
//! initialises), netlink sock_diag (one real dump), and which PID/network namespaces the
//! discovered targets live in. Only a missing procfs is fatal: without it nothing works.

use crate::discover::{self, DiscoverOptions};
use crate::probes::ProbeSet;
use crate::sources::processes;
use crate::sys::ProcFs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Bit of CAP_SYS_PTRACE in the capability masks (linux/capability.h).
const CAP_SYS_PTRACE: u32 = 19;
const TOOL_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
    /// Failing this check means the main job cannot work.
    pub fatal: bool,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct DoctorReport {
    pub checks: Vec<Check>,
}

impl DoctorReport {
    /// True when a fatal check failed (exit non-zero).
    pub fn fatal(&self) -> bool {
        self.checks
            .iter()
            .any(|c| c.fatal && c.status == CheckStatus::Fail)
    }

    pub fn render(&self) -> String {
        let mut o = String::new();
        for c in &self.checks {
            let tag = match c.status {
                CheckStatus::Ok => "ok  ",
                CheckStatus::Warn => "warn",
                CheckStatus::Fail => "FAIL",
            };
            o.push_str(&format!("[{tag}] {:<12} {}\n", c.name, c.detail));
        }
        if self.fatal() {
            o.push_str("\nwedgewatch cannot work here (see FAIL above).\n");
        }
        o
    }
}

/// What doctor needs to know.
#[derive(Debug, Clone)]
pub struct DoctorOptions {
    pub proc_root: PathBuf,
    pub nvml_lib: Option<PathBuf>,
    /// `--py-spy`: checked the way the stacks source will use it.
    pub py_spy: Option<PathBuf>,
    pub discover: DiscoverOptions,
}

fn check(name: &str, status: CheckStatus, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        status,
        detail: detail.into(),
        fatal: false,
    }
}

/// Runs every check.
pub fn run(probes: &ProbeSet, opts: &DoctorOptions) -> DoctorReport {
    let mut checks = Vec::new();
    let procfs_ok = ProcFs::new(&opts.proc_root).pids().is_ok();
    checks.push(procfs_check(&opts.proc_root));
    checks.push(ptrace_check(&opts.proc_root));
    checks.push(py_spy_check(opts.py_spy.as_deref()));
    checks.push(nvml_check(opts.nvml_lib.as_deref()));
    checks.push(netlink_check());
    if procfs_ok {
        checks.extend(namespace_checks(probes, opts));
    }
    DoctorReport { checks }
}

fn procfs_check(root: &Path) -> Check {
    match ProcFs::new(root).pids() {
        Ok(pids) => check(
            "procfs",
            CheckStatus::Ok,
            format!("{} readable, {} processes", root.display(), pids.len()),
        ),
        Err(e) => Check {
            fatal: true,
            ..check(
                "procfs",
                CheckStatus::Fail,
                format!(
                    "cannot read {}: {e}; discovery and every source need it",
                    root.display()
                ),
            )
        },
    }
}

/// CapEff from a status file, as a bit mask.
fn cap_eff(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

fn ptrace_check(root: &Path) -> Check {
    let proc = ProcFs::new(root);
    let status = proc.own_status_text().unwrap_or_default();
    let has_cap = cap_eff(&status).map(|m| m & (1 << CAP_SYS_PTRACE) != 0);
    let scope = proc.ptrace_scope();
    let euid = nix::unistd::geteuid();
    let cap_txt = match has_cap {
        Some(true) => "CAP_SYS_PTRACE effective",
        Some(false) => "no CAP_SYS_PTRACE",
        None => "capabilities unknown",
    };
    let scope_txt = match scope {
        None => "no Yama LSM (ptrace_scope absent)".to_string(),
        Some(s) => format!("yama ptrace_scope={s}"),
    };
    let (st, advice) = match (has_cap, scope) {
        (_, Some(3)) => (CheckStatus::Fail, "ptrace disabled system-wide: no stacks (py-spy) at all"),
        (Some(true), _) => (CheckStatus::Ok, "py-spy can attach to any process"),
        (_, Some(2)) => (CheckStatus::Warn, "only CAP_SYS_PTRACE may attach: run as root or grant the capability"),
        (_, Some(1)) => (CheckStatus::Warn, "only descendants may be attached: stacks of the stack's processes need CAP_SYS_PTRACE or ptrace_scope=0"),
        _ => (CheckStatus::Ok, "same-user processes can be attached"),
    };
    check(
        "ptrace",
        st,
        format!("euid {euid}, {cap_txt}, {scope_txt}: {advice}"),
    )
}

/// Where py-spy is: `WEDGEWATCH_PY_SPY`, then PATH, then the lab venv.
pub fn find_py_spy(explicit: Option<&Path>) -> Result<PathBuf, String> {
    // Exactly the stacks source's lookup, so doctor never approves a py-spy it won't use.
    let mut cfg = crate::sources::stacks::StacksConfig::from_env();
    cfg.py_spy = explicit.map(Path::to_path_buf);
    cfg.resolve_py_spy()
}

/// Runs a command with a hard timeout, killing it when late. Returns stdout+stderr.
pub fn run_with_timeout(cmd: &mut Command, timeout: Duration) -> Result<String, String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .env_remove("RUST_BACKTRACE")
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("timed out after {} ms", timeout.as_millis()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e.to_string()),
        }
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
    s.push_str(&String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        Ok(s.trim().to_string())
    } else {
        Err(format!("{}: {}", out.status, s.trim()))
    }
}

fn py_spy_check(explicit: Option<&Path>) -> Check {
    match find_py_spy(explicit) {
        Err(why) => check(
            "py-spy",
            CheckStatus::Warn,
            format!("{why}: no Python stacks"),
        ),
        Ok(p) => match run_with_timeout(Command::new(&p).arg("--version"), TOOL_TIMEOUT) {
            Ok(v) => check("py-spy", CheckStatus::Ok, format!("{} ({v})", p.display())),
            Err(e) => check(
                "py-spy",
                CheckStatus::Warn,
                format!("{} does not run: {e}", p.display()),
            ),
        },
    }
}

fn nvml_check(lib: Option<&Path>) -> Check {
    let lib_owned = lib.map(Path::to_path_buf);
    let (tx, rx) = mpsc::channel();
    // NVML init is a blocking FFI call into a driver; never let it hang doctor
    std::thread::spawn(move || {
        let res = match &lib_owned {
            Some(p) => nvml_wrapper::Nvml::builder().lib_path(p.as_os_str()).init(),
            None => nvml_wrapper::Nvml::init(),
        };
        let msg = match res {
            Ok(nvml) => {
                let driver = nvml
                    .sys_driver_version()
                    .unwrap_or_else(|e| format!("? ({e})"));
                let count = nvml
                    .device_count()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|e| format!("? ({e})"));
                Ok(format!("driver {driver}, {count} GPU(s)"))
            }
            Err(e) => Err(e.to_string()),
        };
        let _ = tx.send(msg);
    });
    let which = lib
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "libnvidia-ml.so.1 (default search path)".into());
    match rx.recv_timeout(TOOL_TIMEOUT) {
        Ok(Ok(d)) => check("nvml", CheckStatus::Ok, format!("{which}: {d}")),
        Ok(Err(e)) => check(
            "nvml",
            CheckStatus::Warn,
            format!("{which}: {e}; GPU source unavailable (use --nvml-lib PATH)"),
        ),
        Err(_) => check(
            "nvml",
            CheckStatus::Warn,
            format!(
                "{which}: init did not return within {} ms",
                TOOL_TIMEOUT.as_millis()
            ),
        ),
    }
}

/// One real sock_diag dump of TCP sockets, counting the IPv4 ones (the sockets source's own
/// dump, [`crate::sys::sock_diag::dump_netlink`]).
pub fn sock_diag_probe() -> Result<usize, String> {
    let dump =
        crate::sys::sock_diag::dump_netlink(TOOL_TIMEOUT, true).map_err(|e| e.to_string())?;
    Ok(dump
        .sockets
        .iter()
        .filter(|s| !s.local.starts_with('['))
        .count())
}

fn netlink_check() -> Check {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(sock_diag_probe());
    });
    match rx.recv_timeout(TOOL_TIMEOUT) {
        Ok(Ok(n)) => check("sock_diag", CheckStatus::Ok, format!("netlink inet_diag dump works ({n} IPv4 TCP sockets, with tcp_info)")),
        Ok(Err(e)) => check("sock_diag", CheckStatus::Warn, format!("netlink sock_diag unusable ({e}); sockets fall back to /proc/net/tcp without tcp_info")),
        Err(_) => check("sock_diag", CheckStatus::Warn, "netlink dump did not answer in time"),
    }
}

/// The discovered top-level components, in one line.
fn targets_check(topo: &crate::model::Topology) -> Check {
    let summary: Vec<String> = topo
        .components
        .iter()
        .filter(|c| c.parent.is_none())
        .map(|c| format!("{} ({})", c.id, c.role))
        .collect();
    check(
        "targets",
        CheckStatus::Ok,
        format!(
            "{} components: {}",
            topo.components.len(),
            summary.join(", ")
        ),
    )
}

/// Whether any of the pids lies in a namespace other than `mine`, and a text listing the
/// pids by namespace inode (None: unreadable).
fn describe_namespaces(m: &BTreeMap<Option<u64>, Vec<i32>>, mine: Option<u64>) -> (bool, String) {
    let foreign = m.keys().any(|k| k.is_some() && *k != mine);
    let parts: Vec<String> = m
        .iter()
        .map(|(k, pids)| {
            let name = match k {
                Some(k) if Some(*k) == mine => format!("{k} (ours)"),
                Some(k) => k.to_string(),
                None => "unknown".into(),
            };
            format!(
                "{name}: pids {}",
                pids.iter()
                    .map(|p| p.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )
        })
        .collect();
    (foreign, parts.join("; "))
}

/// Targets, their network and pid namespaces, and whether their /proc files are readable.
fn namespace_checks(probes: &ProbeSet, opts: &DoctorOptions) -> Vec<Check> {
    let topo = match discover::discover(probes, &opts.discover) {
        Ok(t) => t,
        Err(e) => {
            return vec![check(
                "targets",
                CheckStatus::Warn,
                format!("discovery failed: {e}"),
            )]
        }
    };
    let me = processes::facts(&opts.proc_root, std::process::id() as i32);
    let mut out = Vec::new();
    if topo.components.is_empty() {
        out.push(check(
            "targets",
            CheckStatus::Warn,
            "no inference-stack process found (use --pid/--url, or --probes DIR for other stacks)",
        ));
        return out;
    }
    out.push(targets_check(&topo));
    let mut netns: BTreeMap<Option<u64>, Vec<i32>> = BTreeMap::new();
    let mut pidns: BTreeMap<Option<u64>, Vec<i32>> = BTreeMap::new();
    let mut unreadable = Vec::new();
    for pid in topo.pids() {
        let f = processes::facts(&opts.proc_root, pid);
        netns.entry(f.netns).or_default().push(pid);
        pidns.entry(f.pidns).or_default().push(pid);
        if f.errors
            .iter()
            .any(|e| e.reason.contains("permission denied"))
        {
            unreadable.push(pid);
        }
    }
    let (foreign_net, net_txt) = describe_namespaces(&netns, me.netns);
    out.push(check(
        "netns",
        if foreign_net { CheckStatus::Warn } else { CheckStatus::Ok },
        if foreign_net {
            format!("{net_txt}; targets in other network namespaces are read through /proc/PID/net (no tcp_info)")
        } else {
            net_txt
        },
    ));
    let (foreign_pid, pid_txt) = describe_namespaces(&pidns, me.pidns);
    out.push(check(
        "pidns",
        if foreign_pid {
            CheckStatus::Warn
        } else {
            CheckStatus::Ok
        },
        if foreign_pid {
            format!("{pid_txt}; containerised targets: NSpid maps their pids")
        } else {
            pid_txt
        },
    ));
    if !unreadable.is_empty() {
        out.push(check(
            "permissions",
            CheckStatus::Warn,
            format!("cannot read some /proc files of pids {unreadable:?} (other user): run as that user or root"),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_mask_parses() {
        let m = cap_eff("Name:\tx\nCapEff:\t000001fffeffffff\n").expect("mask");
        assert!(m & (1 << CAP_SYS_PTRACE) != 0);
        assert_eq!(cap_eff("CapEff:\t0000000000000000\n"), Some(0));
    }

    #[test]
    fn sock_diag_dump_sees_a_listener() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let n = sock_diag_probe().expect("netlink works on the test machine");
        assert!(n >= 1);
        drop(l);
    }

    #[test]
    fn timeout_kills_slow_tools() {
        // The tool outlasts the bound asserted, so waiting for it fails.
        let timeout = Duration::from_millis(200);
        let t0 = Instant::now();
        let r = run_with_timeout(Command::new("sleep").arg("15"), timeout);
        assert!(r.is_err());
        assert!(t0.elapsed() < crate::clock::test_bound(timeout));
    }
}
