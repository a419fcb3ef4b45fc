//! The layering of the workspace (docs/architecture.md). The crates are the layers and the
//! compiler holds most of it: a crate names only the crates it depends on. This test keeps
//! what the compiler cannot say:
//! - which crate may depend on which (a new dependency line would be accepted by cargo), and
//!   that judgement has no OS access and no async runtime;
//! - the order of the modules inside one crate (`correlate` below `detect`, `sources` below
//!   `discover`, ...), read from `crate::X` paths, `#[cfg(test)]` items and comments skipped;
//! - that the modules which must reach the OS through `sys` do not open files or sockets.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each crate of the workspace (its folder) and the workspace crates it may depend on.
const CRATE_DEPS: &[(&str, &[&str])] = &[
    ("crates/model", &[]),
    ("crates/sys", &["wedgewatch-model"]),
    ("crates/collect", &["wedgewatch-model", "wedgewatch-sys"]),
    ("crates/judge", &["wedgewatch-model"]),
    (
        "crates/output",
        &["wedgewatch-model", "wedgewatch-sys", "wedgewatch-judge"],
    ),
    ("crates/tui", &["wedgewatch-model"]),
    // The tests' support crate: the whole binary's library, as the tests see it.
    ("crates/testkit", &["wedgewatch"]),
    (
        ".",
        &[
            "wedgewatch-model",
            "wedgewatch-sys",
            "wedgewatch-collect",
            "wedgewatch-judge",
            "wedgewatch-output",
            "wedgewatch-tui",
        ],
    ),
];

/// External crates that mean OS access or an async runtime: judgement takes none of them.
const OS_CRATES: &[&str] = &[
    "tokio",
    "nix",
    "libc",
    "procfs",
    "nvml-wrapper",
    "netlink-sys",
    "netlink-packet-core",
    "netlink-packet-sock-diag",
];

/// The modules of one crate's `src/` and their layer, bottom first. A module may name
/// modules of its own layer and of any lower one; names that are not this crate's own
/// modules are other crates' (the compiler checks those).
const MODULE_LAYERS: &[(&str, &[&[&str]])] = &[
    (
        "crates/model/src",
        &[
            &["clock", "error", "config"],
            &["model"],
            &["redact", "prom"],
            &["lib"],
        ],
    ),
    (
        "crates/sys/src",
        &[&["safe_fs", "deadline"], &["sys"], &["children"], &["lib"]],
    ),
    (
        "crates/collect/src",
        &[&["sources"], &["probes"], &["discover"], &["lib"]],
    ),
    (
        "crates/judge/src",
        &[&["correlate"], &["detect"], &["pipeline"], &["lib"]],
    ),
    (
        "crates/output/src",
        &[
            &["report", "diff"],
            &["snapshot"],
            &["export", "record", "merge"],
            &["lib"],
        ],
    ),
    (
        "crates/tui/src",
        &[&["feed"], &["app"], &["render"], &["lib"]],
    ),
    (
        "src",
        &[
            &["alloc", "logging"],
            &["policy"],
            &["sampler"],
            &["attach", "daemon", "doctor", "fleet"],
            &["fuzz_entry", "lib"],
            &["cli", "main"],
        ],
    ),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `[dependencies]` names of a Cargo.toml (not dev- or build-dependencies).
fn dependencies(manifest: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let value: toml_like::Table = toml_like::parse(&text);
    value.section("dependencies")
}

/// Just enough of TOML to list a section's keys (no dev-dependency on a TOML parser).
mod toml_like {
    use std::collections::BTreeSet;

    pub struct Table(Vec<(String, String)>);

    pub fn parse(text: &str) -> Table {
        let mut section = String::new();
        let mut keys = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if let Some(s) = line.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
                section = s.trim().to_string();
            } else if let Some((k, _)) = line.split_once('=') {
                if !line.starts_with('#') {
                    let key = k.trim().split('.').next().unwrap_or("").to_string();
                    keys.push((section.clone(), key));
                }
            }
        }
        Table(keys)
    }

    impl Table {
        pub fn section(&self, name: &str) -> BTreeSet<String> {
            self.0
                .iter()
                .filter(|(s, _)| s == name)
                .map(|(_, k)| k.clone())
                .collect()
        }
    }
}

