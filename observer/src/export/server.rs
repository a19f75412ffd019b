//! The HTTP(S) server: `GET /metrics`, `GET /metrics/ranks` (the full
//! per-rank series of chosen jobs, [`ranks_query`]), `GET /report.json` and
//! a landing page at `/`, on hyper
//! (HTTP/1.1) over the daemon's tokio runtime, optionally behind TLS and
//! basic authentication from a `--web.config.file` ([`crate::export::web_config`]).
//!
//! What keeps a node's exporter cheap and up whatever the network sends:
//!
//! - A request is handled only once hyper has parsed its whole head, and a
//!   scrape starts only once its body (if any) has arrived too: half a
//!   request costs no collection.
//! - Concurrent scrapes share one collection (a singleflight): a request
//!   that arrives while a collection runs waits for it and gets its result.
//!   Collections run on the blocking pool, one at a time, so the runtime
//!   thread never waits on them and the blocking pool never grows with
//!   the number of clients; so does bcrypt, one check at a time, its
//!   results cached.
//! - Headers must arrive within [`HEADER_READ_TIMEOUT`] (also the idle
//!   limit of a kept-alive connection), a TLS handshake within
//!   [`HANDSHAKE_TIMEOUT`].
//! - At most [`MAX_CONNECTIONS`] connections are open. A new one over the
//!   cap replaces the connection that has been idle longest: one that is
//!   not answering an authenticated, complete request (it may be in its
//!   TLS handshake, waiting for a request's head or body, or having its
//!   password checked). When every connection is busy answering, the new
//!   one is closed at once, before any task is spawned. So a flood of
//!   half-sent requests cannot keep a scraper out.
//! - Responses are gzipped for clients that send `Accept-Encoding: gzip`
//!   (Prometheus does), compressed once per collection.

use std::{
    collections::HashMap,
    convert::Infallible,
    io::Write as _,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use base64::Engine as _;
use http_body_util::BodyExt as _;
use hyper::{
    HeaderMap, Method, Request, Response, StatusCode,
    body::{Bytes, Frame, Incoming, SizeHint},
    header::{self, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use thiserror::Error;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpSocket, TcpStream},
    sync::{Semaphore, watch},
    task::AbortHandle,
};
use tokio_rustls::TlsAcceptor;

use crate::{
    export::registry::{self, State},
    export::web_config::{self, WebConfig},
};

/// Open connections at most; see the module documentation.
pub const MAX_CONNECTIONS: usize = 128;
/// Time a client has to send a request's head, from the connection's
/// start or the end of the previous response.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send a request body, and its size limit (a scrape
/// needs none).
const BODY_TIMEOUT: Duration = Duration::from_secs(10);
const MAX_BODY: usize = 64 * 1024;
/// hyper's read buffer per connection, which bounds a request head.
const MAX_HEAD: usize = 16 * 1024;
/// A connection takes no new request after this long, and is closed after
/// [`CLOSE_AFTER`] even mid-response (a client that reads too slowly).
const DRAIN_AFTER: Duration = Duration::from_secs(60);
const CLOSE_AFTER: Duration = Duration::from_secs(120);
/// How often, at most, the web config's files are checked for changes.
const RELOAD_CHECK: Duration = Duration::from_secs(1);
/// Remembered basic-auth checks (bcrypt costs tens of milliseconds).
const AUTH_CACHE: usize = 256;

/// Errors starting the server.
#[derive(Debug, Error)]
pub enum ServeError {
    /// Someone else listens there.
    #[error(
        "listen address {addr} is already in use: stop the other process or pick another with --listen HOST:PORT"
    )]
    InUse {
        /// The address.
        addr: SocketAddr,
    },
    /// Any other bind failure.
    #[error("cannot listen on {addr}: {source}; pick another address with --listen HOST:PORT")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The listen backlog (the kernel caps it at net.core.somaxconn): a burst
