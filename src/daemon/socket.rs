//! The daemon's Unix socket and who may use it. Both ends check the other's credentials
//! (`SO_PEERCRED`): the daemon serves only its own uid and root, and a client trusts only a
//! daemon running as itself or root, so a socket planted by another user is never believed.
//! The daemon removes its socket on exit only if the path still names the socket it bound.

use crate::error::{Error, Result};
use crate::safe_fs::{self, my_uid, trusted_uid};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tokio::net::{UnixListener, UnixStream};

/// The socket this daemon bound, identified by device and inode.
#[derive(Debug)]
pub struct BoundSocket {
    pub path: PathBuf,
    dev: u64,
    ino: u64,
}

impl BoundSocket {
    /// Removes the socket file if it is still ours; one that another daemon bound since (after
    /// ours was deleted) is left alone.
    pub fn remove_if_ours(&self) {
        let still_ours = std::fs::symlink_metadata(&self.path)
            .is_ok_and(|md| md.dev() == self.dev && md.ino() == self.ino);
        if still_ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds the socket owner-only: in a verified 0700 directory, the socket itself 0600. A stale
/// socket (nobody listening) is replaced; a live one is an error, and anything that is not a
/// socket is never removed.
pub async fn bind_private(path: &Path) -> Result<(UnixListener, BoundSocket)> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::Other(format!("{}: not a socket file name", path.display())))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let path = safe_fs::private_dir(parent)?.join(name);
    if let Ok(md) = std::fs::symlink_metadata(&path) {
        if !md.file_type().is_socket() {
            return Err(Error::Other(format!(
                "{}: exists and is not a socket; wedgewatch will not replace it",
                path.display()
            )));
        }
        if UnixStream::connect(&path).await.is_ok() {
            return Err(Error::Other(format!(
                "{}: another wedgewatch daemon is already listening here",
                path.display()
            )));
        }
        std::fs::remove_file(&path).map_err(|e| Error::io(&path, e))?;
    }
    let listener = UnixListener::bind(&path).map_err(|e| Error::io(&path, e))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(&path, e))?;
    let md = std::fs::symlink_metadata(&path).map_err(|e| Error::io(&path, e))?;
    let bound = BoundSocket {
        dev: md.dev(),
        ino: md.ino(),
        path,
    };
    Ok((listener, bound))
}

/// The daemon side: whether this client may be served, and if not, the error to send it.
pub fn refuse_client(stream: &UnixStream) -> Option<String> {
    match stream.peer_cred() {
        Ok(c) if trusted_uid(c.uid()) => None,
        Ok(c) => Some(format!(
            "uid {} may not use this daemon: it serves uid {} and root only",
            c.uid(),
            my_uid()
        )),
        Err(e) => Some(format!("cannot tell who is asking ({e})")),
    }
}

/// The client side: refuses a daemon that runs as neither us nor root.
pub fn check_daemon(stream: &UnixStream, path: &Path) -> Result<()> {
    let cred = stream.peer_cred().map_err(|e| Error::io(path, e))?;
    if trusted_uid(cred.uid()) {
        return Ok(());
    }
    Err(Error::Other(format!(
        "{}: the daemon there runs as uid {}, not as you (uid {}) or root; not trusting it",
        path.display(),
        cred.uid(),
        my_uid()
    )))
}
