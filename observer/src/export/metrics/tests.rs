use std::{collections::HashSet, sync::Arc};

use super::*;
use crate::{
    attach::identity::{JobidSource, LABEL_CAP},
    collect::snapshot::Site,
    collect::snapshot::{CallsByFunction, SegmentSnapshot},
    collect::snapshot::{Figures, LayerCalls, PeerTraffic, SegmentProblem},
};

/// A rank with figures in every family: calls, call sites, a segment.
fn rank(pid: u32, id: Identity, value: u64) -> RankSnapshot {
    let mut st = CallStats::ZERO;
    st.calls = value;
    st.time_ns = value;
    st.bytes = [value, value];
    st.bytes_unknown = [value, 0];
    st.hist = [value; HIST_SLOTS];
    let calls: CallsByFunction = [(0, st), (5, st)].into();
    let mut figures = Figures {
        ready: true,
        outstanding: value,
        ..Default::default()
    };
    figures.peers.insert(
        1,
        PeerTraffic {
            messages: Directed {
                send: value,
                recv: value,
            },
            bytes: Directed {
                send: value,
                recv: value,
            },
        },
    );
    figures.functions.insert(
        5,
        LayerCalls {
            calls: value,
            bytes: Directed {
                send: value,
                recv: value,
            },
        },
    );
    let site = |name: &str| Site {
        function: 0,
        name: Arc::from(crate::attach::identity::cap_callsite(name)),
        calls: value / 2,
        time_ns: value / 2,
        exported: true,
        pending: false,
    };
    RankSnapshot {
        pid,
        labels: Labels::new(&id),
        identity: id,
        library: "openmpi",
        version: "4.1.4".into(),
        started: UNIX_EPOCH,
        attached: UNIX_EPOCH,
        counted_since: UNIX_EPOCH,
        exited: pid.is_multiple_of(2).then_some(UNIX_EPOCH),
        calls: Some(calls),
        segment: Some(SegmentSnapshot {
            figures,
            oldest_request_age: Duration::ZERO,
        }),
        callsites: vec![site("main"), site("solve")],
    }
}

/// Every sample line's (name, label set), which must all differ.
fn assert_unique(out: &str) {
    let mut seen = HashSet::new();
    for line in out.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, _) = line.rsplit_once(' ').expect("a sample has a value");
        assert!(seen.insert(series), "duplicate series {series}");
    }
    assert!(seen.len() > 10, "{out}");
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

#[test]
fn no_two_series_share_a_label_set_whatever_the_ranks_claim() {
    let long = "9".repeat(200);
    // Claims chosen to collide: the same rank of the same job, values
    // equal only once cut, a rank that claims a conflict's suffix, label
    // text trying to close the value, another user's claim of the job.
    let jobs = [
        "4242",
        "4242",
        &long,
        &format!("{long}x"),
        "a\",uid=\"0",
        "",
    ];
    let ranks = [
        "0",
        "0",
        "0#pid3",
        "0#pid3.2",
        &long,
        &format!("{long}y"),
        "1",
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for round in 0..200 {
        let n = 2 + (xorshift(&mut seed) % 12) as usize;
        let ranks: Vec<RankSnapshot> = (0..n)
            .map(|i| {
                let r = |s: &mut u64, len: usize| (xorshift(s) % len as u64) as usize;
                let id = Identity::new(
                    jobs[r(&mut seed, jobs.len())],
                    ranks[r(&mut seed, ranks.len())],
                    "2",
                    [0, 0, 1000][r(&mut seed, 3)],
                    JobidSource::Environment,
                );
                rank(1 + i as u32, id, xorshift(&mut seed) >> (round % 64))
            })
            .collect();
        let snap = Snapshot {
            ranks,
            health: Health::default(),
            ..Default::default()
        };
        for (per_rank_histograms, per_rank_detail) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let opts = RenderOptions {
                per_rank_histograms,
                per_rank_detail,
                node: Some("n1"),
                ..Default::default()
            };
            let selfm = SelfMetrics::new();
            assert_unique(&render(&snap, &selfm, opts, || Duration::ZERO));
            assert_unique(&render_ranks(
                &snap,
                &selfm,
                opts,
                None,
                &Default::default(),
            ));
        }
    }
}