/// of connections while the runtime thread is busy waits in the kernel
/// instead of having its SYNs dropped and retried a second later.
const BACKLOG: u32 = 4096;

/// Binds the listening socket.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    let listen = || {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(BACKLOG)
    };
    listen().map_err(|source| {
        if source.kind() == std::io::ErrorKind::AddrInUse {
            ServeError::InUse { addr }
        } else {
            ServeError::Bind { addr, source }
        }
    })
}

/// The warning for serving a non-loopback address without TLS or without
/// authentication; `None` when there is nothing to warn about.
pub fn exposure_warning(addr: SocketAddr, web: Option<&WebConfig>) -> Option<String> {
    let loopback = match addr.ip() {
        IpAddr::V4(v4) => v4.is_loopback(),
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map_or(v6.is_loopback(), |v4| v4.is_loopback()),
    };
    let tls = web.is_some_and(|w| w.tls.is_some());
    let auth = web.is_some_and(WebConfig::authenticates);
    let what = match (loopback, tls, auth) {
        (true, _, _) | (false, true, true) => return None,
        (false, false, false) => {
            "without TLS and without authentication: anyone who can reach it can read the metrics"
        }
        (false, false, true) => "without TLS: passwords and metrics cross the network in clear",
        (false, true, false) => {
            "without authentication: anyone who can reach it can read the metrics"
        }
    };
    Some(format!(
        "warning: serving {addr} {what}; configure tls_server_config and basic_auth_users in a --web.config.file (example: dashboards/deploy/web-config.yml)"
    ))
}

/// Serves until the task is dropped. `web` adds TLS, basic auth and
/// response headers; without it, plain HTTP for everyone.
pub async fn serve(listener: TcpListener, state: Arc<Mutex<State>>, web: Option<WebConfig>) {
    let server = Arc::new(Server::new(state, web));
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(_) => {
                // Out of descriptors and the like: back off instead of
                // spinning on the error.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(id) = server.admit() else {
            // Over the cap and every connection busy: close at once.
            drop(tcp);
            continue;
        };
        let web = server.web();
        let task = tokio::spawn(server.clone().connection(tcp, id, web));
        server.set_abort(id, task.abort_handle());
    }
}

const LANDING: &str = "<!doctype html><html><head><title>mpi-observer</title></head><body>\
<h1>mpi-observer</h1><p>Per-rank MPI call statistics from eBPF probes on running MPI jobs.</p>\
<p><a href=\"/metrics\">Metrics</a> (bounded: per job, a few series per rank) &middot; \
<a href=\"/metrics/ranks\">Per-rank metrics</a> (every rank in full; <code>?jobid=J</code> for chosen jobs) &middot; \
<a href=\"/report.json\">Report data</a> (for <code>mpi-observer report --url</code>)</p></body></html>\n";

/// The answer to a plain HTTP request on the TLS port.
const PLAIN_TO_TLS: &[u8] = b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// Whether the first byte a client sends could start a TLS handshake (a
/// handshake record, 0x16); a client that sends nothing is left to the
/// handshake timeout.
async fn starts_like_tls(tcp: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    !matches!(tcp.peek(&mut first).await, Ok(1) if first[0].is_ascii_alphabetic())
}

const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT_TYPE: &str = "text/plain; charset=utf-8";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One collection's result, shared by every request that waited for it.
struct Collected {
    plain: Bytes,
    /// Compressed when a request of the flight asked for gzip.
    gzip: Option<Bytes>,
}

/// The collection under way.
struct Flight {
    result: watch::Receiver<Option<Arc<Collected>>>,
    /// Whether any request of this flight wants gzip.
    gzip: bool,
}

/// An open connection.
struct Conn {
    /// Answering a request: from the moment it is complete and
    /// authenticated until hyper drops the response body.
    busy: bool,
    /// When it last became idle (or was accepted).
    idle_since: Instant,
    abort: Option<AbortHandle>,
}

#[derive(Default)]
struct Conns {
    next: u64,
    live: HashMap<u64, Conn>,
}

