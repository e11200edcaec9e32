//! The query API's HTTP side: the routes, parameters and answers of docs/queries.md, and
//! forwarding a request to the worker that holds the copy it needs.
//!
//! ```text
//! GET /stores                                  the stores, their kinds and formats
//! GET /stores/{store}/keys/{key}               one key (versioned: ?asOf=ms)
//! GET /stores/{store}/keys?from=&to=           keys in [from, to), every partition merged
//! GET /stores/{store}/keys/{key}/windows?from=&to=   one key's windows (sessions)
//! GET /stores/{store}/windows?from=&to=        every key's windows in a time range
//! ```
//! Every request takes `maxLag` (a number of records, or `any`: a standby may answer) and
//! pages take `limit` and `after` (the `next` of the previous page).

use super::auth::{Access, OwnToken};
use super::client::{FORWARDED_BY, FetchError, HttpClient, client, fetch};
use super::locate::{self, Freshness, LocalCopy, Route};
use super::params::{PAGE, Params, Problem, hex_decode, hex_encode, internal};
use super::read::{self, Read, Request};
use super::{Catalog, Kind, StoreInfo};
use crate::status::Status;
use crate::store::View;
use crate::window::KeySchema;
use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use eddy_crds::TaskId;
use eddy_crds::query::{AnsweredBy, Entry, KeyAnswer, Position, QueryProblem, RangeAnswer};
use eddy_crds::resource::TaskRole;
use std::sync::Arc;

#[derive(Clone)]
struct Api {
    status: Arc<Status>,
    client: HttpClient,
    /// Requests being answered; beyond [`MAX_IN_FLIGHT`] a request is refused at once.
    in_flight: Arc<tokio::sync::Semaphore>,
    /// The credential this worker forwards with (under the operator: its ServiceAccount's).
    own: Option<Arc<OwnToken>>,
}

/// Requests one worker answers at once (forwarded ones included); more get a 503 with
/// Retry-After instead of queueing without bound.
pub const MAX_IN_FLIGHT: usize = 256;
/// The longest a request may take (a forwarded one included), then it gets a 503.
pub const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Every request: within [`MAX_IN_FLIGHT`] and [`REQUEST_TIMEOUT`].
async fn bounded(
    State(api): State<Api>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let Ok(_permit) = api.in_flight.clone().try_acquire_owned() else {
        return Problem::retry(format!(
            "this worker is answering {MAX_IN_FLIGHT} queries already"
        ))
        .into_response();
    };
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(r) => r,
        Err(_) => Problem::retry(format!("no answer within {} s", REQUEST_TIMEOUT.as_secs()))
            .into_response(),
    }
}

/// The query routes, answering from `status.queries` those `access` lets in; forwarding
/// with `own`'s token.
pub fn router(status: Arc<Status>, access: Access, own: Option<Arc<OwnToken>>) -> Router {
    let api = Api {
        status,
        client: client(),
        in_flight: Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT)),
        own,
    };
    Router::new()
        .route("/stores", get(stores))
        .route("/stores/{store}/keys", get(range))
        .route("/stores/{store}/keys/{key}", get(key))
        .route("/stores/{store}/keys/{key}/windows", get(key_windows))
        .route("/stores/{store}/windows", get(all_windows))
        // Checked within the bounds: a token's review takes a permit like any request.
        .layer(axum::middleware::from_fn_with_state(
            access,
            super::auth::authorize,
        ))
        .layer(axum::middleware::from_fn_with_state(api.clone(), bounded))
        .with_state(api)
}

/// The store named in the path, if queryable.
fn store(catalog: &Catalog, name: &str) -> Result<(StoreInfo, Arc<super::Layout>), Problem> {
    let layout = catalog.layout();
    if !layout.enabled {
        return Err(Problem {
            code: StatusCode::NOT_FOUND,
            message: "this app's query API is switched off (spec.queries.enabled: false)".into(),
            retry: false,
        });
    }
    let Some(info) = layout.stores.iter().find(|s| s.name == name).cloned() else {
        let known: Vec<&str> = layout
            .stores
            .iter()
            .filter(|s| s.not_queryable.is_none())
            .map(|s| s.name.as_str())
            .collect();
        return Err(Problem {
            code: StatusCode::NOT_FOUND,
            message: format!(
                "no store {name:?} in this app; its stores are: {}",
                known.join(", ")
            ),
            retry: false,
        });
    };
    if let Some(why) = info.not_queryable {
        return Err(Problem::bad(format!(
            "store {name:?} cannot be queried: {why}"
        )));
    }
    Ok((info, layout))
}

