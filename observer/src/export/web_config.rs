//! `--web.config.file`: TLS and basic authentication for `/metrics`, read
//! from a YAML file in the format of the Prometheus exporter-toolkit
//! (`tls_server_config`, `http_server_config`, `basic_auth_users`), so a
//! site's existing exporter configuration works here too.
//!
//! As in exporter-toolkit: unknown keys are errors, relative paths are
//! resolved against the file's directory, a `tls_server_config` without any
//! certificate, key or client CA serves plain HTTP, and the files are read
//! again when they change (certificate rotation needs no restart; see
//! [`WebConfig::restamp`]).
//!
//! Differences, each refused with a message rather than silently ignored:
//! TLS 1.0 and 1.1 and the CBC cipher suites (rustls has neither), the
//! curve P-521, `client_auth_type` values that ask for a client certificate
//! without verifying it (`RequestClientCert`, `RequireAnyClientCert`),
//! `client_allowed_sans` and `rate_limit`. `http2` is accepted and has no
//! effect: the daemon speaks HTTP/1.1.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use hyper::header::{HeaderName, HeaderValue};
use rustls::{
    RootCertStore, ServerConfig, SupportedProtocolVersion,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    server::WebPkiClientVerifier,
};
use serde::Deserialize;
use thiserror::Error;

/// Why a web config file cannot be used.
#[derive(Debug, Error)]
pub enum WebConfigError {
    /// The file itself cannot be read.
    #[error(
        "cannot read the web config file {}: {source}; check the path given to --web.config.file",
        path.display()
    )]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Not YAML, an unknown key, a value of the wrong type.
    #[error(
        "the web config file {} is not valid: {message}; see dashboards/deploy/web-config.yml for the format",
        path.display()
    )]
    Syntax {
        /// The config file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// Well-formed, but a value or combination is wrong or unsupported.
    #[error("the web config file {}: {problem}", path.display())]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// What is wrong and what to do.
        problem: String,
    },
    /// A certificate, key or CA file it names cannot be read.
    #[error(
        "the web config file {}: cannot read {key} {}: {source}; fix the path (a relative path is relative to the config file's directory)",
        path.display(),
        file.display()
    )]
    ReadFile {
        /// The config file.
        path: PathBuf,
        /// `cert_file`, `key_file` or `client_ca_file`.
        key: &'static str,
        /// The file named there, resolved.
        file: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A certificate, key or CA that is not usable PEM.
    #[error("the web config file {}: {key} {problem}", path.display())]
    Pem {
        /// The config file.
        path: PathBuf,
        /// `cert_file`, `key`, ...
        key: &'static str,
        /// What is wrong and what to do.
        problem: String,
    },
    /// rustls refused the certificate and key (they do not match, an
    /// unsupported key type, ...).
    #[error(
        "the web config file {}: the certificate and key do not make a TLS configuration ({source}); check that the key is the private key of the certificate (the first one in cert_file)",
        path.display()
    )]
    Tls {
        /// The config file.
        path: PathBuf,
        /// rustls's error.
        source: rustls::Error,
    },
    /// A `basic_auth_users` entry that is not a bcrypt hash.
    #[error(
        "the web config file {}: basic_auth_users: the password of user {user:?} is not a bcrypt hash ({source}); store a hash, e.g. from `htpasswd -nBC 10 {user}` (the part after the colon)",
        path.display()
    )]
    Hash {
        /// The config file.
        path: PathBuf,
        /// The user.
        user: String,
        /// bcrypt's error.
        source: bcrypt::BcryptError,
    },
}

/// The file as written. Field names are exporter-toolkit's.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    tls_server_config: Option<TlsFile>,
    #[serde(default)]
    http_server_config: Option<HttpFile>,
    #[serde(default)]
    basic_auth_users: Option<BTreeMap<String, String>>,
    #[serde(default)]
    rate_limit: Option<serde_yaml_ng::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    #[serde(default)]
    cert: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    client_ca: Option<String>,
    #[serde(default)]
    cert_file: Option<PathBuf>,
    #[serde(default)]
    key_file: Option<PathBuf>,
    #[serde(default)]
    client_auth_type: Option<String>,
    #[serde(default)]
    client_ca_file: Option<PathBuf>,
    #[serde(default)]
    cipher_suites: Option<Vec<String>>,
    #[serde(default)]
    curve_preferences: Option<Vec<String>>,
    #[serde(default)]
    min_version: Option<String>,
    #[serde(default)]
    max_version: Option<String>,
    #[serde(default)]
    prefer_server_cipher_suites: Option<bool>,
    #[serde(default)]
    client_allowed_sans: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    #[serde(default)]
    #[allow(dead_code)] // accepted for compatibility; HTTP/1.1 only
    http2: Option<bool>,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
}

