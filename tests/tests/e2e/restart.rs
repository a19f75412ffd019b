//! Nothing is lost across a daemon restart (issue 26, "Build 4"): two jobs
//! held between phases of MPI_Allreduce calls, one counted by the probes,
//! one by its preloaded shim (`MPI_TOOLS_ENTRY=stats`), watched by daemon
//! A (`attach --all`); A stops and daemon B starts between phases, with a
//! phase made while no daemon runs. B must export every call of both jobs,
//! exactly, per rank:
//! - **a planned restart** (the package's prerm wrote the restart request
//!   naming A): A pins its maps and links in /sys/fs/bpf/mpi-observer and
//!   exits without detaching; B adopts them and removes the pins;
//! - **a layout mismatch** (B sized its maps otherwise): B drops the pinned
//!   probes, says so per rank and counts them; the ranks are attached
//!   afresh (their probe counts restart: explicit, not silent);
//! - **a rank gone meanwhile** (it ended while no daemon ran): B drops its
//!   pinned probes, says so and counts it;
//! - **`kill -9`** of A: no probe is left and the job's results are right.
//!
//! After B stops (a plain stop), no probe and no pin is left.
//!
//! And through the package: reinstalling the `.deb` (an upgrade to the
//! same version runs the old prerm's `upgrade` too) names the running
//! installed daemon in the restart request; the SIGTERM systemd's
//! `try-restart` would send (PID 1 is not systemd here) makes it hand
//! over; the installed daemon started from the unit's ExecStart adopts; a
//! removal leaves no pin, no probe and no request.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, assert_no_probes_left, compile, free_port,
    package::{self, DEFAULTS, Installed, PKG},
    parse_metrics, program, require, scratch, shim_launcher, signal, sum,
    systemd::Systemd,
    wait_for,
};

/// Ranks per job.
const NP: u32 = 2;
/// MPI_Allreduce calls per rank and phase.
const CALLS: u64 = 40;
/// The restart request the package's prerm writes.
const REQUEST: &str = "/run/mpi-observer/restart";
/// Where a handover is pinned.
const PINS: &str = "/sys/fs/bpf/mpi-observer";

fn required(mpi: Mpi) -> bool {
    require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")])
}

fn exe(dir: &Path, mpi: Mpi) -> PathBuf {
    let exe = dir.join(format!("phases-{}", mpi.name()));
    compile(mpi, &program("restart/phases.c"), &exe, &[]);
    exe
}

/// A job of [`NP`] ranks of `exe`, held before phase 1; with `shim`, the
/// shim's stats layer preloaded in every rank.
fn start(mpi: Mpi, exe: &Path, dir: &Path, name: &str, shim: bool) -> Job {
    let mut c = if shim {
        shim_launcher(mpi, NP, "stats")
    } else {
        mpi.launcher(NP)
    };
    c.arg(exe).arg(CALLS.to_string());
    Job::spawn(c, NP, dir.join(format!("go-{name}")))
}

/// Lets `job` make phase `phase` and waits until every rank finished it.
fn phase(job: &mut Job, dir: &Path, name: &str, phase: u32) {
    let go = dir.join(format!("go-{name}"));
    let file = if phase == 1 {
        go
    } else {
        PathBuf::from(format!("{}.{phase}", go.display()))
    };
    std::fs::write(file, b"go").unwrap();
    let lines = job.wait_lines("PHASE", NP as usize, Duration::from_secs(60));
    assert!(
        lines
            .iter()
            .all(|l| l.starts_with(&format!("PHASE {phase} "))),
        "{lines:?}"
    );
}

/// Lets `job` check its sums and end; asserts every rank found them right.
fn finish(job: Job, dir: &Path, name: &str) {
    std::fs::write(dir.join(format!("go-{name}.4")), b"go").unwrap();
    job.finish("OK ");
}

/// MPI_Allreduce calls the scrape `s` shows for the rank of pid `pid`
/// (found through `mpi_rank_info`), if it is there.
fn allreduce(s: &[Sample], pid: u32) -> Option<f64> {
    let pid = pid.to_string();
    let info = s
        .iter()
        .find(|x| x.name == "mpi_rank_info" && x.label("pid") == Some(pid.as_str()))?;
    let (jobid, rank) = (info.label("jobid")?, info.label("rank")?);
    Some(sum(
        s,
        "mpi_calls_total",
        &[
            ("jobid", jobid),
            ("rank", rank),
            ("function", "MPI_Allreduce"),
        ],
    ))
}

