//! The HTTP client one worker forwards queries with, also used by the `query` command and the
//! query benchmark.

use axum::http::{HeaderMap, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Header marking a request one worker forwarded to another.
pub const FORWARDED_BY: &str = "x-eddy-forwarded-by";
/// How long a forwarded request may take before the caller is told to retry.
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);
pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// An HTTP/1 client for forwarding (and for the `query` command).
pub fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(2)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// GET `url`: the status and body, or why there was none.
pub async fn fetch(
    client: &HttpClient,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    let mut req = hyper::Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Empty::new()).map_err(|e| e.to_string())?;
    let call = async {
        let res = client.request(req).await.map_err(|e| format!("{e:?}"))?;
        let (parts, body) = res.into_parts();
        let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((parts.status, parts.headers, body))
    };
    tokio::time::timeout(FORWARD_TIMEOUT, call)
        .await
        .map_err(|_| format!("no answer within {} s", FORWARD_TIMEOUT.as_secs()))?
}
