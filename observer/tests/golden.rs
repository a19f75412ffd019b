//! The exposition, byte for byte: a deterministic registry state (no BPF, no
//! clock) rendered and compared with the committed files under `golden/`,
//! which `promtool check metrics` must also accept.
//!
//! The state covers ranks with and without stats-segment figures, a rank
//! with no call statistics, a retained exited rank, a job id that needs
//! escaping, map entries of a process the registry does not know, bytes and
//! unknown-bytes series, map update failures and a segment error, another
//! user's claim of a job and rank, a second claim of a rank by the same user
//! (labels of its own), a job id verified by its cgroup and one cut to the
//! label cap, and a job of four ranks, one exited, with the scheduler's
//! facts (one needing escaping, one rank disagreeing, and a job whose
//! environment names another Slurm job than its cgroup); it is rendered as the bounded `/metrics` (job-level series,
//! a few per rank, two detail ranks per job), with `--per-rank-detail`
//! (every rank in full, histograms per rank off and on) and as
//! `/metrics/ranks`. The default one must satisfy the series formula of
//! docs/cardinality.md.
//!
//! `MPI_OBSERVER_BLESS=1 cargo test -p mpi-observer --test golden` rewrites
//! the files; review the diff: every name, label and value is an interface.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use mpi_observer::{
    attach::identity::{
        Identity, JobidSource,
        scheduler::{Facts, Scheduler},
    },
    collect::snapshot::{
        CallsByFunction, Directed, Figures, Health, Labels, LayerCalls, MapFailures, PeerTraffic,
        RawSite, Requests, SegmentProblem, Snapshot,
    },
    export::metrics::{self, RenderOptions},
    export::registry::{Rank, State},
};
use observer_common::{
    FUNCTIONS,
    maps::{CallStats, HIST_SLOTS},
};

/// `CLOCK_MONOTONIC` at the fixture's scrape.
const NOW_NS: u64 = 10_000_000_000;

fn id(name: &str) -> u16 {
    FUNCTIONS
        .iter()
        .position(|f| f.name == name)
        .unwrap_or_else(|| panic!("{name} in the function table")) as u16
}