async fn stores(State(api): State<Api>) -> Response {
    if !api.status.queries.layout().enabled {
        return Problem {
            code: StatusCode::NOT_FOUND,
            message: "this app's query API is switched off (spec.queries.enabled: false)".into(),
            retry: false,
        }
        .into_response();
    }
    axum::Json(api.status.queries.describe()).into_response()
}

/// Which request was forwarded from where.
fn forwarded(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED_BY)
}

async fn key(
    State(api): State<Api>,
    Path((name, key)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let path = format!("/stores/{}/keys/{}", enc(&name), enc(&key));
    answer(async {
        let p = Params::parse(q.clone(), &["asOf", "maxLag", "minOffset"])?;
        let (info, layout) = store(&api.status.queries, &name)?;
        if let Kind::Window(schema) = info.kind {
            return Err(Problem::bad(format!(
                "store {name:?} is a {} store: ask /stores/{name}/keys/{key}/windows",
                schema_name(schema)
            )));
        }
        let as_of = p.int("asOf")?;
        if as_of.is_some() && !matches!(info.kind, Kind::Versioned { .. }) {
            return Err(Problem::bad(format!(
                "asOf: store {name:?} keeps one value per key; only versioned stores answer as of a time"
            )));
        }
        let bytes = read::key_bytes(info.key_format, &key).map_err(|e| {
            Problem::bad(format!("key {key:?} of store {name:?} ({} keys): {e}", super::format_name(info.key_format)))
        })?;
        let req = Request::Get { key: bytes.clone(), as_of };
        let found = one(&api, &info, &layout, &bytes, req, &p, &path, q.as_deref(), &headers).await?;
        Ok(axum::Json(found).into_response())
    })
    .await
}

async fn key_windows(
    State(api): State<Api>,
    Path((name, key)): Path<(String, String)>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    let path = format!("/stores/{}/keys/{}/windows", enc(&name), enc(&key));
    answer(async {
        let p = Params::parse(
            q.clone(),
            &["from", "to", "limit", "after", "maxLag", "minOffset"],
        )?;
        let (info, layout) = store(&api.status.queries, &name)?;
        if !matches!(info.kind, Kind::Window(_)) {
            return Err(Problem::bad(format!(
                "store {name:?} has no windows: ask /stores/{name}/keys/{key}"
            )));
        }
        let (from, to) = times(&p)?;
        // A key's windows are in time order, one per time: a page goes on after the last
        // one's time.
        let after = p
            .after()?
            .map(|a| <[u8; 8]>::try_from(a.as_slice()).map(i64::from_be_bytes));
        let from = match after {
            None => from,
            Some(Ok(t)) => from.max(t.saturating_add(1)),
            Some(Err(_)) => {
                return Err(Problem::bad(
                    "after: expected the `next` of a previous page",
                ));
            }
        };
        let bytes = read::key_bytes(info.key_format, &key)
            .map_err(|e| Problem::bad(format!("key {key:?} of store {name:?}: {e}")))?;
        let limit = p.limit()?;
        let req = Request::Windows {
            key: bytes.clone(),
            from,
            to,
            limit,
        };
        let mut a = many_of_key(
            &api,
            &info,
            &layout,
            &bytes,
            req,
            &p,
            &path,
            q.as_deref(),
            &headers,
        )
        .await?;
        a.next = None;
        if a.entries.len() >= limit
            && let Some(t) = a.entries.last().and_then(|e| window_time(&info, e))
        {
            a.next = Some(hex_encode(&t.to_be_bytes()));
        }
        Ok(axum::Json(a).into_response())
    })
    .await
}

fn window_time(info: &StoreInfo, e: &Entry) -> Option<i64> {
    match info.kind {
        Kind::Window(KeySchema::Session) => e.end,
        _ => e.start,
    }
}

fn schema_name(s: KeySchema) -> &'static str {
    match s {
        KeySchema::Session => "session",
        KeySchema::Window { .. } => "window",
    }
}

/// `from` and `to` (ms, inclusive), by default all time.
fn times(p: &Params) -> Result<(i64, i64), Problem> {
    let from = p.int("from")?.unwrap_or(0).max(0);
    let to = p.int("to")?.unwrap_or(i64::MAX);
    if to < from {
        return Err(Problem::bad(format!("from={from} is after to={to}")));
    }
    Ok((from, to))
}

