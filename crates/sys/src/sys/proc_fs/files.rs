//! Files as a process sees them: `<root>/<pid>/root/<path>` (a containerised engine's
//! site-packages, not ours), the files it has mapped (`maps`), and the kernel release. Paths
//! are resolved with the process's root as `/` (`openat2` with `RESOLVE_IN_ROOT`), so a link
//! or `..` never names our files; without `openat2` nothing is read (docs/security.md).

use super::{ProcFs, ProcFsError, Result};
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;
use std::ops::ControlFlow;
use std::os::fd::OwnedFd;
use std::path::{Component, Path};

/// Cap of `maps` read (a process with thousands of mappings has a few hundred KiB).
const MAX_MAPS: u64 = 8 << 20;
/// Distinct mapped files kept: a process's site-packages show among its first few hundred;
/// one mapping 64k files is not hashed whole on every read.
pub const MAX_MAPPED_FILES: usize = 4096;

/// The distinct files a process has mapped, as far as they were read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MappedFiles {
    /// In order of first mapping.
    pub files: Vec<String>,
    /// Why the rest of `maps` was not read (over [`MAX_MAPPED_FILES`] files or `MAX_MAPS`
    /// bytes): what is listed is all there will be.
    pub cut: Option<String>,
}

/// Whether `p` is absolute with no `..` or `.`: the only paths taken from a process's
/// environment or mappings (its environment is whatever its starter wrote).
pub fn is_plain_absolute(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

/// Opens `rel` below `root` resolved with `root` as `/` (no magic links either).
fn open_beneath(root: &Path, rel: &Path, flags: OFlag) -> std::io::Result<OwnedFd> {
    let dir = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    Ok(openat2(&dir, rel, how)?)
}

impl ProcFs {
    /// Opens `abs` as `pid` sees it (see the module documentation).
    fn open_in_root(&self, pid: i32, abs: &Path, flags: OFlag) -> Result<OwnedFd> {
        let rel = is_plain_absolute(abs)
            .then(|| abs.strip_prefix("/").ok())
            .flatten()
            .ok_or_else(|| ProcFsError::Malformed {
                path: abs.to_path_buf(),
                what: "not a plain absolute path".into(),
            })?;
        let root = self.path(pid, "root");
        open_beneath(&root, rel, flags).map_err(|e| ProcFsError::from_io(&root.join(rel), e))
    }

    /// At most `cap` bytes of the regular file `abs` as `pid` sees it (never through a link
    /// at the last component; a FIFO is refused, not waited on).
    pub fn read_in_root(&self, pid: i32, abs: &Path, cap: usize) -> Result<String> {
        use std::io::Read;
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK;
        let file = std::fs::File::from(self.open_in_root(pid, abs, flags)?);
        let err = |e| ProcFsError::from_io(abs, e);
        if !file.metadata().map_err(err)?.is_file() {
            return Err(ProcFsError::Malformed {
                path: abs.to_path_buf(),
                what: "not a regular file".into(),
            });
        }
        let mut bytes = Vec::new();
        file.take(cap as u64).read_to_end(&mut bytes).map_err(err)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The names in directory `abs` as `pid` sees it, at most `max`, sorted.
    pub fn list_in_root(&self, pid: i32, abs: &Path, max: usize) -> Result<Vec<String>> {
        let fd = self.open_in_root(pid, abs, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
        let err = |e: nix::errno::Errno| ProcFsError::from_io(abs, e.into());
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(err)?;
        let mut names: Vec<String> = dir
            .iter()
            .filter_map(|e| e.ok()?.file_name().to_str().ok().map(str::to_string))
            .filter(|n| n != "." && n != "..")
            .take(max)
            .collect();
        names.sort();
        Ok(names)
    }

    /// The distinct files `pid` has mapped (`maps`' path column), in order of first mapping,
    /// no further than [`MAX_MAPPED_FILES`] files or `MAX_MAPS` bytes. Takes the process's
    /// mmap lock: callers run it under a deadline.
    pub fn mapped_files(&self, pid: i32) -> Result<MappedFiles> {
        let (mut out, mut seen) = (MappedFiles::default(), std::collections::HashSet::new());
        let capped = self.each_maps_line(pid, MAX_MAPS, |line| {
            let text = String::from_utf8_lossy(line);
            // address perms offset dev inode path (the path may hold spaces)
            let Some(file) = text.trim_end().splitn(6, ' ').nth(5).map(str::trim_start) else {
                return ControlFlow::Continue(());
            };
            if !file.starts_with('/') || seen.contains(file) {
                return ControlFlow::Continue(());
            }
            if out.files.len() == MAX_MAPPED_FILES {
                out.cut = Some(format!(
                    "over {MAX_MAPPED_FILES} mapped files: the rest not read"
                ));
                return ControlFlow::Break(());
            }
            seen.insert(file.to_string());
            out.files.push(file.to_string());
            ControlFlow::Continue(())
        })?;
        if capped {
            out.cut = Some(format!(
                "maps over {} MiB: the rest not read",
                MAX_MAPS >> 20
            ));
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
