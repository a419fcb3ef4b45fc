//! Versions read from a fixture tree standing in for `/proc` and the target's files.

use super::*;
use std::fs;

/// `<root>/<pid>/{maps,exe,root/...}` and `<root>/sys/kernel/osrelease`.
struct Tree {
    dir: tempfile::TempDir,
    pid: i32,
}

impl Tree {
    fn new(pid: i32) -> Tree {
        let dir = tempfile::tempdir().expect("tmp");
        fs::create_dir_all(dir.path().join(pid.to_string()).join("root")).expect("mkdir");
        Tree { dir, pid }
    }
    fn proc(&self) -> ProcFs {
        ProcFs::new(self.dir.path())
    }
    /// A file at `abs` as the process sees it.
    fn file(&self, abs: &str, text: &str) {
        let p = self
            .dir
            .path()
            .join(self.pid.to_string())
            .join("root")
            .join(abs.trim_start_matches('/'));
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, text).expect("write");
    }
    fn proc_file(&self, rel: &str, text: &str) {
        let p = self.dir.path().join(rel);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, text).expect("write");
    }
}

fn metadata(name: &str, version: &str) -> String {
    format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: x\n\nLong text\nVersion: 9.9.9\n")
}

#[test]
fn a_venv_engine_and_its_mapped_torch() {
    let t = Tree::new(42);
    let venv = "/opt/venv";
    t.file(
        &format!("{venv}/pyvenv.cfg"),
        "home = /usr/bin\nversion = 3.11.9\n",
    );
    let site = format!("{venv}/lib/python3.11/site-packages");
    t.file(
        &format!("{site}/sglang-0.5.4.post1.dist-info/METADATA"),
        &metadata("sglang", "0.5.4.post1"),
    );
    t.file(
        &format!("{site}/sgl_kernel-0.3.1.dist-info/METADATA"),
        &metadata("sgl-kernel", "0.3.1"),
    );
    t.file(
        &format!("{site}/numpy-2.0.0.dist-info/METADATA"),
        &metadata("numpy", "2.0.0"),
    );
    // torch lives elsewhere, found only through the library the process has mapped
    let other = "/usr/local/lib/python3.11/dist-packages";
    t.file(
        &format!("{other}/torch-2.5.0+cu124.dist-info/METADATA"),
        &metadata("torch", "2.5.0+cu124"),
    );
    t.proc_file(
        "42/maps",
        &format!("7f00-7f01 r-xp 00000000 08:01 123  {other}/torch/lib/libtorch_cpu.so\n7f02-7f03 r--p 0 00:00 0 [heap]\n"),
    );
    t.proc_file("sys/kernel/osrelease", "6.8.0-45-generic\n");
    let argv = vec![
        format!("{venv}/bin/python3"),
        "-m".into(),
        "sglang.launch_server".into(),
    ];
    let pk: Vec<String> = ["sglang", "sgl-kernel", "torch", "vllm"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let r = read(&t.proc(), 42, &argv, &BTreeMap::new(), &pk);
    assert!(r.complete);
    let v = r.versions;
    assert_eq!(
        v.get("sglang").map(String::as_str),
        Some("0.5.4.post1"),
        "{v:?}"
    );
    assert_eq!(v.get("sgl-kernel").map(String::as_str), Some("0.3.1"));
    assert_eq!(v.get("torch").map(String::as_str), Some("2.5.0+cu124"));
    assert_eq!(v.get("python").map(String::as_str), Some("3.11.9"));
    assert_eq!(
        v.get("kernel").map(String::as_str),
        Some("6.8.0-45-generic")
    );
    assert!(!v.contains_key("vllm") && !v.contains_key("numpy"), "{v:?}");
}

#[test]
fn pythonpath_and_egg_info_and_python_from_the_path() {
    let t = Tree::new(7);
    t.file(
        "/src/pkg/sglang_router-0.3.2.dist-info/METADATA",
        &metadata("sglang-router", "0.3.2"),
    );
    t.file(
        "/usr/lib/python3.12/site-packages/vllm.egg-info/PKG-INFO",
        &metadata("vllm", "0.32.0"),
    );
    let mut env = BTreeMap::new();
    env.insert(
        "PYTHONPATH".to_string(),
        "/src/pkg:relative/x:/a/../etc".to_string(),
    );
    let argv = vec!["/usr/bin/python3.12".to_string()];
    let pk = vec!["sglang-router".to_string(), "vllm".to_string()];
    let v = read_now(&t.proc(), 7, &argv, &env, &pk);
    assert_eq!(
        v.get("sglang-router").map(String::as_str),
        Some("0.3.2"),
        "{v:?}"
    );
    assert_eq!(v.get("vllm").map(String::as_str), Some("0.32.0"));
    assert_eq!(v.get("python").map(String::as_str), Some("3.12"));
}

#[test]
fn nothing_readable_is_nothing() {
    let t = Tree::new(9);
    let v = read(&t.proc(), 9, &[], &BTreeMap::new(), &["sglang".to_string()]).versions;
    assert!(v.is_empty(), "{v:?}");
    assert_eq!(normalize("Sgl.Kernel--x"), "sgl_kernel_x");
    assert_eq!(
        minor_in("/usr/lib/x86_64-linux-gnu/libpython3.11.so.1.0").as_deref(),
        Some("3.11")
    );
    assert_eq!(minor_in("/usr/bin/python3.12").as_deref(), Some("3.12"));
    assert_eq!(minor_in("/usr/bin/python3"), None);
}
