//! End-to-end tests of the exit handover of a daemon run by a user without
//! root (issue 34): `mpi-observer attach --all --no-bpf`, as the README
//! offers it, listens on that user's own socket under their runtime
//! directory, and the shim of that user's ranks knocks there. Such a daemon
//! has no exec events (the process connector needs `CAP_NET_ADMIN`) and
//! cannot open a segment once it is unlinked, so a short job's ranks reach
//! it only through their knock. Every rank of short jobs is then exact, in
//! the scrape and in `--report-file`; a rank it finds only after its
//! segment is gone is said in one line and never shown as a rank without
//! calls.

use std::{
    collections::BTreeMap,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::Duration,
};

use e2e::{
    Daemon, Mpi, Need, Sample,
    attack::{User, VICTIM},
    compile, program, require, scratch, shim_launcher, signal, sum, wait_for, wait_with_timeout,
};

/// The calls of every rank of handover/allreduce.c.
const CALLS: u64 = 25;
/// Ranks per job.
const NP: u32 = 2;
/// What a daemon says of a rank found after its segment is gone.
const GONE_LINE: &str = "was found after its MPI_Finalize, its stats segment already gone";

/// `user`'s daemon, started as that user alone (`setpriv`: real and
/// effective uid and gid, no supplementary group, so no capability), with
/// `runtime` as its `XDG_RUNTIME_DIR`: `attach --all --no-bpf
/// --retain-exited 3600 --report-file REPORT` and no `--handover-socket`.
fn user_daemon(user: &User, runtime: &Path, report: &Path) -> Daemon {
    let ids = [
        format!("--reuid={}", user.uid),
        format!("--regid={}", user.gid),
    ];
    let env = [
        format!("XDG_RUNTIME_DIR={}", runtime.display()),
        format!("HOME={}", user.home.display()),
    ];
    let wrapper = [
        "setpriv",
        &ids[0],
        &ids[1],
        "--clear-groups",
        "env",
        &env[0],
        &env[1],
    ];
    Daemon::start_wrapped(
        &wrapper,
        &[
            "--all".into(),
            "--no-bpf".into(),
            "--retain-exited".into(),
            "3600".into(),
            "--report-file".into(),
            report.to_str().unwrap().into(),
        ],
    )
}

/// A runtime directory of `user`'s, mode 0700, as pam_systemd makes
/// /run/user/UID (which the test users, never logged in, lack).
fn runtime_dir(user: &User) -> PathBuf {
    let d = user.home.join("run");
    std::fs::create_dir_all(&d).unwrap();
    user.own(&d);
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

/// A 2-rank job of `exe` under the shim's `stats`, run by `user` with
/// `runtime` as its runtime directory, its id `jobid`, `env` more
/// variables for the ranks, `args` the program's.
fn job(
    user: &User,
    mpi: Mpi,
    exe: &Path,
    runtime: &Path,
    jobid: &str,
    env: &[(&str, &str)],
    args: &[&str],
) -> Child {
    let mut c = shim_launcher(mpi, NP, "stats");
    user.apply(&mut c).env("XDG_RUNTIME_DIR", runtime);
    for (k, v) in [("SLURM_JOB_ID", jobid)].iter().chain(env) {
        if mpi.is_open_mpi() {
            c.args(["-x", &format!("{k}={v}")]);
        } else {
            c.args(["-genv", k, v]);
        }
    }
    // A group of its own, so that [`Running`] can end all of it.
    c.process_group(0)
        .arg(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start a job")
}

/// A job that is killed, launcher and ranks, if the test ends before it
/// does: a failed test leaves no rank for the next one's daemon to find.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            // SAFETY: kill(2) on the process group of our own child.
            unsafe { libc::kill(-(c.id() as i32), libc::SIGKILL) };
            let _ = c.wait();
        }
    }
}

/// Compiles handover/allreduce.c for `mpi` into `dir`.
fn allreduce(mpi: Mpi, dir: &Path) -> PathBuf {
    let exe = dir.join(format!("allreduce-{}", mpi.name()));
    compile(mpi, &program("handover/allreduce.c"), &exe, &[]);
    exe
}

