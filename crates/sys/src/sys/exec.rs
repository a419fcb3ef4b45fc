//! Programs wedgewatch runs (py-spy): whether a path names one we could execute.

use std::path::Path;

/// Whether `p` is a regular file (after links: `$PATH` entries are often links) with an
/// execute bit. Not a guarantee that exec succeeds (noexec mounts, ACLs); spawning says why.
pub fn is_executable_file(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executables_are_told_from_other_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("tool");
        std::fs::write(&f, "#!/bin/sh\n").unwrap();
        assert!(!is_executable_file(&f), "no execute bit");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(is_executable_file(&f));
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        assert!(is_executable_file(&link), "a link to an executable");
        assert!(!is_executable_file(dir.path()), "a directory");
        assert!(!is_executable_file(&dir.path().join("absent")));
    }
}
