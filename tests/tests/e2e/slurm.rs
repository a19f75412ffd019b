//! mpi-observer deployed on a real Slurm cluster as the README's
//! "Deploying on a Slurm cluster" says, step by step (issue 26): Debian's
//! slurmctld, slurmd and munge on this machine, three compute nodes each in
//! namespaces of their own ([`e2e::slurm`], tests/slurm/cluster.sh), jobs
//! submitted with `srun` and `sbatch` by the unprivileged user `mpiobs`.
//!
//! The README's commands are the ones this test runs; keep them in step:
//! - the .deb (`cargo xtask package`) installed with `dpkg -i` (once on the
//!   host: the nodes share its root file system, as nodes booting one image
//!   do), and at the end purged: no file, no daemon, no probe left;
//! - the site's TLS files in `/etc/mpi-observer/` (0700; root's, 0600):
//!   the package's example web config with bcrypt hashes for two users
//!   (`prometheus`, `epilog`), one certificate from a test CA (rcgen,
//!   [`e2e::tls`]) naming every node's name and address, its key, the CA
//!   (`ca.crt`) and the Epilog's `epilog.auth`; left by the purge (the
//!   site's), removed by the test;
//! - `/etc/default/mpi-observer` edited (`MPI_OBSERVER_OPTS`,
//!   `MPI_OBSERVER_EPILOG_HTML=yes`, `MPI_OBSERVER_EPILOG_CA`,
//!   `MPI_OBSERVER_EPILOG_AUTH_FILE`), one daemon per node started from the
//!   installed unit's ExecStart (PID 1 is not systemd here) with its
//!   `LoadCredential=` files, so serving HTTPS with basic auth, in the
//!   node's namespaces, listening on `0.0.0.0:9479` (`--same-netns`: the
//!   nodes share one pid namespace; a real node does not need it);
//! - Slurm's configuration: Debian's `/etc/slurm/plugstack.conf` (which
//!   includes the postinst's `plugstack.conf.d/mpi-observer.conf`, then
//!   edited to `default=stats`), `Epilog=/usr/lib/mpi-observer/slurm-epilog`;
//! - a real Prometheus scraping the three daemons over HTTPS with the CA
//!   and a password (the package's `deploy/scrape-tls.yml`), asserted
//!   through `/api/v1/query`, the scheduler facts joined in PromQL.
//!
//! What is asserted:
//! - each daemon serves HTTPS only: plain HTTP gets 400, HTTPS without a
//!   password 401, the Epilog's user 200 (so the reports below were read
//!   through https with the CA and the Epilog's password file);
//! - Open MPI through `srun --mpi=pmix` and MPICH through `srun --mpi=pmi2`,
//!   6 ranks on 3 nodes, exact per-rank counts through `--mpi-observer=stats`
//!   (the shim in every rank) and through the probes (`--mpi-observer=off`
//!   under a site's `default=stats`: no shim in any rank's /proc/PID/maps).
//!   Until ranks are found at exec by eBPF, the program holds at its go file
//!   until each node's daemon has them: the once-a-second scan is the only
//!   discovery in a node's network namespace (no process connector there);
//! - a bad `--mpi-observer` value: one line on srun's stderr, the job runs;
//! - a job array and a two-step job (`sbatch -A physics`): the scheduler
//!   labels through Prometheus, and each job's report (text and HTML) in its
//!   directory (`sbatch -D`), owned by `mpiobs`, naming the job and ranks,
//!   with the job's exact MPI_Allreduce count (the array's tasks run through
//!   and end between two reads of their daemon: a shim rank's final figures
//!   reach the report); the second step's ranks are `R#step1` (no identity
//!   conflict) and the report says each rank's step.
//!
//! The module takes about 45 s here (2 cores): MPI start-up dominates.

