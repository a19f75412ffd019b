//! The Debian package (`cargo xtask package`: target/debian/mpi-observer.deb)
//! installed on this machine with dpkg, as a site installs it:
//!
//! - every file where the binary looks for it (`shim-path`, `qmpi-flags`),
//!   the systemd unit verified and reading its options from the conffile
//!   /etc/default/mpi-observer, the Slurm plugin and its plugstack line;
//! - a real Open MPI job under the installed shim (`/usr/bin/mpi-observer
//!   run --tools stats`), observed by the installed daemon started as the
//!   unit starts it: exact counts;
//! - an upgrade to a newer version while that daemon observes a job: the
//!   site's options kept, no figure lost;
//! - removal while the daemon is attached: the prerm stops it (PID 1 is not
//!   systemd here, as in CI), no probe is left, the job still ends well, and
//!   after a purge no file of the package is left.
//!
//! The package is installed on the host: each test purges it when it ends,
//! failed or not ([`Installed`]).

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, assert_no_probes_left, compile,
    package::{
        BIN, DEFAULTS, DPKG_LIMIT, Installed, PKG, PLUGSTACK, PLUGSTACK_DIR, SHIM, UNIT, deb, dpkg,
        installed_output, purge, status, unit_launcher,
    },
    program, require, run_with_timeout, scratch, sum, wait_for,
};

const NP: u32 = 4;
const ITERS: u64 = 50;
/// The site's edit of the conffile: every MPI rank on the machine, no
/// --listen (the harness adds a free loopback port).
const SITE_OPTS: &str = "MPI_OBSERVER_OPTS=\"--all\"\n";

fn required() -> bool {
    require(&[
        Need::Root,
        Need::Mpi(Mpi::OpenMpi),
        Need::Command("dpkg"),
        Need::Command("bpftool"),
        Need::Command("systemd-analyze"),
    ])
}

/// The paths in `deb` (files and directories), absolute.
fn contents(deb: &Path) -> Vec<PathBuf> {
    let o = dpkg(&["--contents", deb.to_str().unwrap()]);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| PathBuf::from(p.trim_start_matches('.')))
        .filter(|p| p != Path::new("/"))
        .collect()
}

/// The package's paths that do not exist before it is installed: none may
/// be left after a purge.
fn new_paths(deb: &Path) -> BTreeSet<PathBuf> {
    // A stale install (a killed run) would hide them.
    if !status().is_empty() {
        purge();
    }
    contents(deb)
        .into_iter()
        .filter(|p| std::fs::symlink_metadata(p).is_err())
        .collect()
}

/// What maintainer scripts and deb-systemd-helper may create besides the
/// package's files.
fn extra_paths() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = [
        PLUGSTACK,
        "/etc/systemd/system/mpi-observer.service",
        "/etc/systemd/system/multi-user.target.wants/mpi-observer.service",
        "/var/lib/systemd/deb-systemd-helper-masked/mpi-observer.service",
        "/var/lib/systemd/deb-systemd-helper-enabled/mpi-observer.service.dsh-also",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    v.push(PathBuf::from(format!("{PLUGSTACK}.dpkg-new")));
    v
}

