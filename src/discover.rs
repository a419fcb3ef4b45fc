//! Discovery: /proc + probe profiles -> [`Topology`].
//!
//! One pass over the process table (procfs, with a configurable root so tests can use fixture
//! trees):
//! 1. every process is matched against the top-level profiles (no `parent`, not
//!    `connects_to_known`); when a process and one of its ancestors match the same profile,
//!    the ancestor is a launcher (`timeout ... python -m ...`) and the descendant wins, unless
//!    both have the same command line (a forked child that has not set its title yet);
//! 2. each component gets its role (refined by `mode_flag`), its arguments (its own cmdline,
//!    or for a titled process the launcher's), its listen addresses (flags with defaults, and
//!    its own LISTEN sockets from `/proc/PID/net/tcp{,6}` + fd inodes), metrics URL and GPU
//!    hints (`CUDA_VISIBLE_DEVICES` of the untitled process, since setproctitle clobbers the
//!    environ of titled ones);
//! 3. children (`parent = ...` profiles) are matched among each component's descendants;
//! 4. config edges come from `worker_flags` (router -> workers), or from the `/workers`
//!    endpoint (loopback only, hard timeout) when the arguments did not survive;
//! 5. generic proxies: processes that listen on a port and hold an ESTABLISHED connection to a
//!    known component's port;
//! 6. `--pid` / `--url` targets discovery missed are added last.
//!
//! Component ids are stable across restarts: `role@listen-address` (`decode@127.0.0.1:31012`),
//! children `name@parent-id` (`scheduler_TP0@decode@127.0.0.1:31012`).

use crate::error::{Error, Result};
use crate::http::{self, Limits};
use crate::model::FetchOutcome;
use crate::model::{Component, Edge, EdgeOrigin, Role, Topology};
use crate::netns::Netns;
use crate::probes::{ProbeSet, Profile};
use crate::sources::processes::socket_inodes;
use procfs::net::{TcpNetEntry, TcpState};
use procfs::process::Process;
use regex::Regex;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

// The component labels discovery writes live in the model layer (sources read them too).
pub use crate::model::topology::labels::*;

/// How far up we look for a launcher, and how deep down for children: real launch chains are
/// 1-3 levels (shell -> timeout -> python); bounded so a pathological tree cannot stall us.
const MAX_ANCESTRY: usize = 8;
const MAX_CHILD_DEPTH: usize = 6;
const MAX_CHILDREN: usize = 512;
/// Longest wait for one /proc read of one process (normally microseconds): a process holding
/// its mmap lock makes reads of its cmdline or environ block for as long as it likes.
const READ_DEADLINE: Duration = Duration::from_millis(250);
/// Longest wait for the whole process table; processes not read by then are left out.
const TABLE_DEADLINE: Duration = Duration::from_millis(1_000);
/// Backstop for one whole discovery (run on a detached thread by [`crate::attach`]).
pub const DISCOVERY_DEADLINE: Duration = Duration::from_secs(5);
/// Body cap for the router's `/workers` answer.
const MAX_HTTP_BODY: usize = 1 << 20;

/// What to discover and where.
#[derive(Debug, Clone)]
pub struct DiscoverOptions {
    /// procfs root (`/proc`; a fixture tree in tests).
    pub proc_root: PathBuf,
    /// `--pid`: processes to include even if no profile matches.
    pub extra_pids: Vec<i32>,
    /// `--url`: endpoints to include even if no process was found for them.
    pub extra_urls: Vec<String>,
    /// Ask components' HTTP endpoints (router `/workers`) when arguments did not survive.
    pub query_endpoints: bool,
    /// Hard timeout of each such request.
    pub http_timeout: Duration,
    /// Pids never to report (the tool itself).
    pub exclude_pids: Vec<i32>,
}

impl Default for DiscoverOptions {
    fn default() -> Self {
        DiscoverOptions {
            proc_root: PathBuf::from("/proc"),
            extra_pids: Vec::new(),
            extra_urls: Vec::new(),
            query_endpoints: true,
            http_timeout: Duration::from_millis(500),
            exclude_pids: vec![std::process::id() as i32],
        }
    }
}

/// The pid whose environ stands for this component (`env_pid` label, else its main pid).
pub fn env_pid(c: &Component) -> Option<i32> {
    c.labels
        .get(LABEL_ENV_PID)
        .and_then(|v| v.parse().ok())
        .or(c.main_pid)
}

/// The pid whose cmdline holds this component's arguments (`args_pid` label, else main pid).
pub fn args_pid(c: &Component) -> Option<i32> {
    c.labels
        .get(LABEL_ARGS_PID)
        .and_then(|v| v.parse().ok())
        .or(c.main_pid)
}

// ---------------------------------------------------------------------------------------
// process table

#[derive(Debug, Clone)]
struct Proc {
    pid: i32,
    ppid: i32,
    comm: String,
    cmdline: Vec<String>,
}

impl Proc {
    fn joined(&self) -> String {
        self.cmdline.join(" ")
    }
    fn argv0(&self) -> &str {
        self.cmdline.first().map(String::as_str).unwrap_or("")
    }
}

struct ProcTable {
    root: PathBuf,
    procs: BTreeMap<i32, Proc>,
    children: BTreeMap<i32, Vec<i32>>,
    /// netns inode -> tcp + tcp6 entries (read once per namespace).
    /// Per network namespace; shared, not copied, for each pid that asks (thousands of
    /// entries under connection churn, asked once per candidate process).
    net: std::cell::RefCell<BTreeMap<u64, std::rc::Rc<Vec<TcpNetEntry>>>>,
    /// Our own network namespace (netns, issue 11 item 5): processes in another one are in a
    /// container, keyed and scraped in there.
    own_net: Option<u64>,
}

impl ProcTable {
    fn read(root: &Path) -> Result<ProcTable> {
        let iter = procfs::process::all_processes_with_root(root).map_err(|e| {
            Error::Other(format!(
                "cannot list processes in {}: {}",
                root.display(),
                crate::sources::processes::reason(&e)
            ))
        })?;
        // Listing is readdir only; reading each process may block (see `read_proc`).
        let items: Vec<(PathBuf, i32)> = iter
            .flatten()
            .map(|p| (root.join(p.pid.to_string()), p.pid))
            .collect();
        let r = root.to_path_buf();
        let read = move |&pid: &i32| read_proc(&r, pid);
        let procs: BTreeMap<i32, Proc> =
            crate::deadline::map(items, READ_DEADLINE, TABLE_DEADLINE, read)
                .into_iter()
                // Vanished, a kernel thread, or blocked: not a candidate this pass.
                .filter_map(|r| r.ok().flatten())
                .map(|p| (p.pid, p))
                .collect();
        let mut children: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for p in procs.values() {
            children.entry(p.ppid).or_default().push(p.pid);
        }
        Ok(ProcTable {
            root: root.to_path_buf(),
            procs,
            children,
            net: Default::default(),
            own_net: crate::netns::inode_of(root, std::process::id() as i32).ok(),
        })
    }