/// The response headers `http_server_config.headers` may set, with the
/// values allowed where the set is closed (exporter-toolkit's list).
const EXTRA_HEADERS: [(&str, &[&str]); 5] = [
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

/// One file's identity and version, to notice a change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    path: PathBuf,
    seen: Option<(SystemTime, u64, u64)>,
}

impl Stamp {
    fn of(path: &Path) -> Stamp {
        use std::os::unix::fs::MetadataExt as _;
        let seen = std::fs::metadata(path).ok().map(|m| {
            (
                m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                m.len(),
                m.ino(),
            )
        });
        Stamp {
            path: path.to_path_buf(),
            seen,
        }
    }
}

/// A loaded web config: what the server needs, ready to use.
pub struct WebConfig {
    path: PathBuf,
    /// The TLS server configuration; `None` serves plain HTTP.
    pub tls: Option<Arc<ServerConfig>>,
    /// Whether TLS demands a client certificate signed by the client CA.
    pub client_cert_required: bool,
    /// `basic_auth_users`: user name to bcrypt hash. Empty: no basic auth.
    pub users: BTreeMap<String, String>,
    /// `http_server_config.headers`, added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    stamps: Vec<Stamp>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("path", &self.path)
            .field("tls", &self.tls.is_some())
            .field("client_cert_required", &self.client_cert_required)
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("headers", &self.headers)
            .finish()
    }
}

impl WebConfig {
    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether requests must authenticate: basic auth users, or a verified
    /// client certificate.
    pub fn authenticates(&self) -> bool {
        !self.users.is_empty() || self.client_cert_required
    }

    /// The versions of the file and of the certificate, key and CA files
    /// it names, as they were read.
    pub fn stamps(&self) -> Vec<Stamp> {
        self.stamps.clone()
    }

    /// The same files' versions now: they changed if this differs from
    /// [`WebConfig::stamps`].
    pub fn restamp(&self) -> Vec<Stamp> {
        self.stamps.iter().map(|s| Stamp::of(&s.path)).collect()
    }
}

/// Reads and checks a web config file, loading every file it names.
pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
    let stamp = Stamp::of(path);
    let text = std::fs::read_to_string(path).map_err(|source| WebConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let file: File = if text.trim().is_empty() {
        File::default()
    } else {
        serde_yaml_ng::from_str::<Option<File>>(&text)
            .map_err(|e| WebConfigError::Syntax {
                path: path.to_path_buf(),
                message: e.to_string().replace('\n', " "),
            })?
            .unwrap_or_default()
    };
    let invalid = |problem: String| WebConfigError::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    if file.rate_limit.is_some() {
        return Err(invalid(
            "rate_limit is not supported by mpi-observer: remove it (connections are capped and concurrent scrapes share one collection)".into(),
        ));
    }
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let mut stamps = vec![stamp];
    let (tls, client_cert_required) = match file.tls_server_config {
        Some(t) => tls_config(path, &dir, t, &mut stamps)?,
        None => (None, false),
    };

    let mut users = BTreeMap::new();
    for (user, hash) in file.basic_auth_users.unwrap_or_default() {
        if user.contains(':') {
            return Err(invalid(format!(
                "basic_auth_users: user name {user:?} contains ':', which basic authentication cannot carry: rename the user"
            )));
        }
        if let Err(source) = hash.parse::<bcrypt::HashParts>() {
            return Err(WebConfigError::Hash {
                path: path.to_path_buf(),
                user,
                source,
            });
        }
        users.insert(user, hash);
    }

    let mut headers = Vec::new();
    if let Some(h) = file.http_server_config.and_then(|h| h.headers) {
        for (name, value) in h {
            let Some((canonical, allowed)) = EXTRA_HEADERS
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(&name))
            else {
                return Err(invalid(format!(
                    "http_server_config.headers: {name:?} cannot be configured: use one of {}",
                    EXTRA_HEADERS.map(|(n, _)| n).join(", ")
                )));
            };
            if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
                return Err(invalid(format!(
                    "http_server_config.headers: {canonical} must be one of {allowed:?}, not {value:?}"
                )));
            }
            let value = HeaderValue::from_str(&value).map_err(|_| {
                invalid(format!(
                    "http_server_config.headers: the value of {canonical} is not a valid header value: use visible ASCII"
                ))
            })?;
            let name = HeaderName::from_bytes(canonical.as_bytes()).expect("a valid header name");
            headers.push((name, value));
        }
    }

    Ok(WebConfig {
        path: path.to_path_buf(),
        tls,
        client_cert_required,
        users,
        headers,
        stamps,
    })
}

