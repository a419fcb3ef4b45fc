//! Where a daemon keeps its state (recording, lock) and its socket by default.
//!
//! Root follows the service conventions, so `sudo wedgewatch` finds the root daemon and a
//! systemd unit with `StateDirectory=`/`RuntimeDirectory=` works unchanged:
//! `$STATE_DIRECTORY` else `/var/lib/wedgewatch`, `$RUNTIME_DIRECTORY` else `/run/wedgewatch`.
//! Other users get per-user directories: `$XDG_STATE_HOME/wedgewatch` (else
//! `~/.local/state/wedgewatch`, else `/var/tmp/wedgewatch-<uid>`) and
//! `$XDG_RUNTIME_DIR/wedgewatch` (else the state directory). Whatever the default, the daemon
//! verifies the directory before use (see `safe_fs`), so a predictable name in a shared
//! `/tmp` cannot be pre-created by someone else.

use std::ffi::OsString;
use std::path::PathBuf;

/// The default state and runtime directories for `uid`, reading the environment via `env`.
pub fn defaults_for(uid: u32, env: impl Fn(&str) -> Option<OsString>) -> (PathBuf, PathBuf) {
    // systemd passes a colon-separated list; the first entry is ours.
    let var = |k: &str| {
        env(k)
            .and_then(|v| {
                let s = v.to_string_lossy().split(':').next()?.to_string();
                Some(s)
            })
            .filter(|s| s.starts_with('/'))
            .map(PathBuf::from)
    };
    if uid == 0 {
        let state = var("STATE_DIRECTORY").unwrap_or_else(|| "/var/lib/wedgewatch".into());
        let runtime = var("RUNTIME_DIRECTORY").unwrap_or_else(|| "/run/wedgewatch".into());
        return (state, runtime);
    }
    let state = var("STATE_DIRECTORY")
        .or_else(|| var("XDG_STATE_HOME").map(|d| d.join("wedgewatch")))
        .or_else(|| var("HOME").map(|h| h.join(".local/state/wedgewatch")))
        .unwrap_or_else(|| PathBuf::from(format!("/var/tmp/wedgewatch-{uid}")));
    let runtime = var("RUNTIME_DIRECTORY")
        .or_else(|| var("XDG_RUNTIME_DIR").map(|d| d.join("wedgewatch")))
        .unwrap_or_else(|| state.clone());
    (state, runtime)
}

fn process_env(k: &str) -> Option<OsString> {
    std::env::var_os(k)
}

/// Where this process's daemon keeps its recording and lock by default.
pub fn default_state_dir() -> PathBuf {
    defaults_for(crate::safe_fs::my_uid(), process_env).0
}

/// Where this process's daemon puts its socket by default.
pub fn default_runtime_dir() -> PathBuf {
    defaults_for(crate::safe_fs::my_uid(), process_env).1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn root_uses_service_directories_and_ignores_a_users_home() {
        let user_env = [("HOME", "/home/alice"), ("XDG_STATE_HOME", "/home/alice/s")];
        assert_eq!(
            defaults_for(0, env(&user_env)),
            ("/var/lib/wedgewatch".into(), "/run/wedgewatch".into())
        );
        let unit = [
            ("STATE_DIRECTORY", "/var/lib/ww:/var/lib/other"),
            ("RUNTIME_DIRECTORY", "/run/ww"),
        ];
        assert_eq!(
            defaults_for(0, env(&unit)),
            ("/var/lib/ww".into(), "/run/ww".into())
        );
    }

    #[test]
    fn users_get_per_user_directories() {
        let xdg = [
            ("XDG_STATE_HOME", "/home/a/.st"),
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
        ];
        assert_eq!(
            defaults_for(1000, env(&xdg)),
            (
                "/home/a/.st/wedgewatch".into(),
                "/run/user/1000/wedgewatch".into()
            )
        );
        let home = [("HOME", "/home/a"), ("XDG_RUNTIME_DIR", "relative")];
        let (s, r) = defaults_for(1000, env(&home));
        assert_eq!(s, PathBuf::from("/home/a/.local/state/wedgewatch"));
        assert_eq!(r, s, "a relative runtime dir is ignored");
        let (s, _) = defaults_for(1000, env(&[]));
        assert_eq!(s, PathBuf::from("/var/tmp/wedgewatch-1000"));
    }
}
