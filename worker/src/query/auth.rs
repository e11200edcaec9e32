//! Who may query: Kubernetes RBAC. A request carries a bearer token the cluster's API server
//! accepts (a ServiceAccount's, a user's); the worker asks the API server, as the token's
//! holder, whether it may `get` the `statefulstreamapps/query` subresource of this app (a
//! SelfSubjectAccessReview), and keeps the answer a few seconds. The workers need no right of
//! their own to judge tokens (a TokenReview would need a ClusterRoleBinding per app), and
//! every kind of token the API server accepts works. Workers forwarding to each other send
//! their own ServiceAccount token, which their Role allows. docs/queries.md, "Who may query".

use super::params::Problem;
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
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The subresource a query client must be allowed to `get` on the app.
pub const QUERY_SUBRESOURCE: &str = "query";
/// How long an answer of the API server is kept (allowed, denied or not a valid token), as
/// the API server's own webhook authorizers keep theirs: a revoked right stops working
/// within it.
pub const DECISION_TTL: Duration = Duration::from_secs(10);
/// Tokens whose answers are kept at once; a flood of different tokens evicts, never grows.
pub const MAX_CACHED: usize = 4096;
/// Reviews in flight to the API server at once from one worker: more requests wait (within
/// the query API's own bounds), so a flood of fresh tokens does not become one on the API server.
pub const MAX_REVIEWS: usize = 4;
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

