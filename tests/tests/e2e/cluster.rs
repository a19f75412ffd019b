//! The cluster deployment of issue 5, end to end: three "nodes" (network
//! namespaces made here), one observer daemon per node, one real Prometheus
//! scraping them with the project's rules, and one MPI job whose ranks are
//! split across the nodes. Every PromQL expression of every dashboard in
//! `dashboards/grafana/` must return data while the job runs, and the
//! cluster-wide totals must be exact once it has ended. The daemons run the
//! bounded `/metrics` of issue 22 (default flags, a node with fewer detail
//! ranks than ranks), and a second scrape job reads `/metrics/ranks` for the
//! main job: a rank without detail on `/metrics` is still drilled into.
//!
//! Also here: the rules and dashboards checked on their own (promtool,
//! dashboard JSON structure), and the systemd unit's capability set proven
//! sufficient by running the daemon unprivileged with exactly that set.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use e2e::{
    Job, Mpi, Need, Proc, compile, free_port, http::Request, http_get, observer_bin, parse_metrics,
    program, require, run_with_timeout, scratch, sum, url_encode, wait_for, workspace_root,
};
use serde_json::Value;

use crate::net::{Net, SIGHUP, kill, write_rsh_agent};

/// Iterations of the counted phase of tests/programs/cluster/steady.c.
const ITERS: u64 = 300;
/// "Nodes" (network namespaces), each with its own daemon.
const NODES: usize = 3;
/// Ranks per node.
const PER_NODE: usize = 2;
const NP: usize = NODES * PER_NODE;
/// The second job: ranks and iterations, all on the last node.
const SMALL_NP: usize = 2;
const SMALL_ITERS: u64 = 100;
/// The port every daemon listens on, at its node's address.
const OBSERVER_PORT: u16 = 9479;
/// The scrape job name the alerts and the overview dashboard expect.
const SCRAPE_JOB: &str = "mpi-observer";
/// The scrape job of `/metrics/ranks`, as in dashboards/deploy/.
const RANKS_JOB: &str = "mpi-observer-ranks";
/// What the `/metrics/ranks` scrape job drops: the four series `/metrics`
/// carries for every rank (dashboards/deploy/prometheus/shard.yml, where the
/// test checks it is the same). The time and request gauges are kept: on
/// `/metrics` only detail ranks have them.
const RANKS_DROP: &str =
    "mpi_rank_info|mpi_rank_up|mpi_rank_mpi_seconds_total|mpi_rank_wall_seconds_total";

/// Metric families that only observers with argument-level metrics (issue 4)
/// export, and the wait states (issue 37, docs/waits.md), also the `stats`
/// layer's (the culprits and waiting ranks only while somebody waited in
/// the last minute: the main job's ring messages between the two ranks of
/// a node make some). Expressions that need them must be valid and may be
/// empty while no daemon exports them; as soon as one does, they must
/// return data.
const OPTIONAL_FAMILIES: [&str; 21] = [
    "mpi_peer_messages_total",
    "mpi_peer_bytes_total",
    "mpi_requests_outstanding",
    "mpi_request_oldest_age_seconds",
    "mpi_job_peer_messages_total",
    "mpi_job_peer_bytes_total",
    "mpi_job_requests_outstanding",
    "mpi_job_request_oldest_age_seconds",
    "mpi_job_request_oldest_rank",
    "mpi_job_wait_seconds_total",
    "mpi_job_wait_instances_total",
    "mpi_job_wait_unresolved_total",
    "mpi_job_wait_records_lost_total",
    "mpi_job_wait_records_invalid_total",
    "mpi_job_wait_sample_period",
    "mpi_job_wait_p2p_sample_period",
    "mpi_job_wait_culprit_rank",
    "mpi_job_wait_culprit_fraction_1m",
    "mpi_job_wait_waiting_rank",
    "mpi_job_wait_waiting_fraction_1m",
    "mpi_job_wait_clock_uncertainty_seconds",
];

/// Of [`OPTIONAL_FAMILIES`], those only a job across nodes whose daemons
/// ship each other their records (`--waits.peers`, waits_nodes.rs) has:
/// this test's daemons are not given each other, so even the main job
/// lacks them, and their panels need only be valid.
const ACROSS_NODES_ONLY: [&str; 1] = ["mpi_job_wait_clock_uncertainty_seconds"];

fn dashboards_dir() -> PathBuf {
    workspace_root().join("dashboards")
}

/// The dashboard JSON files.
fn dashboard_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dashboards_dir().join("grafana"))
        .expect("dashboards/grafana")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    v.sort();
    assert_eq!(v.len(), 3, "three dashboards: cluster, job, rank");
    v
}

/// The Prometheus rules files: every YAML file under dashboards/ with a
/// top-level `groups:` key.
fn rules_files() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dashboards_dir().join("prometheus"))
        .expect("dashboards/prometheus")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .filter(|p| {
            std::fs::read_to_string(p)
                .unwrap()
                .lines()
                .any(|l| l == "groups:")
        })
        .collect();
    v.sort();
    assert!(v.len() >= 2, "recording rules and alerts: {v:?}");
    v
}

/// Copies of the rules files in `dir`, each group that sets its own
/// `interval: 1m` set to 1 s instead, like the tests' scrape intervals, so
/// a test needs no minute to see every rule evaluated.
fn fast_rules(dir: &Path) -> Vec<PathBuf> {
    let dir = dir.join("rules");
    std::fs::create_dir_all(&dir).unwrap();
    let mut own_interval = 0;
    let out = rules_files()
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            own_interval += text.matches("    interval: 1m\n").count();
            let to = dir.join(p.file_name().unwrap());
            std::fs::write(
                &to,
                text.replace("    interval: 1m\n", "    interval: 1s\n"),
            )
            .unwrap();
            to
        })
        .collect();
    assert!(
        own_interval > 0,
        "no rule group sets `interval: 1m` (the latency group): update this test"
    );
    out
}

fn read_json(p: &Path) -> Value {
    let text = std::fs::read_to_string(p).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: invalid JSON: {e}", p.display()))
}

// ---------------------------------------------------------------- HTTP

/// How long one request to Prometheus may take to connect, and between reads.
const HTTP_LIMIT: Duration = Duration::from_secs(15);

/// One sample of an instant query.
#[derive(Debug, Clone)]
struct PromSample {
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A client of Prometheus's HTTP API.
struct Prom {
    addr: String,
}

impl Prom {
    fn get_json(&self, path: &str) -> Value {
        e2e::http::get_json(&self.addr, path, HTTP_LIMIT)
            .unwrap_or_else(|e| panic!("from Prometheus: {e}"))
    }

    /// Evaluates `expr` now. Err carries Prometheus's error for an invalid
    /// expression.
    fn query(&self, expr: &str) -> Result<Vec<PromSample>, String> {
        let form = format!("query={}", url_encode(expr));
        let req = Request {
            method: "POST",
            path: "/api/v1/query",
            headers: &[(
                "Content-Type",
                "application/x-www-form-urlencoded".to_string(),
            )],
            body: form.as_bytes(),
            http10: true,
        };
        let r = e2e::http::send(&self.addr, &req, HTTP_LIMIT)
            .map_err(|e| format!("request failed: {e}"))?;
        let (code, body) = (r.status, r.text());
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| format!("HTTP {code}, not JSON ({e}): {body}"))?;
        if v["status"] != "success" {
            return Err(format!(
                "HTTP {code}: {} {}",
                v["errorType"].as_str().unwrap_or("?"),
                v["error"].as_str().unwrap_or(&body)
            ));
        }
        let value = |pair: &Value| -> f64 {
            let s = pair[1].as_str().unwrap_or("NaN");
            match s {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                _ => s.parse().unwrap_or(f64::NAN),
            }
        };
        let data = &v["data"];
        Ok(match data["resultType"].as_str() {
            Some("vector") => data["result"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| PromSample {
                    labels: r["metric"]
                        .as_object()
                        .unwrap()
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect(),
                    value: value(&r["value"]),
                })
                .collect(),
            Some("scalar") => vec![PromSample {
                labels: BTreeMap::new(),
                value: value(&data["result"]),
            }],
            other => return Err(format!("unexpected result type {other:?}: {body}")),
        })
    }

    /// The single value of an aggregating `expr`, if it has one yet.
    fn value(&self, expr: &str) -> Option<f64> {
        let r = self
            .query(expr)
            .unwrap_or_else(|e| panic!("query {expr}: {e}"));
        assert!(r.len() <= 1, "{expr} returned several series: {r:?}");
        r.first().map(|s| s.value)
    }

    /// Waits until `expr` has the value `want`; panics with the last value.
    fn wait_value(&self, expr: &str, want: f64, limit: Duration) {
        let start = Instant::now();
        loop {
            let got = self.value(expr);
            if got == Some(want) {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "Prometheus: {expr} is {got:?} after {limit:?}, want {want}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Values of a label over the series matching `selector`, as Grafana's
    /// `label_values(selector, label)` asks for them.
    fn label_values(&self, selector: &str, label: &str) -> Vec<String> {
        let v = self.get_json(&format!(
            "/api/v1/label/{label}/values?match[]={}",
            url_encode(selector)
        ));
        assert_eq!(v["status"], "success", "label values: {v}");
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_str().unwrap().to_string())
            .collect()
    }
}

// ---------------------------------------------------------------- processes

/// The MPI job: tests/programs/cluster/steady.c across the nodes, with
/// the harness's launcher (steady.c holds twice: at `go`, then at `stop`
/// once it printed DONE, so the test reads the totals before it ends).
fn start_steady(cmd: Command, dir: &Path, iters: u64, np: usize) -> Job {
    let exe = dir.join("steady");
    compile(Mpi::OpenMpi, &program("cluster/steady.c"), &exe, &[]);
    let mut cmd = cmd;
    cmd.arg(&exe).arg(iters.to_string());
    Job::spawn_held(cmd, np as u32, dir.join("go"), dir.join("stop"))
}

/// Calls each rank of steady.c makes in a run of `iters` iterations:
/// (function, per rank).
fn expected_calls(iters: u64) -> Vec<(&'static str, u64)> {
    vec![
        ("MPI_Isend", iters),
        ("MPI_Irecv", iters + 1),
        ("MPI_Waitall", iters),
        ("MPI_Allreduce", iters),
        ("MPI_Bcast", iters),
        ("MPI_Alltoall", iters),
        ("MPI_Barrier", iters),
        ("MPI_Send", 1),
        ("MPI_Wait", 1),
        ("MPI_Finalize", 1),
    ]
}

// ---------------------------------------------------------------- dashboards

/// A PromQL expression of a dashboard and where it comes from.
struct DashExpr {
    place: String,
    expr: String,
}

/// Every panel, rows' nested panels included.
fn panels(dash: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner.iter());
        }
    }
    out
}