fn assert_gone(paths: impl IntoIterator<Item = PathBuf>) {
    let left: Vec<PathBuf> = paths
        .into_iter()
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// tests/programs/mix.c on [`NP`] Open MPI ranks, each started through the
/// Removes or purges the package (`how`) while the daemon `d` (pid
/// `daemon_pid`) observes a held job: dpkg leaves the package in `want`
/// status, its prerm stops the daemon, which exits cleanly, and no probe is
/// left.
fn goes_with_a_job_held(d: Daemon, daemon_pid: u32, how: &str, want: &str) {
    dpkg(&[how, PKG]);
    assert_eq!(status(), want);
    wait_for(
        "the prerm to stop the daemon",
        Duration::from_secs(40),
        || (!running(daemon_pid)).then_some(()),
    );
    let st = d.stop(e2e::signal::TERM);
    assert!(
        st.success(),
        "the daemon's exit on the prerm's SIGTERM: {st}"
    );
    assert_no_probes_left();
}

/// installed `mpi-observer run --tools stats`, held at its go file.
fn start_job(dir: &Path) -> Job {
    let mpi = Mpi::OpenMpi;
    let exe = dir.join("mix-openmpi");
    compile(mpi, &program("mix.c"), &exe, &[]);
    let mut c = mpi.launcher(NP);
    c.args([BIN, "run", "--tools", "stats", "--"])
        .arg(&exe)
        .arg(ITERS.to_string());
    Job::spawn(c, NP, dir.join("go"))
}

/// Every rank maps the installed shim.
fn assert_installed_shim(job: &Job) {
    for pid in job.pids() {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        assert!(
            maps.contains(SHIM),
            "rank pid {pid} does not map {SHIM}:\n{maps}"
        );
    }
}

/// Waits until the daemon sees all [`NP`] ranks of `job` up, with their
/// shim figures (the stats layer's request gauge); returns the job's id.
fn wait_ranks(d: &mut Daemon, job: &Job) -> String {
    let pid0 = job.pid(0).to_string();
    wait_for(
        "the installed daemon to see every rank's segment",
        Duration::from_secs(30),
        || {
            let (_, s) = d.scrape();
            let jobid = s
                .iter()
                .find(|x| x.name == "mpi_rank_info" && x.label("pid") == Some(pid0.as_str()))?
                .label("jobid")?
                .to_string();
            (0..NP)
                .all(|r| {
                    let want = [("jobid", jobid.as_str()), ("rank", &r.to_string())];
                    sum(&s, "mpi_rank_up", &want) == 1.0
                        && s.iter().any(|x| {
                            x.name == "mpi_requests_outstanding"
                                && want.iter().all(|(k, v)| x.label(k) == Some(v))
                        })
                })
                .then_some(jobid)
        },
    )
}

/// mix.c's exact per-rank counts for a few functions of job `jobid`, in `s`.
fn assert_exact(s: &[Sample], jobid: &str) {
    for rank in 0..NP {
        let r = rank.to_string();
        for f in ["MPI_Allreduce", "MPI_Bcast", "MPI_Sendrecv", "MPI_Barrier"] {
            assert_eq!(
                sum(
                    s,
                    "mpi_calls_total",
                    &[("jobid", jobid), ("rank", &r), ("function", f)]
                ),
                ITERS as f64,
                "rank {rank} {f}"
            );
        }
    }
}

/// Whether `pid` runs: exists and is not a zombie (the harness reaps its
/// daemon only when told to stop it).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

#[test]
fn install_observe_remove_purge() {
    if !required() {
        return;
    }
    let dir = scratch("package-install");
    let deb = deb();
    let fresh = new_paths(&deb);
    let guard = Installed::new(&deb);

    // The files, where the binary looks for them.
    let plugin = e2e::package::plugin();
    for p in [
        BIN,
        SHIM,
        "/usr/lib/mpi-observer/libmpi_observer_qmpi.so",
        "/usr/share/mpi-observer/include/mpi_observer_qmpi.h",
        UNIT,
        DEFAULTS,
        &plugin,
        "/usr/share/mpi-observer/slurm/plugstack.conf",
        "/usr/share/mpi-observer/grafana/mpi-job.json",
        "/usr/share/mpi-observer/prometheus/recording.rules.yml",
        "/usr/share/mpi-observer/prometheus/alerts.rules.yml",
    ] {
        assert!(Path::new(p).is_file(), "{p} is installed");
    }
    assert_eq!(installed_output(&["shim-path"]), SHIM);
    let flags = installed_output(&["qmpi-flags"]);
    assert!(
        flags.contains("-I/usr/share/mpi-observer/include ")
            && flags.contains("-L/usr/lib/mpi-observer "),
        "qmpi-flags: {flags}"
    );
    let conffiles = Command::new("dpkg-query")
        .args(["-W", "-f=${Conffiles}", PKG])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&conffiles.stdout).contains(DEFAULTS),
        "{DEFAULTS} is a conffile"
    );
    // The SPANK plugin: a shared object with SPANK's entry points, and its
    // optional plugstack line where Debian's Slurm reads it.
    let syms = run_with_timeout(
        Command::new("nm").args(["-D", "--defined-only", &plugin]),
        Duration::from_secs(30),
    );
    let syms = String::from_utf8_lossy(&syms.stdout);
    for s in ["slurm_spank_init", "slurm_spank_task_init", "plugin_name"] {
        assert!(syms.contains(s), "{plugin} exports {s}:\n{syms}");
    }
    if Path::new(PLUGSTACK_DIR).is_dir() {
        let line = std::fs::read_to_string(PLUGSTACK).expect("the postinst's plugstack line");
        assert!(
            line.lines().any(|l| l == format!("optional {plugin}")),
            "{PLUGSTACK}:\n{line}"
        );
    }
    let o = run_with_timeout(
        Command::new("systemd-analyze").args(["verify", UNIT]),
        Duration::from_secs(60),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "systemd-analyze verify:\n{err}");
    assert!(
        !err.contains("mpi-observer.service"),
        "systemd-analyze verify warns about the unit:\n{err}"
    );

    // A real job under the installed shim, observed by the installed daemon
    // as the unit starts it, with the site's options.
    std::fs::write(DEFAULTS, SITE_OPTS).unwrap();
    let launcher = unit_launcher(&dir);
    let job = start_job(&dir);
    assert_installed_shim(&job);
    let mut d = Daemon::start_binary(&launcher, &[]);
    let jobid = wait_ranks(&mut d, &job);
    let daemon_pid = d.pid();
    assert!(
        std::fs::read_link(format!("/proc/{daemon_pid}/exe")).unwrap() == Path::new(BIN),
        "the daemon runs the installed binary"
    );
    job.finish("OK ");
    assert_exact(&d.final_scrape(), &jobid);

    // A second job, held with the probes in, while the package goes.
    let job = start_job(&dir);
    wait_ranks(&mut d, &job);
    goes_with_a_job_held(d, daemon_pid, "--remove", "config-files");
    assert!(!Path::new(BIN).exists() && !Path::new(PLUGSTACK).exists());
    assert!(Path::new(DEFAULTS).exists(), "remove keeps the conffile");
    // The job never noticed.
    job.finish("OK ");

    dpkg(&["--purge", PKG]);
    assert_eq!(status(), "");
    drop(guard);
    assert_gone(fresh.into_iter().chain(extra_paths()));
}