use std::{
    collections::BTreeSet,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use e2e::{
    Job, Mpi, Need, Prometheus, Sample, assert_no_probes_left, compile, http_get, mix_expected,
    package::{
        DEFAULTS, Installed, PKG, PLUGSTACK, SHIM, deb, dpkg, plugin, status,
        unit_launcher_with_credentials,
    },
    parse_metrics, program, require, run_with_timeout, scratch,
    slurm::{NODES, OTHER_USER, PARTITION, STATE, SlurmCluster, USER, node_addr, node_name},
    sum,
    tls::{WEB_USER, basic, get_tls, make_certs_for, tls_client, web_config_users},
    url_encode, wait_for,
};
use serde_json::Value;

/// Rounds of mix.c's counted phase.
const ITERS: u64 = 30;
/// Ranks of the srun jobs: two per node.
const NP: u32 = 6;
/// The daemons' port, in each node's network namespace.
const PORT: u16 = 9479;
/// The installed Epilog.
const EPILOG: &str = "/usr/lib/mpi-observer/slurm-epilog";
/// Debian's plugstack.conf (`include /etc/slurm/plugstack.conf.d/*.conf`).
const DEBIAN_PLUGSTACK: &str = "/etc/slurm/plugstack.conf";
/// The account the batch jobs are charged to.
const ACCOUNT: &str = "physics";
/// The site's options, as the README's step sets them.
const OPTS: &str = "MPI_OBSERVER_OPTS=\"--all --same-netns --listen 0.0.0.0:9479\"";
/// The site's TLS files and passwords (README, "Install from a package"),
/// which the unit's `LoadCredential=` lines name.
const SITE: &str = "/etc/mpi-observer";
/// The CA that signed the nodes' certificate, for the Epilog
/// (`MPI_OBSERVER_EPILOG_CA`) and Prometheus.
const CA: &str = "/etc/mpi-observer/ca.crt";
/// The Epilog's `user:password` (`MPI_OBSERVER_EPILOG_AUTH_FILE`).
const EPILOG_AUTH: &str = "/etc/mpi-observer/epilog.auth";
/// The web config's users: Prometheus (and this test's own scrapes), and
/// the Epilog.
const SCRAPE_PASSWORD: &str = "slurm-scrape-s3cret";
const EPILOG_USER: &str = "epilog";
const EPILOG_PASSWORD: &str = "slurm-epilog-s3cret";
/// Says that [`SITE`] is this test's, so a killed run's may be swept.
const SITE_MARK: &str = ".mpi-observer-e2e-slurm";

fn required() -> bool {
    require(&[
        Need::Root,
        Need::Mpi(Mpi::OpenMpi),
        Need::Mpi(Mpi::Mpich),
        Need::Command("dpkg"),
        Need::Command("bpftool"),
        Need::Command("slurmctld"),
        Need::Command("slurmd"),
        Need::Command("munged"),
        Need::Command("srun"),
        Need::Command("prometheus"),
        Need::Command("nsenter"),
        Need::Command("runuser"),
        Need::Command("setpriv"),
    ])
}

/// The package's paths that do not exist before it is installed: none may
/// be left after the purge.
fn new_paths(deb: &Path) -> BTreeSet<PathBuf> {
    let o = dpkg(&["--contents", deb.to_str().unwrap()]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| PathBuf::from(p.trim_start_matches('.')))
        .filter(|p| p != Path::new("/") && std::fs::symlink_metadata(p).is_err())
        .collect()
}

/// The installed /etc/default/mpi-observer with the site's edits (README
/// steps 2 and 4): the options, HTML reports from the Epilog too, and how
/// the Epilog reads the daemons (the CA, its password file).
fn edit_defaults() {
    let text = std::fs::read_to_string(DEFAULTS).unwrap();
    let edits = [
        ("MPI_OBSERVER_OPTS=", OPTS.to_string()),
        (
            "MPI_OBSERVER_EPILOG_HTML=no",
            "MPI_OBSERVER_EPILOG_HTML=yes".into(),
        ),
        (
            "MPI_OBSERVER_EPILOG_CA=",
            format!("MPI_OBSERVER_EPILOG_CA={CA}"),
        ),
        (
            "MPI_OBSERVER_EPILOG_AUTH_FILE=",
            format!("MPI_OBSERVER_EPILOG_AUTH_FILE={EPILOG_AUTH}"),
        ),
    ];
    let mut done = vec![false; edits.len()];
    let edited: String = text
        .lines()
        .map(|l| {
            // The shipped value is replaced: `KEY=` alone for the Epilog's,
            // whatever follows for the options.
            let hit = edits
                .iter()
                .position(|(k, _)| l == *k || (k.ends_with("OPTS=") && l.starts_with(k)));
            match hit {
                Some(i) => {
                    done[i] = true;
                    format!("{}\n", edits[i].1)
                }
                None => format!("{l}\n"),
            }
        })
        .collect();
    for ((k, _), d) in edits.iter().zip(done) {
        assert!(d, "{DEFAULTS} has a line {k:?} to edit:\n{text}");
    }
    std::fs::write(DEFAULTS, edited).unwrap();
}

/// The site's files in [`SITE`], installed as the README says (the
/// directory 0700, every file root's and 0600 but the CA's certificate):
/// the web config from the package's example with two users (Prometheus,
/// the Epilog), one certificate for every node's name and address (the
/// Epilog asks `https://nodeN:9479`, Prometheus and this test the
/// addresses), its key, the CA, the Epilog's password file. Removed when
/// dropped: the package's purge leaves it, as it does a site's.
struct SiteFiles;

impl SiteFiles {
    fn install(dir: &Path) -> SiteFiles {
        let site = Path::new(SITE);
        if std::fs::symlink_metadata(site).is_ok() {
            assert!(
                site.join(SITE_MARK).is_file(),
                "{SITE} exists and is not a killed run's of this test: \
                 refusing to replace a site's TLS files; move it away to run the test"
            );
            eprintln!("slurm: sweeping a stale {SITE}");
            std::fs::remove_dir_all(site).unwrap();
        }
        let made = dir.join("site");
        std::fs::create_dir_all(&made).unwrap();
        let names: Vec<String> = (1..=NODES)
            .flat_map(|i| [node_name(i), node_addr(i)])
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        make_certs_for(&made, &names);
        web_config_users(
            Path::new("/usr/share/mpi-observer/deploy/web-config.yml"),
            &made,
            &[(WEB_USER, SCRAPE_PASSWORD), (EPILOG_USER, EPILOG_PASSWORD)],
        );
        std::fs::write(
            made.join("epilog.auth"),
            format!("{EPILOG_USER}:{EPILOG_PASSWORD}\n"),
        )
        .unwrap();
        let guard = SiteFiles;
        let install = |args: &[&str]| {
            let o = Command::new("install").args(args).status().unwrap();
            assert!(o.success(), "install {args:?}");
        };
        install(&["-d", "-m", "0700", SITE]);
        std::fs::write(site.join(SITE_MARK), "").unwrap();
        for (f, mode) in [
            ("web-config.yml", "0600"),
            ("tls.crt", "0600"),
            ("tls.key", "0600"),
            ("epilog.auth", "0600"),
            ("ca.crt", "0644"),
        ] {
            install(&["-m", mode, made.join(f).to_str().unwrap(), SITE]);
        }
        guard
    }
}

impl Drop for SiteFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(SITE);
    }
}

/// An HTTPS client trusting the site's CA only.
fn client() -> &'static std::sync::Arc<rustls::ClientConfig> {
    static CLIENT: std::sync::OnceLock<std::sync::Arc<rustls::ClientConfig>> =
        std::sync::OnceLock::new();
    CLIENT.get_or_init(|| tls_client(Path::new(CA)))
}

/// `path` of node `i`'s daemon over HTTPS as `user`, as Prometheus
/// reads it: the answer's status and body.
fn get_node(i: usize, path: &str, auth: Option<(&str, &str)>) -> std::io::Result<(u16, String)> {
    let headers: Vec<(&str, String)> = auth.map(|(u, p)| basic(u, p)).into_iter().collect();
    let r = get_tls(
        client(),
        &format!("{}:{PORT}", node_addr(i)),
        path,
        &headers,
    )?;
    Ok((r.status, r.text()))
}

/// Node `i`'s daemon's /metrics over HTTPS as Prometheus, parsed.
fn scrape(i: usize) -> Vec<Sample> {
    let (code, body) = get_node(i, "/metrics", Some((WEB_USER, SCRAPE_PASSWORD)))
        .unwrap_or_else(|e| panic!("scraping node{i}: {e}"));
    assert_eq!(code, 200, "node{i}'s /metrics");
    parse_metrics(&body)
}