/// Waits until `d` shows `want` MPI_Allreduce calls for every rank of
/// every job in `jobs`; the last scrape.
fn wait_calls(d: &mut Daemon, jobs: &[&Job], want: u64, what: &str) -> Vec<Sample> {
    wait_calls_by(|| d.scrape().1, jobs, want, what)
}

/// [`wait_calls`] for a daemon `scrape` reads.
fn wait_calls_by(
    mut scrape: impl FnMut() -> Vec<Sample>,
    jobs: &[&Job],
    want: u64,
    what: &str,
) -> Vec<Sample> {
    let pids: Vec<u32> = jobs.iter().flat_map(|j| j.pids()).collect();
    let mut last = Vec::new();
    let r = wait_for_opt(Duration::from_secs(30), || {
        let s = scrape();
        let ok = pids.iter().all(|p| allreduce(&s, *p) == Some(want as f64));
        last = s;
        ok.then_some(())
    });
    if r.is_none() {
        let got: Vec<_> = pids.iter().map(|p| (p, allreduce(&last, *p))).collect();
        panic!("{what}: every rank must show {want} MPI_Allreduce calls; got (pid, calls) {got:?}");
    }
    last
}

fn wait_for_opt<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// When the figures of the rank of `pid` count from, as `d`'s report data
/// says (`since`, seconds since the epoch).
fn counted_since(d: &Daemon, pid: u32) -> f64 {
    let (code, body) = e2e::http_get(&d.addr, "/report.json").expect("report data");
    assert_eq!(code, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["pid"] == pid)
        .and_then(|r| r["since"].as_f64())
        .unwrap_or_else(|| panic!("no rank of pid {pid} in the report data: {body}"))
}

/// Waits until `d` has probes in every rank of `probed` (and sees them).
fn wait_probed(d: &mut Daemon, probed: &Job) {
    wait_for(
        "the daemon to attach its probes to every probed rank",
        Duration::from_secs(30),
        || {
            let (_, s) = d.scrape();
            let all = probed.pids().iter().all(|p| allreduce(&s, *p).is_some());
            (all && sum(&s, "mpi_observer_attached_processes", &[]) >= f64::from(NP)).then_some(())
        },
    );
}

/// The start time of `pid` in ticks, as the prerm writes it.
fn ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(") ").unwrap().1;
    rest.split(' ').nth(19).unwrap().parse().unwrap()
}

/// Writes the restart request for `pid`, as the prerm does on upgrade.
fn request_restart(pid: u32) {
    std::fs::create_dir_all("/run/mpi-observer").unwrap();
    std::fs::write(REQUEST, format!("{pid} {}\n", ticks(pid))).unwrap();
}

/// Removes the request (also a failed test's).
struct RequestGuard;

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(REQUEST);
    }
}

/// The pins left under [`PINS`].
fn pins() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![PathBuf::from(PINS)];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.filter_map(Result::ok) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out
}

/// The restart request's lines (pid, start ticks), if there is one.
fn request_lines() -> Vec<(u32, u64)> {
    std::fs::read_to_string(REQUEST)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (p, t) = l.split_once(' ')?;
            Some((p.parse().ok()?, t.trim().parse().ok()?))
        })
        .collect()
}

