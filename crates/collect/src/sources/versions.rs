//! Installed versions of what a component runs, read from disk the way pip writes them:
//! `<site-packages>/<dist>-<version>.dist-info/METADATA` (`Version:`), never by importing
//! or running anything in (or as) the target. Also Python's version and the kernel's.
//!
//! Site-packages are found as the process sees its files (`/proc/PID/root`): its mapped
//! files' directories, `PYTHONPATH`, and the prefixes it runs from (`exe`, `argv[0]`,
//! `VIRTUAL_ENV`, `CONDA_PREFIX`). Every read is capped; `maps` takes the target's mmap lock,
//! so the whole read runs under a deadline.

use crate::sys::ProcFs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest a component's versions may take (a blocked `maps` read is abandoned).
pub const VERSIONS_DEADLINE: Duration = Duration::from_millis(500);
/// Site-packages directories looked at per process.
const MAX_SITES: usize = 16;
/// Entries listed per directory.
const MAX_ENTRIES: usize = 20_000;
/// Bytes of a METADATA file read (the `Version:` header is in its first lines).
const MAX_METADATA: usize = 16 << 10;

/// `name` as pip compares distribution names (PEP 503): lower case, runs of `-_.` as `_`.
pub fn normalize(name: &str) -> String {
    let mut o = String::with_capacity(name.len());
    for ch in name.chars() {
        if matches!(ch, '-' | '_' | '.') {
            if !o.ends_with('_') {
                o.push('_');
            }
        } else {
            o.push(ch.to_ascii_lowercase());
        }
    }
    o
}

/// The variables of a process's environment [`read`] looks at.
pub const ENV_VARS: [&str; 3] = ["VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONPATH"];

/// What [`read`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionsRead {
    pub versions: BTreeMap<String, String>,
    /// It finished within [`VERSIONS_DEADLINE`]: installed packages do not change while a
    /// process runs, so only an unfinished read is worth trying again.
    pub complete: bool,
    /// Why part of what could name versions was not read (a process mapping more files
    /// than are looked at): the read is as complete as it will ever be.
    pub cut: Option<String>,
}

/// The versions of `packages` (by their names as given), `python`, and `kernel`, as far as
/// they can be read within [`VERSIONS_DEADLINE`]. `env`: the process's environment (only
/// [`ENV_VARS`] are read).
pub fn read(
    proc: &ProcFs,
    pid: i32,
    argv: &[String],
    env: &BTreeMap<String, String>,
    packages: &[String],
) -> VersionsRead {
    let (proc2, argv, env, packages) =
        (proc.clone(), argv.to_vec(), env.clone(), packages.to_vec());
    let read = move || read_cut(&proc2, pid, &argv, &env, &packages);
    let done = crate::deadline::call(&proc.path(pid, "maps"), VERSIONS_DEADLINE, read);
    let complete = done.is_ok();
    let (mut versions, cut) = done.unwrap_or_default();
    if let Some(k) = proc.kernel_release() {
        versions.insert("kernel".into(), k);
    }
    VersionsRead {
        versions,
        complete,
        cut,
    }
}

/// [`read`] without the deadline (tests, and the body of the deadline call).
pub fn read_now(
    proc: &ProcFs,
    pid: i32,
    argv: &[String],
    env: &BTreeMap<String, String>,
    packages: &[String],
) -> BTreeMap<String, String> {
    read_cut(proc, pid, argv, env, packages).0
}

/// [`read_now`], and why part of `maps` was not read.
fn read_cut(
    proc: &ProcFs,
    pid: i32,
    argv: &[String],
    env: &BTreeMap<String, String>,
    packages: &[String],
) -> (BTreeMap<String, String>, Option<String>) {
    let mut out = BTreeMap::new();
    let maps = proc.mapped_files(pid).unwrap_or_default();
    let prefixes = prefixes(proc, pid, argv, env);
    let sites = site_dirs(proc, pid, &prefixes, env, &maps.files);
    let wanted: BTreeMap<String, &String> = packages.iter().map(|p| (normalize(p), p)).collect();
    for site in &sites {
        for (norm, version) in dists_in(proc, pid, site, &wanted) {
            if let Some(name) = wanted.get(&norm) {
                out.entry((*name).clone()).or_insert(version);
            }
        }
    }
    if let Some(py) = python_version(proc, pid, &prefixes, &sites, argv, &maps.files) {
        out.insert("python".into(), py);
    }
    (out, maps.cut)
}

/// Installation prefixes (`/opt/venv`, `/usr`): the parents of `bin/` of the interpreter.
fn prefixes(
    proc: &ProcFs,
    pid: i32,
    argv: &[String],
    env: &BTreeMap<String, String>,
) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut add = |p: PathBuf| push_path(&mut out, p, usize::MAX);
    // argv[0] first: a venv's bin/python is a link to the system one, which `exe` names
    let interpreters = argv
        .first()
        .map(PathBuf::from)
        .into_iter()
        .chain(proc.exe(pid).ok());
    for exe in interpreters {
        if let Some(prefix) = exe
            .parent()
            .filter(|b| b.ends_with("bin"))
            .and_then(Path::parent)
        {
            add(prefix.to_path_buf());
        }
    }
    for key in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = env.get(key) {
            add(PathBuf::from(v));
        }
    }
    out
}

