//! `cargo xtask bench scale`: the exposition at 64 k ranks (issue 22).
//!
//! Two runs of the pipeline of `e2e::vm` (the one `tests/tests/e2e/scale.rs`
//! runs reduced): `mpi-observer __simulate` nodes (each the daemon's real
//! HTTP server and render path over 64 synthetic ranks of one job, 40
//! functions, 26 peers, call sites, a stats segment), scraped every 15 s by
//! `vmagent`s in cluster mode, remote-written into a single-node
//! VictoriaMetrics, with vmalert evaluating dashboards/prometheus/*.rules.yml
//! every 15 s.
//!
//! - "after": the default exposition at 1,000 nodes × 64 ranks;
//! - "before": today's full per-rank exposition (`--per-rank-detail`) at 20
//!   nodes × 64 ranks, the size that fits this machine, extrapolated
//!   linearly in ranks to 64 k.
//!
//! Each run measures: active series (`/api/v1/series/count`), samples/s
//! scraped (the vmagents' `vm_promscrape_scraped_samples_sum` over a
//! window), ingestion CPU (VictoriaMetrics + vmagents, `/proc/PID/stat` over
//! the same window), the p95 of every dashboard expression as an instant
//! query (its variables set to the planted job and rank, VictoriaMetrics'
//! cache bypassed), the p95 of the same as one-hour range queries (step
//! 15 s) after one hour of history was backfilled for some nodes (see
//! [`Pipeline::backfill`]: each node's exposition replayed with
//! timestamps), vmalert's rule-group evaluation time
//! (`vmalert_iteration_duration_seconds`) against the interval, and checks
//! that the planted straggler is the straggler panel's extreme and that the
//! stuck request raises one `MPIRequestStuck` alert. Exposition bytes,
//! series and collection CPU at 128 ranks on one node come from
//! `__simulate --measure` (in-process, thread CPU).
//!
//! Knobs (environment): `MPI_OBSERVER_SCALE_NODES` (1000),
//! `MPI_OBSERVER_SCALE_BEFORE_NODES` (20), `MPI_OBSERVER_SCALE_SHARDS` (2),
//! `MPI_OBSERVER_SCALE_REPS` (20 instant queries per panel),
//! `MPI_OBSERVER_SCALE_BACKFILL` (share of the nodes given an hour of
//! history, 0.1), `MPI_OBSERVER_SCALE_RANGE_REPS` (3 one-hour range
//! queries per panel; 0 skips the backfill and the ranges). Results go to
//! docs/benchmarks-scale.md.