/// A planned restart (or, with `mismatch`, a restart onto a daemon whose
/// maps are sized otherwise) between phases 1 and 3, phase 2 made while
/// no daemon runs.
fn restart(mismatch: bool) {
    let mpi = Mpi::OpenMpi;
    if !required(mpi) {
        return;
    }
    let dir = scratch(if mismatch {
        "restart-mismatch"
    } else {
        "restart-planned"
    });
    let exe = exe(&dir, mpi);
    let _request = RequestGuard;
    let mut probed = start(mpi, &exe, &dir, "probed", false);
    let mut shimmed = start(mpi, &exe, &dir, "shim", true);
    let mut a = Daemon::start(&["--all".to_string()]);
    wait_probed(&mut a, &probed);
    a.wait_stats_figures(NP);
    phase(&mut probed, &dir, "probed", 1);
    phase(&mut shimmed, &dir, "shim", 1);
    wait_calls(&mut a, &[&probed, &shimmed], CALLS, "daemon A, phase 1");

    let since_a: Vec<f64> = probed
        .pids()
        .iter()
        .map(|p| counted_since(&a, *p))
        .collect();

    // The upgrade's stop: the prerm named A, systemd sends SIGTERM.
    request_restart(a.pid());
    let (st, log) = a.stop_and_log(signal::TERM);
    assert!(st.success(), "daemon A's exit on a restart: {st}");
    assert!(
        log.iter()
            .any(|l| l.contains("restart requested: the probes of 2 ranks")),
        "daemon A must say it handed the probes over:\n{}",
        log.join("\n")
    );
    assert!(!pins().is_empty(), "A pinned nothing in {PINS}");
    // Whatever the mechanism (uprobe_multi links, pinned perf links): the
    // probes are breakpoints in the ranks' memory.
    assert!(
        probed
            .pids()
            .iter()
            .all(|p| !e2e::breakpoints_left(*p).is_empty()),
        "the probes must stay in the ranks while no daemon runs"
    );
    // Counted by the probes and the shim while no daemon runs.
    phase(&mut probed, &dir, "probed", 2);
    phase(&mut shimmed, &dir, "shim", 2);

    let mut args = vec!["--all".to_string()];
    if mismatch {
        args.extend(["--map-memory".to_string(), "8MiB".to_string()]);
    }
    let b_started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let mut b = Daemon::start(&args);
    // Adopted before B serves; attached afresh (a mismatch) by its scan.
    wait_probed(&mut b, &probed);
    phase(&mut probed, &dir, "probed", 3);
    phase(&mut shimmed, &dir, "shim", 3);
    let pids: Vec<String> = probed.pids().iter().map(u32::to_string).collect();
    let s = if mismatch {
        // The probed ranks count afresh from B's attach: phase 3 only. The
        // shim's segment has them all.
        wait_calls(&mut b, &[&shimmed], 3 * CALLS, "daemon B, shim ranks");
        wait_calls(
            &mut b,
            &[&probed],
            CALLS,
            "daemon B, probed ranks attached afresh",
        )
    } else {
        wait_calls(
            &mut b,
            &[&probed, &shimmed],
            3 * CALLS,
            "daemon B after the handover",
        )
    };
    let (adopted, dropped) = if mismatch { (0, NP) } else { (NP, 0) };
    assert_eq!(
        sum(
            &s,
            "mpi_observer_handover_ranks_total",
            &[("outcome", "adopted")]
        ),
        f64::from(adopted)
    );
    assert_eq!(
        sum(
            &s,
            "mpi_observer_handover_ranks_total",
            &[("outcome", "dropped")]
        ),
        f64::from(dropped)
    );
    assert!(pins().is_empty(), "B must remove the pins: {:?}", pins());
    // The report says from when the probed ranks' figures count: A's
    // attach when adopted (to the second), B's (after its start) when
    // attached afresh.
    for (pid, a_since) in probed.pids().iter().zip(&since_a) {
        let b_since = counted_since(&b, *pid);
        if mismatch {
            assert!(
                b_since >= b_started && b_since > *a_since,
                "pid {pid}: counted since {b_since}, B started at {b_started}, A attached at {a_since}"
            );
        } else {
            assert_eq!(b_since, a_since.floor(), "pid {pid}");
        }
    }
    let log = b.log();
    for pid in &pids {
        let lines: Vec<_> = log
            .iter()
            .filter(|l| l.contains(&format!("pid {pid}: ")) && l.contains("handed over"))
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "one line for pid {pid}:\n{}",
            log.join("\n")
        );
        let want = if mismatch { "dropped" } else { "adopted" };
        assert!(lines[0].contains(want), "{}", lines[0]);
    }
    finish(probed, &dir, "probed");
    finish(shimmed, &dir, "shim");
    // A plain stop (the request named A only): everything detached.
    let st = b.stop(signal::TERM);
    assert!(st.success(), "daemon B's exit: {st}");
    assert_no_probes_left();
    assert!(pins().is_empty(), "pins left: {:?}", pins());
}

#[test]
fn planned_restart_loses_no_call() {
    restart(false);
}

#[test]
fn restart_onto_another_layout_says_counts_restart() {
    restart(true);
}

