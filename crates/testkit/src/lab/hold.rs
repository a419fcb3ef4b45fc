//! Who may run a stack beside whom.
//!
//! A test whose wedgewatch watches only its own lab (`--within` the lab's keeper) runs beside
//! any other such test: it holds the machine's stacks [`shared`]. A test whose wedgewatch
//! discovers every stack on the machine holds them [`exclusive`]ly: it waits until no other
//! test file's test holds them, in this process or another (a lock file), and the tests of
//! its own file run side by side with it (they were written to, each asserting on its own
//! lab's pids). A panicking holder still releases.

use std::cell::Cell;
use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::sync::{Condvar, Mutex};

/// Who holds the stacks in this process.
enum Holders {
    Free,
    /// Tests that watch their own lab only; the lock file held shared.
    Shared(usize),
    /// The tests of one file that watch every stack; the lock file held exclusively.
    File(&'static str, usize),
}

struct State {
    holders: Holders,
    /// The lock file while anything is held (other test binaries: the real tiers, benches).
    lock: Option<File>,
}

static STATE: Mutex<State> = Mutex::new(State {
    holders: Holders::Free,
    lock: None,
});
static RELEASED: Condvar = Condvar::new();

thread_local! {
    /// Holds taken by this thread and not dropped yet: a test that holds the stacks and
    /// takes them again (its lab's `up`, a helper's) is not made to wait for itself.
    static TAKEN_HERE: Cell<usize> = const { Cell::new(0) };
}

/// The machine's stacks, held; dropping it lets waiting tests start.
#[must_use = "the stacks are held only while the guard lives"]
pub struct Hold(());

/// Holds the machine's stacks for a test whose wedgewatch watches only its own lab.
#[track_caller]
pub fn shared() -> Hold {
    take(std::panic::Location::caller().file(), false)
}

/// Holds the machine's stacks for the calling file's tests alone: a test whose wedgewatch
/// discovers every stack on the machine takes it first (`let _lab = lab::exclusive();`).
#[track_caller]
pub fn exclusive() -> Hold {
    take(std::panic::Location::caller().file(), true)
}

/// Waits until `file`'s test may hold the stacks, then holds them.
pub(super) fn take(file: &'static str, alone: bool) -> Hold {
    let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let again = TAKEN_HERE.with(Cell::get) > 0;
    TAKEN_HERE.with(|n| n.set(n.get() + 1));
    loop {
        let next = match (&state.holders, alone) {
            (Holders::Shared(n), _) if again => Some(Holders::Shared(n + 1)),
            (Holders::File(f, n), _) if again => Some(Holders::File(f, n + 1)),
            (Holders::Free, false) => Some(Holders::Shared(1)),
            (Holders::Free, true) => Some(Holders::File(file, 1)),
            (Holders::Shared(n), false) => Some(Holders::Shared(n + 1)),
            // a test of the file that holds them alone, taking them again (its lab's `up`)
            (Holders::File(f, n), _) if *f == file => Some(Holders::File(f, n + 1)),
            _ => None,
        };
        if let Some(next) = next {
            if matches!(state.holders, Holders::Free) {
                state.lock = lock_file(alone);
            }
            state.holders = next;
            return Hold(());
        }
        state = RELEASED.wait(state).unwrap_or_else(|p| p.into_inner());
    }
}

/// The machine-wide lock file, locked shared or exclusively (blocking); None when it
/// cannot be opened (then only this process's tests are kept apart).
fn lock_file(alone: bool) -> Option<File> {
    // this module's own tests keep to their process
    let name = if cfg!(test) {
        format!("wedgewatch-test-stacks-{}.lock", std::process::id())
    } else {
        "wedgewatch-test-stacks.lock".to_string()
    };
    let path = std::env::temp_dir().join(name);
    // a shared temporary directory: a link planted under the name is not followed
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(&path)
        .map_err(|e| eprintln!("lab: cannot open {}: {e}", path.display()))
        .ok()?;
    let locked = if alone {
        file.lock()
    } else {
        file.lock_shared()
    };
    match locked {
        Ok(()) => Some(file),
        Err(e) => {
            eprintln!("lab: cannot lock {}: {e}", path.display());
            None
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        TAKEN_HERE.with(|n| n.set(n.get().saturating_sub(1)));
        let mut state = STATE.lock().unwrap_or_else(|p| p.into_inner());
        let left = match &mut state.holders {
            Holders::Shared(n) | Holders::File(_, n) => {
                *n = n.saturating_sub(1);
                *n
            }
            Holders::Free => 0,
        };
        if left == 0 {
            state.holders = Holders::Free;
            state.lock = None;
            RELEASED.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::take;
    use std::sync::mpsc;
    use std::time::Duration;

    /// Another file's tests wait for the stacks; the same file's do not, even while held.
    #[test]
    fn files_wait_for_each_other_and_a_files_tests_do_not() {
        let a = take("a.rs", true);
        let again = take("a.rs", false);
        let (tx, rx) = mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let _b = take("b.rs", true);
            // taken again by the same test, through a helper in another file
            let _again = take("helper.rs", false);
            tx.send(()).expect("send");
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "b ran beside a"
        );
        drop(a);
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "b ran beside a"
        );
        drop(again);
        rx.recv_timeout(Duration::from_secs(30))
            .expect("b runs once a is done");
        waiter.join().expect("waiter");
    }

    /// Tests that watch their own lab run side by side; one that watches every stack waits
    /// for them, and they for it.
    #[test]
    fn shared_holders_run_together_and_apart_from_an_exclusive_one() {
        let s1 = take("s1.rs", false);
        let s2 = take("s2.rs", false);
        let (tx, rx) = mpsc::channel();
        let (release, released) = mpsc::channel::<()>();
        let waiter = std::thread::spawn(move || {
            let _x = take("x.rs", true);
            tx.send(()).expect("send");
            let _ = released.recv();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "an exclusive holder ran beside shared ones"
        );
        drop((s1, s2));
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the exclusive holder runs once the shared ones are done");
        let (tx, rx) = mpsc::channel();
        let shared = std::thread::spawn(move || {
            let _s = take("s3.rs", false);
            tx.send(()).expect("send");
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(300)).is_err(),
            "a shared holder ran beside an exclusive one"
        );
        release.send(()).expect("release");
        waiter.join().expect("waiter");
        rx.recv_timeout(Duration::from_secs(30))
            .expect("the shared holder runs after");
        shared.join().expect("shared");
    }

    /// A test that panics while holding the stacks still lets the next file's tests run.
    #[test]
    fn a_panicking_holder_releases() {
        let panicked = std::thread::spawn(|| {
            let _c = take("c.rs", true);
            panic!("the test failed");
        })
        .join();
        assert!(panicked.is_err());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _d = take("d.rs", true);
            tx.send(()).expect("send");
        });
        rx.recv_timeout(Duration::from_secs(30))
            .expect("d runs after c panicked");
    }
}
