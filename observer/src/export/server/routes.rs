//! What each path answers: `/metrics` (from the shared collection),
//! `/metrics/ranks`, `/report.json`, `/waits/records` (the wait records
//! of jobs that span nodes, for the other nodes' daemons) and the landing
//! page; and the order a request is taken in: its body, then its
//! credentials, then the answer.

use std::sync::Arc;

use http_body_util::BodyExt as _;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{self, HeaderValue},
};

use super::{
    Server,
    body::{Body, METRICS_TYPE, TEXT_TYPE, accepts_gzip, gzip, text},
    conn::{BODY_TIMEOUT, MAX_BODY},
    lock,
    query::ranks_query,
};
use crate::export::web_config::WebConfig;

const LANDING: &str = "<!doctype html><html><head><title>mpi-observer</title></head><body>\
<h1>mpi-observer</h1><p>Per-rank MPI call statistics from eBPF probes on running MPI jobs.</p>\
<p><a href=\"/metrics\">Metrics</a> (bounded: per job, a few series per rank) &middot; \
<a href=\"/metrics/ranks\">Per-rank metrics</a> (every rank in full; <code>?jobid=J</code> for chosen jobs) &middot; \
<a href=\"/report.json\">Report data</a> (for <code>mpi-observer report --url</code>) &middot; \
<a href=\"/waits/records\">Wait records</a> (of jobs spanning nodes, for <code>--waits.peers</code>; <code>?after=N&amp;jobs=K,...</code>)</p></body></html>\n";

/// The one line of a refused `/waits/records` query.
const WAITS_QUERY_ERROR: &str = "the /waits/records query takes after=N, N a decimal cursor from 0 to 18446744073709551615 (the `next` of the last answer), and optionally &jobs=K,K,... (at most 64 job keys of 16 lowercase hex digits, none for no job), each once\n";

/// A `/waits/records` query: the cursor, and the jobs asked for.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct WaitsQuery {
    /// `after=N`: 0 if not given.
    pub after: u64,
    /// `jobs=K,...`: their [`outbox::job_key`]s; every job's if not given.
    ///
    /// [`outbox::job_key`]: crate::export::registry::outbox::job_key
    pub jobs: Option<Vec<u64>>,
}

/// Reads a `/waits/records` query: `after=N`, N decimal digits that fit a
/// u64, and `jobs=K,K,...`, at most [`MAX_FILTER`] keys of exactly 16
/// lowercase hex digits (none: no job), each parameter at most once, in
/// either order; nothing is `after=0` of every job. A user's input:
/// anything else, a sign, an escape, another parameter, is refused, and
/// nothing of it is said back.
///
/// [`MAX_FILTER`]: crate::export::registry::outbox::MAX_FILTER
pub(super) fn waits_query(query: Option<&str>) -> Result<WaitsQuery, &'static str> {
    use crate::export::registry::outbox::MAX_FILTER;
    let mut q = WaitsQuery {
        after: 0,
        jobs: None,
    };
    let Some(query) = query.filter(|q| !q.is_empty()) else {
        return Ok(q);
    };
    let mut after = false;
    for param in query.split('&') {
        if let Some(n) = param.strip_prefix("after=") {
            // 20 digits at most: u64's; parse refuses what overflows.
            if after || n.is_empty() || n.len() > 20 || !n.bytes().all(|b| b.is_ascii_digit()) {
                return Err(WAITS_QUERY_ERROR);
            }
            q.after = n.parse::<u64>().map_err(|_| WAITS_QUERY_ERROR)?;
            after = true;
        } else if let Some(keys) = param.strip_prefix("jobs=") {
            if q.jobs.is_some() {
                return Err(WAITS_QUERY_ERROR);
            }
            let mut jobs = Vec::new();
            // `jobs=` alone names no job.
            let keys = (!keys.is_empty()).then(|| keys.split(','));
            for k in keys.into_iter().flatten() {
                let hex =
                    k.len() == 16 && k.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
                if !hex || jobs.len() == MAX_FILTER {
                    return Err(WAITS_QUERY_ERROR);
                }
                jobs.push(u64::from_str_radix(k, 16).map_err(|_| WAITS_QUERY_ERROR)?);
            }
            q.jobs = Some(jobs);
        } else {
            return Err(WAITS_QUERY_ERROR);
        }
    }
    Ok(q)
}

