//! [`ProcFs`]: every read of `/proc`, or of a fixture tree standing in for it.
//!
//! One value with a configurable root, so a test can point every read at a tempdir. Files
//! are read with [`safe_fs::read_capped`] (never through a link at the last component, never
//! past a cap). Cmdline and environ block while the target holds its mmap lock: callers run
//! them under a deadline ([`crate::deadline`]).

use super::proc_net;
use crate::model::{SocketEntry, ThreadInfo};
use crate::safe_fs;
use nix::dir::Dir;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use procfs::process::{Stat, Status};
use procfs::FromRead;
use std::collections::BTreeMap;
use std::io;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

/// The kernel's procfs: the default root (`--proc-root`).
pub const PROC_ROOT: &str = "/proc";
/// Cap of `cmdline` and `environ` (the kernel allows a few MiB of arguments).
pub const MAX_ARGS_BYTES: usize = 4 << 20;
/// Cap of `stat`, `status`, `comm` (a few hundred bytes each).
pub const MAX_SMALL_FILE: usize = 64 << 10;
/// Most of `maps` searched (line by line, never held whole): a few MiB at the default
/// `vm.max_map_count`.
pub const MAX_MAPS_BYTES: u64 = 256 << 20;
/// Cap of one `net/tcp{,6}` table (about 150 bytes a socket: over 400k sockets).
pub const MAX_TCP_TABLE: usize = 64 << 20;
/// Buffer a seq file's read starts with (a thousand sockets of `net/tcp`).
const SEQ_READ_START: usize = 160 << 10;

/// Why a `/proc` read failed, worded for an operator (these texts end up in snapshots).
#[derive(Debug, thiserror::Error)]
pub enum ProcFsError {
    #[error("permission denied ({})", path.display())]
    PermissionDenied { path: PathBuf },
    #[error("vanished or absent ({})", path.display())]
    Vanished { path: PathBuf },
    #[error("{source} ({})", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("unexpected content in {}: {what}", path.display())]
    Malformed { path: PathBuf, what: String },
}

impl ProcFsError {
    /// Sorts an I/O error by what an operator can do about it.
    pub fn from_io(path: &Path, e: io::Error) -> Self {
        let path = path.to_path_buf();
        match e.kind() {
            io::ErrorKind::PermissionDenied => ProcFsError::PermissionDenied { path },
            io::ErrorKind::NotFound => ProcFsError::Vanished { path },
            _ => ProcFsError::Io { path, source: e },
        }
    }

    /// The process (or the file) is not there.
    pub fn is_vanished(&self) -> bool {
        matches!(self, ProcFsError::Vanished { .. })
    }
}

type Result<T> = std::result::Result<T, ProcFsError>;

/// The fds of one process that are sockets, from one scan of `fd/*`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FdScan {
    /// Fd links read (closed-meanwhile ones are not counted).
    pub fds_read: u64,
    /// `socket:[N]` inodes, in fd directory order (duplicates possible: dup'ed fds).
    pub socket_inodes: Vec<u64>,
}

/// One line of `/proc/PID/cgroup`: `hierarchy-id:controllers:path` (cgroup v2: `0::/path`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupEntry {
    pub hierarchy: u32,
    /// Empty for cgroup v2.
    pub controllers: Vec<String>,
    /// The cgroup's path (a container's id usually appears in it).
    pub path: String,
}

/// One pid directory of the root as a directory listing shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidEntry {
    pub pid: i32,
    /// The directory's inode number (`d_ino`).
    pub ino: u64,
}

/// A procfs tree: `/proc`, or a fixture tree with the same layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcFs {
    root: PathBuf,
}

impl Default for ProcFs {
    fn default() -> Self {
        ProcFs::real()
    }
}

