//! Who may query: Kubernetes RBAC. A request carries a bearer token the cluster's API server
//! accepts (a ServiceAccount's, a user's); the worker asks the API server, as the token's
//! holder, whether it may `get` the `statefulstreamapps/query` subresource of this app (a
//! SelfSubjectAccessReview), and keeps the answer a few seconds. The workers need no right of
//! their own to judge tokens (a TokenReview would need a ClusterRoleBinding per app), and
//! every kind of token the API server accepts works. Workers forwarding to each other send
//! their own ServiceAccount token ([`OwnToken`]), which their Role allows, whether they check
//! tokens themselves or not (during a rolling update the peer may). docs/queries.md, "Who may
//! query".

use super::params::Problem;
use crate::metrics::{Metrics, ReasonLabels, ResultLabels};
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use secrecy::ExposeSecret as _;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The subresource a query client must be allowed to `get` on the app.
pub const QUERY_SUBRESOURCE: &str = "query";
/// How long an answer of the API server is kept (allowed, denied or not a valid token), as
/// the API server's own webhook authorizers keep theirs. A valid token's answer past it is
/// asked again by the next request with it, while the others go on with the old answer
/// for at most as long again: a revoked right stops working within 10 s, 20 s at most.
pub const DECISION_TTL: Duration = Duration::from_secs(10);
/// Tokens whose answers are kept at once, of valid tokens and of invalid ones apart: a flood
/// of forged tokens evicts only forged ones, and nothing grows.
pub const MAX_CACHED: usize = 4096;
/// Reviews in flight to the API server at once from one worker, so a flood of fresh tokens
/// does not become one on the API server.
pub const MAX_REVIEWS: usize = 4;
/// Requests waiting for a review at once; more get a 503 at once instead of holding a slot
/// of the query API (a flood of forged tokens would otherwise crowd out valid callers).
pub const MAX_WAITING: usize = 32;
/// The longest a token may be (Kubernetes' are about 1 KiB, OIDC ones a few).
pub const MAX_TOKEN_BYTES: usize = 16 << 10;
/// How long the API server gets to answer one review before the caller is told to retry.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// How often this worker's own token is read again from its file (the kubelet rotates it).
const OWN_TOKEN_REFRESH: Duration = Duration::from_secs(60);

/// Whether queries need a credential.
#[derive(Clone)]
pub enum Access {
    /// Anyone who reaches the port (`spec.queries.anonymous`, or a standalone worker on
    /// loopback).
    Anonymous,
    Kubernetes(Arc<Reviewer>),
}

/// What the API server said of a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// A valid token without the right, and the API server's reason if it gave one.
    Denied(String),
    /// Not a token the API server accepts (or expired).
    Unauthenticated,
}

#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("the Kubernetes API did not answer in time")]
    Timeout,
    #[error("this worker is checking {MAX_WAITING} other tokens already")]
    Busy,
    #[error("the review of this token, asked by another request, failed")]
    Failed,
    #[error("asking the Kubernetes API: {0}")]
    Api(#[source] kube::Error),
    #[error("writing the review request: {0}")]
    Encode(serde_json::Error),
    #[error("writing the review request: {0}")]
    Http(axum::http::Error),
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("making a Kubernetes client without credentials: {0}")]
    Client(#[source] kube::Error),
}

/// Judges tokens for one app through the API server, and holds this worker's own token.
pub struct Reviewer {
    /// A client of the API server with no credentials of its own: each review carries the
    /// caller's token.
    api: kube::Client,
    namespace: String,
    app: String,
    /// Answers about valid tokens (allowed or denied).
    valid: Mutex<HashMap<[u8; 32], (Decision, Instant)>>,
    /// Tokens the API server did not accept.
    invalid: Mutex<HashMap<[u8; 32], Instant>>,
    /// Tokens being reviewed: requests with the same token wait for that one review (a hot
    /// token's first requests, or its refresh, make one review, not one each).
    pending: Mutex<HashMap<[u8; 32], Arc<tokio::sync::Notify>>>,
    reviews: tokio::sync::Semaphore,
    waiting: AtomicUsize,
    /// How long a review may take ([`REVIEW_TIMEOUT`]).
    timeout: Duration,
    metrics: Option<Arc<Metrics>>,
}