/// The package's `field` from its control file.
fn control_field(deb: &Path, field: &str) -> String {
    let o = run_with_timeout(
        Command::new("dpkg-deb").arg("--field").arg(deb).arg(field),
        Duration::from_secs(30),
    );
    assert!(o.status.success(), "dpkg-deb --field {field}");
    String::from_utf8(o.stdout).unwrap().trim().to_string()
}

/// `deb` repacked as version `version`, same files: the newer package a
/// site gets from its next build.
fn repack(deb: &Path, dir: &Path, version: &str) -> PathBuf {
    let root = dir.join("repack");
    let _ = std::fs::remove_dir_all(&root);
    let ok = |c: &mut Command| {
        let o = run_with_timeout(c, DPKG_LIMIT);
        assert!(
            o.status.success(),
            "{c:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    };
    ok(Command::new("dpkg-deb")
        .arg("--raw-extract")
        .arg(deb)
        .arg(&root));
    let control = root.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).unwrap();
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("Version: ") {
                format!("Version: {version}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&control, text).unwrap();
    let out = dir.join("mpi-observer-upgrade.deb");
    // gzip -1: the test's time goes to dpkg, not to compressing.
    ok(Command::new("dpkg-deb")
        .args(["-Zgzip", "-z1", "--root-owner-group", "--build"])
        .arg(&root)
        .arg(&out));
    let _ = std::fs::remove_dir_all(&root);
    out
}

#[test]
fn upgrade_while_observing_then_purge() {
    if !required() {
        return;
    }
    let dir = scratch("package-upgrade");
    let deb = deb();
    let fresh = new_paths(&deb);
    let newer = format!("{}+upgrade1", control_field(&deb, "Version"));
    let upgrade = repack(&deb, &dir, &newer);
    let guard = Installed::new(&deb);
    std::fs::write(DEFAULTS, SITE_OPTS).unwrap();
    // The site turns the shim on for every job (a default= in the line).
    let site_line = format!("optional {} default=stats\n", e2e::package::plugin());
    let slurm = Path::new(PLUGSTACK_DIR).is_dir();
    if slurm {
        std::fs::write(PLUGSTACK, &site_line).unwrap();
    }
    let launcher = unit_launcher(&dir);
    let job = start_job(&dir);
    let mut d = Daemon::start_binary(&launcher, &[]);
    let jobid = wait_ranks(&mut d, &job);
    let daemon_pid = d.pid();

    // The upgrade, while the daemon observes a job held with its probes in.
    dpkg(&["--install", upgrade.to_str().unwrap()]);
    let version = Command::new("dpkg-query")
        .args(["-W", "-f=${Version}", PKG])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&version.stdout), newer);
    assert_eq!(
        std::fs::read_to_string(DEFAULTS).unwrap(),
        SITE_OPTS,
        "the site's options survive the upgrade"
    );
    if slurm {
        assert_eq!(
            std::fs::read_to_string(PLUGSTACK).unwrap(),
            site_line,
            "the site's plugstack line survives the upgrade"
        );
    }
    assert_eq!(installed_output(&["shim-path"]), SHIM);
    // Without systemd nothing restarts it (with systemd the postinst's
    // try-restart does): the old daemon observes on, from its replaced
    // binary, and loses no figure.
    assert!(running(daemon_pid), "the daemon survives the upgrade");
    job.finish("OK ");
    assert_exact(&d.final_scrape(), &jobid);

    // A second job, held with the probes in, while the package is purged:
    // the prerm stops the daemon left on the replaced binary too.
    let job = start_job(&dir);
    wait_ranks(&mut d, &job);
    goes_with_a_job_held(d, daemon_pid, "--purge", "");
    job.finish("OK ");
    drop(guard);
    assert_gone(fresh.into_iter().chain(extra_paths()));
}
