//! A directory of files built aside and renamed into place ([`StagedDir`]), and the removal
//! of such a directory that deletes only the files its writer names ([`remove_own_dir`]).
//!
//! Why: a reader (or a reboot) must see a whole directory or none, and a file someone else
//! added must not be lost to our clean-up. The rename replaces only an absent name or an
//! empty directory, and the parent is synced after it.

use super::UnsafePath;
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// The prefix of every staging directory's name (after the leading dot and the target's
/// name): `.NAME.tmp-<pid>-<nanos>`.
pub const STAGING_MARK: &str = ".tmp-";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> UnsafePath + '_ {
    move |source| UnsafePath::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A directory being built beside its final name. Dropped without [`StagedDir::commit`],
/// it is removed with everything in it (created exclusively and 0700 here: it holds only
/// what its owner wrote).
#[derive(Debug)]
pub struct StagedDir {
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl StagedDir {
    /// A new, empty, owner-only directory beside `target` (whose parent must exist).
    pub fn beside(target: &Path) -> Result<StagedDir, UnsafePath> {
        let name = target.file_name().ok_or_else(|| UnsafePath::WrongType {
            path: target.to_path_buf(),
            expected: "directory name",
        })?;
        let parent = parent_of(target);
        let tmp = parent.join(staging_name(&name.to_string_lossy()));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&tmp)
            .map_err(io(&tmp))?;
        Ok(StagedDir {
            tmp,
            target: target.to_path_buf(),
            committed: false,
        })
    }

    /// Where to write the files.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// Writes a new owner-only file `name` in the staged directory, synced to the disk.
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> Result<(), UnsafePath> {
        let path = self.tmp.join(name);
        let mut f = super::create_new_private_file(&path).map_err(io(&path))?;
        f.write_all(bytes).map_err(io(&path))?;
        f.sync_all().map_err(io(&path))
    }

    /// Renames the directory to its target (absent, or an empty directory) and syncs the
    /// parent. Returns the target.
    pub fn commit(mut self) -> Result<PathBuf, UnsafePath> {
        sync_dir(&self.tmp)?;
        std::fs::rename(&self.tmp, &self.target).map_err(io(&self.target))?;
        self.committed = true;
        sync_dir(parent_of(&self.target))?;
        Ok(self.target.clone())
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// `.NAME.tmp-<pid>-<nanos>`: a name nobody else uses, and that says whose it is.
fn staging_name(name: &str) -> String {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(".{name}{STAGING_MARK}{}-{stamp}", std::process::id())
}

fn parent_of(p: &Path) -> &Path {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Syncs a directory's entries to the disk (a rename in it survives a power cut).
pub fn sync_dir(dir: &Path) -> Result<(), UnsafePath> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}

/// Replaces file `name` in directory `dir` atomically: a new owner-only file beside it,
/// synced, renamed over it (a rename replaces a link, it never writes through one).
pub fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), UnsafePath> {
    let tmp = dir.join(staging_name(name));
    let path = dir.join(name);
    let written = (|| {
        let mut f = super::create_new_private_file(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)
    })();
    if let Err(e) = written {
        // created exclusively above, or not at all (then this removes nothing of anyone's)
        if e.kind() != std::io::ErrorKind::AlreadyExists {
            let _ = std::fs::remove_file(&tmp);
        }
        return Err(io(&path)(e));
    }
    sync_dir(dir)
}

/// What [`remove_own_dir`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Removed {
    /// The files named and the directory are gone.
    All,
    /// The files named are gone; the directory stays: it holds something else.
    KeptForeign,
}