#[test]
fn rank_gone_while_no_daemon_runs_is_said_and_counted() {
    let mpi = Mpi::OpenMpi;
    if !required(mpi) {
        return;
    }
    let dir = scratch("restart-gone");
    let exe = exe(&dir, mpi);
    let _request = RequestGuard;
    let mut probed = start(mpi, &exe, &dir, "probed", false);
    let pids = probed.pids();
    let mut a = Daemon::start(&["--all".to_string()]);
    wait_probed(&mut a, &probed);
    phase(&mut probed, &dir, "probed", 1);
    request_restart(a.pid());
    let st = a.stop(signal::TERM);
    assert!(st.success(), "daemon A's exit on a restart: {st}");
    phase(&mut probed, &dir, "probed", 2);
    phase(&mut probed, &dir, "probed", 3);
    finish(probed, &dir, "probed");
    let mut b = Daemon::start(&["--all".to_string()]);
    let (_, s) = b.scrape();
    assert_eq!(
        sum(
            &s,
            "mpi_observer_handover_ranks_total",
            &[("outcome", "dropped")]
        ),
        f64::from(NP)
    );
    assert!(pins().is_empty(), "B must remove the pins: {:?}", pins());
    let (st, log) = b.stop_and_log(signal::TERM);
    assert!(st.success(), "daemon B's exit: {st}");
    for pid in pids {
        let n = log
            .iter()
            .filter(|l| {
                l.contains(&format!("pid {pid}: ")) && l.contains("exited while no daemon ran")
            })
            .count();
        assert_eq!(n, 1, "one line for pid {pid}:\n{}", log.join("\n"));
    }
    assert_no_probes_left();
}

#[test]
fn kill9_leaves_no_probe_and_the_job_right() {
    let mpi = Mpi::OpenMpi;
    if !required(mpi) {
        return;
    }
    let dir = scratch("restart-kill9");
    let exe = exe(&dir, mpi);
    let mut probed = start(mpi, &exe, &dir, "probed", false);
    let mut a = Daemon::start(&["--all".to_string()]);
    wait_probed(&mut a, &probed);
    phase(&mut probed, &dir, "probed", 1);
    wait_calls(&mut a, &[&probed], CALLS, "daemon A, phase 1");
    let st = a.stop(signal::KILL);
    assert!(!st.success(), "kill -9: {st}");
    assert_no_probes_left();
    assert!(pins().is_empty(), "kill -9 pins nothing: {:?}", pins());
    phase(&mut probed, &dir, "probed", 2);
    phase(&mut probed, &dir, "probed", 3);
    finish(probed, &dir, "probed");
}

#[test]
fn package_upgrade_hands_over() {
    let mpi = Mpi::OpenMpi;
    if !required(mpi) || !require(&[Need::Command("dpkg")]) {
        return;
    }
    let dir = scratch("restart-package");
    let deb = package::deb();
    let exe = exe(&dir, mpi);
    let _request = RequestGuard;
    let guard = Installed::new(&deb);
    std::fs::write(DEFAULTS, "MPI_OBSERVER_OPTS=\"--all\"\n").unwrap();
    let launcher = package::unit_launcher(&dir);
    let mut probed = start(mpi, &exe, &dir, "probed", false);
    let mut a = Daemon::start_binary(&launcher, &[]);
    wait_probed(&mut a, &probed);
    phase(&mut probed, &dir, "probed", 1);
    wait_calls(&mut a, &[&probed], CALLS, "installed daemon A, phase 1");

    // The upgrade: the old prerm names A.
    package::dpkg(&["--install", deb.to_str().unwrap()]);
    assert_eq!(package::status(), "installed");
    assert_eq!(
        request_lines(),
        vec![(a.pid(), ticks(a.pid()))],
        "the prerm's restart request must name the running daemon"
    );
    // What systemd's try-restart in the postinst would do: SIGTERM, then
    // the unit's ExecStart again.
    let (st, log) = a.stop_and_log(signal::TERM);
    assert!(
        st.success(),
        "daemon A's exit on the upgrade's restart: {st}"
    );
    assert!(
        log.iter()
            .any(|l| l.contains("restart requested: the probes of 2 ranks")),
        "{}",
        log.join("\n")
    );
    phase(&mut probed, &dir, "probed", 2);
    let mut b = Daemon::start_binary(&launcher, &[]);
    phase(&mut probed, &dir, "probed", 3);
    let s = wait_calls(&mut b, &[&probed], 3 * CALLS, "installed daemon B");
    assert_eq!(
        sum(
            &s,
            "mpi_observer_handover_ranks_total",
            &[("outcome", "adopted")]
        ),
        f64::from(NP)
    );
    assert!(pins().is_empty(), "B must remove the pins: {:?}", pins());

    // Removal with the probes in: the request goes first, so the prerm's
    // SIGTERM is a plain stop; no pin, probe or request is left.
    let daemon_pid = b.pid();
    package::dpkg(&["--remove", PKG]);
    wait_for(
        "the prerm to stop daemon B",
        Duration::from_secs(40),
        || {
            std::fs::read_to_string(format!("/proc/{daemon_pid}/stat"))
                .ok()
                .is_none_or(|s| s.contains(") Z"))
                .then_some(())
        },
    );
    let (st, log) = b.stop_and_log(signal::TERM);
    assert!(st.success(), "daemon B's exit on removal: {st}");
    assert!(
        log.iter().any(|l| l.contains("detached, exiting")),
        "a removal is a plain stop:\n{}",
        log.join("\n")
    );
    assert_no_probes_left();
    assert!(pins().is_empty(), "pins left: {:?}", pins());
    assert!(
        !Path::new(REQUEST).exists(),
        "the request must go with the package"
    );
    finish(probed, &dir, "probed");
    drop(guard);
}