#[test]
fn two_users_claiming_one_rank_make_two_series() {
    let honest = Identity::new("4242", "0", "2", 0, JobidSource::Environment);
    let forged = Identity::new("4242", "0", "2", 1001, JobidSource::Environment);
    let snap = Snapshot {
        ranks: vec![rank(10, honest, 2000), rank(11, forged, u64::MAX - 999)],
        health: Health::default(),
        ..Default::default()
    };
    let out = render(&snap, &SelfMetrics::new(), RenderOptions::default(), || {
        Duration::ZERO
    });
    let f0 = FUNCTIONS[0].name;
    assert!(
        out.contains(&format!(
            "mpi_calls_total{{jobid=\"4242\",uid=\"0\",rank=\"0\",function=\"{f0}\"}} 2000\n"
        )),
        "{out}"
    );
    assert!(out.contains("uid=\"1001\",rank=\"0\""), "{out}");
    // The per-job histogram is per (job, uid): the honest one's count is
    // its own.
    assert!(
        out.contains(&format!(
            "mpi_call_duration_seconds_count{{jobid=\"4242\",uid=\"0\",function=\"{f0}\"}} 2000\n"
        )),
        "{out}"
    );
    assert_unique(&out);
}

#[test]
fn sums_saturate_and_histograms_stay_monotonic() {
    // Two ranks of one job at u64::MAX: the per-job sum saturates.
    let id = |r: &str| Identity::new("j", r, "2", 0, JobidSource::Environment);
    let snap = Snapshot {
        ranks: vec![rank(1, id("0"), u64::MAX), rank(3, id("1"), u64::MAX)],
        health: Health::default(),
        ..Default::default()
    };
    let out = render(&snap, &SelfMetrics::new(), RenderOptions::default(), || {
        Duration::ZERO
    });
    let max = u64::MAX.to_string();
    let f0 = FUNCTIONS[0].name;
    let count = format!(
        "mpi_call_duration_seconds_count{{jobid=\"j\",uid=\"0\",function=\"{f0}\"}} {max}\n"
    );
    assert!(out.contains(&count), "{out}");
    let mut a = CallStats::ZERO;
    a.calls = u64::MAX - 1;
    a.hist[3] = u64::MAX;
    let mut b = a;
    b.add(&a);
    assert_eq!((b.calls, b.hist[3]), (u64::MAX, u64::MAX));

    // Hostile slots: more in the slots than calls, and slots that would
    // wrap a cumulative sum. Buckets rise to +Inf, which is _count.
    for (calls, slots) in [
        (5u64, [u64::MAX; HIST_SLOTS]),
        (u64::MAX, [u64::MAX / 2 + 1; HIST_SLOTS]),
        (0, [7; HIST_SLOTS]),
        (100, [0; HIST_SLOTS]),
    ] {
        let mut st = CallStats::ZERO;
        st.calls = calls;
        st.hist = slots;
        let mut out = String::new();
        histogram(&mut out, "jobid=\"j\"", 0, &st);
        let values: Vec<u64> = out
            .lines()
            .filter(|l| l.contains("_bucket"))
            .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
            .collect();
        assert!(values.windows(2).all(|w| w[0] <= w[1]), "{out}");
        assert_eq!(*values.last().unwrap(), calls, "{out}");
        assert!(
            out.contains(&format!(
                "_count{{jobid=\"j\",function=\"{f0}\"}} {calls}\n"
            )),
            "{out}"
        );
    }
}

#[test]
fn exposition_per_rank_is_bounded_whatever_the_claims() {
    let huge = "x".repeat(131 * 1024);
    let small = Identity::new("1", "0", "2", 0, JobidSource::Environment);
    let big = Identity::new(&huge, &huge, &huge, 0, JobidSource::Environment);
    assert_eq!(big.truncated, vec![Label::Jobid, Label::Rank, Label::Size]);
    let size = |id: Identity| {
        let mut r = rank(1, id, 1);
        r.callsites[0].name = Arc::from(crate::attach::identity::cap_callsite(&huge));
        let snap = Snapshot {
            ranks: vec![r],
            health: Health::default(),
            ..Default::default()
        };
        render(&snap, &SelfMetrics::new(), RenderOptions::default(), || {
            Duration::ZERO
        })
        .len()
    };
    let (small, big) = (size(small), size(big));
    println!("exposition of one rank: {small} bytes with short claims, {big} with 131 kB ones");
    // Every label value is at most LABEL_CAP bytes, so a line grows by at
    // most a few caps.
    let lines = 60;
    assert!(big < small + lines * 4 * LABEL_CAP, "{small} -> {big}");
}