/// The web config in force, reread when its files change.
struct Web {
    current: Arc<WebConfig>,
    last_check: Instant,
    seen: Vec<web_config::Stamp>,
}

struct Server {
    state: Arc<Mutex<State>>,
    flight: Mutex<Option<Flight>>,
    conns: Mutex<Conns>,
    web: Option<Mutex<Web>>,
    bcrypt: Arc<Semaphore>,
    /// `/metrics/ranks` collections run one at a time, so the blocking pool
    /// never grows with its clients.
    ranks: Arc<Semaphore>,
    auth_cache: Mutex<HashMap<[u8; 32], bool>>,
}

/// Marks a connection busy while a request is answered; dropped with the
/// response body (or the request, if the client goes away first).
struct Busy {
    server: Arc<Server>,
    id: u64,
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(c) = lock(&self.server.conns).live.get_mut(&self.id) {
            c.busy = false;
            c.idle_since = Instant::now();
        }
    }
}

/// Removes a connection from the table however its task ends.
struct Gone {
    server: Arc<Server>,
    id: u64,
}

impl Drop for Gone {
    fn drop(&mut self) {
        lock(&self.server.conns).live.remove(&self.id);
    }
}

/// A whole response body in one frame, keeping its connection busy until
/// hyper drops it.
pub struct Body {
    data: Option<Bytes>,
    _busy: Option<Busy>,
}

impl Body {
    fn new(data: impl Into<Bytes>) -> Body {
        Body {
            data: Some(data.into()),
            _busy: None,
        }
    }
}

impl hyper::body::Body for Body {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.data.take().map(|d| Ok(Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::new(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_TYPE));
    r
}

/// Whether `Accept-Encoding` admits gzip (a `q` of 0 refuses it).
fn accepts_gzip(h: &HeaderMap) -> bool {
    h.get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';');
            let coding = parts.next().unwrap_or("").trim();
            (coding.eq_ignore_ascii_case("gzip") || coding.eq_ignore_ascii_case("x-gzip"))
                && parts.all(|p| {
                    let p = p.trim();
                    match p.strip_prefix("q=").or_else(|| p.strip_prefix("Q=")) {
                        Some(q) => q.trim().parse::<f32>().is_ok_and(|q| q > 0.0),
                        None => true,
                    }
                })
        })
}

/// User and password of an `Authorization: Basic` header.
fn basic_credentials(v: Option<&HeaderValue>) -> Option<(String, Vec<u8>)> {
    let v = v?.to_str().ok()?.trim();
    let (scheme, token) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .ok()?;
    let colon = raw.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(raw[..colon].to_vec()).ok()?;
    Some((user, raw[colon + 1..].to_vec()))
}

/// The cache key of one check: a digest, so no password is kept.
fn auth_key(user: &str, hash: &str, pass: &[u8]) -> [u8; 32] {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in [user.as_bytes(), hash.as_bytes(), pass] {
        ctx.update(&(part.len() as u64).to_le_bytes());
        ctx.update(part);
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(ctx.finish().as_ref());
    key
}

fn gzip(data: &[u8]) -> Option<Bytes> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 8),
        flate2::Compression::fast(),
    );
    enc.write_all(data).ok()?;
    enc.finish().ok().map(Bytes::from)
}

impl Server {
    fn new(state: Arc<Mutex<State>>, web: Option<WebConfig>) -> Server {
        Server {
            state,
            flight: Mutex::new(None),
            conns: Mutex::new(Conns::default()),
            web: web.map(|w| {
                Mutex::new(Web {
                    seen: w.stamps(),
                    current: Arc::new(w),
                    last_check: Instant::now(),
                })
            }),
            bcrypt: Arc::new(Semaphore::new(1)),
            ranks: Arc::new(Semaphore::new(1)),
            auth_cache: Mutex::new(HashMap::new()),
        }
    }