#[test]
fn each_crate_depends_only_on_the_layers_below_it() {
    let mut found = Vec::new();
    for (dir, allowed) in CRATE_DEPS {
        let deps = dependencies(&root().join(dir).join("Cargo.toml"));
        for d in deps.iter().filter(|d| d.starts_with("wedgewatch")) {
            if !allowed.contains(&d.as_str()) {
                found.push(format!("{dir} depends on {d}"));
            }
        }
    }
    let members: BTreeSet<String> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .map(|e| format!("crates/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    let listed: BTreeSet<String> = CRATE_DEPS
        .iter()
        .map(|(d, _)| d.to_string())
        .filter(|d| d != ".")
        .collect();
    assert_eq!(members, listed, "every crate has its place in CRATE_DEPS");
    assert!(
        found.is_empty(),
        "dependencies against the layering:\n{}",
        found.join("\n")
    );
}

#[test]
fn judgement_has_no_os_access_and_no_async_runtime() {
    let deps = dependencies(&root().join("crates/judge/Cargo.toml"));
    let os: Vec<&&str> = OS_CRATES.iter().filter(|c| deps.contains(**c)).collect();
    assert!(os.is_empty(), "crates/judge depends on {os:?}");
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`sources/stacks/mod.rs` -> `sources`).
fn module_of(rel: &Path) -> String {
    let first = rel
        .components()
        .next()
        .unwrap()
        .as_os_str()
        .to_string_lossy();
    first.trim_end_matches(".rs").to_string()
}

/// A test-only file: `tests.rs` or anything under a `tests/` folder of a module.
fn is_test_file(rel: &Path) -> bool {
    rel.file_name().is_some_and(|n| n == "tests.rs")
        || rel.components().any(|c| c.as_os_str() == "tests")
}

/// `text` without comments and without `#[cfg(test)]` items (the item after the attribute,
/// up to its closing brace or its `;`). String literals are kept: none names a module path.
fn production_code(text: &str) -> String {
    let mut out = String::new();
    let mut skipping = false;
    let mut depth = 0usize;
    let mut opened = false;
    for line in text.lines() {
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let trimmed = code.trim();
        if !skipping && trimmed.starts_with("#[cfg(test)]") {
            skipping = true;
            depth = 0;
            opened = false;
            continue;
        }
        if skipping {
            for ch in code.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
            let ended_decl = !opened && trimmed.ends_with(';');
            if (opened && depth == 0) || ended_decl {
                skipping = false;
            }
            continue;
        }
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Top-level modules named by `crate::` paths in `code`, with `crate::{a, b::c}` groups.
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        // `foo_crate::x` is not ours.
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Items at depth 1 of the group each start with a module name.
            let mut depth = 1;
            let mut item_start = true;
            for (j, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 1 => {
                        let name = ident(&group[j..]);
                        if !name.is_empty() {
                            out.insert(name);
                        }
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(rest);
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// The layer of `module` in one crate's table.
fn layer_in(layers: &[&[&str]], module: &str) -> Option<usize> {
    layers.iter().position(|mods| mods.contains(&module))
}

/// Every upward reference inside one crate's `src/`, and every module without a layer.
fn violations(src_dir: &str, layers: &[&[&str]]) -> Vec<String> {
    let src = root().join(src_dir);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_path_buf();
        if is_test_file(&rel) {
            continue;
        }
        let module = module_of(&rel);
        let Some(own) = layer_in(layers, &module) else {
            found.push(format!(
                "{src_dir}/{}: module `{module}` has no layer",
                rel.display()
            ));
            continue;
        };
        let code = production_code(&std::fs::read_to_string(&f).unwrap());
        for named in named_modules(&code) {
            let Some(theirs) = layer_in(layers, &named) else {
                continue;
            };
            if theirs > own {
                found.push(format!(
                    "{src_dir}/{}: `{module}` names `crate::{named}`, a higher layer",
                    rel.display()
                ));
            }
        }
    }
    found
}

#[test]
fn no_module_names_a_higher_layer_of_its_crate() {
    let found: Vec<String> = MODULE_LAYERS
        .iter()
        .flat_map(|(dir, layers)| violations(dir, layers))
        .collect();
    assert!(
        found.is_empty(),
        "upward references (docs/architecture.md, layers):\n{}",
        found.join("\n")
    );
}

/// Modules above `sys` that must reach the OS only through it: they read other processes,
/// the network or the kernel, never files of their own (outputs, recordings, the daemon and
/// the front end open their own files, through `safe_fs` or not). By crate folder.
const THROUGH_SYS_ONLY: &[(&str, &[&str])] = &[
    ("crates/collect/src", &["sources", "discover"]),
    ("crates/judge/src", &["correlate", "detect", "pipeline"]),
    ("src", &["policy", "sampler", "attach", "doctor"]),
];

/// What names direct OS access in code.
const OS_ACCESS: &[&str] = &[
    "std::fs",
    "fs::File",
    "File::open",
    "OpenOptions",
    "read_link",
    "read_dir",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "tokio::net",
    "socket::",
    "\"/proc",
    "\"/sys/",
];

#[test]
fn only_sys_reads_the_os() {
    let mut found = Vec::new();
    for (dir, modules) in THROUGH_SYS_ONLY {
        let src = root().join(dir);
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        for f in files {
            let rel = f.strip_prefix(&src).unwrap().to_path_buf();
            if is_test_file(&rel) || !modules.contains(&module_of(&rel).as_str()) {
                continue;
            }
            let code = production_code(&std::fs::read_to_string(&f).unwrap());
            for line in code.lines() {
                if let Some(token) = OS_ACCESS.iter().find(|t| line.contains(*t)) {
                    found.push(format!(
                        "{dir}/{}: `{token}` in: {}",
                        rel.display(),
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "OS access above sys (go through wedgewatch-sys):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scanner_reads_paths_groups_and_skips_tests_and_comments() {
    let code = production_code(
        "use crate::model::Topology;\n\
         use crate::{sys::ProcFs, clock,\n    detect::{a, b}};\n\
         let x = crate::sources::f(); // crate::tui in a comment\n\
         /// [`crate::report`] in a doc comment\n\
         let y = other_crate::daemon::g();\n\
         #[cfg(test)]\n\
         mod tests {\n    use crate::cli::x;\n    fn f() { crate::tui::y(); }\n}\n\
         #[cfg(test)]\n\
         use crate::attach;\n\
         fn after() { crate::discover::z() }\n",
    );
    let names: Vec<String> = named_modules(&code).into_iter().collect();
    assert_eq!(
        names,
        ["clock", "detect", "discover", "model", "sources", "sys"]
    );
    let judge = MODULE_LAYERS[3].1;
    assert!(layer_in(judge, "correlate") < layer_in(judge, "detect"));
    assert_eq!(layer_in(judge, "tui"), None);
}