fn at(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

fn stats(calls: u64, seed: u64) -> CallStats {
    let mut s = CallStats::ZERO;
    s.calls = calls;
    s.time_ns = calls * 1_500 + seed;
    s.bytes = [calls * 64, calls * 32];
    // Spread over the slots, the last ones (beyond 1.07 s) included, so
    // the buckets add up to the call count.
    for i in 0..calls {
        s.hist[((i * 7 + seed) % HIST_SLOTS as u64) as usize] += 1;
    }
    s
}

fn rank(pid: u32, r: u32, job: &str, started_ms: u64) -> Rank {
    let mut rank = Rank::synthetic(pid, r, job);
    rank.started_at = at(started_ms);
    rank.attached_at = at(started_ms + 1_250);
    rank
}

fn directed(send: u64, recv: u64) -> Directed {
    Directed { send, recv }
}

/// The registry state, the maps' call statistics and their call sites.
type Fixture = (
    State,
    BTreeMap<u32, CallsByFunction>,
    BTreeMap<u32, Vec<RawSite>>,
);

fn fixture(render: RenderOptions) -> Fixture {
    let mut state = State::new(None, Vec::new(), true, render);
    let (send, recv, allreduce, barrier) = (
        id("MPI_Send"),
        id("MPI_Recv"),
        id("MPI_Allreduce"),
        id("MPI_Barrier"),
    );

    // Job A, rank 0: calls, bytes, unknown bytes, and a stats segment with
    // the oldest outstanding request started 2.5 s before `NOW_NS`.
    let mut a0 = rank(101, 0, "job-a", 1_700_000_000_250);
    let mut f = Figures {
        world_size: 2,
        outstanding: 2,
        oldest_started_ns: Some(NOW_NS - 2_500_000_000),
        persistent_active: 1,
        persistent_inactive: 3,
        requests: Requests {
            started: 40,
            completed: 37,
            cancelled: 1,
            table_full: 2,
        },
        peer_overflow_messages: 5,
        unattributed_messages: 6,
        ..Figures::default()
    };
    let traffic = |messages, bytes| PeerTraffic { messages, bytes };
    f.peers
        .insert(1, traffic(directed(10, 11), directed(640, 704)));
    f.peers.insert(7, traffic(directed(0, 1), directed(0, 8)));
    f.functions.insert(
        send,
        LayerCalls {
            calls: 10,
            bytes: directed(640, 0),
        },
    );
    f.functions.insert(
        allreduce,
        LayerCalls {
            calls: 4,
            bytes: directed(32, 32),
        },
    );
    a0.figures = Some(f);
    state.ranks.insert(101, a0);

    // Job A, rank 1: calls but no stats segment; call sites from the
    // probes, two of them named, the rest of its Allreduce calls in
    // `other`.
    let mut a1 = rank(102, 1, "job-a", 1_700_000_000_500);
    a1.name_site(0x1000, "solve at cg.c:42");
    a1.name_site(0x2000, "halo at halo.c:7");
    state.ranks.insert(102, a1);

    // Job B, rank 0: exited and retained, with frozen segment figures.
    let mut b0 = rank(201, 0, "job-b", 1_700_000_100_000);
    b0.exited_at = Some(std::time::Instant::now());
    b0.exited_wall = Some(at(1_700_000_200_125));
    b0.figures = Some(Figures {
        world_size: 1,
        outstanding: 1,
        oldest_started_ns: Some(1_000),
        requests: Requests {
            started: 3,
            completed: 2,
            ..Requests::default()
        },
        ..Figures::default()
    });
    state.ranks.insert(201, b0);

    // A job id to escape, and a rank the maps have nothing for yet.
    state
        .ranks
        .insert(301, rank(301, 0, "we\"ird\\job\nid", 1_700_000_300_000));

    // Claims of job A's rank 0: by another user (uid 1001), and again by
    // the same user (uid 0), which the registry gives labels of their own.
    let claim = |pid, uid, jobid: &str, source| {
        let mut r = rank(pid, 0, jobid, 1_700_000_400_000);
        r.identity = Identity::new(jobid, "0", "2", uid, source);
        r.labels = Labels::new(&r.identity);
        r
    };
    state.register(claim(401, 1001, "job-a", JobidSource::Environment));
    state.register(claim(402, 0, "job-a", JobidSource::Environment));
    // A job id its Slurm cgroup verified, and one cut to the label cap.
    // Its environment named another Slurm job: only the scheduler is kept.
    let mut verified = claim(501, 0, "4242", JobidSource::Cgroup);
    verified.identity.scheduler = Some(std::sync::Arc::new(Facts::bare(Scheduler::Slurm)));
    verified.identity.scheduler_disowned = true;
    state.register(verified);
    let long = format!("{}-and-more", "j".repeat(130));
    state.register(claim(502, 0, &long, JobidSource::Launcher));
    // Job C: four ranks, more than --detail-ranks 2, one of them exited:
    // two are detail ranks, the two others carry the minimal series only.
    // Its scheduler's facts, an account to escape; the last rank claims
    // another step (counted; the info series has rank 0's).
    for (pid, r) in [(601, 0), (602, 1), (603, 2), (604, 3)] {
        let mut c = rank(pid, r, "job-c", 1_700_000_450_000);
        if pid == 603 {
            c.exited_at = Some(std::time::Instant::now());
            c.exited_wall = Some(at(1_700_000_480_000));
        }
        c.identity.scheduler = Some(std::sync::Arc::new(Facts {
            step: if pid == 604 { "1" } else { "0" }.into(),
            user: "alice".into(),
            account: "phy\"s\\ics".into(),
            partition: "debug".into(),
            array_job: "9".into(),
            array_task: "2".into(),
            ..Facts::bare(Scheduler::Slurm)
        }));
        state.register(c);
    }

    let mut map = BTreeMap::new();
    let mut s = stats(12, 1);
    s.bytes_unknown = [0, 2];
    map.insert(101, BTreeMap::from([(send, stats(10, 0)), (recv, s)]));
    map.insert(
        102,
        BTreeMap::from([
            (send, stats(20, 2)),
            (allreduce, stats(7, 3)),
            (barrier, stats(3, 4)),
        ]),
    );
    map.insert(201, BTreeMap::from([(barrier, stats(5, 5))]));
    // The claims of job A's rank 0, with figures that would wrap a sum.
    let mut huge = stats(3, 7);
    huge.calls = u64::MAX - 999;
    huge.hist[0] = u64::MAX;
    map.insert(401, BTreeMap::from([(send, huge)]));
    map.insert(402, BTreeMap::from([(send, huge)]));
    for (pid, calls) in [(601, 10), (602, 40), (603, 20), (604, 30)] {
        map.insert(
            pid,
            BTreeMap::from([(send, stats(calls, 8)), (barrier, stats(calls / 2, 9))]),
        );
    }
    // A process the registry does not know: never exported.
    map.insert(999, BTreeMap::from([(send, stats(99, 6))]));

    let site = |function, addr, calls, time_ns| RawSite {
        function,
        addr,
        calls,
        time_ns,
    };
    let sites = BTreeMap::from([(
        102,
        vec![
            site(allreduce, 0x1000, 4, 6_000),
            site(allreduce, 0x2000, 2, 3_000),
            site(send, 0x1000 + 64, 0, 0),
        ],
    )]);

    state.selfm.segment_error(SegmentProblem::Corrupt);
    wait_states(&mut state);
    (state, map, sites)
}

/// The wait states of the first job: two of its ranks in a barrier (one
/// 3 ms late) and an allreduce (the other 1 ms late), sampled 1 in 2, and a
/// message rank 0 sends 2 ms after rank 1 waits for it, sampled 1 in 8.
fn wait_states(state: &mut State) {
    use mpi_observer::collect::waits::Drain;
    use observer_common::waits::{self, Plain};
    let job = state.ranks.values().next().unwrap().labels.job.clone();
    let f = |name| observer_common::function_by_name(name).unwrap();
    const MS: u64 = 1_000_000;
    let rec = |seq, function, enter, leave| Plain {
        enter,
        leave,
        seq,
        comm: waits::WORLD,
        function,
        kind: waits::kind::COLL,
        peer: waits::NO_ROOT,
        ..Plain::default()
    };
    let message = |kind, peer, function, enter, leave| Plain {
        enter,
        leave,
        comm: waits::WORLD,
        function: f(function),
        kind,
        peer,
        tag: 4,
        thread: 1,
        bytes: 64,
        ..Plain::default()
    };
    let per_rank = [
        [
            rec(0, f("MPI_Barrier"), 0, 3 * MS),
            rec(2, f("MPI_Allreduce"), 10 * MS, 12 * MS),
            message(waits::kind::SEND, 1, "MPI_Send", 20 * MS, 20 * MS),
        ],
        [
            rec(0, f("MPI_Barrier"), 3 * MS, 3 * MS),
            rec(2, f("MPI_Allreduce"), 11 * MS, 12 * MS),
            message(waits::kind::RECV, 0, "MPI_Recv", 18 * MS, 21 * MS),
        ],
    ];
    for (rank, records) in per_rank.iter().enumerate() {
        state.waits.add(
            &job,
            &Drain {
                rank: rank as u32,
                world_size: 2,
                shift: 1,
                clock: waits::clock::TICKS,
                ns_per_tick: 1 << 32,
                records,
                lost: rank as u64,
                p2p_shift: 4,
                skipped: 3 * rank as u64,
            },
            NOW_NS,
        );
    }
    state.waits.settle(NOW_NS);
}

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

/// How the fixture is rendered.
#[derive(Clone, Copy)]
enum Exposition {
    /// `/metrics` with these flags.
    Metrics {
        per_rank_detail: bool,
        per_rank_histograms: bool,
    },
    /// `/metrics/ranks`.
    Ranks,
}

const DEFAULT: Exposition = Exposition::Metrics {
    per_rank_detail: false,
    per_rank_histograms: false,
};

fn render(how: Exposition) -> String {
    let opts = match how {
        Exposition::Metrics {
            per_rank_detail,
            per_rank_histograms,
        } => RenderOptions {
            per_rank_detail,
            per_rank_histograms,
            ..RenderOptions::default()
        },
        Exposition::Ranks => RenderOptions::default(),
    };
    let (mut state, map, sites) = fixture(RenderOptions {
        node: Some("node-a"),
        ..opts
    });
    let health = Health {
        map_failures: MapFailures {
            stats: 3,
            inflight: 1,
            callsites: 2,
            site_cookies: 0,
        },
        scrapes_total: 0,
    };
    let mut snap: Snapshot = state.snapshot(map, sites, health, NOW_NS);
    snap.taken = at(1_700_000_500_000);
    match how {
        Exposition::Metrics { .. } => {
            let detail = state.picker.update(&snap, state.render.detail_ranks);
            // The same figures 30 s earlier: the last minute's fractions
            // are all 0.
            let mut earlier = snap.clone();
            earlier.taken = at(1_700_000_470_000);
            state.window.update(&earlier);
            let recent = state.window.update(&snap);
            let carried = metrics::Carried {
                detail: &detail,
                recent: &recent,
                departed: &state.departed,
                waits: &state.waits,
            };
            metrics::render_metrics(&snap, &state.selfm, state.render, carried, || {
                Duration::from_millis(3)
            })
        }
        Exposition::Ranks => {
            metrics::render_ranks(&snap, &state.selfm, state.render, None, &state.waits)
        }
    }
}

fn check(name: &str, text: &str) {
    let path = golden(name);
    if std::env::var_os("MPI_OBSERVER_BLESS").is_some() {
        std::fs::write(&path, text).expect("write the golden file");
    }
    let want = std::fs::read_to_string(&path).expect("golden file; bless to create it");
    if text != want {
        let line = text
            .lines()
            .zip(want.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| text.lines().count().min(want.lines().count()));
        panic!(
            "{name} differs from the rendering, first at line {}:\n  rendered: {:?}\n  golden:   {:?}",
            line + 1,
            text.lines().nth(line),
            want.lines().nth(line)
        );
    }
    let out = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&path).expect("golden file"))
        .output()
        .expect("promtool on PATH");
    assert!(
        out.status.success(),
        "promtool check metrics {name}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn exposition_is_unchanged() {
    check("exposition.prom", &render(DEFAULT));
}