    fn ancestors(&self, pid: i32) -> Vec<i32> {
        let mut out = Vec::new();
        let mut cur = pid;
        for _ in 0..MAX_ANCESTRY {
            let Some(p) = self.procs.get(&cur) else { break };
            if p.ppid <= 1 || out.contains(&p.ppid) {
                break;
            }
            out.push(p.ppid);
            cur = p.ppid;
        }
        out
    }

    /// Descendants, breadth first, bounded in depth and count.
    fn descendants(&self, pid: i32) -> Vec<i32> {
        let mut out = Vec::new();
        let mut level = vec![pid];
        for _ in 0..MAX_CHILD_DEPTH {
            let mut next = Vec::new();
            for p in level {
                for &c in self.children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
                    if out.len() < MAX_CHILDREN {
                        out.push(c);
                        next.push(c);
                    }
                }
            }
            if next.is_empty() {
                break;
            }
            level = next;
        }
        out
    }

    fn netns(&self, pid: i32) -> Option<u64> {
        let link = std::fs::read_link(self.root.join(pid.to_string()).join("ns/net")).ok()?;
        let s = link.to_string_lossy();
        s.split_once('[')?.1.strip_suffix(']')?.parse().ok()
    }

    // --- netns (issue 11 item 5) ---

    /// The network namespace of `pid` when it is not ours (a container); None for ours or
    /// when either cannot be read (then it is treated as the host's, as before).
    fn foreign_netns(&self, pid: i32) -> Option<u64> {
        let own = self.own_net?;
        self.netns(pid).filter(|&ns| ns != own)
    }

    /// Where to open connections to `pid`'s sockets: inside its namespace when foreign.
    fn netns_ref(&self, pid: i32) -> Option<Netns> {
        self.foreign_netns(pid).map(|inode| Netns { pid, inode })
    }

    /// A listen address as part of a component id: in a foreign namespace prefixed by it
    /// (`net:4026532845/127.0.0.1:30000`), since two pods can listen on one address.
    fn keyed(&self, pid: i32, addr: &str) -> String {
        match self.foreign_netns(pid) {
            Some(ns) => format!("net:{ns}/{addr}"),
            None => addr.to_string(),
        }
    }

    // --- end netns ---

    /// TCP entries of the network namespace `pid` lives in.
    fn tcp_of(&self, pid: i32) -> std::rc::Rc<Vec<TcpNetEntry>> {
        let key = self.netns(pid).unwrap_or(0);
        if let Some(v) = self.net.borrow().get(&key) {
            return std::rc::Rc::clone(v);
        }
        let mut entries = Vec::new();
        if let Ok(p) = Process::new_with_root(self.root.join(pid.to_string())) {
            entries.extend(p.tcp().unwrap_or_default());
            entries.extend(p.tcp6().unwrap_or_default());
        }
        let entries = std::rc::Rc::new(entries);
        self.net
            .borrow_mut()
            .insert(key, std::rc::Rc::clone(&entries));
        entries
    }

    /// Listen addresses of `pid` (its own LISTEN sockets), sorted by port.
    fn listen_of(&self, pid: i32) -> Vec<SocketAddr> {
        let Ok(inodes) = socket_inodes(&self.root, pid) else {
            return Vec::new();
        };
        if inodes.is_empty() {
            return Vec::new();
        }
        let mut out: Vec<SocketAddr> = self
            .tcp_of(pid)
            .iter()
            .filter(|e| e.state == TcpState::Listen && inodes.contains(&e.inode))
            .map(|e| e.local_address)
            .collect();
        out.sort_by_key(|a| (a.port(), a.to_string()));
        out.dedup();
        out
    }

    /// The environment of `pid` (empty when unreadable: vanished, denied, or blocked).
    fn environ(&self, pid: i32) -> BTreeMap<String, String> {
        let dir = self.root.join(pid.to_string());
        let read = {
            let dir = dir.clone();
            move || {
                Process::new_with_root(dir)
                    .and_then(|p| p.environ())
                    .map(|m| {
                        m.into_iter()
                            .map(|(k, v)| {
                                (
                                    k.to_string_lossy().into_owned(),
                                    v.to_string_lossy().into_owned(),
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default()
            }
        };
        crate::deadline::call(&dir.join("environ"), READ_DEADLINE, read).unwrap_or_default()
    }
}

/// One process's table entry (None: vanished, or a kernel thread). Reading cmdline takes the
/// process's mmap lock, so this runs under [`READ_DEADLINE`].
fn read_proc(root: &Path, pid: i32) -> Option<Proc> {
    let p = Process::new_with_root(root.join(pid.to_string())).ok()?;
    // a process that vanished between readdir and stat is simply not there
    let stat = p.stat().ok()?;
    if stat.ppid == 2 || pid == 2 {
        return None; // kernel threads
    }
    let comm = std::fs::read_to_string(root.join(pid.to_string()).join("comm"))
        .map(|s| s.trim_end_matches('\n').to_string())
        .unwrap_or(stat.comm);
    let cmdline = p.cmdline().unwrap_or_default();
    Some(Proc {
        pid,
        ppid: stat.ppid,
        comm,
        cmdline,
    })
}

// ---------------------------------------------------------------------------------------
// compiled profiles

struct Compiled<'a> {
    p: &'a Profile,
    order: usize,
    cmdline: Vec<Regex>,
    comm: Vec<Regex>,
    title: Vec<Regex>,
    exclude: Vec<Regex>,
    child_name: Option<Regex>,
    gpu_index: Option<Regex>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Match {
    /// Matched by title or comm: its cmdline/environ were rewritten by setproctitle.
    titled: bool,
    /// Its own cmdline matches `match_cmdline` (its arguments are visible).
    own_args: bool,
}

fn compile_list(list: &[String]) -> Vec<Regex> {
    // validated at load time; a regex that fails here is skipped, not fatal
    list.iter().filter_map(|r| Regex::new(r).ok()).collect()
}

impl<'a> Compiled<'a> {
    fn new(p: &'a Profile, order: usize) -> Self {
        Compiled {
            p,
            order,
            cmdline: compile_list(&p.match_cmdline),
            comm: compile_list(&p.match_comm),
            title: compile_list(&p.match_title),
            exclude: compile_list(&p.exclude_cmdline),
            child_name: p.child_name.as_deref().and_then(|r| Regex::new(r).ok()),
            gpu_index: p
                .gpu_index_from_title
                .as_deref()
                .and_then(|r| Regex::new(r).ok()),
        }
    }

    fn matches(&self, proc: &Proc) -> Option<Match> {
        let joined = proc.joined();
        if self.exclude.iter().any(|r| r.is_match(&joined)) {
            return None;
        }
        let by_title =
            !proc.argv0().is_empty() && self.title.iter().any(|r| r.is_match(proc.argv0()));
        let by_comm = self.comm.iter().any(|r| r.is_match(&proc.comm));
        let own_args = !joined.is_empty() && self.cmdline.iter().any(|r| r.is_match(&joined));
        if by_title || by_comm || own_args {
            Some(Match {
                titled: (by_title || by_comm) && !own_args,
                own_args,
            })
        } else {
            None
        }
    }

    fn is_top_level(&self) -> bool {
        self.p.parent.is_none() && !self.p.connects_to_known
    }

    /// The title shown for a process: argv[0] when a title regex matches it, else comm.
    fn title_of(&self, proc: &Proc) -> Option<String> {
        if self.title.iter().any(|r| r.is_match(proc.argv0())) {
            Some(proc.argv0().to_string())
        } else if self.comm.iter().any(|r| r.is_match(&proc.comm)) {
            Some(proc.comm.clone())
        } else {
            None
        }
    }
}

// ---------------------------------------------------------------------------------------
// flags

fn norm_flag(s: &str) -> String {
    s.replace('_', "-")
}

/// Values of each occurrence of `flag`: `--flag=v` gives `[v]`, `--flag a b` gives every
/// following token up to the next `--option`.
pub fn flag_values(args: &[String], flag: &str) -> Vec<Vec<String>> {
    let want = norm_flag(flag);
    let mut out = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let a = &args[i];
        if let Some((name, v)) = a.split_once('=') {
            if name.starts_with('-') && norm_flag(name) == want {
                out.push(vec![v.to_string()]);
                i += 1;
                continue;
            }
        }
        if a.starts_with('-') && norm_flag(a) == want {
            let mut vals = Vec::new();
            let mut j = i + 1;
            while j < args.len() && !args[j].starts_with("--") {
                vals.push(args[j].clone());
                j += 1;
            }
            out.push(vals);
            i = j;
            continue;
        }
        i += 1;
    }
    out
}

/// The first value of the last occurrence of `flag` (argparse semantics: last one wins).
pub fn flag_value(args: &[String], flag: &str) -> Option<String> {
    flag_values(args, flag)
        .into_iter()
        .last()
        .and_then(|v| v.into_iter().next())
}

// ---------------------------------------------------------------------------------------
// addresses

fn is_wildcard(ip: &IpAddr) -> bool {
    ip.is_unspecified()
}

/// Host to connect to for a listen host (`0.0.0.0` -> `127.0.0.1`).
fn connect_host(host: &str) -> String {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) if v4.is_unspecified() => "127.0.0.1".into(),
        Ok(IpAddr::V6(v6)) if v6.is_unspecified() => "[::1]".into(),
        Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
        _ => host.to_string(),
    }
}

fn addr_string(host: &str, port: u16) -> String {
    match host.parse::<IpAddr>() {
        Ok(ip) => SocketAddr::new(ip, port).to_string(),
        Err(_) => format!("{host}:{port}"),
    }
}

/// Splits `ip:port` / `[v6]:port` / `host:port`.
fn split_addr(a: &str) -> Option<(String, u16)> {
    let (h, p) = a.rsplit_once(':')?;
    let h = h.trim_start_matches('[').trim_end_matches(']');
    Some((h.to_string(), p.parse().ok()?))
}

fn hosts_equivalent(a: &str, b: &str) -> bool {
    let norm = |h: &str| -> Option<IpAddr> {
        if h == "localhost" {
            return Some(IpAddr::from([127, 0, 0, 1]));
        }
        h.parse().ok()
    };
    match (norm(a), norm(b)) {
        (Some(x), Some(y)) => {
            x == y || is_wildcard(&x) || is_wildcard(&y) || (x.is_loopback() && y.is_loopback())
        }
        _ => a == b,
    }
}

/// `http://host:port/...` -> (scheme, host, port, path).
fn parse_url(url: &str) -> Option<(String, String, u16, String)> {
    let (scheme, rest) = url.split_once("://")?;
    let (hostport, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    // drop userinfo
    let hostport = hostport
        .rsplit_once('@')
        .map(|(_, h)| h)
        .unwrap_or(hostport);
    let default_port = if scheme == "https" { 443 } else { 80 };
    let (host, port) = if hostport.starts_with('[') {
        let end = hostport.find(']')?;
        let host = &hostport[1..end];
        let port = hostport[end + 1..]
            .strip_prefix(':')
            .and_then(|p| p.parse().ok())
            .unwrap_or(default_port);
        (host.to_string(), port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), p.parse().ok()?),
            None => (hostport.to_string(), default_port),
        }
    };
    Some((scheme.to_string(), host, port, path.to_string()))
}

