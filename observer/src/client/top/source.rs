//! Where `top` reads from: one observer's `/metrics/ranks` (the text
//! exposition of every rank in full, parsed here; its bounded `/metrics`
//! has only the detail ranks' per-function series) or a Prometheus
//! server's instant-query API, over HTTP or HTTPS with the crate's small
//! blocking client ([`crate::client::http_get`]).
//!
//! Each reading is one GET for an observer, two instant queries for
//! Prometheus: the current values, and their per-second rates as `irate`,
//! which Prometheus computes from the last two samples it scraped. An
//! observer's rates come from two successive readings instead
//! ([`super::model::Frame::derive_rates`]).

use std::time::{Duration, Instant};

use thiserror::Error;

use crate::client::http_get::{self, Client, FetchError, Url};
use crate::export::names;

/// How long one request may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The window of Prometheus's `irate`: it uses the last two samples in it,
/// so it must hold two scrapes (scrape intervals up to 60 s).
const RATE_WINDOW: &str = "2m";

/// The label that carries a rate's metric name in the rates query
/// (`irate` drops `__name__`, and `or` ignores it when matching).
const RATE_NAME_LABEL: &str = "top_metric";

/// Why `top` could not read its source.
#[derive(Debug, Error)]
pub enum SourceError {
    /// The URL is unusable, the server does not answer, or not with 200.
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// A 200 answer that is not an observer's exposition.
    #[error(
        "{url} answers, but is not an mpi-observer's /metrics (no mpi_observer_ metrics, no /metrics/ranks); \
         give an observer's address (its --listen), or use --prometheus for a Prometheus server"
    )]
    NotObserver {
        /// The URL, without a password.
        url: String,
    },
    /// An answer that is not Prometheus's query API.
    #[error(
        "{url} answers, but not as Prometheus's /api/v1/query ({why}); \
         give a Prometheus server's base URL, or use --endpoint for an observer"
    )]
    NotPrometheus {
        /// The URL, without a password.
        url: String,
        /// What was wrong with the answer.
        why: String,
    },
    /// No Prometheus answers at the URL.
    #[error("no answer from {url}: {source}; is Prometheus running there?")]
    PrometheusDown {
        /// The base URL, without a password.
        url: String,
        /// Why.
        source: std::io::Error,
    },
    /// Prometheus refused a query.
    #[error("{url} refused the query: {kind}: {error}")]
    Query {
        /// The URL, without a password.
        url: String,
        /// Prometheus's `errorType`.
        kind: String,
        /// Prometheus's `error`.
        error: String,
    },
}

/// One series: name, labels, value.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// The metric name.
    pub name: String,
    /// Label pairs, in the order read.
    pub labels: Vec<(String, String)>,
    /// The value.
    pub value: f64,
}

impl Sample {
    /// A label's value, if the series has it.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// What one refresh read.
#[derive(Debug)]
pub struct Reading {
    /// When it was read.
    pub at: Instant,
    /// The current values of the series `top` shows ([`names::METRICS`]),
    /// each with an `instance` label naming the node it came from.
    pub samples: Vec<Sample>,
    /// Per-second rates of the counters ([`names::COUNTERS`]) when the
    /// source computes them (Prometheus); `None` for an observer, whose
    /// rates come from successive readings.
    pub rates: Option<Vec<Sample>>,
}

/// What `top` reads: one observer, or a Prometheus server.
#[derive(Debug, PartialEq, Eq)]
pub enum Source {
    /// An observer's `/metrics/ranks` (or another path given).
    Endpoint(Url),
    /// A Prometheus server's base URL.
    Prometheus(Url),
}

impl Source {
    /// An observer at `url`; a URL without a path, or with `/metrics`,
    /// means its `/metrics/ranks`: every rank's full series.
    pub fn endpoint(url: &str) -> Result<Source, SourceError> {
        let u = parse(url)?;
        Ok(Source::Endpoint(if u.path == "/" || u.path == "/metrics" {
            u.with_path("/metrics/ranks")
        } else {
            u
        }))
    }

    /// A Prometheus server whose API is under `url`.
    pub fn prometheus(url: &str) -> Result<Source, SourceError> {
        let u = parse(url)?;
        let base = u
            .path
            .split('?')
            .next()
            .unwrap_or("/")
            .trim_end_matches('/');
        Ok(Source::Prometheus(u.with_path(base)))
    }

    /// A short description for the screen's title line.
    pub fn describe(&self) -> String {
        match self {
            Source::Endpoint(u) => format!("observer {}", u.shown()),
            Source::Prometheus(u) => format!("Prometheus {}/", u.shown()),
        }
    }