#[test]
fn truncations_and_conflicts_are_counted() {
    let m = SelfMetrics::new();
    let huge = "1".repeat(131 * 1024);
    let mut id = Identity::new(&huge, "0", "2", 0, JobidSource::Environment);
    id.environ_cut = true;
    m.count_identity(&id);
    assert_eq!(m.capped(Label::Version, &huge).len(), LABEL_CAP);
    m.identity_conflicts.inc();
    m.segment_error(SegmentProblem::Corrupt);
    let mut out = String::new();
    m.render(&mut out, Health::default(), Duration::ZERO);
    for want in [
        "mpi_observer_label_truncations_total{label=\"jobid\"} 1\n",
        "mpi_observer_label_truncations_total{label=\"version\"} 1\n",
        "mpi_observer_label_truncations_total{label=\"rank\"} 0\n",
        "mpi_observer_oversized_environments_total 1\n",
        "mpi_observer_identity_conflicts_total 1\n",
    ] {
        assert!(out.contains(want), "{want} in {out}");
    }
}

#[test]
fn histogram_is_cumulative_and_complete() {
    let mut st = CallStats::ZERO;
    st.hist[0] = 1; // < 2 ns
    st.hist[11] = 2; // [2048, 4096) ns -> le 4.096 us
    st.hist[31] = 3; // >= 2.1 s
    st.calls = 6;
    let mut out = String::new();
    histogram(&mut out, "jobid=\"j\"", 0, &st);
    assert!(out.contains("le=\"0.000001024\"} 1"), "{out}");
    assert!(out.contains("le=\"0.000004096\"} 3"), "{out}");
    assert!(out.contains("le=\"1.073741824\"} 3"), "{out}");
    assert!(out.contains("le=\"+Inf\"} 6"), "{out}");
}

/// Samples of `out` as (name, labels, value).
fn samples(out: &str) -> Vec<(String, String, f64)> {
    out.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, v) = l.rsplit_once(' ').unwrap();
            let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
            (
                name.to_string(),
                labels.trim_end_matches('}').to_string(),
                v.parse().unwrap(),
            )
        })
        .collect()
}

/// A running rank of job "w", its rank its pid, counted since `since`,
/// with `mpi_ns` in MPI calls.
pub(super) fn rank_at(pid: u32, since: SystemTime, mpi_ns: u64) -> RankSnapshot {
    let id = Identity::new("w", &pid.to_string(), "64", 0, JobidSource::Environment);
    let mut r = rank(pid, id, 1);
    (r.exited, r.counted_since, r.started, r.attached) = (None, since, since, since);
    let mut st = CallStats::ZERO;
    st.calls = 1;
    st.time_ns = mpi_ns;
    r.calls = Some([(0, st)].into());
    r
}

/// A job of `n` ranks on this node, rank i with figures i + 1, each
/// sending to the next world rank (rank n-1 to a rank elsewhere).
fn job_of(n: u32, segments: bool) -> Snapshot {
    let ranks = (0..n)
        .map(|i| {
            let id = Identity::new("big", &i.to_string(), "64", 0, JobidSource::Environment);
            let mut r = rank(100 + i, id, u64::from(i) + 1);
            r.exited = None;
            r.counted_since = UNIX_EPOCH;
            let seg = r.segment.as_mut().unwrap();
            let t = seg.figures.peers.remove(&1).unwrap();
            seg.figures.peers.insert(i + 1, t);
            if !segments {
                r.segment = None;
            }
            r
        })
        .collect();
    Snapshot {
        ranks,
        health: Health::default(),
        taken: UNIX_EPOCH + Duration::from_secs(100),
    }
}

