//! The container a process runs in, named from its cgroup (`/proc/PID/cgroup`): an on-call
//! engineer knows the stack by its containers, not by namespace inodes. Runtimes name the
//! cgroup after the container's id (the paths each one writes: docs/security.md); anything
//! else under a systemd unit is named by the unit. A path is no proof, so the name is a label
//! for humans, never used to decide what to scrape, built only from a safe character set.

use super::{CgroupEntry, ProcFs};

/// Longest unit name kept for the systemd fallback.
const MAX_UNIT: usize = 128;
/// Characters of a container id shown (docker's short id).
const SHORT_ID: usize = 12;

/// Where a process runs, as its cgroup says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// `docker`, `containerd`, `cri-o`, `podman`, `container` (a bare id under kubepods or
    /// another parent), or `systemd` (a unit, no container).
    pub runtime: &'static str,
    /// Short container id (12 hex), or the unit name for `systemd`.
    pub id: String,
    /// Kubernetes pod uid, when the cgroup is under kubepods.
    pub pod: Option<String>,
}

impl Placement {
    /// The name shown: `docker 3726184226f5`, `k8s pod 3d274242-... containerd 3e74d3fd9db4`,
    /// `systemd sglang.service`.
    pub fn name(&self) -> String {
        match &self.pod {
            Some(p) if self.id.is_empty() => format!("k8s pod {p}"),
            Some(p) => format!("k8s pod {p} {} {}", self.runtime, self.id),
            None => format!("{} {}", self.runtime, self.id),
        }
    }
}

/// The container (or systemd unit) of `pid`; None for the root cgroup, an unreadable file,
/// or a path that names nothing we know.
pub fn of_pid(proc: &ProcFs, pid: i32) -> Option<Placement> {
    from_entries(&proc.cgroups(pid).ok()?)
}

/// Reads a process's cgroups ([`ProcFs::cgroups`]). The cgroup v2 entry is asked first,
/// then v1's `name=systemd`, then the other v1 hierarchies; the first path naming a
/// container wins, else the first naming a systemd unit.
pub fn from_entries(entries: &[CgroupEntry]) -> Option<Placement> {
    let mut paths: Vec<(u8, &str)> = entries
        .iter()
        .map(|e| {
            let rank = if e.hierarchy == 0 && e.controllers.is_empty() {
                0
            } else if e.controllers.iter().any(|c| c == "name=systemd") {
                1
            } else {
                2
            };
            (rank, e.path.as_str())
        })
        .filter(|(_, p)| *p != "/" && !p.is_empty())
        .collect();
    paths.sort_by_key(|(r, _)| *r);
    let parsed: Vec<Placement> = paths.iter().filter_map(|(_, p)| parse_path(p)).collect();
    parsed
        .iter()
        .find(|p| p.runtime != "systemd")
        .or(parsed.first())
        .cloned()
}

/// Reads the text of a whole `/proc/PID/cgroup` (as [`from_entries`]).
pub fn parse_file(text: &str) -> Option<Placement> {
    let entries: Vec<CgroupEntry> = text
        .lines()
        .filter_map(|l| {
            let mut it = l.splitn(3, ':');
            let (id, ctrl, path) = (it.next()?, it.next()?, it.next()?);
            Some(CgroupEntry {
                hierarchy: id.parse().ok()?,
                controllers: ctrl
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: path.to_string(),
            })
        })
        .collect();
    from_entries(&entries)
}

