//! The API key of a router started with `--api-key`, for its authenticated endpoints (`GET
//! /workers` answers 401 without it). The key goes back only to the router it came from, and
//! nowhere else (docs/security.md §15):
//!
//! - it is read from `/proc` (through [`ProcFs`], raw bytes) at scrape time, for one GET, and
//!   dropped; it never enters the topology, a sample, a snapshot, a recording, a log or the
//!   TUI;
//! - [`RouterKey`] has no `Serialize`, `Display` or `Clone`, its `Debug` says `<redacted>`, and
//!   its bytes (and the cmdline or environ they came from) are overwritten on drop;
//! - it is sent only to the router's own HTTP URL, built from the router process's own
//!   listening sockets; a `--url` target never gets one.
//!
//! Where it is looked for, first found wins: docs/probes.md. Our own environment's `NAME` goes
//! only to a router that names it, in our network namespace, owned by root or us (anyone can
//! start a look-alike). Every key found is held by the redactor ([`crate::redact::held`]).

use crate::model::Component;
use crate::sys::ProcFs;
use std::path::Path;
use std::time::Duration;

/// Longest wait for one `/proc` read of the router's (or its launcher's) cmdline or environ:
/// a process holding its mmap lock makes those reads block (see [`crate::deadline`]).
const READ_DEADLINE: Duration = Duration::from_millis(250);

/// Environ files are read whole; a real one is a few KiB, a hostile one is not read past this.
const MAX_PROC_FILE: usize = 1 << 20;

/// The flag a router takes its key from (sglang-router, smg, sgl-router, vllm-router).
const KEY_FLAG: &str = "--api-key";

/// A router's API key. Deliberately not `Clone`, `Serialize` or `Display`.
pub struct RouterKey(Vec<u8>);

impl RouterKey {
    /// The `Authorization` header value.
    pub fn bearer(&self) -> String {
        format!("Bearer {}", String::from_utf8_lossy(&self.0))
    }

    fn new(v: &[u8]) -> Option<RouterKey> {
        // An empty key, or one that would break the header line, is not a key we can send.
        let ok = !v.is_empty() && v.iter().all(|b| b.is_ascii_graphic());
        if ok {
            crate::redact::held::hold(&String::from_utf8_lossy(v));
        }
        ok.then(|| RouterKey(v.to_vec()))
    }
}

impl std::fmt::Debug for RouterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RouterKey(<redacted>)")
    }
}

