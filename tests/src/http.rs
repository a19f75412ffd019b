//! The suite's one HTTP client, for the daemon, Prometheus, VictoriaMetrics
//! and vmalert alike: one request writer and one response parser, over
//! plain TCP ([`send`]) or any stream a test brings, such as TLS
//! ([`exchange`]).
//!
//! Requests are `Connection: close` (HTTP/1.1) or HTTP/1.0, and the answer
//! is read to the end: no keep-alive, no chunked bodies to decode. A
//! malformed or truncated answer is an error, never a half response.

use std::{
    io::{Read, Write},
    net::{TcpStream, ToSocketAddrs as _},
    time::Duration,
};

/// One request; [`Request::get`] and the fields fill in the rest.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The path and query.
    pub path: &'a str,
    /// Extra headers (Host, Connection and Content-Length are written here).
    pub headers: &'a [(&'a str, String)],
    /// The body; a Content-Length goes with it unless the request is a
    /// bodiless GET.
    pub body: &'a [u8],
    /// HTTP/1.0, so the answer is never chunked (Prometheus's and
    /// VictoriaMetrics's APIs); otherwise HTTP/1.1 with
    /// `Connection: close`.
    pub http10: bool,
}

impl<'a> Request<'a> {
    /// `GET path` over HTTP/1.1, without extra headers.
    pub fn get(path: &'a str) -> Request<'a> {
        Request {
            method: "GET",
            path,
            headers: &[],
            body: b"",
            http10: false,
        }
    }

    /// The request's bytes, for a server reached as `host`.
    pub fn to_bytes(&self, host: &str) -> Vec<u8> {
        let version = if self.http10 { "1.0" } else { "1.1" };
        let mut r = format!(
            "{} {} HTTP/{version}\r\nHost: {host}\r\n",
            self.method, self.path
        );
        if !self.http10 {
            r.push_str("Connection: close\r\n");
        }
        for (k, v) in self.headers {
            r.push_str(&format!("{k}: {v}\r\n"));
        }
        if !self.body.is_empty() || self.method != "GET" {
            r.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        r.push_str("\r\n");
        let mut bytes = r.into_bytes();
        bytes.extend_from_slice(self.body);
        bytes
    }
}

/// A parsed answer.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Headers in the order sent.
    pub headers: Vec<(String, String)>,
    /// The body, cut to its Content-Length when there is one.
    pub body: Vec<u8>,
}

impl Response {
    /// A header's value (case-insensitive name), if present.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends `req` to `addr` over plain TCP and reads the whole answer;
/// `limit` bounds the connect and each read (an error, not a panic).
pub fn send(addr: &str, req: &Request, limit: Duration) -> std::io::Result<Response> {
    let to = addr.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{addr}: no address"),
        )
    })?;
    let mut s = TcpStream::connect_timeout(&to, limit)?;
    s.set_read_timeout(Some(limit))?;
    exchange(&mut s, addr, req)
}

/// Writes `req` for `host` on `stream`, which the caller connected (and
/// bounded with timeouts), and reads the whole answer.
pub fn exchange<S: Read + Write>(
    stream: &mut S,
    host: &str,
    req: &Request,
) -> std::io::Result<Response> {
    stream.write_all(&req.to_bytes(host))?;
    let mut raw = Vec::new();
    match stream.read_to_end(&mut raw) {
        Ok(_) => {}
        // A TLS peer that closes without close_notify: the answer is whole
        // if it parses with its Content-Length.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
        Err(e) => return Err(e),
    }
    parse_response(&raw)
}

/// Parses a whole answer: status line, headers, body (cut to its
/// Content-Length; shorter than it is an error).
pub fn parse_response(raw: &[u8]) -> std::io::Result<Response> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of head"))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad("no status"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[end + 4..].to_vec();
    if let Some(n) = headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
    {
        if body.len() < n {
            return Err(bad("body shorter than Content-Length"));
        }
        body.truncate(n);
    }
    Ok(Response {
        status,
        headers,
        body,
    })
}

/// A GET answering Prometheus-API JSON (`"status": "success"`, 200), over
/// HTTP/1.0, or why not.
pub fn get_json(addr: &str, path: &str, limit: Duration) -> Result<serde_json::Value, String> {
    let req = Request {
        http10: true,
        ..Request::get(path)
    };
    let r = send(addr, &req, limit).map_err(|e| format!("GET {path}: {e}"))?;
    let (code, body) = (r.status, &r.body);
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        format!(
            "GET {path}: {code}, not JSON ({e}): {}",
            String::from_utf8_lossy(&body[..body.len().min(300)])
        )
    })?;
    if code != 200 || v["status"] != "success" {
        return Err(format!(
            "GET {path}: {code} {}",
            String::from_utf8_lossy(&body[..body.len().min(500)])
        ));
    }
    Ok(v)
}