#[test]
fn default_series_per_rank_are_a_small_constant() {
    let opts = RenderOptions {
        node: Some("n1"),
        ..Default::default()
    };
    // Info, up, MPI and wall seconds; the stats layer adds none per rank.
    for (segments, most) in [(false, 4), (true, 4)] {
        let count = |n| {
            let out = render(&job_of(n, segments), &SelfMetrics::new(), opts, || {
                Duration::ZERO
            });
            samples(&out)
                .iter()
                .filter(|(name, _, _)| !name.starts_with("mpi_observer_"))
                .count()
        };
        // Ranks beyond the detail ones add a constant each.
        // (Even sizes: the most loaded rank's call sites then have no
        // `other`.)
        let per_rank = (count(22) - count(12)) / 10;
        assert!(
            per_rank <= most,
            "{per_rank} series per rank (stats: {segments})"
        );
        assert_eq!(count(32) - count(22), 10 * per_rank);
        // No series past the detail ranks carries rank with function, peer,
        // callsite or le.
        let out = render(&job_of(20, segments), &SelfMetrics::new(), opts, || {
            Duration::ZERO
        });
        let s = samples(&out);
        let detail: HashSet<String> = s
            .iter()
            .filter(|(n, _, _)| n == "mpi_rank_detail")
            .map(|(_, l, _)| l.split(",reason=").next().unwrap().to_string())
            .collect();
        assert_eq!(detail.len(), 2);
        for (name, labels, _) in &s {
            if labels.contains("rank=\"")
                && ["function=", "peer=", "callsite=", "le="]
                    .iter()
                    .any(|k| labels.contains(k))
            {
                let rank: Vec<&str> = labels.split(',').take(3).collect();
                assert!(detail.contains(&rank.join(",")), "{name}{{{labels}}}");
            }
        }
    }
}

#[test]
fn job_series_sum_the_ranks_and_peers_go_node_to_node() {
    let snap = job_of(5, true);
    let opts = RenderOptions {
        node: Some("n\"1"),
        per_rank_detail: true,
        ..Default::default()
    };
    let out = render(&snap, &SelfMetrics::new(), opts, || Duration::ZERO);
    let s = samples(&out);
    let sum = |name: &str, with: &str| -> f64 {
        s.iter()
            .filter(|(n, l, _)| n == name && l.contains(with))
            .map(|(_, _, v)| v)
            .sum()
    };
    let f0 = format!("function=\"{}\"", FUNCTIONS[0].name);
    assert_eq!(sum("mpi_job_calls_total", &f0), sum("mpi_calls_total", &f0));
    assert_eq!(sum("mpi_job_calls_total", &f0), 15.0);
    let (job, ranks) = (
        sum("mpi_job_call_seconds_total", ""),
        sum("mpi_rank_mpi_seconds_total", ""),
    );
    assert!(
        (job - ranks).abs() <= 1e-12 * ranks.max(1.0),
        "{job} {ranks}"
    );
    // Ranks 1..4 are here, rank 5 is not: 1 + 2 + 3 + 4 messages sent on
    // this node, 5 to a remote one; the node's name escaped.
    assert!(out.contains("mpi_job_peer_messages_total{jobid=\"big\",uid=\"0\",node=\"n\\\"1\",peer_node=\"n\\\"1\",direction=\"send\"} 10\n"), "{out}");
    assert!(
        out.contains("peer_node=\"remote\",direction=\"send\"} 5\n"),
        "{out}"
    );
    assert!(
        out.contains("mpi_observer_node_info{node=\"n\\\"1\"} 1\n"),
        "{out}"
    );
    assert!(
        out.contains("mpi_job_requests_outstanding{jobid=\"big\",uid=\"0\"} 15\n"),
        "{out}"
    );
    // Fractions (i + 1) ns over 100 s: all in the lowest bucket.
    assert!(
        out.contains("mpi_job_rank_mpi_fraction_bucket{jobid=\"big\",uid=\"0\",le=\"0.05\"} 5\n"),
        "{out}"
    );
    assert!(
        out.contains("mpi_job_ranks{jobid=\"big\",uid=\"0\",state=\"running\"} 5\n"),
        "{out}"
    );
    assert!(
        out.contains("mpi_rank_wall_seconds_total{jobid=\"big\",uid=\"0\",rank=\"3\"} 100\n"),
        "{out}"
    );
}

