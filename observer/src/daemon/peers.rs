//! `--waits.peers`: the wait records of the other nodes' daemons, fetched
//! for the jobs that span nodes (docs/waits.md, "Across nodes: shipping
//! records"). One thread: every [`PERIOD`], each peer in turn is asked for
//! the records after the cursor it last gave (`GET
//! /waits/records?after=N`, again at once while the answer was full); the
//! answer is read and checked off the state's lock, then its drains of
//! jobs this node holds go to the matcher
//! ([`crate::collect::waits::Waits::add_remote`]), under the peer's name
//! as the configuration gives it, never as the answer says.
//!
//! A peer is another root daemon, but what it ships came from its users'
//! processes: the answer is bounded ([`MAX_ANSWER_BYTES`], the records and
//! drains of one answer), malformed ones are refused whole and counted in
//! `mpi_observer_waits_peer_errors_total`, and nothing in it can make this
//! thread panic. What a user controls within a well-formed answer (a
//! record's fields, a rank, a world size) is the matcher's to judge, record
//! by record, so that one user's job cannot stop another's records.
//!
//! A peer that does not answer costs one request a period and one line
//! when it stops answering, and one when it answers again. A changed
//! `epoch` (the peer restarted) starts its cursor over; a cursor before the
//! peer's `first` (it dropped records before they were fetched) counts the
//! gap in `mpi_observer_waits_peer_records_lost_total`, except at the first
//! answer, when what the peer dropped before this daemon asked was never
//! owed to it.

use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use observer_common::waits;
use prometheus::IntCounter;
use thiserror::Error;

use crate::{
    client::http_get::{Client, FetchError, Url},
    collect::waits::Drain,
    export::registry::{
        State,
        outbox::{self, Answer, CHUNK, MAX_ANSWER},
    },
    os::clock::monotonic_ns,
};

/// How often each peer is asked.
pub const PERIOD: Duration = Duration::from_millis(500);
/// The longest one request may take.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// Requests to one peer in one period at most: a full outbox is
/// `MAX_RECORDS / (MAX_ANSWER - CHUNK)` answers, under 10.
const MAX_PULLS: usize = 16;
/// The largest answer read: [`MAX_ANSWER`] records of 11 numbers of at
/// most 20 digits are 2 MiB, and the job labels of up to as many drains
/// (a jobid is cut to 128 bytes) 3 MiB more.
pub const MAX_ANSWER_BYTES: usize = 8 << 20;
/// The longest job label set accepted (`jobid="..",uid=".."`, the jobid
/// cut to 128 bytes, escaped).
const MAX_JOB: usize = 1024;

/// Why `--waits.peers` (or its files) were refused at start-up.
#[derive(Debug, Error)]
pub enum PeerError {
    /// A URL that is no daemon's base URL.
    #[error("--waits.peers `{url}` {why}")]
    BadUrl {
        /// The URL as given (without a password).
        url: String,
        /// What is wrong and what to do.
        why: String,
    },
    /// A CA or auth file that cannot be used.
    #[error("{0}")]
    Files(String),
}

/// Why a peer's answer was refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum AnswerError {
    /// Over [`MAX_ANSWER_BYTES`].
    #[error("an answer of {0} bytes, more than {MAX_ANSWER_BYTES}")]
    TooLarge(usize),
    /// Not the JSON of an answer.
    #[error("not a /waits/records answer: {0}")]
    Malformed(String),
    /// Well-formed, but not what a daemon answers.
    #[error("an inconsistent /waits/records answer: {0}")]
    Inconsistent(&'static str),
}

/// One peer: where to ask, and what it last said.
#[derive(Debug)]
pub struct Peer {
    /// The URL as given: the node's name for the matcher.
    pub given: String,
    url: Url,
    /// The base path, without its trailing `/`.
    prefix: String,
    cursor: u64,
    epoch: Option<u64>,
    failing: bool,
    /// Whether it may be asked for some jobs only: until it refuses.
    filters: bool,
}

