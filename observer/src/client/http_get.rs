//! A small blocking HTTP/1.1 GET for the commands that read a daemon
//! (`report --url`, `top`): plain HTTP or HTTPS (rustls, the server
//! verified against the CA a `--ca-file` names, no system roots), basic
//! authentication from a `--auth-file` (or, with a warning, the URL's
//! user information), a deadline on the whole exchange, and bodies sized
//! by Content-Length, chunked, or ended by the connection's close.

use std::{
    fs,
    io::{self, BufRead, BufReader, Read, Write},
    net::{TcpStream, ToSocketAddrs as _},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject as _};
use thiserror::Error;

/// Largest body accepted.
const MAX_BODY: usize = 512 << 20;
/// Longest status, header or chunk-size line accepted.
const MAX_LINE: usize = 8192;
/// Most header lines accepted.
const MAX_HEADERS: usize = 256;
/// Largest `--ca-file` read: a bundle of a few hundred certificates.
const MAX_CA_FILE: u64 = 4 << 20;
/// Largest `--auth-file` read: one `user:password` line.
const MAX_AUTH_FILE: u64 = 4096;
/// The environment variable naming the auth file when `--auth-file` is not
/// given (for scripts: the Slurm Epilog).
pub const AUTH_FILE_ENV: &str = "MPI_OBSERVER_AUTH_FILE";

/// Errors of a GET.
#[derive(Debug, Error)]
pub enum FetchError {
    /// Not an `http(s)://host:port/...` URL.
    #[error(
        "`{url}` is not an observer's address: give http://HOST:PORT or https://HOST:PORT (as `attach --listen` serves){hint}"
    )]
    BadUrl {
        /// The URL.
        url: String,
        /// More about what was wrong.
        hint: &'static str,
    },
    /// An `https://` URL without a CA to verify the server with.
    #[error(
        "{url} is HTTPS: give --ca-file PATH, the CA certificate (PEM) that signed the daemon's certificate"
    )]
    NoCa {
        /// The URL, without a password.
        url: String,
    },
    /// The `--ca-file` is unusable.
    #[error("--ca-file {path}: {why}")]
    CaFile {
        /// Its path.
        path: String,
        /// What was wrong, and what to do.
        why: String,
    },
    /// The `--auth-file` is unusable.
    #[error("--auth-file {path}: {why}")]
    AuthFile {
        /// Its path.
        path: String,
        /// What was wrong, and what to do.
        why: String,
    },
    /// The TLS handshake failed: the server's certificate is not the CA's,
    /// does not name the host, or the server speaks no TLS.
    #[error("TLS with {url} failed: {source}; {hint}")]
    Tls {
        /// The URL, without a password.
        url: String,
        /// rustls's error.
        source: rustls::Error,
        /// What to do.
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

/// A parsed `http[s]://[user:pass@]host[:port][/path]`.
#[derive(Debug, PartialEq, Eq)]
pub struct Url {
    /// `https://`.
    pub tls: bool,
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
            url: Url::without_password(url),
            hint,
        };
        let (tls, rest) = match url.strip_prefix("https://") {
            Some(r) => (true, r),
            None => (false, url.strip_prefix("http://").unwrap_or(url)),
        };
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
        if authority.is_empty()
            || authority.contains(char::is_whitespace)
            || authority.starts_with(':')
            || (authority.starts_with('[') && !authority.contains(']'))
        {
            return Err(bad(""));
        }
        let port = if tls { 443 } else { 80 };
        let authority = if authority.ends_with(']') || !authority.contains(':') {
            format!("{authority}:{port}")
        } else {
            authority.to_string()
        };
        Ok(Url {
            tls,
            authority,
            path,
            userinfo,
        })
    }

    /// `url` with the password of its user information, if any, left out.
    fn without_password(url: &str) -> String {
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let host_end = rest.find('/').unwrap_or(rest.len());
        match rest[..host_end].rsplit_once('@') {
            Some((_, host)) => {
                let sep = if scheme.is_empty() { "" } else { "://" };
                format!("{scheme}{sep}{host}{}", &rest[host_end..])
            }
            None => url.to_string(),
        }
    }

    /// Whether the URL carries a password (`user:password@`), which every
    /// local user can read on the command line (/proc/PID/cmdline).
    pub fn has_password(&self) -> bool {
        self.userinfo.as_deref().is_some_and(|u| u.contains(':'))
    }

    /// The host, without port or IPv6 brackets: the name the server's
    /// certificate must carry.
    pub fn host(&self) -> &str {
        let h = match self.authority.rsplit_once(':') {
            Some((h, p)) if !p.contains(']') => h,
            _ => &self.authority,
        };
        h.trim_start_matches('[').trim_end_matches(']')
    }

    /// The same server, another path.
    pub fn with_path(&self, path: &str) -> Url {
        Url {
            tls: self.tls,
            authority: self.authority.clone(),
            path: path.into(),
            userinfo: self.userinfo.clone(),
        }
    }

    /// The URL for messages: never the password.
    pub fn shown(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{}", self.authority, self.path)
    }
}