/// Reads one cgroup path (the part after the second `:`).
pub fn parse_path(path: &str) -> Option<Placement> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let pod = segs.iter().find_map(|s| pod_uid(s));
    let under_kubepods = segs.iter().any(|s| s.starts_with("kubepods"));
    // Innermost container first: a process of a container nested in another (docker in
    // docker, a pod's container) belongs to the inner one.
    for (i, seg) in segs.iter().enumerate().rev() {
        if let Some((runtime, id)) = scoped_id(seg) {
            return Some(Placement {
                runtime,
                id: short(id),
                pod,
            });
        }
        if is_hex_id(seg) {
            let parent = i.checked_sub(1).and_then(|j| segs.get(j)).copied();
            let runtime = match parent {
                Some("docker") => "docker",
                Some(p) if p.starts_with("libpod") => "podman",
                _ => "container",
            };
            return Some(Placement {
                runtime,
                id: short(seg),
                pod,
            });
        }
        if let Some(id) = seg.strip_prefix("libpod-").filter(|s| is_hex_id(s)) {
            return Some(Placement {
                runtime: "podman",
                id: short(id),
                pod,
            });
        }
    }
    if under_kubepods {
        // The pod's own slice (no container below it): a pod still names where we are.
        return pod.map(|p| Placement {
            runtime: "container",
            id: String::new(),
            pod: Some(p),
        });
    }
    // No container: the innermost systemd unit, if any; not `init.scope`, a login session
    // or a user's manager (naming those on every component would only be noise).
    segs.iter()
        .rev()
        .find(|s| {
            (s.ends_with(".service") || s.ends_with(".scope"))
                && **s != "init.scope"
                && !s.starts_with("session-")
                && !s.starts_with("user@")
                && s.len() <= MAX_UNIT
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | ':'))
        })
        .map(|s| Placement {
            runtime: "systemd",
            id: (*s).to_string(),
            pod: None,
        })
}

/// `docker-<id>.scope`, `cri-containerd-<id>.scope`, `crio-<id>.scope`, `libpod-<id>.scope`
/// (systemd driver) -> (runtime, id). The runtimes' `conmon` scopes are not containers.
fn scoped_id(seg: &str) -> Option<(&'static str, &str)> {
    let stem = seg.strip_suffix(".scope")?;
    const PREFIXES: [(&str, &str); 5] = [
        ("docker-", "docker"),
        ("cri-containerd-", "containerd"),
        ("crio-", "cri-o"),
        ("libpod-", "podman"),
        ("containerd-", "containerd"),
    ];
    PREFIXES.iter().find_map(|(prefix, runtime)| {
        let id = stem.strip_prefix(prefix)?;
        is_hex_id(id).then_some((*runtime, id))
    })
}

/// Container ids are 64 hex digits (docker, containerd, cri-o, podman all use them).
fn is_hex_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn short(id: &str) -> String {
    id.chars().take(SHORT_ID).collect()
}

