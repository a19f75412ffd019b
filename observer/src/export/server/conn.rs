//! Connections: admitting them under the cap (the longest-idle one makes
//! room, a busy one never does), their time limits, TLS and its handshake,
//! and hyper's HTTP/1.1 on each.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::Arc,
    time::{Duration, Instant},
};

use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    task::AbortHandle,
};
use tokio_rustls::TlsAcceptor;

use super::{Server, lock};
use crate::export::web_config::WebConfig;

/// Open connections at most; see [`crate::export::server`].
pub const MAX_CONNECTIONS: usize = 128;
/// Time a client has to send a request's head, from the connection's
/// start or the end of the previous response.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send a request body, and its size limit (a scrape
/// needs none).
pub(super) const BODY_TIMEOUT: Duration = Duration::from_secs(10);
pub(super) const MAX_BODY: usize = 64 * 1024;
/// hyper's read buffer per connection, which bounds a request head.
const MAX_HEAD: usize = 16 * 1024;
/// A connection takes no new request after this long, and is closed after
/// [`CLOSE_AFTER`] even mid-response (a client that reads too slowly).
const DRAIN_AFTER: Duration = Duration::from_secs(60);
const CLOSE_AFTER: Duration = Duration::from_secs(120);

/// The answer to a plain HTTP request on the TLS port.
const PLAIN_TO_TLS: &[u8] = b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// Whether the first byte a client sends could start a TLS handshake (a
/// handshake record, 0x16); a client that sends nothing is left to the
/// handshake timeout.
async fn starts_like_tls(tcp: &TcpStream) -> bool {
    let mut first = [0u8; 1];
    !matches!(tcp.peek(&mut first).await, Ok(1) if first[0].is_ascii_alphabetic())
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
pub(super) struct Conns {
    next: u64,
    live: HashMap<u64, Conn>,
}

/// Marks a connection busy while a request is answered; dropped with the
/// response body (or the request, if the client goes away first).
pub(super) struct Busy {
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

impl Server {
    /// Admits a new connection, replacing the longest-idle one if at the
    /// cap; `None` if every connection is busy.
    pub(super) fn admit(&self) -> Option<u64> {
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

    pub(super) fn set_abort(&self, id: u64, abort: AbortHandle) {
        match lock(&self.conns).live.get_mut(&id) {
            Some(c) => c.abort = Some(abort),
            // Already evicted.
            None => abort.abort(),
        }
    }

    pub(super) fn busy(self: &Arc<Self>, id: u64) -> Busy {
        if let Some(c) = lock(&self.conns).live.get_mut(&id) {
            c.busy = true;
        }
        Busy {
            server: self.clone(),
            id,
        }
    }

    pub(super) async fn connection(
        self: Arc<Self>,
        tcp: TcpStream,
        id: u64,
        web: Option<Arc<WebConfig>>,
    ) {
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
}