#[test]
fn the_budget_drops_by_priority_and_counts() {
    let snap = job_of(10, true);
    let opts = RenderOptions {
        node: Some("n1"),
        max_series: 75,
        ..Default::default()
    };
    let selfm = SelfMetrics::new();
    let out = render(&snap, &selfm, opts, || Duration::ZERO);
    let s = samples(&out);
    let mpi = s
        .iter()
        .filter(|(n, _, _)| !n.starts_with("mpi_observer_"))
        .count();
    assert!(mpi <= 75, "{mpi}");
    // Every rank's minimal series first.
    assert_eq!(
        s.iter()
            .filter(|(n, _, _)| n == "mpi_rank_wall_seconds_total")
            .count(),
        10
    );
    assert!(
        out.contains("mpi_observer_series_dropped{path=\"/metrics\",metric=\"mpi_calls_total\"}"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "mpi_observer_exposition_series{{path=\"/metrics\"}} {mpi}\n"
        )),
        "{out}"
    );
    let dropped: f64 = s
        .iter()
        .filter(|(n, _, _)| n == "mpi_observer_series_dropped")
        .map(|(_, _, v)| v)
        .sum();
    assert!(
        out.contains(&format!(
            "mpi_observer_series_dropped_total{{path=\"/metrics\"}} {dropped}\n"
        )),
        "{out}"
    );
    // The same drops at the next scrape.
    let again = render(&snap, &selfm, opts, || Duration::ZERO);
    let strip = |o: &str| {
        o.lines()
            .filter(|l| !l.starts_with("mpi_observer"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(strip(&again), strip(&out));
    // A histogram is never cut: every _count has its +Inf bucket.
    let counts = again.matches("mpi_call_duration_seconds_count{").count();
    assert_eq!(
        again.matches("le=\"+Inf\"").count()
            - again
                .matches("mpi_job_rank_mpi_fraction_bucket{jobid=\"big\",uid=\"0\",le=\"+Inf\"")
                .count(),
        counts
    );
}

#[test]
fn ranks_path_has_the_named_jobs_in_full_and_no_self_metrics() {
    let mut snap = job_of(4, true);
    let other = Identity::new("small", "0", "1", 0, JobidSource::Environment);
    snap.ranks.push(rank(500, other, 3));
    let opts = RenderOptions::default();
    let selfm = SelfMetrics::new();
    let all = render_ranks(&snap, &selfm, opts, None, &Default::default());
    assert!(
        !all.contains("mpi_observer_") && !all.contains("mpi_job_"),
        "{all}"
    );
    assert_eq!(all.matches("mpi_rank_info{").count(), 5);
    assert!(
        all.contains("mpi_calls_total{jobid=\"big\",uid=\"0\",rank=\"3\""),
        "{all}"
    );
    let one = render_ranks(
        &snap,
        &selfm,
        opts,
        Some(&["small".to_string()]),
        &Default::default(),
    );
    assert_eq!(one.matches("mpi_rank_info{").count(), 1);
    assert!(
        one.contains("jobid=\"small\"") && !one.contains("jobid=\"big\""),
        "{one}"
    );
    // The same lines as /metrics --per-rank-detail has for those ranks.
    let detail = render(
        &snap,
        &selfm,
        RenderOptions {
            per_rank_detail: true,
            ..opts
        },
        || Duration::ZERO,
    );
    for l in all.lines().filter(|l| !l.starts_with('#')) {
        assert!(detail.contains(&format!("{l}\n")), "{l}");
    }
}

#[test]
fn peer_nodes_come_from_the_launchers_layout() {
    // Open MPI's uniform blocks of 2: ranks 0 and 1 here, 2 and 3 on the
    // layout's node `#1`; rank 0 sends to 1 and to 3.
    let env = [
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
    ];
    let layout = crate::attach::identity::layout::Layout::from_env(
        |k| env.iter().find(|(n, _)| *n == k).map(|(_, v)| *v),
        0,
        4,
        "n1",
    )
    .expect("a layout");
    let mut id = Identity::new("lay", "0", "4", 0, JobidSource::Environment);
    id.layout = Some(Arc::new(layout));
    let mut r = rank(2, id, 7);
    let seg = r.segment.as_mut().unwrap();
    let t = seg.figures.peers.remove(&1).unwrap();
    seg.figures.peers.insert(1, t);
    seg.figures.peers.insert(3, t);
    let snap = Snapshot {
        ranks: vec![r],
        health: Health::default(),
        taken: UNIX_EPOCH,
    };
    let opts = RenderOptions {
        node: Some("n1"),
        ..Default::default()
    };
    let out = render(&snap, &SelfMetrics::new(), opts, || Duration::ZERO);
    for want in [
        "mpi_job_peer_messages_total{jobid=\"lay\",uid=\"0\",node=\"n1\",peer_node=\"n1\",direction=\"send\"} 7\n",
        "mpi_job_peer_messages_total{jobid=\"lay\",uid=\"0\",node=\"n1\",peer_node=\"#1\",direction=\"send\"} 7\n",
    ] {
        assert!(out.contains(want), "{want} in {out}");
    }
    assert!(!out.contains("peer_node=\"remote\""), "{out}");
}

#[test]
fn the_extreme_ranks_are_values_of_job_gauges_lifetime_and_last_minute() {
    let opts = RenderOptions {
        node: Some("n1"),
        ..Default::default()
    };
    let t0 = UNIX_EPOCH + Duration::from_secs(1_000);
    // Rank i spends i % 7 tenths of its time in MPI over its lifetime; over
    // the last 30 s rank 5 drops to nothing and rank 2 spends it all.
    let at = |secs: u64, last: bool| Snapshot {
        ranks: (0..20u32)
            .map(|i| {
                let life = u64::from(i % 7) * secs * 100_000_000;
                let mpi = match (last, i) {
                    (true, 5) => u64::from(i % 7) * 100 * 100_000_000,
                    (true, 2) => u64::from(i % 7) * 100 * 100_000_000 + 30_000_000_000,
                    _ => life,
                };
                rank_at(100 + i, t0, mpi)
            })
            .collect(),
        health: Health::default(),
        taken: t0 + Duration::from_secs(secs),
    };
    let mut w = window::FractionWindow::default();
    let mut picker = DetailPicker::default();
    let mut out = String::new();
    for (secs, last) in [(100, false), (130, true)] {
        let snap = at(secs, last);
        let detail = picker.update(&snap, opts.detail_ranks);
        let recent = w.update(&snap);
        let carried = Carried {
            detail: &detail,
            recent: &recent,
            departed: &departed::DepartedJobs::default(),
            waits: &crate::collect::waits::Waits::default(),
        };
        out = render_metrics(&snap, &SelfMetrics::new(), opts, carried, || Duration::ZERO);
    }
    let one = |name: &str| -> f64 {
        let s: Vec<_> = samples(&out)
            .into_iter()
            .filter(|(n, _, _)| n == name)
            .collect();
        assert_eq!(s.len(), 1, "{name}: {s:?}");
        assert_eq!(s[0].1, "jobid=\"w\",uid=\"0\"");
        s[0].2
    };
    // Lifetime: the first rank seen with the highest (6) and lowest (0).
    assert_eq!(one("mpi_job_rank_mpi_fraction_max_rank"), 106.0);
    assert_eq!(one("mpi_job_rank_mpi_fraction_min_rank"), 100.0);
    // Last 30 s: rank 2 all in MPI, rank 5 none (ranks 0, 7 and 14 are
    // at 0 too: the first seen wins).
    assert_eq!(one("mpi_job_rank_mpi_fraction_1m_max"), 1.0);
    assert_eq!(one("mpi_job_rank_mpi_fraction_1m_max_rank"), 102.0);
    assert_eq!(one("mpi_job_rank_mpi_fraction_1m_min"), 0.0);
    assert_eq!(one("mpi_job_rank_mpi_fraction_1m_min_rank"), 100.0);
    // Without history (a stateless render) the last-minute gauges are
    // absent, not zero.
    let once = render(&at(100, false), &SelfMetrics::new(), opts, || {
        Duration::ZERO
    });
    assert!(!once.contains("\nmpi_job_rank_mpi_fraction_1m_max{"));
}

#[test]
fn a_forgotten_ranks_figures_stay_in_its_jobs_counters() {
    let opts = RenderOptions {
        node: Some("n1"),
        ..Default::default()
    };
    // Four ranks, each sending to the next world rank: rank 2 to rank 3,
    // which is on this node, rank 3 to rank 4, which is not.
    let all = job_of(4, true);
    let counters = |out: &str| -> Vec<(String, String, f64)> {
        samples(out)
            .into_iter()
            .filter(|(n, l, _)| {
                !l.contains("rank=\"")
                    && (n.starts_with("mpi_job_") && n.ends_with("_total")
                        || n.starts_with("mpi_call_duration_seconds"))
            })
            .collect()
    };
    let before = counters(&render(&all, &SelfMetrics::new(), opts, || Duration::ZERO));
    assert!(
        before
            .iter()
            .any(|(n, _, _)| n == "mpi_job_peer_bytes_total")
    );
    // Rank 3 exited and is forgotten: its final figures are folded in.
    let mut departed = departed::DepartedJobs::default();
    let (held, gone) = (&all.ranks[..3], &all.ranks[3]);
    departed.fold(
        gone,
        |p| all.ranks.iter().any(|r| r.identity.rank == p),
        "n1",
    );
    let after_snap = Snapshot {
        ranks: held.to_vec(),
        ..all.clone()
    };
    let detail = DetailPicker::default().update(&after_snap, opts.detail_ranks);
    let carried = Carried {
        detail: &detail,
        recent: &Recent::new(),
        departed: &departed,
        waits: &crate::collect::waits::Waits::default(),
    };
    let after = counters(&render_metrics(
        &after_snap,
        &SelfMetrics::new(),
        opts,
        carried,
        || Duration::ZERO,
    ));
    assert_eq!(
        after, before,
        "no job counter falls when a rank is forgotten"
    );
    // Without the fold they would: the test can fail.
    let dropped = counters(&render(&after_snap, &SelfMetrics::new(), opts, || {
        Duration::ZERO
    }));
    assert_ne!(dropped, before);
    // Once no rank of the job is held, its departed ranks go too.
    departed.retain(|_| false);
    assert!(departed.iter().next().is_none());
}

/// The sample lines of `name` in `out`.
fn lines_of<'a>(out: &'a str, name: &str) -> Vec<&'a str> {
    out.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with('{')))
        .collect()
}