    /// Reads once: two GETs for an observer (its `/metrics/ranks`, and its
    /// `/metrics` for the jobs' wait states), two instant queries for
    /// Prometheus.
    pub fn read(&self, client: &Client) -> Result<Reading, SourceError> {
        match self {
            Source::Endpoint(url) => {
                let body = match client.get(url, TIMEOUT) {
                    // No such path: not an observer (or one from before
                    // /metrics/ranks).
                    Err(FetchError::Status { status, .. }) if status.contains(" 404") => {
                        return Err(SourceError::NotObserver { url: url.shown() });
                    }
                    r => r?,
                };
                let at = Instant::now();
                let text = String::from_utf8_lossy(&body);
                if !text.starts_with(names::RANKS_MARK)
                    && !text.lines().any(|l| l.starts_with("mpi_observer_"))
                {
                    return Err(SourceError::NotObserver { url: url.shown() });
                }
                // The wait states are per job and node: on the bounded
                // /metrics only.
                let bounded = client.get(&url.with_path("/metrics"), TIMEOUT)?;
                let instance = url.authority.clone();
                let samples = parse_exposition(&text)
                    .into_iter()
                    .filter(|s| names::METRICS.contains(&s.name.as_str()))
                    .chain(
                        parse_exposition(&String::from_utf8_lossy(&bounded))
                            .into_iter()
                            .filter(|s| names::WAIT_METRICS.contains(&s.name.as_str())),
                    )
                    .map(|mut s| {
                        s.labels.retain(|(k, _)| k != "instance");
                        s.labels.push(("instance".into(), instance.clone()));
                        s
                    })
                    .collect();
                Ok(Reading {
                    at,
                    samples,
                    rates: None,
                })
            }
            Source::Prometheus(url) => {
                let values = query(client, url, &values_query())?;
                let at = Instant::now();
                let rates = query(client, url, &rates_query())?;
                Ok(Reading {
                    at,
                    samples: values,
                    rates: Some(rates),
                })
            }
        }
    }
}

/// Parses a URL `top` can read: http:// or https://.
fn parse(url: &str) -> Result<Url, SourceError> {
    let u = Url::parse(url)?;
    if u.has_password() {
        log::warn!("{}", http_get::password_warning(&u));
    }
    Ok(u)
}

/// One instant query; the samples are named by `__name__`, or by
/// [`RATE_NAME_LABEL`] for rates.
fn query(client: &Client, base: &Url, expr: &str) -> Result<Vec<Sample>, SourceError> {
    let url = base.with_path(&format!(
        "{}/api/v1/query?query={}",
        base.path,
        encode(expr)
    ));
    let not_prometheus = |why: String| SourceError::NotPrometheus {
        url: base.shown(),
        why,
    };
    let body = match client.get(&url, TIMEOUT) {
        Ok(b) => b,
        // Not found, or an error page: not Prometheus's API. 401 keeps its
        // own hint (credentials in the URL).
        Err(FetchError::Status { status, .. }) if !status.contains(" 401") => {
            return Err(not_prometheus(format!("it answered `{status}`")));
        }
        Err(FetchError::Io { source, .. }) => {
            return Err(SourceError::PrometheusDown {
                url: base.shown(),
                source,
            });
        }
        Err(e) => return Err(e.into()),
    };
    parse_query_answer(&body).map_err(|e| match e {
        Answer::NotPrometheus(why) => not_prometheus(why),
        Answer::Refused { kind, error } => SourceError::Query {
            url: base.shown(),
            kind,
            error,
        },
    })
}

/// Percent-encodes a query parameter's value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Every series `top` shows, in one selector.
fn values_query() -> String {
    format!("{{__name__=~\"{}\"}}", names::METRICS.join("|"))
}

/// The counters' per-second rates, each labelled with its metric's name.
fn rates_query() -> String {
    names::COUNTERS
        .iter()
        .map(|m| {
            format!("label_replace(irate({m}[{RATE_WINDOW}]), \"{RATE_NAME_LABEL}\", \"{m}\", \"\", \"\")")
        })
        .collect::<Vec<_>>()
        .join(" or ")
}

/// Why an answer to a query gave no samples.
#[derive(Debug, PartialEq)]
enum Answer {
    /// Not Prometheus's API at all.
    NotPrometheus(String),
    /// Prometheus's error answer.
    Refused {
        /// `errorType`.
        kind: String,
        /// `error`.
        error: String,
    },
}

/// Reads an `/api/v1/query` answer of result type vector.
fn parse_query_answer(body: &[u8]) -> Result<Vec<Sample>, Answer> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Answer::NotPrometheus(format!("not JSON: {e}")))?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("?").to_string();
    match v["status"].as_str() {
        Some("success") => {}
        Some("error") => {
            return Err(Answer::Refused {
                kind: text(&v["errorType"]),
                error: text(&v["error"]),
            });
        }
        _ => return Err(Answer::NotPrometheus("no \"status\" field".into())),
    }
    let data = &v["data"];
    if data["resultType"].as_str() != Some("vector") {
        return Err(Answer::NotPrometheus(format!(
            "result type {}, not vector",
            data["resultType"]
        )));
    }
    let result = data["result"]
        .as_array()
        .ok_or_else(|| Answer::NotPrometheus("no result array".into()))?;
    Ok(result
        .iter()
        .filter_map(|r| {
            let mut labels: Vec<(String, String)> = r["metric"]
                .as_object()?
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect();
            let pos = labels
                .iter()
                .position(|(k, _)| k == "__name__" || k == RATE_NAME_LABEL)?;
            let name = labels.remove(pos).1;
            let value = parse_value(r["value"][1].as_str()?)?;
            Some(Sample {
                name,
                labels,
                value,
            })
        })
        .collect())
}