    /// The web config in force, reloaded first if its files changed. A
    /// reload that fails keeps the old one, with a warning.
    fn web(&self) -> Option<Arc<WebConfig>> {
        let mut web = lock(self.web.as_ref()?);
        if web.last_check.elapsed() >= RELOAD_CHECK {
            web.last_check = Instant::now();
            let now = web.current.restamp();
            if now != web.seen {
                web.seen = now;
                let path = web.current.path().to_path_buf();
                match web_config::load(&path) {
                    Ok(new) if new.tls.is_some() != web.current.tls.is_some() => eprintln!(
                        "mpi-observer: warning: {} now turns TLS {}; restart the daemon for that (keeping the previous configuration)",
                        path.display(),
                        if new.tls.is_some() { "on" } else { "off" }
                    ),
                    Ok(new) => {
                        eprintln!("mpi-observer: reloaded {}", path.display());
                        web.seen = new.stamps();
                        web.current = Arc::new(new);
                    }
                    Err(e) => eprintln!(
                        "mpi-observer: warning: keeping the previous web configuration: {}",
                        crate::one_line(&e)
                    ),
                }
            }
        }
        Some(web.current.clone())
    }

    /// Admits a new connection, replacing the longest-idle one if at the
    /// cap; `None` if every connection is busy.
    fn admit(&self) -> Option<u64> {
        let mut conns = lock(&self.conns);
        if conns.live.len() >= MAX_CONNECTIONS {
            let victim = conns
                .live
                .iter()
                .filter(|(_, c)| !c.busy)
                .min_by_key(|(_, c)| c.idle_since)
                .map(|(&id, _)| id)?;
            if let Some(abort) = conns.live.remove(&victim).and_then(|c| c.abort) {
                abort.abort();
            }
        }
        let id = conns.next;
        conns.next += 1;
        conns.live.insert(
            id,
            Conn {
                busy: false,
                idle_since: Instant::now(),
                abort: None,
            },
        );
        Some(id)
    }

    fn set_abort(&self, id: u64, abort: AbortHandle) {
        match lock(&self.conns).live.get_mut(&id) {
            Some(c) => c.abort = Some(abort),
            // Already evicted.
            None => abort.abort(),
        }
    }

    fn busy(self: &Arc<Self>, id: u64) -> Busy {
        if let Some(c) = lock(&self.conns).live.get_mut(&id) {
            c.busy = true;
        }
        Busy {
            server: self.clone(),
            id,
        }
    }

