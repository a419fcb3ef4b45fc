//! Connections made by a caller-supplied [`Connector`] instead of tokio's `connect`.
//!
//! Entering a network namespace is a property of a thread, not of a tokio task, so a
//! connector is a plain blocking function returning a connected `std::net::TcpStream`, run
//! on a detached thread (like `resolve`) so a hanging one cannot outlive the connect timeout
//! nor hold the runtime at exit. The stream is then handed to tokio.

use super::Failure;
use crate::model::FetchOutcome;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;

/// Connects to an already resolved address within the given time, blocking. Called on a
/// thread of its own; the result is discarded if the connect timeout passed first.
pub type Connector =
    Arc<dyn Fn(SocketAddr, Duration) -> io::Result<std::net::TcpStream> + Send + Sync>;

/// Connects to `sa` through `connector` within `within`.
pub(super) async fn via(
    connector: &Connector,
    sa: SocketAddr,
    within: Duration,
) -> Result<TcpStream, Failure> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let connector = Arc::clone(connector);
    let spawned = std::thread::Builder::new()
        .name("ww-connect".into())
        .spawn(move || {
            // The receiver is gone when the deadline passed: the stream is dropped (closed).
            let _ = tx.send(connector(sa, within));
        });
    if let Err(e) = spawned {
        return Err((
            FetchOutcome::Error,
            format!("connect to {sa}: no thread: {e}"),
        ));
    }
    let connected = match tokio::time::timeout(within, rx).await {
        Err(_) => {
            return Err((
                FetchOutcome::Timeout,
                format!("connect to {sa} timed out after {} ms", within.as_millis()),
            ))
        }
        Ok(Err(_)) => {
            return Err((
                FetchOutcome::Error,
                format!("connect to {sa}: connector died"),
            ))
        }
        Ok(Ok(r)) => r,
    };
    let std_stream = match connected {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            return Err((FetchOutcome::Refused, format!("connect to {sa}: {e}")))
        }
        Err(e) => return Err((FetchOutcome::Error, format!("connect to {sa}: {e}"))),
    };
    std_stream
        .set_nonblocking(true)
        .and_then(|()| TcpStream::from_std(std_stream))
        .map_err(|e| (FetchOutcome::Error, format!("connect to {sa}: {e}")))
}
