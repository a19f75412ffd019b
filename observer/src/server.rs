//! A deliberately small HTTP/1.1 server: `GET /metrics` and a landing page
//! at `/`. Each connection gets one response and is closed; scrapes run on
//! the blocking pool so the control loop never waits on a slow client.

use std::{
    io,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use thiserror::Error;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};

use crate::registry::State;

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
        source: io::Error,
    },
}

/// Binds the listening socket.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr).await.map_err(|source| {
        if source.kind() == io::ErrorKind::AddrInUse {
            ServeError::InUse { addr }
        } else {
            ServeError::Bind { addr, source }
        }
    })
}

/// Extra exposition text appended by other collectors (the shim's segments).
pub type Extra = Arc<dyn Fn() -> String + Send + Sync>;

/// Serves until the task is dropped.
pub async fn serve(listener: TcpListener, state: Arc<Mutex<State>>, extra: Option<Extra>) {
    loop {
        let Ok((conn, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        let extra = extra.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(30), handle(conn, state, extra)).await;
        });
    }
}

const LANDING: &str = "<!doctype html><html><head><title>mpi-observer</title></head><body>\
<h1>mpi-observer</h1><p>Per-rank MPI call statistics from eBPF probes on running MPI jobs.</p>\
<p><a href=\"/metrics\">Metrics</a></p></body></html>\n";

async fn handle(
    mut conn: TcpStream,
    state: Arc<Mutex<State>>,
    extra: Option<Extra>,
) -> io::Result<()> {
    let mut buf = vec![0u8; 8192];
    let mut n = 0;
    while n < buf.len() {
        let r = conn.read(&mut buf[n..]).await?;
        if r == 0 {
            break;
        }
        n += r;
        if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let req = String::from_utf8_lossy(&buf[..n]);
    let mut parts = req.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => {
            let body = tokio::task::spawn_blocking(move || {
                let extra = extra.map(|f| f()).unwrap_or_default();
                let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
                st.scrape(&extra)
            })
            .await
            .unwrap_or_default();
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body)
        }
        ("GET", "/") => ("200 OK", "text/html; charset=utf-8", LANDING.to_string()),
        ("GET", _) => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found\n".to_string(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await?;
    conn.write_all(body.as_bytes()).await?;
    conn.shutdown().await
}