    async fn connection(self: Arc<Self>, tcp: TcpStream, id: u64, web: Option<Arc<WebConfig>>) {
        let _gone = Gone {
            server: self.clone(),
            id,
        };
        let _ = tcp.set_nodelay(true);
        match web.as_ref().and_then(|w| w.tls.clone()) {
            Some(tls) => {
                let handshake = async {
                    if !starts_like_tls(&tcp).await {
                        // Plain HTTP to the TLS port: say so, as Go's
                        // servers do, instead of failing the handshake
                        // silently.
                        let mut tcp = tcp;
                        let _ = tcp.write_all(PLAIN_TO_TLS).await;
                        let _ = tcp.shutdown().await;
                        // Read what it sent, so closing does not reset
                        // the connection before it reads the answer.
                        let mut sink = [0u8; 4096];
                        let mut left = MAX_HEAD;
                        while left > 0 {
                            match tcp.read(&mut sink).await {
                                Ok(0) | Err(_) => break,
                                Ok(n) => left = left.saturating_sub(n),
                            }
                        }
                        return None;
                    }
                    TlsAcceptor::from(tls).accept(tcp).await.ok()
                };
                if let Ok(Some(stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                    self.http(TokioIo::new(stream), id, web).await;
                }
            }
            None => self.http(TokioIo::new(tcp), id, web).await,
        }
    }

    async fn http<I>(self: &Arc<Self>, io: I, id: u64, web: Option<Arc<WebConfig>>)
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let me = self.clone();
        let service = service_fn(move |req| {
            let me = me.clone();
            let web = web.clone();
            async move { Ok::<_, Infallible>(me.handle(req, id, web.as_deref()).await) }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_READ_TIMEOUT)
            .max_buf_size(MAX_HEAD)
            .half_close(true)
            .serve_connection(io, service);
        tokio::pin!(conn);
        tokio::select! {
            _ = conn.as_mut() => return,
            () = tokio::time::sleep(DRAIN_AFTER) => conn.as_mut().graceful_shutdown(),
        }
        let _ = tokio::time::timeout(CLOSE_AFTER - DRAIN_AFTER, conn).await;
    }

    /// One request: first all of it (its body, if any), then the
    /// credentials, and only then is the connection busy and the request
    /// answered. Until then the connection counts as idle and may be
    /// replaced by a new one when at the cap.
    async fn handle(
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

    /// Basic auth as exporter-toolkit does it: an unknown user is checked
    /// against a real hash anyway (no timing difference), one bcrypt at a
    /// time, results cached.
    async fn authorized(self: &Arc<Self>, w: &WebConfig, h: Option<&HeaderValue>) -> bool {
        let Some((user, pass)) = basic_credentials(h) else {
            return false;
        };
        let (hash, known) = match w.users.get(&user) {
            Some(hash) => (hash.clone(), true),
            None => match w.users.values().next() {
                Some(any) => (any.clone(), false),
                None => return false,
            },
        };
        let key = auth_key(&user, &hash, &pass);
        let cached = || lock(&self.auth_cache).get(&key).copied();
        if let Some(ok) = cached() {
            return ok && known;
        }
        // The permit travels with the check: a client that goes away does
        // not let a second bcrypt start beside it.
        let Ok(permit) = self.bcrypt.clone().acquire_owned().await else {
            return false;
        };
        if let Some(ok) = cached() {
            return ok && known;
        }
        let ok = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            bcrypt::verify(&pass, &hash).unwrap_or(false)
        })
        .await
        .unwrap_or(false);
        let mut cache = lock(&self.auth_cache);
        if cache.len() >= AUTH_CACHE {
            cache.clear();
        }
        cache.insert(key, ok);
        ok && known
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
        let me = self.clone();
        let Ok(json) = tokio::task::spawn_blocking(move || lock(&me.state).report_json()).await
        else {
            return text(StatusCode::INTERNAL_SERVER_ERROR, "collection failed\n");
        };
        let mut r = Response::new(Body::new(json));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    }

    /// Joins the collection under way, or starts one.
    async fn collect(self: &Arc<Self>, gzip: bool) -> Option<Arc<Collected>> {
        let mut result = {
            let mut flight = lock(&self.flight);
            match flight.as_mut() {
                Some(f) => {
                    f.gzip |= gzip;
                    f.result.clone()
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    *flight = Some(Flight {
                        result: rx.clone(),
                        gzip,
                    });
                    let me = self.clone();
                    // Detached: it completes, and is counted, even if every
                    // client waiting for it goes away.
                    tokio::task::spawn_blocking(move || me.run_collection(tx));
                    rx
                }
            }
        };
        let r = result.wait_for(Option::is_some).await.ok()?;
        r.clone()
    }

    /// One collection, on the blocking pool.
    fn run_collection(&self, tx: watch::Sender<Option<Arc<Collected>>>) {
        /// Ends the flight if the collection panics, so the next request
        /// starts a new one instead of joining a dead one.
        struct EndFlight<'a>(Option<&'a Mutex<Option<Flight>>>);
        impl Drop for EndFlight<'_> {
            fn drop(&mut self) {
                if let Some(f) = self.0 {
                    lock(f).take();
                }
            }
        }
        let mut end = EndFlight(Some(&self.flight));
        let text = lock(&self.state).scrape();
        registry::count_scrape();
        // Requests from now on start a new collection; those that joined
        // this one have said whether they want gzip.
        end.0 = None;
        let want_gzip = lock(&self.flight).take().is_some_and(|f| f.gzip);
        let plain = Bytes::from(text);
        let gzip = if want_gzip { gzip(&plain) } else { None };
        let _ = tx.send(Some(Arc::new(Collected { plain, gzip })));
    }
}

