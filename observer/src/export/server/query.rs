//! The `/metrics/ranks` query: which jobs' ranks to serve. Pure, and a
//! user's input to a root daemon: bounded in what it keeps and allocates
//! (fuzzed in observer/tests/fuzz.rs).

use thiserror::Error;

/// `jobid` parameters one `/metrics/ranks` request may name at most.
pub const MAX_JOBIDS: usize = 64;

/// Why a `/metrics/ranks` query was refused (400).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum QueryError {
    /// A parameter other than `jobid`.
    #[error(
        "unknown query parameter `{name}`: /metrics/ranks takes only jobid=JOB, repeated for several jobs"
    )]
    Unknown {
        /// The parameter's name, cut to the label cap.
        name: String,
    },
    /// More `jobid` parameters than [`MAX_JOBIDS`].
    #[error(
        "more than {MAX_JOBIDS} jobid parameters: split the request, or leave them out for every job"
    )]
    TooMany,
    /// A value that is not percent-encoded UTF-8.
    #[error("a jobid is not valid percent-encoded UTF-8: encode it as a URL query value")]
    Encoding,
    /// A value longer than any job id label.
    #[error(
        "a jobid is longer than {} bytes, the longest a jobid label can be",
        crate::attach::identity::LABEL_CAP
    )]
    TooLong,
}

/// Decodes one query component: `%XX` escapes and `+` for a space.
fn percent_decode(s: &str) -> Result<String, QueryError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3).ok_or(QueryError::Encoding)?;
                let hex = std::str::from_utf8(hex).map_err(|_| QueryError::Encoding)?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| QueryError::Encoding)?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| QueryError::Encoding)
}

/// `s` with its control characters escaped (`\n`, `\u{0}`), as far as
/// the first `max` bytes of the result: the name of an unknown parameter
/// is said back in the refusal's one line, and a client's `%0A` must not
/// make it two.
fn escape_controls(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max) + 8);
    for c in s.chars() {
        if out.len() >= max {
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The jobs a `/metrics/ranks` query names: `None` without any `jobid`
/// (every job). Hostile input: at most [`MAX_JOBIDS`] values, each at most
/// the label cap once decoded; anything else is refused.
pub fn ranks_query(query: Option<&str>) -> Result<Option<Vec<String>>, QueryError> {
    let mut jobs = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if name != "jobid" {
            let name = percent_decode(name).unwrap_or_else(|_| name.to_string());
            return Err(QueryError::Unknown {
                name: crate::attach::identity::cut(
                    &escape_controls(&name, crate::attach::identity::LABEL_CAP),
                    crate::attach::identity::LABEL_CAP,
                )
                .to_string(),
            });
        }
        if jobs.len() == MAX_JOBIDS {
            return Err(QueryError::TooMany);
        }
        // Checked before decoding too, so a huge value costs nothing.
        if value.len() > 3 * crate::attach::identity::LABEL_CAP {
            return Err(QueryError::TooLong);
        }
        let v = percent_decode(value)?;
        if v.len() > crate::attach::identity::LABEL_CAP {
            return Err(QueryError::TooLong);
        }
        jobs.push(v);
    }
    Ok((!jobs.is_empty()).then_some(jobs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_queries() {
        assert_eq!(ranks_query(None), Ok(None));
        assert_eq!(ranks_query(Some("")), Ok(None));
        assert_eq!(
            ranks_query(Some("jobid=42&jobid=a%20b%22c&jobid=x+y")),
            Ok(Some(vec!["42".into(), "a b\"c".into(), "x y".into()]))
        );
        assert_eq!(
            ranks_query(Some("jobid=%E2%9C%93")),
            Ok(Some(vec!["\u{2713}".into()]))
        );
        for bad in ["jobid=%", "jobid=%zz", "jobid=%ff", "jobid=%4"] {
            assert_eq!(ranks_query(Some(bad)), Err(QueryError::Encoding), "{bad}");
        }
        assert!(matches!(
            ranks_query(Some("jobid=1&rank=0")),
            Err(QueryError::Unknown { name }) if name == "rank"
        ));
        // An unknown name is said back on one line, a label's worth at most.
        assert!(matches!(
            ranks_query(Some("ra%0Ank%00%E2%9C%93=0")),
            Err(QueryError::Unknown { name }) if name == "ra\\nnk\\u{0}\u{2713}"
        ));
        let long = format!("{}=1", "%0A".repeat(1000));
        assert!(matches!(
            ranks_query(Some(&long)),
            Err(QueryError::Unknown { name }) if name == "\\n".repeat(64)
        ));
        let many = vec!["jobid=1"; MAX_JOBIDS + 1].join("&");
        assert_eq!(ranks_query(Some(&many)), Err(QueryError::TooMany));
        assert!(ranks_query(Some(&many[8..])).is_ok());
        let long = format!("jobid={}", "j".repeat(129));
        assert_eq!(ranks_query(Some(&long)), Err(QueryError::TooLong));
        let huge = format!("jobid={}", "%41".repeat(100_000));
        assert_eq!(ranks_query(Some(&huge)), Err(QueryError::TooLong));
        // Every refusal is one line.
        for e in [
            QueryError::TooMany,
            QueryError::Encoding,
            QueryError::TooLong,
        ] {
            assert!(!e.to_string().contains('\n'));
        }
    }
}