/// A kept answer for a token.
enum Kept {
    Fresh(Decision),
    /// A valid token's answer older than [`DECISION_TTL`], younger than twice that.
    Stale(Decision),
    Missing,
}

/// Ends a token's review when dropped (also when its request is): the waiters look again.
struct Reviewing<'a> {
    pending: &'a Mutex<HashMap<[u8; 32], Arc<tokio::sync::Notify>>>,
    key: [u8; 32],
}

impl Drop for Reviewing<'_> {
    fn drop(&mut self) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = pending.remove(&self.key) {
            n.notify_waiters();
        }
    }
}

/// Counts a request waiting for a review while it lives (also when its request is dropped).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Reviewer {
    /// A reviewer for app `app` of `namespace`, reaching the API server `config` names (its
    /// credentials are dropped). Must be made on the runtime that serves the queries (its
    /// client's connections live there).
    pub fn connect(
        mut config: kube::Config,
        namespace: &str,
        app: &str,
    ) -> Result<Self, SetupError> {
        config.auth_info = Default::default();
        let api = kube::Client::try_from(config).map_err(SetupError::Client)?;
        Ok(Self::new(api, namespace, app))
    }

    fn new(api: kube::Client, namespace: &str, app: &str) -> Self {
        Self {
            api,
            namespace: namespace.into(),
            app: app.into(),
            valid: Mutex::new(HashMap::new()),
            invalid: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            reviews: tokio::sync::Semaphore::new(MAX_REVIEWS),
            waiting: AtomicUsize::new(0),
            timeout: REVIEW_TIMEOUT,
            metrics: None,
        }
    }

    /// Counts reviews, their time and refusals in `metrics` (`eddy_query_token_reviews_total`,
    /// `eddy_query_token_review_duration_seconds`, `eddy_queries_refused_total`).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn refused(&self, reason: &str) {
        if let Some(m) = &self.metrics {
            m.queries_refused
                .get_or_create(&ReasonLabels {
                    reason: reason.into(),
                })
                .inc();
        }
    }

    /// Whether `token` may query this app: the kept answer, or the API server's.
    pub async fn decide(&self, token: &str) -> Result<Decision, ReviewError> {
        let key = digest(token);
        let stale = match self.kept(&key) {
            Kept::Fresh(d) => return Ok(d),
            Kept::Stale(d) => Some(d),
            Kept::Missing => None,
        };
        // One review per token at a time: the others go on with a stale answer, or wait for it.
        let waiting_for = {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            match pending.get(&key) {
                Some(n) => Some(n.clone()),
                None => {
                    pending.insert(key, Arc::new(tokio::sync::Notify::new()));
                    None
                }
            }
        };
        if let Some(notify) = waiting_for {
            if let Some(d) = stale {
                return Ok(d);
            }
            let done = notify.notified();
            tokio::pin!(done);
            // Registered before looking again, so the review's end cannot be missed.
            done.as_mut().enable();
            if !self.is_pending(&key) {
                return self.after_review(&key);
            }
            done.await;
            return self.after_review(&key);
        }
        let _reviewing = Reviewing {
            pending: &self.pending,
            key,
        };
        let _permit = match self.reviews.try_acquire() {
            Ok(p) => p,
            Err(_) => {
                if self.waiting.fetch_add(1, Ordering::Relaxed) >= MAX_WAITING {
                    self.waiting.fetch_sub(1, Ordering::Relaxed);
                    return Err(ReviewError::Busy);
                }
                let _waiting = Waiting(&self.waiting);
                self.reviews
                    .acquire()
                    .await
                    .map_err(|_| ReviewError::Busy)?
            }
        };
        let started = Instant::now();
        let d = tokio::time::timeout(self.timeout, self.review(token))
            .await
            .map_err(|_| ReviewError::Timeout)
            .and_then(|d| d);
        if let Some(m) = &self.metrics {
            let result = match &d {
                Ok(Decision::Allowed) => "allowed",
                Ok(Decision::Denied(_)) => "denied",
                Ok(Decision::Unauthenticated) => "unauthenticated",
                Err(_) => "error",
            };
            m.query_token_reviews
                .get_or_create(&ResultLabels {
                    result: result.into(),
                })
                .inc();
            m.query_token_review_seconds
                .observe(started.elapsed().as_secs_f64());
        }
        let d = d?;
        match &d {
            Decision::Unauthenticated => keep(&self.invalid, key, Instant::now()),
            d => keep(&self.valid, key, (d.clone(), Instant::now())),
        }
        Ok(d)
    }

    fn is_pending(&self, key: &[u8; 32]) -> bool {
        let pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        pending.contains_key(key)
    }

    /// What a request that waited for another's review of its token gets.
    fn after_review(&self, key: &[u8; 32]) -> Result<Decision, ReviewError> {
        match self.kept(key) {
            Kept::Fresh(d) => Ok(d),
            _ => Err(ReviewError::Failed),
        }
    }

    fn kept(&self, key: &[u8; 32]) -> Kept {
        let valid = self.valid.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((d, at)) = valid.get(key) {
            let age = at.elapsed();
            if age < DECISION_TTL {
                return Kept::Fresh(d.clone());
            }
            if age < 2 * DECISION_TTL {
                return Kept::Stale(d.clone());
            }
        }
        drop(valid);
        let invalid = self.invalid.lock().unwrap_or_else(PoisonError::into_inner);
        match invalid.get(key) {
            Some(at) if at.elapsed() < DECISION_TTL => Kept::Fresh(Decision::Unauthenticated),
            _ => Kept::Missing,
        }
    }

    #[cfg(test)]
    fn cached(&self, key: &[u8; 32]) -> Option<Decision> {
        match self.kept(key) {
            Kept::Fresh(d) => Some(d),
            _ => None,
        }
    }

    async fn review(&self, token: &str) -> Result<Decision, ReviewError> {
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    group: Some(eddy_crds::GROUP.into()),
                    resource: Some(eddy_crds::PLURAL.into()),
                    subresource: Some(QUERY_SUBRESOURCE.into()),
                    verb: Some("get".into()),
                    namespace: Some(self.namespace.clone()),
                    name: Some(self.app.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let body = serde_json::to_vec(&review).map_err(ReviewError::Encode)?;
        let mut bearer = HeaderValue::try_from(format!("Bearer {token}"))
            .map_err(|e| ReviewError::Http(e.into()))?;
        bearer.set_sensitive(true);
        let req =
            axum::http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::AUTHORIZATION, bearer)
                .body(body)
                .map_err(ReviewError::Http)?;
        match self.api.request::<SelfSubjectAccessReview>(req).await {
            Ok(answer) => Ok(match answer.status {
                Some(s) if s.allowed && s.denied != Some(true) => Decision::Allowed,
                Some(s) => Decision::Denied(s.reason.unwrap_or_default()),
                None => Decision::Denied(String::new()),
            }),
            Err(kube::Error::Api(s)) if s.code == 401 => Ok(Decision::Unauthenticated),
            // A valid token that may not even ask about itself (no system:basic-user).
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(Decision::Denied(s.message.clone())),
            Err(e) => Err(ReviewError::Api(e)),
        }
    }

    /// What a caller lacking the right is told to do.
    fn denied(&self, reason: &str) -> String {
        let because = match reason.is_empty() {
            true => String::new(),
            false => format!(" ({})", crate::format::shorten(reason, 300)),
        };
        format!(
            "this token may not query app {}/{}{because}: it needs `get` on `statefulstreamapps/query` there, e.g. a RoleBinding in namespace {} to the chart's ClusterRole `<release name>-query` (`eddy-operator-query`) (docs/queries.md, \"Who may query\")",
            self.namespace, self.app, self.namespace
        )
    }
}

