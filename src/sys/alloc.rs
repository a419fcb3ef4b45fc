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

/// Gives the heap's free pages back to the kernel (glibc's `malloc_trim`). Memory freed in
/// the middle of an arena stays resident until then: the daemon builds and drops a view and
/// a socket table every second, and on the big lab its RSS held tens of MiB of such free
/// pages. Returns whether anything was released. A no-op where the C library is not glibc.
pub fn release_free_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists under its locks.
    unsafe {
        libc::malloc_trim(0) == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    #[test]
    fn free_pages_in_the_middle_of_the_heap_are_released() {
        // 32 MiB in 16 KiB blocks, every other one freed: holes of whole pages that free()
        // alone keeps resident (only the heap's top is returned by itself).
        let mut blocks: Vec<Option<Vec<u8>>> =
            (0..2048).map(|_| Some(vec![1u8; 16 * 1024])).collect();
        for b in blocks.iter_mut().step_by(2) {
            *b = None;
        }
        assert!(release_free_memory(), "nothing released");
        drop(blocks);
    }
}