/// A sample value as the exposition and the query API write it.
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// Parses Prometheus's text exposition format (version 0.0.4): comments and
/// blank lines are skipped, label values unescaped (`\\`, `\"`, `\n`), a
/// trailing timestamp ignored. A line that does not parse is skipped.
pub fn parse_exposition(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim_start();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        loop {
            // Skip separators, then a key or the closing brace.
            while chars
                .next_if(|(_, c)| *c == ',' || c.is_whitespace())
                .is_some()
            {}
            let (start, c) = chars.next()?;
            if c == '}' {
                rest = &r[start + 1..];
                break;
            }
            let mut end = start + c.len_utf8();
            for (i, c) in chars.by_ref() {
                if c == '=' {
                    end = i;
                    break;
                }
            }
            let key = r[start..end].trim().to_string();
            if chars.next()?.1 != '"' {
                return None;
            }
            let mut value = String::new();
            loop {
                match chars.next()?.1 {
                    '"' => break,
                    '\\' => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        c => value.push(c),
                    },
                    c => value.push(c),
                }
            }
            labels.push((key, value));
        }
    }
    let value = parse_value(rest.split_whitespace().next()?)?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition() {
        let text = "# HELP mpi_calls_total Completed calls.\n\
                    # TYPE mpi_calls_total counter\n\
                    mpi_calls_total{jobid=\"a,b}\",rank=\"0\",function=\"MPI_Send\"} 12\n\
                    mpi_rank_info{jobid=\"j\\\"q\\\\\",rank=\"1\",pid=\"7\"} 1 1700000000000\n\
                    mpi_observer_probes 352\n\
                    \n\
                    mpi_call_duration_seconds_bucket{le=\"+Inf\"} +Inf\n\
                    broken{rank=\"0\" 1\n\
                    mpi_x{a=\"1\",} NaN\n";
        let s = parse_exposition(text);
        assert_eq!(s.len(), 5, "{s:?}");
        assert_eq!(s[0].name, "mpi_calls_total");
        assert_eq!(s[0].label("jobid"), Some("a,b}"));
        assert_eq!(s[0].label("function"), Some("MPI_Send"));
        assert_eq!(s[0].value, 12.0);
        assert_eq!(s[1].label("jobid"), Some("j\"q\\"));
        assert_eq!(s[1].value, 1.0);
        assert_eq!(
            (s[2].name.as_str(), s[2].labels.len()),
            ("mpi_observer_probes", 0)
        );
        assert_eq!(s[3].value, f64::INFINITY);
        assert!(s[4].value.is_nan());
    }

    #[test]
    fn query_answers() {
        let ok = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"mpi_calls_total","jobid":"j","rank":"0","instance":"n1:9479"},"value":[1.5,"42"]},
            {"metric":{"top_metric":"mpi_calls_total","jobid":"j","rank":"0"},"value":[1.5,"2.5"]},
            {"metric":{"jobid":"nameless"},"value":[1.5,"1"]}]}}"#;
        let s = parse_query_answer(ok).unwrap();
        assert_eq!(s.len(), 2, "a series without a name is dropped");
        assert_eq!(s[0].name, "mpi_calls_total");
        assert_eq!(s[0].label("instance"), Some("n1:9479"));
        assert_eq!(s[0].label("__name__"), None);
        assert_eq!((s[1].name.as_str(), s[1].value), ("mpi_calls_total", 2.5));
        let refused = br#"{"status":"error","errorType":"bad_data","error":"parse error"}"#;
        assert_eq!(
            parse_query_answer(refused),
            Err(Answer::Refused {
                kind: "bad_data".into(),
                error: "parse error".into()
            })
        );
        assert!(matches!(
            parse_query_answer(b"# HELP up\nup 1\n"),
            Err(Answer::NotPrometheus(_))
        ));
        assert!(matches!(
            parse_query_answer(
                br#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#
            ),
            Err(Answer::NotPrometheus(_))
        ));
    }

    #[test]
    fn queries_name_every_metric() {
        let v = values_query();
        for m in names::METRICS {
            assert!(v.contains(m), "{m}");
        }
        let r = rates_query();
        assert_eq!(r.matches("irate(").count(), names::COUNTERS.len());
        assert!(r.contains("\"top_metric\", \"mpi_calls_total\""));
        assert_eq!(encode("a b{\"}"), "a%20b%7B%22%7D");
    }
}