/// `jobid` parameters one `/metrics/ranks` request may name at most.
pub const MAX_JOBIDS: usize = 64;

/// Why a `/metrics/ranks` query was refused (400).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum QueryError {
    /// A parameter other than `jobid`.
    #[error(
        "unknown query parameter `{name}`: /metrics/ranks takes only jobid=JOB, repeated for several jobs"
    )]
    Unknown {
        /// The parameter's name, cut to the label cap.
        name: String,
    },
    /// More `jobid` parameters than [`MAX_JOBIDS`].
    #[error(
        "more than {MAX_JOBIDS} jobid parameters: split the request, or leave them out for every job"
    )]
    TooMany,
    /// A value that is not percent-encoded UTF-8.
    #[error("a jobid is not valid percent-encoded UTF-8: encode it as a URL query value")]
    Encoding,
    /// A value longer than any job id label.
    #[error(
        "a jobid is longer than {} bytes, the longest a jobid label can be",
        crate::attach::identity::LABEL_CAP
    )]
    TooLong,
}

/// Decodes one query component: `%XX` escapes and `+` for a space.
fn percent_decode(s: &str) -> Result<String, QueryError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3).ok_or(QueryError::Encoding)?;
                let hex = std::str::from_utf8(hex).map_err(|_| QueryError::Encoding)?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| QueryError::Encoding)?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| QueryError::Encoding)
}

