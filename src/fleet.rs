//! `fleet snapshot`: one `wedgewatch snapshot --json` per node, all at once, through the user's
//! own transport (`ssh {node}`, `kubectl exec -n infer {node} --`), each under a hard timeout,
//! then one merge.
//!
//! The template is split by shell rules but never given to a shell: `{node}` is substituted
//! inside each word after splitting, so a node's name can never become a second word. Each
//! transport runs in its own process group, killed on timeout, on drop and when we die, with
//! whatever it started, even in a session of its own (`children`, `children::descendants`). Its
//! output is read up to a cap, its errors to a few KiB for the reason; a failed node is named
//! and the others still merge.

use crate::children::{descendants, Spawned};
use crate::clock::{Clock, SystemClock};
use crate::merge::{Collected, NodeInput};
use crate::model::FailedNode;
use crate::snapshot::ParseBudget;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Most bytes of one node's snapshot read (a big stack's is a few MiB).
pub const MAX_NODE_OUTPUT: usize = 64 << 20;
/// Most bytes read from all the nodes together: what one snapshot file may be
/// (`snapshot::MAX_SNAPSHOT_BYTES`), as their parse budget is what one snapshot's is.
pub const MAX_FLEET_OUTPUT: usize = 256 << 20;
/// Most bytes of one transport's error output kept.
const MAX_NODE_STDERR: usize = 16 << 10;
/// The placeholder for the node in a template.
pub const NODE: &str = "{node}";

/// Why a fleet cannot start.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("--via {0:?}: unbalanced quotes (the template is split by shell rules, never run by a shell)")]
    Unsplittable(String),
    #[error("--via {0:?} is empty")]
    Empty(String),
    #[error("--via {0:?} does not contain {NODE}: every node would be reached the same way")]
    NoPlaceholder(String),
    #[error("node name {0:?}: use letters, digits and - . _ : only (at most 63), not starting with - and not . or ..")]
    BadNode(String),
    #[error("no nodes: --nodes a,b,c")]
    NoNodes,
    #[error("node {0:?} is named twice")]
    Duplicate(String),
}

/// A transport template split into words.
#[derive(Debug, Clone)]
pub struct Transport {
    words: Vec<String>,
}

impl Transport {
    pub fn parse(template: &str) -> Result<Transport, FleetError> {
        let words =
            shlex::split(template).ok_or_else(|| FleetError::Unsplittable(template.into()))?;
        if words.is_empty() {
            return Err(FleetError::Empty(template.into()));
        }
        if !words.iter().any(|w| w.contains(NODE)) {
            return Err(FleetError::NoPlaceholder(template.into()));
        }
        Ok(Transport { words })
    }

    /// The command line for `node`: the template's words with `{node}` substituted,
    /// then `remote`.
    pub fn argv(&self, node: &str, remote: &[String]) -> Vec<String> {
        self.words
            .iter()
            .map(|w| w.replace(NODE, node))
            .chain(remote.iter().cloned())
            .collect()
    }
}

/// Parses `a,b,c`: names checked, no duplicates.
pub fn parse_nodes(list: &str) -> Result<Vec<String>, FleetError> {
    let mut out: Vec<String> = Vec::new();
    for n in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        if !crate::sys::node::is_node_name(n) {
            return Err(FleetError::BadNode(n.into()));
        }
        if out.iter().any(|o| o == n) {
            return Err(FleetError::Duplicate(n.into()));
        }
        out.push(n.to_string());
    }
    if out.is_empty() {
        return Err(FleetError::NoNodes);
    }
    Ok(out)
}

/// What to run where.
#[derive(Debug, Clone)]
pub struct FleetPlan {
    pub nodes: Vec<String>,
    pub via: Transport,
    /// What runs on each node after the transport's words (`wedgewatch snapshot --json`).
    pub remote: Vec<String>,
    pub timeout: Duration,
}