/// The warning for a URL that carries a password; one line.
pub fn password_warning(url: &Url) -> String {
    format!(
        "the password in the URL for {} is readable by every local user (/proc/PID/cmdline): \
         put `user:password` in a mode-0600 file and give it with --auth-file",
        url.shown()
    )
}

/// What a GET needs besides the URL: how to verify an HTTPS server, and
/// the credentials for a URL without its own.
#[derive(Clone)]
pub struct Client {
    /// The rustls configuration trusting `--ca-file`'s certificates only.
    tls: Option<Arc<rustls::ClientConfig>>,
    /// `user:password` from `--auth-file`.
    auth: Option<String>,
    /// The largest body read: [`MAX_BODY`] unless [`Client::max_body`]
    /// says less.
    max_body: usize,
}

impl Default for Client {
    /// No CA, no credentials, bodies up to [`MAX_BODY`].
    fn default() -> Client {
        Client {
            tls: None,
            auth: None,
            max_body: MAX_BODY,
        }
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("Client")
            .field("tls", &self.tls.is_some())
            .field("auth", &self.auth.is_some())
            .finish()
    }
}

impl Client {
    /// A client trusting the certificates in `ca_file` (for https URLs)
    /// and sending the credentials of `auth_file`, else of the file named
    /// by [`AUTH_FILE_ENV`].
    pub fn new(ca_file: Option<&Path>, auth_file: Option<&Path>) -> Result<Client, FetchError> {
        let env = std::env::var_os(AUTH_FILE_ENV).filter(|v| !v.is_empty());
        let auth_file = auth_file.or(env.as_deref().map(Path::new));
        Ok(Client {
            tls: ca_file.map(tls_config).transpose()?,
            auth: auth_file.map(read_auth_file).transpose()?,
            max_body: MAX_BODY,
        })
    }

    /// This client reads bodies of at most `bytes` (and never more than
    /// [`MAX_BODY`]): a longer one is an error before it is read.
    pub fn max_body(mut self, bytes: usize) -> Client {
        self.max_body = bytes.min(MAX_BODY);
        self
    }

