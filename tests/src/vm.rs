//! The scale pipeline (issue 22), shared by `tests/tests/e2e/scale.rs` and
//! `cargo xtask bench scale`: `mpi-observer __simulate` (many simulated
//! nodes, each the real HTTP server on its own loopback address), scraped by
//! `vmagent`s in cluster mode (each scrapes its share of the nodes),
//! remote-writing into a single-node `victoria-metrics`, with `vmalert`
//! evaluating the project's rules (dashboards/prometheus/*.rules.yml)
//! against it. Debian's `victoria-metrics` package has all three.
//!
//! Also: the dashboards' expressions with their variables filled in, timed
//! queries, and the processes' CPU time, for the benchmark.

use std::{
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

pub use crate::{Proc, http::get_json};
use crate::{free_port, http::Request, observer_bin, url_encode, wait_for, workspace_root};

/// The commands the pipeline runs, all from Debian's `victoria-metrics`.
pub const COMMANDS: [&str; 3] = ["victoria-metrics", "vmagent", "vmalert"];

/// The installed `victoria-metrics` package's version, for reports (the
/// Debian build's `-version` prints nothing).
pub fn version() -> String {
    Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", "victoria-metrics"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// What to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Simulated nodes.
    pub nodes: u32,
    /// Ranks per node.
    pub ranks_per_node: u32,
    /// Scrapers (`vmagent -promscrape.cluster.membersCount`).
    pub shards: u32,
    /// Scrape interval.
    pub scrape_interval: Duration,
    /// Rule evaluation interval.
    pub eval_interval: Duration,
    /// Groups that set their own `interval: 1m` are evaluated every
    /// `eval_interval` too: a test's minutes are seconds.
    pub fast_groups: bool,
    /// Today's exposition (`--per-rank-detail`) instead of the default.
    pub per_rank_detail: bool,
    /// Per-rank latency histograms for the ranks with full series.
    pub per_rank_histograms: bool,
    /// Node 0's loopback address; node `i` is this + `i`.
    pub base_addr: String,
    /// The planted straggler's world rank.
    pub straggler: u32,
    /// The world rank with the stuck request.
    pub stuck_rank: u32,
    /// The simulated job.
    pub jobid: String,
    /// Where configurations, data and logs go.
    pub dir: PathBuf,
}

impl Config {
    /// `nodes` × `ranks_per_node`, scraped by `shards` scrapers every
    /// `interval` (rules evaluated as often), in `dir`.
    pub fn new(
        nodes: u32,
        ranks_per_node: u32,
        shards: u32,
        interval: Duration,
        dir: &Path,
    ) -> Self {
        let size = nodes * ranks_per_node;
        Config {
            nodes,
            ranks_per_node,
            shards,
            scrape_interval: interval,
            eval_interval: interval,
            fast_groups: false,
            per_rank_detail: false,
            per_rank_histograms: false,
            base_addr: "127.1.0.0".into(),
            // Rank 12,345 of a 64 k-rank job, and a rank on another node.
            straggler: 12_345 % size,
            stuck_rank: (size / 2 + 7) % size,
            jobid: "scale-job".into(),
            dir: dir.to_path_buf(),
        }
    }

    /// The nodes' scrape targets.
    pub fn targets(&self, port: u16) -> Vec<String> {
        let base: std::net::Ipv4Addr = self.base_addr.parse().expect("an IPv4 base address");
        (0..self.nodes)
            .map(|i| format!("{}:{port}", std::net::Ipv4Addr::from(u32::from(base) + i)))
            .collect()
    }
}

/// Makes `cmd`'s process die with the thread that starts it: a benchmark
/// or test killed midway leaves no simulator or database running on a
/// shared machine.
fn die_with_parent(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

unsafe extern "C" {
    fn prctl(option: i32, arg2: u64, arg3: u64, arg4: u64, arg5: u64) -> i32;
}
const PR_SET_PDEATHSIG: i32 = 1;
const SIGKILL: u64 = 9;

/// [`Proc::spawn`] dying with the thread that starts it, its log
/// `dir/NAME.log`.
fn spawn(name: &str, cmd: &mut Command, dir: &Path) -> Proc {
    Proc::spawn(name, die_with_parent(cmd), dir.join(format!("{name}.log")))
}

impl Proc {
    /// Its CPU time so far (user + system), from `/proc/PID/stat`.
    pub fn cpu(&self) -> Duration {
        proc_cpu(self.pid())
    }
}

/// CPU time (user + system) of process `pid`, from `/proc/PID/stat`.
pub fn proc_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): state is the
    // 3rd field, utime the 14th, stime the 15th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { sysconf(SC_CLK_TCK) }.max(1) as u64;
    Duration::from_millis(f.iter().sum::<u64>() * 1000 / hz)
}

