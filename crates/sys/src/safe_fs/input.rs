//! Opening a file handed to us to read (a snapshot, a bundle's `snapshot.json`, a recording's
//! segments): a regular file only, never through a link at its last component nor through
//! a link another user owns on the way ([`super::walk`]). A FIFO, socket or device is refused
//! without blocking on it (the open is non-blocking), so a planted `snapshot.json` FIFO
//! cannot hang a verb, and a planted link to `/etc/shadow` is not read as root.

use super::walk::open_parent;
use super::UnsafePath;
use nix::fcntl::{fcntl, openat, FcntlArg, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};
use std::fs::File;
use std::path::Path;

/// Opens `path` for reading when it is a regular file reached as described above.
pub fn open_input(path: &Path) -> Result<File, UnsafePath> {
    let (dir, name) = open_parent(path)?;
    let io = |e: nix::errno::Errno| UnsafePath::Io {
        path: path.to_path_buf(),
        source: std::io::Error::from(e),
    };
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
    let fd = openat(&dir, name.as_os_str(), flags, Mode::empty()).map_err(|e| match e {
        nix::errno::Errno::ELOOP => UnsafePath::Symlink {
            path: path.to_path_buf(),
        },
        e => io(e),
    })?;
    let st = fstat(&fd).map_err(io)?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(UnsafePath::WrongType {
            path: path.to_path_buf(),
            expected: "regular file",
        });
    }
    fcntl(&fd, FcntlArg::F_SETFL(OFlag::O_RDONLY)).map_err(io)?;
    Ok(File::from(fd))
}

/// Whether `path` is a directory reached as [`super::walk::open_trusted_dir`] allows (a
/// bundle given as its directory).
pub fn is_input_dir(path: &Path) -> bool {
    super::walk::open_trusted_dir(path).is_ok()
}

/// At most `cap` bytes of the input file `path`, and whether it held more.
pub fn read_input_capped(path: &Path, cap: u64) -> Result<(Vec<u8>, bool), UnsafePath> {
    use std::io::Read;
    let file = open_input(path)?;
    let mut bytes = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| UnsafePath::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let more = bytes.len() as u64 > cap;
    bytes.truncate(cap as usize);
    Ok((bytes, more))
}
