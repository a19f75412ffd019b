//! End-to-end tests of rank identity against forgery (issue 21, attacks 6
//! and 7): a real daemon as root, a real honest job, and an unprivileged
//! user's processes that claim the honest job's id and rank, or a job id of
//! 131 kB. Every series must stay distinct, the honest figures exact under
//! the honest uid, and the exposition small. Harness: `e2e::attack`.

use std::{
    collections::HashSet,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, assert_no_probes_left,
    attack::{ATTACKER, User},
    compile, program, promtool_check, require, signal, sum, wait_for,
};

/// The job id everyone claims.
const JOBID: &str = "4242";
/// Calls of each function per rank: honest job, attacker, same-uid claim.
const HONEST_ITERS: u64 = 200;
const ATTACKER_ITERS: u64 = 300;
const CLAIM_ITERS: u64 = 70;
/// Bytes of the huge job id: one environment string stays under the
/// kernel's 128 KiB limit on each.
const HUGE_JOBID: usize = 131_000;

/// A directory under /tmp that the attacker can read and enter (the test's
/// scratch directory under target/ may not be), removed at the end.
struct Shared(PathBuf);

impl Shared {
    fn new(name: &str, mode: u32) -> Shared {
        let d = PathBuf::from(format!("/tmp/mpiobs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
        Shared(d)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An Open MPI job of `np` ranks running `exe ITERS GOFILE` after the
/// shell commands `env` (`export VAR=...`) in each rank, so that the
/// launcher does not take a `SLURM_JOB_ID` as its own, and a huge value is
/// made in the rank rather than passed through the launcher's arguments; as
/// `user` (`None`: root; a user's HOME and TMPDIR are its own, writable,
/// which an unprivileged Open MPI needs for its session directory).
fn start(np: u32, exe: &Path, iters: u64, env: &str, user: Option<&User>, go: PathBuf) -> Job {
    let mpi = Mpi::OpenMpi;
    let mut c = match user {
        None => mpi.launcher(np),
        Some(user) => user.launcher(mpi, np),
    };
    c.args(["sh", "-c", &format!("{env}; exec \"$0\" \"$@\"")])
        .arg(exe)
        .arg(iters.to_string());
    Job::spawn(c, np, go)
}

fn info(s: &[Sample], pid: u32) -> &Sample {
    s.iter()
        .find(|x| x.name == "mpi_rank_info" && x.label("pid") == Some(&pid.to_string()))
        .unwrap_or_else(|| panic!("mpi_rank_info of pid {pid}"))
}

/// Asserts that no (name, label set) occurs twice in `body`.
fn assert_unique_series(body: &str) {
    let mut seen = HashSet::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, _) = line.rsplit_once(' ').expect("a sample has a value");
        assert!(
            seen.insert(series),
            "duplicate series in the exposition: {series}"
        );
    }
}

#[test]
fn another_users_claim_of_a_job_and_rank_never_joins_its_series() {
    let mpi = Mpi::OpenMpi;
    if !require(&[
        Need::Root,
        Need::Mpi(mpi),
        Need::Command("bpftool"),
        Need::Command("promtool"),
    ]) {
        return;
    }
    let user = User::ensure(ATTACKER);
    let uid = user.uid.to_string();

    let bin = Shared::new("identity-bin", 0o755);
    let exe = bin.0.join("claim");
    compile(mpi, &program("identity/claim.c"), &exe, &[]);
    let go = |n: &str| bin.0.join(format!("go-{n}"));

    let huge = "7".repeat(HUGE_JOBID);
    let honest = start(
        2,
        &exe,
        HONEST_ITERS,
        &format!("export SLURM_JOB_ID={JOBID}"),
        None,
        go("honest"),
    );
    let attacker = start(
        1,
        &exe,
        ATTACKER_ITERS,
        &format!("export SLURM_JOB_ID={JOBID} OMPI_COMM_WORLD_RANK=0"),
        Some(&user),
        go("attacker"),
    );
    let huge_job = start(
        1,
        &exe,
        1,
        &format!("export SLURM_JOB_ID=$(printf '%0{HUGE_JOBID}d' 0 | tr 0 7)"),
        Some(&user),
        go("huge"),
    );
    // The honest user's own second claim of rank 0 of the job.
    let claim = start(
        1,
        &exe,
        CLAIM_ITERS,
        &format!("export SLURM_JOB_ID={JOBID}"),
        None,
        go("claim"),
    );

    // The honest ranks first: the first holder keeps the plain labels.
    let jobs = [&honest, &attacker, &huge_job, &claim];
    let pids: Vec<String> = jobs.iter().flat_map(|j| j.pid_args()).collect();
    let honest_pids = [honest.pid(0), honest.pid(1)];
    let (attacker_pid, huge_pid, claim_pid) = (attacker.pid(0), huge_job.pid(0), claim.pid(0));
    let mut daemon = Daemon::start(&pids);
    let (_, s) = daemon.scrape();
    assert_eq!(sum(&s, "mpi_observer_attached_processes", &[]), 5.0);
    for j in jobs {
        j.go();
    }
    for j in [honest, attacker, huge_job, claim] {
        j.finish("OK ");
    }
    let (body, s) = wait_for(
        "the daemon to notice the exits",
        Duration::from_secs(10),
        || {
            let (b, s) = daemon.scrape();
            (sum(&s, "mpi_rank_up", &[]) == 0.0).then_some((b, s))
        },
    );

    assert_unique_series(&body);
    promtool_check(&body);

    // The honest job: exact, under uid 0, plain labels.
    for (rank, pid) in [0u32, 1].into_iter().zip(honest_pids) {
        let i = info(&s, pid);
        let r = rank.to_string();
        assert_eq!(i.label("uid"), Some("0"));
        assert_eq!(i.label("rank"), Some(r.as_str()));
        assert_eq!(i.label("jobid"), Some(JOBID));
        assert_eq!(i.label("jobid_source"), Some("environment"));
        for f in ["MPI_Barrier", "MPI_Allreduce"] {
            let want = [
                ("jobid", JOBID),
                ("uid", "0"),
                ("rank", &r),
                ("function", f),
            ];
            assert_eq!(
                sum(&s, "mpi_calls_total", &want) as u64,
                HONEST_ITERS,
                "honest rank {rank} {f}"
            );
        }
    }

    // The attacker: its own uid, its own figures.
    let i = info(&s, attacker_pid);
    assert_eq!(
        (i.label("uid"), i.label("rank")),
        (Some(uid.as_str()), Some("0"))
    );
    let want = [
        ("jobid", JOBID),
        ("uid", uid.as_str()),
        ("rank", "0"),
        ("function", "MPI_Barrier"),
    ];
    assert_eq!(sum(&s, "mpi_calls_total", &want) as u64, ATTACKER_ITERS);

    // The same user's second claim of rank 0: labels of its own, counted.
    let claimed = format!("0#pid{claim_pid}");
    assert_eq!(info(&s, claim_pid).label("rank"), Some(claimed.as_str()));
    let want = [
        ("jobid", JOBID),
        ("uid", "0"),
        ("rank", claimed.as_str()),
        ("function", "MPI_Barrier"),
    ];
    assert_eq!(sum(&s, "mpi_calls_total", &want) as u64, CLAIM_ITERS);
    assert_eq!(sum(&s, "mpi_observer_identity_conflicts_total", &[]), 1.0);

    // Per-job histograms are per (job, uid): the honest count is the honest
    // ranks' and the same user's claim, never the attacker's.
    let count = |u: &str| {
        sum(
            &s,
            "mpi_call_duration_seconds_count",
            &[("jobid", JOBID), ("uid", u), ("function", "MPI_Barrier")],
        ) as u64
    };
    assert_eq!(count("0"), 2 * HONEST_ITERS + CLAIM_ITERS);
    assert_eq!(count(&uid), ATTACKER_ITERS);

    // The 131 kB job id: cut to 128 bytes, counted, the exposition small.
    let cut = info(&s, huge_pid).label("jobid").unwrap().to_string();
    assert_eq!(cut, huge[..128]);
    assert_eq!(
        sum(
            &s,
            "mpi_observer_label_truncations_total",
            &[("label", "jobid")]
        ),
        1.0
    );
    eprintln!("exposition: {} bytes for 5 ranks", body.len());
    assert!(
        body.len() < 128 * 1024,
        "{} bytes of exposition for 5 ranks",
        body.len()
    );
    let longest = body.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 1024, "a line of {longest} bytes");

    let status = daemon.stop(signal::TERM);
    assert!(status.success(), "daemon exit on TERM: {status}");
    assert_no_probes_left();
}