unsafe extern "C" {
    fn sysconf(name: i32) -> i64;
}
/// `_SC_CLK_TCK` on Linux.
const SC_CLK_TCK: i32 = 2;

/// One HTTP/1.0 request with the suite's client ([`crate::http`]);
/// returns (status, body). `limit` bounds the connect and each read.
pub fn http(
    addr: &str,
    method: &str,
    path: &str,
    body: &[u8],
    limit: Duration,
) -> std::io::Result<(u16, Vec<u8>)> {
    let req = Request {
        method,
        path,
        headers: &[],
        body,
        http10: true,
    };
    let r = crate::http::send(addr, &req, limit)?;
    Ok((r.status, r.body))
}

/// Answers every request with 200: the alert receiver vmalert must be given
/// (alerts are read from vmalert's own API, not from a notifier).
fn blackhole() -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a notifier port");
    let addr = l.local_addr().expect("local address").to_string();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let _ = c.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = [0u8; 65536];
            let _ = c.read(&mut buf);
            let _ = c.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n");
        }
    });
    addr
}

/// `-search.maxUniqueTimeseries` as dashboards/deploy/victoria-metrics/
/// raw.default sets it for the store the scrapers write to (none if that
/// file does not set it), so the pipeline is the documented deployment.
fn deployed_search_limit() -> Option<String> {
    let f = workspace_root().join("dashboards/deploy/victoria-metrics/raw.default");
    let text = std::fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
    text.lines()
        .filter(|l| l.starts_with("ARGS="))
        .flat_map(|l| l.split_whitespace())
        .map(|w| w.trim_start_matches("ARGS=").trim_matches('"'))
        .find(|w| w.starts_with("-search.maxUniqueTimeseries="))
        .map(str::to_string)
}

/// The rule files vmalert evaluates: every `dashboards/prometheus/*.rules.yml`.
pub fn rule_files() -> Vec<PathBuf> {
    let dir = workspace_root().join("dashboards/prometheus");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".rules.yml"))
        .collect();
    v.sort();
    v
}

/// The running pipeline; everything stops when it is dropped.
pub struct Pipeline {
    /// What it runs.
    pub config: Config,
    /// The simulator.
    pub sim: Proc,
    /// The storage.
    pub vm: Proc,
    /// The scrapers.
    pub agents: Vec<Proc>,
    /// The rule evaluator.
    pub alert: Proc,
    /// Where VictoriaMetrics answers (`127.0.0.1:PORT`).
    pub vm_addr: String,
    /// Where each vmagent answers.
    pub agent_addrs: Vec<String>,
    /// Where vmalert answers.
    pub alert_addr: String,
    /// The nodes' addresses.
    pub targets: Vec<String>,
    /// When the first scrape could have happened.
    pub started: Instant,
    /// False after [`Pipeline::stop_scraping`].
    scraping: bool,
    _sim_out: BufReader<ChildStdout>,
}