impl Access {
    /// The `Authorization` value this worker sends when it forwards a query to another.
    pub fn forward_header(&self) -> Option<String> {
        match self {
            Access::Anonymous => None,
            Access::Kubernetes(r) => r.own.bearer(),
        }
    }
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
    #[error("asking the Kubernetes API: {0}")]
    Api(#[source] kube::Error),
    #[error("writing the review request: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("writing the review request: {0}")]
    Http(#[from] axum::http::Error),
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("reading the Kubernetes client configuration (in-cluster or KUBECONFIG)")]
    Config(#[source] kube::config::InferConfigError),
    #[error("making a Kubernetes client without credentials")]
    Client(#[source] kube::Error),
}

/// Judges tokens for one app through the API server, and holds this worker's own token.
pub struct Reviewer {
    /// A client of the API server with no credentials of its own: each review carries the
    /// caller's token.
    api: kube::Client,
    namespace: String,
    app: String,
    cache: Mutex<HashMap<[u8; 32], (Decision, Instant)>>,
    reviews: tokio::sync::Semaphore,
    /// How long a review may take ([`REVIEW_TIMEOUT`]).
    timeout: Duration,
    own: OwnToken,
}

impl Reviewer {
    /// A reviewer for app `app` of `namespace`, from the worker's Kubernetes configuration.
    /// Must be made on the runtime that serves the queries (its client's connections live there).
    pub async fn connect(namespace: &str, app: &str) -> Result<Self, SetupError> {
        let mut config = kube::Config::infer().await.map_err(SetupError::Config)?;
        let own = OwnToken::of(&config.auth_info);
        config.auth_info = Default::default();
        let api = kube::Client::try_from(config).map_err(SetupError::Client)?;
        Ok(Self::new(api, namespace, app, own))
    }

    fn new(api: kube::Client, namespace: &str, app: &str, own: OwnToken) -> Self {
        Self {
            api,
            namespace: namespace.into(),
            app: app.into(),
            cache: Mutex::new(HashMap::new()),
            reviews: tokio::sync::Semaphore::new(MAX_REVIEWS),
            timeout: REVIEW_TIMEOUT,
            own,
        }
    }

    /// Whether `token` may query this app: the kept answer, or the API server's.
    pub async fn decide(&self, token: &str) -> Result<Decision, ReviewError> {
        let key = digest(token);
        if let Some(d) = self.cached(&key) {
            return Ok(d);
        }
        let _permit = self.reviews.acquire().await;
        // Another request with the same token may have asked while this one waited.
        if let Some(d) = self.cached(&key) {
            return Ok(d);
        }
        let d = tokio::time::timeout(self.timeout, self.review(token))
            .await
            .map_err(|_| ReviewError::Timeout)??;
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        if cache.len() >= MAX_CACHED {
            cache.retain(|_, (_, at)| at.elapsed() < DECISION_TTL);
            if cache.len() >= MAX_CACHED {
                cache.clear();
            }
        }
        cache.insert(key, (d.clone(), Instant::now()));
        Ok(d)
    }

    fn cached(&self, key: &[u8; 32]) -> Option<Decision> {
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache
            .get(key)
            .filter(|(_, at)| at.elapsed() < DECISION_TTL)
            .map(|(d, _)| d.clone())
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
        let body = serde_json::to_vec(&review)?;
        let mut bearer =
            HeaderValue::try_from(format!("Bearer {token}")).map_err(axum::http::Error::from)?;
        bearer.set_sensitive(true);
        let req =
            axum::http::Request::post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews")
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::AUTHORIZATION, bearer)
                .body(body)?;
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
            "this token may not query app {}/{}{because}: it needs `get` on `statefulstreamapps/query` there, e.g. a RoleBinding in namespace {} to the chart's ClusterRole `<release>-eddy-operator-query` (docs/queries.md, \"Who may query\")",
            self.namespace, self.app, self.namespace
        )
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
    read: Mutex<Option<(String, Instant)>>,
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

    fn bearer(&self) -> Option<String> {
        let token = match &self.file {
            Some(path) => {
                let mut read = self.read.lock().unwrap_or_else(PoisonError::into_inner);
                match &*read {
                    Some((t, at)) if at.elapsed() < OWN_TOKEN_REFRESH => t.clone(),
                    _ => match std::fs::read_to_string(path) {
                        Ok(t) => {
                            let t = t.trim().to_string();
                            *read = Some((t.clone(), Instant::now()));
                            t
                        }
                        Err(e) => {
                            tracing::warn!(
                                "reading this worker's token {}: {e}; forwarding without it",
                                path.display()
                            );
                            read.as_ref().map(|(t, _)| t.clone())?
                        }
                    },
                }
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
            return unauthorized(
                "a query needs a bearer token (Authorization: Bearer <token>), e.g. `kubectl create token <serviceaccount>` or `eddy-worker query --token`; see docs/queries.md, \"Who may query\"",
            );
        }
        Err(why) => return unauthorized(why),
    };
    match reviewer.decide(token).await {
        Ok(Decision::Allowed) => next.run(req).await,
        Ok(Decision::Unauthenticated) => unauthorized(
            "the bearer token is not one the Kubernetes API server accepts (expired, or of another cluster)",
        ),
        Ok(Decision::Denied(reason)) => Problem {
            code: StatusCode::FORBIDDEN,
            message: reviewer.denied(&reason),
            retry: false,
        }
        .into_response(),
        Err(e) => {
            tracing::warn!("checking a query's token: {e:#}");
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
            Some(("first".into(), Instant::now() - OWN_TOKEN_REFRESH));
        assert_eq!(own.bearer().as_deref(), Some("Bearer second"));
        std::fs::remove_file(&path)?;
        *own.read.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(("second".into(), Instant::now() - OWN_TOKEN_REFRESH));
        assert_eq!(own.bearer().as_deref(), Some("Bearer second"));
        let none = OwnToken::of(&kube::config::AuthInfo::default());
        assert_eq!(none.bearer(), None);
        Ok(())
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
                            "Bearer slow" => {
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
        let none = OwnToken::of(&kube::config::AuthInfo::default());
        let r = Reviewer::new(client, "ns", "app", none);
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
        for (_, at) in r
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values_mut()
        {
            *at -= DECISION_TTL;
        }
        assert_eq!(r.decide("good").await.ok(), Some(Decision::Allowed));
        assert_eq!(asked.load(Ordering::SeqCst), 4);
        // The same token for another app is its own question.
        let (client, _) = api_server().await;
        let none = OwnToken::of(&kube::config::AuthInfo::default());
        let elsewhere = Reviewer::new(client, "ns", "another", none);
        assert!(matches!(
            elsewhere.decide("good").await,
            Ok(Decision::Denied(_))
        ));
    }

    #[tokio::test]
    async fn a_flood_of_fresh_tokens_keeps_the_cache_bounded() {
        let (client, _) = api_server().await;
        let none = OwnToken::of(&kube::config::AuthInfo::default());
        let r = Reviewer::new(client, "ns", "app", none);
        for i in 0..MAX_CACHED + 10 {
            r.decide(&format!("forged-{i}")).await.ok();
        }
        let kept = r.cache.lock().unwrap_or_else(PoisonError::into_inner).len();
        assert!(kept <= MAX_CACHED, "{kept} answers kept");
        assert_eq!(r.decide("good").await.ok(), Some(Decision::Allowed));
    }

    #[tokio::test]
    async fn an_api_server_that_does_not_answer_is_a_retry_not_a_decision() {
        let (client, _) = api_server().await;
        let none = OwnToken::of(&kube::config::AuthInfo::default());
        let mut r = Reviewer::new(client, "ns", "app", none);
        r.timeout = Duration::from_millis(200);
        assert!(matches!(r.decide("slow").await, Err(ReviewError::Timeout)));
        assert!(r.cached(&digest("slow")).is_none());
    }

    /// Through the middleware: no token 401 with a challenge, a forged one 401, a token
    /// without the right 403 naming what it needs, the right one answered.
    #[tokio::test]
    async fn requests_are_answered_by_what_their_token_may_do() {
        let (client, _) = api_server().await;
        let none = OwnToken::of(&kube::config::AuthInfo::default());
        let access = Access::Kubernetes(Arc::new(Reviewer::new(client, "ns", "app", none)));
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
    }
}
