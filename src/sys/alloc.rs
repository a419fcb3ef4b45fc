//! The allocator's per-thread arenas. glibc gives every thread that allocates its own arena
//! (up to 8 per core), and each keeps what it freed: on the big lab a quarter of the daemon's
//! RSS was arenas of its sampling threads holding freed socket tables (docs/performance.md,
//! "The daemon's memory and its recording on the big lab"). Two arenas keep the locking
//! cheap for our few busy threads and that memory bounded.

/// Arenas the process may create (glibc's `M_ARENA_MAX`).
pub const ARENAS: i32 = 2;

/// Caps the allocator's arenas at [`ARENAS`]. Called first thing in `main`, before any thread
/// exists (an arena already made stays). `MALLOC_ARENA_MAX` in the environment wins: the
/// operator's word. A no-op where the C library is not glibc.
pub fn limit_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_some() {
        return;
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; no thread allocates concurrently
    // this early, and a refusal (return 0) leaves the default in place.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}