/// A pod uid from `pod<uid>` (cgroupfs) or `kubepods-<qos>-pod<uid_with_underscores>.slice`
/// (systemd driver), in its usual dashed form.
fn pod_uid(seg: &str) -> Option<String> {
    let raw = match seg.strip_suffix(".slice") {
        Some(stem) if stem.starts_with("kubepods") => stem.rsplit_once("-pod")?.1,
        Some(_) => return None,
        None => seg.strip_prefix("pod")?,
    };
    let uid = raw.replace('_', "-");
    let ok = uid.len() == 36 && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
    ok.then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3726184226f5d3147c25fdeab5b60097e378e8a720503a5e19ecfdf29f869860";

    fn name(text: &str) -> Option<String> {
        parse_file(text).map(|p| p.name())
    }

    // Lines in the formats real hosts produce (kubepods: kubelet's cgroup_manager_linux.go).

    #[test]
    fn docker_cgroupfs_and_systemd_driver() {
        let v1 =
            format!("13:name=systemd:/docker/{ID}\n12:pids:/docker/{ID}\n1:cpuset:/docker/{ID}\n");
        assert_eq!(name(&v1).as_deref(), Some("docker 3726184226f5"));
        let centos = "10:devices:/system.slice/docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope\n1:name=systemd:/system.slice/docker-9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d.scope\n";
        assert_eq!(name(centos).as_deref(), Some("docker 9ec39b91f3d7"));
        let v2 = format!("0::/system.slice/docker-{ID}.scope\n");
        assert_eq!(name(&v2).as_deref(), Some("docker 3726184226f5"));
    }

    #[test]
    fn kubernetes_cgroupfs_and_systemd_driver() {
        let cgroupfs = "11:perf_event:/kubepods/besteffort/pod3d274242-8ee0-11e9-a8a6-1e68d864ef1a/3e74d3fd9db4c9dd921ae05c2502fb984d0cde1b36e581b13f79c639da4518a1\n";
        assert_eq!(
            name(cgroupfs).as_deref(),
            Some("k8s pod 3d274242-8ee0-11e9-a8a6-1e68d864ef1a container 3e74d3fd9db4")
        );
        let systemd = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod2c9b4f10_33c5_4e9a_9e3c_1b1f0d1c7a55.slice/cri-containerd-{ID}.scope\n");
        assert_eq!(
            name(&systemd).as_deref(),
            Some("k8s pod 2c9b4f10-33c5-4e9a-9e3c-1b1f0d1c7a55 containerd 3726184226f5")
        );
        let crio = format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod2c9b4f10_33c5_4e9a_9e3c_1b1f0d1c7a55.slice/crio-{ID}.scope\n");
        assert!(name(&crio).unwrap().ends_with("cri-o 3726184226f5"));
        let guaranteed =
            "0::/kubepods.slice/kubepods-pod2c9b4f10_33c5_4e9a_9e3c_1b1f0d1c7a55.slice\n";
        assert_eq!(
            name(guaranteed).as_deref(),
            Some("k8s pod 2c9b4f10-33c5-4e9a-9e3c-1b1f0d1c7a55")
        );
    }

    #[test]
    fn podman_rootful_rootless_and_cgroupfs() {
        let rootful = format!("0::/machine.slice/libpod-{ID}.scope/container\n");
        assert_eq!(name(&rootful).as_deref(), Some("podman 3726184226f5"));
        let rootless = format!("0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container\n");
        assert_eq!(name(&rootless).as_deref(), Some("podman 3726184226f5"));
        let cgroupfs = format!("0::/libpod_parent/libpod-{ID}\n");
        assert_eq!(name(&cgroupfs).as_deref(), Some("podman 3726184226f5"));
        let conmon = format!("0::/machine.slice/libpod-conmon-{ID}.scope\n");
        assert_eq!(name(&conmon).as_deref(), Some("systemd libpod-conmon-3726184226f5d3147c25fdeab5b60097e378e8a720503a5e19ecfdf29f869860.scope"));
    }

    #[test]
    fn systemd_units_hybrid_hosts_and_nothing() {
        assert_eq!(
            name("0::/system.slice/sglang.service\n").as_deref(),
            Some("systemd sglang.service")
        );
        // A hybrid host (v1 controllers + an empty v2 line): the name=systemd line decides.
        let hybrid = format!(
            "9:name=systemd:/system.slice/docker-{ID}.scope\n8:pids:/\n4:memory:/process_api/46cb55b6\n0::/\n"
        );
        assert_eq!(name(&hybrid).as_deref(), Some("docker 3726184226f5"));
        assert_eq!(name("0::/\n"), None);
        assert_eq!(
            name("0::/user.slice/user-1000.slice/session-3.scope\n"),
            None
        );
        assert_eq!(
            name("0::/user.slice/user-1000.slice/user@1000.service/app.slice/run-r1.scope\n")
                .as_deref(),
            Some("systemd run-r1.scope")
        );
        assert_eq!(name("0::/init.scope\n"), None);
        assert_eq!(name(""), None);
        assert_eq!(name("garbage"), None);
        // Not a container id: not named as one; hostile bytes never make a name.
        assert_eq!(name("0::/docker/abc\n"), None);
        assert_eq!(name("0::/system.slice/evil\x1b[2J.service\n"), None);
        let long = format!("0::/system.slice/{}.service\n", "a".repeat(200));
        assert_eq!(name(&long), None);
    }

    #[test]
    fn reads_a_real_proc_file() {
        // Whatever this host is, reading our own cgroup never fails or panics.
        let _ = of_pid(&ProcFs::real(), std::process::id() as i32);
        assert_eq!(of_pid(&ProcFs::real(), i32::MAX), None);
    }
}
