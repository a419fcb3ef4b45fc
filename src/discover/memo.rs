//! What a component's build reads of its processes besides the command line, kept per
//! process incarnation in the [`DiscoveryCache`](super::DiscoveryCache) so that a
//! rediscovery pass never reads them again for a known process (issue 15, item 3):
//! - the few environment variables discovery uses (GPU hints, where the site-packages are),
//!   never the whole environment: the daemon keeps no secret values;
//! - the installed versions (`sources::versions`, which reads `maps`), once a read finished
//!   within its deadline.
//!
//! Reads that fail or time out are not remembered: the next pass tries again.

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
        if let Some(m) = memo.filter(|m| m.packages == packages) {
            return m.versions.as_ref().clone();
        }
        let read = versions::read(&self.proc, pid, argv, env, packages);
        self.count_versions_read();
        if read.complete {
            let versions = Arc::new(read.versions.clone());
            self.with_entry(pid, |e| {
                e.versions = Some(VersionsMemo {
                    packages: packages.to_vec(),
                    versions,
                })
            });
        }
        read.versions
    }
}
