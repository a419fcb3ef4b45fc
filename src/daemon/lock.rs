//! One daemon per state directory: an `flock`ed `daemon.lock` held for the daemon's life.
//! The kernel drops the lock when the process dies, so a crash never leaves it stale, and a
//! deleted socket cannot let a second daemon share the directory.

use crate::error::{Error, Result};
use crate::safe_fs;
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;

pub const LOCK_FILE: &str = "daemon.lock";

/// Held while the daemon runs; dropping it releases the lock (the file stays: removing a
/// lock file races with the next daemon taking it).
#[derive(Debug)]
pub struct StateLock {
    _file: Flock<File>,
}

/// Takes the lock of a verified state directory, or says which daemon holds it.
pub fn lock_state_dir(state_dir: &Path) -> Result<StateLock> {
    let path = state_dir.join(LOCK_FILE);
    let file = safe_fs::open_private_file(&path)?;
    let mut locked = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(l) => l,
        Err((mut file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut pid = String::new();
            let _ = Read::by_ref(&mut file).take(32).read_to_string(&mut pid);
            return Err(Error::Other(format!(
                "{}: another wedgewatch daemon (pid {}) uses this state directory",
                state_dir.display(),
                pid.trim()
            )));
        }
        Err((_, e)) => return Err(Error::io(&path, e.into())),
    };
    let pid = std::process::id().to_string();
    let written = locked
        .set_len(0)
        .and_then(|_| locked.rewind())
        .and_then(|_| locked.write_all(pid.as_bytes()));
    written.map_err(|e| Error::io(&path, e))?;
    Ok(StateLock { _file: locked })
}