/// The (jobid, rank) → MPI_Allreduce calls of every rank in the report
/// data at `path`.
fn reported(path: &Path) -> BTreeMap<(String, String), u64> {
    let data: serde_json::Value =
        serde_json::from_slice(&std::fs::read(path).expect("the report data")).unwrap();
    let mut calls = BTreeMap::new();
    for r in data["ranks"].as_array().expect("ranks") {
        let key = (
            r["jobid"].as_str().unwrap_or("").to_string(),
            r["rank"].as_str().unwrap_or("").to_string(),
        );
        let n: u64 = r["functions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|f| f["name"] == "MPI_Allreduce")
            .map(|f| f["calls"].as_u64().unwrap_or(0))
            .sum();
        calls.insert(key, n);
    }
    calls
}

/// Every rank listed (`mpi_rank_info`) as (jobid, rank), with its
/// MPI_Allreduce calls.
fn listed(s: &[Sample]) -> BTreeMap<(String, String), u64> {
    s.iter()
        .filter(|x| x.name == "mpi_rank_info")
        .map(|x| {
            let jobid = x.label("jobid").unwrap_or("").to_string();
            let rank = x.label("rank").unwrap_or("").to_string();
            let n = sum(
                s,
                "mpi_calls_total",
                &[
                    ("jobid", &jobid),
                    ("rank", &rank),
                    ("function", "MPI_Allreduce"),
                ],
            ) as u64;
            ((jobid, rank), n)
        })
        .collect()
}

/// Three 2-rank MPICH jobs at once, then an Open MPI one, each rank 25
/// MPI_Allreduce under the shim's `stats`, each job a fraction of a second,
/// under a daemon its user started without root: every rank is exact in
/// the scrape and in the report data, held through its knock at the
/// user's own socket, and no rank is listed without its calls.
#[test]
fn an_unprivileged_daemon_keeps_every_rank_of_its_users_short_jobs() {
    if !require(&[
        Need::Root,
        Need::Mpi(Mpi::Mpich),
        Need::Mpi(Mpi::OpenMpi),
        Need::Command("setpriv"),
    ]) {
        return;
    }
    let dir = scratch("handover-user");
    let user = User::ensure(VICTIM);
    let runtime = runtime_dir(&user);
    let report = user.home.join("report.json");
    let exes = [Mpi::Mpich, Mpi::OpenMpi].map(|m| (m, allreduce(m, &dir)));
    let mut daemon = user_daemon(&user, &runtime, &report);
    let socket = runtime.join("mpi-observer/handover.sock");
    wait_for("the user's own socket", Duration::from_secs(10), || {
        socket.exists().then_some(())
    });
    assert!(
        daemon
            .log()
            .iter()
            .any(|l| l.contains(socket.to_str().unwrap()) && l.contains("knock")),
        "the daemon says where its user's ranks knock"
    );
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(socket.parent().unwrap()), 0o700);
    assert_eq!(mode(&socket), 0o600, "only its user's ranks reach it");

    let mut jobids = Vec::new();
    for batch in [&[0usize, 0, 0][..], &[1]] {
        let children: Vec<(String, Running)> = batch
            .iter()
            .map(|&m| {
                let (mpi, exe) = &exes[m];
                let id = format!("user-{}-{}", mpi.name(), jobids.len());
                jobids.push(id.clone());
                let c = Running(Some(job(&user, *mpi, exe, &runtime, &id, &[], &[])));
                (id, c)
            })
            .collect();
        for (id, mut c) in children {
            let o = wait_with_timeout(c.0.take().unwrap(), Duration::from_secs(60));
            assert!(
                o.status.success(),
                "job {id} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }

    let s = daemon.final_scrape();
    let want: BTreeMap<(String, String), u64> = jobids
        .iter()
        .flat_map(|id| (0..NP).map(move |r| ((id.clone(), r.to_string()), CALLS)))
        .collect();
    let l = listed(&s);
    let knocks = |r: &str| sum(&s, "mpi_observer_exit_handovers_total", &[("result", r)]);
    let (held, stale) = (knocks("held"), knocks("stale"));
    let (status, log) = daemon.stop_and_log(signal::TERM);
    assert!(status.success(), "daemon exit on TERM: {status}");
    assert_eq!(
        l,
        want,
        "every rank listed, each with its exact calls, no other\ndaemon log:\n{}",
        log.join("\n")
    );
    assert_eq!(held, want.len() as f64, "every rank held at its knock");
    assert_eq!(stale, 0.0);
    assert!(
        !log.iter().any(|l| l.contains(GONE_LINE)),
        "no rank found after its segment was gone"
    );
    assert_eq!(
        reported(&report),
        want,
        "the report data {}: every rank exact, no other",
        report.display()
    );
}

/// A rank whose segment is gone when the daemon finds it (it opted out of
/// the knock, and the daemon started after its MPI_Finalize, while it
/// still runs): the daemon says so once per rank, counts it as
/// `segment_errors_total{reason="gone"}`, and never lists it as a rank
/// without calls, neither in the scrape nor in the report data.
#[test]
fn a_rank_found_after_its_segment_is_gone_is_said_once_and_not_listed() {
    if !require(&[Need::Root, Need::Mpi(Mpi::Mpich), Need::Command("setpriv")]) {
        return;
    }
    let dir = scratch("handover-gone");
    let user = User::ensure(VICTIM);
    let runtime = runtime_dir(&user);
    let report = user.home.join("report.json");
    let exe = allreduce(Mpi::Mpich, &dir);
    // Finalized, unlinked, then 4 s more of life outside MPI.
    let mut c = Running(Some(job(
        &user,
        Mpi::Mpich,
        &exe,
        &runtime,
        "gone",
        &[("MPI_OBSERVER_HANDOVER_SOCKET", "none")],
        &["4000"],
    )));
    let mut out = std::io::BufReader::new(c.0.as_mut().unwrap().stdout.take().unwrap());
    // The launcher may join the ranks' lines into one.
    let mut said = String::new();
    while said.matches("finalized").count() < NP as usize {
        use std::io::BufRead as _;
        let n = out.read_line(&mut said).unwrap();
        assert!(n > 0, "the job ended before its ranks finalized: {said:?}");
    }
    let mut daemon = user_daemon(&user, &runtime, &report);
    wait_for(
        "a line for each rank found after its MPI_Finalize",
        Duration::from_secs(10),
        || {
            (daemon
                .log()
                .iter()
                .filter(|l| l.contains(GONE_LINE))
                .count()
                >= NP as usize)
                .then_some(())
        },
    );
    let o = wait_with_timeout(c.0.take().unwrap(), Duration::from_secs(60));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // Past the ranks' exit and a few scans of the processes still there.
    std::thread::sleep(Duration::from_millis(1500));
    let (_, s) = daemon.scrape();
    let gone = sum(
        &s,
        "mpi_observer_segment_errors_total",
        &[("reason", "gone")],
    );
    let (status, log) = daemon.stop_and_log(signal::TERM);
    assert!(status.success(), "daemon exit on TERM: {status}");
    assert_eq!(
        listed(&s),
        BTreeMap::new(),
        "no rank listed without its calls"
    );
    assert_eq!(gone, f64::from(NP), "each rank counted once");
    let lines: Vec<&String> = log.iter().filter(|l| l.contains(GONE_LINE)).collect();
    assert_eq!(lines.len(), NP as usize, "one line per rank: {lines:?}");
    assert!(
        lines.iter().all(|l| l.contains("allreduce-mpich")),
        "the line names the program: {lines:?}"
    );
    // Written once a rank was observed: none was.
    assert!(
        !report.exists(),
        "no report data without a rank: {:?}",
        std::fs::read_to_string(&report)
    );
}