impl Pipeline {
    /// Starts the simulator, VictoriaMetrics, the vmagents and vmalert, and
    /// waits until the simulator serves every node.
    pub fn start(config: Config) -> Pipeline {
        let dir = &config.dir;
        std::fs::create_dir_all(dir).expect("pipeline dir");
        let port = free_port();
        let targets = config.targets(port);

        // The simulator first: it says when every node listens.
        let mut cmd = Command::new(observer_bin());
        cmd.args(["__simulate", "--nodes", &config.nodes.to_string()])
            .args(["--ranks-per-node", &config.ranks_per_node.to_string()])
            .args([
                "--base-addr",
                &config.base_addr,
                "--port",
                &port.to_string(),
            ])
            .args(["--jobid", &config.jobid])
            .args(["--straggler", &config.straggler.to_string()])
            .args(["--stuck-rank", &config.stuck_rank.to_string()]);
        if config.per_rank_detail {
            cmd.arg("--per-rank-detail");
        }
        if config.per_rank_histograms {
            cmd.arg("--per-rank-histograms");
        }
        let log = dir.join("simulate.log");
        let mut child = die_with_parent(&mut cmd)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start mpi-observer __simulate");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        let mut sim = Proc::adopt("simulate", child, log);
        sim.assert_running();
        assert!(line.starts_with("simulate:"), "simulator said {line:?}");

        let vm_addr = format!("127.0.0.1:{}", free_port());
        let vm = spawn(
            "victoria-metrics",
            Command::new("victoria-metrics")
                .arg(format!(
                    "-storageDataPath={}",
                    dir.join("vm-data").display()
                ))
                .arg(format!("-httpListenAddr={vm_addr}"))
                .arg("-retentionPeriod=1")
                // Samples are visible to queries this soon after they
                // arrive (default 30 s: longer than a test's scrapes).
                .arg("-search.latencyOffset=2s")
                // The deployment's query limit: at 64 k ranks the latency
                // rule selects more series than the default allows.
                .args(deployed_search_limit())
                .arg("-loggerLevel=WARN"),
            dir,
        );
        let mut vm = vm;
        wait_for("VictoriaMetrics to answer", Duration::from_secs(60), || {
            vm.assert_running();
            http(&vm_addr, "GET", "/health", b"", Duration::from_secs(2))
                .ok()
                .filter(|(c, _)| *c == 200)
        });

        // The scrapers: one configuration, each member takes its share.
        let secs = |d: Duration| format!("{}ms", d.as_millis());
        let scrape = dir.join("scrape.yml");
        let mut yml = format!(
            "global:\n  scrape_interval: {}\n  scrape_timeout: {}\nscrape_configs:\n  - job_name: mpi-observer\n    static_configs:\n      - targets:\n",
            secs(config.scrape_interval),
            secs(config.scrape_interval.mul_f64(0.9)),
        );
        for t in &targets {
            yml.push_str(&format!("          - {t}\n"));
        }
        std::fs::write(&scrape, yml).expect("write scrape.yml");
        let (mut agents, mut agent_addrs) = (Vec::new(), Vec::new());
        for i in 0..config.shards {
            let addr = format!("127.0.0.1:{}", free_port());
            let agent = spawn(
                &format!("vmagent-{i}"),
                Command::new("vmagent")
                    .arg(format!("-promscrape.config={}", scrape.display()))
                    .arg(format!(
                        "-promscrape.cluster.membersCount={}",
                        config.shards
                    ))
                    .arg(format!("-promscrape.cluster.memberNum={i}"))
                    .arg(format!("-remoteWrite.url=http://{vm_addr}/api/v1/write"))
                    .arg(format!(
                        "-remoteWrite.tmpDataPath={}",
                        dir.join(format!("vmagent-{i}")).display()
                    ))
                    .arg(format!("-httpListenAddr={addr}"))
                    .arg("-promscrape.suppressScrapeErrors")
                    .arg("-loggerLevel=WARN"),
                dir,
            );
            agents.push(agent);
            agent_addrs.push(addr);
        }

        let alert_addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = Command::new("vmalert");
        for f in rule_files() {
            let f = if config.fast_groups {
                let text = std::fs::read_to_string(&f).expect("read a rule file");
                let to = dir.join(f.file_name().expect("a file name"));
                let every = format!("    interval: {}\n", secs(config.eval_interval));
                std::fs::write(&to, text.replace("    interval: 1m\n", &every))
                    .expect("write a rule file");
                to
            } else {
                f
            };
            cmd.arg(format!("-rule={}", f.display()));
        }
        cmd.arg(format!("-datasource.url=http://{vm_addr}"))
            .arg(format!("-remoteWrite.url=http://{vm_addr}"))
            .arg(format!("-notifier.url=http://{}", blackhole()))
            .arg(format!(
                "-evaluationInterval={}",
                secs(config.eval_interval)
            ))
            .arg(format!("-httpListenAddr={alert_addr}"))
            .arg("-loggerLevel=WARN");
        let mut alert = spawn("vmalert", &mut cmd, dir);
        wait_for("vmalert to answer", Duration::from_secs(60), || {
            alert.assert_running();
            http(&alert_addr, "GET", "/health", b"", Duration::from_secs(2))
                .ok()
                .filter(|(c, _)| *c == 200)
        });
        Pipeline {
            config,
            sim,
            vm,
            agents,
            alert,
            vm_addr,
            agent_addrs,
            alert_addr,
            targets,
            started: Instant::now(),
            scraping: true,
            _sim_out: out,
        }
    }

