//! How the worker serves HTTP (`/metrics` and probes, the query API): one connection per
//! task, within bounds that hold below the request, where the handlers' own limits (in-flight
//! permits, timeouts) cannot reach.
//!
//! - At most [`MAX_CONNECTIONS`] connections at once; one more is closed as it is accepted,
//!   so a flood of idle or slow connections costs a bounded number of sockets and tasks.
//! - A request's head must arrive within [`HEADER_READ_TIMEOUT`], and so must the next one on
//!   a kept-alive connection: a client sending its headers a byte at a time, or holding a
//!   connection open doing nothing, is cut off.
//! - A request's head is at most [`MAX_HEAD_BYTES`] (hyper's read buffer): a longer one is
//!   refused before any handler runs.
//! - A connection lives at most [`MAX_CONNECTION_LIFETIME`]: then it finishes the request in
//!   hand (for up to [`CLOSE_GRACE`]) and closes, so a client that never reads its answer
//!   does not hold its place for good.

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

pub const MAX_CONNECTIONS: usize = 512;
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
pub const MAX_HEAD_BYTES: usize = 64 << 10;
pub const MAX_CONNECTION_LIFETIME: Duration = Duration::from_secs(60);
pub const CLOSE_GRACE: Duration = Duration::from_secs(10);

/// Serve `app` on `listener` until the runtime stops (`what` names it in logs).
pub async fn serve(listener: TcpListener, app: Router, what: &'static str) {
    serve_with(listener, app, what, MAX_CONNECTIONS, HEADER_READ_TIMEOUT).await
}

/// [`serve`] with other bounds (the tests use small ones).
pub async fn serve_with(
    listener: TcpListener,
    app: Router,
    what: &'static str,
    max_connections: usize,
    header_read_timeout: Duration,
) {
    let open = Arc::new(Semaphore::new(max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, or a connection reset before it was accepted: go
                // on after a breath instead of spinning.
                tracing::warn!("{what} server: accepting a connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::debug!("{what} server: {max_connections} connections open, closing one more");
            continue;
        };
        // Answers go out at once: without it, an answer written after a forwarded one waits
        // for the peer's delayed ACK (up to 40 ms).
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            let mut connection = std::pin::pin!(connection);
            let ended = tokio::select! {
                r = connection.as_mut() => Some(r),
                () = tokio::time::sleep(MAX_CONNECTION_LIFETIME) => {
                    connection.as_mut().graceful_shutdown();
                    tokio::time::timeout(CLOSE_GRACE, connection.as_mut()).await.ok()
                }
            };
            if let Some(Err(e)) = ended {
                tracing::debug!("{what} server: connection ended: {e}");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use std::time::Instant;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn start(max_connections: usize, timeout: Duration) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address").to_string();
        let app = Router::new().route("/", get(|| async { "hello" }));
        tokio::spawn(serve_with(listener, app, "test", max_connections, timeout));
        address
    }

    /// Everything the server sends until it closes the connection (or `within` passes).
    async fn read_all(conn: &mut TcpStream, within: Duration) -> Option<String> {
        let mut all = Vec::new();
        tokio::time::timeout(within, conn.read_to_end(&mut all))
            .await
            .ok()
            .map(|_| String::from_utf8_lossy(&all).into_owned())
    }

    #[tokio::test]
    async fn a_client_sending_its_headers_a_byte_at_a_time_is_cut_off() {
        let address = start(8, Duration::from_millis(300)).await;
        let mut conn = TcpStream::connect(&address).await.expect("connect");
        let started = Instant::now();
        let head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
        let mut cut = false;
        for b in head {
            if conn.write_all(&[*b]).await.is_err() {
                cut = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            if started.elapsed() > Duration::from_secs(5) {
                break;
            }
        }
        // Cut off mid-head (a write failed), or the server closed without answering.
        let rest = read_all(&mut conn, Duration::from_secs(5)).await;
        assert!(
            cut || rest.as_deref().is_some_and(|r| !r.contains("hello")),
            "the slow client was answered: {rest:?}"
        );
        // A prompt client is still answered.
        let mut ok = TcpStream::connect(&address).await.expect("connect");
        ok.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let answer = read_all(&mut ok, Duration::from_secs(5)).await;
        assert!(answer.is_some_and(|a| a.ends_with("hello")));
    }

    #[tokio::test]
    async fn an_idle_kept_alive_connection_is_closed() {
        let address = start(8, Duration::from_millis(300)).await;
        let mut conn = TcpStream::connect(&address).await.expect("connect");
        conn.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        // The answer, then nothing from us: the server closes within its header timeout.
        let all = read_all(&mut conn, Duration::from_secs(5)).await;
        assert!(
            all.as_deref().is_some_and(|a| a.contains("hello")),
            "the connection was not closed after its idle time: {all:?}"
        );
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed_and_the_cap_frees_up() {
        let address = start(2, Duration::from_secs(2)).await;
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(TcpStream::connect(&address).await.expect("connect"));
        }
        // Let the server take both in before the third arrives.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let mut third = TcpStream::connect(&address).await.expect("connect");
        let _ = third.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").await;
        let refused = read_all(&mut third, Duration::from_secs(5)).await;
        assert_eq!(refused.as_deref(), Some(""), "beyond the cap: {refused:?}");
        drop(idle);
        let mut answered = None;
        for _ in 0..50 {
            let mut conn = TcpStream::connect(&address).await.expect("connect");
            let _ = conn.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").await;
            answered = read_all(&mut conn, Duration::from_secs(5)).await;
            if answered.as_deref().is_some_and(|a| a.ends_with("hello")) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            answered.as_deref().is_some_and(|a| a.ends_with("hello")),
            "{answered:?}"
        );
    }
}