/// Keeps an answer in a cache of at most [`MAX_CACHED`]: when full, expired answers go, then
/// one other (never all: valid callers keep theirs through a flood).
fn keep<V: Stamped>(cache: &Mutex<HashMap<[u8; 32], V>>, key: [u8; 32], value: V) {
    let mut cache = cache.lock().unwrap_or_else(PoisonError::into_inner);
    if cache.len() >= MAX_CACHED && !cache.contains_key(&key) {
        cache.retain(|_, v| v.at().elapsed() < DECISION_TTL);
        if cache.len() >= MAX_CACHED
            && let Some(k) = cache.keys().next().copied()
        {
            cache.remove(&k);
        }
    }
    cache.insert(key, value);
}

/// When a kept answer was given.
trait Stamped {
    fn at(&self) -> Instant;
}

impl Stamped for Instant {
    fn at(&self) -> Instant {
        *self
    }
}

impl Stamped for (Decision, Instant) {
    fn at(&self) -> Instant {
        self.1
    }
}

fn digest(token: &str) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(d.as_ref());
    key
}

/// This worker's own credential, sent when it forwards: its ServiceAccount token, read again
/// from the file the kubelet keeps fresh, or the token of its kubeconfig.
pub struct OwnToken {
    file: Option<PathBuf>,
    fixed: Option<String>,
    /// The token last read from `file` (None if it never was) and when it was read or tried.
    read: Mutex<Option<(Option<String>, Instant)>>,
}