    /// GETs `url` within `timeout`; returns the body of a 200 answer.
    pub fn get(&self, url: &Url, timeout: Duration) -> Result<Vec<u8>, FetchError> {
        let shown = url.shown();
        let io_err = |source| FetchError::Io {
            url: shown.clone(),
            source,
        };
        // Checked before any connection: https needs the CA.
        let tls = match (url.tls, &self.tls) {
            (true, None) => return Err(FetchError::NoCa { url: shown }),
            (true, Some(c)) => Some(c.clone()),
            (false, _) => None,
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
        let tcp = conn.ok_or_else(|| io_err(last))?;
        tcp.set_read_timeout(Some(left().map_err(io_err)?))
            .map_err(io_err)?;
        tcp.set_write_timeout(Some(left().map_err(io_err)?))
            .map_err(io_err)?;
        let auth = url.userinfo.as_deref().or(self.auth.as_deref());
        let Some(config) = tls else {
            return exchange(tcp, url, auth, &shown, self.max_body);
        };
        let name =
            ServerName::try_from(url.host().to_string()).map_err(|_| FetchError::BadUrl {
                url: shown.clone(),
                hint: "; its host is no DNS name or IP address",
            })?;
        let conn =
            rustls::ClientConnection::new(config, name).map_err(|source| FetchError::Tls {
                url: shown.clone(),
                source,
                hint: "the TLS configuration is unusable",
            })?;
        let mut stream = rustls::StreamOwned::new(conn, tcp);
        while stream.conn.is_handshaking() {
            if let Err(e) = stream.conn.complete_io(&mut stream.sock) {
                return Err(tls_error(e, &shown));
            }
        }
        // The handshake took some of the time.
        let sock = &stream.sock;
        sock.set_read_timeout(Some(left().map_err(io_err)?))
            .map_err(io_err)?;
        sock.set_write_timeout(Some(left().map_err(io_err)?))
            .map_err(io_err)?;
        exchange(stream, url, auth, &shown, self.max_body)
    }
}

/// A handshake's I/O error: rustls's own error (certificate, protocol) as
/// [`FetchError::Tls`] with what to do, anything else as no answer.
fn tls_error(e: io::Error, shown: &str) -> FetchError {
    let Some(source) = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<rustls::Error>())
        .cloned()
    else {
        return FetchError::Io {
            url: shown.into(),
            source: e,
        };
    };
    let hint = match &source {
        rustls::Error::InvalidCertificate(_) => {
            "give with --ca-file the CA that signed the daemon's certificate, and a host name or address its certificate names"
        }
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            "it does not speak TLS: without tls_server_config in its web config the daemon serves http://"
        }
        _ => "check the daemon's tls_server_config (its web config)",
    };
    FetchError::Tls {
        url: shown.into(),
        source,
        hint,
    }
}

/// Reads `path` as a PEM bundle and makes a client configuration trusting
/// its certificates only.
fn tls_config(path: &Path) -> Result<Arc<rustls::ClientConfig>, FetchError> {
    let err = |why: String| FetchError::CaFile {
        path: path.display().to_string(),
        why,
    };
    // Certificates are public: a symbolic link (/etc/ssl/certs) is fine.
    // Non-blocking: a FIFO is refused, not waited on.
    let open = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path);
    let data = read_capped(open, MAX_CA_FILE).map_err(&err)?;
    let certs = CertificateDer::pem_slice_iter(&data)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            err(format!(
                "is not valid PEM ({e}): give the CA certificate (-----BEGIN CERTIFICATE-----)"
            ))
        })?;
    if certs.is_empty() {
        return Err(err(
            "holds no certificate: give the CA certificate (PEM, -----BEGIN CERTIFICATE-----) that signed the daemon's"
                .into(),
        ));
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots
            .add(c)
            .map_err(|e| err(format!("holds an unusable certificate: {e}")))?;
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| err(format!("no TLS version to use: {e}")))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Reads a regular file opened by `open`, refusing one over `cap` bytes.
fn read_capped(open: io::Result<fs::File>, cap: u64) -> Result<Vec<u8>, String> {
    let f = open.map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => "is a symbolic link: give the file itself".to_string(),
        _ => format!("cannot open it: {e}"),
    })?;
    let meta = f.metadata().map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err("is not a regular file".into());
    }
    if meta.len() > cap {
        return Err(format!(
            "is {} bytes, more than {cap}: give the right file",
            meta.len()
        ));
    }
    let mut data = Vec::new();
    f.take(cap + 1)
        .read_to_end(&mut data)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if data.len() as u64 > cap {
        return Err(format!("is more than {cap} bytes: give the right file"));
    }
    Ok(data)
}