fn is_loopback_host(h: &str) -> bool {
    h == "localhost"
        || h.parse::<IpAddr>()
            .map(|ip| ip.is_loopback() || ip.is_unspecified())
            .unwrap_or(false)
}

/// GET `http://host:port/path` over loopback with the one timed, size-capped client
/// ([`crate::http`]), `timeout` for the whole request. Refuses non-loopback hosts: discovery
/// never talks to the network. `netns`: the loopback of that namespace (a container's).
pub fn loopback_get(
    host: &str,
    port: u16,
    path: &str,
    timeout: Duration,
    netns: Option<Netns>,
) -> std::result::Result<String, String> {
    if !is_loopback_host(host) {
        return Err(format!("{host} is not a loopback address; not asked"));
    }
    let url = format!("http://{}:{port}{path}", connect_host(host));
    let limits = Limits {
        connect: timeout,
        total: timeout,
        cap: MAX_HTTP_BODY,
    };
    let r = http::get_blocking_in(&url, limits, netns);
    match r.outcome {
        FetchOutcome::Ok => Ok(String::from_utf8_lossy(&r.body).into_owned()),
        _ => Err(r.detail.unwrap_or_else(|| format!("{:?}", r.outcome))),
    }
}

/// Where to reach `port` of a process whose flags name `claimed`: one of its own listening
/// sockets on this host (`own`), a wildcard one at loopback. Any local process can pose as
/// an engine, so an address the process does not itself listen on is never scraped: not a
/// remote `--host`, not a loopback port someone else may hold. Err says why.
pub fn scrape_addr(
    claimed: &str,
    port: u16,
    own: &[SocketAddr],
) -> std::result::Result<String, String> {
    let on_port: Vec<&SocketAddr> = own.iter().filter(|s| s.port() == port).collect();
    let pick = on_port
        .iter()
        .find(|s| hosts_equivalent(&s.ip().to_string(), claimed))
        .or(on_port.first());
    match pick {
        Some(s) => Ok(format!("{}:{port}", connect_host(&s.ip().to_string()))),
        None if is_loopback_host(claimed) => Err(format!(
            "{}: not one of its listening sockets, so not scraped",
            addr_string(claimed, port)
        )),
        None => Err(format!(
            "{}: not on this host (no listening socket of its own on port {port}), so not scraped",
            addr_string(claimed, port)
        )),
    }
}