impl OwnToken {
    pub fn of(auth: &kube::config::AuthInfo) -> Self {
        let own = Self {
            file: auth.token_file.as_ref().map(PathBuf::from),
            fixed: auth.token.as_ref().map(|t| t.expose_secret().to_string()),
            read: Mutex::new(None),
        };
        if own.file.is_none() && own.fixed.is_none() {
            tracing::warn!(
                "the worker's Kubernetes credentials hold no bearer token: the queries it forwards to other workers will be refused (401)"
            );
        }
        own
    }

    /// The `Authorization` value to forward with. The token file is read again once a minute
    /// (a small file on a tmpfs); a failed read keeps the last token and is tried again a
    /// minute later.
    pub fn bearer(&self) -> Option<String> {
        let token = match &self.file {
            Some(path) => {
                let mut read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
                match &*read {
                    Some((t, at)) if at.elapsed() < OWN_TOKEN_REFRESH => t.clone(),
                    last => {
                        let last = last.as_ref().and_then(|(t, _)| t.clone());
                        let t = match std::fs::read_to_string(path) {
                            Ok(t) => Some(t.trim().to_string()),
                            Err(e) => {
                                tracing::warn!(
                                    "reading this worker's token {}: {e}; forwarding with the last one read, if any",
                                    path.display()
                                );
                                last
                            }
                        };
                        *read = Some((t.clone(), Instant::now()));
                        t
                    }
                }?
            }
            None => self.fixed.clone()?,
        };
        Some(format!("Bearer {token}"))
    }
}

/// The bearer token of a request: None without one, an error for any other scheme.
fn bearer(req: &Request) -> Result<Option<&str>, &'static str> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| "the Authorization header is not text")?;
    let (scheme, token) = value.split_once(' ').unwrap_or((value, ""));
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err("the Authorization header must be `Bearer <token>`");
    }
    let token = token.trim();
    if token.is_empty() {
        return Ok(None);
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err("the bearer token is longer than 16 KiB");
    }
    Ok(Some(token))
}

fn unauthorized(message: &str) -> Response {
    let mut r = Problem {
        code: StatusCode::UNAUTHORIZED,
        message: message.into(),
        retry: false,
    }
    .into_response();
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Bearer realm=\"eddy-query\""),
    );
    r
}