impl Peer {
    /// The URL of the records after `after`, of the jobs `jobs` names
    /// (`K,K,...`: their keys) or of every job.
    fn records_url(&self, after: u64, jobs: Option<&str>) -> Url {
        let jobs = jobs.map(|j| format!("&jobs={j}")).unwrap_or_default();
        self.url.with_path(&format!(
            "{}/waits/records?after={after}{jobs}",
            self.prefix
        ))
    }
}

/// The `jobs=` filter of the jobs held here, `K,K,...` (empty for none);
/// `None` (every job) when they are more than a filter names.
fn filter(state: &Mutex<State>) -> Option<String> {
    let st = state.lock().unwrap_or_else(|p| p.into_inner());
    let keys: std::collections::BTreeSet<u64> = st
        .ranks
        .values()
        .map(|r| outbox::job_key(&r.labels.job))
        .collect();
    drop(st);
    (keys.len() <= outbox::MAX_FILTER).then(|| {
        keys.iter()
            .map(|k| format!("{k:016x}"))
            .collect::<Vec<_>>()
            .join(",")
    })
}

/// Parses `--waits.peers`: each URL as [`Url::parse`] reads it, a daemon's
/// base URL (a path prefix allowed, no query, no credentials: those go in
/// `--waits.peers-auth-file`), each once, https only with a CA file.
pub fn parse_peers(given: &[String], ca_file: bool) -> Result<Vec<Peer>, PeerError> {
    let mut peers: Vec<Peer> = Vec::with_capacity(given.len());
    for g in given {
        let bad = |why: &str| PeerError::BadUrl {
            url: shown(g),
            why: why.into(),
        };
        let url = Url::parse(g).map_err(|_| {
            bad("is not a daemon's address: give http://HOST:PORT or https://HOST:PORT, its --listen")
        })?;
        if url.userinfo.is_some() {
            return Err(bad(
                "carries credentials, which every local user can read on the command line: put `user:password` in a mode-0600 file and give it with --waits.peers-auth-file",
            ));
        }
        if url.path.contains(['?', '#']) {
            return Err(bad(
                "is not a base URL: give http://HOST:PORT or https://HOST:PORT (a path prefix is allowed, a query is not)",
            ));
        }
        if url.tls && !ca_file {
            return Err(bad(
                "is HTTPS: give --waits.peers-ca-file PATH, the CA certificate (PEM) that signed the peers' certificates",
            ));
        }
        if peers.iter().any(|p| p.given == *g) {
            return Err(bad("is given twice: give each peer once"));
        }
        peers.push(Peer {
            given: g.clone(),
            prefix: url.path.trim_end_matches('/').to_string(),
            url,
            cursor: 0,
            epoch: None,
            failing: false,
            filters: true,
        });
    }
    Ok(peers)
}

/// `url` as a message may say it: without the user information of its
/// authority (a password), its control characters as `?`.
fn shown(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, r)) => (format!("{s}://"), r),
        None => (String::new(), url),
    };
    let end = rest.find('/').unwrap_or(rest.len());
    let host = match rest[..end].rsplit_once('@') {
        Some((_, h)) => h,
        None => &rest[..end],
    };
    format!("{scheme}{host}{}", &rest[end..]).replace(char::is_control, "?")
}

/// The client of the peers, from `--waits.peers-ca-file` and
/// `--waits.peers-auth-file`; their problems said under those names.
pub fn client(
    ca_file: Option<&std::path::Path>,
    auth_file: Option<&std::path::Path>,
) -> Result<Client, PeerError> {
    // A peer's answer is never read past MAX_ANSWER_BYTES.
    Client::new(ca_file, auth_file)
        .map(|c| c.max_body(MAX_ANSWER_BYTES))
        .map_err(|e| {
            PeerError::Files(match e {
                FetchError::CaFile { path, why } => format!("--waits.peers-ca-file {path}: {why}"),
                FetchError::AuthFile { path, why } => {
                    format!("--waits.peers-auth-file {path}: {why}")
                }
                e => format!("--waits.peers: {}", crate::one_line(&e)),
            })
        })
}

