//! `deploy/kubernetes/daemonset.yaml` agrees with the binary and with the systemd unit: its
//! arguments are ones `wedgewatch daemon` takes, it grants exactly the unit's capabilities
//! (drop ALL, add those), it runs in the host PID namespace with the host's `/proc` mounted
//! read-only where `--proc-root` points, and the scrape annotation names the port the
//! exporter listens on; its state directory (incident bundles included) is on the node's
//! disk. (No YAML parser among the dev-dependencies: the file's own layout,
//! one setting a line, is read.)

use std::path::Path;
use std::process::{Command, Stdio};

fn read(rel: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The lines of a block list (`key:` then `- item` lines at a deeper indent), comments out.
fn list_after(text: &str, key: &str) -> Vec<String> {
    let mut lines = text.lines().skip_while(|l| l.trim() != key);
    let head = lines.next().unwrap_or_else(|| panic!("no {key}"));
    let indent = head.len() - head.trim_start().len();
    lines
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .take_while(|l| {
            l.len() - l.trim_start().len() >= indent && l.trim_start().starts_with("- ")
        })
        .map(|l| l.trim_start().trim_start_matches("- ").trim().to_string())
        .collect()
}

/// The value of the first `key: value` line.
fn value_of(text: &str, key: &str) -> String {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
        .map(|v| {
            v.split('#')
                .next()
                .unwrap_or_default()
                .trim()
                .trim_matches('"')
                .to_string()
        })
        .unwrap_or_else(|| panic!("no {key}"))
}

#[test]
fn its_arguments_are_flags_the_daemon_takes() {
    let ds = read("deploy/kubernetes/daemonset.yaml");
    let args = list_after(&ds, "args:");
    assert_eq!(args.first().map(String::as_str), Some("daemon"), "{args:?}");
    let out = Command::new(env!("CARGO_BIN_EXE_wedgewatch"))
        .args(&args)
        .arg("--help")
        .stdin(Stdio::null())
        .output()
        .expect("run wedgewatch");
    assert!(
        out.status.success(),
        "wedgewatch {args:?} --help: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listen = args
        .iter()
        .find_map(|a| a.strip_prefix("--metrics-listen="))
        .expect("--metrics-listen");
    let port = listen.rsplit(':').next().unwrap_or_default();
    assert_eq!(
        value_of(&ds, "prometheus.io/port"),
        port,
        "scrape annotation"
    );
    assert_eq!(value_of(&ds, "prometheus.io/scrape"), "true");
    assert_eq!(value_of(&ds, "containerPort"), port);
    assert!(
        args.contains(&"--proc-root=/host/proc".to_string()),
        "{args:?}"
    );
}

#[test]
fn it_grants_exactly_the_units_capabilities_and_reads_proc_read_only() {
    let ds = read("deploy/kubernetes/daemonset.yaml");
    let mut added = list_after(&ds, "add:");
    added.sort();
    let unit = read("deploy/wedgewatch.service");
    let mut bounding: Vec<String> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit's CapabilityBoundingSet")
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_").to_string())
        .collect::<Vec<_>>();
    bounding.sort();
    assert_eq!(added, bounding, "the DaemonSet and the unit grant the same");
    assert!(!added.iter().any(|c| c == "NET_ADMIN"), "{added:?}");
    assert!(ds.contains("drop: [\"ALL\"]"), "drops everything else");
    assert_eq!(value_of(&ds, "hostPID"), "true");
    assert_eq!(value_of(&ds, "allowPrivilegeEscalation"), "false");
    assert_eq!(value_of(&ds, "readOnlyRootFilesystem"), "true");
    assert_eq!(value_of(&ds, "privileged"), "false");
    // The host's /proc, mounted read-only at /host/proc (the mount, then the volume).
    let mut parts = ds.split("- name: host-proc").skip(1);
    let two = |p: Option<&str>| -> Vec<String> {
        let p = p.expect("a host-proc entry");
        p.lines()
            .skip(1)
            .take(2)
            .map(|l| l.trim().to_string())
            .collect()
    };
    assert_eq!(
        two(parts.next()),
        ["mountPath: /host/proc", "readOnly: true"]
    );
    assert_eq!(two(parts.next()), ["hostPath:", "path: /proc"]);
}

/// The YAML documents of the file (`---` lines between them).
fn documents(text: &str) -> Vec<String> {
    text.split("\n---\n").map(str::to_string).collect()
}

/// The lines of the block under the first `key:` line (deeper indented), comments out,
/// trimmed.
fn block_under(text: &str, key: &str) -> Vec<String> {
    let mut lines = text.lines().skip_while(|l| l.trim() != key);
    let head = lines.next().unwrap_or_else(|| panic!("no {key}"));
    let indent = head.len() - head.trim_start().len();
    lines
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .take_while(|l| l.len() - l.trim_start().len() > indent)
        .map(|l| l.trim().to_string())
        .collect()
}

/// Issue 34 item 17: docs/fleet.md says the DaemonSet names the node; the daemon reads
/// `WEDGEWATCH_NODE` (`sys::node::NODE_ENV`), so the container sets it from `spec.nodeName`
/// (the pod's hostname is the pod's, not the node's).
#[test]
fn it_names_the_node_from_spec_node_name() {
    let ds = read("deploy/kubernetes/daemonset.yaml");
    let env = block_under(&ds, "env:");
    let at = env
        .iter()
        .position(|l| l == &format!("- name: {}", wedgewatch::sys::node::NODE_ENV))
        .unwrap_or_else(|| panic!("no {} in env: {env:?}", wedgewatch::sys::node::NODE_ENV));
    assert_eq!(
        env[at + 1..at + 4],
        ["valueFrom:", "fieldRef:", "fieldPath: spec.nodeName"],
        "{env:?}"
    );
    let fleet = read("docs/fleet.md");
    assert!(
        fleet.contains("a DaemonSet sets it from `spec.nodeName`"),
        "docs/fleet.md still says so"
    );
}

/// Issue 34 item 3: the exporter listens on the pod's IP, reachable from every pod of the
/// cluster by default. A NetworkPolicy selecting the DaemonSet's pods lets in only the
/// selected Prometheus, on the metrics port alone.
#[test]
fn a_network_policy_lets_only_prometheus_reach_the_exporter() {
    let text = read("deploy/kubernetes/daemonset.yaml");
    let docs = documents(&text);
    let ds = docs
        .iter()
        .find(|d| d.contains("\nkind: DaemonSet\n"))
        .expect("the DaemonSet");
    let policy = docs
        .iter()
        .find(|d| d.contains("\nkind: NetworkPolicy\n"))
        .expect("a NetworkPolicy in the manifest");
    assert_eq!(value_of(policy, "namespace"), value_of(ds, "namespace"));
    let pod_label = block_under(ds, "matchLabels:");
    let spec = block_under(policy, "spec:");
    assert_eq!(spec[0..2], ["podSelector:", "matchLabels:"], "{spec:?}");
    assert_eq!(spec[2], pod_label[0], "it selects the DaemonSet's pods");
    assert_eq!(list_after(policy, "policyTypes:"), ["Ingress"]);
    // One rule: from a selected source (an empty or missing `from` lets everyone in), to the
    // metrics port only.
    let ingress = block_under(policy, "ingress:");
    assert_eq!(
        ingress.iter().filter(|l| l.starts_with("- from:")).count(),
        1,
        "{ingress:?}"
    );
    let from = block_under(policy, "- from:");
    assert!(
        from.iter().any(|l| l.ends_with("Selector:")) && from.iter().any(|l| l == "matchLabels:"),
        "a selected source: {from:?}"
    );
    assert!(
        !from
            .iter()
            .any(|l| l.contains("{}") || l.starts_with("- ipBlock")),
        "no selector matching everything: {from:?}"
    );
    let port = value_of(ds, "containerPort");
    let ports = block_under(policy, "ports:");
    assert_eq!(
        ports,
        ["- protocol: TCP", &format!("port: {port}")],
        "{ports:?}"
    );
}

/// Issue 36: incident bundles outlive the pod's restart and the node's reboot: the state
/// directory the daemon is told (`STATE_DIRECTORY`) is mounted from a hostPath, not an
/// emptyDir that dies with the pod.
#[test]
fn its_state_directory_with_the_incidents_is_on_the_nodes_disk() {
    let ds = read("deploy/kubernetes/daemonset.yaml");
    let env = block_under(&ds, "- name: STATE_DIRECTORY");
    assert_eq!(
        env.first().map(String::as_str),
        Some("value: /var/lib/wedgewatch"),
        "{env:?}"
    );
    let mut parts = ds.split("- name: state\n").skip(1);
    let mount = parts.next().expect("the state mount");
    assert!(
        mount
            .lines()
            .next()
            .is_some_and(|l| l.trim() == "mountPath: /var/lib/wedgewatch"),
        "{mount}"
    );
    let volume: Vec<&str> = parts
        .next()
        .expect("the state volume")
        .lines()
        .take(3)
        .map(str::trim)
        .collect();
    assert_eq!(
        volume,
        [
            "hostPath:",
            "path: /var/lib/wedgewatch",
            "type: DirectoryOrCreate"
        ]
    );
}