impl Server {
    /// One request: first all of it (its body, if any), then the
    /// credentials, and only then is the connection busy and the request
    /// answered. Until then the connection counts as idle and may be
    /// replaced by a new one when at the cap.
    pub(super) async fn handle(
        self: &Arc<Self>,
        req: Request<Incoming>,
        id: u64,
        web: Option<&WebConfig>,
    ) -> Response<Body> {
        let (req, body) = req.into_parts();
        let body = http_body_util::Limited::new(body, MAX_BODY).collect();
        let mut resp = if !matches!(tokio::time::timeout(BODY_TIMEOUT, body).await, Ok(Ok(_))) {
            text(StatusCode::BAD_REQUEST, "incomplete or oversized request\n")
        } else if let Some(w) = web.filter(|w| !w.users.is_empty())
            && !self
                .authorized(w, req.headers.get(header::AUTHORIZATION))
                .await
        {
            let mut r = text(StatusCode::UNAUTHORIZED, "Unauthorized\n");
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"mpi-observer\""),
            );
            r
        } else {
            let busy = self.busy(id);
            let mut r = self.route(&req).await;
            r.body_mut()._busy = Some(busy);
            r
        };
        if let Some(w) = web {
            for (name, value) in &w.headers {
                resp.headers_mut().insert(name.clone(), value.clone());
            }
        }
        resp
    }

    async fn route(self: &Arc<Self>, req: &hyper::http::request::Parts) -> Response<Body> {
        match (&req.method, req.uri.path()) {
            (&Method::GET, "/metrics") => self.metrics(accepts_gzip(&req.headers)).await,
            (&Method::GET, "/metrics/ranks") => match ranks_query(req.uri.query()) {
                Ok(jobs) => self.ranks(jobs, accepts_gzip(&req.headers)).await,
                Err(e) => {
                    let mut r = Response::new(Body::new(format!("{e}\n")));
                    *r.status_mut() = StatusCode::BAD_REQUEST;
                    r.headers_mut()
                        .insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_TYPE));
                    r
                }
            },
            (&Method::GET, "/report.json") => self.report().await,
            (&Method::GET, "/waits/records") => match waits_query(req.uri.query()) {
                Ok(q) => self.waits_records(q).await,
                Err(e) => text(StatusCode::BAD_REQUEST, e),
            },
            (&Method::GET, "/") => {
                let mut r = Response::new(Body::new(LANDING));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/html; charset=utf-8"),
                );
                r
            }
            (&Method::GET, _) => text(StatusCode::NOT_FOUND, "not found\n"),
            _ => {
                let mut r = text(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
                r.headers_mut()
                    .insert(header::ALLOW, HeaderValue::from_static("GET"));
                r
            }
        }
    }
    async fn metrics(self: &Arc<Self>, gzip: bool) -> Response<Body> {
        let Some(c) = self.collect(gzip).await else {
            return text(StatusCode::INTERNAL_SERVER_ERROR, "collection failed\n");
        };
        let (data, encoded) = match (&c.gzip, gzip) {
            (Some(z), true) => (z.clone(), true),
            _ => (c.plain.clone(), false),
        };
        let mut r = Response::new(Body::new(data));
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(METRICS_TYPE));
        h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        if encoded {
            h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        r
    }

    /// `/metrics/ranks`: the full per-rank series of `jobs` (every job
    /// with `None`), from a collection of its own on the blocking pool (its
    /// text differs from /metrics', so it never joins that flight).
    async fn ranks(self: &Arc<Self>, jobs: Option<Vec<String>>, gzip: bool) -> Response<Body> {
        let Ok(permit) = self.ranks.clone().acquire_owned().await else {
            return text(StatusCode::INTERNAL_SERVER_ERROR, "collection failed\n");
        };
        let me = self.clone();
        let Ok(text) = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            lock(&me.state).scrape_ranks(jobs.as_deref())
        })
        .await
        else {
            return text(StatusCode::INTERNAL_SERVER_ERROR, "collection failed\n");
        };
        let plain = Bytes::from(text);
        let zipped = if gzip { self::gzip(&plain) } else { None };
        let mut r = Response::new(Body::new(zipped.clone().unwrap_or(plain)));
        let h = r.headers_mut();
        h.insert(header::CONTENT_TYPE, HeaderValue::from_static(METRICS_TYPE));
        h.insert(header::VARY, HeaderValue::from_static("Accept-Encoding"));
        if zipped.is_some() {
            h.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        r
    }

    /// The ranks' report data (`mpi-observer report --url`), from a
    /// collection of its own on the blocking pool.
    async fn report(self: &Arc<Self>) -> Response<Body> {
        self.json_off_pool(|state| state.report_json()).await
    }

    /// The wait records after cursor `after` of jobs that span nodes
    /// (crate::export::registry::outbox), for another node's daemon.
    async fn waits_records(self: &Arc<Self>, q: WaitsQuery) -> Response<Body> {
        self.json_off_pool(move |state| {
            let a = state.outbox.answer_jobs(q.after, q.jobs.as_deref());
            crate::export::registry::outbox::json(&a).into_bytes()
        })
        .await
    }

    /// A JSON answer made by `make` under the state's lock, on the
    /// blocking pool (as every answer that takes the lock).
    async fn json_off_pool(
        self: &Arc<Self>,
        make: impl FnOnce(&mut crate::export::registry::State) -> Vec<u8> + Send + 'static,
    ) -> Response<Body> {
        let me = self.clone();
        let Ok(json) = tokio::task::spawn_blocking(move || make(&mut lock(&me.state))).await else {
            return text(StatusCode::INTERNAL_SERVER_ERROR, "collection failed\n");
        };
        let mut r = Response::new(Body::new(json));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }
}