/// Reads a peer's answer to `GET /waits/records?after=after`: bounded,
/// typed (every number in its field's range), and consistent with the
/// request (no more records than [`MAX_ANSWER`], none before `after`).
pub fn parse_answer(body: &[u8], after: u64) -> Result<Answer, AnswerError> {
    if body.len() > MAX_ANSWER_BYTES {
        return Err(AnswerError::TooLarge(body.len()));
    }
    let a: Answer = serde_json::from_slice(body).map_err(|e| {
        // serde_json says where, not what it read.
        AnswerError::Malformed(crate::one_line(&e))
    })?;
    if a.drains.len() > MAX_ANSWER {
        return Err(AnswerError::Inconsistent("more drains than records"));
    }
    let records = a.drains.iter().map(|d| d.records.len()).sum::<usize>();
    if records > MAX_ANSWER {
        return Err(AnswerError::Inconsistent(
            "more records than an answer holds",
        ));
    }
    if a.drains.iter().any(|d| d.job.len() > MAX_JOB) {
        return Err(AnswerError::Inconsistent("a job label longer than any"));
    }
    if records > 0
        && a.next
            .checked_sub(records as u64)
            .is_none_or(|start| start < after.max(a.first))
    {
        return Err(AnswerError::Inconsistent(
            "its records do not follow the cursor asked for",
        ));
    }
    Ok(a)
}

/// What one peer's answer does to its cursor: the records the peer dropped
/// before they were fetched, and whether to ask again from 0 at once (the
/// peer restarted).
fn advance(p: &mut Peer, a: &Answer) -> (u64, bool) {
    let first_answer = match p.epoch {
        Some(e) if e != a.epoch => {
            p.epoch = Some(a.epoch);
            p.cursor = 0;
            return (0, true);
        }
        Some(_) => false,
        None => {
            p.epoch = Some(a.epoch);
            true
        }
    };
    // At the first answer, what the peer dropped before was never owed.
    let lost = if first_answer {
        0
    } else {
        a.first.saturating_sub(p.cursor)
    };
    p.cursor = a.next;
    (lost, false)
}

/// The self-metrics the thread counts in.
struct Counters {
    lost: IntCounter,
    errors: IntCounter,
}

/// Starts the thread that fetches the peers' records until `stop`; `None`
/// without peers.
pub fn start(
    peers: Vec<Peer>,
    client: Client,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
) -> Option<JoinHandle<()>> {
    if peers.is_empty() {
        return None;
    }
    let counters = {
        let st = state.lock().unwrap_or_else(|p| p.into_inner());
        Counters {
            lost: st.selfm.waits_peer_records_lost.clone(),
            errors: st.selfm.waits_peer_errors.clone(),
        }
    };
    let spawned = std::thread::Builder::new()
        .name("waits-peers".into())
        .spawn(move || run(peers, &client, &state, &stop, &counters));
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            log::error!("cannot start the thread that fetches --waits.peers' records: {e}");
            None
        }
    }
}

fn run(
    mut peers: Vec<Peer>,
    client: &Client,
    state: &Mutex<State>,
    stop: &AtomicBool,
    c: &Counters,
) {
    log::info!(
        "fetching the wait records of jobs spanning nodes from {} every {} ms",
        peers
            .iter()
            .map(|p| p.given.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        PERIOD.as_millis()
    );
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        for p in &mut peers {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            pull(p, client, state, stop, c);
        }
        // Slept in slices, so that a stop is seen within 100 ms.
        while !stop.load(Ordering::Relaxed) {
            let left = PERIOD.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(100)));
        }
    }
}