/// The installed scrape-tls.yml (README step 5), its CA and password
/// files copied into `dir` for Prometheus: its `scrape_configs:` up to the
/// targets.
fn scrape_tls(dir: &Path) -> String {
    const SNIPPET: &str = "/usr/share/mpi-observer/deploy/scrape-tls.yml";
    const CA_AT: &str = "/etc/prometheus/mpi-observer-ca.crt";
    const PASSWORD_AT: &str = "/etc/prometheus/mpi-observer.password";
    let snippet = std::fs::read_to_string(SNIPPET).unwrap();
    for (path, what) in [(CA_AT, "CA"), (PASSWORD_AT, "password file")] {
        assert!(snippet.contains(path), "{SNIPPET} names its {what} {path}");
    }
    assert!(
        snippet.contains(&format!("username: {WEB_USER}")),
        "{SNIPPET} scrapes as {WEB_USER}"
    );
    let (ca, password) = (dir.join("mpi-observer-ca.crt"), dir.join("password"));
    std::fs::copy(CA, &ca).unwrap();
    std::fs::write(&password, SCRAPE_PASSWORD).unwrap();
    snippet
        .replace(CA_AT, ca.to_str().unwrap())
        .replace(PASSWORD_AT, password.to_str().unwrap())
}

/// Every node's scrape.
fn scrape_all() -> Vec<Vec<Sample>> {
    (1..=NODES).map(scrape).collect()
}

/// One node's daemon, started as the unit starts it (the installed
/// ExecStart through [`unit_launcher`]'s script) in the node's namespaces,
/// its stderr in a log file. A thread reaps it as soon as it exits: the
/// package's prerm waits for the daemons it signals to be gone from /proc,
/// which a zombie is not.
struct NodeDaemon {
    node: usize,
    pid: u32,
    log: PathBuf,
    exited: std::sync::mpsc::Receiver<std::process::ExitStatus>,
    /// Its exit seen: its pid is no longer ours to signal.
    reaped: bool,
}

impl NodeDaemon {
    fn start(cl: &SlurmCluster, node: usize, launcher: &Path, dir: &Path) -> NodeDaemon {
        let log = dir.join(format!("daemon-node{node}.log"));
        let mut child = cl
            .exec(node)
            .arg(launcher)
            .arg("attach")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start a node's daemon");
        let pid = child.id();
        let (tx, exited) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            if let Ok(st) = child.wait() {
                let _ = tx.send(st);
            }
        });
        NodeDaemon {
            node,
            pid,
            log,
            exited,
            reaped: false,
        }
    }

    /// Panics with its log if it exited.
    fn assert_running(&self) {
        if let Ok(st) = self.exited.try_recv() {
            panic!(
                "node{}'s daemon exited ({st}):\n{}",
                self.node,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }

    /// Panics unless a line of its log contains `line`.
    fn assert_log(&self, line: &str) {
        let log = std::fs::read_to_string(&self.log).unwrap();
        assert!(
            log.lines().any(|l| l.contains(line)),
            "node{}'s daemon says {line:?}:\n{log}",
            self.node
        );
    }

    /// Waits until it exits (someone else signalled it).
    fn wait_exit(mut self, limit: Duration) -> std::process::ExitStatus {
        let st = self
            .exited
            .recv_timeout(limit)
            .unwrap_or_else(|_| panic!("node{}'s daemon still runs after {limit:?}", self.node));
        self.reaped = true;
        st
    }
}

impl Drop for NodeDaemon {
    fn drop(&mut self) {
        if !self.reaped && self.exited.try_recv().is_err() {
            let _ = Command::new("kill")
                .args(["-KILL", &self.pid.to_string()])
                .status();
            let _ = self.exited.recv_timeout(Duration::from_secs(10));
        }
    }
}

/// Whether process `pid` maps the shim; panics if it maps one that is not
/// the package's (the plugin's default `shim=` is where the package puts it).
fn maps_shim(pid: u32) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/maps: {e}"));
    let any = maps.contains("libmpi_observer_shim");
    assert!(
        !any || maps.contains(SHIM),
        "pid {pid} maps a shim that is not {SHIM}:\n{maps}"
    );
    any
}

/// `name`'s value in process `pid`'s environment (as it was started).
fn environ(pid: u32, name: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/environ: {e}"));
    env.split(|b| *b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{name}=")).map(str::to_string)
    })
}

