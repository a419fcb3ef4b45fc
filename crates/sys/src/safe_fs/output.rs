//! Writing a file at a user-given path (`report -o`, `export --perfetto`) as root on a shared
//! host: never through a link (at the last component, or one another user owns on the way:
//! [`super::walk`]), and never over a file we did not create. A new path is created
//! exclusively; an existing regular file of ours is replaced atomically (a new file beside
//! it, renamed over it: a rename replaces the name, it never writes through it).

use super::walk::open_parent;
use super::{my_uid, UnsafePath};
use nix::errno::Errno;
use nix::fcntl::{openat, renameat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, FileStat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::Path;

fn create_new(dir: &OwnedFd, name: &OsStr, mode: u32) -> nix::Result<File> {
    let flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    openat(dir, name, flags, Mode::from_bits_truncate(mode)).map(File::from)
}

/// An existing output is ours to replace or extend only as a regular file the caller owns.
fn regular_and_ours(st: &FileStat, path: &Path) -> Result<(), UnsafePath> {
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(UnsafePath::WrongType {
            path: path.to_path_buf(),
            expected: "regular file",
        });
    }
    if st.st_uid != my_uid() {
        return Err(UnsafePath::NotOurs {
            path: path.to_path_buf(),
            uid: st.st_uid,
            me: my_uid(),
        });
    }
    Ok(())
}

fn write_all(mut f: File, bytes: &[u8]) -> std::io::Result<()> {
    f.write_all(bytes)?;
    f.sync_all()
}

/// Writes `bytes` to `path` (0600), creating it or replacing a regular file of ours.
pub fn write_output(path: &Path, bytes: &[u8]) -> Result<(), UnsafePath> {
    write_output_mode(path, bytes, 0o600)
}

/// [`write_output`] of a file meant for everyone to read (a man page: 0644).
pub fn write_public_output(path: &Path, bytes: &[u8]) -> Result<(), UnsafePath> {
    write_output_mode(path, bytes, 0o644)
}

fn write_output_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), UnsafePath> {
    let (dir, name) = open_parent(path)?;
    let io = |source: std::io::Error| UnsafePath::Io {
        path: path.to_path_buf(),
        source,
    };
    let existing = match fstatat(&dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Some(st),
        Err(Errno::ENOENT) => None,
        Err(e) => return Err(io(e.into())),
    };
    let Some(st) = existing else {
        // EEXIST here: something appeared since; refused like anything already there
        let f = create_new(&dir, &name, mode).map_err(|e| io(e.into()))?;
        return write_all(f, bytes).map_err(io);
    };
    let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if kind == SFlag::S_IFLNK {
        return Err(UnsafePath::Symlink {
            path: path.to_path_buf(),
        });
    }
    regular_and_ours(&st, path)?;
    replace(&dir, &name, bytes, mode).map_err(io)
}

/// A new file beside `name`, written whole, then renamed over it.
fn replace(dir: &OwnedFd, name: &OsStr, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".wedgewatch-{}-{stamp}", std::process::id()));
    let f = create_new(dir, &tmp, mode)?;
    let done = write_all(f, bytes).and_then(|()| Ok(renameat(dir, tmp.as_os_str(), dir, name)?));
    if done.is_err() {
        // created exclusively above: ours to remove
        let _ = unlinkat(dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
    }
    done
}

/// Opens `path` to append to (`record -o FILE`), creating it 0600: reached like
/// [`write_output`]'s path, never through a link at the file, never another user's file, and
/// only a regular file (a FIFO is refused, not waited on).
pub fn open_append_output(path: &Path) -> Result<File, UnsafePath> {
    let (dir, name) = open_parent(path)?;
    let io = |e: Errno| UnsafePath::Io {
        path: path.to_path_buf(),
        source: e.into(),
    };
    let flags = OFlag::O_WRONLY
        | OFlag::O_APPEND
        | OFlag::O_CREAT
        | OFlag::O_NOFOLLOW
        | OFlag::O_NONBLOCK
        | OFlag::O_CLOEXEC;
    let mode = Mode::from_bits_truncate(0o600);
    let fd = openat(&dir, name.as_os_str(), flags, mode).map_err(|e| match e {
        Errno::ELOOP => UnsafePath::Symlink {
            path: path.to_path_buf(),
        },
        e => io(e),
    })?;
    let st = nix::sys::stat::fstat(&fd).map_err(io)?;
    regular_and_ours(&st, path)?;
    let append = OFlag::O_WRONLY | OFlag::O_APPEND;
    nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(append)).map_err(io)?;
    Ok(File::from(fd))
}