/// Fetches what `p` holds after its cursor, and again while its answers
/// are full.
fn pull(p: &mut Peer, client: &Client, state: &Mutex<State>, stop: &AtomicBool, c: &Counters) {
    for _ in 0..MAX_PULLS {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let jobs = p.filters.then(|| filter(state)).flatten();
        let got = match client.get(&p.records_url(p.cursor, jobs.as_deref()), TIMEOUT) {
            Err(FetchError::Status { status, .. })
                if jobs.is_some() && status.split(' ').nth(1) == Some("400") =>
            {
                p.filters = false;
                log::info!(
                    "--waits.peers {} does not filter by job (a daemon of an older version): the records of all its jobs are fetched",
                    p.given
                );
                continue;
            }
            got => got
                .map_err(|e| crate::one_line(&e))
                .and_then(|body| parse_answer(&body, p.cursor).map_err(|e| e.to_string())),
        };
        let a = match got {
            Ok(a) => a,
            Err(why) => {
                c.errors.inc();
                if !p.failing {
                    p.failing = true;
                    log::warn!(
                        "--waits.peers {}: {why}; instances of jobs with ranks there stay incomplete until it answers (asked every {} ms, said again when it does)",
                        p.given,
                        PERIOD.as_millis()
                    );
                }
                return;
            }
        };
        if std::mem::take(&mut p.failing) {
            log::info!(
                "--waits.peers {} answers again: its wait records are fetched",
                p.given
            );
        }
        let (lost, restart) = advance(p, &a);
        if restart {
            log::info!(
                "--waits.peers {} restarted: its wait records are fetched from its start",
                p.given
            );
            continue;
        }
        if lost > 0 {
            c.lost.inc_by(lost);
        }
        let records = a.drains.iter().map(|d| d.records.len()).sum::<usize>();
        if records > 0 {
            give(state, &p.given, &a.drains);
        }
        if !outbox::full(records) {
            return;
        }
    }
}

/// Hands the drains of jobs this node holds to the matcher, under the
/// state's lock; the others are not this node's to match.
fn give(state: &Mutex<State>, node: &str, drains: &[outbox::Shipped]) {
    let now = monotonic_ns();
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    let st = &mut *st;
    let here: HashSet<&str> = st.ranks.values().map(|r| r.labels.job.as_str()).collect();
    for d in drains.iter().filter(|d| here.contains(d.job.as_str())) {
        st.waits.add_remote(
            &d.job,
            node,
            &Drain {
                rank: d.rank,
                world_size: d.world_size,
                shift: d.shift,
                clock: waits::clock::NS,
                ns_per_tick: 0,
                records: &d.records,
                lost: 0,
                p2p_shift: d.p2p_shift,
                skipped: d.skipped,
            },
            now,
        );
    }
}

