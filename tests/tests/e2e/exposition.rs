//! End-to-end tests of the bounded exposition (issue 22): a real 4-rank
//! Open MPI job (tests/programs/mix.c) observed by a real daemon with its
//! default flags, scraped over real HTTP.
//!
//! - The default `/metrics` keeps the series formula (docs/cardinality.md):
//!   no series combines `rank` with `function`, `peer`, `callsite` or `le`
//!   unless its rank is a detail rank, each other rank costs at most 4
//!   series; the job-level sums equal the per-rank figures of
//!   `/metrics/ranks`; the detail ranks are two and stay put.
//! - A budget of a few series (`--max-series 30`) drops the rest, counts
//!   them by family, and leaves the job unharmed.
//! - Under the shim's `stats` layer, peer traffic is node × node: the
//!   job's four ranks on this node talk to this node, named as
//!   `mpi_observer_node_info` names it, and a rank still costs at most 4.
//! - Two runs under one job id (two steps of one Slurm job): when the first
//!   run's exited ranks are forgotten, no job counter falls.

use std::{collections::BTreeSet, path::Path, time::Duration};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, assert_no_probes_left, compile, http_get_within, parse_metrics,
    program, promtool_check, require, scratch, shim, shim_launcher, signal, sum, url_encode,
    wait_for,
};

const NP: u32 = 4;
const ITERS: u64 = 200;
const LIMIT: Duration = Duration::from_secs(10);

/// tests/programs/mix.c on [`NP`] ranks, held at its go file; with the
/// shim and its `stats` layer in every rank if `stats`.
fn start_mix(dir: &Path, stats: bool) -> Job {
    start_mix_as(dir, stats, None, "go")
}

/// [`start_mix`] with `SLURM_JOB_ID` set to `jobid` (when given), held at
/// the go file named `go`.
fn start_mix_as(dir: &Path, stats: bool, jobid: Option<&str>, go: &str) -> Job {
    let mpi = Mpi::OpenMpi;
    let exe = dir.join("mix-openmpi");
    if !exe.exists() {
        compile(mpi, &program("mix.c"), &exe, &[]);
    }
    let mut launcher = if stats {
        shim_launcher(mpi, NP, "stats")
    } else {
        mpi.launcher(NP)
    };
    if let Some(id) = jobid {
        launcher.env("SLURM_JOB_ID", id);
    }
    launcher.arg(&exe).arg(ITERS.to_string());
    Job::spawn(
        launcher,
        NP,
        dir.join(format!("{go}-{}", std::process::id())),
    )
}