/// Every target expression of every panel of the dashboard.
fn panel_exprs(path: &Path, dash: &Value) -> Vec<DashExpr> {
    let file = path.file_name().unwrap().to_string_lossy().into_owned();
    let mut out = Vec::new();
    for p in panels(dash) {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(DashExpr {
                place: format!(
                    "{file}: panel {:?} target {}",
                    p["title"].as_str().unwrap_or(""),
                    t["refId"].as_str().unwrap_or("?")
                ),
                expr: t["expr"].as_str().unwrap_or_default().to_string(),
            });
        }
    }
    out
}

/// The dashboard's query variables: (name, label_values selector, label).
fn label_values_vars(dash: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for v in dash["templating"]["list"].as_array().unwrap() {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .unwrap_or_default();
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {}: not a label_values query: {q}", v["name"]));
        let (sel, label) = inner.rsplit_once(',').unwrap();
        out.push((
            v["name"].as_str().unwrap().to_string(),
            sel.trim().to_string(),
            label.trim().to_string(),
        ));
    }
    out
}

/// Grafana's built-in variables the dashboards may use in expressions.
const BUILTINS: [&str; 3] = ["__rate_interval", "__interval", "__range"];

/// The `$name` and `${name...}` variable references in `s`.
fn var_refs(s: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'$' {
            let braced = b.get(i + 1) == Some(&b'{');
            let start = i + 1 + usize::from(braced);
            let mut end = start;
            while end < b.len() && (b[end].is_ascii_alphanumeric() || b[end] == b'_') {
                end += 1;
            }
            if end > start {
                out.insert(s[start..end].to_string());
            }
            i = end.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

/// Replaces the template variables in `s` by `vars`, in the `$x`, `${x}`
/// and `${x:format}` forms.
fn substitute(s: &str, vars: &BTreeMap<&str, String>) -> String {
    let mut out = s.to_string();
    // Longest names first, so `$__rate_interval` is not cut short by a
    // variable named `__rate`.
    let mut names: Vec<&&str> = vars.keys().collect();
    names.sort_by_key(|n| std::cmp::Reverse(n.len()));
    for n in names {
        let v = &vars[*n];
        while let Some(pos) = out.find(&format!("${{{n}:")) {
            let end = pos + out[pos..].find('}').unwrap();
            out.replace_range(pos..=end, v);
        }
        out = out.replace(&format!("${{{n}}}"), v);
        out = out.replace(&format!("${n}"), v);
    }
    out
}

// ---------------------------------------------------------------- tests

#[test]
fn dashboards_are_valid_grafana_json() {
    let mut uids = BTreeSet::new();
    let mut vars_seen = BTreeSet::new();
    for path in dashboard_files() {
        let d = read_json(&path);
        let f = path.display();
        assert!(
            d["schemaVersion"].as_u64().is_some_and(|v| v >= 39),
            "{f}: schemaVersion must be >= 39"
        );
        for k in ["title", "uid"] {
            assert!(d[k].as_str().is_some_and(|s| !s.is_empty()), "{f}: no {k}");
        }
        assert!(
            uids.insert(d["uid"].as_str().unwrap().to_string()),
            "{f}: uid reused"
        );
        assert!(d["time"]["from"].is_string(), "{f}: no time range");

        // Templating: a Prometheus datasource variable first, then
        // label_values variables that query through it.
        let vars = d["templating"]["list"].as_array().expect("templating.list");
        let ds = vars
            .iter()
            .find(|v| v["type"] == "datasource")
            .unwrap_or_else(|| panic!("{f}: no datasource variable"));
        assert_eq!(ds["name"], "datasource", "{f}");
        assert_eq!(ds["query"], "prometheus", "{f}: datasource variable type");
        let mut names = BTreeSet::new();
        for v in vars {
            let name = v["name"].as_str().expect("variable name");
            assert!(names.insert(name), "{f}: variable {name} defined twice");
            if v["type"] == "query" {
                assert_eq!(
                    v["datasource"]["uid"], "${datasource}",
                    "{f}: variable {name}"
                );
            }
        }
        for (name, sel, label) in label_values_vars(&d) {
            assert!(!sel.is_empty() && !label.is_empty(), "{f}: variable {name}");
            vars_seen.insert(name);
        }
        assert!(names.contains("jobid"), "{f}: no jobid variable");
        assert!(names.contains("function"), "{f}: no function variable");

        // Panels: unique ids, inside the 24-column grid, every query through
        // the datasource variable.
        let mut ids = BTreeSet::new();
        let mut targets = 0;
        let mut cells: BTreeMap<(u64, u64), &str> = BTreeMap::new();
        for p in panels(&d) {
            let title = p["title"].as_str().unwrap_or("");
            assert!(p["type"].is_string(), "{f}: panel {title}: no type");
            assert!(
                ids.insert(p["id"].as_u64().expect("panel id")),
                "{f}: panel id reused"
            );
            let g = &p["gridPos"];
            let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
            assert!(
                x + w <= 24 && g["h"].as_u64().unwrap() > 0,
                "{f}: {title}: gridPos"
            );
            // No two panels on the same grid cell.
            let (y, h) = (g["y"].as_u64().unwrap(), g["h"].as_u64().unwrap());
            for cx in x..x + w {
                for cy in y..y + h {
                    if let Some(other) = cells.insert((cx, cy), title) {
                        panic!("{f}: panels {other:?} and {title:?} overlap at ({cx}, {cy})");
                    }
                }
            }
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{f}: panel {title}"
            );
            assert_eq!(p["datasource"]["type"], "prometheus", "{f}: panel {title}");
            let ts = p["targets"]
                .as_array()
                .unwrap_or_else(|| panic!("{f}: {title}: no targets"));
            assert!(!ts.is_empty(), "{f}: panel {title} has no targets");
            for t in ts {
                targets += 1;
                assert_eq!(
                    t["datasource"]["uid"], "${datasource}",
                    "{f}: panel {title}"
                );
                let expr = t["expr"].as_str().unwrap_or_default();
                assert!(!expr.trim().is_empty(), "{f}: panel {title}: empty expr");
                for r in var_refs(expr) {
                    assert!(
                        names.contains(r.as_str()) || BUILTINS.contains(&r.as_str()),
                        "{f}: panel {title} uses undefined variable ${r}"
                    );
                }
            }
        }
        assert!(targets >= 10, "{f}: only {targets} queries");

        // No datasource pinned by UID anywhere: every "datasource" object
        // names the variable (or Grafana's own annotation source).
        fn walk(v: &Value, f: &str) {
            match v {
                Value::Object(m) => {
                    if let Some(ds) = m.get("datasource") {
                        let uid = match ds {
                            Value::Object(o) => o.get("uid").and_then(Value::as_str),
                            Value::String(s) => Some(s.as_str()),
                            _ => None,
                        };
                        if let Some(uid) = uid {
                            assert!(
                                uid.starts_with("${") || uid == "-- Grafana --",
                                "{f}: hard-coded datasource {uid:?}"
                            );
                        }
                    }
                    m.values().for_each(|x| walk(x, f));
                }
                Value::Array(a) => a.iter().for_each(|x| walk(x, f)),
                _ => {}
            }
        }
        walk(&d, &f.to_string());
    }
    for v in ["jobid", "function"] {
        assert!(vars_seen.contains(v), "no label_values variable {v}");
    }
    // A job may have 64,000 ranks: the rank is typed, never listed.
    assert!(!vars_seen.contains("rank"), "a rank variable lists ranks");
    let rank_vars: Vec<String> = dashboard_files()
        .iter()
        .flat_map(|p| {
            let d = read_json(p);
            d["templating"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|v| v["name"] == "rank")
                .map(|v| format!("{}: {}", p.display(), v["type"]))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(!rank_vars.is_empty(), "no rank variable");
    for v in &rank_vars {
        assert!(
            v.ends_with("\"textbox\""),
            "the rank variable is a text box: {v}"
        );
    }
}

/// The metric and recording-rule names a text reads, each with the label
/// selector written right after it (`None` when there is none):
/// identifiers that start with `mpi_` or contain a `:`. With `quotes`,
/// text inside double quotes is skipped (PromQL strings); rules files are
/// scanned whole, their comments left out.
fn series_refs(text: &str, quotes: bool) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let (mut i, mut quoted) = (0, false);
    while i < b.len() {
        let c = b[i];
        if quotes && c == b'"' {
            quoted = !quoted;
            i += 1;
        } else if !quoted && (c.is_ascii_alphabetic() || c == b'_') {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':') {
                i += 1;
            }
            let w = &text[start..i];
            if w.starts_with("mpi_") || w.contains(':') {
                let sel = text[i..]
                    .trim_start()
                    .strip_prefix('{')
                    .and_then(|s| s.split_once('}'))
                    .map(|(s, _)| s.to_string());
                out.push((w.to_string(), sel));
            }
        } else {
            i += 1;
        }
    }
    out
}

/// The four series `/metrics` has for every rank (issue 22): at 64 k ranks,
/// 64 k series per family.
const EVERY_RANK: [&str; 4] = [
    "mpi_rank_info",
    "mpi_rank_up",
    "mpi_rank_mpi_seconds_total",
    "mpi_rank_wall_seconds_total",
];

/// Families exported per job and node, or by the daemon about itself; the
/// detail-rank marks (a few per job and node); the per-job latency
/// histogram (`rank=""`). What any panel or rule may read whole.
fn bounded_family(name: &str, selector: Option<&str>) -> bool {
    name.starts_with("mpi_job_")
        || name.starts_with("mpi_observer_")
        || name == "mpi_rank_detail"
        || (name.starts_with("mpi_call_duration_seconds")
            && selector.is_some_and(|s| s.contains("rank=\"\"")))
}

/// The recording rules' names, from recording.rules.yml.
fn recorded_names() -> BTreeSet<String> {
    std::fs::read_to_string(dashboards_dir().join("prometheus/recording.rules.yml"))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- record: "))
        .map(|n| n.trim().to_string())
        .collect()
}

/// What each panel and rule may read, so that they work at 64 k ranks on
/// 1,000 nodes (issue 22): job-level series, recording rules, the
/// detail-rank marks and the per-job histogram anywhere, each at most
/// nodes x functions series; a per-rank family (one series per rank, even
/// the four every rank has) only with the rank dashboard's single-rank
/// selector `rank="$rank"`, in every place it is selected; the per-rank
/// detail families only in panels whose description says where that
/// detail comes from. No rule or alert reads a per-rank family at all.
#[test]
fn dashboards_read_bounded_series() {
    let rules = recorded_names();
    assert!(rules.len() >= 10, "recording rules: {rules:?}");
    let mut detail_panels = 0;
    let mut one_rank = 0;
    for path in dashboard_files() {
        let d = read_json(&path);
        let f = path.file_name().unwrap().to_string_lossy().into_owned();
        for p in panels(&d) {
            let title = p["title"].as_str().unwrap_or("");
            let description = p["description"].as_str().unwrap_or("");
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap_or_default();
                for (n, sel) in series_refs(expr, true) {
                    let place = format!("{f}: panel {title:?}: {n} in {expr}");
                    if n.contains(':') {
                        assert!(rules.contains(&n), "{place}: no such recording rule");
                        continue;
                    }
                    if bounded_family(&n, sel.as_deref()) {
                        continue;
                    }
                    assert!(
                        sel.as_deref().is_some_and(|s| s.contains("rank=\"$rank\"")),
                        "{place}: a per-rank series read without the single-rank selector rank=\"$rank\" \
                         (64 k series at 64 k ranks)"
                    );
                    one_rank += 1;
                    if !EVERY_RANK.contains(&n.as_str()) {
                        assert!(
                            description.contains("Detail series"),
                            "{place}: the description must say where the detail comes from"
                        );
                        detail_panels += 1;
                    }
                }
            }
        }
    }
    assert!(one_rank >= 10, "the rank dashboard reads its rank");
    assert!(detail_panels >= 5, "the rank dashboard drills into detail");
    // The rules and alerts (annotation templates included) read job-level
    // series only.
    for path in rules_files() {
        let text: String = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .map(|l| format!("{l}\n"))
            .collect();
        let refs = series_refs(&text, false);
        assert!(!refs.is_empty(), "{}: reads nothing", path.display());
        for (n, sel) in refs {
            assert!(
                n.contains(':') || bounded_family(&n, sel.as_deref()),
                "{}: {n}{{{}}} is a per-rank series: a rule over it reads every rank",
                path.display(),
                sel.unwrap_or_default()
            );
        }
    }
}