impl Drop for RouterKey {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

/// Best effort: a key should not outlive its one request in freed memory (`black_box` keeps
/// the zeroing writes from being dropped as dead stores).
fn wipe(bytes: &mut [u8]) {
    bytes.iter_mut().for_each(|b| *b = 0);
    std::hint::black_box(&*bytes);
}

/// A process's raw cmdline or environ, which may hold a key: wiped when dropped, like the
/// key itself, so the key's copy in the read buffer does not outlive the look-up either.
struct RawProcFile(Vec<u8>);

impl Drop for RawProcFile {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

/// Which of a process's files a key is looked for in.
#[derive(Debug, Clone, Copy)]
enum ProcFile {
    Cmdline,
    Environ,
}

impl ProcFile {
    fn name(self) -> &'static str {
        match self {
            ProcFile::Cmdline => "cmdline",
            ProcFile::Environ => "environ",
        }
    }
}

/// Where a key may be looked for.
#[derive(Debug, Clone, Default)]
pub struct KeySources {
    /// The procfs (`/proc`; `--proc-root`, a fixture tree in tests).
    pub proc: ProcFs,
    /// `--router-key-env NAME`.
    pub env_name: Option<String>,
}

/// What the look-up found.
#[derive(Debug)]
pub enum Lookup {
    /// A key, and where it came from (for the endpoint's detail; never the key itself).
    Found(RouterKey, String),
    /// No key; why (said on the endpoint when the router answers 401).
    None(String),
}

/// The key of router component `c`. `own_env` reads wedgewatch's own environment (a
/// parameter so that tests need not change the process environment).
pub fn lookup(c: &Component, src: &KeySources, own_env: &dyn Fn(&str) -> Option<String>) -> Lookup {
    let found_by = c
        .labels
        .get(crate::model::topology::labels::LABEL_FOUND_BY)
        .map(String::as_str);
    let Some(main_pid) = c.main_pid else {
        return Lookup::None("no router process known (a --url target)".into());
    };
    if found_by.is_some_and(|f| f.starts_with("--url")) {
        return Lookup::None("a --url target gets no key".into());
    }
    let args_pid = label_pid(c, crate::model::topology::labels::LABEL_ARGS_PID).unwrap_or(main_pid);
    let env_pid = label_pid(c, crate::model::topology::labels::LABEL_ENV_PID).unwrap_or(main_pid);
    let mut tried = Vec::new();
    // Discovery says when setproctitle overwrote the arguments and no launcher kept them.
    let args_lost = c
        .labels
        .get(crate::model::topology::labels::LABEL_ARGS_SOURCE)
        .is_some_and(|s| s.starts_with("unavailable"));
    if args_lost {
        tried.push(format!(
            "the arguments of pid {args_pid} were overwritten by its process title and no \
             launcher kept them"
        ));
    } else {
        match read_proc(&src.proc, args_pid, ProcFile::Cmdline) {
            Ok(raw) => {
                if let Some(k) = flag_in_cmdline(&raw.0, KEY_FLAG) {
                    return Lookup::Found(k, format!("{KEY_FLAG} of pid {args_pid}"));
                }
                tried.push(format!("no {KEY_FLAG} in the arguments of pid {args_pid}"));
            }
            Err(e) => tried.push(e),
        }
    }
    if let Some(name) = src.env_name.as_deref() {
        match read_proc(&src.proc, env_pid, ProcFile::Environ) {
            Ok(raw) => {
                if let Some(k) = var_in_environ(&raw.0, name) {
                    return Lookup::Found(k, format!("${name} of pid {env_pid}"));
                }
                tried.push(format!("no ${name} in the environment of pid {env_pid}"));
            }
            Err(e) => tried.push(e),
        }
        let asker = Asker {
            component: c,
            main_pid,
            args_pid,
            env_pid,
        };
        match own_key(&src.proc, &asker, name, own_env) {
            Ok(k) => return Lookup::Found(k, format!("${name} of wedgewatch")),
            Err(why) => tried.push(why),
        }
    } else {
        // Worded so that no word follows the option: the redactor would take it for its value.
        tried.push("no key variable named with --router-key-env".into());
    }
    Lookup::None(tried.join("; "))
}

/// Teaches every redactor the value of `NAME` in wedgewatch's own environment
/// (`--router-key-env NAME`), at start: it must leave in no output, whether it is ever sent
/// or not.
pub fn hold_own(name: &str) {
    if let Ok(v) = std::env::var(name) {
        crate::redact::held::hold(&v);
    }
}

/// Whether an HTTP failure detail ([`crate::sys::http`]) is an authentication refusal.
pub fn is_auth_refusal(detail: &str) -> bool {
    matches!(detail, "HTTP status 401" | "HTTP status 403")
}

/// The `Authorization` value for discovery's `GET /workers` of router `c`, or None (called off
/// the runtime, under discovery's deadline).
pub fn discovery_key(c: &Component, proc_root: &Path, env_name: Option<&str>) -> Option<String> {
    let src = KeySources {
        proc: ProcFs::new(proc_root),
        env_name: env_name.map(str::to_string),
    };
    let own_env = |name: &str| std::env::var(name).ok();
    match lookup(c, &src, &own_env) {
        Lookup::Found(k, _) => Some(k.bearer()),
        Lookup::None(_) => None,
    }
}

fn label_pid(c: &Component, label: &str) -> Option<i32> {
    c.labels.get(label).and_then(|v| v.parse().ok())
}

/// Reads `FILE` of `pid` through `proc` under [`READ_DEADLINE`] on a detached thread, at
/// most [`MAX_PROC_FILE`] bytes (a read that times out is dropped, hence wiped, there).
fn read_proc(proc: &ProcFs, pid: i32, file: ProcFile) -> Result<RawProcFile, String> {
    let path = proc.path(pid, file.name());
    let reader = proc.clone();
    let read = move || {
        match file {
            ProcFile::Cmdline => reader.cmdline_bytes(pid, MAX_PROC_FILE),
            ProcFile::Environ => reader.environ_bytes(pid, MAX_PROC_FILE),
        }
        .map(RawProcFile)
    };
    match crate::deadline::call(&path, READ_DEADLINE, read) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("cannot read the {} of pid {pid}: {e}", file.name())),
        Err(e) => Err(e),
    }
}

