//! Blocking reads under a deadline, on threads nobody waits for: `/proc/PID/{cmdline,environ,
//! maps}` block while the target holds its mmap lock, maybe forever. The caller waits at most
//! its deadline; a path still blocked is not read again until that read returns, so a stuck
//! process costs one thread, not one a tick.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// At most this many threads one [`map`] call leaves blocked before it gives up on the rest.
const MAX_STUCK_PER_CALL: usize = 8;

/// Paths whose read has not returned yet, and since when.
static STUCK: Mutex<BTreeMap<PathBuf, Instant>> = Mutex::new(BTreeMap::new());

fn stuck() -> MutexGuard<'static, BTreeMap<PathBuf, Instant>> {
    STUCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why `path` was not read: still blocked since an earlier call, or None.
pub fn still_blocked(path: &Path) -> Option<String> {
    let since = *stuck().get(path)?;
    Some(format!(
        "still blocked reading {} (for {} ms; not read again until it returns)",
        path.display(),
        since.elapsed().as_millis()
    ))
}

fn timed_out(path: &Path, after: Duration) -> String {
    format!(
        "timed out reading {} after {} ms (the process may hold its memory lock)",
        path.display(),
        after.as_millis()
    )
}

/// Runs `f` (which reads `path`) on a detached thread; waits at most `timeout`.
pub fn call<T, F>(path: &Path, timeout: Duration, f: F) -> Result<T, String>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if let Some(r) = still_blocked(path) {
        return Err(r);
    }
    let (tx, rx) = mpsc::channel();
    let returned = Arc::new(AtomicBool::new(false));
    let (key, back) = (path.to_path_buf(), Arc::clone(&returned));
    let spawned = std::thread::Builder::new()
        .name("wedgewatch-read".into())
        .spawn(move || {
            let out = f();
            // Under the registry's lock, so the caller cannot mark it stuck after this.
            let mut g = stuck();
            back.store(true, Ordering::SeqCst);
            g.remove(&key);
            drop(g);
            let _ = tx.send(out);
        });
    if let Err(e) = spawned {
        return Err(format!("cannot start a reader thread: {e}"));
    }
    let started = Instant::now();
    rx.recv_timeout(timeout).map_err(|_| {
        let mut g = stuck();
        if !returned.load(Ordering::SeqCst) {
            g.insert(path.to_path_buf(), started);
        }
        timed_out(path, timeout)
    })
}

/// Items still to read, shared by the workers of one [`map`] call.
struct Queue<I, F> {
    items: Mutex<VecDeque<(usize, PathBuf, I)>>,
    f: F,
    /// The caller returned: take no further item.
    done: AtomicBool,
}

/// What a worker is reading now, and since when.
type Current = Arc<Mutex<Option<(usize, Instant)>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn start_worker<I, T, F>(q: &Arc<Queue<I, F>>, tx: &mpsc::Sender<(usize, T)>) -> Option<Current>
where
    I: Send + 'static,
    T: Send + 'static,
    F: Fn(&I) -> T + Send + Sync + 'static,
{
    let current: Current = Arc::new(Mutex::new(None));
    let (q, tx, cur) = (Arc::clone(q), tx.clone(), Arc::clone(&current));
    std::thread::Builder::new()
        .name("wedgewatch-read".into())
        .spawn(move || loop {
            if q.done.load(Ordering::SeqCst) {
                break;
            }
            let Some((i, key, item)) = lock(&q.items).pop_front() else {
                break;
            };
            *lock(&cur) = Some((i, Instant::now()));
            let out = (q.f)(&item);
            // Under the registry's lock, so the caller cannot mark it stuck after this.
            let mut g = stuck();
            *lock(&cur) = None;
            g.remove(&key);
            drop(g);
            if tx.send((i, out)).is_err() {
                break;
            }
        })
        .ok()
        .map(|_| current)
}

/// The results of one [`map`] call as they come in.
struct Tally<T> {
    results: Vec<Option<Result<T, String>>>,
    paths: Vec<PathBuf>,
    /// Items without a result yet.
    left: usize,
    /// Items given up on (each left a thread behind).
    gave_up: usize,
}

impl<T> Tally<T> {
    fn set(&mut self, i: usize, r: Result<T, String>) {
        if self.results[i].is_none() {
            self.results[i] = Some(r);
            self.left -= 1;
        }
    }

    /// Fails the item of each worker that has been on it for `per_item` or more, and marks
    /// its path blocked. True when some worker can still take the next item.
    fn give_up_stuck(&mut self, workers: &[Current], per_item: Duration) -> bool {
        let mut live = false;
        for w in workers {
            let mut g = stuck();
            match *lock(w) {
                Some((i, since)) if since.elapsed() >= per_item => {
                    if self.results[i].is_none() {
                        g.insert(self.paths[i].clone(), since);
                        self.set(i, Err(timed_out(&self.paths[i], per_item)));
                        self.gave_up += 1;
                    }
                }
                _ => live = true,
            }
        }
        live
    }

