//! Directories and files wedgewatch trusts. wedgewatch runs as root on shared hosts, so a
//! directory it writes into is either created here (0700) or verified first: owned by us or
//! root, not writable by anyone else, not a symbolic link, and every directory above it safe
//! too (owned by us or root, and not writable by others unless sticky, like `/tmp`). Files
//! inside are opened without following links, and new ones only if they do not exist yet.

use std::fs::{File, Metadata, OpenOptions};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

mod input;
mod output;
pub mod staged;
mod walk;

pub use input::{is_input_dir, open_input, read_input_capped};
pub use output::{open_append_output, write_output, write_public_output};
pub use walk::open_trusted_dir;

/// Why a path is not safe to write into.
#[derive(Debug, thiserror::Error)]
pub enum UnsafePath {
    #[error("{path}: owned by uid {uid}, not by you (uid {me}) or root; refusing to use it")]
    ForeignOwner { path: PathBuf, uid: u32, me: u32 },
    #[error("{path}: writable by other users (mode {mode:04o}); refusing to use it")]
    OthersMayWrite { path: PathBuf, mode: u32 },
    #[error("{path}: is a symbolic link; wedgewatch does not follow links here")]
    Symlink { path: PathBuf },
    #[error("{path}: reached through the symbolic link {link:?}, owned by uid {uid}; wedgewatch follows only links owned by you or root")]
    ForeignLink {
        path: PathBuf,
        link: PathBuf,
        uid: u32,
    },
    #[error("{path}: exists and belongs to uid {uid}, not to you (uid {me}); wedgewatch replaces only its own files")]
    NotOurs { path: PathBuf, uid: u32, me: u32 },
    #[error("{path}: is not a {expected}")]
    WrongType {
        path: PathBuf,
        expected: &'static str,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl From<UnsafePath> for crate::error::Error {
    fn from(e: UnsafePath) -> Self {
        crate::error::Error::Other(e.to_string())
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> UnsafePath + '_ {
    move |source| UnsafePath::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The effective uid: whose files we trust besides root's.
pub fn my_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Whether `uid` is us or root: the only owners (and socket peers) wedgewatch trusts.
pub fn trusted_uid(uid: u32) -> bool {
    uid == 0 || uid == my_uid()
}

fn check_owner(path: &Path, md: &Metadata) -> Result<(), UnsafePath> {
    if trusted_uid(md.uid()) {
        return Ok(());
    }
    Err(UnsafePath::ForeignOwner {
        path: path.to_path_buf(),
        uid: md.uid(),
        me: my_uid(),
    })
}

/// An entry we write into (from `lstat`): not a link, ours or root's, nobody else may write.
fn check_entry(path: &Path, md: &Metadata) -> Result<(), UnsafePath> {
    if md.file_type().is_symlink() {
        return Err(UnsafePath::Symlink {
            path: path.to_path_buf(),
        });
    }
    check_owner(path, md)?;
    if md.mode() & 0o022 != 0 {
        return Err(UnsafePath::OthersMayWrite {
            path: path.to_path_buf(),
            mode: md.mode() & 0o7777,
        });
    }
    Ok(())
}

/// Every directory of an absolute, link-free path: ours or root's, and others may not write
/// unless the sticky bit keeps them from renaming our entries.
fn check_ancestors(canonical: &Path) -> Result<(), UnsafePath> {
    for dir in canonical.ancestors() {
        let md = std::fs::symlink_metadata(dir).map_err(io(dir))?;
        check_owner(dir, &md)?;
        let sticky = md.mode() & 0o1000 != 0;
        if md.mode() & 0o022 != 0 && !sticky {
            return Err(UnsafePath::OthersMayWrite {
                path: dir.to_path_buf(),
                mode: md.mode() & 0o7777,
            });
        }
    }
    Ok(())
}

/// Creates `dir` 0700 (missing parents too), or verifies the existing one; refuses a link, a
/// directory another user owns or may write, or one under such a directory. Returns the path
/// with its parents' links resolved, so later use cannot be redirected.
pub fn private_dir(dir: &Path) -> Result<PathBuf, UnsafePath> {
    let name = dir.file_name().ok_or_else(|| UnsafePath::WrongType {
        path: dir.to_path_buf(),
        expected: "directory name (it ends in `..` or `/`)",
    })?;
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(parent)
        .map_err(io(parent))?;
    let parent = parent.canonicalize().map_err(io(parent))?;
    check_ancestors(&parent)?;
    let full = parent.join(name);
    match std::fs::DirBuilder::new().mode(0o700).create(&full) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(&full)(e)),
    }
    let md = std::fs::symlink_metadata(&full).map_err(io(&full))?;
    check_entry(&full, &md)?;
    if !md.is_dir() {
        return Err(UnsafePath::WrongType {
            path: full,
            expected: "directory",
        });
    }
    Ok(full)
}

/// Verifies an existing directory we are about to write into, without creating anything.
pub fn verify_private_dir(dir: &Path) -> Result<(), UnsafePath> {
    let md = std::fs::symlink_metadata(dir).map_err(io(dir))?;
    check_entry(dir, &md)?;
    if !md.is_dir() {
        return Err(UnsafePath::WrongType {
            path: dir.to_path_buf(),
            expected: "directory",
        });
    }
    Ok(())
}

/// Creates a new owner-only file; fails if anything (a file, a link) is already there.
pub fn create_new_private_file(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Opens (creating 0600 if missing) a file we keep state in, never through a link; refuses
/// one another user owns or may write.
pub fn open_private_file(path: &Path) -> Result<File, UnsafePath> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => UnsafePath::Symlink {
                path: path.to_path_buf(),
            },
            _ => io(path)(e),
        })?;
    let md = f.metadata().map_err(io(path))?;
    check_entry(path, &md)?;
    if !md.is_file() {
        return Err(UnsafePath::WrongType {
            path: path.to_path_buf(),
            expected: "regular file",
        });
    }
    Ok(f)
}

