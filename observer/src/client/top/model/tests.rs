//! Tests of the model: frames from readings, rates, rows and the wait states.
use std::time::Duration;

use super::*;
use crate::{client::top::source::parse_exposition, export::names::METRICS};

/// An observer's exposition: job "j" with ranks 0..2 on one node.
fn scrape(calls0: u64, secs0: f64, calls2: u64, secs2: f64) -> String {
    format!(
        "mpi_rank_info{{jobid=\"j\",rank=\"0\",pid=\"100\",size=\"3\",library=\"openmpi\",version=\"4.1.4\"}} 1\n\
         mpi_rank_info{{jobid=\"j\",rank=\"2\",pid=\"102\",size=\"3\",library=\"openmpi\",version=\"4.1.4\"}} 1\n\
         mpi_rank_info{{jobid=\"j\",rank=\"10\",pid=\"110\",size=\"3\",library=\"openmpi\",version=\"4.1.4\"}} 1\n\
         mpi_rank_up{{jobid=\"j\",rank=\"0\"}} 1\n\
         mpi_rank_up{{jobid=\"j\",rank=\"2\"}} 1\n\
         mpi_rank_up{{jobid=\"j\",rank=\"10\"}} 0\n\
         mpi_calls_total{{jobid=\"j\",rank=\"0\",function=\"MPI_Barrier\"}} {calls0}\n\
         mpi_call_seconds_total{{jobid=\"j\",rank=\"0\",function=\"MPI_Barrier\"}} {secs0}\n\
         mpi_calls_total{{jobid=\"j\",rank=\"0\",function=\"MPI_Send\"}} {calls0}\n\
         mpi_call_seconds_total{{jobid=\"j\",rank=\"0\",function=\"MPI_Send\"}} 0.001\n\
         mpi_bytes_total{{jobid=\"j\",rank=\"0\",function=\"MPI_Send\",direction=\"send\"}} {}\n\
         mpi_calls_total{{jobid=\"j\",rank=\"2\",function=\"MPI_Barrier\"}} {calls2}\n\
         mpi_call_seconds_total{{jobid=\"j\",rank=\"2\",function=\"MPI_Barrier\"}} {secs2}\n\
         mpi_layer_bytes_total{{jobid=\"j\",rank=\"2\",function=\"MPI_Send\",direction=\"send\"}} 4096\n\
         mpi_peer_bytes_total{{jobid=\"j\",rank=\"2\",peer=\"0\",direction=\"send\"}} 4096\n\
         mpi_peer_bytes_total{{jobid=\"j\",rank=\"2\",peer=\"0\",direction=\"recv\"}} 999\n\
         mpi_requests_outstanding{{jobid=\"j\",rank=\"2\"}} 3\n\
         mpi_request_oldest_age_seconds{{jobid=\"j\",rank=\"2\"}} 1.5\n\
         mpi_calls_total{{jobid=\"other\",rank=\"0\",function=\"MPI_Recv\"}} 5\n\
         mpi_call_seconds_total{{jobid=\"other\",rank=\"0\",function=\"MPI_Recv\"}} 0.5\n\
         mpi_observer_probes 12\n",
        calls0 * 1024
    )
}

fn reading(at: Instant, text: &str) -> Reading {
    let samples = parse_exposition(text)
        .into_iter()
        .filter(|s| METRICS.contains(&s.name.as_str()))
        .map(|mut s| {
            s.labels.push(("instance".into(), "n1:9479".into()));
            s
        })
        .collect();
    Reading {
        at,
        samples,
        rates: None,
    }
}

/// Two readings 2 s apart: rank 0 spent 1.6 s of them in MPI_Barrier
/// (80 %), rank 2 0.4 s (20 %).
fn two_frames() -> Frame {
    let t0 = Instant::now();
    let f0 = Frame::new(&reading(t0, &scrape(100, 1.0, 100, 1.0)), None);
    assert!(!f0.rated);
    let t1 = t0 + Duration::from_secs(2);
    Frame::new(&reading(t1, &scrape(300, 2.6, 300, 1.4)), Some(&f0))
}

/// Through Prometheus a rank that is not a detail rank has no
/// per-function series: its MPI % comes from its MPI seconds.
#[test]
fn a_rank_without_function_series_shows_its_mpi_seconds() {
    let text = "mpi_rank_info{jobid=\"j\",rank=\"5\",pid=\"105\",size=\"8\",library=\"openmpi\",version=\"4.1.4\"} 1\n\
                mpi_rank_up{jobid=\"j\",rank=\"5\"} 1\n\
                mpi_rank_mpi_seconds_total{jobid=\"j\",rank=\"5\"} 12\n";
    let mut r = reading(Instant::now(), text);
    let label = |k: &str, v: &str| (k.to_string(), v.to_string());
    r.rates = Some(vec![Sample {
        name: RANK_MPI_SECONDS.into(),
        labels: vec![
            label("jobid", "j"),
            label("rank", "5"),
            label("instance", "n1:9479"),
        ],
        value: 0.25,
    }]);
    let f = Frame::new(&r, None);
    let r5 = &f.ranks[&RankKey::new("j", "5")];
    assert!(r5.functions.is_empty());
    assert_eq!(r5.mpi_seconds.total, 12.0);
    assert_eq!(r5.mpi_fraction(), 0.25);
}