/// Runs the plan on every node at once; the snapshots read (in the plan's order), and the
/// nodes that failed, those whose answer cannot be merged with the others' among them (a
/// merged snapshot, another node's identity: `merge::screen`). Dropping the future aborts
/// every run, which kills its transport.
pub async fn collect(plan: &FleetPlan) -> (Vec<NodeInput>, Vec<FailedNode>) {
    // whatever a transport starts stays below us, however it leaves its group
    descendants::become_subreaper();
    let me = std::process::id() as i32;
    let ours_before: BTreeSet<i32> = descendants::of(me).into_keys().collect();
    let shared = Arc::new(Shared::default());
    let mut set = tokio::task::JoinSet::new();
    for (i, n) in plan.nodes.iter().enumerate() {
        let argv = plan.via.argv(n, &plan.remote);
        let (node, timeout, shared) = (n.clone(), plan.timeout, shared.clone());
        set.spawn(async move { (i, one_node(&node, &argv, timeout, &shared).await) });
    }
    let mut results: Vec<Option<Result<NodeInput, String>>> =
        (0..plan.nodes.len()).map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        if let Ok((i, r)) = joined {
            results[i] = Some(r);
        }
    }
    // nothing a transport started outlives the collection (the transports themselves are
    // tokio's to reap)
    let mut spare = lock(&shared.transports).clone();
    spare.extend(ours_before);
    descendants::kill(me, &spare);
    let (ok, failed) = answered(&plan.nodes, results);
    let (ok, unmergeable) = crate::merge::screen(ok);
    let failed = failed
        .into_iter()
        .chain(unmergeable.into_iter().map(|(inp, why)| FailedNode {
            name: inp.name.unwrap_or(inp.source),
            reason: why.reason(),
        }));
    (ok, failed.collect())
}

/// The snapshots read and the nodes that failed, in the plan's order.
fn answered(
    nodes: &[String],
    results: Vec<Option<Result<NodeInput, String>>>,
) -> (Vec<NodeInput>, Vec<FailedNode>) {
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for (name, r) in nodes.iter().zip(results) {
        match r {
            Some(Ok(inp)) => ok.push(inp),
            Some(Err(reason)) => failed.push(FailedNode {
                name: name.clone(),
                reason,
            }),
            None => failed.push(FailedNode {
                name: name.clone(),
                reason: "its run ended without an answer".to_string(),
            }),
        }
    }
    (ok, failed)
}

/// Runs one node's transport; its snapshot, or why not (one line, no secret).
async fn one_node(
    node: &str,
    argv: &[String],
    timeout: Duration,
    shared: &Shared,
) -> Result<NodeInput, String> {
    let (prog, args) = argv.split_first().ok_or("empty command")?;
    let mut cmd = tokio::process::Command::new(prog);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    crate::children::die_with_parent(&mut cmd);
    let started_ms = SystemClock.now_ms();
    let mut child = cmd.spawn().map_err(|e| format!("cannot run {prog}: {e}"))?;
    let pgid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or("the transport exited before it could be tracked")?;
    lock(&shared.transports).insert(pgid);
    let mut group = Spawned::register(pgid);
    let run = async {
        let (out, err) = tokio::join!(
            read_capped(child.stdout.take(), MAX_NODE_OUTPUT, Some(&shared.output)),
            read_capped(child.stderr.take(), MAX_NODE_STDERR, None)
        );
        (out, err, child.wait().await)
    };
    let Ok((out, err, status)) = tokio::time::timeout(timeout, run).await else {
        // its descendants first (some may have left its group), then the group
        descendants::kill(pgid, &BTreeSet::new());
        group.kill();
        return Err(format!(
            "no answer within {} s (killed)",
            timeout.as_secs_f64()
        ));
    };
    group.reaped();
    let ended_ms = SystemClock.now_ms();
    let code = status
        .map_err(|e| format!("waiting for the transport: {e}"))?
        .code();
    let collected = Collected {
        started_ms,
        ended_ms,
    };
    interpret(node, (out, &err, code), collected, &shared.budget)
}

/// What a finished transport means: exit 0 (or 1, findings) with a snapshot on stdout.
fn interpret(
    node: &str,
    (out, err, code): (Output, &Output, Option<i32>),
    collected: Collected,
    budget: &ParseBudget,
) -> Result<NodeInput, String> {
    let why = last_line(&err.0);
    match code {
        Some(0 | 1) => {}
        Some(c) => return Err(format!("exit status {c}{why}")),
        None => return Err(format!("killed by a signal{why}")),
    }
    if out.1 {
        return Err(format!(
            "wrote more than {} MiB (or the nodes together more than {} MiB)",
            MAX_NODE_OUTPUT >> 20,
            MAX_FLEET_OUTPUT >> 20
        ));
    }
    let text = String::from_utf8(out.0).map_err(|_| "its output is not UTF-8 text".to_string())?;
    let origin = Path::new(node);
    let snapshot = crate::snapshot::parse_snapshot_within(&text, origin, budget).map_err(|e| {
        let msg = e.to_string();
        let msg = msg
            .strip_prefix(node)
            .unwrap_or(&msg)
            .trim_start_matches([':', ' ']);
        format!("not a snapshot: {}{why}", clip(msg))
    })?;
    Ok(NodeInput {
        source: format!("node {node}"),
        snapshot,
        name: Some(node.to_string()),
        collected: Some(collected),
    })
}