    /// Panics if any part exited (the scrapers and vmalert only until
    /// [`Pipeline::stop_scraping`]).
    pub fn assert_running(&mut self) {
        self.sim.assert_running();
        self.vm.assert_running();
        if self.scraping {
            self.alert.assert_running();
        }
        for a in &mut self.agents {
            a.assert_running();
        }
    }

    /// Stops the scrapers and vmalert, leaving VictoriaMetrics with what
    /// it stored. Counting every series of the store is then a query on
    /// an idle server: with 230 k series arriving every 3 s and the rules
    /// evaluated as often, the two cores here had none left for it, and
    /// it passed the server's 30 s query limit.
    pub fn stop_scraping(&mut self) {
        self.agents.clear();
        self.alert.kill();
        self.scraping = false;
    }

    /// The instant query `expr` now (VictoriaMetrics' cache bypassed):
    /// its result, or why it failed.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let v = get_json(
            &self.vm_addr,
            &format!("/api/v1/query?nocache=1&query={}", url_encode(expr)),
            Duration::from_secs(60),
        )?;
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// [`Pipeline::query`] reading only the last `lookback` of samples
    /// (VictoriaMetrics' `step` on an instant query; 5 min by default).
    /// Counting every series of a 6,400-rank job over 5 min of 3 s scrapes
    /// read millions of samples and passed the server's 30 s query limit
    /// on a loaded 2-core machine; a series scraped lately is seen as well.
    pub fn query_recent(&self, expr: &str, lookback: Duration) -> Result<Vec<Value>, String> {
        let v = get_json(
            &self.vm_addr,
            &format!(
                "/api/v1/query?nocache=1&step={}s&query={}",
                lookback.as_secs().max(1),
                url_encode(expr)
            ),
            Duration::from_secs(60),
        )?;
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// The range query `expr` over the last `range` at `step`.
    pub fn query_range(
        &self,
        expr: &str,
        range: Duration,
        step: Duration,
    ) -> Result<Vec<Value>, String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_secs();
        let v = get_json(
            &self.vm_addr,
            &format!(
                "/api/v1/query_range?nocache=1&query={}&start={}&end={now}&step={}",
                url_encode(expr),
                now - range.as_secs(),
                step.as_secs().max(1)
            ),
            Duration::from_secs(120),
        )?;
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// Waits until every node has been scraped successfully (`up == 1`).
    pub fn wait_scraped(&mut self, limit: Duration) {
        let want = self.config.nodes as usize;
        let start = Instant::now();
        loop {
            self.assert_running();
            let up = self
                .query("count(up{job=\"mpi-observer\"} == 1)")
                .ok()
                .and_then(|r| r.first().map(value))
                .unwrap_or(0.0);
            if up as usize >= want {
                return;
            }
            assert!(
                start.elapsed() < limit,
                "after {limit:?} only {up} of {want} nodes were scraped; see {}",
                self.config.dir.display()
            );
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    /// Series VictoriaMetrics holds (`/api/v1/series/count`).
    pub fn series_count(&self) -> u64 {
        get_json(
            &self.vm_addr,
            "/api/v1/series/count",
            Duration::from_secs(60),
        )
        .ok()
        .and_then(|v| v["data"][0].as_u64())
        .unwrap_or(0)
    }

    /// vmalert's alerts (pending and firing) named `name`.
    pub fn alerts(&self, name: &str) -> Vec<Value> {
        get_json(&self.alert_addr, "/api/v1/alerts", Duration::from_secs(30))
            .map(|v| {
                v["data"]["alerts"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|a| a["name"] == name)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The sum of the samples of `name` (any labels) in the Prometheus text
    /// at `addr`'s `/metrics`.
    pub fn self_metric(addr: &str, name: &str) -> f64 {
        let Ok((_, body)) = http(addr, "GET", "/metrics", b"", Duration::from_secs(10)) else {
            return 0.0;
        };
        crate::parse_metrics(&String::from_utf8_lossy(&body))
            .iter()
            .filter(|s| s.name == name)
            .map(|s| s.value)
            .sum()
    }

    /// Samples scraped so far, by all the scrapers.
    pub fn scraped_samples(&self) -> f64 {
        self.agent_addrs
            .iter()
            .map(|a| Self::self_metric(a, "vm_promscrape_scraped_samples_sum"))
            .sum()
    }

    /// One node's exposition, as the scrapers get it.
    pub fn exposition(&self, node: usize) -> String {
        let (_, body) = http(
            &self.targets[node],
            "GET",
            "/metrics",
            b"",
            Duration::from_secs(30),
        )
        .expect("scrape a simulated node");
        String::from_utf8_lossy(&body).into_owned()
    }

    /// Backfills `hours` of history before now for nodes `0..nodes`:
    /// each node's exposition now, replayed at the scrape interval with
    /// counters scaled down linearly to zero at the start, through
    /// VictoriaMetrics' `/api/v1/import/prometheus`. Returns the samples
    /// imported.
    pub fn backfill(&self, nodes: usize, range: Duration) -> u64 {
        let step = self.config.scrape_interval.as_millis() as u64;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock after 1970")
            .as_millis() as u64;
        let points = (range.as_millis() as u64 / step).max(1);
        let mut imported = 0;
        for (node, target) in self.targets.iter().take(nodes).enumerate() {
            let text = self.exposition(node);
            let extra = format!("job=\"mpi-observer\",instance=\"{target}\"");
            let series: Vec<(String, f64, bool)> = text
                .lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .filter_map(|l| {
                    let (s, v) = l.rsplit_once(' ')?;
                    let v: f64 = v.parse().ok()?;
                    let name = s.split('{').next().unwrap_or(s);
                    let counter = name.ends_with("_total")
                        || name.ends_with("_count")
                        || name.ends_with("_sum")
                        || (name.ends_with("_bucket") && !name.contains("fraction"));
                    let s = match s.split_once('{') {
                        Some((n, rest)) => format!("{n}{{{extra},{rest}"),
                        None => format!("{s}{{{extra}}}"),
                    };
                    Some((s, v, counter))
                })
                .collect();
            let mut body = String::new();
            for k in 0..points {
                let t = now_ms - range.as_millis() as u64 + k * step;
                let scale = k as f64 / points as f64;
                for (s, v, counter) in &series {
                    let v = if *counter { (v * scale).floor() } else { *v };
                    body.push_str(&format!("{s} {v} {t}\n"));
                    imported += 1;
                }
                if body.len() > 32 << 20 {
                    self.import(&body);
                    body.clear();
                }
            }
            self.import(&body);
        }
        imported
    }

    fn import(&self, body: &str) {
        if body.is_empty() {
            return;
        }
        let (code, answer) = http(
            &self.vm_addr,
            "POST",
            "/api/v1/import/prometheus",
            body.as_bytes(),
            Duration::from_secs(300),
        )
        .expect("import into VictoriaMetrics");
        assert!(
            code / 100 == 2,
            "import answered {code}: {}",
            String::from_utf8_lossy(&answer)
        );
    }
}

/// An instant-query result's value.
pub fn value(r: &Value) -> f64 {
    r["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

/// One dashboard panel's query.
#[derive(Clone, Debug)]
pub struct PanelExpr {
    /// The dashboard file's name.
    pub dashboard: String,
    /// The panel's title.
    pub panel: String,
    /// The expression as written.
    pub raw: String,
    /// The panel says it reads rank × peer series, which only a
    /// `/metrics/ranks` scrape job (or `--per-rank-detail`) brings: no data
    /// from the bounded `/metrics` alone is what it documents.
    pub ranks_only: bool,
}

/// Every `expr` of every panel (rows' nested panels included) in
/// dashboards/grafana/*.json.
/// What a panel's description says when it needs a `/metrics/ranks` scrape
/// job ([`PanelExpr::ranks_only`]).
pub const RANKS_ONLY: &str = "from /metrics/ranks only";

pub fn dashboard_exprs() -> Vec<PanelExpr> {
    let dir = workspace_root().join("dashboards/grafana");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).expect("read dashboard"))
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        fn walk(panels: &Value, dashboard: &str, out: &mut Vec<PanelExpr>) {
            for p in panels.as_array().into_iter().flatten() {
                let title = p["title"].as_str().unwrap_or("").to_string();
                let ranks_only = p["description"]
                    .as_str()
                    .is_some_and(|d| d.contains(RANKS_ONLY));
                for t in p["targets"].as_array().into_iter().flatten() {
                    if let Some(e) = t["expr"].as_str().filter(|e| !e.trim().is_empty()) {
                        out.push(PanelExpr {
                            dashboard: dashboard.into(),
                            panel: title.clone(),
                            raw: e.into(),
                            ranks_only,
                        });
                    }
                }
                walk(&p["panels"], dashboard, out);
            }
        }
        walk(&v["panels"], &name, &mut out);
    }
    out
}

/// Values for a dashboard's template variables.
#[derive(Clone, Debug)]
pub struct Vars {
    /// `$jobid`.
    pub jobid: String,
    /// `$rank` (the drill-down text box): a world rank, or `.*` for all.
    pub rank: String,
    /// `$instance`: a node's address.
    pub instance: String,
    /// `$__rate_interval`, `$__interval`.
    pub rate_interval: String,
}

/// `expr` with Grafana's variables replaced: `$name` and `${name}` (and
/// `${name:fmt}`). Inside a regex matcher (`=~"$x"`, `!~`) an unknown or
/// multi-value variable becomes `.*` (Grafana's "All"); in an equality, the
/// one value.
pub fn substitute(expr: &str, vars: &Vars) -> String {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(i) = rest.find('$') {
        let (before, after) = rest.split_at(i);
        out.push_str(before);
        let after = &after[1..];
        let (name, len) = if let Some(b) = after.strip_prefix('{') {
            let end = b.find('}').unwrap_or(b.len());
            let name = b[..end].split(':').next().unwrap_or("");
            (name.to_string(), end + 2)
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (after[..end].to_string(), end)
        };
        let regex = out.ends_with("=~\"") || out.ends_with("!~\"");
        let v = match name.as_str() {
            "jobid" => vars.jobid.clone(),
            "rank" => vars.rank.clone(),
            "uid" => "0".into(),
            "instance" | "node" if regex => ".*".into(),
            "instance" | "node" => vars.instance.clone(),
            "scrape_job" | "job" => "mpi-observer".into(),
            "function" if regex => ".*".into(),
            "function" => "MPI_Allreduce".into(),
            "__rate_interval" | "__interval" => vars.rate_interval.clone(),
            "__range" => "1h".into(),
            _ if regex => ".*".into(),
            other => panic!("unknown dashboard variable ${other} in {expr}"),
        };
        out.push_str(&v);
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// The p-th percentile (0..=100) of `v`, by nearest rank.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let i = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[i.clamp(1, v.len()) - 1]
}