/// Opens a file for reading without following a link at its last component.
pub fn open_no_follow(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Reads at most `cap` bytes of a file opened without following a link at its last
/// component. Returns the bytes and whether the file held more (then only `cap` are kept):
/// a file written by someone else (a process's environment) cannot make us allocate more.
pub fn read_capped(path: &Path, cap: usize) -> std::io::Result<(Vec<u8>, bool)> {
    use std::io::Read;
    let file = open_no_follow(path)?;
    let mut bytes = Vec::new();
    file.take(cap as u64 + 1).read_to_end(&mut bytes)?;
    let more = bytes.len() > cap;
    bytes.truncate(cap);
    Ok((bytes, more))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("stat").permissions().mode() & 0o7777
    }

    #[test]
    fn capped_reads_keep_the_cap_and_do_not_follow_links() {
        let tmp = tempfile::tempdir().expect("tmp");
        let f = tmp.path().join("f");
        std::fs::write(&f, "0123456789").expect("write");
        assert_eq!(read_capped(&f, 4).expect("read"), (b"0123".to_vec(), true));
        assert_eq!(
            read_capped(&f, 10).expect("read"),
            (b"0123456789".to_vec(), false)
        );
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&f, &link).expect("ln");
        assert!(read_capped(&link, 10).is_err());
    }

    #[test]
    fn new_dirs_are_owner_only_and_existing_safe_ones_are_kept() {
        let tmp = tempfile::tempdir().expect("tmp");
        let d = private_dir(&tmp.path().join("a/b/state")).expect("create");
        assert_eq!(mode(&d), 0o700);
        assert_eq!(mode(&tmp.path().join("a/b")), 0o700);
        assert_eq!(private_dir(&d).expect("again"), d);
    }

    #[test]
    fn a_link_or_a_world_writable_dir_is_refused() {
        let tmp = tempfile::tempdir().expect("tmp");
        let target = tmp.path().join("elsewhere");
        std::fs::create_dir(&target).expect("mkdir");
        std::os::unix::fs::symlink(&target, tmp.path().join("link")).expect("ln");
        let e = private_dir(&tmp.path().join("link")).expect_err("link");
        assert!(matches!(e, UnsafePath::Symlink { .. }), "{e}");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = private_dir(&target).expect_err("0777");
        assert!(matches!(e, UnsafePath::OthersMayWrite { .. }), "{e}");
        let e = private_dir(&target.join("below")).expect_err("under a 0777 dir");
        assert!(e.to_string().contains("writable by other users"), "{e}");
    }

    #[test]
    fn files_are_not_opened_through_links_and_new_ones_are_exclusive() {
        let tmp = tempfile::tempdir().expect("tmp");
        let real = tmp.path().join("real");
        std::fs::write(&real, "x").expect("write");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("ln");
        assert!(matches!(
            open_private_file(&link),
            Err(UnsafePath::Symlink { .. })
        ));
        assert!(create_new_private_file(&link).is_err());
        assert!(create_new_private_file(&real).is_err());
        let new = tmp.path().join("new");
        create_new_private_file(&new).expect("new");
        assert_eq!(mode(&new), 0o600);
        assert_eq!(std::fs::read_to_string(&real).expect("read"), "x");
    }
}
