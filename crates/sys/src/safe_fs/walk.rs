//! Reaching a directory named by a user-given path without letting another user redirect
//! it: the path is resolved one component at a time, and a symbolic link on the way is
//! followed only when it is owned by us or root. A link another user planted in a shared
//! directory (`/tmp/reports -> /etc/cron.d`) is refused, whatever the kernel's
//! `fs.protected_symlinks` says, and the directory found is the one checked: the caller
//! works relative to the returned descriptor, so nothing is resolved twice.

use super::{trusted_uid, UnsafePath};
use nix::fcntl::{openat, readlinkat, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, Mode, SFlag};
use std::collections::VecDeque;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Component, Path};

/// Links followed in one resolution, like the kernel's limit.
const MAX_LINKS: usize = 40;

fn errno(path: &Path) -> impl Fn(nix::errno::Errno) -> UnsafePath + '_ {
    move |e| UnsafePath::Io {
        path: path.to_path_buf(),
        source: std::io::Error::from(e),
    }
}

/// The names to walk in `p` (`..` kept: it is never a link).
fn names(p: &Path) -> impl Iterator<Item = OsString> + '_ {
    p.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n.to_os_string()),
        Component::ParentDir => Some("..".into()),
        Component::RootDir | Component::CurDir | Component::Prefix(_) => None,
    })
}

fn open_path(dir: impl std::os::fd::AsFd, name: &std::ffi::OsStr) -> nix::Result<OwnedFd> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    openat(dir, name, flags, Mode::empty())
}

/// Opens directory `dir` (an `O_PATH` descriptor, for `*at` calls), following only links
/// owned by us or root; `""` is the working directory.
pub fn open_trusted_dir(dir: &Path) -> Result<OwnedFd, UnsafePath> {
    let err = errno(dir);
    let start = if dir.is_absolute() { "/" } else { "." };
    let mut cur = open_path(AT_FDCWD, start.as_ref()).map_err(&err)?;
    let mut todo: VecDeque<OsString> = names(dir).collect();
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        let next = open_path(&cur, &name).map_err(&err)?;
        let st = fstat(&next).map_err(&err)?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFDIR {
            cur = next;
            continue;
        }
        if kind != SFlag::S_IFLNK {
            return Err(UnsafePath::WrongType {
                path: dir.to_path_buf(),
                expected: "directory",
            });
        }
        if !trusted_uid(st.st_uid) {
            return Err(UnsafePath::ForeignLink {
                path: dir.to_path_buf(),
                link: name.into(),
                uid: st.st_uid,
            });
        }
        links += 1;
        if links > MAX_LINKS {
            return Err(err(nix::errno::Errno::ELOOP));
        }
        let target = readlinkat(&next, "").map_err(&err)?;
        let target = Path::new(&target);
        if target.is_absolute() {
            cur = open_path(AT_FDCWD, "/".as_ref()).map_err(&err)?;
        }
        for n in names(target).collect::<Vec<_>>().into_iter().rev() {
            todo.push_front(n);
        }
    }
    Ok(cur)
}

/// The directory a file path is in, opened by [`open_trusted_dir`], and the file's name.
pub fn open_parent(path: &Path) -> Result<(OwnedFd, OsString), UnsafePath> {
    let name = match path.components().next_back() {
        Some(Component::Normal(n)) => n.to_os_string(),
        _ => {
            return Err(UnsafePath::WrongType {
                path: path.to_path_buf(),
                expected: "file name",
            })
        }
    };
    let parent = path.parent().unwrap_or(Path::new(""));
    Ok((open_trusted_dir(parent)?, name))
}