// A period's requests take a whole outbox.
const _: () = assert!(MAX_PULLS * (MAX_ANSWER - CHUNK) >= outbox::MAX_RECORDS);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::registry::outbox::{Outbox, Shipped};

    fn shipped(job: &str, n: u64) -> Shipped {
        Shipped {
            job: job.into(),
            rank: 1,
            world_size: 4,
            shift: 0,
            p2p_shift: 0,
            skipped: 0,
            records: (0..n)
                .map(|s| waits::Plain {
                    enter: s,
                    leave: s + 1,
                    seq: s,
                    kind: waits::kind::COLL,
                    ..Default::default()
                })
                .collect(),
        }
    }

    #[test]
    fn peers_are_base_urls_given_once() {
        let p = parse_peers(
            &["http://10.0.0.2:9479".into(), "https://n3:9479/obs/".into()],
            true,
        )
        .unwrap();
        assert_eq!(p[0].given, "http://10.0.0.2:9479");
        assert_eq!(
            p[0].records_url(7, Some("00000000000000ff")).shown(),
            "http://10.0.0.2:9479/waits/records?after=7&jobs=00000000000000ff"
        );
        assert_eq!(
            p[1].records_url(0, None).shown(),
            "https://n3:9479/obs/waits/records?after=0"
        );
        for (bad, says) in [
            ("ftp://n2", "http://HOST:PORT"),
            ("", "http://HOST:PORT"),
            ("http://n2:9479/?after=3", "not a base URL"),
            ("http://me:secret@n2:9479", "--waits.peers-auth-file"),
            ("http://me:secret@", "http://HOST:PORT"),
            ("https://n2:9479", "--waits.peers-ca-file"),
            ("http://n2\n:9479", "http://HOST:PORT"),
        ] {
            let e = parse_peers(&[bad.into()], false).unwrap_err().to_string();
            assert!(e.starts_with("--waits.peers `"), "{bad}: {e}");
            assert!(e.contains(says), "{bad}: {e}");
            assert!(!e.contains('\n') && !e.contains("secret"), "{bad}: {e}");
        }
        let e = parse_peers(&["http://n2:1".into(), "http://n2:1".into()], false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("given twice"), "{e}");
        // A bare HOST:PORT is http://, as for `report --url`.
        let p = parse_peers(&["n2:9479".into()], false).unwrap();
        assert_eq!(
            p[0].records_url(1, None).shown(),
            "http://n2:9479/waits/records?after=1"
        );
        assert_eq!(p[0].given, "n2:9479");
    }

    #[test]
    fn an_answer_round_trips_and_hostile_ones_are_refused() {
        let mut o = Outbox::new(9);
        o.push(shipped("jobid=\"1\",uid=\"5\"", 3), 0, 0);
        let body = o.answer_json(0);
        let a = parse_answer(body.as_bytes(), 0).unwrap();
        assert_eq!((a.epoch, a.first, a.next, a.drains.len()), (9, 0, 3, 1));
        assert_eq!(a.drains[0].records[2].seq, 2);
        let malformed = |b: &str| {
            matches!(
                parse_answer(b.as_bytes(), 0),
                Err(AnswerError::Malformed(_))
            )
        };
        for bad in [
            "",
            "null",
            "[]",
            "{",
            "{\"epoch\":1}",
            "{\"epoch\":-1,\"first\":0,\"next\":0,\"drains\":[]}",
            "{\"epoch\":1.5,\"first\":0,\"next\":0,\"drains\":[]}",
            "{\"epoch\":18446744073709551616,\"first\":0,\"next\":0,\"drains\":[]}",
            "{\"epoch\":1,\"first\":0,\"next\":0,\"drains\":{}}",
            // A record of 10 fields, of 12, a kind over u8, a peer over i32.
            "{\"epoch\":1,\"first\":0,\"next\":1,\"drains\":[{\"job\":\"j\",\"rank\":0,\"world_size\":2,\"shift\":0,\"p2p_shift\":0,\"skipped\":0,\"records\":[[1,2,3,4,5,6,7,8,9,10]]}]}",
            "{\"epoch\":1,\"first\":0,\"next\":1,\"drains\":[{\"job\":\"j\",\"rank\":0,\"world_size\":2,\"shift\":0,\"p2p_shift\":0,\"skipped\":0,\"records\":[[1,2,3,4,5,6,7,8,9,10,11,12]]}]}",
            "{\"epoch\":1,\"first\":0,\"next\":1,\"drains\":[{\"job\":\"j\",\"rank\":0,\"world_size\":2,\"shift\":0,\"p2p_shift\":0,\"skipped\":0,\"records\":[[1,2,3,4,5,256,7,8,9,10,11]]}]}",
            "{\"epoch\":1,\"first\":0,\"next\":1,\"drains\":[{\"job\":\"j\",\"rank\":0,\"world_size\":2,\"shift\":0,\"p2p_shift\":0,\"skipped\":0,\"records\":[[1,2,3,4,5,6,7,2147483648,9,10,11]]}]}",
            // A job that is no string; a rank that is negative.
            "{\"epoch\":1,\"first\":0,\"next\":0,\"drains\":[{\"job\":7,\"rank\":0,\"world_size\":2,\"shift\":0,\"p2p_shift\":0,\"skipped\":0,\"records\":[]}]}",
            "{\"epoch\":1,\"first\":0,\"next\":0,\"drains\":[{\"job\":\"j\",\"rank\":-1,\"world_size\":2,\"shift\":0,\"p2p_shift\":0,\"skipped\":0,\"records\":[]}]}",
            "\u{0}\u{ff}",
        ] {
            assert!(malformed(bad), "{bad}");
        }
        // Deep nesting is refused by serde_json's recursion limit, not a
        // stack overflow.
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(malformed(&deep));
        // Too large, before it is parsed.
        let big = vec![b' '; MAX_ANSWER_BYTES + 1];
        assert_eq!(
            parse_answer(&big, 0),
            Err(AnswerError::TooLarge(MAX_ANSWER_BYTES + 1))
        );
        // Well-formed but inconsistent: records before the cursor asked
        // for, or more than an answer holds, or an overlong job.
        let mut o = Outbox::new(9);
        o.push(shipped("j", 3), 0, 0);
        let body = o.answer_json(0);
        assert!(matches!(
            parse_answer(body.as_bytes(), 2),
            Err(AnswerError::Inconsistent(_))
        ));
        let too_many = Answer {
            epoch: 1,
            first: 0,
            next: 10_000,
            drains: vec![shipped("j", 10_000)],
        };
        let body = serde_json::to_vec(&too_many).unwrap();
        assert!(matches!(
            parse_answer(&body, 0),
            Err(AnswerError::Inconsistent(_))
        ));
        let long = Answer {
            epoch: 1,
            first: 0,
            next: 1,
            drains: vec![shipped(&"x".repeat(MAX_JOB + 1), 1)],
        };
        let body = serde_json::to_vec(&long).unwrap();
        assert!(matches!(
            parse_answer(&body, 0),
            Err(AnswerError::Inconsistent(_))
        ));
        // A field it does not know is ignored (a later version's).
        let a = parse_answer(
            b"{\"epoch\":1,\"first\":4,\"next\":4,\"drains\":[],\"more\":true}",
            0,
        )
        .unwrap();
        assert_eq!((a.first, a.next), (4, 4));
    }

    #[test]
    fn cursors_follow_epochs_and_count_what_the_peer_dropped() {
        let mut p = parse_peers(&["http://n2:1".into()], false)
            .unwrap()
            .remove(0);
        let answer = |epoch, first, next| Answer {
            epoch,
            first,
            next,
            drains: Vec::new(),
        };
        // The first answer: the peer's earlier drops are not counted.
        assert_eq!(advance(&mut p, &answer(5, 1_000, 1_200)), (0, false));
        assert_eq!(p.cursor, 1_200);
        assert_eq!(advance(&mut p, &answer(5, 1_000, 1_300)), (0, false));
        // It dropped 200 before we asked again.
        assert_eq!(advance(&mut p, &answer(5, 1_500, 1_600)), (200, false));
        assert_eq!(p.cursor, 1_600);
        // It restarted: ask again from 0, then count what it dropped since.
        assert_eq!(advance(&mut p, &answer(6, 0, 10)), (0, true));
        assert_eq!(p.cursor, 0);
        assert_eq!(advance(&mut p, &answer(6, 3, 10)), (3, false));
        assert_eq!(p.cursor, 10);
    }

    /// A peer of one connection: answers `status` and `body` to the one
    /// request it takes, and hands back the request's first line.
    fn one_answer(status: &'static str, body: String) -> (String, std::thread::JoinHandle<String>) {
        let (url, h) = answers(vec![(status, body)]);
        (url, std::thread::spawn(move || h.join().unwrap().remove(0)))
    }

    /// A peer of one connection a request: answers them in turn, and hands
    /// back their first lines.
    fn answers(
        answers: Vec<(&'static str, String)>,
    ) -> (String, std::thread::JoinHandle<Vec<String>>) {
        use std::io::{BufRead as _, BufReader, Write as _};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let h = std::thread::spawn(move || {
            let mut firsts = Vec::new();
            for (status, body) in answers {
                let (s, _) = l.accept().unwrap();
                let mut r = BufReader::new(s);
                let mut first = String::new();
                r.read_line(&mut first).unwrap();
                let mut line = String::new();
                while r.read_line(&mut line).unwrap() > 2 {
                    line.clear();
                }
                let mut s = r.into_inner();
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                firsts.push(first.trim_end().to_string());
            }
            firsts
        });
        (url, h)
    }

    /// A daemon's state holding no rank.
    fn no_ranks() -> Mutex<State> {
        Mutex::new(State::new(
            None,
            Vec::new(),
            false,
            crate::export::metrics::RenderOptions::default(),
        ))
    }

    /// One pull of `p` by a default client, never stopped.
    fn pull_from(p: &mut Peer, state: &Mutex<State>, c: &Counters) {
        pull(p, &Client::default(), state, &AtomicBool::new(false), c);
    }

    fn counters() -> Counters {
        Counters {
            lost: IntCounter::new("lost", "l").unwrap(),
            errors: IntCounter::new("errors", "e").unwrap(),
        }
    }

    #[test]
    fn a_pull_asks_from_the_cursor_and_gives_the_jobs_held_here() {
        let state = no_ranks();
        let here = crate::export::registry::Rank::synthetic(100, 0, "77");
        let job = here.labels.job.clone();
        state.lock().unwrap().ranks.insert(100, here);
        let mut o = Outbox::new(3);
        o.push(shipped(&job, 2), 0, 0);
        o.push(shipped("jobid=\"other\",uid=\"0\"", 2), 0, 0);
        let (url, h) = one_answer("200 OK", o.answer_json(0));
        let mut p = parse_peers(std::slice::from_ref(&url), false)
            .unwrap()
            .remove(0);
        let c = counters();
        pull_from(&mut p, &state, &c);
        // Asked for the job held here only.
        let key = format!("{:016x}", outbox::job_key(&job));
        assert_eq!(
            h.join().unwrap(),
            format!("GET /waits/records?after=0&jobs={key} HTTP/1.1")
        );
        assert_eq!((p.cursor, p.epoch, p.failing), (4, Some(3), false));
        assert_eq!((c.errors.get(), c.lost.get()), (0, 0));
        let st = state.lock().unwrap();
        // The job held here was given to the matcher; the other was not.
        assert!(st.waits.figures(&job).is_some());
        assert_eq!(st.waits.all().count(), 1);
        drop(st);
        // A peer that answers garbage, then none at all: counted, the
        // cursor kept.
        let (url, h) = one_answer("200 OK", "{\"epoch\":".into());
        p.url = Url::parse(&url).unwrap();
        pull_from(&mut p, &state, &c);
        h.join().unwrap();
        assert_eq!((p.cursor, p.failing, c.errors.get()), (4, true, 1));
        let (url, h) = one_answer("500 Internal Server Error", String::new());
        p.url = Url::parse(&url).unwrap();
        pull_from(&mut p, &state, &c);
        assert_eq!(
            h.join().unwrap(),
            format!("GET /waits/records?after=4&jobs={key} HTTP/1.1")
        );
        assert_eq!((p.cursor, p.failing, c.errors.get()), (4, true, 2));
        // An answer longer than the client reads: refused before it is
        // read, counted.
        let (url, h) = one_answer("200 OK", o.answer_json(0));
        p.url = Url::parse(&url).unwrap();
        let small = Client::default().max_body(16);
        pull(&mut p, &small, &state, &AtomicBool::new(false), &c);
        h.join().unwrap();
        assert_eq!((p.cursor, c.errors.get()), (4, 3));
    }

    #[test]
    fn a_peer_that_refuses_the_filter_is_asked_for_every_job() {
        let state = no_ranks();
        let c = counters();
        // Holding no job: the filter names none.
        let mut o = Outbox::new(5);
        o.push(shipped("jobid=\"other\",uid=\"0\"", 2), 0, 0);
        let (url, h) = answers(vec![("200 OK", o.answer_jobs_json(0, Some(&[])))]);
        let mut p = parse_peers(std::slice::from_ref(&url), false)
            .unwrap()
            .remove(0);
        pull_from(&mut p, &state, &c);
        assert_eq!(
            h.join().unwrap(),
            ["GET /waits/records?after=0&jobs= HTTP/1.1"]
        );
        // Nothing shipped, the cursor past the other job's records.
        assert_eq!((p.cursor, p.filters, c.errors.get()), (2, true, 0));
        // An older daemon: 400 to the filter, then asked without it, at
        // once and from then on; no error counted.
        o.push(shipped("jobid=\"other\",uid=\"0\"", 1), 0, 0);
        let (url, h) = answers(vec![
            (
                "400 Bad Request",
                "the /waits/records query takes only after=N\n".into(),
            ),
            ("200 OK", o.answer_json(2)),
            ("200 OK", o.answer_json(3)),
        ]);
        p.url = Url::parse(&url).unwrap();
        pull_from(&mut p, &state, &c);
        pull_from(&mut p, &state, &c);
        assert_eq!(
            h.join().unwrap(),
            [
                "GET /waits/records?after=2&jobs= HTTP/1.1",
                "GET /waits/records?after=2 HTTP/1.1",
                "GET /waits/records?after=3 HTTP/1.1",
            ]
        );
        assert_eq!((p.cursor, p.filters, c.errors.get()), (3, false, 0));
    }
}
