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
//!
//! The files of this folder: `conn.rs` (admitting connections, their limits
//! and timeouts, TLS), `routes.rs` (what each path answers), `flight.rs`
//! (concurrent scrapes share one collection), `auth.rs` (basic
//! authentication and its cache), `body.rs` (response bodies, gzip) and
//! `query.rs` (the `/metrics/ranks` query, parsed as hostile input).

mod auth;
mod body;
mod conn;
mod flight;
mod query;
mod routes;

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use thiserror::Error;
use tokio::{
    net::{TcpListener, TcpSocket},
    sync::Semaphore,
};

pub use self::{
    body::Body,
    conn::{HANDSHAKE_TIMEOUT, HEADER_READ_TIMEOUT, MAX_CONNECTIONS},
    query::{MAX_JOBIDS, QueryError, ranks_query},
};
use self::{conn::Conns, flight::Flight};
use crate::{
    export::registry::State,
    export::web_config::{self, WebConfig},
};

/// How often, at most, the web config's files are checked for changes.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

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
        "serving {addr} {what}; configure tls_server_config and basic_auth_users in a --web.config.file (example: dashboards/deploy/web-config.yml)"
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
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
                    Ok(new) if new.tls.is_some() != web.current.tls.is_some() => log::warn!(
                        "{} now turns TLS {}; restart the daemon for that (keeping the previous configuration)",
                        path.display(),
                        if new.tls.is_some() { "on" } else { "off" }
                    ),
                    Ok(new) => {
                        log::info!("reloaded {}", path.display());
                        web.seen = new.stamps();
                        web.current = Arc::new(new);
                    }
                    Err(e) => log::warn!(
                        "keeping the previous web configuration: {}",
                        crate::one_line(&e)
                    ),
                }
            }
        }
        Some(web.current.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