#[test]
fn rates_from_successive_readings() {
    let f = two_frames();
    assert!(f.rated);
    let r0 = &f.ranks[&RankKey::new("j", "0")];
    assert_eq!(r0.functions["MPI_Barrier"].calls.rate, 100.0);
    assert!((r0.mpi_fraction() - 0.8).abs() < 1e-9);
    assert_eq!(r0.functions["MPI_Send"].bytes.rate, 200.0 * 1024.0 / 2.0);
    assert_eq!((r0.pid.as_str(), r0.node.as_str()), ("100", "n1:9479"));
    // Rank 2 has no probe bytes: the layer's stand in.
    let r2 = &f.ranks[&RankKey::new("j", "2")];
    assert_eq!(r2.functions["MPI_Send"].bytes.total, 4096.0);
    assert_eq!(r2.requests, Some((3.0, 1.5)));
}

/// The bounded exposition's wait states of job "j" on the node:
/// `barrier` and `sender` seconds so far, rank `culprit` the one waited
/// for (none: nobody waited in the last minute).
fn waits(barrier: f64, sender: f64, culprit: Option<&str>) -> String {
    let mut t = format!(
        "mpi_job_wait_seconds_total{{jobid=\"j\",uid=\"0\",pattern=\"wait_barrier\"}} {barrier}\n\
         mpi_job_wait_seconds_total{{jobid=\"j\",uid=\"0\",pattern=\"late_sender\"}} {sender}\n\
         mpi_job_wait_seconds_total{{jobid=\"j\",uid=\"0\",pattern=\"late_receiver\"}} 0\n"
    );
    if let Some(c) = culprit {
        t.push_str(&format!(
            "mpi_job_wait_culprit_rank{{jobid=\"j\",uid=\"0\",k=\"1\"}} {c}\n\
             mpi_job_wait_culprit_fraction_1m{{jobid=\"j\",uid=\"0\",k=\"1\"}} 0.5\n\
             mpi_job_wait_culprit_rank{{jobid=\"j\",uid=\"0\",k=\"2\"}} 0\n\
             mpi_job_wait_culprit_fraction_1m{{jobid=\"j\",uid=\"0\",k=\"2\"}} 0.1\n"
        ));
    }
    t
}

#[test]
fn waiting_is_a_share_of_the_running_ranks_time_with_its_culprit() {
    let t0 = Instant::now();
    let text = |b, s, c| scrape(100, 1.0, 100, 1.0) + &waits(b, s, c);
    let f0 = Frame::new(&reading(t0, &text(1.0, 0.0, Some("2"))), None);
    // No rates yet; a job without the stats layer has no waiting.
    assert_eq!(waiting(&f0, "j"), None);
    let t1 = t0 + Duration::from_secs(2);
    let f1 = Frame::new(&reading(t1, &text(2.6, 0.4, Some("2"))), Some(&f0));
    assert_eq!(waiting(&f1, "other"), None);
    // 1.6 + 0.4 s in 2 s over the 2 running ranks (rank 10 exited).
    let w = waiting(&f1, "j").unwrap();
    assert!((w.share - 0.5).abs() < 1e-9, "{w:?}");
    let names: Vec<&str> = w.patterns.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["Wait at Barrier", "Late Sender"]);
    assert!((w.patterns[0].1 - 0.4).abs() < 1e-9);
    assert_eq!(w.culprit, Some(("2".to_string(), 0.5)));
    // Nobody waited in the last minute: no culprit, and a value that is
    // no rank names none.
    let f2 = Frame::new(
        &reading(t1 + Duration::from_secs(1), &text(2.6, 0.4, None)),
        Some(&f1),
    );
    let w = waiting(&f2, "j").unwrap();
    assert_eq!((w.share, w.patterns.len(), w.culprit), (0.0, 0, None));
    let f3 = Frame::new(
        &reading(t1 + Duration::from_secs(2), &text(2.6, 0.4, Some("1.5"))),
        Some(&f2),
    );
    assert_eq!(waiting(&f3, "j").unwrap().culprit, None);
}

#[test]
fn a_reset_counter_counts_from_zero() {
    let t0 = Instant::now();
    let f0 = Frame::new(&reading(t0, &scrape(1000, 10.0, 1, 1.0)), None);
    let f1 = Frame::new(
        &reading(t0 + Duration::from_secs(1), &scrape(10, 0.5, 1, 1.0)),
        Some(&f0),
    );
    let r0 = &f1.ranks[&RankKey::new("j", "0")];
    assert_eq!(r0.functions["MPI_Barrier"].calls.rate, 10.0);
}