/// Worker URLs from a `/workers` answer (`[...]` or `{"workers": [...]}`, items with `url`).
fn worker_urls_from_json(body: &str) -> Vec<String> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(body) else {
        return Vec::new();
    };
    let items = match &v {
        serde_json::Value::Array(a) => a.clone(),
        serde_json::Value::Object(o) => o
            .get("workers")
            .and_then(|w| w.as_array())
            .cloned()
            .unwrap_or_default(),
        _ => Vec::new(),
    };
    items
        .iter()
        .filter_map(|i| i.get("url").and_then(|u| u.as_str()).map(str::to_string))
        .collect()
}

/// What discovery knows of a component's endpoints.
struct EndpointFacts<'a> {
    prof: &'a Profile,
    args: &'a [String],
    /// `host:port` its flags (or defaults, or sockets) name.
    primary: Option<&'a str>,
    port: Option<u16>,
    listen: &'a [String],
    /// Its own listening sockets.
    own: &'a [SocketAddr],
    top_level: bool,
}

/// (HTTP API URL, metrics URL, why each endpoint that is not scraped is not): every URL is
/// one of the process's own listening sockets ([`scrape_addr`]).
fn endpoint_urls(f: &EndpointFacts) -> (Option<String>, Option<String>, Vec<String>) {
    let mut unscraped: Vec<String> = Vec::new();
    let mut reach = |host: &str, port: u16| match scrape_addr(host, port, f.own) {
        Ok(a) => Some(a),
        Err(why) => {
            if !unscraped.contains(&why) {
                unscraped.push(why);
            }
            None
        }
    };
    let primary = f.primary.and_then(split_addr);
    let has_port = f.prof.port_flag.is_some() || f.prof.default_port.is_some();
    let http_url = match (&primary, f.top_level && has_port) {
        (Some((h, p)), true) => reach(h, *p).map(|a| format!("http://{a}")),
        _ => None,
    };
    let metrics_url = f.prof.metrics_path.as_ref().and_then(|path| {
        let mhost = f
            .prof
            .metrics_host_flag
            .as_ref()
            .and_then(|flag| flag_value(f.args, flag))
            .or_else(|| primary.as_ref().map(|(h, _)| h.clone()))
            .unwrap_or_else(|| "127.0.0.1".into());
        let mp = metrics_port(f, primary.as_ref().map(|(_, p)| *p))?;
        reach(&mhost, mp).map(|a| format!("http://{a}{path}"))
    });
    (http_url, metrics_url, unscraped)
}

/// The metrics port: its flag, else (when setproctitle took the arguments) the one other
/// listening port (the router listens on exactly its API port and its metrics port), else
/// the profile's default; without a metrics port flag, the HTTP port.
fn metrics_port(f: &EndpointFacts, primary_port: Option<u16>) -> Option<u16> {
    let Some(flag) = &f.prof.metrics_port_flag else {
        return f.port;
    };
    let other_ports: Vec<u16> = f
        .listen
        .iter()
        .filter_map(|a| split_addr(a).map(|(_, p)| p))
        .filter(|p| Some(*p) != primary_port)
        .collect();
    let from_sockets = match other_ports.as_slice() {
        [only] => Some(*only),
        _ => None,
    };
    flag_value(f.args, flag)
        .and_then(|v| v.parse::<u16>().ok())
        .or(from_sockets)
        .or(f.prof.metrics_default_port)
}

fn parse_gpu_list(v: &str) -> Vec<u32> {
    v.split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

// ---------------------------------------------------------------------------------------
// discovery

struct Builder<'a> {
    table: ProcTable,
    compiled: Vec<Compiled<'a>>,
    opts: &'a DiscoverOptions,
    topo: Topology,
}

/// Builds the topology. Fails only when the procfs root cannot be listed at all.
pub fn discover(probes: &ProbeSet, opts: &DiscoverOptions) -> Result<Topology> {
    let table = ProcTable::read(&opts.proc_root)?;
    let compiled = probes
        .profiles
        .iter()
        .enumerate()
        .map(|(i, p)| Compiled::new(p, i))
        .collect();
    let mut b = Builder {
        table,
        compiled,
        opts,
        topo: Topology::default(),
    };
    b.top_level();
    b.children();
    b.config_edges();
    b.proxies();
    b.extra_pids();
    b.extra_urls();
    b.topo.components.sort_by(|a, c| {
        (a.role.depth(), a.parent.is_some(), &a.id).cmp(&(
            c.role.depth(),
            c.parent.is_some(),
            &c.id,
        ))
    });
    Ok(b.topo)
}

impl<'a> Builder<'a> {
    fn excluded(&self, pid: i32) -> bool {
        self.opts.exclude_pids.contains(&pid)
    }

    /// Best top-level profile for a process (highest priority, then file order).
    fn best_top_level(&self, proc: &Proc) -> Option<(usize, Match)> {
        self.compiled
            .iter()
            .enumerate()
            .filter(|(_, c)| c.is_top_level())
            .filter_map(|(i, c)| c.matches(proc).map(|m| (i, m, c.p.priority, c.order)))
            .max_by(|a, b| a.2.cmp(&b.2).then(b.3.cmp(&a.3)))
            .map(|(i, m, _, _)| (i, m))
    }