#[cfg(test)]
mod tests {
    use super::{WaitsQuery, waits_query};

    fn q(after: u64, jobs: Option<Vec<u64>>) -> Result<WaitsQuery, &'static str> {
        Ok(WaitsQuery { after, jobs })
    }

    #[test]
    fn the_waits_query_is_a_cursor_and_jobs_or_nothing() {
        assert_eq!(waits_query(None), q(0, None));
        assert_eq!(waits_query(Some("")), q(0, None));
        assert_eq!(waits_query(Some("after=0")), q(0, None));
        assert_eq!(waits_query(Some("after=0042")), q(42, None));
        assert_eq!(
            waits_query(Some("after=18446744073709551615")),
            q(u64::MAX, None)
        );
        assert_eq!(waits_query(Some("after=3&jobs=")), q(3, Some(vec![])));
        assert_eq!(
            waits_query(Some("jobs=00000000000000ff,ffffffffffffffff&after=3")),
            q(3, Some(vec![255, u64::MAX]))
        );
        assert_eq!(
            waits_query(Some("jobs=0123456789abcdef")),
            q(0, Some(vec![0x0123_4567_89ab_cdef]))
        );
        let most = vec!["0000000000000001"; 64].join(",");
        assert_eq!(
            waits_query(Some(&format!("after=1&jobs={most}"))),
            q(1, Some(vec![1; 64]))
        );
        let too_many = format!("after=1&jobs={most},0000000000000001");
        for bad in [
            too_many.as_str(),
            "jobs=1",
            "jobs=00000000000000FF",
            "jobs=000000000000000g",
            "jobs=+000000000000001",
            "jobs=00000000000000001",
            "jobs=0000000000000001,",
            "jobs=,0000000000000001",
            "jobs=0000000000000001,,0000000000000002",
            "jobs=&jobs=",
            "jobs=%30000000000000001",
            "after=1&jobs",
            "after=1&",
            "&after=1",
            "after=",
            "after=-1",
            "after=+1",
            "after= 1",
            "after=1 ",
            "after=1&after=2",
            "after=1&x=2",
            "x=1",
            "AFTER=1",
            "after",
            "after=0x10",
            "after=1e3",
            "after=%31",
            "after=18446744073709551616",
            "after=000000000000000000001",
            "after=1\n2",
            "after=\u{0663}",
            "&",
        ] {
            let e = waits_query(Some(bad)).unwrap_err();
            assert!(e.ends_with('\n') && e.matches('\n').count() == 1, "{bad}");
            assert!(e.contains("after=N") && e.contains("jobs="), "{bad}: {e}");
        }
    }
}
