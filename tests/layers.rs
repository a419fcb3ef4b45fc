//! The layering of `src/` (docs/architecture.md, issue 12): every module names only modules
//! of its own layer or of a lower one. The test reads the sources (no build of the graph:
//! `use crate::X`, `crate::X::` paths and `crate::{X, Y}` groups), skipping comments and
//! `#[cfg(test)]` items, and fails naming each upward reference.
//!
//! A new top-level module must be placed in [`LAYERS`]; the test fails until it is.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules of `src/` and their layer, bottom first. A module may name modules of
/// its own layer and of any lower layer.
const LAYERS: &[(&str, &[&str])] = &[
    // Leaf utilities that name no other module of the crate but its error type. `config`
    // (thresholds, range checks) is read by the model itself.
    ("base", &["clock", "error", "safe_fs", "deadline", "config"]),
    ("model", &["model"]),
    // Pure helpers over the model (a parser, redaction, the redacting log writer), usable by
    // every layer above.
    ("model-helpers", &["redact", "prom", "logging"]),
    // `crate::http` is `sys::http` at its old path; `children` (what we spawn, and its
    // descendants) reads `/proc` through `sys`.
    ("sys", &["sys", "http", "children"]),
    ("sources", &["sources"]),
    // Probe tables: stack rules and metric maps of `sources`, profiles of `discover`.
    ("probes", &["probes"]),
    ("discover", &["discover"]),
    ("correlate", &["correlate"]),
    ("detect", &["detect"]),
    (
        "outputs",
        &[
            "snapshot", "report", "diff", "export", "record", "pipeline", "merge",
        ],
    ),
    (
        "runtime",
        &["daemon", "attach", "sampler", "doctor", "fleet"],
    ),
    ("front", &["cli", "tui", "main", "lib", "fuzz_entry"]),
];

/// Upward references not fixed yet: (file under `src/`, the module it names). Each entry
/// says why it is still there. Keep this list tiny.
const ALLOWED: &[(&str, &str)] = &[];

/// The layer index of a top-level module (`runtime` in `crate::runtime()` is a fn of
/// `lib.rs`, hence `front`).
fn layer_of(module: &str) -> Option<usize> {
    if module == "runtime" {
        return layer_of("lib");
    }
    LAYERS.iter().position(|(_, mods)| mods.contains(&module))
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

/// Every `(file, named module, why)` that breaks the layering.
fn violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut found = Vec::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap().to_path_buf();
        if is_test_file(&rel) {
            continue;
        }
        let module = module_of(&rel);
        // `main.rs` and `cli/` are the binary crate: their `crate::` is `main.rs`, and they
        // name the library as `wedgewatch::`, from the top layer.
        if module == "main" || module == "cli" {
            continue;
        }
        let Some(own) = layer_of(&module) else {
            found.push(format!(
                "{}: module `{module}` has no layer in tests/layers.rs",
                rel.display()
            ));
            continue;
        };
        let code = production_code(&std::fs::read_to_string(&f).unwrap());
        for named in named_modules(&code) {
            // `crate::Error`, `crate::Result`: lib.rs re-exports of `error`.
            if named.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
                continue;
            }
            let Some(theirs) = layer_of(&named) else {
                found.push(format!(
                    "{}: names `crate::{named}`, which has no layer in tests/layers.rs",
                    rel.display()
                ));
                continue;
            };
            let rel_s = rel.to_string_lossy().to_string();
            if theirs > own && !ALLOWED.contains(&(rel_s.as_str(), named.as_str())) {
                found.push(format!(
                    "{rel_s}: `{module}` ({}) names `crate::{named}` ({})",
                    LAYERS[own].0, LAYERS[theirs].0
                ));
            }
        }
    }
    found
}

#[test]
fn no_module_names_a_higher_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = violations(&src);
    assert!(
        found.is_empty(),
        "upward references (docs/architecture.md, layers):\n{}",
        found.join("\n")
    );
}

/// Modules above `sys` that must reach the OS only through it: they read other processes,
/// the network or the kernel, never files of their own. (Outputs, recordings, the daemon,
/// probes and the front end open their own files and sockets, through `safe_fs` or not.)
const THROUGH_SYS_ONLY: &[&str] = &[
    "sources",
    "discover",
    "correlate",
    "detect",
    "pipeline",
    "sampler",
    "attach",
    "doctor",
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
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().to_path_buf();
        if is_test_file(&rel) || !THROUGH_SYS_ONLY.contains(&module_of(&rel).as_str()) {
            continue;
        }
        let code = production_code(&std::fs::read_to_string(&f).unwrap());
        for line in code.lines() {
            if let Some(token) = OS_ACCESS.iter().find(|t| line.contains(*t)) {
                found.push(format!("{}: `{token}` in: {}", rel.display(), line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "OS access above sys (go through crate::sys):\n{}",
        found.join("\n")
    );
}

#[test]
fn allow_list_entries_are_still_needed() {
    // An entry whose reference is gone must be removed, so the list only shrinks.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for (file, named) in ALLOWED {
        let code = production_code(&std::fs::read_to_string(src.join(file)).unwrap());
        assert!(
            named_modules(&code).contains(*named),
            "{file} no longer names crate::{named}: remove it from ALLOWED"
        );
    }
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
    assert!(layer_of("model") < layer_of("sys"));
    assert!(layer_of("detect") < layer_of("record"));
    assert!(layer_of("attach") < layer_of("tui"));
}