    fn top_level(&mut self) {
        let mut matched: BTreeMap<i32, (usize, Match)> = BTreeMap::new();
        for p in self.table.procs.values() {
            if self.excluded(p.pid) {
                continue;
            }
            if let Some(m) = self.best_top_level(p) {
                matched.insert(p.pid, m);
            }
        }
        // launchers vs forks: see the module doc
        let mut dropped: BTreeSet<i32> = BTreeSet::new();
        for (&pid, &(ci, _)) in &matched {
            for anc in self.table.ancestors(pid) {
                if let Some(&(aci, _)) = matched.get(&anc) {
                    if aci != ci {
                        continue;
                    }
                    let same_cmdline = self.table.procs.get(&anc).map(|p| &p.cmdline)
                        == self.table.procs.get(&pid).map(|p| &p.cmdline);
                    if same_cmdline {
                        dropped.insert(pid);
                    } else {
                        dropped.insert(anc);
                    }
                }
            }
        }
        for (pid, (ci, m)) in matched {
            if dropped.contains(&pid) {
                continue;
            }
            let c = self.build_component(pid, ci, m, None);
            self.push_unique(c);
        }
    }

    fn push_unique(&mut self, mut c: Component) {
        if self.topo.components.iter().any(|o| o.id == c.id) {
            c.id = format!("{}#{}", c.id, c.main_pid.unwrap_or(0));
        }
        self.topo.components.push(c);
    }

    /// Nearest ancestor whose cmdline matches the profile's `match_cmdline`.
    fn launcher_of(&self, pid: i32, ci: usize) -> Option<i32> {
        let comp = &self.compiled[ci];
        self.table.ancestors(pid).into_iter().find(|a| {
            self.table.procs.get(a).is_some_and(|p| {
                let j = p.joined();
                comp.cmdline.iter().any(|r| r.is_match(&j))
            })
        })
    }

    fn build_component(
        &self,
        pid: i32,
        ci: usize,
        m: Match,
        parent: Option<&Component>,
    ) -> Component {
        let comp = &self.compiled[ci];
        let prof = comp.p;
        let proc = self.table.procs.get(&pid).cloned().unwrap_or(Proc {
            pid,
            ppid: 0,
            comm: String::new(),
            cmdline: Vec::new(),
        });
        let mut labels = BTreeMap::new();
        labels.insert(LABEL_FOUND_BY.to_string(), "profile".to_string());

        // arguments: own, or the launcher's when setproctitle hid them
        let mut args = proc.cmdline.clone();
        if m.own_args {
            labels.insert(LABEL_ARGS_SOURCE.into(), "own".into());
        } else if m.titled && prof.args_from_ancestor {
            match self.launcher_of(pid, ci) {
                Some(l) => {
                    args = self
                        .table
                        .procs
                        .get(&l)
                        .map(|p| p.cmdline.clone())
                        .unwrap_or_default();
                    labels.insert(LABEL_ARGS_PID.into(), l.to_string());
                    labels.insert(LABEL_ARGS_SOURCE.into(), format!("launcher pid {l}"));
                }
                None => {
                    args = Vec::new();
                    labels.insert(
                        LABEL_ARGS_SOURCE.into(),
                        "unavailable (titled, no launcher keeps them); sockets used".into(),
                    );
                }
            }
        } else if m.titled {
            args = Vec::new();
        }

        // environment: the untitled process's (setproctitle clobbers a titled one's)
        let env_source = if m.titled {
            match parent {
                Some(p) => p.main_pid,
                None => labels.get(LABEL_ARGS_PID).and_then(|v| v.parse().ok()),
            }
        } else {
            None
        };
        if let Some(e) = env_source {
            labels.insert(LABEL_ENV_PID.into(), e.to_string());
        }
        let env = self.table.environ(env_source.unwrap_or(pid));

        // role
        let mut role = Role::parse(&prof.role).unwrap_or(Role::Other);
        if let Some(flag) = &prof.mode_flag {
            if let Some(mode) = flag_value(&args, flag) {
                labels.insert("mode".into(), mode.clone());
                if let Some(r) = prof.mode_roles.get(&mode).and_then(|r| Role::parse(r)) {
                    role = r;
                }
            }
        }
        for (label, flag) in &prof.labels_from_flags {
            if let Some(v) = flag_value(&args, flag) {
                labels.insert(label.clone(), v);
            }
        }

        // listen addresses
        let sockets = if prof.ports_from_sockets {
            self.table.listen_of(pid)
        } else {
            Vec::new()
        };
        let flag_host = prof.host_flag.as_ref().and_then(|f| flag_value(&args, f));
        let flag_port = prof
            .port_flag
            .as_ref()
            .and_then(|f| flag_value(&args, f))
            .and_then(|v| v.parse::<u16>().ok());
        // arguments lost (titled, no launcher): ask each listen socket for the workers
        // endpoint; the one that answers is the HTTP API (the other is metrics)
        let probed_port =
            if args.is_empty() && m.titled && flag_port.is_none() && self.opts.query_endpoints {
                prof.workers_endpoint.as_ref().and_then(|path| {
                    sockets.iter().take(4).find_map(|s| {
                        let body = loopback_get(
                            &s.ip().to_string(),
                            s.port(),
                            path,
                            self.opts.http_timeout,
                            self.table.netns_ref(pid),
                        )
                        .ok()?;
                        serde_json::from_str::<serde_json::Value>(&body)
                            .ok()
                            .map(|_| s.port())
                    })
                })
            } else {
                None
            };
        let port = flag_port.or(probed_port).or_else(|| {
            match prof.default_port {
                Some(d) if sockets.is_empty() || sockets.iter().any(|s| s.port() == d) => Some(d),
                // the default is not what it listens on: trust the sockets
                Some(_) => sockets.first().map(|s| s.port()),
                None => None,
            }
        });
        let primary: Option<String> = port.map(|port| {
            let host = flag_host
                .clone()
                .or_else(|| {
                    sockets
                        .iter()
                        .find(|s| s.port() == port)
                        .map(|s| s.ip().to_string())
                })
                .or_else(|| prof.default_host.clone())
                .unwrap_or_else(|| "0.0.0.0".into());
            addr_string(&host, port)
        });
        let mut listen: Vec<String> = primary.iter().cloned().collect();
        for s in &sockets {
            let s = s.to_string();
            let dup = listen
                .iter()
                .any(|l| match (split_addr(l), split_addr(&s)) {
                    (Some((h1, p1)), Some((h2, p2))) => p1 == p2 && hosts_equivalent(&h1, &h2),
                    _ => *l == s,
                });
            if !dup {
                listen.push(s);
            }
        }

        // id
        let name = match (&comp.child_name, comp.title_of(&proc)) {
            (Some(re), Some(t)) => re
                .captures(&t)
                .and_then(|c| c.get(1))
                .map(|m| m.as_str().to_string())
                .unwrap_or_else(|| role.to_string()),
            _ => role.to_string(),
        };
        let id = match parent {
            Some(p) => format!("{name}@{}", p.id),
            None => match &primary {
                Some(a) => format!("{role}@{}", self.table.keyed(pid, a)),
                None => match sockets.first() {
                    Some(s) => format!("{role}@{}", self.table.keyed(pid, &s.to_string())),
                    None => format!("{role}@pid{pid}"),
                },
            },
        };

        let mut c = Component::new(id, role, prof.stack.clone());
        c.profile = prof.name.clone();
        c.pids = vec![pid];
        c.main_pid = Some(pid);
        c.listen = listen;
        c.parent = parent.map(|p| p.id.clone());
        c.title = comp.title_of(&proc);
        c.netns = self.table.foreign_netns(pid);
        c.container = crate::cgroup::of_pid(&self.table.root, pid).map(|p| p.name());
        // Scrape addresses: only the process's own listening sockets (see `scrape_addr`).
        let own = if prof.ports_from_sockets {
            sockets.clone()
        } else {
            self.table.listen_of(pid)
        };
        let (http_url, metrics_url, unscraped) = endpoint_urls(&EndpointFacts {
            prof,
            args: &args,
            primary: primary.as_deref(),
            port,
            listen: &c.listen,
            own: &own,
            top_level: parent.is_none(),
        });
        c.http_url = http_url;
        c.metrics_url = metrics_url;
        if !unscraped.is_empty() {
            labels.insert(LABEL_METRICS_UNSCRAPED.into(), unscraped.join("; "));
        }

        // GPUs: hints from the visible-devices variable of the untitled process
        if let Some(var) = &prof.gpu_env {
            let visible = env.get(var).map(|v| parse_gpu_list(v));
            let rank = comp
                .gpu_index
                .as_ref()
                .zip(c.title.as_ref())
                .and_then(|(re, t)| re.captures(t))
                .and_then(|cap| cap.get(1))
                .and_then(|m| m.as_str().parse::<usize>().ok());
            c.gpus = match (visible, rank) {
                (Some(v), Some(r)) => v.get(r).copied().into_iter().collect(),
                (Some(v), None) => v,
                (None, Some(r)) => vec![r as u32],
                (None, None) => Vec::new(),
            };
            if let Some(v) = env.get(var) {
                labels.insert(var.to_lowercase(), v.clone());
            }
        }
        if !args.is_empty() {
            labels.insert("argc".into(), args.len().to_string());
        }
        c.labels = labels;
        c
    }

