//! What a component's build reads of its processes besides the command line, kept per process
//! incarnation in the [`DiscoveryCache`](super::DiscoveryCache): the few environment variables
//! discovery uses (never the whole environment: the daemon keeps no secrets), and the installed
//! versions (a read that timed out is tried again up to [`MAX_VERSIONS_TRIES`] times).

use super::table::ProcTable;
use crate::sources::versions;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Some variables of a process's environment, and which were asked for.
#[derive(Debug, Clone)]
pub(super) struct EnvMemo {
    pub names: Arc<Vec<String>>,
    pub vars: Arc<BTreeMap<String, String>>,
}

/// The versions read of a process, and for which packages.
#[derive(Debug, Clone)]
pub(super) struct VersionsMemo {
    pub packages: Vec<String>,
    pub versions: Arc<BTreeMap<String, String>>,
    /// Reads that timed out so far; the memo is final when 0 (the read finished) or
    /// [`MAX_VERSIONS_TRIES`].
    pub timeouts: u32,
}

/// Versions reads of one process incarnation that may time out before it is given up.
pub(super) const MAX_VERSIONS_TRIES: u32 = 3;

impl VersionsMemo {
    fn is_final(&self) -> bool {
        self.timeouts == 0 || self.timeouts >= MAX_VERSIONS_TRIES
    }
}

impl ProcTable {
    /// The variables `names` of `pid`'s environment (those set), read once per incarnation.
    pub fn env_vars(&self, pid: i32, names: &Arc<Vec<String>>) -> Arc<BTreeMap<String, String>> {
        let memo = self.with_entry(pid, |e| e.env.clone()).flatten();
        if let Some(m) = memo.filter(|m| m.names == *names) {
            return m.vars;
        }
        let Some(all) = self.environ_read(pid) else {
            return Arc::default();
        };
        let vars: BTreeMap<String, String> = names
            .iter()
            .filter_map(|n| all.get(n).map(|v| (n.clone(), v.clone())))
            .collect();
        let vars = Arc::new(vars);
        self.with_entry(pid, |e| {
            e.env = Some(EnvMemo {
                names: Arc::clone(names),
                vars: Arc::clone(&vars),
            })
        });
        vars
    }

    /// The installed versions of `packages` for `pid`, read once per incarnation.
    pub fn versions(
        &self,
        pid: i32,
        argv: &[String],
        env: &BTreeMap<String, String>,
        packages: &[String],
    ) -> BTreeMap<String, String> {
        let memo = self.with_entry(pid, |e| e.versions.clone()).flatten();
        let memo = memo.filter(|m| m.packages == packages);
        if let Some(m) = memo.as_ref().filter(|m| m.is_final()) {
            return m.versions.as_ref().clone();
        }
        let read = versions::read(&self.proc, pid, argv, env, packages);
        self.count_versions_read();
        let timeouts = match read.complete {
            true => 0,
            false => memo.map_or(0, |m| m.timeouts) + 1,
        };
        if let Some(why) = read.cut.as_ref() {
            tracing::info!(pid, "versions read from part of the process's files: {why}");
        } else if timeouts == MAX_VERSIONS_TRIES {
            tracing::info!(pid, "versions not read again: {timeouts} reads timed out");
        }
        let versions = Arc::new(read.versions.clone());
        self.with_entry(pid, |e| {
            e.versions = Some(VersionsMemo {
                packages: packages.to_vec(),
                versions,
                timeouts,
            })
        });
        read.versions
    }
}