#[test]
fn jobs_rows() {
    let f = two_frames();
    let rows = jobs(&f, "", 0);
    assert_eq!(rows.len(), 2);
    let j = &rows[0];
    assert_eq!(j.jobid, "j", "sorted by MPI %: j is busier");
    assert_eq!((j.ranks, j.running, j.nodes), (3, 2, 1));
    assert!(
        (j.mpi - 0.5).abs() < 1e-9,
        "mean of 0.8 and 0.2, the exited rank left out"
    );
    assert_eq!(j.busiest.as_deref(), Some("MPI_Barrier"));
    assert_eq!(j.calls_rate, 300.0);
    // "other" made no call in the interval: its busiest is by total.
    assert_eq!(rows[1].busiest.as_deref(), Some("MPI_Recv"));
    assert_eq!(jobs(&f, "OTH", 0).len(), 1, "the filter ignores case");
    assert_eq!(jobs(&f, "", 4)[0].jobid, "j", "by job id");
    assert_eq!(jobs(&f, "", 3)[0].jobid, "j", "by ranks");
}

#[test]
fn ranks_rows_sorting_filter_and_imbalance() {
    let f = two_frames();
    let rows = ranks(&f, "j", "", 0);
    let order: Vec<&str> = rows.iter().map(|r| r.key.rank.as_str()).collect();
    assert_eq!(order, ["0", "2", "10"], "numeric rank order");
    assert!(!rows[2].up);
    assert_eq!(rows[0].busiest.as_deref(), Some("MPI_Barrier"));
    let by_out = ranks(&f, "j", "", 4);
    assert_eq!(
        by_out[0].key.rank, "2",
        "the rank with outstanding requests first"
    );
    assert_eq!(ranks(&f, "j", "102", 0).len(), 1, "filter by pid");
    let im = imbalance(&f, "j").unwrap();
    assert_eq!((im.max.1.as_str(), im.min.1.as_str()), ("0", "2"));
    assert!((im.spread() - 0.6).abs() < 1e-9);
    assert!(im.spread() > SPREAD_ALERT);
    assert_eq!(imbalance(&f, "other"), None, "one rank: no imbalance");
}

#[test]
fn function_rows() {
    let f = two_frames();
    let rows = functions(&f, &RankKey::new("j", "0"), "", 0);
    assert_eq!(rows[0].name, "MPI_Barrier");
    assert_eq!(rows[0].calls, 300.0);
    assert!(
        (rows[0].share - 1.0).abs() < 1e-9,
        "MPI_Send took no time lately"
    );
    let lat = rows[0].mean_latency.unwrap();
    assert!((lat - 1.6 / 200.0).abs() < 1e-12, "{lat}");
    assert_eq!(rows[1].mean_latency, Some(0.0));
    let by_bytes = functions(&f, &RankKey::new("j", "0"), "", 3);
    assert_eq!(by_bytes[0].name, "MPI_Send");
    assert_eq!(functions(&f, &RankKey::new("j", "0"), "barr", 0).len(), 1);
    assert!(functions(&f, &RankKey::new("j", "99"), "", 0).is_empty());
}

#[test]
fn the_matrix() {
    let f = two_frames();
    let m = matrix(&f, "j").unwrap();
    assert_eq!(m.ranks, ["0", "2"]);
    assert_eq!(m.cells.len(), 1, "only sends: {m:?}");
    assert_eq!(m.cells[&(1, 0)].total, 4096.0);
    assert_eq!(matrix(&f, "other"), None, "no stats layer");
}

#[test]
fn prometheus_rates_and_nodes() {
    let mk = |name: &str, rank: &str, inst: &str, labels: &[(&str, &str)], v: f64| Sample {
        name: name.into(),
        labels: [("jobid", "p"), ("rank", rank), ("instance", inst)]
            .iter()
            .chain(labels)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        value: v,
    };
    let fun = [("function", "MPI_Allreduce")];
    let samples = vec![
        mk(CALLS, "0", "a:1", &fun, 10.0),
        mk(SECONDS, "0", "a:1", &fun, 5.0),
        mk(RANK_INFO, "0", "a:1", &[("pid", "1")], 1.0),
        mk(RANK_INFO, "1", "b:1", &[("pid", "2")], 1.0),
        mk(CALLS, "1", "b:1", &fun, 10.0),
        mk(SECONDS, "1", "b:1", &fun, 1.0),
        // The same rank seen by a second observer is not counted twice.
        mk(CALLS, "1", "c:1", &fun, 10.0),
    ];
    let rates = vec![
        mk(SECONDS, "0", "a:1", &fun, 0.9),
        mk(SECONDS, "1", "b:1", &fun, 0.3),
        mk(CALLS, "1", "b:1", &fun, 7.0),
        mk(CALLS, "1", "c:1", &fun, 7.0),
    ];
    let f = Frame::new(
        &Reading {
            at: Instant::now(),
            samples,
            rates: Some(rates),
        },
        None,
    );
    assert!(f.rated);
    let j = &jobs(&f, "", 0)[0];
    assert_eq!((j.ranks, j.nodes, j.calls_rate), (2, 2, 7.0));
    assert!((j.mpi - 0.6).abs() < 1e-9);
    assert_eq!(
        f.ranks[&RankKey::new("p", "1")].functions["MPI_Allreduce"]
            .calls
            .total,
        10.0
    );
}