    fn children(&mut self) {
        let parents: Vec<Component> = self.topo.components.clone();
        let mut claimed: BTreeSet<i32> = parents.iter().flat_map(|c| c.pids.clone()).collect();
        for parent in &parents {
            let child_profiles: Vec<usize> = self
                .compiled
                .iter()
                .enumerate()
                .filter(|(_, c)| c.p.parent.as_deref() == Some(parent.profile.as_str()))
                .map(|(i, _)| i)
                .collect();
            if child_profiles.is_empty() {
                continue;
            }
            let Some(main) = parent.main_pid else {
                continue;
            };
            let mut kids = Vec::new();
            for d in self.table.descendants(main) {
                if claimed.contains(&d) || self.excluded(d) {
                    continue;
                }
                let Some(proc) = self.table.procs.get(&d) else {
                    continue;
                };
                let best = child_profiles
                    .iter()
                    .filter_map(|&ci| self.compiled[ci].matches(proc).map(|m| (ci, m)))
                    .max_by_key(|(ci, _)| (self.compiled[*ci].p.priority, usize::MAX - *ci));
                if let Some((ci, m)) = best {
                    claimed.insert(d);
                    kids.push(self.build_component(d, ci, m, Some(parent)));
                }
            }
            let mut ids = Vec::new();
            for k in kids {
                let before = self.topo.components.len();
                self.push_unique(k);
                if self.topo.components.len() > before {
                    if let Some(last) = self.topo.components.last() {
                        ids.push(last.id.clone());
                    }
                }
            }
            if let Some(p) = self.topo.components.iter_mut().find(|c| c.id == parent.id) {
                p.children.extend(ids);
            }
        }
    }

    /// The component listening on (host, port) in network namespace `netns` (None: ours),
    /// top-level first.
    fn component_at(&self, netns: Option<u64>, host: &str, port: u16) -> Option<String> {
        self.topo
            .components
            .iter()
            .filter(|c| c.parent.is_none() && c.netns == netns)
            .find(|c| {
                c.listen.iter().any(|l| {
                    split_addr(l).is_some_and(|(h, p)| p == port && hosts_equivalent(&h, host))
                })
            })
            .map(|c| c.id.clone())
    }