#[test]
fn exposition_with_per_rank_detail_is_unchanged() {
    check(
        "exposition-per-rank-detail.prom",
        &render(Exposition::Metrics {
            per_rank_detail: true,
            per_rank_histograms: false,
        }),
    );
}

#[test]
fn exposition_with_per_rank_histograms_is_unchanged() {
    check(
        "exposition-per-rank-histograms.prom",
        &render(Exposition::Metrics {
            per_rank_detail: true,
            per_rank_histograms: true,
        }),
    );
}

#[test]
fn ranks_exposition_is_unchanged() {
    check("exposition-ranks.prom", &render(Exposition::Ranks));
}

/// A sample's name and its label pairs (values unescaped enough to compare).
fn parse(line: &str) -> (&str, Vec<(&str, &str)>) {
    let (series, _) = line.rsplit_once(' ').expect("a sample has a value");
    let Some((name, rest)) = series.split_once('{') else {
        return (series, Vec::new());
    };
    let body = rest.strip_suffix('}').expect("closed label set");
    let mut labels = Vec::new();
    let mut rest = body;
    while let Some((key, after)) = rest.split_once("=\"") {
        // The value ends at the first quote not escaped.
        let bytes = after.as_bytes();
        let mut i = 0;
        while bytes[i] != b'"' {
            i += if bytes[i] == b'\\' { 2 } else { 1 };
        }
        labels.push((key, &after[..i]));
        rest = after[i + 1..].trim_start_matches(',');
    }
    (name, labels)
}