#[test]
fn one_scheduler_info_series_per_job_from_its_lowest_running_rank() {
    use crate::attach::identity::scheduler::{Facts, Scheduler};
    let slurm = |step: &str, task: &str| {
        Some(Arc::new(Facts {
            step: step.into(),
            user: "alice".into(),
            account: "physics".into(),
            partition: "debug".into(),
            array_job: "4".into(),
            array_task: task.into(),
            ..Facts::bare(Scheduler::Slurm)
        }))
    };
    let with = |pid, r: &str, facts: Option<Arc<Facts>>| {
        let mut id = Identity::new("42", r, "4", 1000, JobidSource::Environment);
        id.scheduler = facts;
        rank(pid, id, 10)
    };
    // Even pids have exited (see `rank`): exited rank 0 (pid 2) of an
    // earlier step, then running ranks 3, 1 and 2 (pids 3, 5, 7), rank 1
    // the lowest running one; and a launcher's job with no scheduler.
    let ranks = vec![
        with(2, "0", slurm("0", "1")),
        with(3, "3", slurm("2", "9")),
        with(5, "1", slurm("1", "1")),
        with(7, "2", slurm("1", "1")),
        rank(
            9,
            Identity::new("launcher-77", "0", "1", 1000, JobidSource::Launcher),
            5,
        ),
    ];
    let snap = Snapshot {
        ranks,
        ..Default::default()
    };
    let out = render(
        &snap,
        &SelfMetrics::new(),
        RenderOptions {
            node: Some("n1"),
            ..Default::default()
        },
        || Duration::ZERO,
    );
    assert_eq!(
        lines_of(&out, "mpi_job_scheduler_info"),
        [
            "mpi_job_scheduler_info{jobid=\"42\",uid=\"1000\",scheduler=\"slurm\",step=\"1\",user=\"alice\",account=\"physics\",partition=\"debug\",array_job=\"4\",array_task=\"1\"} 1"
        ],
        "{out}"
    );
    assert!(out.contains("# TYPE mpi_job_scheduler_info gauge\n"));
    // The join key: the info series' (jobid, uid) is the job series'.
    assert!(
        lines_of(&out, "mpi_job_calls_total")
            .iter()
            .any(|l| l.starts_with("mpi_job_calls_total{jobid=\"42\",uid=\"1000\",function="))
    );
    // Once every rank has exited, the lowest exited one speaks.
    let mut exited = snap.clone();
    for r in &mut exited.ranks {
        r.exited = Some(UNIX_EPOCH);
    }
    let out = render(
        &exited,
        &SelfMetrics::new(),
        RenderOptions::default(),
        || Duration::ZERO,
    );
    let info = lines_of(&out, "mpi_job_scheduler_info");
    assert_eq!(info.len(), 1, "{out}");
    assert!(info[0].contains(",step=\"0\","), "{out}");
    // No job with a scheduler: not even the header.
    let none = Snapshot {
        ranks: vec![snap.ranks[4].clone()],
        ..Default::default()
    };
    let out = render(&none, &SelfMetrics::new(), RenderOptions::default(), || {
        Duration::ZERO
    });
    assert!(lines_of(&out, "mpi_job_scheduler_info").is_empty(), "{out}");
    assert!(!out.contains("# TYPE mpi_job_scheduler_info"), "{out}");
}