    fn config_edges(&mut self) {
        let comps: Vec<Component> = self.topo.components.clone();
        for c in comps {
            let Some(prof) = self
                .compiled
                .iter()
                .find(|x| x.p.name == c.profile)
                .map(|x| x.p)
            else {
                continue;
            };
            if prof.worker_flags.is_empty() {
                continue;
            }
            let args_unavailable = c
                .labels
                .get(LABEL_ARGS_SOURCE)
                .is_some_and(|s| s.starts_with("unavailable"));
            let args: Vec<String> = if args_unavailable {
                Vec::new()
            } else {
                args_pid(&c)
                    .and_then(|p| self.table.procs.get(&p))
                    .map(|p| p.cmdline.clone())
                    .unwrap_or_default()
            };
            let mut urls: Vec<(String, String)> = Vec::new(); // (kind, url)
            for flag in &prof.worker_flags {
                for vals in flag_values(&args, flag) {
                    for v in vals {
                        if v.contains("://") {
                            urls.push((flag.trim_start_matches('-').to_string(), v));
                        }
                    }
                }
            }
            let mut source = "flags".to_string();
            if urls.is_empty() && self.opts.query_endpoints {
                if let (Some(path), Some(base)) = (&prof.workers_endpoint, &c.http_url) {
                    if let Some((_, host, port, _)) = parse_url(base) {
                        let ns = c.main_pid.and_then(|p| self.table.netns_ref(p));
                        match loopback_get(&host, port, path, self.opts.http_timeout, ns) {
                            Ok(body) => {
                                urls = worker_urls_from_json(&body)
                                    .into_iter()
                                    .map(|u| ("workers".to_string(), u))
                                    .collect();
                                source = format!("GET {path}");
                            }
                            Err(e) => source = format!("GET {path} failed: {e}"),
                        }
                    }
                }
            }
            let mut unresolved = Vec::new();
            let mut edges = Vec::new();
            for (_, url) in &urls {
                // A worker URL means an address in the router's own namespace.
                let at =
                    |(_, h, p, _): (String, String, u16, String)| self.component_at(c.netns, &h, p);
                match parse_url(url).and_then(at) {
                    Some(to) if to != c.id => edges.push(Edge {
                        from: c.id.clone(),
                        to,
                        origin: EdgeOrigin::Config,
                        connections: None,
                    }),
                    Some(_) => {}
                    None => unresolved.push(url.clone()),
                }
            }
            for e in edges {
                self.topo.upsert_edge(e);
            }
            if let Some(comp) = self.topo.components.iter_mut().find(|x| x.id == c.id) {
                if !urls.is_empty() {
                    let all: Vec<&str> = urls.iter().map(|(_, u)| u.as_str()).collect();
                    comp.labels.insert("workers".into(), all.join(","));
                }
                comp.labels.insert("workers_source".into(), source);
                if !unresolved.is_empty() {
                    comp.labels
                        .insert("workers_unresolved".into(), unresolved.join(","));
                }
            }
        }
    }

    fn proxies(&mut self) {
        let proxy_profiles: Vec<usize> = self
            .compiled
            .iter()
            .enumerate()
            .filter(|(_, c)| c.p.connects_to_known)
            .map(|(i, _)| i)
            .collect();
        if proxy_profiles.is_empty() || self.topo.components.is_empty() {
            return;
        }
        // proxies in front of proxies: a few rounds, each adding the new listen ports
        for _round in 0..3 {
            // Ports by namespace: two pods can listen on one port.
            let mut known_ports: BTreeMap<(Option<u64>, u16), String> = BTreeMap::new();
            for c in self.topo.components.iter().filter(|c| c.parent.is_none()) {
                for p in c.listen_ports() {
                    known_ports
                        .entry((c.netns, p))
                        .or_insert_with(|| c.id.clone());
                }
            }
            let mut known_pids: BTreeSet<i32> = BTreeSet::new();
            for c in &self.topo.components {
                for &p in &c.pids {
                    known_pids.insert(p);
                    known_pids.extend(self.table.ancestors(p));
                }
            }
            known_pids.extend(self.opts.exclude_pids.iter().copied());
            // client-side ESTABLISHED sockets towards a known port, by inode, per namespace
            let mut wanted: BTreeMap<u64, String> = BTreeMap::new();
            let mut pids_by_ns: BTreeMap<u64, i32> = BTreeMap::new();
            for &pid in self.table.procs.keys() {
                if let Some(ns) = self.table.netns(pid) {
                    pids_by_ns.entry(ns).or_insert(pid);
                }
            }
            for &rep in pids_by_ns.values() {
                let ns = self.table.foreign_netns(rep);
                for e in self.table.tcp_of(rep).iter() {
                    // CLOSE_WAIT too: a proxy that leaks its upstream connections (the
                    // upstream hung up, the proxy never closed) is still that upstream's
                    // client, and exactly the proxy worth finding.
                    let client_state =
                        matches!(e.state, TcpState::Established | TcpState::CloseWait);
                    if !client_state || e.inode == 0 {
                        continue;
                    }
                    if known_ports.contains_key(&(ns, e.local_address.port())) {
                        continue; // the server side of a known component
                    }
                    if let Some(target) = known_ports.get(&(ns, e.remote_address.port())) {
                        wanted.insert(e.inode, target.clone());
                    }
                }
            }
            if wanted.is_empty() {
                return;
            }
            // which processes hold those sockets (the expensive part: fd scans)
            let mut found: BTreeMap<i32, BTreeMap<String, u32>> = BTreeMap::new();
            for &pid in self.table.procs.keys() {
                if known_pids.contains(&pid) {
                    continue;
                }
                let Ok(inodes) = socket_inodes(&self.table.root, pid) else {
                    continue;
                };
                for i in inodes {
                    if let Some(t) = wanted.get(&i) {
                        *found.entry(pid).or_default().entry(t.clone()).or_insert(0) += 1;
                    }
                }
            }
            let mut added = false;
            for (pid, targets) in found {
                let Some(proc) = self.table.procs.get(&pid).cloned() else {
                    continue;
                };
                let listen = self.table.listen_of(pid);
                let Some(first) = listen.first().copied() else {
                    continue;
                };
                let Some(&ci) = proxy_profiles.iter().find(|&&ci| {
                    let c = &self.compiled[ci];
                    let has_rules =
                        !c.cmdline.is_empty() || !c.comm.is_empty() || !c.title.is_empty();
                    !has_rules || c.matches(&proc).is_some()
                }) else {
                    continue;
                };
                let prof = self.compiled[ci].p;
                let role = Role::parse(&prof.role).unwrap_or(Role::Proxy);
                let id = format!("{role}@{}", self.table.keyed(pid, &first.to_string()));
                if let Some(existing) = self.topo.components.iter_mut().find(|c| c.id == id) {
                    // another process of the same proxy (worker of a master)
                    if !existing.pids.contains(&pid) {
                        existing.pids.push(pid);
                    }
                } else {
                    let mut c = Component::new(id.clone(), role, prof.stack.clone());
                    c.profile = prof.name.clone();
                    c.pids = vec![pid];
                    c.main_pid = Some(pid);
                    c.listen = listen.iter().map(|a| a.to_string()).collect();
                    c.http_url = Some(format!(
                        "http://{}:{}",
                        connect_host(&first.ip().to_string()),
                        first.port()
                    ));
                    c.labels.insert(LABEL_FOUND_BY.into(), "sockets".into());
                    c.labels.insert("comm".into(), proc.comm.clone());
                    c.netns = self.table.foreign_netns(pid);
                    c.container = crate::cgroup::of_pid(&self.table.root, pid).map(|p| p.name());
                    self.topo.components.push(c);
                    added = true;
                }
                for (to, n) in targets {
                    self.topo.upsert_edge(Edge {
                        from: id.clone(),
                        to,
                        origin: EdgeOrigin::Sockets,
                        connections: Some(n),
                    });
                }
            }
            if !added {
                return;
            }
        }
    }