/// The jobs a `/metrics/ranks` query names: `None` without any `jobid`
/// (every job). Hostile input: at most [`MAX_JOBIDS`] values, each at most
/// the label cap once decoded; anything else is refused.
pub fn ranks_query(query: Option<&str>) -> Result<Option<Vec<String>>, QueryError> {
    let mut jobs = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "jobid" {
            let name = percent_decode(name).unwrap_or_else(|_| name.to_string());
            return Err(QueryError::Unknown {
                name: crate::attach::identity::cut(&name, crate::attach::identity::LABEL_CAP)
                    .to_string(),
            });
        }
        if jobs.len() == MAX_JOBIDS {
            return Err(QueryError::TooMany);
        }
        // Checked before decoding too, so a huge value costs nothing.
        if value.len() > 3 * crate::attach::identity::LABEL_CAP {
            return Err(QueryError::TooLong);
        }
        let v = percent_decode(value)?;
        if v.len() > crate::attach::identity::LABEL_CAP {
            return Err(QueryError::TooLong);
        }
        jobs.push(v);
    }
    Ok((!jobs.is_empty()).then_some(jobs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_queries() {
        assert_eq!(ranks_query(None), Ok(None));
        assert_eq!(ranks_query(Some("")), Ok(None));
        assert_eq!(
            ranks_query(Some("jobid=42&jobid=a%20b%22c&jobid=x+y")),
            Ok(Some(vec!["42".into(), "a b\"c".into(), "x y".into()]))
        );
        assert_eq!(
            ranks_query(Some("jobid=%E2%9C%93")),
            Ok(Some(vec!["\u{2713}".into()]))
        );
        for bad in ["jobid=%", "jobid=%zz", "jobid=%ff", "jobid=%4"] {
            assert_eq!(ranks_query(Some(bad)), Err(QueryError::Encoding), "{bad}");
        }
        assert!(matches!(
            ranks_query(Some("jobid=1&rank=0")),
            Err(QueryError::Unknown { name }) if name == "rank"
        ));
        let many = vec!["jobid=1"; MAX_JOBIDS + 1].join("&");
        assert_eq!(ranks_query(Some(&many)), Err(QueryError::TooMany));
        assert!(ranks_query(Some(&many[8..])).is_ok());
        let long = format!("jobid={}", "j".repeat(129));
        assert_eq!(ranks_query(Some(&long)), Err(QueryError::TooLong));
        let huge = format!("jobid={}", "%41".repeat(100_000));
        assert_eq!(ranks_query(Some(&huge)), Err(QueryError::TooLong));
        // Every refusal is one line.
        for e in [
            QueryError::TooMany,
            QueryError::Encoding,
            QueryError::TooLong,
        ] {
            assert!(!e.to_string().contains('\n'));
        }
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn gzip_negotiation() {
        assert!(accepts_gzip(&headers(&[("accept-encoding", "gzip")])));
        assert!(accepts_gzip(&headers(&[(
            "accept-encoding",
            "br;q=1.0, gzip;q=0.8, *;q=0.1"
        )])));
        assert!(accepts_gzip(&headers(&[
            ("accept-encoding", "identity"),
            ("accept-encoding", "GZIP")
        ])));
        assert!(!accepts_gzip(&headers(&[("accept-encoding", "gzip;q=0")])));
        assert!(!accepts_gzip(&headers(&[(
            "accept-encoding",
            "deflate, br"
        )])));
        assert!(!accepts_gzip(&headers(&[])));
    }

    #[test]
    fn basic_credentials_parse() {
        let h = HeaderValue::from_static("Basic cHJvbWV0aGV1czpzM2NyZXQ6eA==");
        assert_eq!(
            basic_credentials(Some(&h)),
            Some(("prometheus".to_string(), b"s3cret:x".to_vec()))
        );
        let h = HeaderValue::from_static("Bearer abc");
        assert_eq!(basic_credentials(Some(&h)), None);
        let h = HeaderValue::from_static("Basic !!!");
        assert_eq!(basic_credentials(Some(&h)), None);
        assert_eq!(basic_credentials(None), None);
    }

    /// Requests that arrive while a collection runs share it: with the
    /// state held, eight scrapes come in; released, one collection answers
    /// them all with the same body.
    #[test]
    fn concurrent_scrapes_share_one_collection() {
        use std::io::{Read as _, Write as _};

        use crate::export::metrics::RenderOptions;

        let state = Arc::new(Mutex::new(State::new(
            None,
            Vec::new(),
            true,
            RenderOptions::default(),
        )));
        let (tx, rx) = std::sync::mpsc::channel();
        let served = state.clone();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let l = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
                    tx.send(l.local_addr().unwrap()).unwrap();
                    serve(l, served, None).await;
                });
        });
        let addr = rx.recv().unwrap();
        let get = move || {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out.split_once("\r\n\r\n").unwrap().1.to_string()
        };
        get();
        let before = registry::scrapes_total();
        let held = state.lock().unwrap();
        let clients: Vec<_> = (0..8).map(|_| std::thread::spawn(get)).collect();
        // Generous: every request must have arrived and joined.
        std::thread::sleep(Duration::from_secs(1));
        assert_eq!(
            registry::scrapes_total(),
            before,
            "nothing completes while held"
        );
        drop(held);
        let bodies: Vec<String> = clients.into_iter().map(|c| c.join().unwrap()).collect();
        assert_eq!(
            registry::scrapes_total(),
            before + 1,
            "one collection for all eight"
        );
        assert!(bodies.iter().all(|b| *b == bodies[0]), "one shared result");
        assert!(bodies[0].contains("mpi_observer_scrapes_total"));
    }

    #[test]
    fn exposure_warnings() {
        let lo: SocketAddr = "127.0.0.1:9479".parse().unwrap();
        let any: SocketAddr = "0.0.0.0:9479".parse().unwrap();
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:9479".parse().unwrap();
        assert_eq!(exposure_warning(lo, None), None);
        assert_eq!(exposure_warning(mapped, None), None);
        let w = exposure_warning(any, None).unwrap();
        assert!(w.contains("without TLS and without authentication"), "{w}");
        assert!(!w.contains('\n'));
    }
}