/// One Prometheus instant query's result vector.
fn query(prom: &Prometheus, expr: &str) -> Vec<Value> {
    let (code, body) = http_get(
        &prom.addr,
        &format!("/api/v1/query?query={}", url_encode(expr)),
    )
    .expect("query Prometheus");
    assert_eq!(code, 200, "{expr}: {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// Waits until `expr` returns exactly `n` series; returns their labels.
fn wait_series(prom: &Prometheus, expr: &str, n: usize) -> Vec<Value> {
    wait_for(
        &format!("Prometheus: {n} series of {expr}"),
        Duration::from_secs(60),
        || {
            let r = query(prom, expr);
            (r.len() == n).then(|| r.into_iter().map(|s| s["metric"].clone()).collect())
        },
    )
}

/// A 6-rank mix.c job on the 3 nodes through `srun` as `mpiobs`, held at
/// its go file `go-NAME` (in `dir`, which every node sees); srun's own
/// stderr (its lines and the tasks') goes to the returned file, `NAME.err`.
///
/// Each job has files of its own: its go file, and under Open MPI its own
/// session directory (`orte_tmpdir_base`, in each node's private /tmp):
/// Open MPI 4.1 fails a launch whose `/tmp/ompi.HOST.UID` another launch of
/// the same user creates or removes at the same moment ("orte_session_dir
/// failed").
fn srun_job(
    cl: &SlurmCluster,
    dir: &Path,
    mpi: Mpi,
    exe: &Path,
    option: &str,
    name: &str,
) -> (Job, PathBuf) {
    let plugin = if mpi.is_open_mpi() { "pmix" } else { "pmi2" };
    let err = dir.join(format!("{name}.err"));
    let _ = std::fs::remove_file(&err);
    // `sh -c 'exec srun "$@" 2>"$0"' ERR ARGS...`: srun's stderr in ERR,
    // written as mpiobs.
    let mut c = cl.as_user(dir, "sh");
    c.args(["-c", "exec srun \"$@\" 2>\"$0\""]).arg(&err).args([
        // Not srun's "job N queued and waiting for resources" while an
        // earlier job ends: its errors only.
        "--quiet",
        "-N3",
        &format!("-n{NP}"),
        &format!("--mpi={plugin}"),
        option,
    ]);
    if mpi.is_open_mpi() {
        c.arg(format!(
            "--export=ALL,OMPI_MCA_orte_tmpdir_base=/tmp/ompi-{name}"
        ));
    }
    c.arg(exe).arg(ITERS.to_string());
    let job = Job::spawn(c, NP, dir.join(format!("go-{name}")));
    (job, err)
}

/// The lines of srun's stderr file `err`.
fn err_lines(err: &Path) -> Vec<String> {
    std::fs::read_to_string(err)
        .unwrap_or_else(|e| panic!("{}: {e}", err.display()))
        .lines()
        .map(str::to_string)
        .collect()
}

/// Waits until each rank of `job` is observed by its node's daemon (the one
/// whose `mpi_rank_info` has its pid): attached with probes, or holding its
/// shim segment (the stats layer's request gauge). Returns the job's id and,
/// per rank, its node.
fn wait_observed(job: &Job, shim: bool) -> (String, Vec<usize>) {
    let start = Instant::now();
    loop {
        let all = scrape_all();
        let mut jobid: Option<String> = None;
        let mut nodes = Vec::new();
        let mut missing = Vec::new();
        for (rank, pid) in &job.ranks {
            let p = pid.to_string();
            let found = all.iter().enumerate().find_map(|(i, s)| {
                s.iter()
                    .find(|x| x.name == "mpi_rank_info" && x.label("pid") == Some(&p))
                    .map(|x| (i, x))
            });
            let Some((i, info)) = found else {
                missing.push(format!("rank {rank} pid {pid}: not seen"));
                continue;
            };
            let id = info.label("jobid").unwrap_or_default().to_string();
            assert_eq!(info.label("rank"), Some(rank.to_string().as_str()));
            let s = &all[i];
            let want = [("jobid", id.as_str()), ("rank", &rank.to_string())];
            let ready = if shim {
                s.iter().any(|x| {
                    x.name == "mpi_requests_outstanding"
                        && want.iter().all(|(k, v)| x.label(k) == Some(v))
                })
            } else {
                sum(s, "mpi_rank_up", &want) == 1.0
            };
            if !ready {
                missing.push(format!("rank {rank} pid {pid}: not ready on node{}", i + 1));
            }
            assert_eq!(jobid.get_or_insert(id.clone()), &id, "one job id");
            nodes.push(i + 1);
        }
        let probes: f64 = all
            .iter()
            .map(|s| sum(s, "mpi_observer_attached_processes", &[]))
            .sum();
        if missing.is_empty() && (shim || probes >= NP as f64) {
            return (jobid.unwrap(), nodes);
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "30 s on, the node daemons do not observe every rank ({probes} attached): {missing:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs `job` to its end and asserts mix.c's exact per-rank counts, each
/// rank on its own node's daemon only.
fn assert_exact(job: Job, jobid: &str, nodes: &[usize]) {
    job.finish("OK ");
    let all = wait_for(
        "every daemon to notice the job's end",
        Duration::from_secs(30),
        || {
            let all = scrape_all();
            all.iter()
                .all(|s| sum(s, "mpi_rank_up", &[("jobid", jobid)]) == 0.0)
                .then_some(all)
        },
    );
    for (rank, node) in (0..NP).zip(nodes) {
        let r = rank.to_string();
        for (i, s) in all.iter().enumerate() {
            let want = [("jobid", jobid), ("rank", r.as_str())];
            let calls = sum(s, "mpi_calls_total", &want);
            if i + 1 != *node {
                assert_eq!(calls, 0.0, "rank {rank} of job {jobid} on node{}", i + 1);
                continue;
            }
            for (f, (n, ..)) in mix_expected(rank, ITERS, true) {
                if f == "MPI_Finalize" {
                    continue;
                }
                assert_eq!(
                    sum(s, "mpi_calls_total", &[want[0], want[1], ("function", f)]),
                    n as f64,
                    "job {jobid} rank {rank} (node{node}) {f}"
                );
            }
        }
    }
}

/// `srun ARGS` as `mpiobs`: its output, asserting success.
fn srun(cl: &SlurmCluster, dir: &Path, args: &[&str]) -> (String, String) {
    let o = run_with_timeout(cl.as_user(dir, "srun").args(args), Duration::from_secs(60));
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    );
    assert!(o.status.success(), "srun {args:?}: {}\n{err}", o.status);
    (out, err)
}

/// How many of 3 tasks (one per node) map the shim: each prints its own
/// /proc/self/maps' shim lines.
fn tasks_with_shim(cl: &SlurmCluster, dir: &Path, option: Option<&str>) -> usize {
    let mut args = vec!["-N3", "-n3"];
    args.extend(option);
    args.extend([
        "sh",
        "-c",
        "grep -c libmpi_observer_shim /proc/self/maps || true",
    ]);
    let (out, _) = srun(cl, dir, &args);
    out.lines().filter(|l| l.trim() != "0").count()
}

/// A batch script: `steps` srun steps of steady.c (MPICH, `--mpi=pmi2`),
/// step S held at its go file `go-NAME-S` and again, its counted phase done,
/// at `stop-NAME-S` (`S`: the array task id in an array).
///
/// The second hold lets the test read a step's labels while it runs (a
/// job's info series has its lowest running rank's step); the array's
/// tasks get their stop file with their go file and run through.
fn batch_script(dir: &Path, name: &str, exe: &Path, steps: usize) -> PathBuf {
    let mut s = String::from("#!/bin/sh\nset -e\n");
    for step in 0..steps {
        let s_ = format!("{name}-${{SLURM_ARRAY_TASK_ID:-{step}}}");
        s.push_str(&format!(
            "srun --mpi=pmi2 {} {ITERS} \"$PWD/go-{s_}\" \"$PWD/stop-{s_}\"\n",
            exe.display()
        ));
    }
    let p = dir.join(format!("{name}.sh"));
    std::fs::write(&p, s).unwrap();
    let ok = Command::new("chmod").arg("755").arg(&p).status().unwrap();
    assert!(ok.success());
    p
}

/// The labels of an info series, as (name, value), without Prometheus's
/// own (`__name__`, `instance`, `job`).
fn facts(m: &Value) -> Vec<(String, String)> {
    m.as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| !["__name__", "instance", "job"].contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
        .collect()
}

/// Asserts job `jobid`'s report files in `dir`: the text one names the job,
/// its user's uid, then `ranks` (its ranks and nodes), and counts
/// `allreduce` MPI_Allreduce calls; the HTML one is a document; both are
/// `mpiobs`'s.
fn assert_reports(dir: &Path, jobid: &str, uid: u32, ranks: &str, allreduce: u64) {
    for ext in ["txt", "html"] {
        let p = dir.join(format!("mpi-observer-{jobid}.{ext}"));
        let md = std::fs::symlink_metadata(&p)
            .unwrap_or_else(|e| panic!("{}: {e} (the Epilog's report)", p.display()));
        assert!(md.is_file() && md.len() > 0, "{}", p.display());
        assert_eq!(
            (md.uid(), md.gid()),
            (uid, uid),
            "{} is mpiobs's",
            p.display()
        );
        let text = std::fs::read_to_string(&p).unwrap();
        if ext == "txt" {
            let head = format!("job {jobid} of uid {uid} ({ranks}");
            assert!(
                text.contains(&head),
                "{} names {head:?}:\n{text}",
                p.display()
            );
            // The final figures: every rank's exit seen, its calls in
            // ("Top functions": name, calls, ...).
            let calls = text.lines().find_map(|l| {
                let mut w = l.split_whitespace();
                (w.next() == Some("MPI_Allreduce")).then(|| w.next()?.parse::<u64>().ok())?
            });
            assert!(
                calls == Some(allreduce) && !text.contains("(running)"),
                "{}: {allreduce} MPI_Allreduce calls, every rank ended:\n{text}",
                p.display()
            );
        } else {
            assert!(
                text.trim_start()
                    .to_ascii_lowercase()
                    .starts_with("<!doctype html"),
                "{}",
                p.display()
            );
        }
    }
}

/// Step 8b: job `victim` of `mpiobs` (one MPICH rank on node1, run
/// through at once), while `mpiobs2` runs one MPICH rank on node1 claiming
/// its job id from her environment, held until the victim's report is
/// written. Asserts her rank was observed under the victim's job id, and
/// that the victim's report names the victim's uid only and came without
/// waiting for her rank.
fn claimed_job_report(cl: &SlurmCluster, dir: &Path, exe: &Path, uid: u32) {
    let other = cl.other_uid();
    let script = dir.join("victim.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nset -e\n\
             srun --mpi=pmi2 {} {ITERS} \"$PWD/go-victim\" \"$PWD/stop-victim\"\n\
             : >\"$PWD/ended-victim\"\n",
            exe.display()
        ),
    )
    .unwrap();
    let ok = Command::new("chmod")
        .arg("755")
        .arg(&script)
        .status()
        .unwrap();
    assert!(ok.success());
    let d = dir.to_str().unwrap();
    let victim = cl.sbatch(
        dir,
        &[
            "-D",
            d,
            "-N1",
            "-n1",
            "-w",
            "node1",
            script.to_str().unwrap(),
        ],
    );
    let rank_of = |samples: &[Sample], who: u32| -> Option<String> {
        samples
            .iter()
            .find(|x| {
                x.name == "mpi_rank_info"
                    && x.label("jobid") == Some(victim.as_str())
                    && x.label("uid") == Some(who.to_string().as_str())
            })
            .and_then(|x| x.label("pid").map(str::to_string))
    };
    wait_for(
        "node1's daemon to observe the victim's rank",
        Duration::from_secs(60),
        || rank_of(&scrape(1), uid),
    );

    // Her rank: mpiobs2's MPICH job on node1 (Hydra, fork launcher), its
    // one process started through `env` with the victim's job id.
    let her_dir = Path::new(STATE).join("jobs/other");
    std::fs::create_dir_all(&her_dir).unwrap();
    let mut c = cl.exec(1);
    c.args(["runuser", "-u", OTHER_USER, "--"])
        .arg(Mpi::Mpich.mpirun())
        .args(["-launcher", "fork", "-np", "1", "env"])
        .arg(format!("SLURM_JOB_ID={victim}"))
        .arg(exe)
        .arg(ITERS.to_string())
        .current_dir(&her_dir);
    let her = Job::spawn_held(c, 1, her_dir.join("go-her"), her_dir.join("stop-her"));
    let her_pid = her.pid(0).to_string();
    wait_for(
        "node1's daemon to hold her rank under the victim's job id",
        Duration::from_secs(30),
        || {
            let s = scrape(1);
            (rank_of(&s, other).as_deref() == Some(her_pid.as_str())
                && sum(
                    &s,
                    "mpi_rank_up",
                    &[("jobid", &victim), ("uid", &other.to_string())],
                ) == 1.0)
                .then_some(())
        },
    );
    // Her claim is in the daemon's report data: without --uid, a report
    // of the job has her section.
    let o = run_with_timeout(
        Command::new("/usr/bin/mpi-observer")
            .args(["report", "--url"])
            .arg(format!("https://{}:{PORT}", node_addr(1)))
            .args([
                "--ca-file",
                CA,
                "--auth-file",
                EPILOG_AUTH,
                "--job",
                &victim,
            ]),
        Duration::from_secs(30),
    );
    let all = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && all.contains(&format!("job {victim} of uid {other} (")),
        "the unfiltered report has her claim: {all}{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // The victim's job runs through and ends; the Epilog writes its report.
    std::fs::write(dir.join("stop-victim"), "stop").unwrap();
    std::fs::write(dir.join("go-victim"), "go").unwrap();
    let ended = dir.join("ended-victim");
    wait_for(
        "the victim's batch script to end",
        Duration::from_secs(60),
        || ended.exists().then_some(()),
    );
    let t = Instant::now();
    cl.wait_gone(&victim, Duration::from_secs(60));
    let epilog = t.elapsed();
    // Her rank ran through it all.
    assert!(
        Path::new(&format!("/proc/{her_pid}")).exists(),
        "her rank still runs"
    );
    assert!(
        epilog < Duration::from_secs(12),
        "the job left squeue {epilog:?} after its script ended: the Epilog waited for her \
         running rank (its wait gives up at 15 s)"
    );
    for ext in ["txt", "html"] {
        let p = dir.join(format!("mpi-observer-{victim}.{ext}"));
        let text = std::fs::read_to_string(&p)
            .unwrap_or_else(|e| panic!("{}: {e} (the Epilog's report)", p.display()));
        assert!(
            !text.contains(&format!("uid {other}")),
            "{}: nothing of uid {other}'s:\n{text}",
            p.display()
        );
        if ext == "txt" {
            assert!(
                text.contains(&format!("job {victim} of uid {uid} (1 ranks on node1)")),
                "{}:\n{text}",
                p.display()
            );
            assert_eq!(
                text.matches(&format!("job {victim} of uid")).count(),
                1,
                "one job in {}:\n{text}",
                p.display()
            );
        }
    }
    her.finish("OK ");
    eprintln!("slurm: the claimed job's Epilog took {epilog:?}");
}

#[test]
fn site_deployment_on_a_slurm_cluster() {
    if !required() {
        return;
    }
    let t0 = Instant::now();
    // Where the module's time goes (CI's budget is tight).
    let phase = |what: &str| eprintln!("slurm: {what} at {:.1} s", t0.elapsed().as_secs_f64());
    let dir = scratch("slurm");
    let deb = deb();
    if !status().is_empty() {
        e2e::package::purge();
    }
    let fresh = new_paths(&deb);

    // 1. The package, and the site's options.
    let package = Installed::new(&deb);
    assert!(Path::new(EPILOG).is_file(), "{EPILOG} is installed");
    // The plugin's line, without shim=: the plugin knows where the package
    // puts the shim (every job below that maps one maps SHIM).
    let line = std::fs::read_to_string(PLUGSTACK).expect("the postinst's plugstack line");
    assert!(
        line.lines().any(|l| l == format!("optional {}", plugin())),
        "{PLUGSTACK}:\n{line}"
    );
    edit_defaults();
    // The TLS files and passwords the unit loads, and the Epilog's.
    let site = SiteFiles::install(&dir);

    phase("installed");
    // 2. Slurm, configured as the README says.
    let cl = SlurmCluster::up(&[
        ("MPIOBS_SLURM_EPILOG", EPILOG),
        ("MPIOBS_SLURM_PLUGSTACK", DEBIAN_PLUGSTACK),
    ]);
    let uid = cl.uid();

    phase("cluster up");
    // 3. One daemon per node, as the unit starts it: its web config,
    // certificate and key loaded from /etc/mpi-observer/.
    let launcher = unit_launcher_with_credentials(&dir);
    let daemons: Vec<NodeDaemon> = (1..=NODES)
        .map(|i| NodeDaemon::start(&cl, i, &launcher, &dir))
        .collect();
    for (i, d) in (1..=NODES).zip(daemons.iter()) {
        wait_for(
            &format!("node{i}'s daemon to serve /metrics over HTTPS"),
            Duration::from_secs(60),
            || {
                d.assert_running();
                get_node(i, "/metrics", Some((WEB_USER, SCRAPE_PASSWORD)))
                    .ok()
                    .filter(|(c, _)| *c == 200)
            },
        );
        let node = scrape(i);
        assert_eq!(
            sum(&node, "mpi_observer_node_info", &[("node", &node_name(i))]),
            1.0,
            "node{i}'s daemon is in node{i}"
        );
        // Only HTTPS with a password gets anything: the reports below came
        // that way. Plain HTTP is refused, and so is HTTPS without a
        // password; the Epilog's user is one of the web config's.
        d.assert_log("mpi-observer: serving https://0.0.0.0:9479/metrics");
        let addr = format!("{}:{PORT}", node_addr(i));
        for path in ["/metrics", "/report.json"] {
            let (code, body) = http_get(&addr, path).unwrap();
            assert!(
                code == 400 && body.contains("HTTPS") && !body.contains("mpi_"),
                "node{i}: plain HTTP {path}: {code} {body}"
            );
            let (code, _) = get_node(i, path, None).unwrap();
            assert_eq!(code, 401, "node{i}: HTTPS {path} without a password");
        }
        let (code, body) =
            get_node(i, "/report.json", Some((EPILOG_USER, EPILOG_PASSWORD))).unwrap();
        assert_eq!(code, 200, "node{i}: the Epilog's user: {body}");
    }

    phase("daemons up");
    // 4. A real Prometheus scraping the three.
    let prom_dir = dir.join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let targets: Vec<String> = (1..=NODES)
        .map(|i| format!("{}:{PORT}", node_addr(i)))
        .collect();
    let targets: Vec<&str> = targets.iter().map(String::as_str).collect();
    let prom = Prometheus::start_with(&prom_dir, &scrape_tls(&prom_dir), &targets);

    // The programs, where every node and mpiobs see them.
    let work = cl.user_dir("srun");
    let exe = |mpi: Mpi| {
        let exe = work.join(format!("mix-{}", mpi.name()));
        compile(mpi, &program("mix.c"), &exe, &[]);
        exe
    };
    let (ompi, mpich) = (exe(Mpi::OpenMpi), exe(Mpi::Mpich));

    phase("programs built");
    // 5. Per job: the plugstack line as installed registers the option and
    // changes nothing else; a bad value gets one line and the job runs.
    assert_eq!(tasks_with_shim(&cl, &work, None), 0);
    let (out, err) = srun(
        &cl,
        &work,
        // --quiet: not srun's "job N queued and waiting for resources"
        // while an earlier job's Epilog runs; errors are still printed.
        &[
            "--quiet",
            "-N1",
            "-n1",
            "--mpi-observer=a b",
            "sh",
            "-c",
            "echo \"[$LD_PRELOAD]\"",
        ],
    );
    assert_eq!(out.trim(), "[]", "no shim after a bad value");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line on srun's stderr: {err}");
    assert!(
        lines[0].contains("mpi-observer: invalid --mpi-observer value \"a b\""),
        "{err}"
    );

    phase("bad value checked");
    // 5b. Values srun checks before the job starts (README step 3): each
    // entry a keyword of the shim's or a library found from where srun
    // runs. What is not is one srun line, and the job runs, with the rest
    // or without the shim, its counts exact either way.
    let keywords = "v, fort, fortran, preload, stats";
    let where_ = "in LD_LIBRARY_PATH, the loader's cache or its directories";
    for (name, value, why) in [
        (
            "bogus-value",
            "bogus_value",
            format!(
                "\"bogus_value\" is no keyword ({keywords}) and no library \
                 libbogus_value.so is found {where_}"
            ),
        ),
        (
            "bogus-path",
            "/nonexistent/libtool.so",
            "\"/nonexistent/libtool.so\": No such file or directory".to_string(),
        ),
    ] {
        let option = format!("--mpi-observer={value}");
        let (job, err) = srun_job(&cl, &work, Mpi::Mpich, &mpich, &option, name);
        for pid in job.pids() {
            assert!(!maps_shim(pid), "{option}: rank pid {pid} maps no shim");
        }
        let (jobid, nodes) = wait_observed(&job, false);
        assert_exact(job, &jobid, &nodes);
        assert_eq!(
            err_lines(&err),
            [format!(
                "srun: error: mpi-observer: {option}: {why}; running without the shim"
            )],
            "{option}: one srun line"
        );
    }
    // A bad keyword beside a good one: the job runs with the good one.
    let (job, err) = srun_job(
        &cl,
        &work,
        Mpi::Mpich,
        &mpich,
        "--mpi-observer=stats,bogus",
        "mixed",
    );
    for pid in job.pids() {
        assert!(maps_shim(pid), "stats,bogus: rank pid {pid} maps the shim");
        assert_eq!(
            environ(pid, "MPI_TOOLS_ENTRY").as_deref(),
            Some("stats"),
            "pid {pid}: what srun kept"
        );
        assert_eq!(
            environ(pid, "MPI_OBSERVER_TOOLS_ON_ERROR").as_deref(),
            Some("skip"),
            "pid {pid}: the shim leaves out what it cannot use"
        );
        assert_eq!(
            environ(pid, "SLURM_MPI_OBSERVER_TOOLS"),
            None,
            "pid {pid}: the plugin's handover is not the task's"
        );
    }
    let (jobid, nodes) = wait_observed(&job, true);
    assert_exact(job, &jobid, &nodes);
    assert_eq!(
        err_lines(&err),
        [format!(
            "srun: error: mpi-observer: --mpi-observer=stats,bogus: \"bogus\" is no keyword \
             ({keywords}) and no library libbogus.so is found {where_}; running with \
             --mpi-observer=stats"
        )],
        "stats,bogus: one srun line"
    );
    // A library srun finds but the ranks' loader refuses (a symbol nothing
    // defines): srun has nothing to say, and the shim in each rank leaves
    // it out with one line instead of ending the rank.
    let broken_c = work.join("broken.c");
    std::fs::write(
        &broken_c,
        "#include <mpi.h>\n\
         void mpi_observer_test_nowhere(void);\n\
         int MPI_Barrier(MPI_Comm c) { mpi_observer_test_nowhere(); return PMPI_Barrier(c); }\n",
    )
    .unwrap();
    let broken = work.join("libbroken.so");
    compile(
        Mpi::Mpich,
        &broken_c,
        &broken,
        &["-shared", "-fPIC", "-Wl,--unresolved-symbols=ignore-all"],
    );
    let option = format!("--mpi-observer=stats,{}", broken.display());
    let (job, err) = srun_job(&cl, &work, Mpi::Mpich, &mpich, &option, "broken");
    let (jobid, nodes) = wait_observed(&job, true);
    assert_exact(job, &jobid, &nodes);
    let lines = err_lines(&err);
    let want = format!(
        "mpi-observer-shim: tools entry `{0}`: cannot load {0}: {0}: undefined symbol: \
         mpi_observer_test_nowhere; left out (MPI_OBSERVER_TOOLS_ON_ERROR=skip)",
        broken.display()
    );
    assert!(
        lines.len() == NP as usize && lines.iter().all(|l| *l == want),
        "one line from each rank's shim, none from srun:\n{}",
        lines.join("\n")
    );

    phase("tools lists checked");
    // 6. --mpi-observer=stats: the shim in every rank, exact counts.
    for (mpi, exe) in [(Mpi::OpenMpi, &ompi), (Mpi::Mpich, &mpich)] {
        let (job, _) = srun_job(
            &cl,
            &work,
            mpi,
            exe,
            "--mpi-observer=stats",
            &format!("stats-{}", mpi.name()),
        );
        for pid in job.pids() {
            assert!(maps_shim(pid), "{mpi:?} rank pid {pid} maps the shim");
        }
        let (jobid, nodes) = wait_observed(&job, true);
        assert_eq!(
            nodes.iter().collect::<BTreeSet<_>>().len(),
            NODES,
            "{mpi:?}: ranks on every node: {nodes:?}"
        );
        assert_exact(job, &jobid, &nodes);
    }

    // Every shim rank knocked at its exit on its own node's handover
    // socket (cluster.sh gives each node its /run/mpi-observer), and its
    // node's daemon held its segment.
    let all = scrape_all();
    let knocks = |result: &str| -> f64 {
        all.iter()
            .map(|s| {
                sum(
                    s,
                    "mpi_observer_exit_handovers_total",
                    &[("result", result)],
                )
            })
            .sum()
    };
    // Four shim jobs so far: step 5b's two (stats,bogus and the broken
    // library) and these two.
    assert_eq!(knocks("held"), 4.0 * NP as f64, "exit knocks held");
    for refused in [
        "not_observed",
        "not_mpi",
        "refused",
        "uid_mismatch",
        "queue_full",
        "stale",
        "malformed",
    ] {
        assert_eq!(knocks(refused), 0.0, "exit knocks answered {refused}");
    }

    phase("stats jobs exact");
    // 7. The site's default (default=stats), and opting out of it: no shim
    // in any rank, exact counts through the probes.
    std::fs::write(PLUGSTACK, format!("optional {} default=stats\n", plugin())).unwrap();
    assert_eq!(tasks_with_shim(&cl, &work, None), 3, "default=stats");
    assert_eq!(tasks_with_shim(&cl, &work, Some("--mpi-observer=off")), 0);
    for (mpi, exe) in [(Mpi::OpenMpi, &ompi), (Mpi::Mpich, &mpich)] {
        let (job, _) = srun_job(
            &cl,
            &work,
            mpi,
            exe,
            "--mpi-observer=off",
            &format!("off-{}", mpi.name()),
        );
        for pid in job.pids() {
            assert!(!maps_shim(pid), "{mpi:?} rank pid {pid} opted out");
        }
        let (jobid, nodes) = wait_observed(&job, false);
        assert_exact(job, &jobid, &nodes);
    }

    phase("probe jobs exact");
    // 8. Batch jobs (the site default on): a job array and a two-step job,
    // charged to an account; the scheduler's facts through Prometheus, each
    // job's report in its directory.
    let batch = cl.user_dir("batch");
    let bexe = batch.join("steady-mpich");
    compile(Mpi::Mpich, &program("cluster/steady.c"), &bexe, &[]);
    let array_sh = batch_script(&batch, "array", &bexe, 1);
    let two_sh = batch_script(&batch, "two", &bexe, 2);
    let d = batch.to_str().unwrap();
    let array = cl.sbatch(
        &batch,
        &[
            "-A",
            ACCOUNT,
            "-D",
            d,
            "--array=1-3",
            "-N1",
            "-n2",
            array_sh.to_str().unwrap(),
        ],
    );
    let two = cl.sbatch(
        &batch,
        &[
            "-A",
            ACCOUNT,
            "-D",
            d,
            "-N3",
            "-n3",
            two_sh.to_str().unwrap(),
        ],
    );
    // Prometheus stores a fact the scheduler did not give ("") as absent.
    let common = |jobid: &str, step: &str, array_job: &str, task: &str| {
        [
            ("account".to_string(), ACCOUNT.to_string()),
            ("array_job".to_string(), array_job.to_string()),
            ("array_task".to_string(), task.to_string()),
            ("jobid".to_string(), jobid.to_string()),
            ("partition".to_string(), PARTITION.to_string()),
            ("scheduler".to_string(), "slurm".to_string()),
            ("step".to_string(), step.to_string()),
            ("uid".to_string(), uid.to_string()),
            ("user".to_string(), USER.to_string()),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect::<Vec<_>>()
    };
    // The array: one series per task (each on one node), labels exact.
    let series = wait_series(
        &prom,
        &format!("mpi_job_scheduler_info{{array_job=\"{array}\"}}"),
        3,
    );
    let tasks = cl.array_tasks(&array);
    assert_eq!(tasks.len(), 3, "array {array}'s tasks: {tasks:?}");
    let mut seen = BTreeSet::new();
    for m in &series {
        let f = facts(m);
        let jobid = m["jobid"].as_str().unwrap();
        let task = m["array_task"].as_str().unwrap();
        assert!(
            tasks.iter().any(|(j, t)| j == jobid && t == task),
            "task {task} is job {jobid}: {tasks:?}"
        );
        assert_eq!(f, common(jobid, "0", &array, task), "{m}");
        seen.insert(task.to_string());
    }
    assert_eq!(
        seen,
        ["1", "2", "3"].iter().map(|s| s.to_string()).collect()
    );
    // A job's MPI_Allreduce calls over its nodes.
    let allreduce = |jobid: &str, want: u64| {
        prom.wait_query(
            &format!(
                "sum(mpi_job_calls_total{{jobid=\"{jobid}\",function=\"MPI_Allreduce\"}}) == {want}"
            ),
            Duration::from_secs(60),
        );
    };
    // The array's tasks run through without the second hold: each ends
    // between two reads of its daemon, and its final figures must still
    // reach Prometheus and its report.
    for t in 1..=3 {
        std::fs::write(batch.join(format!("stop-array-{t}")), "stop").unwrap();
        std::fs::write(batch.join(format!("go-array-{t}")), "go").unwrap();
    }
    for (jobid, _) in &tasks {
        allreduce(jobid, 2 * ITERS);
    }
    // The two steps, one after the other, on the 3 nodes each.
    for step in ["0", "1"] {
        let series = wait_series(
            &prom,
            &format!("mpi_job_scheduler_info{{jobid=\"{two}\",step=\"{step}\"}}"),
            NODES,
        );
        for m in &series {
            assert_eq!(facts(m), common(&two, step, "", ""), "{m}");
        }
        std::fs::write(batch.join(format!("go-two-{step}")), "go").unwrap();
        // The join a site writes: a job's calls with its account and
        // partition, over its nodes (step 0's ranks, then both steps').
        let steps = if step == "0" { 1 } else { 2 };
        prom.wait_query(
            &format!(
                "sum by (account, partition) (mpi_job_calls_total{{jobid=\"{two}\",function=\"MPI_Allreduce\"}} \
                 * on(instance, jobid, uid) group_left(account, partition) \
                 mpi_job_scheduler_info{{account=\"{ACCOUNT}\",partition=\"{PARTITION}\"}}) == {}",
                steps * 3 * ITERS
            ),
            Duration::from_secs(60),
        );
        std::fs::write(batch.join(format!("stop-two-{step}")), "stop").unwrap();
    }
    // Step 1's ranks on a node holding step 0's (retained): their own
    // step's rank, no identity conflict.
    let ranks: BTreeSet<String> =
        wait_series(&prom, &format!("mpi_rank_info{{jobid=\"{two}\"}}"), 6)
            .iter()
            .map(|m| m["rank"].as_str().unwrap().to_string())
            .collect();
    let want: BTreeSet<String> = ["0", "1", "2", "0#step1", "1#step1", "2#step1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(ranks, want, "job {two}'s ranks over its two steps");
    prom.wait_query(
        "sum(mpi_observer_identity_conflicts_total) == 0",
        Duration::from_secs(30),
    );
    cl.wait_gone(&array, Duration::from_secs(120));
    cl.wait_gone(&two, Duration::from_secs(120));
    for (jobid, _) in &tasks {
        assert_reports(&batch, jobid, uid, "2 ranks on node", 2 * ITERS);
    }
    assert_reports(
        &batch,
        &two,
        uid,
        "6 ranks on node1, node2, node3)",
        6 * ITERS,
    );
    let text = std::fs::read_to_string(batch.join(format!("mpi-observer-{two}.txt"))).unwrap();
    for step in ["0", "1"] {
        assert_eq!(
            text.matches(&format!(", step {step}\n")).count(),
            3,
            "three ranks of step {step} in the report:\n{text}"
        );
    }
    drop(prom);

    phase("batch jobs and reports checked");
    // 8b. Another user claims a running job's id: her own process, outside
    // Slurm, with the victim's SLURM_JOB_ID in its environment, running on
    // the job's node through the job's end. The Epilog asks for the job's
    // user's ranks only (`report --uid`): her section is not in the
    // victim's report, and her running rank does not hold the Epilog's wait
    // (up to 15 s) for the job's ranks to end.
    claimed_job_report(&cl, &batch, &bexe, uid);
    phase("a claimed job id checked");
    // 9. The package goes: its prerm stops the node daemons, no probe and no
    // file of its own is left; the site's TLS files stay.
    dpkg(&["--purge", PKG]);
    assert_eq!(status(), "");
    assert!(
        Path::new(SITE).join("tls.key").is_file(),
        "the purge leaves the site's {SITE}"
    );
    phase("purged");
    for d in daemons {
        let st = d.wait_exit(Duration::from_secs(40));
        assert!(
            st.success(),
            "a node daemon's exit on the prerm's SIGTERM: {st}"
        );
    }
    assert_no_probes_left();
    drop(package);
    let left: Vec<PathBuf> = fresh
        .into_iter()
        .chain([PathBuf::from(PLUGSTACK)])
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    drop(site);
    phase("no probe, no file left");
    drop(cl);
    assert!(
        !Path::new(STATE).exists(),
        "cluster.sh down removes {STATE}"
    );
    phase("cluster down");
}
