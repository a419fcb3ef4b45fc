//! Stopping a daemon the benches started: SIGTERM (its clean stop), then SIGKILL after 10 s,
//! and reaped either way. Shared by the bench binaries (`#[path]`-included).

// rusage and clock_gettime through libc, which std does not wrap.
#![allow(unsafe_code)]

use std::process::Child;
use std::time::{Duration, Instant};

pub fn stop_child(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
    }
    let _ = child.wait();
}
