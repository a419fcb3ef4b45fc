//! Installed versions are read inside the target's root (issue 34, item 15): a real process
//! chrooted into a tree whose `/venv` is an absolute link to a path that exists on the host
//! shows the versions of its own tree, never the host's.

use wedgewatch_testkit::ready_python;

use ready_python::ReadyPython;
use std::collections::BTreeMap;
use std::path::Path;
use wedgewatch::sources::versions;
use wedgewatch::sys::ProcFs;

/// A python process chrooted into `root` (it chroots itself once started: nothing inside the
/// tree needs to be executable), killed on drop.
fn start_chrooted(root: &Path) -> ReadyPython {
    let code = "import os, sys, time\nos.chroot(sys.argv[1])\nos.chdir('/')\nprint('ready', flush=True)\ntime.sleep(600)\n";
    ReadyPython::start(code, &[root.as_os_str()], "chroot")
}

fn dist(prefix: &Path, name: &str, version: &str) {
    let d = prefix.join(format!(
        "lib/python3.11/site-packages/{name}-{version}.dist-info"
    ));
    std::fs::create_dir_all(&d).expect("mkdir");
    let meta = format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n");
    std::fs::write(d.join("METADATA"), meta).expect("write");
}

fn read(pid: i32, interpreter: &str) -> BTreeMap<String, String> {
    let argv = vec![
        interpreter.to_string(),
        "-m".into(),
        "sglang.launch_server".into(),
    ];
    let packages = vec!["sglang".to_string()];
    let r = versions::read(&ProcFs::real(), pid, &argv, &BTreeMap::new(), &packages);
    assert!(r.complete, "{r:?}");
    r.versions
}

#[test]
fn a_link_in_a_chroot_does_not_lead_to_the_hosts_packages() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: chroot needs root");
        return;
    }
    let tmp = tempfile::tempdir().expect("tmp");
    let host_venv = tmp.path().join("host-venv");
    dist(&host_venv, "sglang", "6.6.6");
    let root = tmp.path().join("root");
    std::fs::create_dir_all(&root).expect("mkdir");
    // escapes when resolved from our root: the host's venv
    std::os::unix::fs::symlink(&host_venv, root.join("venv")).expect("ln");
    // the target's own venv, also reached through an absolute link (inside its root)
    dist(&root.join("opt/own"), "sglang", "1.2.3");
    std::os::unix::fs::symlink("/opt/own", root.join("own")).expect("ln");
    let p = start_chrooted(&root);
    let pid = p.pid() as i32;
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/root")).expect("root link"),
        root
    );
    let escaped = read(pid, "/venv/bin/python3");
    assert_eq!(
        escaped.get("sglang"),
        None,
        "the host's version: {escaped:?}"
    );
    let own = read(pid, "/own/bin/python3");
    assert_eq!(
        own.get("sglang").map(String::as_str),
        Some("1.2.3"),
        "{own:?}"
    );
}
