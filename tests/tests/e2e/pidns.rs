//! A daemon inside a pid namespace (a container without hostPID, or
//! systemd booted as PID 1 in `unshare --pid`) counts the ranks of its own
//! namespace: the probes name a task by its pid there, as the daemon's
//! /proc, its attach calls and the exec ring do. Without that, every call
//! of such a rank went under its host pid, which the daemon never reads,
//! and the exec ring sent it host pids, naming nothing or another process.
//!
//! One `unshare --pid --mount --fork --mount-proc` holds an `attach --all`
//! daemon and an Open MPI job found by it; the namespace shares the host's
//! network, so the test scrapes the daemon from outside. A job started on
//! the host meanwhile must not appear; the namespace's job must, exact per
//! rank, found through exec events; no probe is left afterwards.

use std::{
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use e2e::{
    Mpi, Need, Sample, assert_no_probes_left, compile, free_port, http_get, observer_bin,
    parse_metrics, program, require, run_with_timeout, scratch, sum, wait_for, wait_with_timeout,
};

/// Ranks per job.
const NP: u32 = 2;
/// What each rank of short.c calls, and how often.
const CALLS: [(&str, u64); 2] = [("MPI_Barrier", 7), ("MPI_Allreduce", 11)];
/// The job ids of the two jobs (SLURM_JOB_ID in their ranks).
const INSIDE: &str = "pidns-inside";
const HOST: &str = "pidns-host";

/// What runs as the namespace's init: the daemon in the background, the
/// job once the test says so (`start`), then the daemon's orderly stop
/// (`stop`). Its arguments: the scratch directory, the daemon's address,
/// the daemon binary, then the job's command.
const SCRIPT: &str = r#"
dir=$1; addr=$2; obs=$3; shift 3
"$obs" attach --per-rank-detail --all --retain-exited 3600 \
    --handover-socket "$dir/handover.sock" --listen "$addr" 2>"$dir/daemon.log" &
d=$!
while [ ! -e "$dir/start" ]; do sleep 0.05; done
"$@" >"$dir/job.out" 2>&1
echo $? >"$dir/job.status"
while [ ! -e "$dir/stop" ]; do sleep 0.05; done
kill -TERM "$d"
wait "$d"
echo $? >"$dir/daemon.status"
"#;

/// `mpirun` for `exe` with job id `jobid`, its ranks waiting `ms` after
/// MPI_Init before their counted calls.
fn job(exe: &Path, jobid: &str, ms: u32) -> Command {
    let mut c = Mpi::OpenMpi.launcher(NP);
    c.args(["-x", &format!("SLURM_JOB_ID={jobid}")])
        .arg(exe)
        .arg(ms.to_string());
    c
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn required() -> bool {
    require(&[
        Need::Root,
        Need::Mpi(Mpi::OpenMpi),
        Need::Command("bpftool"),
        Need::Command("unshare"),
    ])
}

/// The namespace's init ([`SCRIPT`]) running `job` once `dir/start` is
/// written, its daemon at `addr` serving /metrics.
fn namespace(dir: &Path, addr: &str, job: &Command) -> std::process::Child {
    let mut ns = Command::new("unshare");
    ns.args(["--pid", "--mount", "--fork", "--mount-proc", "sh", "-c"])
        .arg(SCRIPT)
        .arg("sh")
        .arg(dir)
        .arg(addr)
        .arg(observer_bin())
        .arg(job.get_program())
        .args(job.get_args())
        .envs(job.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let ns = ns.spawn().expect("start unshare");
    wait_for(
        "the namespace's daemon to serve /metrics",
        Duration::from_secs(60),
        || http_get(addr, "/metrics").ok().filter(|(c, _)| *c == 200),
    );
    ns
}

/// Waits for the namespace's job to end and asserts it succeeded.
fn job_succeeded(dir: &Path) {
    let status = wait_for(
        "the namespace's job to end",
        Duration::from_secs(90),
        || Some(read(&dir.join("job.status"))).filter(|s| !s.is_empty()),
    );
    assert_eq!(
        status.trim(),
        "0",
        "the namespace's job failed:\n{}",
        read(&dir.join("job.out"))
    );
}

fn scrape(addr: &str) -> Vec<Sample> {
    let (code, body) = http_get(addr, "/metrics").expect("scrape");
    assert_eq!(code, 200);
    parse_metrics(&body)
}

/// Stops the namespace's daemon (TERM), asserts it exited 0, and that no
/// probe is left.
fn stop(dir: &Path, ns: std::process::Child) {
    std::fs::write(dir.join("stop"), b"stop").unwrap();
    let o = wait_with_timeout(ns, Duration::from_secs(60));
    assert!(
        o.status.success(),
        "unshare: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(
        read(&dir.join("daemon.status")).trim(),
        "0",
        "the daemon's exit on TERM\n{}",
        read(&dir.join("daemon.log"))
    );
    assert_no_probes_left();
}

#[test]
fn a_daemon_in_a_pid_namespace_counts_its_namespace_ranks_exactly_and_no_others() {
    if !required() {
        return;
    }
    let dir = scratch("pidns");
    let exe = dir.join("short-openmpi");
    compile(Mpi::OpenMpi, &program("shortjobs/short.c"), &exe, &[]);
    let addr = format!("127.0.0.1:{}", free_port());
    let ns = namespace(&dir, &addr, &job(&exe, INSIDE, 500));
    let log = || read(&dir.join("daemon.log"));
    assert!(
        log().contains("count the ranks of this namespace only"),
        "the daemon must say it observes its pid namespace only:\n{}",
        log()
    );

    // Both jobs at once: the host's runs longer, so it is alive throughout.
    let host = job(&exe, HOST, 1500)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the host job");
    std::fs::write(dir.join("start"), b"go").unwrap();
    job_succeeded(&dir);
    let o = wait_with_timeout(host, Duration::from_secs(90));
    assert!(
        o.status.success(),
        "the host job failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Until every rank's exit is noticed and the job's series are there;
    // if they never are, the checks below say what is missing.
    let start = std::time::Instant::now();
    let s = loop {
        let s = scrape(&addr);
        let seen = s.iter().any(|x| x.label("jobid") == Some(INSIDE));
        if (seen && sum(&s, "mpi_rank_up", &[]) == 0.0) || start.elapsed() > Duration::from_secs(30)
        {
            break s;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for r in 0..NP {
        for (f, n) in CALLS {
            let got = sum(
                &s,
                "mpi_calls_total",
                &[("jobid", INSIDE), ("rank", &r.to_string()), ("function", f)],
            );
            assert_eq!(
                got as u64,
                n,
                "rank {r} of the namespace's job, {f}\ndaemon log:\n{}",
                log()
            );
        }
    }
    let foreign: Vec<&Sample> = s
        .iter()
        .filter(|x| x.label("jobid") == Some(HOST))
        .collect();
    assert!(
        foreign.is_empty(),
        "the host job's ranks are not the namespace's daemon's: {foreign:?}"
    );
    // Found as they started, through the exec ring (whose pids are now
    // the namespace's), not only by the scan.
    let found = sum(&s, "mpi_observer_exec_found_total", &[]);
    assert!(
        found >= f64::from(NP),
        "the ranks must be found through exec events, {found} were\ndaemon log:\n{}",
        log()
    );
    stop(&dir, ns);
}

/// A rank in a pid namespace nested in the daemon's shows in the daemon's
/// /proc but its tasks are not in the daemon's namespace, so the probes
/// would count none of its calls: it is refused, said and counted, never
/// attached to count nothing.
#[test]
fn a_rank_of_a_nested_pid_namespace_is_refused_and_counted() {
    if !required() {
        return;
    }
    let dir = scratch("pidns-nested");
    let exe = dir.join("short-openmpi");
    compile(Mpi::OpenMpi, &program("shortjobs/short.c"), &exe, &[]);
    let addr = format!("127.0.0.1:{}", free_port());
    let inner = job(&exe, INSIDE, 1500);
    let mut nested = Command::new("unshare");
    nested
        .args(["--pid", "--mount", "--fork", "--mount-proc"])
        .arg(inner.get_program())
        .args(inner.get_args())
        .envs(inner.get_envs().filter_map(|(k, v)| Some((k, v?))));
    let ns = namespace(&dir, &addr, &nested);
    std::fs::write(dir.join("start"), b"go").unwrap();
    job_succeeded(&dir);
    let s = scrape(&addr);
    let log = read(&dir.join("daemon.log"));
    let refusals = log
        .lines()
        .filter(|l| l.contains("it is in another pid namespace than the daemon's"))
        .count();
    assert_eq!(refusals, NP as usize, "one line per nested rank:\n{log}");
    assert_eq!(
        sum(&s, "mpi_observer_attach_failures_total", &[]),
        f64::from(NP),
        "every nested rank refused is counted\n{log}"
    );
    assert!(
        !s.iter().any(|x| x.label("jobid") == Some(INSIDE)),
        "a nested rank must not be exported as if observed\n{log}"
    );
    stop(&dir, ns);
}

/// Inside a pid namespace with the host's /proc, every pid the daemon read
/// there would name another process than its probes': it refuses to
/// start, in one line.
#[test]
fn a_daemon_in_a_pid_namespace_without_its_own_proc_refuses_to_start() {
    if !required() {
        return;
    }
    let o = run_with_timeout(
        Command::new("unshare")
            .args(["--pid", "--fork"])
            .arg(observer_bin())
            .args(["attach", "--all", "--handover-socket", "none", "--listen"])
            .arg(format!("127.0.0.1:{}", free_port())),
        Duration::from_secs(30),
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "it must refuse: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    assert!(
        lines[0].contains("/proc is not this pid namespace's"),
        "it must say what is wrong: {err}"
    );
    assert_no_probes_left();
}