/// The installed unit's name.
const UNIT_NAME: &str = "mpi-observer.service";

/// The site's directory of the unit's credentials.
const SITE_DIR: &str = "/etc/mpi-observer";

/// The password of the web config's user in [`SiteFiles`].
const PASSWORD: &str = "unit test password";

/// The three files the unit's `LoadCredential=` reads from [`SITE_DIR`]
/// (web-config.yml, tls.crt, tls.key), made as the README tells a site:
/// a certificate for 127.0.0.1 from a test CA, the shipped web config with
/// a bcrypt hash for [`e2e::tls::WEB_USER`]. Removed after the test; a
/// machine that has the directory already fails the test, untouched.
struct SiteFiles {
    /// The CA that signed the daemon's certificate, for the scrapes.
    ca: PathBuf,
}

impl SiteFiles {
    fn new(dir: &Path) -> SiteFiles {
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).unwrap();
        e2e::tls::make_certs(&certs);
        e2e::tls::web_config(&certs, PASSWORD);
        let ca = certs.join("ca.crt");
        assert!(
            !Path::new(SITE_DIR).exists(),
            "{SITE_DIR} exists: this test installs its own site files there; move it away"
        );
        std::fs::create_dir(SITE_DIR).unwrap();
        let site = SiteFiles { ca };
        for name in ["web-config.yml", "tls.crt", "tls.key"] {
            let to = Path::new(SITE_DIR).join(name);
            std::fs::copy(certs.join(name), &to).unwrap();
            std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
        }
        site
    }
}

impl Drop for SiteFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(SITE_DIR);
    }
}

/// dpkg ARGS inside `sd`'s namespaces, so its maintainer scripts talk to
/// that systemd; asserts success.
fn dpkg_in(sd: &Systemd, args: &[&str]) {
    let mut argv = vec!["dpkg"];
    argv.extend_from_slice(args);
    let o = sd.run(&argv, package::DPKG_LIMIT);
    assert!(
        o.status.success(),
        "dpkg {args:?} under the test bed's systemd ({}):\n{}{}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
        sd.journal(UNIT_NAME)
    );
}

/// The package installed under `sd`; purged there when dropped (systemd
/// stops the unit first), and on the host too if that failed.
struct InstalledUnder<'a>(&'a Systemd);

impl Drop for InstalledUnder<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(&["dpkg", "--purge", PKG], package::DPKG_LIMIT);
        package::purge();
    }
}

/// `key`'s value in the `/proc/PID/status` of `pid` inside `sd`.
fn status_field(sd: &Systemd, pid: &str, key: &str) -> String {
    let o = sd.run(
        &["cat", &format!("/proc/{pid}/status")],
        Duration::from_secs(10),
    );
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in the status of {pid}: {text}"))
        .trim()
        .to_string()
}