#[test]
fn rules_pass_promtool() {
    if !require(&[Need::Command("promtool")]) {
        return;
    }
    let dir = dashboards_dir().join("prometheus");
    for f in rules_files() {
        let o = run_with_timeout(
            Command::new("promtool").arg("check").arg("rules").arg(&f),
            Duration::from_secs(60),
        );
        assert!(
            o.status.success(),
            "promtool check rules {}:\n{}{}",
            f.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    // The alert thresholds, pinned by unit tests.
    let o = run_with_timeout(
        Command::new("promtool")
            .current_dir(&dir)
            .args(["test", "rules", "alerts.test.yml"]),
        Duration::from_secs(60),
    );
    assert!(
        o.status.success(),
        "promtool test rules:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    // The example configuration, with its paths pointed into the checkout.
    let tmp = scratch("cluster-config");
    let example = std::fs::read_to_string(dir.join("prometheus.yml")).unwrap();
    let cfg = example
        .replace(
            "/etc/prometheus/rules/mpi-observer",
            &dir.display().to_string(),
        )
        .replace(
            "/etc/prometheus/targets/mpi-observer",
            &dir.join("targets").display().to_string(),
        );
    assert_ne!(
        cfg, example,
        "the example config's paths changed: update this test"
    );
    std::fs::write(tmp.join("prometheus.yml"), cfg).unwrap();
    let o = run_with_timeout(
        Command::new("promtool")
            .args(["check", "config"])
            .arg(tmp.join("prometheus.yml")),
        Duration::from_secs(60),
    );
    assert!(
        o.status.success(),
        "promtool check config (example):\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The arguments of an `/etc/default` file's `ARGS="..."` line (none of
/// ours has a space inside an argument).
fn default_args(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("ARGS=\""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap_or_else(|| panic!("{}: no ARGS=\"...\" line", path.display()));
    line.split_whitespace().map(str::to_string).collect()
}

/// `s` with `from` replaced by `to`, which must occur.
fn must_replace(s: &str, from: &str, to: &str) -> String {
    assert!(
        s.contains(from),
        "{from:?} is no longer in the file: update this test"
    );
    s.replace(from, to)
}

/// Runs `cmd`, which must succeed within a minute.
fn run_ok(what: &str, cmd: &mut Command) {
    let o = run_with_timeout(cmd, Duration::from_secs(60));
    assert!(
        o.status.success(),
        "{what}:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Waits for an HTTP 200 from `path` on `addr` while `p` runs.
fn wait_http_ok(p: &mut Proc, addr: &str, path: &str) {
    wait_for(
        &format!("{} to answer {path}", p.name),
        Duration::from_secs(60),
        || {
            p.assert_running();
            http_get(addr, path).ok().filter(|(c, _)| *c == 200)
        },
    );
}

/// The scale-out configurations of dashboards/deploy/ (issue 22), run for
/// real where the tool allows: four Prometheus shards and four vmagent
/// cluster members scrape 40 (silent) node addresses and remote-write into
/// a real VictoriaMetrics started with the documented flags; every node
/// must be scraped by exactly one shard (both scrape jobs on the same one)
/// and by exactly `replicationFactor` vmagent members. vmalert evaluates
/// every project rule against that VictoriaMetrics without an error. The
/// remote-write block is the same for every store; the units verify.
#[test]
fn deploy_configs_check() {
    if !require(&[
        Need::Command("promtool"),
        Need::Command("prometheus"),
        Need::Command("victoria-metrics"),
        Need::Command("vmagent"),
        Need::Command("vmalert"),
        Need::Command("systemd-analyze"),
    ]) {
        return;
    }
    const SHARDS: usize = 4;
    const NODES: usize = 40;
    let deploy = dashboards_dir().join("deploy");
    let rules_dir = dashboards_dir().join("prometheus");
    let dir = scratch("cluster-deploy");
    // Nothing listens on these: each scrape fails fast and still records
    // `up`, which is all the partition needs.
    let nodes: Vec<String> = (0..NODES)
        .map(|i| format!("127.0.0.{}:1", 10 + i))
        .collect();
    let quoted: Vec<String> = nodes.iter().map(|n| format!("\"{n}\"")).collect();
    std::fs::write(
        dir.join("targets.json"),
        format!("[{{\"targets\": [{}]}}]\n", quoted.join(", ")),
    )
    .unwrap();
    let targets_glob = dir.join("*.json").display().to_string();

    // VictoriaMetrics, as raw.default runs it (its storage path and port
    // moved here; samples visible after 1 s instead of 30 s). The
    // long-term store's flags exist too.
    let vm_addr = format!("127.0.0.1:{}", free_port());
    let mut vm_args: Vec<String> = default_args(&deploy.join("victoria-metrics/raw.default"))
        .into_iter()
        .filter(|a| !a.starts_with("-storageDataPath="))
        .collect();
    vm_args.extend([
        format!("-storageDataPath={}", dir.join("vm").display()),
        format!("-httpListenAddr={vm_addr}"),
        "-search.latencyOffset=1s".into(),
        "-loggerLevel=ERROR".into(),
    ]);
    let mut vm = Proc::spawn(
        "victoria-metrics",
        Command::new("victoria-metrics").args(&vm_args),
        dir.join("vm.log"),
    );
    wait_http_ok(&mut vm, &vm_addr, "/health");
    {
        let addr = format!("127.0.0.1:{}", free_port());
        let mut args: Vec<String> =
            default_args(&deploy.join("victoria-metrics/long-term.default"))
                .into_iter()
                .filter(|a| {
                    !a.starts_with("-storageDataPath=") && !a.starts_with("-httpListenAddr=")
                })
                .collect();
        args.extend([
            format!("-storageDataPath={}", dir.join("vm-long").display()),
            format!("-httpListenAddr={addr}"),
        ]);
        let mut long = Proc::spawn(
            "victoria-metrics (long-term)",
            Command::new("victoria-metrics").args(&args),
            dir.join("vm-long.log"),
        );
        wait_http_ok(&mut long, &addr, "/health");
    }
    let store = Prom {
        addr: vm_addr.clone(),
    };

    // The Prometheus shards: each config valid as a server and as an agent,
    // then run (every second instead of every 15 s).
    let shard_cfg = std::fs::read_to_string(deploy.join("prometheus/shard.yml")).unwrap();
    // The cluster test's /metrics/ranks job drops what these drop.
    for f in ["prometheus/shard.yml", "vmagent/scrape.yml"] {
        let text = std::fs::read_to_string(deploy.join(f)).unwrap();
        assert!(
            text.contains(&format!("regex: '{RANKS_DROP}'")),
            "{f}: the /metrics/ranks job must drop {RANKS_DROP}"
        );
    }
    let mut shards = Vec::new();
    for i in 0..SHARDS {
        let mut cfg = must_replace(&shard_cfg, "regex: \"0\"", &format!("regex: \"{i}\""));
        cfg = must_replace(&cfg, "shard: \"0\"", &format!("shard: \"{i}\""));
        cfg = must_replace(&cfg, "modulus: 4", &format!("modulus: {SHARDS}"));
        cfg = must_replace(
            &cfg,
            "/etc/prometheus/targets/mpi-observer/*.json",
            &targets_glob,
        );
        cfg = must_replace(
            &cfg,
            "http://victoria-metrics:8428/api/v1/write",
            &format!("http://{vm_addr}/api/v1/write"),
        );
        let path = dir.join(format!("shard{i}.yml"));
        std::fs::write(&path, &cfg).unwrap();
        for agent in [false, true] {
            let mut c = Command::new("promtool");
            c.args(["check", "config"]);
            if agent {
                c.arg("--agent");
            }
            run_ok(&format!("promtool check config shard {i}"), c.arg(&path));
        }
        cfg = must_replace(&cfg, "scrape_interval: 15s", "scrape_interval: 1s");
        cfg = must_replace(&cfg, "scrape_timeout: 10s", "scrape_timeout: 500ms");
        cfg = must_replace(&cfg, "scrape_interval: 1m", "scrape_interval: 2s");
        cfg = must_replace(&cfg, "scrape_timeout: 30s", "scrape_timeout: 1s");
        cfg = cfg.replace("refresh_interval: 1m", "refresh_interval: 1s");
        std::fs::write(&path, &cfg).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let p = Proc::spawn(
            &format!("prometheus shard {i}"),
            Command::new("prometheus")
                .arg(format!("--config.file={}", path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join(format!("tsdb{i}")).display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=error"),
            dir.join(format!("shard{i}.log")),
        );
        shards.push((p, addr));
    }
    // Each node's two scrape jobs land in the store from exactly one shard.
    let up = wait_for(
        "every node's `up` from the shards in VictoriaMetrics",
        Duration::from_secs(90),
        || {
            for (p, _) in &mut shards {
                p.assert_running();
            }
            let r = store.query("up{shard!=\"\"}").ok()?;
            (r.len() >= 2 * NODES).then_some(r)
        },
    );
    let mut shard_of: BTreeMap<(String, String), String> = BTreeMap::new();
    for s in &up {
        let key = (s.labels["job"].clone(), s.labels["instance"].clone());
        assert!(
            shard_of
                .insert(key.clone(), s.labels["shard"].clone())
                .is_none(),
            "{key:?} scraped by two shards: {up:?}"
        );
    }
    assert_eq!(shard_of.len(), 2 * NODES, "{shard_of:?}");
    for n in &nodes {
        let host = n.split(':').next().unwrap().to_string();
        let a = &shard_of[&("mpi-observer".to_string(), host.clone())];
        let b = &shard_of[&("mpi-observer-ranks".to_string(), host.clone())];
        assert_eq!(
            a, b,
            "{host}: /metrics and /metrics/ranks on different shards"
        );
    }
    let used: BTreeSet<&String> = shard_of.values().collect();
    assert_eq!(used.len(), SHARDS, "every shard takes nodes: {shard_of:?}");
    // The detail scrape asks for the chosen jobs.
    let t = Prom {
        addr: shards[0].1.clone(),
    }
    .get_json("/api/v1/targets");
    let urls: Vec<&str> = t["data"]["activeTargets"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["scrapeUrl"].as_str())
        .filter(|u| u.contains("/metrics/ranks"))
        .collect();
    assert!(
        !urls.is_empty()
            && urls
                .iter()
                .all(|u| u.ends_with("/metrics/ranks?jobid=12345&jobid=12346")),
        "{urls:?}"
    );
    drop(shards);

    // vmagent: the documented arguments pass its own check for every member;
    // then the members run, writing to the store instead of the three
    // cluster URLs.
    let va_args = default_args(&deploy.join("vmagent/vmagent.default"));
    let va_scrape = dir.join("vmagent-scrape.yml");
    let scrape = std::fs::read_to_string(deploy.join("vmagent/scrape.yml")).unwrap();
    let scrape = must_replace(
        &scrape,
        "/etc/vmagent/targets/mpi-observer/*.json",
        &targets_glob,
    );
    std::fs::write(&va_scrape, &scrape).unwrap();
    let local = |a: &String| -> String {
        a.replace("/etc/vmagent/scrape.yml", &va_scrape.display().to_string())
            .replace(
                "/etc/vmagent/",
                &format!("{}/", deploy.join("vmagent").display()),
            )
            .replace(
                "/var/lib/vmagent",
                &dir.join("vmagent-check").display().to_string(),
            )
    };
    let flag = |name: &str| -> usize {
        va_args
            .iter()
            .find_map(|a| a.strip_prefix(&format!("-{name}=")))
            .unwrap_or_else(|| panic!("vmagent.default: no -{name}"))
            .parse()
            .unwrap()
    };
    let (members, replication) = (
        flag("promscrape.cluster.membersCount"),
        flag("promscrape.cluster.replicationFactor"),
    );
    assert!(replication > 1 && members > replication, "{va_args:?}");
    for m in 0..members {
        run_ok(
            &format!("vmagent -dryRun, member {m}"),
            Command::new("vmagent")
                .arg("-dryRun")
                .args(va_args.iter().map(local))
                .arg(format!("-promscrape.cluster.memberNum={m}")),
        );
    }
    let scrape = must_replace(&scrape, "scrape_interval: 15s", "scrape_interval: 1s");
    let scrape = must_replace(&scrape, "scrape_timeout: 10s", "scrape_timeout: 500ms");
    let scrape = must_replace(&scrape, "scrape_interval: 1m", "scrape_interval: 2s");
    let scrape = must_replace(&scrape, "scrape_timeout: 30s", "scrape_timeout: 1s");
    std::fs::write(&va_scrape, &scrape).unwrap();
    let mut agents = Vec::new();
    for m in 0..members {
        let addr = format!("127.0.0.1:{}", free_port());
        let args: Vec<String> = va_args
            .iter()
            .filter(|a| {
                !a.starts_with("-remoteWrite.url")
                    && !a.starts_with("-remoteWrite.tmpDataPath")
                    && !a.starts_with("-httpListenAddr")
            })
            .map(local)
            .collect();
        let p = Proc::spawn(
            &format!("vmagent member {m}"),
            Command::new("vmagent")
                .args(&args)
                .arg(format!("-promscrape.cluster.memberNum={m}"))
                .arg(format!("-remoteWrite.url=http://{vm_addr}/api/v1/write"))
                .arg(format!(
                    "-remoteWrite.tmpDataPath={}",
                    dir.join(format!("vmagent{m}")).display()
                ))
                .arg(format!("-httpListenAddr={addr}"))
                .arg("-loggerLevel=ERROR"),
            dir.join(format!("vmagent{m}.log")),
        );
        agents.push((p, addr));
    }
    // Every (job, node) is an active target of exactly `replication` members.
    let mut scraped_by: BTreeMap<(String, String), usize> = BTreeMap::new();
    for (p, addr) in &mut agents {
        wait_http_ok(p, addr, "/api/v1/targets");
        let t = Prom { addr: addr.clone() }.get_json("/api/v1/targets");
        for x in t["data"]["activeTargets"].as_array().unwrap() {
            let key = (
                x["labels"]["job"].as_str().unwrap().to_string(),
                x["labels"]["instance"].as_str().unwrap().to_string(),
            );
            *scraped_by.entry(key).or_default() += 1;
        }
    }
    assert_eq!(scraped_by.len(), 2 * NODES, "{scraped_by:?}");
    assert!(
        scraped_by.values().all(|&n| n == replication),
        "each target scraped by {replication} members: {scraped_by:?}"
    );
    // Their writes arrive, deduplicated to one series per target.
    wait_for(
        "every node's `up` from the vmagent members",
        Duration::from_secs(90),
        || {
            for (p, _) in &mut agents {
                p.assert_running();
            }
            let r = store.query("up{shard=\"\"}").ok()?;
            (r.len() == 2 * NODES).then_some(())
        },
    );
    drop(agents);

    // vmalert: the documented arguments pass its check (rules and templates
    // validated as MetricsQL); then every rule evaluates against the store
    // without an error.
    let local_rules = |a: &String| {
        a.replace(
            "/etc/mpi-observer/rules/",
            &format!("{}/", rules_dir.display()),
        )
    };
    let vma_args = default_args(&deploy.join("vmalert/vmalert.default"));
    run_ok(
        "vmalert -dryRun",
        Command::new("vmalert")
            .arg("-dryRun")
            .args(vma_args.iter().map(local_rules))
            .arg("-loggerLevel=ERROR"),
    );
    // It runs the same rules with the latency group's minute cut to a
    // second, so every group evaluates twice within the wait below.
    let fast_dir = fast_rules(&dir)[0].parent().unwrap().to_path_buf();
    let alert_addr = format!("127.0.0.1:{}", free_port());
    let mut vmalert = Proc::spawn(
        "vmalert",
        Command::new("vmalert")
            .args(
                vma_args
                    .iter()
                    .filter(|a| a.starts_with("-rule="))
                    .map(|a| {
                        a.replace(
                            "/etc/mpi-observer/rules/",
                            &format!("{}/", fast_dir.display()),
                        )
                    }),
            )
            .arg(format!("-datasource.url=http://{vm_addr}"))
            .arg(format!("-remoteWrite.url=http://{vm_addr}"))
            // Nothing fires on this data; an unreachable notifier is never
            // called.
            .arg("-notifier.url=http://127.0.0.1:1")
            .arg("-evaluationInterval=1s")
            .arg(format!("-httpListenAddr={alert_addr}")),
        dir.join("vmalert.log"),
    );
    let rules = recorded_names().len();
    let errors = wait_for(
        "vmalert to evaluate every rule twice",
        Duration::from_secs(60),
        || {
            vmalert.assert_running();
            let (_, body) = http_get(&alert_addr, "/metrics").ok()?;
            let s = parse_metrics(&body);
            let errs: Vec<_> = s
                .iter()
                .filter(|x| x.name.ends_with("_rules_error"))
                .map(|x| (x.labels.clone(), x.value))
                .collect();
            (errs.len() > rules
                && sum(&s, "vmalert_execution_total", &[]) >= 2.0 * errs.len() as f64)
                .then_some((errs, sum(&s, "vmalert_execution_errors_total", &[])))
        },
    );
    assert_eq!(
        errors.1,
        0.0,
        "vmalert failed evaluations: see {}",
        dir.join("vmalert.log").display()
    );
    assert!(
        errors.0.iter().all(|(_, v)| *v == 0.0),
        "rules in error under vmalert: {:?}",
        errors.0
    );
    drop(vmalert);
    vm.assert_running();

    // One remote-write block for every store: only the URL (and Mimir's
    // tenant header) differ.
    let block = |text: &str| -> String {
        let start = text.find("    queue_config:").expect("queue_config");
        text[start..].to_string()
    };
    let want = block(&shard_cfg);
    let mut stores = 0;
    for e in std::fs::read_dir(deploy.join("remote-write")).unwrap() {
        let path = e.unwrap().path();
        run_ok(
            &format!("promtool check config {}", path.display()),
            Command::new("promtool")
                .args(["check", "config"])
                .arg(&path),
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            block(&text),
            want,
            "{}: not the shard's block",
            path.display()
        );
        stores += 1;
    }
    assert_eq!(
        stores, 4,
        "VictoriaMetrics, its cluster, Mimir, Thanos Receive"
    );

    // The units.
    std::fs::copy(
        deploy.join("vmagent/vmagent@.service"),
        dir.join("vmagent@0.service"),
    )
    .unwrap();
    std::fs::copy(
        deploy.join("vmalert/vmalert.service"),
        dir.join("vmalert.service"),
    )
    .unwrap();
    for unit in ["vmagent@0.service", "vmalert.service"] {
        let o = run_with_timeout(
            Command::new("systemd-analyze")
                .arg("verify")
                .arg(dir.join(unit)),
            Duration::from_secs(60),
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && !err.contains(unit),
            "systemd-analyze verify {unit}:\n{err}"
        );
    }
}

/// The shim library, as `mpi-observer shim-path` names it.
fn shim_path() -> String {
    let o = run_with_timeout(
        Command::new(observer_bin()).arg("shim-path"),
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "mpi-observer shim-path failed");
    let p = String::from_utf8(o.stdout).unwrap().trim().to_string();
    assert!(Path::new(&p).exists(), "mpi-observer shim-path: {p}");
    p
}

/// The capabilities the systemd unit grants.
fn unit_capabilities() -> Vec<String> {
    let unit =
        std::fs::read_to_string(dashboards_dir().join("deploy/mpi-observer.service")).unwrap();
    let line = |key: &str| -> Vec<String> {
        unit.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("the unit has no {key}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let ambient = line("AmbientCapabilities=");
    assert_eq!(
        ambient,
        line("CapabilityBoundingSet="),
        "the bounding set must be exactly the ambient set"
    );
    ambient
}

#[test]
fn systemd_unit_verifies() {
    if !require(&[Need::Command("systemd-analyze")]) {
        return;
    }
    let dir = scratch("cluster-unit");
    let unit =
        std::fs::read_to_string(dashboards_dir().join("deploy/mpi-observer.service")).unwrap();
    // The options are the site's, in the package's conffile; TLS and basic
    // auth stay in the unit.
    assert!(unit.contains(
        "ExecStart=/usr/bin/mpi-observer attach --web.config.file %d/web-config.yml $MPI_OBSERVER_OPTS"
    ));
    assert!(unit.contains("EnvironmentFile=/etc/default/mpi-observer"));
    let defaults = std::fs::read_to_string(
        e2e::workspace_root().join("packaging/debian/mpi-observer.default"),
    )
    .unwrap();
    assert!(defaults.contains("\nMPI_OBSERVER_OPTS=\"--all --listen 0.0.0.0:9479\"\n"));
    assert!(unit.contains("NoNewPrivileges=yes") && unit.contains("\nUser=mpi-observer\n"));
    // verify checks that ExecStart= and ExecStartPre= exist: point them at
    // the built binary and the package's script.
    let local = unit
        .replace(
            "/usr/lib/mpi-observer/pin-dir",
            &e2e::workspace_root()
                .join("packaging/debian/pin-dir")
                .display()
                .to_string(),
        )
        .replace(
            "/usr/bin/mpi-observer",
            &observer_bin().display().to_string(),
        );
    let path = dir.join("mpi-observer.service");
    std::fs::write(&path, local).unwrap();
    let o = run_with_timeout(
        Command::new("systemd-analyze").arg("verify").arg(&path),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "systemd-analyze verify:\n{err}");
    assert!(
        !err.contains("mpi-observer.service"),
        "systemd-analyze verify warns about the unit:\n{err}"
    );
}

/// Runs the daemon as an unprivileged user (nobody) holding exactly the
/// unit's capabilities, on a real job of root-owned ranks: the counts must
/// be exact.
#[test]
fn least_privilege_capabilities_suffice() {
    if !require(&[
        Need::Root,
        Need::Mpi(Mpi::OpenMpi),
        Need::Command("setpriv"),
    ]) {
        return;
    }
    let dir = scratch("cluster-least-privilege");
    let caps = unit_capabilities();
    let set = caps
        .iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect::<Vec<_>>()
        .join(",");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut daemon = Proc::spawn(
        "unprivileged daemon",
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(format!("--inh-caps=-all,{set}"))
            .arg(format!("--ambient-caps=-all,{set}"))
            .arg(format!("--bounding-set=-all,{set}"))
            .arg("--no-new-privs")
            .arg(observer_bin())
            .args(["attach", "--all", "--listen", &addr]),
        dir.join("daemon.log"),
    );
    wait_for(
        "the unprivileged daemon to serve",
        Duration::from_secs(90),
        || {
            daemon.assert_running();
            http_get(&addr, "/metrics").ok().filter(|(c, _)| *c == 200)
        },
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap()
            .trim()
            .to_string()
    };
    assert!(
        field("Uid:").starts_with("65534"),
        "the daemon runs as nobody"
    );
    let want: u64 = caps
        .iter()
        .map(|c| {
            1u64 << match c.as_str() {
                "CAP_DAC_READ_SEARCH" => 2,
                "CAP_NET_ADMIN" => 12,
                "CAP_SYS_PTRACE" => 19,
                "CAP_PERFMON" => 38,
                "CAP_BPF" => 39,
                other => panic!("unexpected capability {other} in the unit"),
            }
        })
        .sum();
    assert_eq!(
        u64::from_str_radix(&field("CapEff:"), 16).unwrap(),
        want,
        "the daemon holds exactly the unit's capabilities"
    );

    let iters = 50;
    // With the stats layer, so the segments' figures (0600 files of the
    // ranks' user in /dev/shm) are covered too.
    let mut launcher = Mpi::OpenMpi.launcher(2);
    launcher.args([
        "-x",
        &format!("LD_PRELOAD={}", shim_path()),
        "-x",
        "MPI_TOOLS_ENTRY=stats",
    ]);
    let job = start_steady(launcher, &dir, iters, 2);
    let jobid = wait_for(
        "the daemon to attach to both ranks",
        Duration::from_secs(90),
        || {
            daemon.assert_running();
            let (_, body) = http_get(&addr, "/metrics").ok()?;
            let s = parse_metrics(&body);
            let ours: Vec<_> = s
                .iter()
                .filter(|x| {
                    x.name == "mpi_rank_info"
                        && job
                            .ranks
                            .iter()
                            .any(|r| x.label("pid") == Some(&r.1.to_string()))
                })
                .collect();
            (ours.len() == 2).then(|| ours[0].label("jobid").unwrap().to_string())
        },
    );
    job.go();
    job.finish("OK ");
    let (_, body) = http_get(&addr, "/metrics").unwrap();
    let s = parse_metrics(&body);
    for rank in ["0", "1"] {
        for (f, n) in expected_calls(iters) {
            assert_eq!(
                sum(
                    &s,
                    "mpi_calls_total",
                    &[("jobid", &jobid), ("rank", rank), ("function", f)]
                ),
                n as f64,
                "rank {rank} {f} as seen by the unprivileged daemon"
            );
        }
        // Message sizes come from reading the rank's memory.
        assert_eq!(
            sum(
                &s,
                "mpi_bytes_total",
                &[
                    ("jobid", &jobid),
                    ("rank", rank),
                    ("function", "MPI_Isend"),
                    ("direction", "send")
                ]
            ),
            (64 * iters) as f64
        );
    }
    // Peer traffic: node by node on /metrics, rank by rank on /metrics/ranks
    // (the bounded /metrics has no rank x peer series, issue 22).
    let (code, body) = http_get(
        &addr,
        &format!("/metrics/ranks?jobid={}", url_encode(&jobid)),
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let by_rank = parse_metrics(&body);
    for dir in ["send", "recv"] {
        for (series, name) in [
            (&s, "mpi_job_peer_bytes_total"),
            (&by_rank, "mpi_peer_bytes_total"),
        ] {
            assert_eq!(
                sum(series, name, &[("jobid", &jobid), ("direction", dir)]),
                (2 * (64 * iters + 4)) as f64,
                "{dir} {name} from the stats segments, read unprivileged"
            );
        }
    }
    assert_eq!(sum(&s, "mpi_observer_attach_failures_total", &[]), 0.0);
}

/// The multi-node run: see the module documentation.
#[test]
fn dashboards_on_a_three_node_cluster() {
    if !require(&[
        Need::Root,
        Need::Mpi(Mpi::OpenMpi),
        Need::Command("prometheus"),
        Need::Command("promtool"),
        Need::Command("ip"),
        Need::Command("unshare"),
    ]) {
        return;
    }
    let started = Instant::now();
    let dir = scratch("cluster");
    // Dropped last (declared first): namespaces outlive what runs in them.
    let net = Net::create(NODES);

    // One daemon per node, listening on the node's address, with the bounded
    // /metrics of issue 22. Node 1 runs at default flags. Nodes 0 and 2 also
    // export their full ranks' histograms, so the rank dashboard's heatmap
    // has data and the job-level rules must not count them twice. Node 2
    // keeps one detail rank per job (--detail-ranks 1) of its two: the other
    // is drilled into through /metrics/ranks only.
    let mut daemons: Vec<(Proc, String)> = (0..NODES)
        .map(|i| {
            let addr = format!("{}:{OBSERVER_PORT}", net.node_addr(i));
            // In a UTS namespace named as the node, like the node's ranks
            // (the rsh agent): the daemon's node name is in `node`/`peer_node`.
            let mut daemon = format!(
                "{} attach --all --same-netns --listen {addr}",
                observer_bin().display()
            );
            if i != 1 {
                daemon.push_str(" --per-rank-histograms");
            }
            if i == NODES - 1 {
                daemon.push_str(" --detail-ranks 1");
            }
            let p = Proc::spawn(
                &format!("daemon on node {i}"),
                &mut net.in_node(i, &[], &daemon),
                dir.join(format!("daemon{i}.log")),
            );
            (p, addr)
        })
        .collect();
    for (d, addr) in &mut daemons {
        wait_for(
            "a daemon to serve /metrics",
            Duration::from_secs(90),
            || {
                d.assert_running();
                http_get(addr, "/metrics").ok().filter(|(c, _)| *c == 200)
            },
        );
    }

    // Prometheus, discovering the daemons from a file_sd target file, with
    // the project's rules.
    let targets: Vec<String> = daemons.iter().map(|(_, a)| format!("\"{a}\"")).collect();
    std::fs::write(
        dir.join("targets.json"),
        format!(
            "[{{\"targets\": [{}], \"labels\": {{\"cluster\": \"test\"}}}}]\n",
            targets.join(", ")
        ),
    )
    .unwrap();
    let rules: Vec<String> = fast_rules(&dir)
        .iter()
        .map(|p| format!("  - {}\n", p.display()))
        .collect();
    // The second scrape job, /metrics/ranks for the jobs named, as
    // dashboards/deploy/ configures it (slower, the duplicated per-rank
    // series dropped); added once the main job's id is known.
    let write_config = |detail_jobs: &[&str]| {
        let mut cfg = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n\
             rule_files:\n{}\
             scrape_configs:\n  - job_name: {SCRAPE_JOB}\n    file_sd_configs:\n      - files: ['{}']\n        refresh_interval: 1s\n",
            rules.concat(),
            dir.join("targets.json").display()
        );
        if !detail_jobs.is_empty() {
            let ids: Vec<String> = detail_jobs
                .iter()
                .map(|j| format!("\"{}\"", j.replace('\\', "\\\\").replace('"', "\\\"")))
                .collect();
            cfg.push_str(&format!(
                "  - job_name: {RANKS_JOB}\n    metrics_path: /metrics/ranks\n    params:\n      jobid: [{}]\n\
                 \x20   scrape_interval: 2s\n    scrape_timeout: 1900ms\n\
                 \x20   file_sd_configs:\n      - files: ['{}']\n        refresh_interval: 1s\n\
                 \x20   metric_relabel_configs:\n      - source_labels: [__name__]\n        regex: '{RANKS_DROP}'\n        action: drop\n",
                ids.join(", "),
                dir.join("targets.json").display()
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), cfg).unwrap();
    };
    write_config(&[]);
    let prom_addr = format!("127.0.0.1:{}", free_port());
    let mut prometheus = Proc::spawn(
        "prometheus",
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={prom_addr}"))
            .arg("--log.level=warn"),
        dir.join("prometheus.log"),
    );
    let prom = Prom {
        addr: prom_addr.clone(),
    };
    wait_for("Prometheus to be ready", Duration::from_secs(60), || {
        prometheus.assert_running();
        http_get(&prom_addr, "/-/ready")
            .ok()
            .filter(|(c, _)| *c == 200)
    });
    prom.wait_value(
        &format!("sum(up{{job=\"{SCRAPE_JOB}\"}})"),
        NODES as f64,
        Duration::from_secs(90),
    );

    // The job: two ranks per node, launched into the namespaces by Open MPI's
    // rsh agent; TCP between the nodes, shared memory within one. A second,
    // smaller job runs on the last node only, so the overview has two jobs
    // to tell apart and node 2's daemon serves both.
    let agent = write_rsh_agent(&dir, "");
    let mpirun = |nodes: &[String], np: usize, name: &str| {
        net.mpirun(&dir, &agent, nodes, PER_NODE, np, name)
    };
    // The main job runs with the shim's stats layer, so the daemons export
    // the argument-level metrics (per-peer traffic, request health) for it;
    // the small job runs without, so the same dashboards are checked on a job
    // that has only the probes' figures.
    let shim = shim_path();
    let mut main_cmd = mpirun(&net.namespaces, NP, "main");
    main_cmd.args([
        "-x",
        &format!("LD_PRELOAD={shim}"),
        "-x",
        "MPI_TOOLS_ENTRY=stats",
    ]);
    let mut job = start_steady(main_cmd, &dir, ITERS, NP);
    let small_dir = dir.join("small");
    std::fs::create_dir_all(&small_dir).unwrap();
    let mut small = start_steady(
        mpirun(&net.namespaces[NODES - 1..], SMALL_NP, "small"),
        &small_dir,
        SMALL_ITERS,
        SMALL_NP,
    );

    // The ranks really are split across the nodes.
    let node_of_pid = |pid: u32| net.node_of_pid(pid);
    let node_of: BTreeMap<u32, usize> = job
        .ranks
        .iter()
        .map(|&(rank, pid)| (rank, node_of_pid(pid)))
        .collect();
    for n in 0..NODES {
        assert_eq!(
            node_of.values().filter(|&&x| x == n).count(),
            PER_NODE,
            "ranks per node: {node_of:?}"
        );
    }
    for &(_, pid) in &small.ranks {
        assert_eq!(node_of_pid(pid), NODES - 1, "the small job's node");
    }

    // Each daemon owns exactly its node's ranks (by pid: no rank of another
    // node leaks in), and the daemons agree on each job's id.
    let mut jobids = BTreeSet::new();
    let mut small_jobids = BTreeSet::new();
    for (i, (d, addr)) in daemons.iter_mut().enumerate() {
        let mut want: BTreeMap<String, (&str, String)> = job
            .ranks
            .iter()
            .filter(|(r, _)| node_of[r] == i)
            .map(|(r, p)| (p.to_string(), ("main", r.to_string())))
            .collect();
        if i == NODES - 1 {
            want.extend(
                small
                    .ranks
                    .iter()
                    .map(|(r, p)| (p.to_string(), ("small", r.to_string()))),
            );
        }
        let ids = wait_for(
            "each daemon to attach to exactly its node's ranks",
            Duration::from_secs(90),
            || {
                d.assert_running();
                let (_, body) = http_get(addr, "/metrics").ok()?;
                let s = parse_metrics(&body);
                let info: BTreeMap<String, (String, String)> = s
                    .iter()
                    .filter(|x| x.name == "mpi_rank_info")
                    .map(|x| {
                        let l = |k| x.label(k).unwrap().to_string();
                        (l("pid"), (l("jobid"), l("rank")))
                    })
                    .collect();
                let same = info.len() == want.len()
                    && want
                        .iter()
                        .all(|(pid, (_, rank))| info.get(pid).is_some_and(|x| &x.1 == rank));
                same.then(|| {
                    want.iter()
                        .map(|(pid, (which, _))| (*which, info[pid].0.clone()))
                        .collect::<BTreeSet<_>>()
                })
            },
        );
        for (which, id) in ids {
            if which == "main" {
                jobids.insert(id);
            } else {
                small_jobids.insert(id);
            }
        }
    }
    assert_eq!(jobids.len(), 1, "one job id across the nodes: {jobids:?}");
    assert_eq!(small_jobids.len(), 1, "{small_jobids:?}");
    let jobid = jobids.into_iter().next().unwrap();
    let small_jobid = small_jobids.into_iter().next().unwrap();
    assert_ne!(jobid, small_jobid, "two jobs, two job ids");
    let sel = format!("jobid=\"{jobid}\"");
    let small_sel = format!("jobid=\"{small_jobid}\"");
    // The main job through the /metrics/ranks scrape job: every rank's
    // full series.
    let ranks_sel = format!("job=\"{RANKS_JOB}\", {sel}");
    // Full detail of the main job through /metrics/ranks: the config
    // reloaded (SIGHUP), one target per node.
    write_config(&[&jobid]);
    // SAFETY: kill(2) with a pid of our own live child and a signal number;
    // no memory is involved.
    let hup = unsafe { kill(prometheus.pid() as i32, SIGHUP) };
    assert_eq!(hup, 0, "SIGHUP to Prometheus");
    prom.wait_value(
        &format!("sum(up{{job=\"{RANKS_JOB}\"}})"),
        NODES as f64,
        Duration::from_secs(60),
    );
    prom.wait_value(
        &format!("count(mpi_rank_info{{{sel}}})"),
        NP as f64,
        Duration::from_secs(30),
    );

    // Run the counted phase; the ranks then hold, alive, with one request
    // outstanding each.
    job.go();
    small.go();
    job.wait_lines("DONE", NP, Duration::from_secs(120));
    small.wait_lines("DONE", SMALL_NP, Duration::from_secs(60));
    // Job-level totals: the bounded exposition's per job and node series.
    let total = |f: &str| format!("sum(mpi_job_calls_total{{{sel}, function=\"{f}\"}})");
    prom.wait_value(
        &total("MPI_Allreduce"),
        (ITERS * NP as u64) as f64,
        Duration::from_secs(30),
    );
    assert_eq!(
        prom.value(&format!("sum(mpi_rank_up{{{sel}}})")),
        Some(NP as f64),
        "every rank is still running"
    );
    // The overview's job-level rules tell the two jobs apart.
    prom.wait_value(
        "count(jobid:mpi_ranks_running:count)",
        2.0,
        Duration::from_secs(60),
    );
    prom.wait_value(
        &format!("jobid:mpi_nodes_running:count{{{sel}}}"),
        NODES as f64,
        Duration::from_secs(60),
    );
    prom.wait_value(
        &format!("jobid:mpi_nodes_running:count{{{small_sel}}}"),
        1.0,
        Duration::from_secs(60),
    );
    prom.wait_value(
        &format!("jobid:mpi_ranks_running:count{{{small_sel}}}"),
        SMALL_NP as f64,
        Duration::from_secs(60),
    );

    // The stats layer's figures for the main job, while it holds: every
    // rank has its one held receive outstanding. Rank by rank from the
    // /metrics/ranks job (on /metrics only detail ranks have them, checked
    // below); node by node, with the rank holding each node's oldest.
    prom.wait_value(
        &format!("sum(mpi_requests_outstanding{{{ranks_sel}}})"),
        NP as f64,
        Duration::from_secs(60),
    );
    // Every held receive ages: waited for, not read once, since the scrape
    // that first shows the last receive posted may be followed by one a
    // loaded machine times out (the series then go stale for a moment).
    let oldest = format!("min(mpi_request_oldest_age_seconds{{{ranks_sel}}})");
    let mut last = None;
    let limit = Duration::from_secs(30);
    let start = Instant::now();
    while !last.is_some_and(|age: f64| age > 0.0) {
        assert!(
            start.elapsed() < limit,
            "the held receives age: {oldest} is {last:?} after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
        last = prom.value(&oldest);
    }
    prom.wait_value(
        &format!("sum(mpi_job_requests_outstanding{{{sel}}})"),
        NP as f64,
        Duration::from_secs(60),
    );
    // The node of each observer target, and the world ranks each gauge of
    // `family` (one series per job and node, the rank as its value) names:
    // each must be a rank of the job on that very node.
    let node_of_instance: BTreeMap<&str, usize> = daemons
        .iter()
        .enumerate()
        .map(|(i, (_, addr))| (addr.as_str(), i))
        .collect();
    let ranks_named = |family: &str| -> BTreeMap<usize, u32> {
        let r = prom.query(&format!("{family}{{{sel}}}")).unwrap();
        assert_eq!(r.len(), NODES, "{family}: one series per node: {r:?}");
        r.iter()
            .map(|s| {
                let node = node_of_instance[s.labels["instance"].as_str()];
                assert!(
                    s.value.fract() == 0.0 && s.value >= 0.0,
                    "{family}: not a world rank: {s:?}"
                );
                let rank = s.value as u32;
                assert_eq!(
                    node_of.get(&rank),
                    Some(&node),
                    "{family}: rank {rank} does not run on node {node}: {s:?}"
                );
                (node, rank)
            })
            .collect()
    };
    let oldest = wait_for(
        "each node's mpi_job_request_oldest_rank",
        Duration::from_secs(30),
        || {
            let n = prom
                .query(&format!("mpi_job_request_oldest_rank{{{sel}}}"))
                .unwrap()
                .len();
            (n == NODES).then(|| ranks_named("mpi_job_request_oldest_rank"))
        },
    );
    // The rank named holds its node's oldest request: its own oldest age
    // (from the /metrics/ranks job) is the largest of its node's ranks'.
    let age = |rank: u32| {
        prom.value(&format!(
            "max(mpi_request_oldest_age_seconds{{{ranks_sel}, rank=\"{rank}\"}})"
        ))
        .unwrap_or_else(|| panic!("rank {rank}: no mpi_request_oldest_age_seconds"))
    };
    for (node, rank) in &oldest {
        for (other, _) in node_of.iter().filter(|(_, n)| *n == node) {
            assert!(
                age(*rank) + 2.0 >= age(*other),
                "node {node}: rank {rank} named as holding the oldest request, rank {other}'s is older"
            );
        }
    }

    // The bounded exposition: every rank of nodes 0 and 1 is a detail rank
    // (two ranks, --detail-ranks 2), one of each job's two on node 2. The
    // other rank of node 2 has no per-function series on /metrics, yet the
    // /metrics/ranks scrape job has all of them for the main job, and none
    // for the small job, which it does not name.
    let detail = |sel: &str| -> BTreeMap<String, String> {
        prom.query(&format!("mpi_rank_detail{{job=\"{SCRAPE_JOB}\", {sel}}}"))
            .unwrap()
            .into_iter()
            .map(|s| (s.labels["rank"].clone(), s.labels["instance"].clone()))
            .collect()
    };
    let main_detail = wait_for("the detail ranks", Duration::from_secs(30), || {
        let d = detail(&sel);
        (d.len() == NP - 1).then_some(d)
    });
    // The time and request gauges are on /metrics for the detail ranks
    // only; every rank has them on /metrics/ranks.
    for family in [
        "mpi_rank_start_time_seconds",
        "mpi_rank_attach_time_seconds",
        "mpi_requests_outstanding",
        "mpi_request_oldest_age_seconds",
    ] {
        let on_metrics: BTreeSet<String> = prom
            .query(&format!("{family}{{job=\"{SCRAPE_JOB}\", {sel}}}"))
            .unwrap()
            .into_iter()
            .map(|s| s.labels["rank"].clone())
            .collect();
        assert_eq!(
            on_metrics,
            main_detail.keys().cloned().collect::<BTreeSet<_>>(),
            "{family} on /metrics: the detail ranks' only"
        );
        assert_eq!(
            prom.value(&format!("count({family}{{{ranks_sel}}})")),
            Some(NP as f64),
            "{family} of every rank on /metrics/ranks"
        );
    }
    let hidden = node_of
        .iter()
        .find(|(r, _)| !main_detail.contains_key(&r.to_string()))
        .map(|(r, n)| {
            assert_eq!(
                *n,
                NODES - 1,
                "only node 2 keeps fewer detail ranks: {main_detail:?}"
            );
            r.to_string()
        })
        .unwrap();
    let small_detail = detail(&small_sel);
    assert_eq!(small_detail.len(), 1, "{small_detail:?}");
    let small_hidden = small
        .ranks
        .iter()
        .map(|(r, _)| r.to_string())
        .find(|r| !small_detail.contains_key(r))
        .unwrap();
    let small_rank = small_detail.keys().next().unwrap().clone();
    let calls = |job: &str, sel: &str, rank: &str| {
        prom.query(&format!(
            "mpi_calls_total{{job=\"{job}\", {sel}, rank=\"{rank}\", function=\"MPI_Allreduce\"}}"
        ))
        .unwrap()
    };
    assert!(
        calls(SCRAPE_JOB, &sel, &hidden).is_empty(),
        "rank {hidden} is not a detail rank, yet /metrics has its per-function series"
    );
    prom.wait_value(
        &format!(
            "sum(mpi_calls_total{{job=\"{RANKS_JOB}\", {sel}, rank=\"{hidden}\", function=\"MPI_Allreduce\"}})"
        ),
        ITERS as f64,
        Duration::from_secs(30),
    );
    for job in [SCRAPE_JOB, RANKS_JOB] {
        assert!(
            calls(job, &small_sel, &small_hidden).is_empty(),
            "small job's rank {small_hidden}: no detail anywhere ({job})"
        );
    }
    assert!(!calls(SCRAPE_JOB, &small_sel, &small_rank).is_empty());
    // The /metrics/ranks job added no second copy of any per-rank series.
    assert_eq!(
        prom.value(&format!(
            "count({{job=\"{RANKS_JOB}\", __name__=~\"{RANKS_DROP}\"}})"
        )),
        None
    );

    // Every dashboard expression, with the variables set to a job, a rank on
    // a node with per-rank histograms and a collective: for the main job
    // every panel must return data; for the small job the panels over the
    // argument-level metrics may be empty, and must still be valid.
    let vars = |jobid: &str, rank: String| -> BTreeMap<&'static str, String> {
        [
            ("jobid", jobid.to_string()),
            ("rank", rank),
            ("function", "MPI_Allreduce".to_string()),
            ("scrape_job", SCRAPE_JOB.to_string()),
            ("__rate_interval", "10s".to_string()),
            ("__interval", "1s".to_string()),
            ("__range", "5m".to_string()),
        ]
        .into_iter()
        .collect()
    };
    // The main job's rank on node 0 is a detail rank of /metrics; its
    // rank `hidden` on node 2 is drilled into through /metrics/ranks only.
    let rank = node_of
        .iter()
        .find(|(_, n)| **n == 0)
        .map(|(r, _)| r.to_string())
        .unwrap();
    for r in [rank, hidden.clone()] {
        let lenient = check_dashboards_return_data(&prom, &vars(&jobid, r));
        assert_eq!(
            lenient, 0,
            "the main job has every family: every panel is strict"
        );
    }
    let lenient = check_dashboards_return_data(&prom, &vars(&small_jobid, small_rank));
    // Each of those was checked to need a family the small job lacks.
    assert!(
        lenient > 0,
        "the small job has no argument-level figures, so their panels are empty"
    );
    // The rules evaluate cleanly (recording rules over absent families too).
    let rules = prom.get_json("/api/v1/rules");
    let mut n_rules = 0;
    for g in rules["data"]["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            n_rules += 1;
            assert_eq!(
                r["health"], "ok",
                "rule {} is unhealthy: {}",
                r["name"], r["lastError"]
            );
        }
    }
    assert!(
        n_rules >= 20,
        "the rules files were loaded ({n_rules} rules)"
    );
    // The straggler picture is there: per-rank MPI time fractions of the
    // whole run, from the two per-rank series every rank has, are sane, and
    // the distribution counts every rank.
    let fractions = prom
        .query(&format!(
            "mpi_rank_mpi_seconds_total{{{sel}}} / mpi_rank_wall_seconds_total{{{sel}}}"
        ))
        .unwrap();
    assert_eq!(fractions.len(), NP);
    prom.wait_value(
        &format!("sum(mpi_job_rank_mpi_fraction_bucket{{{sel}, le=\"+Inf\"}})"),
        NP as f64,
        Duration::from_secs(10),
    );
    assert!(
        prom.value(&format!("jobid:mpi_time_fraction:ratio{{{sel}}}"))
            .is_some_and(|f| f > 0.0 && f <= 1.05),
        "the job's MPI time fraction"
    );
    for s in &fractions {
        assert!(
            s.value > 0.0 && s.value <= 1.05,
            "MPI time fraction out of range: {s:?}"
        );
    }
    // Each node's extremes, which the dashboards and rules read instead of
    // every rank's series, name their rank (the value is the world rank):
    // over the lifetime, the node's rank with the highest and the lowest
    // fraction (to within what a scrape between the two queries moves).
    let fraction_of: BTreeMap<u32, f64> = fractions
        .iter()
        .map(|s| (s.labels["rank"].parse().unwrap(), s.value))
        .collect();
    for (family, highest) in [
        ("mpi_job_rank_mpi_fraction_max_rank", true),
        ("mpi_job_rank_mpi_fraction_min_rank", false),
    ] {
        for (node, rank) in ranks_named(family) {
            for (other, _) in node_of.iter().filter(|(_, n)| **n == node) {
                let (a, b) = (fraction_of[&rank], fraction_of[other]);
                assert!(
                    if highest {
                        a + 0.01 >= b
                    } else {
                        a <= b + 0.01
                    },
                    "{family}: node {node} names rank {rank} ({a}), rank {other} has {b}"
                );
            }
        }
    }
    // Over the last minute, from the daemons' own samples: one series per
    // node, the highest at least the lowest, each naming a rank of the node.
    wait_for(
        "each node's fractions over the last minute",
        Duration::from_secs(30),
        || {
            let hi = prom
                .query(&format!("mpi_job_rank_mpi_fraction_1m_max{{{sel}}}"))
                .unwrap();
            let lo = prom
                .query(&format!("mpi_job_rank_mpi_fraction_1m_min{{{sel}}}"))
                .unwrap();
            (hi.len() == NODES && lo.len() == NODES).then_some(())
        },
    );
    assert_eq!(
        prom.value(&format!(
            "count(mpi_job_rank_mpi_fraction_1m_max{{{sel}}} >= on (instance, jobid, uid) mpi_job_rank_mpi_fraction_1m_min{{{sel}}} >= 0 <= 1.05)"
        )),
        Some(NODES as f64),
        "per node, the highest fraction over the last minute is at least the lowest, and in [0, 1.05]"
    );
    for family in [
        "mpi_job_rank_mpi_fraction_1m_max_rank",
        "mpi_job_rank_mpi_fraction_1m_min_rank",
    ] {
        ranks_named(family);
    }
    eprintln!(
        "MPI time fraction per rank: {:?}",
        fractions
            .iter()
            .map(|s| (
                s.labels["rank"].clone(),
                (s.value * 1000.0).round() / 1000.0
            ))
            .collect::<BTreeMap<_, _>>()
    );

    // End the job. Exited ranks stay exported (--retain-exited), so the
    // cluster-wide totals in Prometheus must be exact.
    job.finish("OK ");
    small.finish("OK ");
    prom.wait_value(
        &format!("count(mpi_rank_exit_time_seconds{{{ranks_sel}}})"),
        NP as f64,
        Duration::from_secs(30),
    );
    assert_eq!(prom.value(&format!("sum(mpi_rank_up{{{sel}}})")), Some(0.0));
    // Let one more scrape of every node land after the exits were seen.
    std::thread::sleep(Duration::from_secs(2));
    for (f, per_rank) in expected_calls(ITERS) {
        let want = (per_rank * NP as u64) as f64;
        prom.wait_value(&total(f), want, Duration::from_secs(60));
    }
    let np = NP as u64;
    // Who talks to whom, exactly: each rank sends ITERS Isends of 64 bytes
    // and one 4-byte Send to its right neighbour, and receives the same from
    // its left; nothing else is point-to-point.
    // Node by node on /metrics; rank by rank from the /metrics/ranks job.
    for dir in ["send", "recv"] {
        for (m, s) in [
            ("mpi_job_peer_messages_total", &sel),
            ("mpi_peer_messages_total", &ranks_sel),
        ] {
            prom.wait_value(
                &format!("sum({m}{{{s}, direction=\"{dir}\"}})"),
                ((ITERS + 1) * np) as f64,
                Duration::from_secs(30),
            );
        }
        for (m, s) in [
            ("mpi_job_peer_bytes_total", &sel),
            ("mpi_peer_bytes_total", &ranks_sel),
        ] {
            prom.wait_value(
                &format!("sum({m}{{{s}, direction=\"{dir}\"}})"),
                ((64 * ITERS + 4) * np) as f64,
                Duration::from_secs(30),
            );
        }
    }
    // Node by node: each node's ranks send their ring traffic to ranks of
    // their own node (named by the daemon) and of the next node (named by
    // the launcher's layout, or "remote" when it cannot say).
    let per_rank = (64 * ITERS + 4) as f64;
    let (mut same, mut off) = ([0.0; NODES], [0.0; NODES]);
    for r in 0..NP as u32 {
        let (a, b) = (node_of[&r], node_of[&((r + 1) % NP as u32)]);
        if a == b {
            same[a] += per_rank;
        } else {
            off[a] += per_rank;
        }
    }
    let matrix = prom
        .query(&format!(
            "sum by (node, peer_node) (mpi_job_peer_bytes_total{{{sel}, direction=\"send\"}})"
        ))
        .unwrap();
    for (i, me) in net.namespaces.iter().enumerate() {
        let row: BTreeMap<&str, f64> = matrix
            .iter()
            .filter(|c| c.labels["node"] == *me)
            .map(|c| (c.labels["peer_node"].as_str(), c.value))
            .collect();
        assert_eq!(
            row.get(me.as_str()).copied().unwrap_or(0.0),
            same[i],
            "{me} to itself: {matrix:?}"
        );
        assert_eq!(
            row.iter()
                .filter(|(p, _)| **p != me)
                .map(|(_, v)| v)
                .sum::<f64>(),
            off[i],
            "{me} to other nodes: {matrix:?}"
        );
        // `#k`: the job's k-th node, where Open MPI's layout says no more.
        let block = |p: &str| {
            p.strip_prefix('#')
                .is_some_and(|k| k.parse::<usize>().is_ok_and(|k| k <= NODES))
        };
        assert!(
            row.keys()
                .all(|p| *p == "remote" || block(p) || net.namespaces.iter().any(|n| n == p)),
            "peer nodes are nodes, #k or \"remote\": {matrix:?}"
        );
    }
    eprintln!(
        "node x node send bytes: {:?}",
        matrix
            .iter()
            .map(|c| (&c.labels["node"], &c.labels["peer_node"], c.value))
            .collect::<Vec<_>>()
    );
    // The node label of the node x node series is the daemon's node name.
    let names: BTreeMap<String, String> = prom
        .query("mpi_observer_node_info")
        .unwrap()
        .into_iter()
        .map(|s| (s.labels["instance"].clone(), s.labels["node"].clone()))
        .collect();
    for (i, (_, addr)) in daemons.iter().enumerate() {
        assert_eq!(names.get(addr), Some(&net.namespaces[i]), "{names:?}");
    }
    let cells_by_node = prom
        .query(&format!("mpi_job_peer_bytes_total{{{sel}}}"))
        .unwrap()
        .len();
    assert!(cells_by_node > 0);
    assert_eq!(
        prom.value(&format!(
            "count(mpi_job_peer_bytes_total{{{sel}}} * on (instance, node) group_left () mpi_observer_node_info)"
        )),
        Some(cells_by_node as f64),
        "mpi_observer_node_info joins every peer series' node"
    );
    let cells: BTreeSet<(u64, u64)> = prom
        .query(&format!(
            "mpi_peer_bytes_total{{{ranks_sel}, direction=\"send\"}} > 0"
        ))
        .unwrap()
        .iter()
        .map(|c| {
            (
                c.labels["rank"].parse().unwrap(),
                c.labels["peer"].parse().unwrap(),
            )
        })
        .collect();
    let ring: BTreeSet<(u64, u64)> = (0..np).map(|r| (r, (r + 1) % np)).collect();
    assert_eq!(cells, ring, "the communication matrix is the ring");
    // The small job's totals are exact and its own.
    for (f, per_rank) in expected_calls(SMALL_ITERS) {
        prom.wait_value(
            &format!("sum(mpi_job_calls_total{{{small_sel}, function=\"{f}\"}})"),
            (per_rank * SMALL_NP as u64) as f64,
            Duration::from_secs(60),
        );
    }
    let nodes = prom
        .query(&format!(
            "sum by (instance) (mpi_job_calls_total{{{sel}, function=\"MPI_Barrier\"}})"
        ))
        .unwrap();
    assert_eq!(nodes.len(), NODES, "every node contributes: {nodes:?}");
    for s in &nodes {
        assert_eq!(s.value, (ITERS * PER_NODE as u64) as f64, "per node: {s:?}");
    }
    let bytes = |f: &str, dir: &str| {
        prom.value(&format!(
            "sum(mpi_job_bytes_total{{{sel}, function=\"{f}\", direction=\"{dir}\"}})"
        ))
    };
    assert_eq!(bytes("MPI_Isend", "send"), Some((64 * ITERS * np) as f64));
    assert_eq!(
        bytes("MPI_Allreduce", "send"),
        Some((32 * ITERS * np) as f64)
    );
    assert_eq!(bytes("MPI_Bcast", "recv"), Some((32 * ITERS * np) as f64));
    // The per-job histogram (rank="") sums up across nodes, whether or not
    // a node also exports its ranks' own; the recording rule agrees.
    for m in [
        format!(
            "sum(mpi_call_duration_seconds_count{{{sel}, rank=\"\", function=\"MPI_Allreduce\"}})"
        ),
        format!(
            "sum(mpi_call_duration_seconds_bucket{{{sel}, rank=\"\", function=\"MPI_Allreduce\", le=\"+Inf\"}})"
        ),
    ] {
        assert_eq!(prom.value(&m), Some((ITERS * np) as f64), "{m}");
    }
    // Per-rank histograms come from the nodes with --per-rank-histograms
    // (0 and 2), for every rank of the job on /metrics/ranks.
    assert_eq!(
        prom.value(&format!(
            "sum(mpi_call_duration_seconds_count{{{ranks_sel}, function=\"MPI_Allreduce\"}})"
        )),
        Some((ITERS * 2 * PER_NODE as u64) as f64)
    );
    // Rank by rank, the /metrics/ranks job holds every call.
    for (f, per_rank) in expected_calls(ITERS) {
        prom.wait_value(
            &format!("sum(mpi_calls_total{{{ranks_sel}, function=\"{f}\"}})"),
            (per_rank * np) as f64,
            Duration::from_secs(30),
        );
    }
    // Prometheus holds exactly what the daemons serve, on both paths.
    let (mut direct, mut direct_ranks) = (0.0, 0.0);
    for (_, addr) in &daemons {
        let (_, body) = http_get(addr, "/metrics").unwrap();
        direct += sum(
            &parse_metrics(&body),
            "mpi_job_calls_total",
            &[("jobid", &jobid)],
        );
        let (code, body) = http_get(
            addr,
            &format!("/metrics/ranks?jobid={}", url_encode(&jobid)),
        )
        .unwrap();
        assert_eq!(code, 200, "{body}");
        direct_ranks += sum(
            &parse_metrics(&body),
            "mpi_calls_total",
            &[("jobid", &jobid)],
        );
    }
    assert_eq!(
        prom.value(&format!("sum(mpi_job_calls_total{{{sel}}})")),
        Some(direct),
        "Prometheus's cluster-wide total equals the sum of the daemons' scrapes"
    );
    assert_eq!(direct_ranks, direct, "/metrics/ranks and /metrics agree");
    assert_eq!(
        prom.value(&format!("sum(mpi_calls_total{{{ranks_sel}}})")),
        Some(direct_ranks)
    );
    // Exited ranks' wall seconds (the base of the lifetime MPI fraction)
    // stop at their exit.
    prom.wait_value(
        &format!(
            "max(abs(mpi_rank_wall_seconds_total{{{sel}}} - mpi_rank_wall_seconds_total{{{sel}}} offset 3s))"
        ),
        0.0,
        Duration::from_secs(60),
    );
    for (d, _) in &mut daemons {
        d.assert_running();
    }
    eprintln!("cluster test took {:?}", started.elapsed());
}

/// Evaluates every panel expression and every variable query of every
/// dashboard in Prometheus with `vars` filled in. Each must be valid and
/// return data, except that expressions needing a metric family of
/// [`OPTIONAL_FAMILIES`] that no daemon exports for the job in `vars` need
/// only be valid (and empty); returns how many were let off that way.
fn check_dashboards_return_data(prom: &Prom, vars: &BTreeMap<&str, String>) -> usize {
    // Which optional families exist now for this job, and which recording
    // rules derive from them (so panels reading those rules are optional
    // too).
    let jobid = &vars["jobid"];
    let exists = |f: &str| {
        !prom
            .query(&format!("group({{__name__=\"{f}\", jobid=\"{jobid}\"}})"))
            .unwrap()
            .is_empty()
    };
    let present: BTreeSet<&str> = OPTIONAL_FAMILIES
        .iter()
        .copied()
        .filter(|f| exists(f))
        .collect();
    let rules = prom.get_json("/api/v1/rules");
    let mut derived: BTreeMap<String, String> = BTreeMap::new();
    for g in rules["data"]["groups"].as_array().unwrap() {
        for r in g["rules"].as_array().unwrap() {
            if r["type"] == "recording" {
                derived.insert(
                    r["name"].as_str().unwrap().to_string(),
                    r["query"].as_str().unwrap().to_string(),
                );
            }
        }
    }
    let needs = |expr: &str| -> BTreeSet<&'static str> {
        // Expand recording rule names into their queries, transitively.
        let mut text = expr.to_string();
        for _ in 0..4 {
            let mut more = String::new();
            for (name, q) in &derived {
                if text.contains(name.as_str()) && !more.contains(q.as_str()) {
                    more.push(' ');
                    more.push_str(q);
                }
            }
            text.push_str(&more);
        }
        OPTIONAL_FAMILIES
            .iter()
            .copied()
            .filter(|f| text.contains(f))
            .collect()
    };

    let mut strict = 0;
    let mut lenient = Vec::new();
    let mut failures = Vec::new();
    for path in dashboard_files() {
        let d = read_json(&path);
        for DashExpr { place, expr } in panel_exprs(&path, &d) {
            let q = substitute(&expr, vars);
            assert!(!q.contains('$'), "{place}: unfilled variable in {q}");
            let missing: Vec<&str> = needs(&q)
                .into_iter()
                .filter(|f| !present.contains(f))
                .collect();
            if missing.is_empty() {
                strict += 1;
                // Recording rules and rate windows may need a few more
                // evaluations: retry briefly.
                let deadline = Instant::now() + Duration::from_secs(20);
                loop {
                    match prom.query(&q) {
                        Ok(r) if !r.is_empty() => break,
                        Ok(_) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(500))
                        }
                        // A family that was there may have gone since: the
                        // culprits and waiting ranks exist only while
                        // somebody waited in the last minute.
                        Ok(_) if needs(&q).iter().any(|f| !exists(f)) => {
                            lenient.push(format!("{place} (its families went during the check)"));
                            break;
                        }
                        Ok(_) => {
                            failures.push(format!("{place}: no data for {q}"));
                            break;
                        }
                        Err(e) => {
                            failures.push(format!("{place}: {e} in {q}"));
                            break;
                        }
                    }
                }
            } else {
                match prom.query(&q) {
                    Ok(r)
                        if r.is_empty()
                            && missing.iter().all(|f| ACROSS_NODES_ONLY.contains(f)) => {}
                    Ok(r) if r.is_empty() => lenient.push(format!("{place} (needs {missing:?})")),
                    Ok(r) => failures.push(format!(
                        "{place}: {missing:?} are absent yet {q} returned {r:?}"
                    )),
                    Err(e) => failures.push(format!("{place}: {e} in {q}")),
                }
            }
        }
        for (name, sel, label) in label_values_vars(&d) {
            let s = substitute(&sel, vars);
            let values = prom.label_values(&s, &label);
            let want = vars
                .get(name.as_str())
                .unwrap_or_else(|| panic!("{}: no test value for variable {name}", path.display()));
            if !values.contains(want) {
                failures.push(format!(
                    "{}: variable {name} = label_values({s}, {label}) gives {values:?}, not {want}",
                    path.display()
                ));
            }
        }
    }
    eprintln!("dashboards: {strict} expressions returned data");
    if !lenient.is_empty() {
        eprintln!(
            "dashboards: {} valid but empty because this job has no {:?}:\n  {}",
            lenient.len(),
            OPTIONAL_FAMILIES
                .iter()
                .filter(|f| !present.contains(*f))
                .collect::<Vec<_>>(),
            lenient.join("\n  ")
        );
    }
    assert!(
        failures.is_empty(),
        "{} dashboard queries failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        strict >= 40,
        "only {strict} expressions were checked strictly"
    );
    lenient.len()
}