/// The value of the last occurrence of `flag` in a NUL-separated cmdline, argparse-style.
fn flag_in_cmdline(raw: &[u8], flag: &str) -> Option<RouterKey> {
    let want = flag.replace('_', "-");
    let args: Vec<&[u8]> = raw.split(|b| *b == 0).collect();
    let mut found: Option<&[u8]> = None;
    let mut i = 0;
    while i < args.len() {
        let a = args[i];
        let name_end = a.iter().position(|b| *b == b'=').unwrap_or(a.len());
        let name = String::from_utf8_lossy(&a[..name_end]).replace('_', "-");
        if name == want {
            if name_end < a.len() {
                found = Some(&a[name_end + 1..]);
            } else if let Some(v) = args.get(i + 1).filter(|v| !v.starts_with(b"--")) {
                found = Some(v);
                i += 1;
            }
        }
        i += 1;
    }
    found.and_then(RouterKey::new)
}

/// The value of `NAME` in a NUL-separated environ.
fn var_in_environ(raw: &[u8], name: &str) -> Option<RouterKey> {
    raw.split(|b| *b == 0)
        .filter_map(|kv| {
            let eq = kv.iter().position(|b| *b == b'=')?;
            (&kv[..eq] == name.as_bytes()).then(|| &kv[eq + 1..])
        })
        .next_back()
        .and_then(RouterKey::new)
}

/// The router a key from wedgewatch's own environment would go to, and the processes whose
/// arguments and environment are its own.
struct Asker<'a> {
    component: &'a Component,
    main_pid: i32,
    args_pid: i32,
    env_pid: i32,
}

/// `NAME` from wedgewatch's own environment, for a router that may have it.
fn own_key(
    proc: &ProcFs,
    asker: &Asker,
    name: &str,
    own_env: &dyn Fn(&str) -> Option<String>,
) -> Result<RouterKey, String> {
    let Some(v) = own_env(name) else {
        return Err(format!("${name} is not set for wedgewatch"));
    };
    // Held even when not sent: the value must not leave in any output either way.
    crate::redact::held::hold(&v);
    let sendable = same_netns(proc, asker)
        .and_then(|()| owner_may_have_it(proc, asker.main_pid))
        .and_then(|()| asks_for(proc, asker, name));
    match sendable {
        Ok(()) => RouterKey::new(v.as_bytes())
            .ok_or_else(|| format!("${name} of wedgewatch is empty or not one token")),
        Err(why) => Err(format!("${name} of wedgewatch not sent: {why}")),
    }
}

/// Whether the router runs in wedgewatch's own network namespace: a router in a container's
/// is another host's business, whatever its uid there.
fn same_netns(proc: &ProcFs, asker: &Asker) -> Result<(), String> {
    let pid = asker.main_pid;
    if asker.component.netns.is_some() {
        return Err(format!("pid {pid} runs in another network namespace"));
    }
    let theirs = proc
        .ns_inode(pid, "net")
        .map_err(|e| format!("cannot tell the network namespace of pid {pid}: {e}"))?;
    let ours = proc
        .own_ns_inode("net")
        .map_err(|e| format!("cannot tell our own network namespace: {e}"))?;
    if theirs == ours {
        Ok(())
    } else {
        Err(format!("pid {pid} runs in another network namespace"))
    }
}

/// Whether the router's own arguments or environment name `NAME`: a router that never
/// mentions it never asked for it.
fn asks_for(proc: &ProcFs, asker: &Asker, name: &str) -> Result<(), String> {
    let (args_pid, env_pid) = (asker.args_pid, asker.env_pid);
    let in_args = read_proc(proc, args_pid, ProcFile::Cmdline)
        .is_ok_and(|raw| raw.0.split(|b| *b == 0).any(|a| names_word(a, name)));
    let in_env = read_proc(proc, env_pid, ProcFile::Environ).is_ok_and(|raw| {
        raw.0
            .split(|b| *b == 0)
            .any(|kv| kv.split(|b| *b == b'=').next() == Some(name.as_bytes()))
    });
    if in_args || in_env {
        Ok(())
    } else {
        Err(format!(
            "neither the arguments of pid {args_pid} nor the environment of pid {env_pid} \
             name it"
        ))
    }
}

/// Whether `arg` holds `name` as a whole word (`$NAME`, `${NAME}`, `--key-env=NAME`; not
/// `NAME_OLD` or `MY_NAME`).
fn names_word(arg: &[u8], name: &str) -> bool {
    let name = name.as_bytes();
    let word = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_');
    !name.is_empty()
        && arg.windows(name.len()).enumerate().any(|(i, w)| {
            w == name
                && !word(i.checked_sub(1).and_then(|j| arg.get(j)))
                && !word(arg.get(i + name.len()))
        })
}

