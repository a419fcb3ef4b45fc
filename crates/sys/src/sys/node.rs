//! The node wedgewatch runs on: hostname, machine-id, boot-id, non-loopback interface
//! addresses (of wedgewatch's own network namespace, through `getifaddrs`, which asks the
//! kernel over netlink) and the wall and monotonic clocks read back to back. Every read is
//! bounded; a fact that cannot be read is left out, never an error.

use crate::model::{NodeClock, NodeIdentity};
use crate::safe_fs;
use std::net::IpAddr;
use std::path::Path;

/// The environment variable naming the node (a DaemonSet sets it from `spec.nodeName`).
pub const NODE_ENV: &str = "WEDGEWATCH_NODE";
/// Most bytes of an identity file kept (a hostname is at most 64, an id 33).
const MAX_ID_FILE: usize = 256;
/// At most this many addresses are kept.
const MAX_ADDRESSES: usize = 64;

/// Where the identity files are (`/` in production; a fixture tree in tests).
#[derive(Debug, Clone)]
pub struct NodeFiles<'a> {
    pub root: &'a Path,
}

impl NodeFiles<'_> {
    fn read(&self, rel: &str) -> Option<String> {
        let (bytes, _) = safe_fs::read_capped(&self.root.join(rel), MAX_ID_FILE).ok()?;
        let text = String::from_utf8_lossy(&bytes);
        let line = text.lines().next().unwrap_or("").trim();
        let printable = line.chars().all(|c| c.is_ascii_graphic());
        (!line.is_empty() && printable).then(|| line.to_string())
    }

    /// Hostname, machine-id (`/etc/machine-id`, else D-Bus's copy) and boot-id.
    pub fn identity(&self, name_override: Option<&str>) -> NodeIdentity {
        let hostname = self.read("proc/sys/kernel/hostname");
        let machine_id = self
            .read("etc/machine-id")
            .or_else(|| self.read("var/lib/dbus/machine-id"));
        let name = name_override
            .map(str::trim)
            .filter(|n| is_node_name(n))
            .map(str::to_string)
            .or_else(|| hostname.clone())
            .unwrap_or_else(|| "unknown".to_string());
        NodeIdentity {
            name,
            hostname,
            machine_id,
            boot_id: self.read("proc/sys/kernel/random/boot_id"),
            addresses: Vec::new(),
            clock: None,
        }
    }
}

/// Whether a name can namespace components: printable, no `/`, at most 63 bytes; not
/// `.` or `..` and not starting with `-` (it becomes a word of a `--via` command line and a
/// path component: never an option or a parent directory).
pub fn is_node_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 63
        && !n.starts_with('-')
        && n != "."
        && n != ".."
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'))
}

/// This node now: its identity, addresses and clocks.
pub fn this_node() -> NodeIdentity {
    let files = NodeFiles {
        root: Path::new("/"),
    };
    let over = std::env::var(NODE_ENV).ok();
    let mut n = files.identity(over.as_deref());
    n.addresses = addresses();
    n.clock = clocks();
    n
}

/// Non-loopback, non-link-local interface addresses, sorted and deduplicated.
pub fn addresses() -> Vec<String> {
    let Ok(ifs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut out: Vec<String> = ifs
        .filter_map(|i| i.address)
        .filter_map(|a| {
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified() && !is_link_local(ip))
        .map(|ip| ip.to_string())
        .take(MAX_ADDRESSES * 4)
        .collect();
    out.sort();
    out.dedup();
    out.truncate(MAX_ADDRESSES);
    out
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// Wall and monotonic clocks, read back to back.
pub fn clocks() -> Option<NodeClock> {
    use nix::time::{clock_gettime, ClockId};
    let mono = clock_gettime(ClockId::CLOCK_MONOTONIC).ok()?;
    let wall = clock_gettime(ClockId::CLOCK_REALTIME).ok()?;
    let ms = |t: nix::sys::time::TimeSpec| t.tv_sec() * 1000 + t.tv_nsec() / 1_000_000;
    Some(NodeClock {
        wall_ms: ms(wall),
        monotonic_ms: ms(mono),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let w = |rel: &str, text: &str| {
            let p = d.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        w("proc/sys/kernel/hostname", "gpu-node-7\n");
        w("etc/machine-id", "0123456789abcdef0123456789abcdef\n");
        w("proc/sys/kernel/random/boot_id", "6a1e-boot\n");
        d
    }

    #[test]
    fn identity_files_are_read_and_the_name_defaults_to_the_hostname() {
        let d = tree();
        let f = NodeFiles { root: d.path() };
        let n = f.identity(None);
        assert_eq!(n.name, "gpu-node-7");
        assert_eq!(n.hostname.as_deref(), Some("gpu-node-7"));
        assert_eq!(
            n.machine_id.as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
        assert_eq!(n.boot_id.as_deref(), Some("6a1e-boot"));
        assert_eq!(f.identity(Some("node-b")).name, "node-b");
        assert_eq!(f.identity(Some("a/b")).name, "gpu-node-7", "not a name");
    }

    #[test]
    fn missing_or_hostile_files_are_left_out() {
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("etc")).unwrap();
        std::fs::write(d.path().join("etc/machine-id"), "\x1b[2Jevil\n").unwrap();
        let n = NodeFiles { root: d.path() }.identity(None);
        assert_eq!(n.machine_id, None);
        assert_eq!(n.hostname, None);
        assert_eq!(n.name, "unknown");
    }

    #[test]
    fn this_node_has_clocks_and_no_loopback_address() {
        let n = this_node();
        let c = n.clock.unwrap();
        assert!(c.wall_ms > 1_600_000_000_000 && c.monotonic_ms > 0);
        assert!(n.addresses.iter().all(|a| a != "127.0.0.1" && a != "::1"));
        assert!(n.boot_id.is_some(), "Linux has a boot id");
    }
}