/// What the nodes' runs share.
#[derive(Debug, Default)]
struct Shared {
    /// All the nodes' snapshots together may hold what one merged snapshot may.
    budget: ParseBudget,
    /// The transports (process group leaders), tokio's to reap.
    transports: Mutex<BTreeSet<i32>>,
    /// Bytes of snapshot read from all the nodes.
    output: AtomicUsize,
}

fn lock(m: &Mutex<BTreeSet<i32>>) -> std::sync::MutexGuard<'_, BTreeSet<i32>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// ": <the last non-empty line of stderr>", redacted and clipped, or nothing.
fn last_line(err: &[u8]) -> String {
    let text = String::from_utf8_lossy(err);
    match text.lines().map(str::trim).rfind(|l| !l.is_empty()) {
        Some(l) => format!(": {}", clip(&crate::redact::log_line(l))),
        None => String::new(),
    }
}

fn clip(s: &str) -> String {
    let clean: String = s.chars().filter(|c| !c.is_control()).take(300).collect();
    clean
}

/// Bytes read from a pipe, and whether there were more than kept.
type Output = (Vec<u8>, bool);

/// Reads at most `cap` bytes, and no more than `total` (all the nodes' reads together,
/// [`MAX_FLEET_OUTPUT`]) allows; whether there was more.
async fn read_capped<R: AsyncRead + Unpin>(
    r: Option<R>,
    cap: usize,
    total: Option<&AtomicUsize>,
) -> Output {
    let Some(mut r) = r else {
        return (Vec::new(), false);
    };
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = match r.read(&mut chunk).await {
            Ok(0) | Err(_) => return (buf, false),
            Ok(n) => n,
        };
        let all = total.map_or(0, |t| t.fetch_add(n, Ordering::Relaxed) + n);
        if buf.len() + n > cap || all > MAX_FLEET_OUTPUT {
            return (buf, true);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_split_by_shell_rules_and_substitute_per_word() {
        let t = Transport::parse("ssh -o 'ConnectTimeout 5' {node}.cluster").unwrap();
        let argv = t.argv("b", &["wedgewatch".into(), "snapshot".into()]);
        assert_eq!(
            argv,
            [
                "ssh",
                "-o",
                "ConnectTimeout 5",
                "b.cluster",
                "wedgewatch",
                "snapshot"
            ]
        );
        assert!(matches!(
            Transport::parse("ssh 'x"),
            Err(FleetError::Unsplittable(_))
        ));
        assert!(matches!(
            Transport::parse("ssh host"),
            Err(FleetError::NoPlaceholder(_))
        ));
        assert!(matches!(Transport::parse("  "), Err(FleetError::Empty(_))));
    }

    #[test]
    fn reads_stop_at_the_node_cap_and_at_the_fleet_total() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let data = vec![b'x'; 3000];
        let total = AtomicUsize::new(0);
        let (buf, over) = rt.block_on(read_capped(Some(&data[..]), 5000, Some(&total)));
        assert_eq!((buf.len(), over), (3000, false));
        let (buf, over) = rt.block_on(read_capped(Some(&data[..]), 2000, Some(&total)));
        assert!(over && buf.len() <= 2000);
        total.store(MAX_FLEET_OUTPUT - 100, Ordering::Relaxed);
        let (_, over) = rt.block_on(read_capped(Some(&data[..]), 5000, Some(&total)));
        assert!(over, "past what all the nodes together may write");
        let (buf, over) = rt.block_on(read_capped(Some(&data[..]), 5000, None));
        assert_eq!((buf.len(), over), (3000, false));
    }

    #[test]
    fn node_lists_are_checked() {
        assert_eq!(parse_nodes("a, b,c").unwrap(), ["a", "b", "c"]);
        assert!(matches!(parse_nodes("a,a"), Err(FleetError::Duplicate(_))));
        assert!(matches!(
            parse_nodes("a;rm -rf"),
            Err(FleetError::BadNode(_))
        ));
        assert!(matches!(parse_nodes(","), Err(FleetError::NoNodes)));
        for bad in ["-oProxyCommand", "a,-F", ".", "a,..", "a/b"] {
            assert!(
                matches!(parse_nodes(bad), Err(FleetError::BadNode(_))),
                "{bad}"
            );
        }
        assert_eq!(parse_nodes("a-1,.b,...").unwrap(), ["a-1", ".b", "..."]);
    }
}