/// Whether wedgewatch's own key may go to this process: it runs as root or as us.
fn owner_may_have_it(proc: &ProcFs, pid: i32) -> Result<(), String> {
    let uid = proc
        .owner_uid(pid)
        .map_err(|e| format!("cannot tell who runs pid {pid}: {e}"))?;
    let me = nix::unistd::geteuid().as_raw();
    if uid == 0 || uid == me {
        Ok(())
    } else {
        Err(format!(
            "the router runs as uid {uid}, neither root nor wedgewatch's uid {me}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Role;

    fn text(k: &Option<RouterKey>) -> Option<String> {
        k.as_ref().map(|k| k.bearer())
    }

    #[test]
    fn flags_are_read_like_argparse() {
        let raw = b"python\0-m\0sglang_router.launch_router\0--api-key\0k1\0--port\x0030000\0";
        assert_eq!(
            text(&flag_in_cmdline(raw, KEY_FLAG)).as_deref(),
            Some("Bearer k1")
        );
        let raw = b"smg\0--api_key=k2\0--api-key\0k3\0";
        assert_eq!(
            text(&flag_in_cmdline(raw, KEY_FLAG)).as_deref(),
            Some("Bearer k3")
        );
        let raw = b"smg\0--api-key\0--port\x0030000\0";
        assert!(flag_in_cmdline(raw, KEY_FLAG).is_none());
        let raw = b"smg\0--api-key-file\0x\0";
        assert!(flag_in_cmdline(raw, KEY_FLAG).is_none());
        // A value that would break the header line is not sent.
        let raw = b"smg\0--api-key\0a\r\nX-Evil: 1\0";
        assert!(flag_in_cmdline(raw, KEY_FLAG).is_none());
    }

    #[test]
    fn environ_last_value_wins_and_names_are_exact() {
        let raw = b"A=1\0ROUTER_KEY=x\0ROUTER_KEY=y\0ROUTER_KEY_OLD=z\0";
        assert_eq!(
            text(&var_in_environ(raw, "ROUTER_KEY")).as_deref(),
            Some("Bearer y")
        );
        assert!(var_in_environ(raw, "ROUTER").is_none());
    }

    #[test]
    fn debug_never_shows_the_key() {
        let k = RouterKey::new(b"s3cret-value").expect("a key");
        assert_eq!(format!("{k:?}"), "RouterKey(<redacted>)");
        let l = Lookup::Found(k, "--api-key of pid 1".into());
        assert!(!format!("{l:?}").contains("s3cret"));
    }

    fn fake_proc(pid: i32, cmdline: &[u8], environ: &[u8]) -> tempfile::TempDir {
        let d = tempfile::tempdir().expect("tempdir");
        let p = d.path().join(pid.to_string());
        std::fs::create_dir_all(&p).expect("mkdir");
        std::fs::write(p.join("cmdline"), cmdline).expect("cmdline");
        std::fs::write(p.join("environ"), environ).expect("environ");
        d
    }

    /// `ns/net` of `pid` in namespace `inode`, and our own (`self`) in 4026531840.
    fn netns(root: &Path, pid: i32, inode: u64) {
        for (dir, ino) in [(pid.to_string(), inode), ("self".to_string(), 4026531840)] {
            let ns = root.join(dir).join("ns");
            std::fs::create_dir_all(&ns).expect("mkdir ns");
            std::os::unix::fs::symlink(format!("net:[{ino}]"), ns.join("net")).expect("link");
        }
    }

    fn none_because(l: Lookup) -> String {
        match l {
            Lookup::None(why) => why,
            Lookup::Found(_, from) => panic!("a key was sent (from {from})"),
        }
    }

    /// Our own key goes only to a router that names its variable, in our own network
    /// namespace.
    #[test]
    fn our_own_key_goes_only_to_a_router_that_asks_for_it_in_our_namespace() {
        let own = |n: &str| (n == "ROUTER_KEY").then(|| "own-env-key-51c7".to_string());
        let src = |d: &tempfile::TempDir| KeySources {
            proc: ProcFs::new(d.path()),
            env_name: Some("ROUTER_KEY".into()),
        };
        // Names nothing: no key.
        let d = fake_proc(
            45,
            b"smg\0--port\x0030000\0",
            b"PATH=/bin\0ROUTER_KEY_OLD=x\0",
        );
        netns(d.path(), 45, 4026531840);
        let why = none_because(lookup(&router(45), &src(&d), &own));
        assert!(why.contains("not sent: neither the arguments"), "{why}");
        // Named in a launcher's arguments ("$ROUTER_KEY" expanded by its shell): the key.
        let d = fake_proc(46, b"sh\0-c\0exec smg --api-key \"$ROUTER_KEY\"\0", b"");
        netns(d.path(), 46, 4026531840);
        assert!(matches!(
            lookup(&router(46), &src(&d), &own),
            Lookup::Found(..)
        ));
        // Named, but in another network namespace (a root container): no key.
        let d = fake_proc(47, b"smg\0", b"ROUTER_KEY=\0");
        netns(d.path(), 47, 4026532999);
        let why = none_because(lookup(&router(47), &src(&d), &own));
        assert!(why.contains("another network namespace"), "{why}");
        let mut contained = router(47);
        contained.netns = Some(4026532999);
        let why = none_because(lookup(&contained, &src(&d), &own));
        assert!(why.contains("another network namespace"), "{why}");
        // A namespace we cannot tell: no key.
        let d = fake_proc(48, b"smg\0", b"ROUTER_KEY=\0");
        let why = none_because(lookup(&router(48), &src(&d), &own));
        assert!(why.contains("cannot tell the network namespace"), "{why}");
    }

    #[test]
    fn a_name_is_a_whole_word() {
        for (arg, yes) in [
            (&b"$ROUTER_KEY"[..], true),
            (b"${ROUTER_KEY}", true),
            (b"--key-env=ROUTER_KEY", true),
            (b"ROUTER_KEY", true),
            (b"$ROUTER_KEY_OLD", false),
            (b"MY_ROUTER_KEY", false),
            (b"", false),
        ] {
            assert_eq!(names_word(arg, "ROUTER_KEY"), yes, "{arg:?}");
        }
    }

    fn router(pid: i32) -> Component {
        let mut c = Component::new("router@127.0.0.1:30000", Role::Router, "sglang");
        c.main_pid = Some(pid);
        c.pids = vec![pid];
        c
    }

    #[test]
    fn lookup_order_and_reasons() {
        let d = fake_proc(
            42,
            b"smg\0launch\0--port\x0030000\0",
            b"ROUTER_KEY=from-env\0",
        );
        let mut src = KeySources {
            proc: ProcFs::new(d.path()),
            env_name: None,
        };
        let none = |_: &str| None;
        match lookup(&router(42), &src, &none) {
            Lookup::None(why) => {
                assert!(
                    why.contains("no --api-key in the arguments of pid 42"),
                    "{why}"
                )
            }
            Lookup::Found(..) => panic!("no key expected"),
        }
        src.env_name = Some("ROUTER_KEY".into());
        match lookup(&router(42), &src, &none) {
            Lookup::Found(k, from) => {
                assert_eq!(k.bearer(), "Bearer from-env");
                assert_eq!(from, "$ROUTER_KEY of pid 42");
            }
            Lookup::None(why) => panic!("{why}"),
        }
        let d2 = fake_proc(43, b"smg\0--api-key\0from-args\0", b"ROUTER_KEY=from-env\0");
        src.proc = ProcFs::new(d2.path());
        match lookup(&router(43), &src, &none) {
            Lookup::Found(k, _) => assert_eq!(k.bearer(), "Bearer from-args"),
            Lookup::None(why) => panic!("{why}"),
        }
        // Our own environment: the fake /proc entry is owned by us, in our namespace, and
        // its environment names the variable (empty there), so it may have it.
        let d3 = fake_proc(44, b"smg\0", b"ROUTER_KEY=\0");
        netns(d3.path(), 44, 4026531840);
        src.proc = ProcFs::new(d3.path());
        let own = |n: &str| (n == "ROUTER_KEY").then(|| "own-env-key-51c7".to_string());
        match lookup(&router(44), &src, &own) {
            Lookup::Found(k, from) => {
                assert_eq!(k.bearer(), "Bearer own-env-key-51c7");
                assert_eq!(from, "$ROUTER_KEY of wedgewatch");
            }
            Lookup::None(why) => panic!("{why}"),
        }
        let mut url = router(44);
        url.labels.insert(
            crate::model::topology::labels::LABEL_FOUND_BY.into(),
            "--url".into(),
        );
        assert!(matches!(lookup(&url, &src, &own), Lookup::None(_)));
    }
}
