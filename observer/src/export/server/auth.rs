//! Basic authentication: the credentials of a request, checked against a
//! `--web.config.file`'s users one bcrypt at a time, results cached under a
//! digest (no password is kept).

use std::sync::Arc;

use base64::Engine as _;
use hyper::header::HeaderValue;

use super::{Server, lock};
use crate::export::web_config::WebConfig;

/// Remembered basic-auth checks (bcrypt costs tens of milliseconds).
const AUTH_CACHE: usize = 256;

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

impl Server {
    /// Basic auth as exporter-toolkit does it: an unknown user is checked
    /// against a real hash anyway (no timing difference), one bcrypt at a
    /// time, results cached.
    pub(super) async fn authorized(
        self: &Arc<Self>,
        w: &WebConfig,
        h: Option<&HeaderValue>,
    ) -> bool {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
