//! The reduced scale test (issue 22): 100 simulated nodes × 64 ranks of one
//! job, each node the daemon's real HTTP server and render path, scraped by
//! two `vmagent`s in cluster mode into a real VictoriaMetrics, with
//! `vmalert` evaluating the project's rules. The full 64 k-rank run is
//! `cargo xtask bench scale`; both use `e2e::vm`.
//!
//! Asserts: every dashboard expression returns data; the planted straggler
//! is the rank the straggler panel singles out; the stuck request raises
//! exactly one `MPIRequestStuck` alert, for the planted job; and the series
//! stored keep the formula: at most 12 per rank (stats layer on) besides
//! the job-level series and the few detail ranks of each node.
//!
//! `MPI_OBSERVER_SCALE_NODES` changes the node count (development only).

use std::time::{Duration, Instant};

use e2e::{
    Need, require, scratch,
    vm::{COMMANDS, Config, PanelExpr, Pipeline, Vars, dashboard_exprs, substitute, value},
};

/// Series each rank may add, with the stats layer (issue 22's goal).
const SERIES_PER_RANK: f64 = 12.0;
/// Series per job and node, detail ranks included (issue 22's goal).
const SERIES_PER_JOB_AND_NODE: f64 = 1_500.0;

#[test]
fn scale_reduced() {
    let needs: Vec<Need> = COMMANDS.iter().map(|c| Need::Command(c)).collect();
    if !require(&needs) {
        return;
    }
    let nodes = std::env::var("MPI_OBSERVER_SCALE_NODES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100);
    let mut config = Config::new(nodes, 64, 2, Duration::from_secs(3), &scratch("scale"));
    // The rank drill-down's latency heatmap needs them (as on the live
    // cluster test); they cost only the detail ranks.
    config.per_rank_histograms = true;
    // The once-a-minute rule groups as often as the rest: 3 s here.
    config.fast_groups = true;
    let (jobid, straggler, stuck) = (config.jobid.clone(), config.straggler, config.stuck_rank);
    let ranks = f64::from(nodes * 64);
    let mut p = Pipeline::start(config);
    p.wait_scraped(Duration::from_secs(90));

    // The stuck request starts 100 s old, crosses 120 s, then the alert's
    // `for` runs: one alert for the job, however many ranks and nodes.
    let start = Instant::now();
    let firing = loop {
        p.assert_running();
        let alerts = p.alerts("MPIRequestStuck");
        if alerts.iter().any(|a| a["state"] == "firing") {
            break alerts;
        }
        assert!(
            start.elapsed() < Duration::from_secs(150),
            "no MPIRequestStuck alert firing after 150 s: {alerts:?}"
        );
        std::thread::sleep(Duration::from_secs(2));
    };
    assert_eq!(
        firing.len(),
        1,
        "one stuck request must raise exactly one MPIRequestStuck alert: {firing:#?}"
    );
    assert_eq!(
        firing[0]["labels"]["jobid"], jobid,
        "the alert names the planted job: {firing:#?}"
    );
    eprintln!(
        "MPIRequestStuck: {} (planted on rank {stuck})",
        firing[0]["labels"]
    );

    // Every panel's expression returns data, the rank drill-down on the
    // planted straggler.
    let vars = Vars {
        jobid: jobid.clone(),
        rank: straggler.to_string(),
        instance: p.targets[0].clone(),
        rate_interval: "1m".into(),
    };
    let exprs = dashboard_exprs();
    assert!(!exprs.is_empty(), "no dashboard expressions found");
    let mut empty = Vec::new();
    // The rank × peer panels need a /metrics/ranks scrape job, which a
    // site adds for the jobs it debugs and this pipeline (every rank of a
    // 6,400-rank job) does not: they alone may be empty, and say so. The
    // live cluster test scrapes /metrics/ranks and sees them filled.
    let ranks_only: Vec<&PanelExpr> = exprs.iter().filter(|e| e.ranks_only).collect();
    assert!(
        ranks_only.len() <= 3 && ranks_only.iter().all(|e| e.dashboard == "mpi-rank.json"),
        "only the rank dashboard's peer panels may need /metrics/ranks: {:?}",
        ranks_only.iter().map(|e| &e.panel).collect::<Vec<_>>()
    );
    // The nodes' clock uncertainty exists only for a job whose daemons are
    // given each other (--waits.peers; tests/tests/e2e/waits_nodes.rs), which
    // the simulated nodes are not: its panel need only be a valid query.
    const ACROSS_NODES_ONLY: &str = "mpi_job_wait_clock_uncertainty_seconds";
    for e in exprs.iter().filter(|e| e.raw.contains(ACROSS_NODES_ONLY)) {
        let q = substitute(&e.raw, &vars);
        if let Err(why) = p.query(&q) {
            empty.push(format!(
                "{} / {}: {q}: not valid: {why:?}",
                e.dashboard, e.panel
            ));
        }
    }
    for e in exprs
        .iter()
        .filter(|e| !e.ranks_only && !e.raw.contains(ACROSS_NODES_ONLY))
    {
        let q = substitute(&e.raw, &vars);
        // Recording rules need an evaluation or two after the first scrapes.
        let deadline = Instant::now() + Duration::from_secs(30);
        let got = loop {
            match p.query(&q) {
                Ok(r) if !r.is_empty() => break Ok(r.len()),
                other if Instant::now() >= deadline => break Err(format!("{other:?}")),
                _ => std::thread::sleep(Duration::from_secs(1)),
            }
        };
        if let Err(why) = got {
            empty.push(format!("{} / {}: {q}: {why}", e.dashboard, e.panel));
        }
    }
    assert!(
        empty.is_empty(),
        "{} of {} dashboard expressions returned no data:\n{}",
        empty.len(),
        exprs.len(),
        empty.join("\n")
    );

    // The straggler panel, over all ranks, singles out the planted rank:
    // it is among the series returned, and the most extreme of them.
    let all = Vars {
        rank: ".*".into(),
        ..vars
    };
    let panel = exprs
        .iter()
        .find(|e| e.panel.to_lowercase().contains("straggler"))
        .expect("a straggler panel in the dashboards");
    let q = substitute(&panel.raw, &all);
    let result = p.query(&q).expect("the straggler panel's query");
    let planted = straggler.to_string();
    let of = |r: &serde_json::Value| r["metric"]["rank"].as_str().unwrap_or("").to_string();
    let found = result.iter().find(|r| of(r) == planted).unwrap_or_else(|| {
        panic!(
            "straggler rank {planted} not in {} ({} series): {:?}",
            q,
            result.len(),
            result.iter().take(10).map(of).collect::<Vec<_>>()
        )
    });
    let v = value(found);
    let (min, max) = result
        .iter()
        .map(value)
        .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(x), hi.max(x)));
    assert!(
        v == min || v == max,
        "straggler rank {planted} ({v}) is not the extreme of {q} (min {min}, max {max})"
    );
    eprintln!(
        "straggler panel {:?}: rank {planted} = {v} among {} series",
        panel.panel,
        result.len()
    );

    // The series formula, from what VictoriaMetrics stores: the series
    // every rank adds (those with a `rank` label, less the detail ranks'
    // full series) stay within 12 per rank with stats. Counted on a store
    // no longer written to, over the last scrapes (every live series has
    // a sample in the last 30 s).
    p.assert_running();
    p.stop_scraping();
    let count = |q: &str| {
        p.query_recent(q, Duration::from_secs(30))
            .unwrap_or_else(|e| panic!("{q}: {e}"))
            .first()
            .map_or(0.0, value)
    };
    let job = format!("job=\"mpi-observer\",jobid=\"{jobid}\"");
    let with_rank = count(&format!("count({{{job},rank!=\"\"}})"));
    // The detail ranks' series at default flags: their per-rank histograms
    // (--per-rank-histograms, on here for the rank heatmap) are opt-in.
    let detail = count(&format!(
        "count({{{job},rank!=\"\",__name__!~\"mpi_call_duration_seconds_(bucket|sum|count)\"}} and on (jobid, uid, rank) mpi_rank_detail)"
    ));
    let histograms = count(&format!(
        "count({{{job},rank!=\"\",__name__=~\"mpi_call_duration_seconds_(bucket|sum|count)\"}})"
    ));
    let job_level = count(&format!("count({{{job},rank=\"\"}})"));
    let per_rank = (with_rank - detail - histograms) / ranks;
    let series = p.series_count() as f64;
    let per_node = (job_level + detail) / f64::from(nodes);
    eprintln!(
        "series stored: {series} for {ranks} ranks ({:.0} at 64 k ranks; goal 1.5 M): {per_rank:.2} per rank, \
         {per_node:.0} per job and node ({job_level} job-level + {detail} of detail ranks; goal 1,500; \
         {histograms} of opt-in per-rank histograms besides)",
        series * 64_000.0 / ranks
    );
    assert!(
        per_rank <= SERIES_PER_RANK,
        "{per_rank} series per rank ({with_rank} with a rank label, {detail} of detail ranks, {ranks} ranks): over {SERIES_PER_RANK}"
    );
    assert!(
        per_node <= SERIES_PER_JOB_AND_NODE,
        "{per_node} series per job and node ({job_level} job-level + {detail} of detail ranks, {nodes} nodes): over {SERIES_PER_JOB_AND_NODE}"
    );
    p.assert_running();
}
