//! Response bodies: a whole body in one frame, which keeps its connection
//! busy until hyper drops it, plain text answers, and gzip for the clients
//! that accept it.

use std::{
    convert::Infallible,
    io::Write as _,
    pin::Pin,
    task::{Context, Poll},
};

use hyper::{
    HeaderMap, Response, StatusCode,
    body::{Bytes, Frame, SizeHint},
    header::{self, HeaderValue},
};

use super::conn::Busy;

pub(super) const METRICS_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
pub(super) const TEXT_TYPE: &str = "text/plain; charset=utf-8";

/// A whole response body in one frame, keeping its connection busy until
/// hyper drops it.
pub struct Body {
    data: Option<Bytes>,
    pub(super) _busy: Option<Busy>,
}

impl Body {
    pub(super) fn new(data: impl Into<Bytes>) -> Body {
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

pub(super) fn text(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut r = Response::new(Body::new(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(TEXT_TYPE));
    r
}

/// Whether `Accept-Encoding` admits gzip (a `q` of 0 refuses it).
pub(super) fn accepts_gzip(h: &HeaderMap) -> bool {
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

pub(super) fn gzip(data: &[u8]) -> Option<Bytes> {
    let mut enc = flate2::write::GzEncoder::new(
        Vec::with_capacity(data.len() / 8),
        flate2::Compression::fast(),
    );
    enc.write_all(data).ok()?;
    enc.finish().ok().map(Bytes::from)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
