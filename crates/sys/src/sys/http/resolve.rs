//! Name resolution with a deadline, on a thread nobody waits for: `getaddrinfo` cannot be
//! cancelled, and a runtime waits for its blocking pool at shutdown. An IP literal needs no
//! lookup; a name is resolved on a detached thread, abandoned at the deadline. At most
//! [`MAX_PENDING`] lookups run at once, so a hanging resolver cannot pile up threads.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// A resolver: `host:port` -> addresses. The system one is [`system`]; tests pass fakes.
pub type Resolver = fn(&str) -> io::Result<Vec<SocketAddr>>;

/// Lookups allowed to run (or hang) at once.
pub const MAX_PENDING: usize = 16;

static PENDING: AtomicUsize = AtomicUsize::new(0);

/// The system resolver (`getaddrinfo`).
pub fn system(authority: &str) -> io::Result<Vec<SocketAddr>> {
    Ok(authority.to_socket_addrs()?.collect())
}

/// Resolves `authority` (`host:port`, IPv6 in brackets) within `within`; an error says why.
pub async fn resolve(
    authority: &str,
    within: Duration,
    resolver: Resolver,
) -> Result<Vec<SocketAddr>, String> {
    if let Ok(sa) = authority.parse::<SocketAddr>() {
        return Ok(vec![sa]);
    }
    if PENDING.fetch_add(1, Ordering::SeqCst) >= MAX_PENDING {
        PENDING.fetch_sub(1, Ordering::SeqCst);
        return Err(format!(
            "resolve {authority}: {MAX_PENDING} lookups already pending"
        ));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let name = authority.to_string();
    let spawned = std::thread::Builder::new()
        .name("ww-resolve".into())
        .spawn(move || {
            let r = resolver(&name);
            PENDING.fetch_sub(1, Ordering::SeqCst);
            // The receiver is gone when the deadline passed: nothing to do.
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        PENDING.fetch_sub(1, Ordering::SeqCst);
        return Err(format!("resolve {authority}: no thread: {e}"));
    }
    match tokio::time::timeout(within, rx).await {
        Err(_) => Err(format!(
            "resolve {authority}: no answer within {} ms",
            within.as_millis()
        )),
        Ok(Err(_)) => Err(format!("resolve {authority}: resolver thread died")),
        Ok(Ok(Err(e))) => Err(format!("resolve {authority}: {e}")),
        Ok(Ok(Ok(v))) if v.is_empty() => Err(format!("resolve {authority}: no address")),
        Ok(Ok(Ok(v))) => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Hangs past the bound the tests assert (nobody waits for its thread).
    fn hangs(_: &str) -> io::Result<Vec<SocketAddr>> {
        std::thread::sleep(Duration::from_secs(15));
        Err(io::Error::other("late"))
    }

    #[tokio::test]
    async fn literals_skip_the_resolver_and_hangs_are_abandoned() {
        let t = Instant::now();
        let lit = resolve("127.0.0.1:80", Duration::from_millis(50), hangs).await;
        assert_eq!(lit, Ok(vec!["127.0.0.1:80".parse().unwrap()]));
        let lit6 = resolve("[::1]:80", Duration::from_millis(50), hangs).await;
        assert!(lit6.is_ok());
        let hung = resolve("slow.invalid:80", Duration::from_millis(100), hangs).await;
        assert!(hung.unwrap_err().contains("no answer within 100 ms"));
        let bound = wedgewatch_model::clock::test_bound(Duration::from_millis(200));
        assert!(t.elapsed() < bound, "{:?}", t.elapsed());
    }
}