/// Reads `user:password` from `path`: a regular file (not a symbolic
/// link), owned by this user or root, that neither group nor others may
/// read or write (as ssh wants of a private key), holding one line.
pub fn read_auth_file(path: &Path) -> Result<String, FetchError> {
    let err = |why: String| FetchError::AuthFile {
        path: path.display().to_string(),
        why,
    };
    let open = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    // The checks are made on the file opened, not on the path again.
    let f = open.map_err(|e| {
        err(match e.raw_os_error() {
            Some(libc::ELOOP) => "is a symbolic link: give the file itself".to_string(),
            _ => format!("cannot open it: {e}"),
        })
    })?;
    let meta = f
        .metadata()
        .map_err(|e| err(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(err("is not a regular file".into()));
    }
    check_auth_owner(meta.mode(), meta.uid(), {
        // SAFETY: geteuid has no preconditions and cannot fail.
        unsafe { libc::geteuid() }
    })
    .map_err(err)?;
    let data = read_capped(Ok(f), MAX_AUTH_FILE).map_err(err)?;
    parse_auth(&data).map_err(err)
}

/// The auth file's mode and owner: refused when group or others have any
/// access to it, or when it is neither `euid`'s nor root's.
fn check_auth_owner(mode: u32, uid: u32, euid: u32) -> Result<(), String> {
    if mode & 0o077 != 0 {
        return Err(format!(
            "group or others may read it (mode {:04o}): `chmod 600` it",
            mode & 0o7777
        ));
    }
    if uid != euid && uid != 0 {
        return Err(format!(
            "belongs to uid {uid}, not to this user ({euid}) nor root: give a file of your own"
        ));
    }
    Ok(())
}

/// The auth file's text: one `user:password` line (a final newline
/// allowed), neither part empty, no control character.
fn parse_auth(data: &[u8]) -> Result<String, String> {
    let shape = "give one line `user:password`";
    let text = std::str::from_utf8(data).map_err(|_| format!("is not UTF-8: {shape}"))?;
    let line = text
        .strip_suffix('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .unwrap_or(text);
    if line.contains(['\n', '\r']) {
        return Err(format!("holds more than one line: {shape}"));
    }
    if line.chars().any(char::is_control) {
        return Err(format!("holds a control character: {shape}"));
    }
    match line.split_once(':') {
        Some((user, password)) if !user.is_empty() && !password.is_empty() => Ok(line.to_string()),
        Some(_) => Err(format!("has an empty user or password: {shape}")),
        None => Err(format!("has no `:` between user and password: {shape}")),
    }
}

/// The request and its answer over `stream` (TCP, or TLS over it).
fn exchange<S: Read + Write>(
    mut stream: S,
    url: &Url,
    auth: Option<&str>,
    shown: &str,
    max_body: usize,
) -> Result<Vec<u8>, FetchError> {
    let io_err = |source| FetchError::Io {
        url: shown.into(),
        source,
    };
    let mut req = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: mpi-observer/{}\r\nAccept: */*\r\nConnection: close\r\n",
        url.path,
        url.authority,
        env!("CARGO_PKG_VERSION")
    );
    if let Some(u) = auth {
        let _ = std::fmt::Write::write_fmt(
            &mut req,
            format_args!(
                "Authorization: Basic {}\r\n",
                base64::engine::general_purpose::STANDARD.encode(u)
            ),
        );
    }
    req.push_str("\r\n");
    stream
        .write_all(req.as_bytes())
        .and_then(|()| stream.flush())
        .map_err(io_err)?;
    let mut r = BufReader::new(stream);
    let mut status = String::new();
    read_line(&mut r, &mut status).map_err(io_err)?;
    let status = status.trim_end().to_string();
    let code = status
        .strip_prefix("HTTP/1.")
        .and_then(|s| s.get(2..5))
        .and_then(|c| c.parse::<u16>().ok());
    let Some(code) = code else {
        return Err(FetchError::Status {
            url: shown.into(),
            status: format!("`{}`", status.chars().take(60).collect::<String>()),
            why: if url.tls {
                "that is not HTTP; give the observer's --listen address"
            } else {
                "that is not HTTP; give the observer's --listen address (https:// if it serves TLS)"
            },
        });
    };
    let mut length = None;
    let mut chunked = false;
    for n in 0.. {
        if n == MAX_HEADERS {
            return Err(io_err(io::Error::other("too many header lines")));
        }
        let mut h = String::new();
        if read_line(&mut r, &mut h).map_err(io_err)? == 0 {
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
            url: shown.into(),
            status,
            why: match code {
                401 => {
                    "give the right user and password: one line `user:password` in a mode-0600 file, with --auth-file FILE"
                }
                400 if !url.tls => {
                    "if the daemon serves TLS (tls_server_config in its web config), give https:// and --ca-file"
                }
                404 => "it is no mpi-observer of this version (no such page)",
                _ => "the observer could not answer",
            },
        });
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut line = String::new();
            read_line(&mut r, &mut line).map_err(io_err)?;
            let size = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| io_err(io::Error::new(io::ErrorKind::InvalidData, "bad chunk")))?;
            if size == 0 {
                break;
            }
            if body.len().saturating_add(size) > max_body {
                return Err(io_err(io::Error::other("answer too large")));
            }
            let at = body.len();
            body.resize(at + size, 0);
            r.read_exact(&mut body[at..]).map_err(io_err)?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf).map_err(io_err)?;
        }
    } else if let Some(n) = length {
        if n > max_body {
            return Err(io_err(io::Error::other("answer too large")));
        }
        body.resize(n, 0);
        r.read_exact(&mut body).map_err(io_err)?;
    } else {
        r.take(max_body as u64 + 1)
            .read_to_end(&mut body)
            .map_err(io_err)?;
        if body.len() > max_body {
            return Err(io_err(io::Error::other("answer too large")));
        }
    }
    Ok(body)
}

/// Reads one line of at most [`MAX_LINE`] bytes.
fn read_line<R: BufRead>(r: &mut R, line: &mut String) -> io::Result<usize> {
    let n = r.take(MAX_LINE as u64).read_line(line)?;
    if n == MAX_LINE && !line.ends_with('\n') {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
    }
    Ok(n)
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
        let u = Url::parse("https://node1:9479/metrics").unwrap();
        assert!(u.tls);
        assert_eq!((u.host(), u.authority.as_str()), ("node1", "node1:9479"));
        assert_eq!(u.shown(), "https://node1:9479/metrics");
        assert_eq!(Url::parse("https://node1").unwrap().authority, "node1:443");
        let u = Url::parse("https://[::1]:9479").unwrap();
        assert_eq!((u.host(), u.authority.as_str()), ("::1", "[::1]:9479"));
        assert_eq!(Url::parse("http://[::1]").unwrap().host(), "::1");
        // A password in the URL is noticed, and never shown.
        let u = Url::parse("https://me:pw@node1:9479").unwrap();
        assert!(u.has_password() && !u.shown().contains("pw"));
        assert!(!Url::parse("http://me@node1").unwrap().has_password());
        let e = Url::parse("https://me:pw@").unwrap_err().to_string();
        assert!(!e.contains("pw") && e.contains("https://"), "{e}");
        assert!(Url::parse("http://:9479").is_err());
        assert!(Url::parse("https://[::1").is_err());
        assert!(Url::parse("ftp://x").is_err());
        assert!(Url::parse("http://").is_err());
    }

    /// A fresh directory of this test process.
    fn scratch(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("mpiobs-http-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn write_mode(path: &Path, text: &str, mode: u32) {
        use std::os::unix::fs::PermissionsExt as _;
        fs::write(path, text).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn auth_file_text() {
        assert_eq!(parse_auth(b"me:pw\n").unwrap(), "me:pw");
        assert_eq!(parse_auth(b"me:pw").unwrap(), "me:pw");
        assert_eq!(parse_auth(b"me:p:w\r\n").unwrap(), "me:p:w");
        for (bad, why) in [
            (&b"me:pw\nother:pw\n"[..], "more than one line"),
            (b"me:pw\n\n", "more than one line"),
            (b"mepw\n", "no `:`"),
            (b":pw\n", "empty user or password"),
            (b"me:\n", "empty user or password"),
            (b"", "no `:`"),
            (b"me:p\tw", "control character"),
            (b"me:\xff", "not UTF-8"),
        ] {
            let e = parse_auth(bad).unwrap_err();
            assert!(
                e.contains(why) && e.contains("`user:password`"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn auth_file_mode_and_owner() {
        assert!(check_auth_owner(0o100600, 1000, 1000).is_ok());
        assert!(check_auth_owner(0o100400, 0, 1000).is_ok());
        for mode in [0o100640, 0o100604, 0o100620, 0o100602, 0o100644, 0o100610] {
            let e = check_auth_owner(mode, 1000, 1000).unwrap_err();
            assert!(e.contains("chmod 600"), "{mode:o}: {e}");
        }
        let e = check_auth_owner(0o100600, 1001, 1000).unwrap_err();
        assert!(e.contains("uid 1001"), "{e}");
    }

    #[test]
    fn auth_files_on_disk() {
        let d = scratch("auth");
        let ok = d.join("ok");
        write_mode(&ok, "me:pw\n", 0o600);
        assert_eq!(read_auth_file(&ok).unwrap(), "me:pw");
        let open = d.join("open");
        write_mode(&open, "me:pw\n", 0o644);
        let e = read_auth_file(&open).unwrap_err().to_string();
        assert!(
            e.starts_with("--auth-file ") && e.contains("mode 0644"),
            "{e}"
        );
        let link = d.join("link");
        std::os::unix::fs::symlink(&ok, &link).unwrap();
        let e = read_auth_file(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let e = read_auth_file(&d).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = read_auth_file(&d.join("absent")).unwrap_err().to_string();
        assert!(e.contains("cannot open it"), "{e}");
        let big = d.join("big");
        write_mode(&big, &format!("me:{}\n", "x".repeat(5000)), 0o600);
        let e = read_auth_file(&big).unwrap_err().to_string();
        assert!(e.contains("more than 4096"), "{e}");
        // Never the password in a message.
        let two = d.join("two");
        write_mode(&two, "me:secret\nagain\n", 0o600);
        let e = read_auth_file(&two).unwrap_err().to_string();
        assert!(!e.contains("secret"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn https_needs_a_usable_ca_file() {
        let d = scratch("ca");
        let u = Url::parse("https://127.0.0.1:1/report.json").unwrap();
        let e = Client::default()
            .get(&u, Duration::from_secs(1))
            .unwrap_err()
            .to_string();
        assert!(e.contains("give --ca-file PATH"), "{e}");
        let notes = d.join("notes.txt");
        fs::write(&notes, "not a certificate\n").unwrap();
        let e = Client::new(Some(&notes), None).unwrap_err().to_string();
        assert!(e.contains("holds no certificate"), "{e}");
        let e = Client::new(Some(&d.join("absent")), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("--ca-file ") && e.contains("cannot open"),
            "{e}"
        );
        let e = Client::new(Some(&d), None).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_closed_port_is_one_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let u = Url::parse(&format!("http://127.0.0.1:{port}/")).unwrap();
        let e = Client::default()
            .get(&u, Duration::from_secs(2))
            .unwrap_err();
        assert!(e.to_string().starts_with("no answer from"), "{e}");
    }
}
