//! Files as a process sees them: `<root>/<pid>/root/<path>` (its own mount namespace, so a
//! containerised engine's site-packages are read, not ours), the files it has mapped
//! (`maps`), and the kernel release. Used to read installed package versions from disk
//! (`sources::versions`) without running anything in the target.

use super::{ProcFs, ProcFsError, Result};
use std::path::{Component, Path, PathBuf};

/// Cap of `maps` (a process with thousands of mappings has a few hundred KiB).
const MAX_MAPS: usize = 8 << 20;

/// Whether `p` is absolute with no `..` or `.`: the only paths taken from a process's
/// environment or mappings (its environment is whatever its starter wrote).
pub fn is_plain_absolute(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

impl ProcFs {
    /// `<root>/<pid>/root/<abs>`; None for a path that is not plain and absolute.
    pub fn in_root(&self, pid: i32, abs: &Path) -> Option<PathBuf> {
        if !is_plain_absolute(abs) {
            return None;
        }
        let rel = abs.strip_prefix("/").ok()?;
        Some(self.path(pid, "root").join(rel))
    }

    /// At most `cap` bytes of `abs` as `pid` sees it (never through a link at the last
    /// component).
    pub fn read_in_root(&self, pid: i32, abs: &Path, cap: usize) -> Result<String> {
        let path = self
            .in_root(pid, abs)
            .ok_or_else(|| ProcFsError::Malformed {
                path: abs.to_path_buf(),
                what: "not a plain absolute path".into(),
            })?;
        self.read_text(&path, cap)
    }

    /// The names in directory `abs` as `pid` sees it, at most `max`, sorted.
    pub fn list_in_root(&self, pid: i32, abs: &Path, max: usize) -> Result<Vec<String>> {
        let path = self
            .in_root(pid, abs)
            .ok_or_else(|| ProcFsError::Malformed {
                path: abs.to_path_buf(),
                what: "not a plain absolute path".into(),
            })?;
        let rd = std::fs::read_dir(&path).map_err(|e| ProcFsError::from_io(&path, e))?;
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .take(max)
            .collect();
        names.sort();
        Ok(names)
    }

    /// The distinct files `pid` has mapped (`maps`' path column), in order of first mapping.
    /// Reading `maps` takes the process's mmap lock: callers run it under a deadline.
    pub fn mapped_files(&self, pid: i32) -> Result<Vec<String>> {
        let text = self.read_text(&self.path(pid, "maps"), MAX_MAPS)?;
        let mut out: Vec<String> = Vec::new();
        for line in text.lines() {
            // address perms offset dev inode path (the path may hold spaces)
            let Some(path) = line.splitn(6, ' ').nth(5).map(str::trim_start) else {
                continue;
            };
            if path.starts_with('/') && !out.iter().any(|p| p == path) {
                out.push(path.to_string());
            }
        }
        Ok(out)
    }

    /// The running kernel's release (`<root>/sys/kernel/osrelease`).
    pub fn kernel_release(&self) -> Option<String> {
        let text = self
            .read_text(&self.root.join("sys/kernel/osrelease"), 256)
            .ok()?;
        Some(text.trim().to_string()).filter(|s| !s.is_empty())
    }
}