/// The package's unit under a real systemd (tests/src/systemd.rs: PID 1 of
/// a private pid and mount namespace), as a site runs it: installed and
/// upgraded by dpkg, whose scripts talk to that systemd. The daemon runs as
/// the unit's unprivileged user with its sandbox; the upgrade's `try-restart`
/// hands the probes of a held job over to the new daemon (ExecStartPre's
/// pin directory, ReadWritePaths=), which exports every call of the three
/// phases; the removal stops it with no probe, pin or request left.
#[test]
fn package_upgrade_under_systemd_hands_over() {
    let mpi = Mpi::OpenMpi;
    if !required(mpi)
        || !require(&[
            Need::Command("dpkg"),
            Need::Command("unshare"),
            Need::Command("nsenter"),
            Need::Command("systemctl"),
        ])
    {
        return;
    }
    let dir = scratch("restart-systemd");
    let deb = package::deb();
    let exe = exe(&dir, mpi);
    let sd = Systemd::boot(&dir.join("systemd"), &[UNIT_NAME]);
    let site = SiteFiles::new(&dir);
    dpkg_in(&sd, &["--install", deb.to_str().unwrap()]);
    let _installed = InstalledUnder(&sd);
    let addr = format!("127.0.0.1:{}", free_port());
    std::fs::write(
        DEFAULTS,
        format!("MPI_OBSERVER_OPTS=\"--all --listen {addr}\"\n"),
    )
    .unwrap();
    sd.systemctl(&["start", UNIT_NAME]);
    let a = sd.property(UNIT_NAME, "MainPID");
    // The unit's user, which the postinst made: unprivileged, all four
    // uids.
    let user = system_user().expect("the postinst must make the user mpi-observer");
    // systemd forks the main process as root and gives it the unit's user
    // just before the exec (after the sandbox, which takes a while on a
    // loaded machine): its ids are the daemon's once it is the daemon.
    wait_for(
        "the unit's main process to exec the daemon",
        Duration::from_secs(30),
        || (status_field(&sd, &a, "Name") == "mpi-observer").then_some(()),
    );
    let uids = status_field(&sd, &a, "Uid");
    assert!(
        user != "0" && uids.split_whitespace().all(|u| u == user),
        "the unit's daemon must run as mpi-observer (uid {user}): Uid {uids}"
    );
    // As Prometheus scrapes it: HTTPS verified against the site's CA, basic
    // auth.
    let client = e2e::tls::tls_client(&site.ca);
    let auth = [e2e::tls::basic(e2e::tls::WEB_USER, PASSWORD)];
    let scrape = || {
        e2e::tls::get_tls(&client, &addr, "/metrics", &auth)
            .ok()
            .filter(|r| r.status == 200)
            .map(|r| parse_metrics(&r.text()))
            .unwrap_or_default()
    };

    let mut c = mpi.launcher(NP);
    c.arg(&exe).arg(CALLS.to_string());
    let mut probed = Job::spawn(sd.wrap(&c), NP, dir.join("go-probed"));
    wait_for(
        "the unit's daemon to attach its probes to every rank",
        Duration::from_secs(60),
        || {
            let s = scrape();
            probed
                .pids()
                .iter()
                .all(|p| allreduce(&s, *p).is_some())
                .then_some(())
        },
    );
    phase(&mut probed, &dir, "probed", 1);
    wait_calls_by(scrape, &[&probed], CALLS, "the unit's daemon A, phase 1");

    // The upgrade: the prerm names A, the postinst's try-restart stops it
    // (a handover) and starts B.
    dpkg_in(&sd, &["--install", deb.to_str().unwrap()]);
    let b = sd.property(UNIT_NAME, "MainPID");
    assert_ne!(a, b, "the upgrade must restart the unit");
    let journal = sd.journal(UNIT_NAME);
    assert!(
        journal.contains("restart requested: the probes of 2 ranks"),
        "A must hand its probes over:\n{journal}"
    );
    phase(&mut probed, &dir, "probed", 2);
    phase(&mut probed, &dir, "probed", 3);
    let s = wait_calls_by(scrape, &[&probed], 3 * CALLS, "the unit's daemon B");
    assert_eq!(
        sum(
            &s,
            "mpi_observer_handover_ranks_total",
            &[("outcome", "adopted")]
        ),
        f64::from(NP),
        "B must adopt both ranks:\n{}",
        sd.journal(UNIT_NAME)
    );
    assert!(pins().is_empty(), "B must remove the pins: {:?}", pins());

    // Removal with the probes in: systemd stops B, a plain stop.
    dpkg_in(&sd, &["--remove", PKG]);
    assert_eq!(sd.property(UNIT_NAME, "ActiveState"), "inactive");
    assert_no_probes_left();
    assert!(
        !Path::new(PINS).exists(),
        "the postrm must remove {PINS}: {:?}",
        pins()
    );
    assert!(
        !sd.run_path(REQUEST).exists(),
        "the request must go with the package"
    );
    finish(probed, &dir, "probed");
    dpkg_in(&sd, &["--purge", PKG]);
    assert_eq!(system_user(), None, "a purge removes the unit's user");
}

/// The uid of the unit's system user `mpi-observer`, if it exists.
fn system_user() -> Option<String> {
    let o = std::process::Command::new("getent")
        .args(["passwd", "mpi-observer"])
        .output()
        .expect("getent");
    let line = String::from_utf8_lossy(&o.stdout).into_owned();
    o.status
        .success()
        .then(|| line.split(':').nth(2).unwrap_or_default().to_string())
}
