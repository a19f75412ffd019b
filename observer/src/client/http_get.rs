//! A small blocking HTTP/1.1 GET for the commands that read a daemon
//! (`report --url`): plain HTTP, optional basic authentication from the
//! URL's user information, a deadline on the whole exchange, and bodies
//! sized by Content-Length, chunked, or ended by the connection's close.

use std::{
    io::{self, BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpStream, ToSocketAddrs as _},
    time::{Duration, Instant},
};

use base64::Engine as _;
use thiserror::Error;

/// Largest body accepted.
const MAX_BODY: usize = 512 << 20;

/// Errors of a GET.
#[derive(Debug, Error)]
pub enum FetchError {
    /// Not an `http://host:port/...` URL.
    #[error(
        "`{url}` is not an observer's address: give http://HOST:PORT (as `attach --listen` serves){hint}"
    )]
    BadUrl {
        /// The URL.
        url: String,
        /// More about what was wrong.
        hint: &'static str,
    },
    /// No connection, or the exchange failed.
    #[error(
        "no answer from {url}: {source}; is `mpi-observer attach` running and listening there?"
    )]
    Io {
        /// The URL.
        url: String,
        /// The I/O error.
        source: io::Error,
    },
    /// An answer that is not a successful HTTP response.
    #[error("{url} answered {status}: {why}")]
    Status {
        /// The URL.
        url: String,
        /// The status line, or what was received instead.
        status: String,
        /// What to do.
        why: &'static str,
    },
}

/// A parsed `http://[user:pass@]host[:port][/path]`.
#[derive(Debug, PartialEq, Eq)]
pub struct Url {
    /// `host:port`.
    pub authority: String,
    /// The path, `/` at least.
    pub path: String,
    /// `user:password`, if given.
    pub userinfo: Option<String>,
}

impl Url {
    /// Parses `url`; a bare `host:port` is taken as `http://host:port`.
    pub fn parse(url: &str) -> Result<Url, FetchError> {
        let bad = |hint| FetchError::BadUrl {
            url: url.into(),
            hint,
        };
        if url.starts_with("https://") {
            return Err(bad(
                "; this client speaks plain HTTP only: read a TLS daemon's report from its --report-file, or give it a loopback --listen",
            ));
        }
        let rest = url.strip_prefix("http://").unwrap_or(url);
        if rest.contains("://") {
            return Err(bad(""));
        }
        let (hostpart, path) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].to_string()),
            None => (rest, "/".to_string()),
        };
        let (userinfo, authority) = match hostpart.rsplit_once('@') {
            Some((u, a)) => (Some(u.to_string()), a),
            None => (None, hostpart),
        };
        if authority.is_empty() || authority.contains(char::is_whitespace) {
            return Err(bad(""));
        }
        let authority = if authority.ends_with(']') || !authority.contains(':') {
            format!("{authority}:80")
        } else {
            authority.to_string()
        };
        Ok(Url {
            authority,
            path,
            userinfo,
        })
    }

    /// The same server, another path.
    pub fn with_path(&self, path: &str) -> Url {
        Url {
            authority: self.authority.clone(),
            path: path.into(),
            userinfo: self.userinfo.clone(),
        }
    }

    /// The URL for messages: never the password.
    pub fn shown(&self) -> String {
        format!("http://{}{}", self.authority, self.path)
    }
}

/// GETs `url` within `timeout`; returns the body of a 200 answer.
pub fn get(url: &Url, timeout: Duration) -> Result<Vec<u8>, FetchError> {
    let shown = url.shown();
    let io_err = |source| FetchError::Io {
        url: shown.clone(),
        source,
    };
    let deadline = Instant::now() + timeout;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, "timed out"))
    };
    let addrs: Vec<_> = url.authority.to_socket_addrs().map_err(io_err)?.collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, "no address");
    let mut conn = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, left().map_err(io_err)?) {
            Ok(s) => {
                conn = Some(s);
                break;
            }
            Err(e) => last = e,
        }
    }
    let mut tcp = conn.ok_or_else(|| io_err(last))?;
    tcp.set_read_timeout(Some(left().map_err(io_err)?))
        .map_err(io_err)?;
    tcp.set_write_timeout(Some(left().map_err(io_err)?))
        .map_err(io_err)?;
    let mut req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: mpi-observer/{}\r\nAccept: */*\r\nConnection: close\r\n",
        url.path,
        url.authority,
        env!("CARGO_PKG_VERSION")
    );
    if let Some(u) = &url.userinfo {
        let _ = std::fmt::Write::write_fmt(
            &mut req,
            format_args!(
                "Authorization: Basic {}\r\n",
                base64::engine::general_purpose::STANDARD.encode(u)
            ),
        );
    }
    req.push_str("\r\n");
    tcp.write_all(req.as_bytes()).map_err(io_err)?;
    let mut r = BufReader::new(tcp);
    let mut status = String::new();
    r.read_line(&mut status).map_err(io_err)?;
    let status = status.trim_end().to_string();
    let code = status
        .strip_prefix("HTTP/1.")
        .and_then(|s| s.get(2..5))
        .and_then(|c| c.parse::<u16>().ok());
    let Some(code) = code else {
        return Err(FetchError::Status {
            url: shown,
            status: format!("`{}`", status.chars().take(60).collect::<String>()),
            why: "that is not HTTP; give the observer's --listen address",
        });
    };
    let mut length = None;
    let mut chunked = false;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h).map_err(io_err)? == 0 {
            break;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-length") {
                length = v.parse::<usize>().ok();
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                chunked = v.eq_ignore_ascii_case("chunked");
            }
        }
    }
    if code != 200 {
        return Err(FetchError::Status {
            url: shown,
            status,
            why: match code {
                401 => "give the user and password as http://USER:PASS@HOST:PORT",
                404 => "it is no mpi-observer of this version (no such page)",
                _ => "the observer could not answer",
            },
        });
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut line = String::new();
            r.read_line(&mut line).map_err(io_err)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| io_err(io::Error::new(io::ErrorKind::InvalidData, "bad chunk")))?;
            if size == 0 {
                break;
            }
            if body.len() + size > MAX_BODY {
                return Err(io_err(io::Error::other("answer too large")));
            }
            let at = body.len();
            body.resize(at + size, 0);
            r.read_exact(&mut body[at..]).map_err(io_err)?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf).map_err(io_err)?;
        }
    } else if let Some(n) = length {
        if n > MAX_BODY {
            return Err(io_err(io::Error::other("answer too large")));
        }
        body.resize(n, 0);
        r.read_exact(&mut body).map_err(io_err)?;
    } else {
        r.take(MAX_BODY as u64)
            .read_to_end(&mut body)
            .map_err(io_err)?;
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = Url::parse("http://127.0.0.1:9479/metrics").unwrap();
        assert_eq!(u.authority, "127.0.0.1:9479");
        assert_eq!(u.path, "/metrics");
        let u = Url::parse("localhost:9479").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.path.as_str()),
            ("localhost:9479", "/")
        );
        let u = Url::parse("http://me:pw@node1").unwrap();
        assert_eq!(u.authority, "node1:80");
        assert_eq!(u.userinfo.as_deref(), Some("me:pw"));
        assert!(Url::parse("https://x:1").is_err());
        assert!(Url::parse("ftp://x").is_err());
        assert!(Url::parse("http://").is_err());
    }

    #[test]
    fn a_closed_port_is_one_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let u = Url::parse(&format!("http://127.0.0.1:{port}/")).unwrap();
        let e = get(&u, Duration::from_secs(2)).unwrap_err();
        assert!(e.to_string().starts_with("no answer from"), "{e}");
    }
}
