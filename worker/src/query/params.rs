//! A query request's parameters, checked (an unknown one is an error, not ignored), and the
//! error answers: what went wrong, where, and what to do.

use super::locate::Freshness;
use super::read::{DEFAULT_LIMIT, MAX_LIMIT};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use eddy_crds::query::QueryProblem;
use std::collections::HashMap;

/// Seconds a caller is asked to wait before retrying a request no copy could answer.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// An error answer: what went wrong, where, and what to do.
#[derive(Debug)]
pub struct Problem {
    pub code: StatusCode,
    pub message: String,
    pub retry: bool,
}

impl Problem {
    pub fn bad(message: impl Into<String>) -> Self {
        Problem {
            code: StatusCode::BAD_REQUEST,
            message: message.into(),
            retry: false,
        }
    }
    pub fn retry(message: impl Into<String>) -> Self {
        Problem {
            code: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            retry: true,
        }
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let body = QueryProblem {
            error: self.message,
            retry_after_seconds: self.retry.then_some(RETRY_AFTER_SECONDS),
        };
        let mut r = (self.code, axum::Json(body)).into_response();
        if self.retry {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        r
    }
}

/// The request's parameters, checked: an unknown one is an error, not ignored.
pub struct Params {
    raw: HashMap<String, String>,
}

impl Params {
    pub fn parse(query: Option<String>, allowed: &[&str]) -> Result<Self, Problem> {
        let raw: HashMap<String, String> = match query {
            Some(q) => form_urlencoded::parse(q.as_bytes()).into_owned().collect(),
            None => HashMap::new(),
        };
        if let Some(k) = raw.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(Problem::bad(format!(
                "unknown parameter {k:?}: this request takes {}",
                allowed.join(", ")
            )));
        }
        Ok(Params { raw })
    }

    pub fn text(&self, name: &str) -> Option<&str> {
        self.raw.get(name).map(String::as_str)
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>, Problem> {
        self.text(name)
            .map(|t| {
                t.parse::<i64>().map_err(|_| {
                    Problem::bad(format!(
                        "{name}={t:?}: expected an integer (milliseconds since the epoch for times)"
                    ))
                })
            })
            .transpose()
    }

    pub fn limit(&self) -> Result<usize, Problem> {
        match self.text("limit") {
            None => Ok(DEFAULT_LIMIT),
            Some(t) => match t.parse::<usize>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
                _ => Err(Problem::bad(format!(
                    "limit={t:?}: expected 1 to {MAX_LIMIT} (default {DEFAULT_LIMIT}); page on with `after`"
                ))),
            },
        }
    }

    pub fn freshness(&self) -> Result<Freshness, Problem> {
        match self.text("maxLag") {
            None => Ok(Freshness::Active),
            Some("any") => Ok(Freshness::Any),
            Some(t) => match t.parse::<i64>() {
                Ok(n) if n >= 0 => Ok(Freshness::MaxLag(n)),
                _ => Err(Problem::bad(format!(
                    "maxLag={t:?}: expected a number of changelog records (0 or more) or `any`"
                ))),
            },
        }
    }

    pub fn after(&self) -> Result<Option<Vec<u8>>, Problem> {
        self.text("after")
            .map(|t| {
                hex_decode(t).ok_or_else(|| {
                    Problem::bad(format!(
                        "after={t:?}: expected the `next` of a previous page"
                    ))
                })
            })
            .transpose()
    }
}

pub const PAGE: &[&str] = &["limit", "after", "maxLag", "partition"];

pub fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn hex_decode(t: &str) -> Option<Vec<u8>> {
    if !t.len().is_multiple_of(2) {
        return None;
    }
    (0..t.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(t.get(i..i + 2)?, 16).ok())
        .collect()
}

pub fn internal(e: impl std::fmt::Display) -> Problem {
    Problem {
        code: StatusCode::INTERNAL_SERVER_ERROR,
        message: e.to_string(),
        retry: false,
    }
}