#[test]
fn hostile_scheduler_facts_stay_inside_their_label() {
    use crate::attach::identity::scheduler::{Facts, Scheduler};
    let env: &[(&str, &[u8])] = &[
        ("SLURM_JOB_USER", b"x\"} 1\nmpi_forged{a=\"b"),
        ("SLURM_JOB_ACCOUNT", b"back\\slash\"quote"),
        ("SLURM_JOB_PARTITION", b"\x1b]0;title\x07"),
        ("SLURM_STEP_ID", &[b'7'; 1000]),
    ];
    let (facts, cut) = Facts::read(Scheduler::Slurm, |n| {
        env.iter().find(|(k, _)| *k == n).map(|(_, v)| *v)
    });
    assert!(cut);
    let mut id = Identity::new("j", "0", "1", 0, JobidSource::Environment);
    id.scheduler = Some(Arc::new(facts));
    let snap = Snapshot {
        ranks: vec![rank(1, id, 3)],
        ..Default::default()
    };
    let out = render(&snap, &SelfMetrics::new(), RenderOptions::default(), || {
        Duration::ZERO
    });
    let info = lines_of(&out, "mpi_job_scheduler_info");
    assert_eq!(info.len(), 1, "{out}");
    assert!(!out.contains("\nmpi_forged"), "{out}");
    let l = info[0];
    assert!(
        l.contains(",user=\"x\\\"} 1\u{FFFD}mpi_forged{a=\\\"b\","),
        "{l}"
    );
    assert!(l.contains(",account=\"back\\\\slash\\\"quote\","), "{l}");
    assert!(
        l.contains(",partition=\"\u{FFFD}]0;title\u{FFFD}\","),
        "{l}"
    );
    assert!(
        l.contains(&format!(",step=\"{}\",", "7".repeat(LABEL_CAP))),
        "{l}"
    );
    assert!(!l.chars().any(char::is_control), "{l:?}");
}

#[test]
fn scheduler_conflicts_are_counted_by_reason() {
    let m = SelfMetrics::new();
    let mut out = String::new();
    m.render(&mut out, Health::default(), Duration::ZERO);
    for reason in ["ranks", "cgroup"] {
        assert!(
            out.contains(&format!(
                "mpi_observer_scheduler_conflicts_total{{reason=\"{reason}\"}} 0\n"
            )),
            "{out}"
        );
    }
    let mut id = Identity::new("j", "0", "1", 0, JobidSource::Cgroup);
    id.scheduler_disowned = true;
    m.count_identity(&id);
    m.scheduler_conflict();
    m.scheduler_conflict();
    let mut out = String::new();
    m.render(&mut out, Health::default(), Duration::ZERO);
    assert!(out.contains("mpi_observer_scheduler_conflicts_total{reason=\"cgroup\"} 1\n"));
    assert!(out.contains("mpi_observer_scheduler_conflicts_total{reason=\"ranks\"} 2\n"));
}