async fn range(
    State(api): State<Api>,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    answer(async {
        let mut allowed = vec!["from", "to"];
        allowed.extend_from_slice(PAGE);
        let p = Params::parse(q.clone(), &allowed)?;
        let (info, layout) = store(&api.status.queries, &name)?;
        match info.kind {
            Kind::Window(schema) => {
                return Err(Problem::bad(format!(
                    "store {name:?} is a {} store: ask /stores/{name}/windows (every key) or /stores/{name}/keys/<key>/windows",
                    schema_name(schema)
                )));
            }
            Kind::Versioned { .. } => {
                return Err(Problem::bad(format!(
                    "store {name:?} is versioned: it answers single keys, /stores/{name}/keys/<key>"
                )));
            }
            Kind::KeyValue | Kind::Global => {}
        }
        let key = |param: &str| {
            p.text(param)
                .map(|t| {
                    read::key_bytes(info.key_format, t)
                        .map_err(|e| Problem::bad(format!("{param}={t:?}: {e}")))
                })
                .transpose()
        };
        let mut from = key("from")?.unwrap_or_default();
        let to = key("to")?;
        if let Some(mut a) = p.after()? {
            // The smallest key after `a`.
            a.push(0);
            from = from.max(a);
        }
        let limit = p.limit()?;
        let req = Request::Range { from, to, limit };
        let a = scatter(&api, &info, &layout, req, limit, &p, &format!("/stores/{}/keys", enc(&name)), q.as_deref(), &headers).await?;
        Ok(axum::Json(a).into_response())
    })
    .await
}