    fn extra_pids(&mut self) {
        for &pid in &self.opts.extra_pids {
            if self.topo.components.iter().any(|c| c.pids.contains(&pid)) {
                continue;
            }
            let Some(proc) = self.table.procs.get(&pid).cloned() else {
                // vanished or hidden: still listed, so the snapshot says what happened
                let mut c = Component::new(format!("other@pid{pid}"), Role::Other, "generic");
                c.profile = "--pid".into();
                c.pids = vec![pid];
                c.main_pid = Some(pid);
                c.labels
                    .insert(LABEL_FOUND_BY.into(), "--pid (not found in procfs)".into());
                self.topo.components.push(c);
                continue;
            };
            let mut c = match self.best_top_level(&proc) {
                Some((ci, m)) => self.build_component(pid, ci, m, None),
                None => {
                    let listen = self.table.listen_of(pid);
                    let id = match listen.first() {
                        Some(a) => format!("other@{}", self.table.keyed(pid, &a.to_string())),
                        None => format!("other@pid{pid}"),
                    };
                    let mut c = Component::new(id, Role::Other, "generic");
                    c.profile = "--pid".into();
                    c.pids = vec![pid];
                    c.main_pid = Some(pid);
                    c.listen = listen.iter().map(|a| a.to_string()).collect();
                    c.netns = self.table.foreign_netns(pid);
                    c.container = crate::cgroup::of_pid(&self.table.root, pid).map(|p| p.name());
                    c
                }
            };
            c.labels.insert(LABEL_FOUND_BY.into(), "--pid".into());
            self.push_unique(c);
        }
    }

    fn extra_urls(&mut self) {
        for url in &self.opts.extra_urls {
            let Some((scheme, host, port, path)) = parse_url(url) else {
                let mut c = Component::new(format!("other@{url}"), Role::Other, "generic");
                c.profile = "--url".into();
                c.labels
                    .insert(LABEL_FOUND_BY.into(), "--url (unparsable)".into());
                self.topo.components.push(c);
                continue;
            };
            let base = format!("{scheme}://{}:{port}", connect_host(&host));
            if let Some(id) = self.component_at(None, &host, port) {
                if let Some(c) = self.topo.components.iter_mut().find(|c| c.id == id) {
                    if c.http_url.is_none() {
                        c.http_url = Some(base.clone());
                    }
                    c.labels.insert("url".into(), url.clone());
                }
                continue;
            }
            let addr = addr_string(&host, port);
            let mut c = Component::new(format!("other@{addr}"), Role::Other, "generic");
            c.profile = "--url".into();
            c.listen = vec![addr];
            c.http_url = Some(base.clone());
            c.metrics_url = Some(if path.ends_with("metrics") {
                format!("{base}{path}")
            } else {
                format!("{base}/metrics")
            });
            c.labels.insert(LABEL_FOUND_BY.into(), "--url".into());
            self.push_unique(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn flags_parse_like_argparse() {
        let a = v("timeout 60 python -m sglang_router.launch_router --host 127.0.0.1 --port=30000 --pd-disaggregation --prefill http://127.0.0.1:31011 38998 --prefill http://127.0.0.1:31013 --decode http://127.0.0.1:31012 --disaggregation_mode decode");
        assert_eq!(flag_value(&a, "--host").as_deref(), Some("127.0.0.1"));
        assert_eq!(flag_value(&a, "--port").as_deref(), Some("30000"));
        assert_eq!(
            flag_value(&a, "--disaggregation-mode").as_deref(),
            Some("decode")
        );
        let p = flag_values(&a, "--prefill");
        assert_eq!(
            p,
            vec![
                v("http://127.0.0.1:31011 38998"),
                v("http://127.0.0.1:31013")
            ]
        );
        assert_eq!(
            flag_values(&a, "--decode"),
            vec![v("http://127.0.0.1:31012")]
        );
        assert!(flag_value(&a, "--nope").is_none());
    }

    #[test]
    fn urls_and_hosts() {
        assert_eq!(
            parse_url("http://u:p@127.0.0.1:31012/x"),
            Some(("http".into(), "127.0.0.1".into(), 31012, "/x".into()))
        );
        assert_eq!(parse_url("http://[::1]:8000").map(|u| u.2), Some(8000));
        assert!(hosts_equivalent("0.0.0.0", "127.0.0.1"));
        assert!(hosts_equivalent("localhost", "127.0.0.1"));
        assert!(!hosts_equivalent("10.0.0.1", "10.0.0.2"));
        assert_eq!(connect_host("0.0.0.0"), "127.0.0.1");
        assert!(loopback_get("10.1.2.3", 80, "/", Duration::from_millis(10), None).is_err());
    }

    #[test]
    fn scrape_addresses_are_own_listening_sockets() {
        let sa = |s: &str| s.parse::<SocketAddr>().unwrap();
        let wild = [sa("0.0.0.0:30000")];
        assert_eq!(
            scrape_addr("10.1.2.3", 30000, &wild).as_deref(),
            Ok("127.0.0.1:30000")
        );
        let own = [sa("127.0.0.1:29000"), sa("10.9.9.9:30000")];
        assert_eq!(
            scrape_addr("10.9.9.9", 30000, &own).as_deref(),
            Ok("10.9.9.9:30000")
        );
        assert_eq!(
            scrape_addr("127.0.0.1", 29000, &own).as_deref(),
            Ok("127.0.0.1:29000")
        );
        let remote = scrape_addr("10.1.2.3", 31000, &own).unwrap_err();
        assert!(remote.contains("not on this host"), "{remote}");
        let squatted = scrape_addr("127.0.0.1", 31000, &own).unwrap_err();
        assert!(
            squatted.contains("not one of its listening sockets"),
            "{squatted}"
        );
        assert!(scrape_addr("localhost", 31000, &[]).is_err());
        let v6 = [sa("[::]:8000")];
        assert_eq!(scrape_addr("::", 8000, &v6).as_deref(), Ok("[::1]:8000"));
    }

    #[test]
    fn workers_json_shapes() {
        assert_eq!(
            worker_urls_from_json(r#"{"workers":[{"url":"http://a:1"},{"url":"http://b:2"}]}"#),
            vec!["http://a:1", "http://b:2"]
        );
        assert_eq!(
            worker_urls_from_json(r#"[{"url":"http://a:1"}]"#),
            vec!["http://a:1"]
        );
        assert!(worker_urls_from_json("garbage").is_empty());
    }
}