    fn finish(self, total: Duration) -> Vec<Result<T, String>> {
        let not_read = |p: &Path| {
            let ms = total.as_millis();
            format!("not read: {ms} ms were up before {} was", p.display())
        };
        let paths = self.paths;
        self.results
            .into_iter()
            .zip(&paths)
            .map(|(r, p)| r.unwrap_or_else(|| Err(not_read(p))))
            .collect()
    }
}

/// Applies `f` to every item (`path` names what it reads), one after another on a detached
/// thread. An item whose read exceeds `per_item` is given up ("timed out reading PATH") and
/// the rest continue on a fresh thread; whatever is not read when `total` has passed is
/// "not read". Results come back in item order.
pub fn map<I, T, F>(
    items: Vec<(PathBuf, I)>,
    per_item: Duration,
    total: Duration,
    f: F,
) -> Vec<Result<T, String>>
where
    I: Send + 'static,
    T: Send + 'static,
    F: Fn(&I) -> T + Send + Sync + 'static,
{
    let started = Instant::now();
    let mut tally = Tally {
        results: Vec::with_capacity(items.len()),
        paths: Vec::with_capacity(items.len()),
        left: 0,
        gave_up: 0,
    };
    let mut queue = VecDeque::new();
    for (i, (path, item)) in items.into_iter().enumerate() {
        let blocked = still_blocked(&path);
        if blocked.is_none() {
            queue.push_back((i, path.clone(), item));
            tally.left += 1;
        }
        tally.results.push(blocked.map(Err));
        tally.paths.push(path);
    }
    let q = Arc::new(Queue {
        items: Mutex::new(queue),
        f,
        done: AtomicBool::new(false),
    });
    let (tx, rx) = mpsc::channel();
    let mut workers: Vec<Current> = Vec::new();
    while tally.left > 0 && started.elapsed() < total {
        let live = tally.give_up_stuck(&workers, per_item);
        let queued = !lock(&q.items).is_empty();
        if !live && queued && tally.gave_up < MAX_STUCK_PER_CALL {
            match start_worker(&q, &tx) {
                Some(w) => workers.push(w),
                None => break,
            }
        }
        if let Ok((i, out)) = rx.recv_timeout(per_item.min(Duration::from_millis(50))) {
            tally.set(i, Ok(out));
        }
    }
    q.done.store(true, Ordering::SeqCst);
    tally.finish(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A FIFO nobody writes to: opening it for reading blocks forever, like a /proc read
    /// behind a held mmap lock.
    fn fifo(dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        p
    }

    #[test]
    fn a_blocked_read_times_out_and_the_others_are_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let ok1 = dir.path().join("ok1");
        std::fs::write(&ok1, "one").unwrap();
        let ok2 = dir.path().join("ok2");
        std::fs::write(&ok2, "two").unwrap();
        let blocked = fifo(dir.path(), "blocked");
        let items = vec![
            (ok1.clone(), ok1),
            (blocked.clone(), blocked.clone()),
            (ok2.clone(), ok2),
        ];
        let read = |p: &PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        let t0 = Instant::now();
        let out = map(
            items.clone(),
            Duration::from_millis(200),
            Duration::from_secs(20),
            read,
        );
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        assert_eq!(out[0].as_deref(), Ok("one"));
        assert!(out[1].as_ref().unwrap_err().contains("timed out reading"));
        assert_eq!(out[2].as_deref(), Ok("two"));
        // Not read again while still blocked: no second thread, an immediate answer.
        let out = map(
            items,
            Duration::from_secs(30),
            Duration::from_secs(30),
            read,
        );
        assert!(out[1].as_ref().unwrap_err().contains("still blocked"));
        let r = call(&blocked, Duration::from_secs(30), || ());
        assert!(r.unwrap_err().contains("still blocked"));
        // Unblock the reader: it returns, and the path is readable again.
        let w = std::fs::OpenOptions::new()
            .write(true)
            .open(&blocked)
            .unwrap();
        drop(w);
        let deadline = Instant::now() + Duration::from_secs(20);
        while still_blocked(&blocked).is_some() {
            assert!(Instant::now() < deadline, "the reader never came back");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn call_times_out_on_a_blocked_read() {
        let dir = tempfile::tempdir().unwrap();
        let blocked = fifo(dir.path(), "b");
        let p = blocked.clone();
        let r = call(&blocked, Duration::from_millis(100), move || {
            std::fs::read(&p).map(|v| v.len()).ok()
        });
        assert!(r.unwrap_err().contains("timed out reading"));
        assert!(call(dir.path(), Duration::from_secs(20), || 7).is_ok_and(|v| v == 7));
        drop(std::fs::OpenOptions::new().write(true).open(&blocked));
    }
}