async fn all_windows(
    State(api): State<Api>,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> Response {
    answer(async {
        let mut allowed = vec!["from", "to"];
        allowed.extend_from_slice(PAGE);
        let p = Params::parse(q.clone(), &allowed)?;
        let (info, layout) = store(&api.status.queries, &name)?;
        if !matches!(info.kind, Kind::Window(_)) {
            return Err(Problem::bad(format!(
                "store {name:?} has no windows: ask /stores/{name}/keys"
            )));
        }
        let (from, to) = times(&p)?;
        let limit = p.limit()?;
        let req = Request::AllWindows {
            from,
            to,
            after: p.after()?,
            limit,
        };
        let a = scatter(
            &api,
            &info,
            &layout,
            req,
            limit,
            &p,
            &format!("/stores/{}/windows", enc(&name)),
            q.as_deref(),
            &headers,
        )
        .await?;
        Ok(axum::Json(a).into_response())
    })
    .await
}

async fn answer(f: impl Future<Output = Result<Response, Problem>>) -> Response {
    f.await.unwrap_or_else(IntoResponse::into_response)
}

fn enc(s: &str) -> String {
    form_urlencoded::byte_serialize(s.as_bytes())
        .collect::<String>()
        .replace('+', "%20")
}

/// The task holding `key` of a partitioned store.
fn task_of(
    info: &StoreInfo,
    layout: &super::Layout,
    key: &[u8],
) -> Result<Option<TaskId>, Problem> {
    let Some(sub) = info.subtopology else {
        return Ok(None);
    };
    let n = partitions(info, layout)?;
    Ok(Some(TaskId::new(
        sub,
        crate::partitioner::partition_for(key, n),
    )))
}

fn partitions(info: &StoreInfo, layout: &super::Layout) -> Result<i32, Problem> {
    match layout.partitions.get(&info.partitioned_by) {
        Some(&n) if n > 0 => Ok(n),
        _ => Err(Problem::retry(format!(
            "the partitions of {} are not known yet: the worker is starting",
            info.partitioned_by
        ))),
    }
}

/// A single-key lookup, answered here or where the key's copy is.
#[allow(clippy::too_many_arguments)]
async fn one(
    api: &Api,
    info: &StoreInfo,
    layout: &super::Layout,
    key: &[u8],
    req: Request,
    p: &Params,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<KeyAnswer, Problem> {
    let key_json = read::json(info, "key", info.key_format, key).map_err(internal)?;
    let (read, by) = match task_of(info, layout, key)? {
        None => local_global(api, info, layout, key, req).await?,
        Some(task) => match where_to(api, task, p, headers)? {
            Route::Local => local(api, info, task, req, p).await?,
            Route::Forward { pod, address } => {
                return forward(api, &pod, &address, path, query).await;
            }
            Route::Unavailable(why) => return Err(Problem::retry(why)),
        },
    };
    let Read::One(entry) = read else {
        return Err(internal("a single-key read answered several entries"));
    };
    Ok(match entry {
        Some(e) => KeyAnswer {
            store: info.name.clone(),
            key: key_json,
            found: true,
            value: e.value,
            timestamp: e.timestamp,
            answered_by: by,
        },
        None => KeyAnswer {
            store: info.name.clone(),
            key: key_json,
            found: false,
            value: serde_json::Value::Null,
            timestamp: None,
            answered_by: by,
        },
    })
}

/// One key's windows.
#[allow(clippy::too_many_arguments)]
async fn many_of_key(
    api: &Api,
    info: &StoreInfo,
    layout: &super::Layout,
    key: &[u8],
    req: Request,
    p: &Params,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<RangeAnswer, Problem> {
    let Some(task) = task_of(info, layout, key)? else {
        return Err(internal("a window store without tasks"));
    };
    let (read, by) = match where_to(api, task, p, headers)? {
        Route::Local => local(api, info, task, req, p).await?,
        Route::Forward { pod, address } => return forward(api, &pod, &address, path, query).await,
        Route::Unavailable(why) => return Err(Problem::retry(why)),
    };
    let Read::Many(rows) = read else {
        return Err(internal("a window read answered a single entry"));
    };
    Ok(RangeAnswer {
        store: info.name.clone(),
        entries: rows.into_iter().map(|(_, e)| e).collect(),
        next: None,
        answered_by: vec![by],
    })
}

/// A range or a scan of every key: each partition read where its copy is, merged in order.
#[allow(clippy::too_many_arguments)]
async fn scatter(
    api: &Api,
    info: &StoreInfo,
    layout: &super::Layout,
    req: Request,
    limit: usize,
    p: &Params,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<RangeAnswer, Problem> {
    let Some(sub) = info.subtopology else {
        let (read, by) = local_global(api, info, layout, &[], req).await?;
        return Ok(page(info, vec![(read, by)], limit));
    };
    let n = partitions(info, layout)?;
    let wanted: Vec<i32> = match p.int("partition")? {
        Some(one) => match i32::try_from(one) {
            Ok(one) if (0..n).contains(&one) => vec![one],
            _ => {
                return Err(Problem::bad(format!(
                    "partition={one}: store {} has partitions 0 to {}",
                    info.name,
                    n - 1
                )));
            }
        },
        None => (0..n).collect(),
    };
    let asked_for_one = p.text("partition").is_some();
    let mut parts = Vec::new();
    for partition in wanted {
        let task = TaskId::new(sub, partition);
        let req = req.clone();
        parts.push(async move {
            match where_to(api, task, p, headers)? {
                Route::Local => local(api, info, task, req, p).await,
                Route::Forward { pod, address } => {
                    // Ask the holder for that partition only, with each entry's order.
                    let q = match query {
                        Some(q) if !q.is_empty() => format!("{q}&partition={partition}"),
                        _ => format!("partition={partition}"),
                    };
                    let a: RangeAnswer = forward(api, &pod, &address, path, Some(&q)).await?;
                    let rows = a
                        .entries
                        .into_iter()
                        .map(|e| {
                            let order =
                                e.order.as_deref().and_then(hex_decode).ok_or_else(|| {
                                    internal(format!("{pod} answered an entry without its order"))
                                })?;
                            Ok((order, Entry { order: None, ..e }))
                        })
                        .collect::<Result<Vec<_>, Problem>>()?;
                    let by = a.answered_by.into_iter().next().ok_or_else(|| {
                        internal(format!("{pod} did not say which copy answered"))
                    })?;
                    Ok((Read::Many(rows), by))
                }
                Route::Unavailable(why) => {
                    Err(Problem::retry(format!("partition {partition}: {why}")))
                }
            }
        });
    }
    let parts = futures::future::join_all(parts)
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    let mut a = page(info, parts, limit);
    if !asked_for_one {
        // Only a worker merging partitions (it asked for one) needs each entry's order.
        for e in &mut a.entries {
            e.order = None;
        }
    }
    Ok(a)
}

/// Merge the partitions' entries in order, keep the first `limit`; `next` when more may follow.
fn page(info: &StoreInfo, parts: Vec<(Read, AnsweredBy)>, limit: usize) -> RangeAnswer {
    let mut more = false;
    let mut rows = Vec::new();
    let mut by = Vec::new();
    for (r, b) in parts {
        if let Read::Many(r) = r {
            more |= r.len() >= limit;
            rows.extend(r);
        }
        by.push(b);
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    more |= rows.len() > limit;
    rows.truncate(limit);
    let next = more
        .then(|| rows.last().map(|(o, _)| hex_encode(o)))
        .flatten();
    RangeAnswer {
        store: info.name.clone(),
        entries: rows
            .into_iter()
            .map(|(o, e)| Entry {
                order: Some(hex_encode(&o)),
                ..e
            })
            .collect(),
        next,
        answered_by: by,
    }
}

/// Where `task`'s query goes from here.
fn where_to(api: &Api, task: TaskId, p: &Params, headers: &HeaderMap) -> Result<Route, Problem> {
    let freshness = p.freshness()?;
    let catalog = &api.status.queries;
    let local = catalog.holder(task).map(|h| {
        let replicas = api.status.replicas.lock().ok();
        LocalCopy::of(h, replicas.as_ref().and_then(|r| r.get(&task.to_string())))
    });
    let cluster = catalog.cluster();
    Ok(locate::route(
        task,
        freshness,
        local,
        cluster.as_deref(),
        &catalog.layout().pod,
        forwarded(headers),
    ))
}

/// Read this worker's copy of `task`. A single key is read on the server's own thread (a
/// point lookup takes microseconds, less than a hand-off to the blocking pool); a page, or a
/// versioned store's key (its history), is read on a blocking thread.
async fn local(
    api: &Api,
    info: &StoreInfo,
    task: TaskId,
    req: Request,
    p: &Params,
) -> Result<(Read, AnsweredBy), Problem> {
    let freshness = p.freshness()?;
    let min_offset = p.int("minOffset")?;
    // A point lookup here; a versioned store's get reads the key's history, so it goes to
    // the bounded blocking pool with the pages.
    if matches!(req, Request::Get { .. }) && !matches!(info.kind, Kind::Versioned { .. }) {
        return read_copy(&api.status, info, task, &req, freshness, min_offset);
    }
    let (status, info) = (api.status.clone(), info.clone());
    tokio::task::spawn_blocking(move || {
        read_copy(&status, &info, task, &req, freshness, min_offset)
    })
    .await
    .map_err(internal)?
}

fn read_copy(
    status: &Status,
    info: &StoreInfo,
    task: TaskId,
    req: &Request,
    freshness: Freshness,
    min_offset: Option<i64>,
) -> Result<(Read, AnsweredBy), Problem> {
    let catalog = &status.queries;
    let layout = catalog.layout();
    let pod = &layout.pod;
    catalog
        .with_copy(task, |holder, held| {
            let copy = {
                let replicas = status.replicas.lock().ok();
                LocalCopy::of(
                    holder,
                    replicas.as_ref().and_then(|r| r.get(&task.to_string())),
                )
            };
            if !freshness.accepts(copy.role, copy.lag) {
                return Err(Problem::retry(format!(
                    "this worker's copy of task {task} lacks {:?} records, beyond maxLag",
                    copy.lag
                )));
            }
            let read_from = |view: &dyn View| {
                let offset = view.checkpoint(&info.name).map_err(internal)?;
                if let (Some(min), o) = (min_offset, offset)
                    && o.unwrap_or(0) < min
                {
                    return Err(Problem::retry(format!(
                        "this copy of task {task} ({} on {pod}) is at changelog offset {}, before minOffset={min}",
                        copy.role.name().to_ascii_lowercase(),
                        o.unwrap_or(0)
                    )));
                }
                Ok((read::run(info, view, req).map_err(internal)?, offset))
            };
            let (read, offset) = match (held.memory(&info.name), held.db) {
                (Some(m), _) => read_from(&m.view(info.kind.window_schema()))?,
                (None, Some(db)) => read_from(&db.snapshot())?,
                (None, None) => return Err(internal(format!("task {task} has no store {}", info.name))),
            };
            let by = AnsweredBy {
                pod: pod.clone(),
                task: task.to_string(),
                role: copy.role,
                lag: copy.lag,
                position: offset.map(|offset| Position {
                    topic: info.changelog.clone(),
                    partition: task.partition,
                    offset,
                }),
            };
            Ok((read, by))
        })
        .unwrap_or_else(|| {
            Err(Problem::retry(format!(
                "task {task} just left this worker ({pod}); ask again"
            )))
        })
}

/// Read a global table: every worker holds all of it.
async fn local_global(
    api: &Api,
    info: &StoreInfo,
    layout: &super::Layout,
    key: &[u8],
    req: Request,
) -> Result<(Read, AnsweredBy), Problem> {
    let status = api.status.clone();
    let info = info.clone();
    let partition = match (&req, layout.partitions.get(&info.partitioned_by)) {
        (Request::Get { .. }, Some(&n)) if n > 0 => Some(crate::partitioner::partition_for(key, n)),
        _ => None,
    };
    let pod = layout.pod.clone();
    tokio::task::spawn_blocking(move || {
        status
            .queries
            .with_global(|g| {
                let snap = g.snapshot();
                let position = match partition {
                    Some(p) => snap
                        .partition_checkpoint(&info.name, p)
                        .map_err(internal)?
                        .map(|offset| Position {
                            topic: info.changelog.clone(),
                            partition: p,
                            offset,
                        }),
                    None => None,
                };
                let read = read::run(&info, &snap, &req).map_err(internal)?;
                Ok((
                    read,
                    AnsweredBy {
                        pod: pod.clone(),
                        task: "global".into(),
                        role: TaskRole::Active,
                        lag: None,
                        position,
                    },
                ))
            })
            .unwrap_or_else(|| {
                Err(Problem::retry(
                    "the global tables are not open yet: the worker is starting",
                ))
            })
    })
    .await
    .map_err(internal)?
}

/// Ask `pod` the same request and pass its answer on (its refusals as [`peer_problem`] says).
async fn forward<T: serde::de::DeserializeOwned>(
    api: &Api,
    pod: &str,
    address: &str,
    path: &str,
    query: Option<&str>,
) -> Result<T, Problem> {
    let url = match query {
        Some(q) if !q.is_empty() => format!("http://{address}{path}?{q}"),
        _ => format!("http://{address}{path}"),
    };
    let me = api.status.queries.layout().pod.clone();
    let credential = api.own.as_ref().and_then(|o| o.bearer());
    let mut headers = vec![(FORWARDED_BY, me.as_str())];
    if let Some(c) = &credential {
        headers.push(("authorization", c.as_str()));
    }
    let (code, _, body) = match fetch(&api.client, &url, &headers).await {
        Ok(answer) => answer,
        Err(e @ FetchError::TooLarge) => {
            return Err(Problem {
                code: StatusCode::BAD_GATEWAY,
                message: format!("forwarding to {pod}: {e}"),
                retry: false,
            });
        }
        Err(e) => {
            return Err(Problem::retry(format!(
                "forwarding to {pod} ({address}): {e}"
            )));
        }
    };
    if code.is_success() {
        return serde_json::from_slice(&body)
            .map_err(|e| internal(format!("{pod} answered something unreadable: {e}")));
    }
    if code == StatusCode::UNAUTHORIZED || code == StatusCode::FORBIDDEN {
        // The caller was let in here: it is this worker's own credential that was refused.
        return Err(Problem {
            code: StatusCode::BAD_GATEWAY,
            message: format!(
                "{pod} refused this worker's own credential ({code}): the app's worker Role must allow `get` on statefulstreamapps/query (the operator makes it), and the worker needs a ServiceAccount token"
            ),
            retry: false,
        });
    }
    Err(peer_problem(pod, code, &body))
}

/// What the caller is told of another worker's refusal: the statuses the query API answers
/// with, and the message of its problem document, bounded; anything else is a bad gateway,
/// and a body that is not a problem document is not passed on (it may be any server's).
fn peer_problem(pod: &str, code: StatusCode, body: &[u8]) -> Problem {
    const MAX_MESSAGE: usize = 1024;
    let passed = [
        StatusCode::BAD_REQUEST,
        StatusCode::NOT_FOUND,
        StatusCode::SERVICE_UNAVAILABLE,
    ];
    let answered = code;
    let code = if passed.contains(&answered) {
        answered
    } else {
        StatusCode::BAD_GATEWAY
    };
    let message = match serde_json::from_slice::<QueryProblem>(body) {
        Ok(p) if p.error.len() > MAX_MESSAGE => {
            let mut end = MAX_MESSAGE;
            while !p.error.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}...", &p.error[..end])
        }
        Ok(p) => p.error,
        Err(_) => format!(
            "answered {answered} without a problem document ({} bytes)",
            body.len()
        ),
    };
    Problem {
        code,
        message: format!("{pod}: {message}"),
        retry: code == StatusCode::SERVICE_UNAVAILABLE,
    }
}