/// Adds `p` once, and only a plain absolute path (no `..` or `.`: it is read inside the target's
/// root), while `out` holds fewer than `cap`.
fn push_path(out: &mut Vec<PathBuf>, p: PathBuf, cap: usize) {
    if crate::sys::proc_fs::is_plain_absolute(&p) && !out.contains(&p) && out.len() < cap {
        out.push(p);
    }
}

/// The site-packages directory a mapped file or path lies in, if any.
fn site_of(path: &str) -> Option<PathBuf> {
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = path.find(marker) {
            return Some(PathBuf::from(&path[..i + marker.len() - 1]));
        }
    }
    None
}

fn site_dirs(
    proc: &ProcFs,
    pid: i32,
    prefixes: &[PathBuf],
    env: &BTreeMap<String, String>,
    mapped: &[String],
) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut add = |p: PathBuf| push_path(&mut out, p, MAX_SITES);
    for p in env.get("PYTHONPATH").into_iter().flat_map(|v| v.split(':')) {
        if !p.is_empty() {
            add(PathBuf::from(p));
        }
    }
    for prefix in prefixes {
        for lib in ["lib", "lib64"] {
            let dir = prefix.join(lib);
            let names = proc
                .list_in_root(pid, &dir, MAX_ENTRIES)
                .unwrap_or_default();
            for n in names.iter().filter(|n| n.starts_with("python3")) {
                add(dir.join(n).join("site-packages"));
                add(dir.join(n).join("dist-packages"));
            }
        }
    }
    for f in mapped {
        if let Some(site) = site_of(f) {
            add(site);
        }
    }
    out
}

/// `(normalized name, version)` of the wanted distributions installed in `site`.
fn dists_in(
    proc: &ProcFs,
    pid: i32,
    site: &Path,
    wanted: &BTreeMap<String, &String>,
) -> Vec<(String, String)> {
    let names = proc
        .list_in_root(pid, site, MAX_ENTRIES)
        .unwrap_or_default();
    let mut out = Vec::new();
    for n in names {
        let (stem, meta) = if let Some(s) = n.strip_suffix(".dist-info") {
            (s, "METADATA")
        } else if let Some(s) = n.strip_suffix(".egg-info") {
            (s, "PKG-INFO")
        } else {
            continue;
        };
        // `<name>-<version>`: the name's own dashes were written as underscores
        let (name, dir_version) = match stem.split_once('-') {
            Some((a, b)) => (a, Some(b)),
            None => (stem, None),
        };
        let norm = normalize(name);
        if !wanted.contains_key(&norm) {
            continue;
        }
        let from_file = proc
            .read_in_root(pid, &site.join(&n).join(meta), MAX_METADATA)
            .ok()
            .and_then(|t| header(&t, "Version"));
        if let Some(v) = from_file.or(dir_version.map(str::to_string)) {
            out.push((norm, v));
        }
    }
    out
}

/// The value of an email-style header (`Version: 0.5.4`) in the header block.
fn header(text: &str, key: &str) -> Option<String> {
    text.lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim().eq_ignore_ascii_case(key)).then(|| v.trim().to_string())
        })
        .filter(|v| !v.is_empty() && v.len() <= 64)
}

/// Python's version: a venv's `pyvenv.cfg`, else the `python3.N` in a site-packages path, the
/// interpreter's name or a file it mapped.
fn python_version(
    proc: &ProcFs,
    pid: i32,
    prefixes: &[PathBuf],
    sites: &[PathBuf],
    argv: &[String],
    mapped: &[String],
) -> Option<String> {
    for p in prefixes {
        if let Ok(cfg) = proc.read_in_root(pid, &p.join("pyvenv.cfg"), 4096) {
            for l in cfg.lines() {
                if let Some((k, v)) = l.split_once('=') {
                    if matches!(k.trim(), "version" | "version_info") {
                        return Some(v.trim().to_string());
                    }
                }
            }
        }
    }
    let named = sites
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .chain(argv.first().cloned())
        .chain(proc.exe(pid).ok().map(|e| e.to_string_lossy().into_owned()));
    let found = named.filter_map(|p| minor_in(&p)).next();
    found.or_else(|| mapped.iter().find_map(|p| minor_in(p)))
}

/// `3.11` from a path naming `python3.11` (a directory, `python3.11`, `libpython3.11.so`).
fn minor_in(path: &str) -> Option<String> {
    let i = path.rfind("python3.")?;
    let v: String = path[i + "python".len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let v = v.trim_end_matches('.');
    (v.len() > 2).then(|| v.to_string())
}

#[cfg(test)]
mod tests;