use std::{
    fmt::Write as _,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use e2e::vm::{Config, Pipeline, Vars, dashboard_exprs, percentile, substitute, value};

use crate::{
    bench_common::{loadavg, machine, release_binaries, write_report},
    setup::run_cmd,
};

/// The scrape and evaluation interval.
const INTERVAL: Duration = Duration::from_secs(15);
/// The window ingestion is measured over.
const WINDOW: Duration = Duration::from_secs(90);

fn knob<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one run measured.
#[derive(Debug, Default)]
struct Run {
    label: String,
    ranks: u32,
    series: f64,
    node_series: usize,
    node_bytes: usize,
    rank_series_per_rank: f64,
    detail_series_per_node: usize,
    job_series_per_node: usize,
    samples_per_s: f64,
    ingest_cpu: f64,
    sim_cpu: f64,
    instant_p95_max: f64,
    instant_worst: String,
    instant_errors: Vec<String>,
    instant_over_1s: usize,
    panels: usize,
    /// (panel, instant p95 s, range p95 s) for every expression.
    per_panel: Vec<(String, f64, f64)>,
    range_p95_max: f64,
    range_worst: String,
    range_errors: usize,
    backfill_nodes: usize,
    backfilled: u64,
    backfill_s: f64,
    live_minutes: f64,
    rule_groups: Vec<(String, f64, f64)>,
    stuck_alerts: usize,
    stuck_ok: bool,
    straggler_ok: bool,
    straggler_note: String,
}

/// Each rule group's own `interval:` in dashboards/prometheus/*.rules.yml
/// (those without one are evaluated every [`INTERVAL`]); minutes or
/// seconds.
fn group_intervals() -> std::collections::HashMap<String, Duration> {
    let mut out = std::collections::HashMap::new();
    for f in e2e::vm::rule_files() {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let mut group: Option<String> = None;
        for line in text.lines().map(str::trim) {
            if let Some(name) = line.strip_prefix("- name:") {
                group = Some(name.trim().to_string());
            } else if let (Some(g), Some(v)) = (&group, line.strip_prefix("interval:")) {
                let v = v.trim();
                let secs = v
                    .strip_suffix('m')
                    .and_then(|m| m.parse::<u64>().ok().map(|m| m * 60))
                    .or_else(|| v.strip_suffix('s').and_then(|s| s.parse().ok()));
                if let Some(secs) = secs {
                    out.insert(g.clone(), Duration::from_secs(secs));
                }
            }
        }
    }
    out
}

/// The vmalert groups' evaluation time: (group, mean seconds, 0.99
/// quantile seconds).
fn rule_groups(alert_addr: &str) -> Vec<(String, f64, f64)> {
    let Ok((_, body)) = e2e::vm::http(alert_addr, "GET", "/metrics", b"", Duration::from_secs(10))
    else {
        return Vec::new();
    };
    let samples = e2e::parse_metrics(&String::from_utf8_lossy(&body));
    let mut groups: Vec<String> = samples
        .iter()
        .filter(|s| s.name == "vmalert_iteration_duration_seconds_count")
        .filter_map(|s| s.label("group").map(str::to_string))
        .collect();
    groups.sort();
    groups.dedup();
    groups
        .into_iter()
        .map(|g| {
            let get = |name: &str, q: Option<&str>| {
                samples
                    .iter()
                    .find(|s| {
                        s.name == name
                            && s.label("group") == Some(g.as_str())
                            && (q.is_none() || s.label("quantile") == q)
                    })
                    .map_or(f64::NAN, |s| s.value)
            };
            let mean = get("vmalert_iteration_duration_seconds_sum", None)
                / get("vmalert_iteration_duration_seconds_count", None);
            let q99 = get("vmalert_iteration_duration_seconds", Some("0.99"));
            (g, mean, q99)
        })
        .collect()
}

fn measure(
    label: &str,
    mut config: Config,
    detail: bool,
    reps: usize,
    backfill: f64,
    range_reps: usize,
) -> Result<Run> {
    config.per_rank_detail = detail;
    config.eval_interval = INTERVAL;
    let (nodes, rpn) = (config.nodes, config.ranks_per_node);
    let (jobid, straggler) = (config.jobid.clone(), config.straggler);
    println!(
        "== {label}: {nodes} nodes x {rpn} ranks, {} scrapers",
        config.shards
    );
    let t = Instant::now();
    let mut p = Pipeline::start(config);
    p.wait_scraped(Duration::from_secs(600));
    println!(
        "all {nodes} nodes scraped after {:.0} s",
        t.elapsed().as_secs_f64()
    );
    let mut run = Run {
        label: label.into(),
        ranks: nodes * rpn,
        ..Run::default()
    };

    // One node's exposition: what a scrape carries.
    let text = p.exposition(0);
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    run.node_bytes = text.len();
    run.node_series = lines.len();
    // Per rank: the series with a `rank` label, less the detail ranks'
    // full series (counted per job and node, with the job-level ones).
    let rank_of = |l: &str| {
        l.split(",rank=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .map(str::to_string)
    };
    // With --per-rank-detail every rank has its full series: none apart.
    let detail_ranks: std::collections::HashSet<String> = lines
        .iter()
        .filter(|l| !detail && l.starts_with("mpi_rank_detail{"))
        .filter_map(|l| rank_of(l))
        .collect();
    // Every rank's own series (info, up, MPI and wall seconds): the rest of
    // a detail rank's are its full series.
    let minimal = |l: &&&str| {
        [
            "mpi_rank_info{",
            "mpi_rank_up{",
            "mpi_rank_mpi_seconds_total{",
            "mpi_rank_wall_seconds_total{",
        ]
        .iter()
        .any(|p| l.starts_with(p))
    };
    let with_rank: Vec<&&str> = lines.iter().filter(|l| l.contains(",rank=\"")).collect();
    let of_detail = with_rank
        .iter()
        .filter(|l| {
            !detail_ranks.is_empty()
                && !minimal(l)
                && rank_of(l).is_some_and(|r| detail_ranks.contains(&r))
        })
        .count();
    run.rank_series_per_rank = (with_rank.len() - of_detail) as f64 / f64::from(rpn);
    run.detail_series_per_node = of_detail;
    run.job_series_per_node = lines
        .iter()
        .filter(|l| l.contains("jobid=\"") && !l.contains(",rank=\""))
        .count();

    // Ingestion over a window of steady scraping.
    let cpu = |p: &Pipeline| p.vm.cpu() + p.agents.iter().map(e2e::vm::Proc::cpu).sum::<Duration>();
    let (c0, s0, n0, t0) = (cpu(&p), p.sim.cpu(), p.scraped_samples(), Instant::now());
    std::thread::sleep(WINDOW);
    p.assert_running();
    let w = t0.elapsed().as_secs_f64();
    run.samples_per_s = (p.scraped_samples() - n0) / w;
    run.ingest_cpu = (cpu(&p) - c0).as_secs_f64() / w;
    run.sim_cpu = (p.sim.cpu() - s0).as_secs_f64() / w;
    run.series = p.series_count() as f64;
    println!(
        "series {} ; samples/s {:.0} ; ingestion CPU {:.2} cores ; simulator CPU {:.2} cores",
        run.series, run.samples_per_s, run.ingest_cpu, run.sim_cpu
    );

    // The planted stuck request: one alert for the job.
    let start = Instant::now();
    let firing = loop {
        let a = p.alerts("MPIRequestStuck");
        if a.iter().any(|a| a["state"] == "firing") || start.elapsed() > Duration::from_secs(240) {
            break a;
        }
        std::thread::sleep(Duration::from_secs(5));
    };
    run.stuck_alerts = firing.iter().filter(|a| a["state"] == "firing").count();
    run.stuck_ok = run.stuck_alerts == 1 && firing[0]["labels"]["jobid"] == jobid.as_str();
    println!("MPIRequestStuck alerts: {firing:?}");

    // Every panel, instant.
    let vars = Vars {
        jobid: jobid.clone(),
        rank: straggler.to_string(),
        instance: p.targets[0].clone(),
        rate_interval: "1m".into(),
    };
    let exprs = dashboard_exprs();
    run.panels = exprs.len();
    for e in &exprs {
        let q = substitute(&e.raw, &vars);
        let mut times = Vec::new();
        let mut error = None;
        for _ in 0..reps {
            let t = Instant::now();
            match p.query(&q) {
                // Rank × peer panels document that they need a
                // /metrics/ranks scrape job, which this pipeline has not.
                Ok(r) if r.is_empty() && !e.ranks_only => error = Some("no data".to_string()),
                Ok(_) => {}
                Err(why) => error = Some(why),
            }
            times.push(t.elapsed().as_secs_f64());
        }
        let p95 = percentile(&mut times, 95.0);
        println!("instant p95 {p95:.3} s: {} / {}", e.dashboard, e.panel);
        run.per_panel
            .push((format!("{} / {}", e.dashboard, e.panel), p95, f64::NAN));
        if p95 > 1.0 {
            run.instant_over_1s += 1;
        }
        if p95 > run.instant_p95_max {
            run.instant_p95_max = p95;
            run.instant_worst = format!("{} / {}", e.dashboard, e.panel);
        }
        if let Some(why) = error {
            let why: String = why.chars().take(200).collect();
            run.instant_errors
                .push(format!("{} / {}: {why}", e.dashboard, e.panel));
        }
    }
    println!(
        "instant p95 max {:.3} s ({}); {} errors",
        run.instant_p95_max,
        run.instant_worst,
        run.instant_errors.len()
    );

    // The straggler panel over all ranks.
    if let Some(panel) = exprs
        .iter()
        .find(|e| e.panel.to_lowercase().contains("straggler"))
    {
        let all = Vars {
            rank: ".*".into(),
            ..vars.clone()
        };
        let q = substitute(&panel.raw, &all);
        match p.query(&q) {
            Ok(r) => {
                let of =
                    |r: &serde_json::Value| r["metric"]["rank"].as_str().unwrap_or("").to_string();
                let planted = r.iter().find(|x| of(x) == straggler.to_string()).map(value);
                let (lo, hi) = r
                    .iter()
                    .map(value)
                    .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
                run.straggler_ok = planted.is_some_and(|v| v == lo || v == hi);
                run.straggler_note = match planted {
                    Some(v) => format!(
                        "panel \"{}\": {} series, planted rank {straggler} = {v:.4} (min {lo:.4}, max {hi:.4})",
                        panel.panel,
                        r.len()
                    ),
                    None => format!(
                        "panel \"{}\": {} series, planted rank {straggler} not among them",
                        panel.panel,
                        r.len()
                    ),
                };
            }
            Err(why) => run.straggler_note = format!("panel \"{}\": {why}", panel.panel),
        }
    }
    println!("straggler: {}", run.straggler_note);
    run.rule_groups = rule_groups(&p.alert_addr);

    // An hour of history for a share of the nodes, then 1 h ranges.
    if range_reps == 0 {
        p.assert_running();
        return Ok(run);
    }
    run.backfill_nodes = ((f64::from(nodes) * backfill).ceil() as usize).clamp(1, nodes as usize);
    let t = Instant::now();
    run.backfilled = p.backfill(run.backfill_nodes, Duration::from_secs(3600));
    run.backfill_s = t.elapsed().as_secs_f64();
    run.live_minutes = p.started.elapsed().as_secs_f64() / 60.0;
    println!(
        "backfilled {} samples for {} nodes in {:.0} s",
        run.backfilled, run.backfill_nodes, run.backfill_s
    );
    for (i, e) in exprs.iter().enumerate() {
        let q = substitute(&e.raw, &vars);
        let mut times = Vec::new();
        for _ in 0..range_reps {
            let t = Instant::now();
            if p.query_range(&q, Duration::from_secs(3600), INTERVAL)
                .is_err()
            {
                run.range_errors += 1;
            }
            times.push(t.elapsed().as_secs_f64());
        }
        let p95 = percentile(&mut times, 95.0);
        println!("range p95 {p95:.3} s: {} / {}", e.dashboard, e.panel);
        run.per_panel[i].2 = p95;
        if p95 > run.range_p95_max {
            run.range_p95_max = p95;
            run.range_worst = format!("{} / {}", e.dashboard, e.panel);
        }
    }
    println!(
        "range p95 max {:.3} s ({}); {} errors",
        run.range_p95_max, run.range_worst, run.range_errors
    );
    // Evaluations under the query load too.
    run.rule_groups = rule_groups(&p.alert_addr);
    p.assert_running();
    Ok(run)
}

/// `__simulate --measure` at 128 ranks: (bytes, series, series with rank,
/// job-level series, collection CPU ms).
fn at_128(observer: &Path, detail: bool) -> Result<(f64, f64, f64, f64, f64)> {
    let mut cmd = Command::new(observer);
    cmd.args([
        "__simulate",
        "--nodes",
        "1000",
        "--ranks-per-node",
        "128",
        "--measure",
        "31",
    ]);
    if detail {
        cmd.arg("--per-rank-detail");
    }
    let out = cmd.output().context("run __simulate --measure")?;
    if !out.status.success() {
        bail!(
            "__simulate --measure: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |k: &str| -> Result<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix('=')?.parse().ok())
            .with_context(|| format!("no {k} in {text}"))
    };
    Ok((
        get("exposition_bytes")?,
        get("series")?,
        get("series_with_rank")?,
        get("series_job_level")?,
        get("collect_cpu_ms")?,
    ))
}

/// Runs the benchmark.
pub fn run(root: &Path) -> Result<()> {
    for c in e2e::vm::COMMANDS {
        if run_cmd(Command::new("sh").args(["-c", &format!("command -v {c} >/dev/null")])).is_err()
        {
            bail!("{c} is missing: run `cargo xtask setup` (Debian package victoria-metrics)");
        }
    }
    let load_before = loadavg();
    let (observer, _) = release_binaries(root)?;
    let nodes: u32 = knob("MPI_OBSERVER_SCALE_NODES", 1000);
    let before_nodes: u32 = knob("MPI_OBSERVER_SCALE_BEFORE_NODES", 20);
    let shards: u32 = knob("MPI_OBSERVER_SCALE_SHARDS", 2);
    let reps: usize = knob("MPI_OBSERVER_SCALE_REPS", 20);
    let backfill: f64 = knob("MPI_OBSERVER_SCALE_BACKFILL", 0.1);
    let range_reps: usize = knob("MPI_OBSERVER_SCALE_RANGE_REPS", 3);
    let scratch = e2e::target_dir().join("bench-scale");

    let after128 = at_128(&observer, false)?;
    let before128 = at_128(&observer, true)?;
    let dir = scratch.join("after");
    let _ = std::fs::remove_dir_all(&dir);
    let after = measure(
        "after: default exposition",
        Config::new(nodes, 64, shards, INTERVAL, &dir),
        false,
        reps,
        backfill,
        range_reps,
    )?;
    let dir = scratch.join("before");
    let _ = std::fs::remove_dir_all(&dir);
    let before = measure(
        "before: --per-rank-detail",
        Config::new(before_nodes, 64, shards, INTERVAL, &dir),
        true,
        reps.min(5),
        backfill,
        range_reps,
    )?;

    let mut r = String::new();
    writeln!(r, "# Scale: `cargo xtask bench scale`\n")?;
    writeln!(
        r,
        "Machine: {}. Debian victoria-metrics {}.\n",
        machine(),
        e2e::vm::version()
    )?;
    writeln!(
        r,
        "Pipeline: `mpi-observer __simulate` (each node the daemon's HTTP server and render path, 64 ranks of one job, \
         40 functions, 26 peers, call sites, stats segment), {shards} `vmagent`s in cluster mode scraping every 15 s, \
         remote write into single-node VictoriaMetrics, vmalert evaluating dashboards/prometheus/*.rules.yml every 15 s. \
         Instant queries: every `expr` of dashboards/grafana/*.json, variables set to the planted job and rank, \
         {reps} runs each ({} for before), `nocache=1`. One-hour ranges: step 15 s, {range_reps} runs each, after one hour of \
         history was backfilled for a share of the nodes (`/api/v1/import/prometheus`, each node's exposition replayed \
         every 15 s with counters scaled linearly); the rest of the nodes have only the live minutes.\n",
        reps.min(5)
    )?;
    let x = |b: f64| b * 64_000.0 / f64::from(before.ranks);
    writeln!(
        r,
        "| | after (default, {} ranks) | before (`--per-rank-detail`, {} ranks) | before extrapolated to 64 k ranks | ratio | goal |",
        after.ranks, before.ranks
    )?;
    writeln!(r, "|---|---|---|---|---|---|")?;
    let ax = |a: f64| a * 64_000.0 / f64::from(after.ranks);
    writeln!(
        r,
        "| active series (VictoriaMetrics) | {:.0} | {:.0} | {:.0} | {:.1}x | ≤ 1.5 M at 64 k |",
        after.series,
        before.series,
        x(before.series),
        x(before.series) / ax(after.series)
    )?;
    writeln!(
        r,
        "| series per rank (one node's exposition: with `rank`, less the detail ranks' full series, / ranks) | {:.1} | {:.1} | | {:.1}x | ≤ 8; ≤ 12 with stats |",
        after.rank_series_per_rank,
        before.rank_series_per_rank,
        before.rank_series_per_rank / after.rank_series_per_rank
    )?;
    writeln!(
        r,
        "| detail ranks' full series per node | {} | {} | | | |",
        after.detail_series_per_node, before.detail_series_per_node
    )?;
    writeln!(
        r,
        "| job-level series per node (no `rank`) | {} | {} | | | ≤ 1,500 |",
        after.job_series_per_node, before.job_series_per_node
    )?;
    writeln!(
        r,
        "| series per node at 64 ranks (all) | {} | {} | | {:.1}x | |",
        after.node_series,
        before.node_series,
        before.node_series as f64 / after.node_series as f64
    )?;
    writeln!(
        r,
        "| samples/s scraped at 15 s | {:.0} | {:.0} | {:.0} | {:.1}x | ≤ 100 k at 64 k |",
        after.samples_per_s,
        before.samples_per_s,
        x(before.samples_per_s),
        x(before.samples_per_s) / ax(after.samples_per_s)
    )?;
    writeln!(
        r,
        "| ingestion CPU (VictoriaMetrics + vmagents), cores | {:.2} | {:.2} | {:.2} | {:.1}x | ≤ 1 core at 64 k |",
        after.ingest_cpu,
        before.ingest_cpu,
        x(before.ingest_cpu),
        x(before.ingest_cpu) / ax(after.ingest_cpu)
    )?;
    writeln!(
        r,
        "| simulator CPU (all nodes' collection, render, HTTP), cores | {:.2} | {:.2} | {:.2} | | |",
        after.sim_cpu,
        before.sim_cpu,
        x(before.sim_cpu)
    )?;
    writeln!(
        r,
        "| instant query p95, worst panel ({} panels) | {:.3} s ({}) | {:.3} s ({}) | | | ≤ 1 s |",
        after.panels,
        after.instant_p95_max,
        after.instant_worst,
        before.instant_p95_max,
        before.instant_worst
    )?;
    writeln!(
        r,
        "| panels with p95 > 1 s / with errors or no data | {} / {} | {} / {} | | | 0 |",
        after.instant_over_1s,
        after.instant_errors.len(),
        before.instant_over_1s,
        before.instant_errors.len()
    )?;
    writeln!(
        r,
        "| one-hour range p95, worst panel | {:.3} s ({}) | {:.3} s ({}) | | | ≤ 3 s |",
        after.range_p95_max, after.range_worst, before.range_p95_max, before.range_worst
    )?;
    writeln!(
        r,
        "| range queries failed | {} | {} | | | 0 |",
        after.range_errors, before.range_errors
    )?;
    writeln!(
        r,
        "| history backfilled (nodes, samples, seconds); live minutes | {}, {}, {:.0} s; {:.1} min | {}, {}, {:.0} s; {:.1} min | | | |",
        after.backfill_nodes,
        after.backfilled,
        after.backfill_s,
        after.live_minutes,
        before.backfill_nodes,
        before.backfilled,
        before.backfill_s,
        before.live_minutes
    )?;
    let intervals = group_intervals();
    let groups = |run: &Run| {
        run.rule_groups
            .iter()
            .map(|(g, mean, q99)| {
                let every = intervals.get(g).copied().unwrap_or(INTERVAL);
                format!(
                    "{g} (every {} s): mean {mean:.3} s, p99 {q99:.3} s ({:.1} %)",
                    every.as_secs(),
                    100.0 * mean / every.as_secs_f64()
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    writeln!(
        r,
        "| rule-group evaluation (share of each group's interval; 15 s unless it sets its own) | {} | {} | | | ≤ 20 % |",
        groups(&after),
        groups(&before)
    )?;
    writeln!(
        r,
        "| MPIRequestStuck alerts firing (one stuck request) | {} | {} | | | 1 |",
        after.stuck_alerts, before.stuck_alerts
    )?;
    writeln!(
        r,
        "| planted straggler is the straggler panel's extreme | {} | {} | | | yes |",
        after.straggler_ok, before.straggler_ok
    )?;
    writeln!(
        r,
        "| exposition bytes per node, 128 ranks (`__simulate --measure`) | {:.0} | {:.0} | | {:.1}x | ≤ 150 KB |",
        after128.0,
        before128.0,
        before128.0 / after128.0
    )?;
    writeln!(
        r,
        "| series per node, 128 ranks (with rank / job-level) | {:.0} ({:.0} / {:.0}) | {:.0} ({:.0} / {:.0}) | | | |",
        after128.1, after128.2, after128.3, before128.1, before128.2, before128.3
    )?;
    writeln!(
        r,
        "| collection CPU per scrape, 128 ranks (median of 31, thread CPU) | {:.2} ms | {:.2} ms | | {:.1}x | ≤ 10 ms |",
        after128.4,
        before128.4,
        before128.4 / after128.4
    )?;
    writeln!(r)?;
    writeln!(
        r,
        "Straggler: after: {}. Before: {}.\n",
        after.straggler_note, before.straggler_note
    )?;
    writeln!(
        r,
        "p95 per panel expression, seconds (instant / one-hour range; NaN: not run):\n\n| panel | after, instant | after, range | before, instant | before, range |\n|---|---|---|---|---|"
    )?;
    for (i, (panel, inst, range)) in after.per_panel.iter().enumerate() {
        let (bi, br) = before
            .per_panel
            .get(i)
            .map_or((f64::NAN, f64::NAN), |b| (b.1, b.2));
        writeln!(
            r,
            "| {panel} | {inst:.3} | {range:.3} | {bi:.3} | {br:.3} |"
        )?;
    }
    writeln!(r)?;
    for run in [&after, &before] {
        if !run.instant_errors.is_empty() {
            writeln!(r, "Panels with errors or no data ({}):\n", run.label)?;
            for e in &run.instant_errors {
                writeln!(r, "- {e}")?;
            }
            writeln!(r)?;
        }
    }
    write_report(root, "benchmarks-scale.md", r, &load_before)
}
