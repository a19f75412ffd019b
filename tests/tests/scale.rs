//! The reduced scale test (issue 22): 100 simulated nodes × 64 ranks of one
//! job, each node the daemon's real HTTP server and render path, scraped by
//! two `vmagent`s in cluster mode into a real VictoriaMetrics, with
//! `vmalert` evaluating the project's rules. The full 64 k-rank run is
//! `cargo xtask bench scale`; both use `e2e::vm`.
//!
//! Asserts: every dashboard expression returns data; the planted straggler
//! is the rank the straggler panel singles out; the stuck request raises
//! exactly one `MPIRequestStuck` alert, for the planted job; and the series
//! stored stay within the budget per rank (≤ 1.5 M at 64 k ranks).
//!
//! `MPI_OBSERVER_SCALE_NODES` changes the node count (development only).

use std::time::{Duration, Instant};

use e2e::{
    Need, require, scratch,
    vm::{COMMANDS, Config, Pipeline, Vars, dashboard_exprs, substitute, value},
};

/// Series allowed at 64 k ranks, and per rank from that.
const SERIES_AT_64K: f64 = 1.5e6;

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
    let config = Config::new(nodes, 64, 2, Duration::from_secs(3), &scratch("scale"));
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
    for e in &exprs {
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

    // The series formula: at most 1.5 M at 64 k ranks, scaled.
    let series = p.series_count() as f64;
    let allowed = SERIES_AT_64K * ranks / 64_000.0;
    eprintln!(
        "series stored: {series} for {ranks} ranks ({:.1} per rank; allowed {allowed})",
        series / ranks
    );
    assert!(
        series <= allowed,
        "{series} series for {ranks} ranks: over the budget of {allowed} (1.5 M at 64 k ranks)"
    );
    p.assert_running();
}