fn empty(s: &Option<String>) -> bool {
    s.as_deref().is_none_or(str::is_empty)
}

fn empty_path(p: &Option<PathBuf>) -> bool {
    p.as_deref().is_none_or(|p| p.as_os_str().is_empty())
}

/// A PEM source: inline text, or a file relative to the config's directory.
fn pem(
    path: &Path,
    dir: &Path,
    inline: Option<String>,
    file: Option<PathBuf>,
    keys: (&'static str, &'static str),
    stamps: &mut Vec<Stamp>,
) -> Result<Option<(Vec<u8>, &'static str)>, WebConfigError> {
    let (inline_key, file_key) = keys;
    match (file.filter(|p| !p.as_os_str().is_empty()), inline) {
        (Some(f), _) => {
            let f = dir.join(f);
            stamps.push(Stamp::of(&f));
            let data = std::fs::read(&f).map_err(|source| WebConfigError::ReadFile {
                path: path.to_path_buf(),
                key: file_key,
                file: f,
                source,
            })?;
            Ok(Some((data, file_key)))
        }
        (None, Some(s)) if !s.is_empty() => Ok(Some((s.into_bytes(), inline_key))),
        _ => Ok(None),
    }
}

fn certs(
    path: &Path,
    key: &'static str,
    data: &[u8],
) -> Result<Vec<CertificateDer<'static>>, WebConfigError> {
    let certs = CertificateDer::pem_slice_iter(data)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| WebConfigError::Pem {
            path: path.to_path_buf(),
            key,
            problem: format!(
                "is not valid PEM ({e}): give PEM certificates (-----BEGIN CERTIFICATE-----)"
            ),
        })?;
    if certs.is_empty() {
        return Err(WebConfigError::Pem {
            path: path.to_path_buf(),
            key,
            problem: "holds no certificate: give PEM certificates (-----BEGIN CERTIFICATE-----)"
                .into(),
        });
    }
    Ok(certs)
}

fn version(path: &Path, key: &str, v: Option<&str>, default: u8) -> Result<u8, WebConfigError> {
    let invalid = |problem: String| WebConfigError::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    match v.unwrap_or("") {
        "" => Ok(default),
        "TLS12" => Ok(2),
        "TLS13" => Ok(3),
        "TLS10" | "TLS11" => Err(invalid(format!(
            "tls_server_config.{key}: {} is not supported (rustls speaks TLS 1.2 and 1.3 only): use TLS12 or TLS13",
            v.unwrap_or_default()
        ))),
        other => Err(invalid(format!(
            "tls_server_config.{key}: unknown TLS version {other:?}: use TLS12 or TLS13"
        ))),
    }
}

/// The rustls name of a TLS 1.2 suite as Go (and exporter-toolkit) spell it.
fn suite_name(s: &rustls::SupportedCipherSuite) -> String {
    format!("{:?}", s.suite())
}

