//! The HTTP client one worker forwards queries with, also used by the `query` command and the
//! query benchmark.

use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Header marking a request one worker forwarded to another.
pub const FORWARDED_BY: &str = "x-eddy-forwarded-by";
/// How long a forwarded request may take before the caller is told to retry.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read from another worker (or by the `query` command): a page of 1000
/// entries of large values may need more, and then says to ask for fewer (`limit`). Without a
/// bound, a peer sending an endless body would fill this worker's memory.
pub const MAX_ANSWER_BYTES: usize = 32 << 20;
pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// An HTTP/1 client for forwarding (and for the `query` command).
pub fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    Client::builder(TokioExecutor::new())
        // Below the servers' idle cut-off (`server::HEADER_READ_TIMEOUT`): a pooled connection
        // is never one the peer is closing.
        .pool_idle_timeout(Duration::from_secs(5))
        .build(connector)
}

/// Why a GET got no whole answer.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0}")]
    Failed(String),
    #[error("no answer within {} s", FORWARD_TIMEOUT.as_secs())]
    Timeout,
    #[error("the answer is larger than {} MiB: ask for fewer entries (limit)", MAX_ANSWER_BYTES >> 20)]
    TooLarge,
}

/// GET `url`: the status and body (at most [`MAX_ANSWER_BYTES`]), or why there was none.
pub async fn fetch(
    client: &HttpClient,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<(StatusCode, HeaderMap, Bytes), FetchError> {
    let mut req = hyper::Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Empty::new())
        .map_err(|e| FetchError::Failed(e.to_string()))?;
    let call = async {
        let res = client
            .request(req)
            .await
            .map_err(|e| FetchError::Failed(format!("{e:?}")))?;
        let (parts, body) = res.into_parts();
        let body = Limited::new(body, MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|e| match e.downcast::<LengthLimitError>() {
                Ok(_) => FetchError::TooLarge,
                Err(e) => FetchError::Failed(e.to_string()),
            })?
            .to_bytes();
        Ok((parts.status, parts.headers, body))
    };
    tokio::time::timeout(FORWARD_TIMEOUT, call)
        .await
        .map_err(|_| FetchError::Timeout)?
}