/// Every query request: let through anonymous access, or a token the API server allows.
pub async fn authorize(State(access): State<Access>, req: Request, next: Next) -> Response {
    let Access::Kubernetes(reviewer) = &access else {
        return next.run(req).await;
    };
    let token = match bearer(&req) {
        Ok(Some(t)) => t,
        Ok(None) => {
            reviewer.refused("unauthenticated");
            return unauthorized(
                "a query needs a bearer token (Authorization: Bearer <token>), e.g. `kubectl create token <serviceaccount>` or `eddy-worker query --token`; see docs/queries.md, \"Who may query\"",
            );
        }
        Err(why) => {
            reviewer.refused("unauthenticated");
            return unauthorized(why);
        }
    };
    match reviewer.decide(token).await {
        Ok(Decision::Allowed) => next.run(req).await,
        Ok(Decision::Unauthenticated) => {
            reviewer.refused("unauthenticated");
            unauthorized(
                "the bearer token is not one the Kubernetes API server accepts (expired, or of another cluster)",
            )
        }
        Ok(Decision::Denied(reason)) => {
            reviewer.refused("forbidden");
            Problem {
                code: StatusCode::FORBIDDEN,
                message: reviewer.denied(&reason),
                retry: false,
            }
            .into_response()
        }
        Err(e) => {
            reviewer.refused("review_unavailable");
            // A flood of fresh tokens makes many of the first two: not one log line each.
            match e {
                ReviewError::Busy | ReviewError::Failed => {
                    tracing::debug!("checking a query's token: {e:#}")
                }
                _ => tracing::warn!("checking a query's token: {e:#}"),
            }
            Problem::retry(format!("the token could not be checked: {e}")).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(auth: Option<&str>) -> Request {
        let mut b = axum::http::Request::get("/stores");
        if let Some(a) = auth {
            b = b.header(header::AUTHORIZATION, a);
        }
        b.body(axum::body::Body::empty()).expect("request")
    }

    #[test]
    fn a_bearer_token_is_read_and_other_schemes_are_refused() {
        assert_eq!(bearer(&request(None)), Ok(None));
        assert_eq!(bearer(&request(Some("Bearer abc"))), Ok(Some("abc")));
        assert_eq!(bearer(&request(Some("bearer  abc "))), Ok(Some("abc")));
        assert_eq!(bearer(&request(Some("Bearer"))), Ok(None));
        assert!(bearer(&request(Some("Basic dXNlcjpwdw=="))).is_err());
        let long = format!("Bearer {}", "a".repeat(MAX_TOKEN_BYTES + 1));
        assert!(bearer(&request(Some(&long))).is_err());
    }

    #[test]
    fn the_own_token_comes_from_its_file_and_follows_it() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n")?;
        let auth = kube::config::AuthInfo {
            token_file: Some(path.display().to_string()),
            ..Default::default()
        };
        let own = OwnToken::of(&auth);
        assert_eq!(own.bearer().as_deref(), Some("Bearer first"));
        // Rotated: read again once the kept copy is old; a vanished file keeps the last one.
        std::fs::write(&path, "second")?;
        *own.read.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Some("first".into()), Instant::now() - OWN_TOKEN_REFRESH));
        assert_eq!(own.bearer().as_deref(), Some("Bearer second"));
        std::fs::remove_file(&path)?;
        *own.read.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((Some("second".into()), Instant::now() - OWN_TOKEN_REFRESH));
        assert_eq!(own.bearer().as_deref(), Some("Bearer second"));
        // The failed read is not tried again on every forward, only after the refresh period.
        std::fs::write(&path, "third")?;
        assert_eq!(own.bearer().as_deref(), Some("Bearer second"));
        let none = OwnToken::of(&kube::config::AuthInfo::default());
        assert_eq!(none.bearer(), None);
        Ok(())
    }

    /// Makes every kept answer about a valid token `by` older.
    fn age(r: &Reviewer, by: Duration) {
        let mut valid = r.valid.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, at) in valid.values_mut() {
            *at -= by;
        }
    }

    /// A stand-in API server answering SelfSubjectAccessReviews by token: `good` may query,
    /// `other` may not, `slow` gets no answer, anything else is not a token; it counts reviews.
    async fn api_server() -> (kube::Client, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let asked = Arc::new(AtomicUsize::new(0));
        let counter = asked.clone();
        let app = axum::Router::new().route(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let counter = counter.clone();
                    async move {
                        counter.fetch_add(1, Ordering::SeqCst);
                        let review: SelfSubjectAccessReview =
                            serde_json::from_slice(&body).unwrap_or_default();
                        let attrs = review.spec.resource_attributes.unwrap_or_default();
                        let asked_right = attrs.subresource.as_deref() == Some("query")
                            && attrs.namespace.as_deref() == Some("ns")
                            && attrs.name.as_deref() == Some("app")
                            && attrs.verb.as_deref() == Some("get");
                        let token = headers
                            .get(header::AUTHORIZATION)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string();
                        let answer = |allowed: bool, reason: &str| {
                            axum::Json(serde_json::json!({
                                "apiVersion": "authorization.k8s.io/v1",
                                "kind": "SelfSubjectAccessReview",
                                "spec": {},
                                "status": {"allowed": allowed, "reason": reason},
                            }))
                            .into_response()
                        };
                        match token.as_str() {
                            "Bearer good" => answer(asked_right, ""),
                            "Bearer other" => answer(false, "no RBAC policy matched"),
                            t if t.starts_with("Bearer slow") => {
                                tokio::time::sleep(REVIEW_TIMEOUT * 2).await;
                                answer(true, "")
                            }
                            _ => (
                                StatusCode::UNAUTHORIZED,
                                axum::Json(serde_json::json!({
                                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "message": "Unauthorized", "reason": "Unauthorized", "code": 401,
                                })),
                            )
                                .into_response(),
                        }
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = kube::Config::new(url.parse().expect("url"));
        (kube::Client::try_from(config).expect("client"), asked)
    }

    #[tokio::test]
    async fn the_api_server_decides_and_its_answers_are_kept_a_while() {
        use std::sync::atomic::Ordering;
        let (client, asked) = api_server().await;
        let r = Reviewer::new(client, "ns", "app");
        assert_eq!(r.decide("good").await.ok(), Some(Decision::Allowed));
        assert_eq!(
            r.decide("other").await.ok(),
            Some(Decision::Denied("no RBAC policy matched".into()))
        );
        assert_eq!(
            r.decide("forged").await.ok(),
            Some(Decision::Unauthenticated)
        );
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        // Asked again within the TTL: the kept answers, no new review.
        for t in ["good", "other", "forged"] {
            r.decide(t).await.ok();
        }
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        // Past it: asked again (a revoked right stops working).
        age(&r, DECISION_TTL);
        assert_eq!(r.decide("good").await.ok(), Some(Decision::Allowed));
        assert_eq!(asked.load(Ordering::SeqCst), 4);
        // The same token for another app is its own question.
        let (client, _) = api_server().await;
        let elsewhere = Reviewer::new(client, "ns", "another");
        assert!(matches!(
            elsewhere.decide("good").await,
            Ok(Decision::Denied(_))
        ));
    }

    #[tokio::test]
    async fn a_flood_of_forged_tokens_keeps_the_caches_bounded_and_valid_answers_kept() {
        use std::sync::atomic::Ordering;
        let (client, asked) = api_server().await;
        let r = Reviewer::new(client, "ns", "app");
        assert_eq!(r.decide("good").await.ok(), Some(Decision::Allowed));
        for i in 0..MAX_CACHED + 10 {
            r.decide(&format!("forged-{i}")).await.ok();
        }
        let kept = r
            .invalid
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        assert!(kept <= MAX_CACHED, "{kept} answers kept");
        let before = asked.load(Ordering::SeqCst);
        assert_eq!(r.decide("good").await.ok(), Some(Decision::Allowed));
        assert_eq!(
            asked.load(Ordering::SeqCst),
            before,
            "the valid answer was kept"
        );
    }

    /// Many requests with one new token make one review, and so does its refresh: the
    /// others wait for it, then go on with the old answer while it is renewed.
    #[tokio::test]
    async fn one_token_is_reviewed_once_however_many_requests_carry_it() {
        use std::sync::atomic::Ordering;
        let (client, asked) = api_server().await;
        let r = Arc::new(Reviewer::new(client, "ns", "app"));
        let all = |r: &Arc<Reviewer>| {
            let calls: Vec<_> = (0..200)
                .map(|_| {
                    let r = r.clone();
                    tokio::spawn(async move { r.decide("good").await.ok() })
                })
                .collect();
            async move {
                let mut answers = Vec::new();
                for c in calls {
                    answers.push(c.await.ok().flatten());
                }
                answers
            }
        };
        let answers = all(&r).await;
        assert!(
            answers.iter().all(|a| *a == Some(Decision::Allowed)),
            "{answers:?}"
        );
        assert_eq!(asked.load(Ordering::SeqCst), 1);
        // Past the TTL: one refresh, nobody refused meanwhile.
        age(&r, DECISION_TTL);
        let answers = all(&r).await;
        assert!(
            answers.iter().all(|a| *a == Some(Decision::Allowed)),
            "{answers:?}"
        );
        assert_eq!(asked.load(Ordering::SeqCst), 2);
        // Past twice the TTL an answer is not used at all: asked before answering.
        age(&r, 2 * DECISION_TTL);
        assert_eq!(r.decide("good").await.ok(), Some(Decision::Allowed));
        assert_eq!(asked.load(Ordering::SeqCst), 3);
        assert!(
            r.pending
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_empty()
        );
    }

    /// Beyond the reviews in flight and the requests allowed to wait for one, a request is
    /// told to retry at once instead of holding a slot of the query API.
    #[tokio::test]
    async fn requests_beyond_the_review_queue_are_refused_at_once() {
        let (client, _) = api_server().await;
        let mut r = Reviewer::new(client, "ns", "app");
        r.timeout = Duration::from_millis(100);
        let r = Arc::new(r);
        let n = MAX_REVIEWS + MAX_WAITING + 8;
        let calls: Vec<_> = (0..n)
            .map(|i| {
                let r = r.clone();
                tokio::spawn(async move { r.decide(&format!("slow-{i}")).await })
            })
            .collect();
        let mut busy = 0;
        for c in calls {
            if matches!(c.await, Ok(Err(ReviewError::Busy))) {
                busy += 1;
            }
        }
        assert!(busy >= 8, "{busy} of {n} refused at once");
        assert_eq!(
            r.waiting.load(Ordering::Relaxed),
            0,
            "every waiter counted out"
        );
    }

    #[tokio::test]
    async fn an_api_server_that_does_not_answer_is_a_retry_not_a_decision() {
        let (client, _) = api_server().await;
        let mut r = Reviewer::new(client, "ns", "app");
        r.timeout = Duration::from_millis(200);
        assert!(matches!(r.decide("slow").await, Err(ReviewError::Timeout)));
        assert!(r.cached(&digest("slow")).is_none());
    }

    /// Through the middleware: no token 401 with a challenge, a forged one 401, a token
    /// without the right 403 naming what it needs, the right one answered.
    #[tokio::test]
    async fn requests_are_answered_by_what_their_token_may_do() {
        let (client, _) = api_server().await;
        let metrics = Arc::new(Metrics::new());
        let access = Access::Kubernetes(Arc::new(
            Reviewer::new(client, "ns", "app").with_metrics(metrics.clone()),
        ));
        let app = axum::Router::new()
            .route("/stores", axum::routing::get(|| async { "the stores" }))
            .layer(axum::middleware::from_fn_with_state(access, authorize));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/stores", listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        let http = super::super::client::client();
        let call = |auth: Option<&'static str>| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let headers: Vec<(&str, &str)> =
                    auth.map(|a| ("authorization", a)).into_iter().collect();
                let (code, h, body) = super::super::client::fetch(&http, &url, &headers)
                    .await
                    .expect("an answer");
                let challenge = h.get(header::WWW_AUTHENTICATE).cloned();
                (code, challenge, String::from_utf8_lossy(&body).into_owned())
            }
        };
        let (code, challenge, body) = call(None).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        assert!(challenge.is_some(), "a 401 says how to authenticate");
        assert!(body.contains("needs a bearer token"), "{body}");
        let (code, _, body) = call(Some("Bearer forged")).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        assert!(
            body.contains("not one the Kubernetes API server accepts"),
            "{body}"
        );
        let (code, _, body) = call(Some("Bearer other")).await;
        assert_eq!(code, StatusCode::FORBIDDEN);
        assert!(
            body.contains("statefulstreamapps/query") && body.contains("no RBAC policy matched"),
            "{body}"
        );
        let (code, _, body) = call(Some("Bearer good")).await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "the stores"));
        // What an operator sees of it.
        let text = metrics.encode();
        for line in [
            r#"eddy_queries_refused_total{reason="unauthenticated"} 2"#,
            r#"eddy_queries_refused_total{reason="forbidden"} 1"#,
            r#"eddy_query_token_reviews_total{result="allowed"} 1"#,
            r#"eddy_query_token_reviews_total{result="unauthenticated"} 1"#,
            "eddy_query_token_review_duration_seconds_count 3",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