/// Builds the rustls configuration from `tls_server_config`.
fn tls_config(
    path: &Path,
    dir: &Path,
    t: TlsFile,
    stamps: &mut Vec<Stamp>,
) -> Result<(Option<Arc<ServerConfig>>, bool), WebConfigError> {
    let invalid = |problem: String| WebConfigError::Invalid {
        path: path.to_path_buf(),
        problem,
    };
    let auth = t.client_auth_type.clone().unwrap_or_default();
    // exporter-toolkit's IsEnabled: any of these turns TLS on.
    let enabled = !empty(&t.cert)
        || !empty(&t.key)
        || !empty(&t.client_ca)
        || !empty_path(&t.cert_file)
        || !empty_path(&t.key_file)
        || !empty_path(&t.client_ca_file)
        || !auth.is_empty();
    if !enabled {
        return Ok((None, false));
    }
    if empty(&t.cert) && empty_path(&t.cert_file) {
        return Err(invalid(
            "tls_server_config has no certificate: add cert_file (a PEM certificate chain) or cert"
                .into(),
        ));
    }
    if empty(&t.key) && empty_path(&t.key_file) {
        return Err(invalid(
            "tls_server_config has no private key: add key_file (the PEM private key of cert_file) or key".into(),
        ));
    }
    if t.client_allowed_sans.is_some() {
        return Err(invalid(
            "tls_server_config.client_allowed_sans is not supported by mpi-observer: remove it and restrict clients by the CA in client_ca_file".into(),
        ));
    }

    let (cert_pem, cert_key) = pem(
        path,
        dir,
        t.cert,
        t.cert_file,
        ("cert", "cert_file"),
        stamps,
    )?
    .expect("checked above");
    let chain = certs(path, cert_key, &cert_pem)?;
    let (key_pem, key_key) =
        pem(path, dir, t.key, t.key_file, ("key", "key_file"), stamps)?.expect("checked above");
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| WebConfigError::Pem {
        path: path.to_path_buf(),
        key: key_key,
        problem: format!(
            "holds no usable private key ({e}): give a PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC)"
        ),
    })?;

    let ca = pem(
        path,
        dir,
        t.client_ca,
        t.client_ca_file,
        ("client_ca", "client_ca_file"),
        stamps,
    )?;
    let verify = match auth.as_str() {
        "" | "NoClientCert" => None,
        "VerifyClientCertIfGiven" => Some(false),
        "RequireAndVerifyClientCert" => Some(true),
        "RequestClientCert" | "RequireAnyClientCert" | "RequireClientCert" => {
            return Err(invalid(format!(
                "tls_server_config.client_auth_type {auth} (a client certificate nobody verifies) is not supported: use RequireAndVerifyClientCert or VerifyClientCertIfGiven with client_ca_file"
            )));
        }
        other => {
            return Err(invalid(format!(
                "tls_server_config.client_auth_type: unknown value {other:?}: use NoClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert"
            )));
        }
    };

    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(names) = &t.cipher_suites {
        let mut chosen: Vec<rustls::SupportedCipherSuite> = provider
            .cipher_suites
            .iter()
            .filter(|s| s.tls13().is_some())
            .copied()
            .collect();
        for name in names {
            match provider
                .cipher_suites
                .iter()
                .find(|s| s.tls13().is_none() && suite_name(s) == *name)
            {
                Some(s) => chosen.push(*s),
                None => {
                    let known: Vec<String> = provider
                        .cipher_suites
                        .iter()
                        .filter(|s| s.tls13().is_none())
                        .map(suite_name)
                        .collect();
                    return Err(invalid(format!(
                        "tls_server_config.cipher_suites: {name:?} is not a TLS 1.2 suite rustls offers: use some of {}",
                        known.join(", ")
                    )));
                }
            }
        }
        provider.cipher_suites = chosen;
    }
    if let Some(names) = &t.curve_preferences {
        let mut chosen = Vec::new();
        for name in names {
            let want = match name.as_str() {
                "X25519" => rustls::NamedGroup::X25519,
                "CurveP256" => rustls::NamedGroup::secp256r1,
                "CurveP384" => rustls::NamedGroup::secp384r1,
                other => {
                    return Err(invalid(format!(
                        "tls_server_config.curve_preferences: {other:?} is not supported: use X25519, CurveP256 or CurveP384"
                    )));
                }
            };
            if let Some(g) = provider.kx_groups.iter().find(|g| g.name() == want) {
                chosen.push(*g);
            }
        }
        provider.kx_groups = chosen;
    }
    let provider = Arc::new(provider);

    let min = version(path, "min_version", t.min_version.as_deref(), 2)?;
    let max = version(path, "max_version", t.max_version.as_deref(), 3)?;
    if min > max {
        return Err(invalid(
            "tls_server_config: min_version is above max_version: swap them".into(),
        ));
    }
    let versions: Vec<&'static SupportedProtocolVersion> =
        [(2, &rustls::version::TLS12), (3, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (min..=max).contains(v))
            .map(|(_, p)| p)
            .collect();

    let tls_err = |source: rustls::Error| WebConfigError::Tls {
        path: path.to_path_buf(),
        source,
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(tls_err)?;
    let builder = match (verify, ca) {
        (None, Some((_, key))) => {
            return Err(invalid(format!(
                "tls_server_config.{key} is set but client_auth_type is NoClientCert: set client_auth_type to RequireAndVerifyClientCert (or VerifyClientCertIfGiven), or remove {key}"
            )));
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => {
            return Err(invalid(format!(
                "tls_server_config.client_auth_type {auth} needs client_ca_file (or client_ca): the CA that signs the client certificates"
            )));
        }
        (Some(required), Some((data, key))) => {
            let mut roots = RootCertStore::empty();
            for c in certs(path, key, &data)? {
                roots.add(c).map_err(|e| WebConfigError::Pem {
                    path: path.to_path_buf(),
                    key,
                    problem: format!("holds a certificate that cannot be a trust anchor ({e}): give the client CA's PEM certificate"),
                })?;
            }
            let mut v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            if !required {
                v = v.allow_unauthenticated();
            }
            let v = v.build().map_err(|e| WebConfigError::Pem {
                path: path.to_path_buf(),
                key,
                problem: format!(
                    "cannot verify client certificates ({e}): give the client CA's PEM certificate"
                ),
            })?;
            builder.with_client_cert_verifier(v)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(tls_err)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.ignore_client_order = t.prefer_server_cipher_suites.unwrap_or(true);
    Ok((Some(Arc::new(config)), verify == Some(true)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn tmp(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("mpi-observer-webcfg-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn empty_file_is_plain_http_without_auth() {
        let d = tmp("empty");
        let c = load(&write(&d, "w.yml", "")).unwrap();
        assert!(c.tls.is_none() && c.users.is_empty() && !c.authenticates());
        let c = load(&write(
            &d,
            "w2.yml",
            "tls_server_config:\n  min_version: TLS13\n",
        ))
        .unwrap();
        assert!(c.tls.is_none());
    }

    #[test]
    fn users_must_be_bcrypt_hashes() {
        let d = tmp("users");
        let hash = bcrypt::hash("secret", 4).unwrap();
        let c = load(&write(
            &d,
            "ok.yml",
            &format!("basic_auth_users:\n  prometheus: '{hash}'\n"),
        ))
        .unwrap();
        assert!(c.authenticates());
        assert_eq!(c.users["prometheus"], hash);
        let e = load(&write(
            &d,
            "bad.yml",
            "basic_auth_users:\n  prometheus: secret\n",
        ))
        .unwrap_err();
        let m = crate::one_line(&e);
        assert!(
            m.contains("not a bcrypt hash") && m.contains("htpasswd"),
            "{m}"
        );
    }

    #[test]
    fn unknown_keys_and_unsupported_options_are_refused() {
        let d = tmp("unknown");
        for (text, want) in [
            (
                "tls_server_config:\n  certfile: x\n",
                "unknown field `certfile`",
            ),
            ("rate_limit:\n  burst: 1\n", "rate_limit is not supported"),
            ("tls_server_config:\n  cert_file: c\n", "no private key"),
            ("tls_server_config:\n  key_file: k\n", "no certificate"),
            (
                "tls_server_config:\n  cert_file: missing.crt\n  key_file: missing.key\n",
                "cannot read cert_file",
            ),
            (
                "http_server_config:\n  headers:\n    X-Foo: bar\n",
                "cannot be configured",
            ),
            (
                "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
                "must be one of",
            ),
            ("- a\n- b\n", "is not valid"),
        ] {
            let e = load(&write(&d, "w.yml", text)).unwrap_err();
            let m = crate::one_line(&e);
            assert!(m.contains(want), "{text:?}: {m}");
            assert!(m.contains("w.yml"), "names the file: {m}");
        }
    }

    #[test]
    fn missing_file_is_one_clear_error() {
        let e = load(Path::new("/nonexistent/web.yml")).unwrap_err();
        let m = crate::one_line(&e);
        assert!(
            m.starts_with("cannot read the web config file /nonexistent/web.yml"),
            "{m}"
        );
        assert!(m.contains("--web.config.file"), "{m}");
    }

    #[test]
    fn headers_are_checked_and_kept() {
        let d = tmp("headers");
        let c = load(&write(
            &d,
            "w.yml",
            "http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    Strict-Transport-Security: max-age=31536000\n",
        ))
        .unwrap();
        let names: Vec<&str> = c.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["strict-transport-security", "x-frame-options"]);
    }
}