fn get(d: &Daemon, path: &str) -> (u16, String) {
    http_get_within(&d.addr, path, LIMIT).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// What every test here needs: root for BPF, Open MPI, bpftool (no
/// probe left) and promtool (every exposition checked).
fn required() -> bool {
    require(&[
        Need::Root,
        Need::Mpi(Mpi::OpenMpi),
        Need::Command("bpftool"),
        Need::Command("promtool"),
    ])
}

/// The first scrape (body and samples) in which every one of the job's
/// [`NP`] ranks is seen exited.
fn all_exited(daemon: &mut Daemon, jobid: &str) -> (String, Vec<Sample>) {
    wait_for("the exits to be noticed", LIMIT, || {
        let (b, s) = daemon.scrape();
        (sum(&s, "mpi_rank_up", &[("jobid", jobid)]) == 0.0
            && sum(
                &s,
                "mpi_job_ranks",
                &[("jobid", jobid), ("state", "exited")],
            ) == f64::from(NP))
        .then_some((b, s))
    })
}

/// The job id the ranks' `mpi_rank_info` gives.
fn jobid(s: &[Sample], job: &Job) -> String {
    let pid = job.ranks[0].1.to_string();
    s.iter()
        .find(|x| x.name == "mpi_rank_info" && x.label("pid") == Some(&pid))
        .and_then(|x| x.label("jobid"))
        .expect("rank info of rank 0")
        .to_string()
}

/// The detail ranks (`mpi_rank_detail`) of the job, by rank label.
fn detail(s: &[Sample], jobid: &str) -> BTreeSet<String> {
    s.iter()
        .filter(|x| x.name == "mpi_rank_detail" && x.label("jobid") == Some(jobid))
        .map(|x| x.label("rank").unwrap().to_string())
        .collect()
}

/// The series formula on one scrape of the default /metrics: at most
/// `most` series per rank beyond the detail ranks.
fn assert_formula(s: &[Sample], jobid: &str, most: usize) {
    let detail = detail(s, jobid);
    let mut per_rank = std::collections::BTreeMap::<String, usize>::new();
    for x in s.iter().filter(|x| x.label("jobid") == Some(jobid)) {
        let Some(rank) = x.label("rank") else {
            continue;
        };
        let wide = ["function", "peer", "callsite", "le"]
            .iter()
            .any(|k| x.label(k).is_some());
        assert!(
            !wide || detail.contains(rank),
            "{} {:?}: rank {rank} with a wide label, and no detail rank",
            x.name,
            x.labels
        );
        *per_rank.entry(rank.to_string()).or_default() += 1;
    }
    assert_eq!(per_rank.len(), NP as usize, "every rank has series");
    for (rank, n) in per_rank.iter().filter(|(r, _)| !detail.contains(*r)) {
        assert!(*n <= most, "rank {rank}: {n} series, at most {most}");
    }
}

#[test]
fn default_exposition_is_bounded_and_sums_the_ranks() {
    if !required() {
        return;
    }
    let dir = scratch("exposition-default");
    let job = start_mix(&dir, false);
    let mut args = job.pid_args();
    args.extend(["--detail-ranks".into(), "2".into()]);
    let mut daemon = Daemon::start_bounded(&args);
    let (_, s) = daemon.scrape();
    let jobid = jobid(&s, &job);
    let ranks: Vec<u32> = job.ranks.iter().map(|r| r.0).collect();
    // Chosen at the first scrape, kept while the ranks run.
    let chosen = detail(&s, &jobid);
    assert_eq!(chosen.len(), 2, "two detail ranks: {chosen:?}");
    for _ in 0..3 {
        let (_, s) = daemon.scrape();
        assert_eq!(detail(&s, &jobid), chosen, "the detail ranks stay");
        assert_formula(&s, &jobid, 4);
    }
    job.go();
    job.finish("OK ");
    let (body, s) = all_exited(&mut daemon, &jobid);
    promtool_check(&body);
    assert_formula(&s, &jobid, 4);
    // The node's busiest and idlest ranks are values of job gauges: the
    // ranks the ranks' own MPI and wall seconds make the extremes.
    let of = |name: &str| -> std::collections::BTreeMap<String, f64> {
        s.iter()
            .filter(|x| x.name == name && x.label("jobid") == Some(&jobid))
            .map(|x| (x.label("rank").unwrap().to_string(), x.value))
            .collect()
    };
    let (mpi, wall) = (
        of("mpi_rank_mpi_seconds_total"),
        of("mpi_rank_wall_seconds_total"),
    );
    let fractions: Vec<(f64, String)> = mpi.iter().map(|(r, m)| (m / wall[r], r.clone())).collect();
    let hi = fractions.iter().max_by(|a, b| a.0.total_cmp(&b.0)).unwrap();
    let lo = fractions.iter().min_by(|a, b| a.0.total_cmp(&b.0)).unwrap();
    assert!(hi.0 > lo.0, "the ranks differ: {fractions:?}");
    let gauge = |name: &str| sum(&s, name, &[("jobid", &jobid)]);
    assert_eq!(
        gauge("mpi_job_rank_mpi_fraction_max_rank").to_string(),
        hi.1
    );
    assert_eq!(
        gauge("mpi_job_rank_mpi_fraction_min_rank").to_string(),
        lo.1
    );
    assert!((gauge("mpi_job_rank_mpi_fraction_max") - hi.0).abs() < 1e-6);
    assert!((gauge("mpi_job_rank_mpi_fraction_min") - lo.0).abs() < 1e-6);
    let after = detail(&s, &jobid);
    assert_eq!(after.len(), 2, "still two detail ranks: {after:?}");
    let (_, again) = daemon.scrape();
    assert_eq!(detail(&again, &jobid), after, "the detail ranks stay");
    let mpi_series = s
        .iter()
        .filter(|x| !x.name.starts_with("mpi_observer_"))
        .count();
    assert!(
        sum(
            &s,
            "mpi_observer_exposition_series",
            &[("path", "/metrics")]
        ) >= mpi_series as f64,
        "the exposition's series are counted"
    );
    assert_eq!(
        sum(
            &s,
            "mpi_observer_series_dropped_total",
            &[("path", "/metrics")]
        ),
        0.0,
        "nothing dropped at the default budget"
    );

    // Every rank in full, for this job only.
    let (code, ranks_body) = get(
        &daemon,
        &format!("/metrics/ranks?jobid={}", url_encode(&jobid)),
    );
    assert_eq!(code, 200, "{ranks_body}");
    promtool_check(&ranks_body);
    let r = parse_metrics(&ranks_body);
    assert!(
        r.iter().all(|x| !x.name.starts_with("mpi_observer_")),
        "no self-metrics"
    );
    assert!(
        r.iter().all(|x| x.label("jobid") == Some(jobid.as_str())),
        "this job only"
    );
    assert_eq!(
        r.iter().filter(|x| x.name == "mpi_rank_info").count(),
        NP as usize
    );
    // The job-level series are the sums of the ranks' figures.
    let functions: BTreeSet<&str> = r
        .iter()
        .filter(|x| x.name == "mpi_calls_total")
        .filter_map(|x| x.label("function"))
        .collect();
    assert!(functions.contains("MPI_Allreduce"), "{functions:?}");
    for f in &functions {
        let ranks = sum(&r, "mpi_calls_total", &[("jobid", &jobid), ("function", f)]);
        let job_level = sum(
            &s,
            "mpi_job_calls_total",
            &[("jobid", &jobid), ("function", f)],
        );
        assert_eq!(
            job_level, ranks,
            "{f}: mpi_job_calls_total = the ranks' sum"
        );
    }
    assert_eq!(
        sum(
            &s,
            "mpi_job_calls_total",
            &[("jobid", &jobid), ("function", "MPI_Allreduce")]
        ),
        (ITERS * u64::from(NP)) as f64
    );
    for rank in &ranks {
        let rank = rank.to_string();
        let want = sum(
            &r,
            "mpi_call_seconds_total",
            &[("jobid", &jobid), ("rank", &rank)],
        );
        let have = sum(
            &s,
            "mpi_rank_mpi_seconds_total",
            &[("jobid", &jobid), ("rank", &rank)],
        );
        assert!(want > 0.0, "rank {rank} spent time in MPI");
        assert!(
            (have - want).abs() <= 1e-9 * want.max(1.0),
            "rank {rank}: mpi_rank_mpi_seconds_total {have} = its call seconds {want}"
        );
        let wall = sum(
            &s,
            "mpi_rank_wall_seconds_total",
            &[("jobid", &jobid), ("rank", &rank)],
        );
        assert!(wall >= have, "rank {rank}: wall {wall} >= MPI {have}");
    }
    // Another job's name gives nothing; a bad query one clear line.
    let (code, none) = get(&daemon, "/metrics/ranks?jobid=no-such-job");
    assert_eq!(code, 200);
    assert!(parse_metrics(&none).is_empty(), "{none}");
    let (code, bad) = get(&daemon, "/metrics/ranks?rank=0");
    assert_eq!(code, 400);
    assert_eq!(bad.trim_end().lines().count(), 1, "{bad}");
    assert!(bad.contains("unknown query parameter `rank`"), "{bad}");
    let status = daemon.stop(signal::TERM);
    assert!(status.success(), "daemon exit: {status}");
    assert_no_probes_left();
}

#[test]
fn a_small_budget_drops_and_counts_and_the_job_is_unharmed() {
    if !require(&[
        Need::Root,
        Need::Mpi(Mpi::OpenMpi),
        Need::Command("bpftool"),
    ]) {
        return;
    }
    let dir = scratch("exposition-budget");
    let job = start_mix(&dir, false);
    let mut args = job.pid_args();
    args.extend(["--max-series".into(), "30".into()]);
    let started = std::time::Instant::now();
    let mut daemon = Daemon::start_bounded(&args);
    let (_, s) = daemon.scrape();
    let jobid = jobid(&s, &job);
    job.go();
    // Its own checks of every result pass, and it exits normally.
    job.finish("OK ");
    let s = wait_for("the exits to be noticed", LIMIT, || {
        let (_, s) = daemon.scrape();
        let up = s
            .iter()
            .filter(|x| x.name == "mpi_rank_up" && x.label("jobid") == Some(&jobid));
        (up.clone().count() == NP as usize && up.map(|x| x.value).sum::<f64>() == 0.0).then_some(s)
    });
    let mpi_series = s
        .iter()
        .filter(|x| !x.name.starts_with("mpi_observer_"))
        .count();
    assert!(
        mpi_series <= 30,
        "{mpi_series} MPI series over a budget of 30"
    );
    // Every rank's minimal series first.
    assert_eq!(
        s.iter()
            .filter(|x| x.name == "mpi_rank_wall_seconds_total")
            .count(),
        NP as usize
    );
    assert_eq!(
        sum(
            &s,
            "mpi_observer_exposition_series",
            &[("path", "/metrics")]
        ),
        mpi_series as f64
    );
    assert!(
        sum(
            &s,
            "mpi_observer_series_dropped_total",
            &[("path", "/metrics")]
        ) > 0.0
    );
    let dropped: BTreeSet<&str> = s
        .iter()
        .filter(|x| {
            x.name == "mpi_observer_series_dropped"
                && x.label("path") == Some("/metrics")
                && x.value > 0.0
        })
        .filter_map(|x| x.label("metric"))
        .collect();
    for family in [
        "mpi_job_calls_total",
        "mpi_call_duration_seconds",
        "mpi_calls_total",
    ] {
        assert!(dropped.contains(family), "{family} in {dropped:?}");
    }
    let (status, log) = daemon.stop_and_log(signal::TERM);
    assert!(status.success(), "daemon exit: {status}");
    let lines = log
        .iter()
        .filter(|l| l.contains("/metrics is over --max-series 30"))
        .count();
    let most = 1 + started.elapsed().as_secs() as usize / 60;
    assert!(
        (1..=most).contains(&lines),
        "{lines} lines, one a minute at most: {log:?}"
    );
    assert_no_probes_left();
}

#[test]
fn peer_traffic_is_node_by_node_under_the_stats_layer() {
    if !required() {
        return;
    }
    assert!(shim().exists(), "the shim is built");
    let dir = scratch("exposition-stats");
    let job = start_mix(&dir, true);
    let mut daemon = Daemon::start_bounded(&job.pid_args());
    let (_, s) = daemon.scrape();
    let jobid = jobid(&s, &job);
    job.go();
    job.finish("OK ");
    let (body, s) = all_exited(&mut daemon, &jobid);
    promtool_check(&body);
    assert_formula(&s, &jobid, 4);
    let node = s
        .iter()
        .find(|x| x.name == "mpi_observer_node_info")
        .and_then(|x| x.label("node"))
        .expect("mpi_observer_node_info")
        .to_string();
    let peers: Vec<&Sample> = s
        .iter()
        .filter(|x| x.name == "mpi_job_peer_messages_total" && x.label("jobid") == Some(&jobid))
        .collect();
    assert!(!peers.is_empty(), "node x node peer series");
    for p in &peers {
        assert_eq!(p.label("node"), Some(node.as_str()), "{:?}", p.labels);
        assert_eq!(
            p.label("peer_node"),
            Some(node.as_str()),
            "every peer rank of the job is on this node: {:?}",
            p.labels
        );
    }
    // The node's sums equal the ranks' per-peer figures of /metrics/ranks.
    let (code, ranks_body) = get(&daemon, "/metrics/ranks");
    assert_eq!(code, 200);
    let r = parse_metrics(&ranks_body);
    for d in ["send", "recv"] {
        let ranks = sum(
            &r,
            "mpi_peer_messages_total",
            &[("jobid", &jobid), ("direction", d)],
        );
        let node_level = sum(
            &s,
            "mpi_job_peer_messages_total",
            &[("jobid", &jobid), ("direction", d)],
        );
        assert!(ranks > 0.0, "{d}: messages counted");
        assert_eq!(node_level, ranks, "{d}: node x node = the ranks' sum");
    }
    // Request health per rank on /metrics/ranks only, per job on /metrics.
    let outstanding = |s: &[Sample]| {
        s.iter()
            .filter(|x| x.name == "mpi_requests_outstanding" && x.label("jobid") == Some(&jobid))
            .count()
    };
    assert_eq!(outstanding(&r), NP as usize);
    assert_eq!(outstanding(&s), detail(&s, &jobid).len());
    assert_eq!(
        sum(&s, "mpi_job_requests_outstanding", &[("jobid", &jobid)]),
        0.0,
        "every request completed"
    );
    let status = daemon.stop(signal::TERM);
    assert!(status.success(), "daemon exit: {status}");
    assert_no_probes_left();
}

#[test]
fn no_job_counter_falls_when_exited_ranks_are_forgotten() {
    if !required() {
        return;
    }
    assert!(shim().exists(), "the shim is built");
    let dir = scratch("exposition-departed");
    // Two runs of one job on this node, as two steps of a Slurm job: the
    // first ends, the second runs on.
    let id = format!("77{}", std::process::id());
    let mut daemon = Daemon::start_bounded(&["--all".into(), "--retain-exited".into(), "6".into()]);
    let first = start_mix_as(&dir, true, Some(&id), "go-first");
    let running = |d: &mut Daemon, n: u32| {
        wait_for("the ranks to be attached", LIMIT, || {
            let (_, s) = d.scrape();
            (sum(&s, "mpi_job_ranks", &[("jobid", &id), ("state", "running")]) == f64::from(n))
                .then_some(())
        })
    };
    running(&mut daemon, NP);
    first.go();
    first.finish("OK ");
    let second = start_mix_as(&dir, true, Some(&id), "go-second");
    running(&mut daemon, NP);
    let job = [("jobid", id.as_str())];
    let counters = |s: &[Sample]| -> std::collections::BTreeMap<String, f64> {
        s.iter()
            .filter(|x| {
                x.label("jobid") == Some(&id)
                    && x.label("rank").is_none()
                    && (x.name.starts_with("mpi_job_") && x.name.ends_with("_total")
                        || x.name.starts_with("mpi_call_duration_seconds"))
            })
            .map(|x| (format!("{}{:?}", x.name, x.labels), x.value))
            .collect()
    };
    // Both runs held: the first's ranks exited, the second's running.
    let (_, held) = wait_for("both runs to be held", LIMIT, || {
        let (b, s) = daemon.scrape();
        (sum(&s, "mpi_job_ranks", &[("jobid", &id), ("state", "exited")]) == f64::from(NP)
            && sum(&s, "mpi_job_ranks", &[("jobid", &id), ("state", "running")]) == f64::from(NP))
        .then_some((b, s))
    });
    let before = counters(&held);
    assert!(sum(&held, "mpi_job_calls_total", &job) > 0.0);
    assert!(sum(&held, "mpi_job_peer_messages_total", &job) > 0.0);
    // The first run's ranks are forgotten after --retain-exited.
    let (body, gone) = wait_for("the first run to be forgotten", 3 * LIMIT, || {
        let (b, s) = daemon.scrape();
        (sum(&s, "mpi_job_ranks", &[("jobid", &id), ("state", "exited")]) == 0.0).then_some((b, s))
    });
    promtool_check(&body);
    let after = counters(&gone);
    for (series, v) in &before {
        let now = after.get(series).copied().unwrap_or(f64::NAN);
        assert!(now >= *v, "{series} fell from {v} to {now}");
    }
    // The forgotten ranks' own series are gone.
    assert_eq!(
        gone.iter()
            .filter(|x| x.name == "mpi_rank_up" && x.label("jobid") == Some(&id))
            .count(),
        NP as usize
    );
    second.go();
    second.finish("OK ");
    let status = daemon.stop(signal::TERM);
    assert!(status.success(), "daemon exit: {status}");
    assert_no_probes_left();
}