impl ProcFs {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        ProcFs { root: root.into() }
    }

    /// The kernel's `/proc`.
    pub fn real() -> Self {
        ProcFs::new(PROC_ROOT)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether this is the kernel's procfs (its directory sizes mean fd counts; a fixture
    /// tree's do not).
    pub fn is_real(&self) -> bool {
        self.root == Path::new(PROC_ROOT)
    }

    /// `<root>/<pid>`.
    pub fn pid_dir(&self, pid: i32) -> PathBuf {
        self.root.join(pid.to_string())
    }

    /// `<root>/<pid>/<rel>`.
    pub fn path(&self, pid: i32, rel: &str) -> PathBuf {
        self.pid_dir(pid).join(rel)
    }

    fn read(&self, path: &Path, cap: usize) -> Result<Vec<u8>> {
        safe_fs::read_capped(path, cap)
            .map(|(bytes, _more)| bytes)
            .map_err(|e| ProcFsError::from_io(path, e))
    }

    fn read_text(&self, path: &Path, cap: usize) -> Result<String> {
        self.read(path, cap)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// The numeric entries of the root: a readdir only, it never blocks on a process.
    pub fn pids(&self) -> Result<Vec<i32>> {
        let rd = std::fs::read_dir(&self.root).map_err(|e| ProcFsError::from_io(&self.root, e))?;
        let mut pids: Vec<i32> = rd
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        pids.sort_unstable();
        Ok(pids)
    }

    /// The numeric entries of the root with their inode numbers (`d_ino`), sorted by pid, with
    /// no allocation per entry. An unchanged (pid, inode) is a cheap sign, not a proof, of the
    /// same process.
    pub fn pid_entries(&self) -> Result<Vec<PidEntry>> {
        let err = |e: nix::errno::Errno| ProcFsError::from_io(&self.root, e.into());
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut dir = Dir::open(&self.root, flags, Mode::empty()).map_err(err)?;
        let mut out = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(err)?;
            if let Some(pid) = pid_of_name(entry.file_name().to_bytes()) {
                out.push(PidEntry {
                    pid,
                    ino: entry.ino(),
                });
            }
        }
        out.sort_unstable_by_key(|e| e.pid);
        Ok(out)
    }

    /// Whether the root can be listed: opened as a directory, nothing read (a source's "is
    /// procfs there", which must not grow with the host's processes).
    pub fn readable(&self) -> Result<()> {
        std::fs::read_dir(&self.root)
            .map(|_| ())
            .map_err(|e| ProcFsError::from_io(&self.root, e))
    }

    /// Whether `pid`'s directory is there (Err says why not).
    pub fn exists(&self, pid: i32) -> Result<()> {
        let dir = self.pid_dir(pid);
        std::fs::symlink_metadata(&dir)
            .map(|_| ())
            .map_err(|e| ProcFsError::from_io(&dir, e))
    }

    /// Arguments (NUL-separated; empty ones dropped, as procfs does).
    pub fn cmdline(&self, pid: i32) -> Result<Vec<String>> {
        let text = self.read_text(&self.path(pid, "cmdline"), MAX_ARGS_BYTES)?;
        Ok(text
            .split('\0')
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect())
    }

    /// `cmdline` as the kernel gives it (NUL-separated), at most `cap` bytes: for a caller
    /// that must not copy an argument into other buffers (a secret it wipes after use).
    pub fn cmdline_bytes(&self, pid: i32, cap: usize) -> Result<Vec<u8>> {
        self.read(&self.path(pid, "cmdline"), cap.min(MAX_ARGS_BYTES))
    }

    /// `environ` as the kernel gives it (NUL-separated `K=V`), at most `cap` bytes: see
    /// [`ProcFs::cmdline_bytes`].
    pub fn environ_bytes(&self, pid: i32, cap: usize) -> Result<Vec<u8>> {
        self.read(&self.path(pid, "environ"), cap.min(MAX_ARGS_BYTES))
    }

    /// Environment (`K=V` entries; entries without `=` dropped).
    pub fn environ(&self, pid: i32) -> Result<BTreeMap<String, String>> {
        let bytes = self.read(&self.path(pid, "environ"), MAX_ARGS_BYTES)?;
        Ok(bytes
            .split(|b| *b == 0)
            .filter_map(|kv| {
                let eq = kv.iter().position(|b| *b == b'=')?;
                let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                Some((text(&kv[..eq]), text(&kv[eq + 1..])))
            })
            .collect())
    }

    /// A kernel seq file (`net/tcp`) read into a buffer allocated up front: each `read`
    /// restarts the kernel's walk of its table.
    fn read_seq_text(&self, path: &Path, cap: usize) -> Result<String> {
        use std::io::Read;
        let err = |e| ProcFsError::from_io(path, e);
        let file = safe_fs::open_no_follow(path).map_err(err)?;
        let mut bytes = Vec::with_capacity(SEQ_READ_START.min(cap + 1));
        file.take(cap as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(err)?;
        bytes.truncate(cap);
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// `comm` (what setproctitle also rewrites), without the newline.
    pub fn comm(&self, pid: i32) -> Result<String> {
        let text = self.read_text(&self.path(pid, "comm"), MAX_SMALL_FILE)?;
        Ok(text.trim_end_matches('\n').to_string())
    }

    /// `stat`, parsed by the procfs crate.
    pub fn stat(&self, pid: i32) -> Result<Stat> {
        self.parsed(&self.path(pid, "stat"))
    }

    /// `status`, parsed by the procfs crate.
    pub fn status(&self, pid: i32) -> Result<Status> {
        self.parsed(&self.path(pid, "status"))
    }

    fn parsed<T: FromRead>(&self, path: &Path) -> Result<T> {
        let bytes = self.read(path, MAX_SMALL_FILE)?;
        T::from_read(bytes.as_slice()).map_err(|e| ProcFsError::Malformed {
            path: path.to_path_buf(),
            what: e.to_string(),
        })
    }

    /// The cgroups `pid` belongs to (malformed lines skipped).
    pub fn cgroups(&self, pid: i32) -> Result<Vec<CgroupEntry>> {
        let text = self.read_text(&self.path(pid, "cgroup"), MAX_SMALL_FILE)?;
        Ok(text.lines().filter_map(parse_cgroup_line).collect())
    }

    /// The executable (`exe` link's target).
    pub fn exe(&self, pid: i32) -> Result<PathBuf> {
        let link = self.path(pid, "exe");
        std::fs::read_link(&link).map_err(|e| ProcFsError::from_io(&link, e))
    }

    /// Whether a line of `maps` mentions `needle` (`libpython`); Malformed when
    /// [`MAX_MAPS_BYTES`] pass without a match (a truncated search is not an absent library).
    /// Blocks on the target's mmap lock: run it under a deadline.
    pub fn maps_mention(&self, pid: i32, needle: &str) -> Result<bool> {
        let mut found = false;
        let capped = self.each_maps_line(pid, MAX_MAPS_BYTES, |line| {
            found = line.windows(needle.len()).any(|w| w == needle.as_bytes());
            if found {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })?;
        if capped && !found {
            return Err(ProcFsError::Malformed {
                path: self.path(pid, "maps"),
                what: format!("over {} MiB without {needle:?}", MAX_MAPS_BYTES >> 20),
            });
        }
        Ok(found)
    }

    /// Feeds `pid`'s `maps` to `each` line by line until `each` breaks or `cap` bytes were
    /// read; whether the cap ended it. Blocks on the target's mmap lock: run it under a deadline.
    pub(crate) fn each_maps_line(
        &self,
        pid: i32,
        cap: u64,
        mut each: impl FnMut(&[u8]) -> ControlFlow<()>,
    ) -> Result<bool> {
        use std::io::{BufRead, Read};
        let path = self.path(pid, "maps");
        let err = |e| ProcFsError::from_io(&path, e);
        let file = safe_fs::open_no_follow(&path).map_err(err)?;
        let mut reader = std::io::BufReader::new(file.take(cap));
        let mut line = Vec::new();
        let mut read: u64 = 0;
        loop {
            line.clear();
            let n = reader.read_until(b'\n', &mut line).map_err(err)?;
            if n == 0 {
                return Ok(read >= cap);
            }
            read += n as u64;
            if each(&line).is_break() {
                return Ok(false);
            }
        }
    }

    /// Owner uid of `pid`'s directory (the process's effective uid), followed if it is a
    /// link (a fixture tree may link to real processes).
    pub fn owner_uid(&self, pid: i32) -> Result<u32> {
        use std::os::unix::fs::MetadataExt;
        let dir = self.pid_dir(pid);
        std::fs::metadata(&dir)
            .map(|m| m.uid())
            .map_err(|e| ProcFsError::from_io(&dir, e))
    }

    /// Thread ids and names from `task/*/comm`, at most `max`, sorted by tid. A thread that
    /// exits between readdir and read keeps its tid with an empty name.
    pub fn threads(&self, pid: i32, max: usize) -> Result<Vec<ThreadInfo>> {
        let task = self.path(pid, "task");
        let rd = std::fs::read_dir(&task).map_err(|e| ProcFsError::from_io(&task, e))?;
        let mut out = Vec::new();
        for entry in rd.flatten() {
            let Some(tid) = entry.file_name().to_str().and_then(|s| s.parse().ok()) else {
                continue;
            };
            let name = self
                .read_text(&entry.path().join("comm"), MAX_SMALL_FILE)
                .map(|s| s.trim_end_matches('\n').to_string())
                .unwrap_or_default();
            out.push(ThreadInfo { tid, name });
            if out.len() >= max {
                break;
            }
        }
        out.sort_by_key(|t| t.tid);
        Ok(out)
    }

    /// Open fds: the kernel's `st_size` of `fd/` (Linux >= 6.2), else the entries counted.
    pub fn fd_count(&self, pid: i32) -> Result<u64> {
        if let Some(n) = self.fd_dir_size(pid).filter(|n| *n > 0) {
            return Ok(n);
        }
        let dir = self.path(pid, "fd");
        let rd = std::fs::read_dir(&dir).map_err(|e| ProcFsError::from_io(&dir, e))?;
        Ok(rd.count() as u64)
    }

    /// `st_size` of `fd/` on the kernel's procfs: the open fd count (Linux >= 6.2, else 0);
    /// None elsewhere or when unreadable. A cheap "did its fds change" signal.
    pub fn fd_dir_size(&self, pid: i32) -> Option<u64> {
        if !self.is_real() {
            return None;
        }
        std::fs::metadata(self.path(pid, "fd"))
            .ok()
            .map(|m| m.len())
    }

    /// Reads every fd link of `pid` (one readlinkat per fd, relative to the open fd directory)
    /// and keeps the `socket:[N]` inodes. The one fd -> socket scanner.
    pub fn socket_inodes(&self, pid: i32) -> Result<FdScan> {
        let path = self.path(pid, "fd");
        let dir = std::fs::File::open(&path).map_err(|e| ProcFsError::from_io(&path, e))?;
        let rd = std::fs::read_dir(&path).map_err(|e| ProcFsError::from_io(&path, e))?;
        let mut scan = FdScan::default();
        for entry in rd.flatten() {
            let Ok(target) = nix::fcntl::readlinkat(&dir, entry.file_name().as_os_str()) else {
                continue; // closed between readdir and readlink
            };
            scan.fds_read += 1;
            if let Some(ino) = socket_inode(target.as_encoded_bytes()) {
                scan.socket_inodes.push(ino);
            }
        }
        Ok(scan)
    }

    /// Inode of namespace `ns` (`net`, `pid`, ...) of `pid`, from its link `net:[N]`.
    pub fn ns_inode(&self, pid: i32, ns: &str) -> Result<u64> {
        self.ns_inode_at(&self.pid_dir(pid), ns)
    }

    /// Inode of our own namespace `ns` (`self/ns/<ns>`).
    pub fn own_ns_inode(&self, ns: &str) -> Result<u64> {
        self.ns_inode_at(&self.root.join("self"), ns)
    }

    fn ns_inode_at(&self, dir: &Path, ns: &str) -> Result<u64> {
        let link = dir.join("ns").join(ns);
        let target = std::fs::read_link(&link).map_err(|e| ProcFsError::from_io(&link, e))?;
        let text = target.to_string_lossy();
        text.split_once('[')
            .and_then(|(_, rest)| rest.strip_suffix(']'))
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| ProcFsError::Malformed {
                path: link.clone(),
                what: format!("unexpected link {text:?}"),
            })
    }

    /// The network namespace of `pid`, opened (for `setns`; the link must be followed).
    pub fn open_netns(&self, pid: i32) -> Result<std::fs::File> {
        let path = self.path(pid, "ns/net");
        std::fs::File::open(&path).map_err(|e| ProcFsError::from_io(&path, e))
    }

    /// Every TCP socket of the network namespace `pid` lives in, from `net/tcp` and
    /// `net/tcp6` (absent when IPv6 is off): no tcp_info, but no need to enter it.
    pub fn tcp_table(&self, pid: i32) -> Result<Vec<SocketEntry>> {
        self.tcp_table_at(&self.pid_dir(pid))
    }

    /// [`ProcFs::tcp_table`] of our own network namespace (`self/net/tcp{,6}`).
    pub fn own_tcp_table(&self) -> Result<Vec<SocketEntry>> {
        self.tcp_table_at(&self.root.join("self"))
    }

    fn tcp_table_at(&self, dir: &Path) -> Result<Vec<SocketEntry>> {
        let mut out = Vec::new();
        for (file, v6) in [("net/tcp", false), ("net/tcp6", true)] {
            let path = dir.join(file);
            let text = match self.read_seq_text(&path, MAX_TCP_TABLE) {
                Ok(t) => t,
                Err(e) if v6 && e.is_vanished() => continue,
                Err(e) => return Err(e),
            };
            out.extend(proc_net::parse_table(&text, v6));
        }
        Ok(out)
    }

    /// Our own `status` text (`self/status`: capabilities, for the doctor).
    pub fn own_status_text(&self) -> Result<String> {
        self.read_text(&self.root.join("self/status"), MAX_SMALL_FILE)
    }

    /// Yama's `ptrace_scope` (None: no Yama LSM, or unreadable).
    pub fn ptrace_scope(&self) -> Option<u8> {
        let path = self.root.join("sys/kernel/yama/ptrace_scope");
        self.read_text(&path, MAX_SMALL_FILE)
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Boot time (epoch ms) from `stat`'s `btime` line.
    pub fn boot_time_ms(&self) -> Option<i64> {
        let text = self
            .read_text(&self.root.join("stat"), MAX_SMALL_FILE)
            .ok()?;
        let secs: i64 = text
            .lines()
            .find_map(|l| l.strip_prefix("btime "))?
            .trim()
            .parse()
            .ok()?;
        Some(secs * 1000)
    }
}

fn parse_cgroup_line(line: &str) -> Option<CgroupEntry> {
    let (hierarchy, rest) = line.split_once(':')?;
    let (controllers, path) = rest.split_once(':')?;
    Some(CgroupEntry {
        hierarchy: hierarchy.parse().ok()?,
        controllers: controllers
            .split(',')
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect(),
        path: path.to_string(),
    })
}

/// A directory name that is a pid (decimal, positive, fits an i32), without allocating.
fn pid_of_name(name: &[u8]) -> Option<i32> {
    if name.is_empty() || name.len() > 10 || name[0] == b'0' {
        return None;
    }
    let n = name.iter().try_fold(0i64, |acc, &b| {
        let d = b.checked_sub(b'0').filter(|d| *d < 10)?;
        Some(acc * 10 + i64::from(d))
    })?;
    i32::try_from(n).ok()
}

/// `socket:[12345]` -> 12345.
fn socket_inode(link: &[u8]) -> Option<u64> {
    let digits = link.strip_prefix(b"socket:[")?.strip_suffix(b"]")?;
    std::str::from_utf8(digits).ok()?.parse().ok()
}

mod brief;
mod files;
pub use brief::{parse_brief, Comm, StatBrief, StatReader};
pub use files::{is_plain_absolute, MappedFiles, MAX_MAPPED_FILES};

#[cfg(test)]
mod tests;