/// The series formula of docs/cardinality.md on the default exposition:
/// no label set combines `rank` with `function`, `peer`, `callsite` or `le`
/// unless that rank is a detail rank (`mpi_rank_detail`), and every other
/// rank costs at most 7 series, 9 with a stats segment.
#[test]
fn default_exposition_keeps_the_series_formula() {
    let text = render(DEFAULT);
    let samples: Vec<(&str, Vec<(&str, &str)>)> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(parse)
        .collect();
    let rank_of = |labels: &[(&str, &str)]| -> Option<(String, String, String)> {
        let get = |k| {
            labels
                .iter()
                .find(|(key, _)| *key == k)
                .map(|(_, v)| v.to_string())
        };
        Some((get("jobid")?, get("uid")?, get("rank")?))
    };
    let detail: std::collections::HashSet<_> = samples
        .iter()
        .filter(|(n, _)| *n == "mpi_rank_detail")
        .filter_map(|(_, l)| rank_of(l))
        .collect();
    assert!(!detail.is_empty(), "{text}");
    let mut per_rank: BTreeMap<(String, String, String), (usize, bool)> = BTreeMap::new();
    for (name, labels) in &samples {
        let Some(rank) = rank_of(labels) else {
            continue;
        };
        let wide = labels
            .iter()
            .any(|(k, _)| ["function", "peer", "callsite", "le"].contains(k));
        assert!(
            !wide || detail.contains(&rank),
            "{name} {labels:?} combines rank with a wide label, and {rank:?} is no detail rank"
        );
        let e = per_rank.entry(rank).or_default();
        e.0 += 1;
        e.1 |= *name == "mpi_requests_outstanding";
    }
    let mut seen = Vec::new();
    for (rank, (n, stats)) in &per_rank {
        if detail.contains(rank) {
            continue;
        }
        let most = if *stats { 9 } else { 7 };
        assert!(n <= &most, "{rank:?}: {n} series, at most {most}");
        seen.push((n, stats));
    }
    assert!(!seen.is_empty(), "a rank beyond the detail ones");
    println!("series of the ranks that are not detail ranks (count, stats segment): {seen:?}");
}
