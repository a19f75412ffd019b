//! TLS and basic authentication as a site sets them up for the daemon's
//! web server (`--web.config.file`): a test CA and a server certificate
//! made with rcgen, the shipped web config with real bcrypt hashes, and an
//! HTTPS client that trusts only that CA. Used by `tests/tests/e2e/web.rs`
//! (one daemon on loopback) and `tests/tests/e2e/slurm.rs` (one per
//! Slurm node, as the unit serves them).

use std::{
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _};

use crate::{
    http::{self, Request, Response},
    workspace_root,
};

/// The one user of the shipped web config
/// (dashboards/deploy/web-config.yml), whose hash is a placeholder.
pub const WEB_USER: &str = "prometheus";

/// How long an HTTPS request may take to connect, and between reads.
const LIMIT: Duration = Duration::from_secs(10);

// ------------------------------------------------------------ certificates

/// [`make_certs_for`] 127.0.0.1 and localhost.
pub fn make_certs(dir: &Path) {
    make_certs_for(dir, &["127.0.0.1", "localhost"]);
}

/// In `dir`: a test CA (`ca.crt`); a server certificate for `names`
/// (subjectAltName: IP addresses as IP entries, the rest as DNS names)
/// signed by it (`tls.crt`, `tls.key`); a client certificate from the same
/// CA, for mutual TLS (`client.crt`, `client.key`); a key that is not the
/// server certificate's (`other.key`).
pub fn make_certs_for(dir: &Path, names: &[&str]) {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "mpi-observer test CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    // rcgen takes an address for an IP entry, anything else for a DNS one.
    let mut server =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    // The first host name as the subject (SANs are what clients check).
    let cn = names
        .iter()
        .find(|n| n.parse::<std::net::IpAddr>().is_err())
        .or(names.first())
        .copied()
        .unwrap_or("server");
    server.distinguished_name.push(DnType::CommonName, cn);
    server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = server.signed_by(&key, &ca).unwrap();
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(DnType::CommonName, "prometheus");
    client.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_key = KeyPair::generate().unwrap();
    let client = client.signed_by(&client_key, &ca).unwrap();
    std::fs::write(dir.join("client.crt"), client.pem()).unwrap();
    std::fs::write(dir.join("client.key"), client_key.serialize_pem()).unwrap();
    std::fs::write(
        dir.join("other.key"),
        KeyPair::generate().unwrap().serialize_pem(),
    )
    .unwrap();
}

// -------------------------------------------------------------- web config

/// The shipped example, dashboards/deploy/web-config.yml, in
/// `dir/web-config.yml` with [`WEB_USER`]'s password hash in place of its
/// placeholder. Its paths are relative, so they resolve to the
/// certificates next to it.
pub fn web_config(dir: &Path, password: &str) -> PathBuf {
    web_config_users(
        &workspace_root().join("dashboards/deploy/web-config.yml"),
        dir,
        &[(WEB_USER, password)],
    )
}

/// `example` (a web config with one `prometheus:` placeholder line under
/// `basic_auth_users`, as shipped) in `dir/web-config.yml`, that line
/// replaced by one `USER: 'BCRYPT HASH'` line per `(user, password)`.
pub fn web_config_users(example: &Path, dir: &Path, users: &[(&str, &str)]) -> PathBuf {
    let text =
        std::fs::read_to_string(example).unwrap_or_else(|e| panic!("{}: {e}", example.display()));
    let mut replaced = 0;
    let mut out = Vec::new();
    for l in text.lines() {
        if l.trim_start().starts_with(&format!("{WEB_USER}:")) {
            replaced += 1;
            for (user, password) in users {
                // Cost 10, as the example's htpasswd line makes: the daemon
                // caches a checked password, so only the first request pays.
                let hash = bcrypt::hash(password, 10).unwrap();
                out.push(format!("  {user}: '{hash}'"));
            }
        } else {
            out.push(l.to_string());
        }
    }
    assert_eq!(
        replaced,
        1,
        "{} has one `{WEB_USER}:` user line",
        example.display()
    );
    let path = dir.join("web-config.yml");
    std::fs::write(&path, out.join("\n") + "\n").unwrap();
    path
}

// ------------------------------------------------------------ HTTPS client

/// The `Authorization` header of basic authentication.
pub fn basic(user: &str, password: &str) -> (&'static str, String) {
    (
        "Authorization",
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        ),
    )
}

/// The certificates of the PEM file `ca`, as trust roots.
fn roots(ca: &Path) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).expect("the CA file") {
        roots.add(c.expect("a CA certificate")).unwrap();
    }
    roots
}

fn builder() -> rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier> {
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
}

/// A TLS client that trusts only the CA in `ca`.
pub fn tls_client(ca: &Path) -> Arc<rustls::ClientConfig> {
    Arc::new(
        builder()
            .with_root_certificates(roots(ca))
            .with_no_client_auth(),
    )
}

/// A TLS client that trusts the CA in `ca` and presents `cert` and `key`.
pub fn tls_client_with_cert(ca: &Path, cert: &Path, key: &Path) -> Arc<rustls::ClientConfig> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    Arc::new(
        builder()
            .with_root_certificates(roots(ca))
            .with_client_auth_cert(chain, key)
            .unwrap(),
    )
}

/// GET `path` over HTTPS from `addr` (an `IP:PORT`, the server verified as
/// that IP) with extra headers.
pub fn get_tls(
    client: &Arc<rustls::ClientConfig>,
    addr: &str,
    path: &str,
    headers: &[(&str, String)],
) -> std::io::Result<Response> {
    let sa: SocketAddr = addr.parse().unwrap();
    let tcp = TcpStream::connect_timeout(&sa, LIMIT)?;
    tcp.set_read_timeout(Some(LIMIT))?;
    let conn = rustls::ClientConnection::new(client.clone(), ServerName::IpAddress(sa.ip().into()))
        .map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    http::exchange(
        &mut tls,
        addr,
        &Request {
            headers,
            ..Request::get(path)
        },
    )
}