/// Removes `parent/name`, a directory of files named `ours`: each only when it is a regular
/// file owned by us, then the directory only if empty. Everything is removed relative to the
/// directory opened without following a link, so a swapped-in link cannot redirect it.
pub fn remove_own_dir(parent: &Path, name: &str, ours: &[&str]) -> Result<Removed, UnsafePath> {
    let path = parent.join(name);
    let err = |e: Errno| io(&path)(e.into());
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let parent_fd = openat(nix::fcntl::AT_FDCWD, parent, flags, Mode::empty()).map_err(err)?;
    let dir = openat(&parent_fd, name, flags, Mode::empty()).map_err(|e| match e {
        Errno::ELOOP | Errno::ENOTDIR => UnsafePath::WrongType {
            path: path.clone(),
            expected: "directory (not a link)",
        },
        e => err(e),
    })?;
    for file in ours {
        let st = match fstatat(&dir, *file, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(err(e)),
        };
        let regular = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG;
        if regular && st.st_uid == super::my_uid() {
            unlinkat(&dir, *file, UnlinkatFlags::NoRemoveDir).map_err(err)?;
        }
    }
    match unlinkat(&parent_fd, name, UnlinkatFlags::RemoveDir) {
        Ok(()) => Ok(Removed::All),
        Err(Errno::ENOTEMPTY | Errno::EEXIST) => Ok(Removed::KeptForeign),
        Err(e) => Err(err(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn a_staged_dir_appears_whole_or_not_at_all() {
        let tmp = tempfile::tempdir().expect("tmp");
        let target = tmp.path().join("bundle");
        let staged = StagedDir::beside(&target).expect("stage");
        staged.write_file("a.json", b"{}").expect("write");
        assert!(!target.exists(), "nothing at the target before the commit");
        assert_eq!(mode(staged.path()), 0o700);
        assert_eq!(mode(&staged.path().join("a.json")), 0o600);
        let done = staged.commit().expect("commit");
        assert_eq!(std::fs::read(done.join("a.json")).expect("read"), b"{}");
        // Dropped before the commit: nothing is left, not even the staging directory.
        let other = StagedDir::beside(&tmp.path().join("other")).expect("stage");
        other.write_file("x", b"1").expect("write");
        drop(other);
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("ls")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("bundle")]);
    }

    #[test]
    fn a_commit_never_replaces_a_directory_with_something_in_it() {
        let tmp = tempfile::tempdir().expect("tmp");
        let target = tmp.path().join("taken");
        std::fs::create_dir(&target).expect("mkdir");
        std::fs::write(target.join("notes.txt"), "mine").expect("write");
        let staged = StagedDir::beside(&target).expect("stage");
        staged.write_file("a", b"1").expect("write");
        assert!(staged.commit().is_err());
        assert_eq!(
            std::fs::read_to_string(target.join("notes.txt")).expect("kept"),
            "mine"
        );
    }

    #[test]
    fn removal_takes_only_our_regular_files_and_keeps_a_dir_with_anything_else() {
        let tmp = tempfile::tempdir().expect("tmp");
        let outside = tmp.path().join("outside.txt");
        std::fs::write(&outside, "precious").expect("write");
        let d = tmp.path().join("inc");
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::write(d.join("report.md"), "ours").expect("write");
        // A link under one of our names is removed as a link, never followed.
        std::os::unix::fs::symlink(&outside, d.join("snapshot.json")).expect("ln");
        std::fs::write(d.join("notes.txt"), "someone else's").expect("write");
        let ours = ["report.md", "snapshot.json", "missing.json"];
        let r = remove_own_dir(tmp.path(), "inc", &ours).expect("remove");
        assert_eq!(r, Removed::KeptForeign);
        assert!(!d.join("report.md").exists());
        assert!(
            std::fs::symlink_metadata(d.join("snapshot.json")).is_ok(),
            "a link is not ours"
        );
        assert_eq!(std::fs::read_to_string(&outside).expect("read"), "precious");
        assert!(d.join("notes.txt").exists());
        std::fs::remove_file(d.join("notes.txt")).expect("rm");
        std::fs::remove_file(d.join("snapshot.json")).expect("rm");
        assert_eq!(
            remove_own_dir(tmp.path(), "inc", &ours).expect("remove"),
            Removed::All
        );
        assert!(!d.exists());
    }

    #[test]
    fn removal_does_not_follow_a_directory_link() {
        let tmp = tempfile::tempdir().expect("tmp");
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::fs::write(elsewhere.join("report.md"), "not ours to remove").expect("write");
        std::os::unix::fs::symlink(&elsewhere, tmp.path().join("inc")).expect("ln");
        assert!(remove_own_dir(tmp.path(), "inc", &["report.md"]).is_err());
        assert!(elsewhere.join("report.md").exists());
    }

    #[test]
    fn a_replaced_file_is_whole_and_owner_only() {
        let tmp = tempfile::tempdir().expect("tmp");
        std::fs::write(tmp.path().join("incident.json"), "old").expect("write");
        replace_file(tmp.path(), "incident.json", b"new").expect("replace");
        let p = tmp.path().join("incident.json");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "new");
        assert_eq!(mode(&p), 0o600);
        assert_eq!(std::fs::read_dir(tmp.path()).expect("ls").count(), 1);
    }
}
