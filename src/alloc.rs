//! The binary's allocator: jemalloc (`src/main.rs` installs it), and the options it runs with.
//!
//! Why: the daemon drops a socket table, a view and a recording delta every few seconds
//! beside a long-lived history of small strings, and glibc's consolidation of the fragments
//! grew to a third of its CPU (docs/performance-log.md, "jemalloc").
//!
//! The library itself allocates through whatever its user installs; tests run on the system
//! allocator.

/// jemalloc's options for the binary (`malloc_conf`, a NUL-terminated C string; see
/// jemalloc(3) "TUNING"). `_RJEM_MALLOC_CONF` in the environment is read after it and wins.
///
/// - `narenas:1`: the daemon's few threads are rarely busy; more arenas kept more partly used
///   pages resident for the same CPU (docs/performance-log.md, "jemalloc").
/// - `dirty_decay_ms:1000`, `muzzy_decay_ms:0`: freed pages go back to the kernel within
///   about a second (default 10 s), so a transient view or socket table does not stay in RSS.
pub const JEMALLOC_CONF: &[u8] = b"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

#[cfg(test)]
mod tests {
    #[test]
    fn the_options_are_one_c_string() {
        let (last, rest) = super::JEMALLOC_CONF.split_last().expect("not empty");
        assert_eq!(*last, 0, "NUL-terminated");
        assert!(!rest.contains(&0), "no NUL inside");
        let text = std::str::from_utf8(rest).expect("ASCII");
        for opt in text.split(',') {
            let (k, v) = opt.split_once(':').expect("key:value");
            assert!(!k.is_empty() && !v.is_empty(), "{opt}");
        }
    }
}
