//! End-to-end tests of `mpi-observer attach`: real eBPF probes on real MPI
//! jobs (Debian's Open MPI and MPICH; the exact counts also on Open MPI 5 and
//! MPICH 5 from PyPI, MPICH 5 through its native and its MPI-5 standard ABI),
//! real HTTP scrapes, real bpftool and promtool.

use std::{collections::BTreeMap, path::Path, process::Command, time::Duration};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, assert_no_probes_left, compile, free_port, http_get,
    observer_bin, program, promtool_check, require, run_with_timeout, scratch, signal, sum,
    wait_for,
};

/// Iterations of the counted phase of tests/programs/mix.c.
const ITERS: u64 = 40;
const NP: u32 = 3;

/// Starts tests/programs/`program_name` (compiled for `mpi` once per
/// directory) on `np` ranks with `args`, held at its go file.
fn start_program(mpi: Mpi, dir: &Path, np: u32, program_name: &str, args: &[String]) -> Job {
    let stem = program_name.split('.').next().unwrap_or(program_name);
    let exe = dir.join(format!("{stem}-{}", mpi.name()));
    if !exe.exists() {
        compile(mpi, &program(program_name), &exe, &[]);
    }
    let mut launcher = mpi.launcher(np);
    launcher.arg(&exe).args(args);
    Job::spawn(launcher, np, dir.join(format!("go-{}", std::process::id())))
}

/// tests/programs/mix.c with `iters` iterations of its counted phase.
fn start_mix(mpi: Mpi, dir: &Path, np: u32, iters: u64) -> Job {
    start_program(mpi, dir, np, "mix.c", &[iters.to_string()])
}

/// mix.c's expected figures for one rank: see [`e2e::mix_expected`].
fn expected(rank: u32, derived_known: bool) -> BTreeMap<&'static str, (u64, u64, u64, u64)> {
    e2e::mix_expected(rank, ITERS, derived_known)
}

fn check_exact(samples: &[Sample], mpi: Mpi, jobid: &str) {
    e2e::check_mix_exact(samples, mpi, jobid, NP, ITERS);
}

/// The `library` label of `mpi_rank_info`: the implementation, with `-abi`
/// for its MPI-5 standard ABI library (`libmpi_abi.so`).
fn library_label(mpi: Mpi) -> &'static str {
    match mpi {
        Mpi::OpenMpi | Mpi::OpenMpi5 => "openmpi",
        Mpi::Mpich | Mpi::Mpich5 => "mpich",
        Mpi::Mpich5Abi => "mpich-abi",
    }
}

fn jobid_of(samples: &[Sample], pid: u32) -> Option<String> {
    samples
        .iter()
        .find(|s| s.name == "mpi_rank_info" && s.label("pid") == Some(&pid.to_string()))
        .and_then(|s| s.label("jobid").map(str::to_string))
}

fn exact_counts(mpi: Mpi) {
    if !require(&[
        Need::Root,
        Need::Mpi(mpi),
        Need::Command("bpftool"),
        Need::Command("promtool"),
    ]) {
        return;
    }
    let dir = scratch(&format!("exact-{}", mpi.name()));
    let job = start_mix(mpi, &dir, NP, ITERS);
    let mut daemon = Daemon::start(&job.pid_args());
    let (_, s) = daemon.scrape();
    assert_eq!(sum(&s, "mpi_observer_attached_processes", &[]) as u32, NP);
    let jobid = jobid_of(&s, job.ranks[0].1).expect("rank info for rank 0");
    for (rank, pid) in &job.ranks {
        let info = s
            .iter()
            .find(|x| x.name == "mpi_rank_info" && x.label("pid") == Some(&pid.to_string()))
            .unwrap();
        assert_eq!(info.label("rank"), Some(rank.to_string().as_str()));
        assert_eq!(info.label("size"), Some(NP.to_string().as_str()));
        assert_eq!(
            info.label("jobid"),
            Some(jobid.as_str()),
            "one job id for all ranks"
        );
        assert_eq!(info.label("library"), Some(library_label(mpi)));
    }
    job.go();
    job.finish("OK ");
    // The ranks exited: their final figures are retained and exact.
    let (body, s) = wait_for(
        "the daemon to notice the exits",
        Duration::from_secs(10),
        || {
            let (b, s) = daemon.scrape();
            (sum(&s, "mpi_rank_up", &[]) == 0.0).then_some((b, s))
        },
    );
    check_exact(&s, mpi, &jobid);
    assert_eq!(sum(&s, "mpi_observer_attached_processes", &[]), 0.0);
    promtool_check(&body);
    for forbidden in ["job=\"", "instance=\""] {
        assert!(
            !body.contains(forbidden),
            "label {forbidden} belongs to Prometheus"
        );
    }
    let status = daemon.stop(signal::TERM);
    assert!(status.success(), "daemon exit on signal::TERM: {status}");
    assert_no_probes_left();
}

e2e::per_mpi!(exact_counts => exact_counts: openmpi, mpich, openmpi5, mpich5, mpich5_abi);

#[test]
fn all_mode_picks_up_a_job_started_later_and_retains_it() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    let dir = scratch("all-mode");
    let mut daemon = Daemon::start(&["--all".into(), "--retain-exited".into(), "300".into()]);
    let job = start_mix(mpi, &dir, NP, ITERS);
    let pids = job.pids();
    let jobid = wait_for(
        "--all to attach to the new ranks",
        Duration::from_secs(20),
        || {
            let (_, s) = daemon.scrape();
            let attached = pids.iter().all(|p| jobid_of(&s, *p).is_some());
            attached.then(|| jobid_of(&s, pids[0]).unwrap())
        },
    );
    e2e::wait_datatypes(&mut daemon);
    job.go();
    job.finish("OK ");
    let s = wait_for("the exits to be noticed", Duration::from_secs(10), || {
        let (_, s) = daemon.scrape();
        (sum(&s, "mpi_rank_up", &[("jobid", &jobid)]) == 0.0).then_some(s)
    });
    // Retained after exit, exact.
    check_exact(&s, mpi, &jobid);
    assert_eq!(
        s.iter()
            .filter(|x| x.name == "mpi_rank_exit_time_seconds" && x.label("jobid") == Some(&jobid))
            .count(),
        NP as usize
    );
    let status = daemon.stop(signal::INT);
    assert!(status.success(), "daemon exit on signal::INT: {status}");
    assert_no_probes_left();
}

#[test]
fn kill_9_leaves_no_probe_and_the_job_finishes_correctly() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    let dir = scratch("kill9");
    // Long enough to be mid-run when the daemon dies.
    let job = start_mix(mpi, &dir, NP, 3000);
    let mut daemon = Daemon::start(&job.pid_args());
    job.go();
    wait_for("calls to be counted", Duration::from_secs(20), || {
        let (_, s) = daemon.scrape();
        (sum(&s, "mpi_calls_total", &[("function", "MPI_Allreduce")]) > 10.0).then_some(())
    });
    let status = daemon.stop(signal::KILL);
    assert!(!status.success());
    assert_no_probes_left();
    job.finish("OK ");
}

#[test]
fn a_call_in_flight_at_attach_time_is_not_counted() {
    for mpi in Mpi::ALL {
        if !require(&[Need::Root, Need::Mpi(mpi)]) {
            return;
        }
        let dir = scratch(&format!("inflight-{}", mpi.name()));
        let job = start_program(mpi, &dir, NP, "inflight.c", &[]);
        // Let rank 1 get well into its MPI_Recv before the probes go in.
        std::thread::sleep(Duration::from_millis(500));
        let mut daemon = Daemon::start(&job.pid_args());
        job.go();
        job.finish("OK ");
        let s = wait_for("the exits", Duration::from_secs(10), || {
            let (_, s) = daemon.scrape();
            (sum(&s, "mpi_rank_up", &[]) == 0.0).then_some(s)
        });
        let calls =
            |rank: &str, f: &str| sum(&s, "mpi_calls_total", &[("rank", rank), ("function", f)]);
        assert_eq!(
            calls("1", "MPI_Recv"),
            0.0,
            "{mpi:?}: the receive began before attach"
        );
        assert_eq!(calls("0", "MPI_Send"), 1.0, "{mpi:?}");
        for r in ["0", "1", "2"] {
            assert_eq!(
                calls(r, "MPI_Barrier"),
                10.0,
                "{mpi:?} rank {r}: barriers after the in-flight call"
            );
        }
        assert!(daemon.stop(signal::TERM).success());
    }
}

#[test]
fn fortran_calls_are_counted_under_their_c_names() {
    for mpi in Mpi::ALL {
        // `Need::Command` holds a `&'static str`: leaked, once per test.
        let mpifort = mpi.mpifort().leak();
        if !require(&[Need::Root, Need::Mpi(mpi), Need::Command(mpifort)]) {
            return;
        }
        let dir = scratch(&format!("fortran-{}", mpi.name()));
        let job = start_program(mpi, &dir, 2, "fortran.f90", &[]);
        let mut daemon = Daemon::start(&job.pid_args());
        job.go();
        job.finish("OK ");
        let s = wait_for("the exits", Duration::from_secs(10), || {
            let (_, s) = daemon.scrape();
            (sum(&s, "mpi_rank_up", &[]) == 0.0).then_some(s)
        });
        let calls =
            |rank: &str, f: &str| sum(&s, "mpi_calls_total", &[("rank", rank), ("function", f)]);
        assert_eq!(calls("0", "MPI_Send"), 10.0, "{mpi:?}: Fortran MPI_SEND");
        assert_eq!(calls("1", "MPI_Recv"), 10.0, "{mpi:?}: Fortran MPI_RECV");
        for r in ["0", "1"] {
            assert_eq!(
                calls(r, "MPI_Barrier"),
                5.0,
                "{mpi:?} rank {r}: Fortran MPI_BARRIER"
            );
        }
        let bytes = |rank: &str, f: &str, d: &str| {
            sum(
                &s,
                "mpi_bytes_total",
                &[("rank", rank), ("function", f), ("direction", d)],
            )
        };
        // MPI_INTEGER is 4 bytes on both libraries.
        assert_eq!(bytes("0", "MPI_Send", "send"), 40.0, "{mpi:?}");
        assert_eq!(bytes("1", "MPI_Recv", "recv"), 40.0, "{mpi:?}");
        assert!(daemon.stop(signal::TERM).success());
    }
}

/// Runs the daemon expecting failure: one line on stderr, non-zero exit.
fn expect_one_line_error(cmd: &mut Command, needle: &str) -> String {
    let out = run_with_timeout(cmd, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {err}"
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "exactly one line expected:\n{err}"
    );
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(err.starts_with("mpi-observer: error: "), "{err}");
    err
}

fn attach_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(observer_bin());
    c.arg("attach")
        .args(args)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())]);
    c
}

#[test]
fn bad_input_nonexistent_pid() {
    if !require(&[Need::Root]) {
        return;
    }
    let mut gone = Command::new("true").spawn().unwrap();
    let pid = gone.id();
    gone.wait().unwrap();
    expect_one_line_error(
        &mut attach_cmd(&["--pid", &pid.to_string()]),
        &format!("no process with pid {pid}"),
    );
}

#[test]
fn bad_input_process_without_mpi() {
    if !require(&[Need::Root]) {
        return;
    }
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let err = expect_one_line_error(
        &mut attach_cmd(&["--pid", &sleeper.id().to_string()]),
        "has no MPI library mapped",
    );
    assert!(err.contains("(sleep)"), "{err}");
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn bad_input_not_root_names_the_capabilities() {
    if !require(&[Need::Root, Need::Command("setpriv")]) {
        return;
    }
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
    ])
    .arg(observer_bin())
    .args(["attach", "--pid", "1"]);
    let err = expect_one_line_error(&mut c, "missing capabilities");
    for cap in [
        "CAP_BPF",
        "CAP_PERFMON",
        "CAP_SYS_PTRACE",
        "CAP_DAC_READ_SEARCH",
    ] {
        assert!(err.contains(cap), "{cap} not named: {err}");
    }
}

/// A launcher that makes bpf() fail with ENOSYS, exactly as on a kernel
/// without CONFIG_BPF_SYSCALL, then execs its arguments.
const NO_BPF_C: &str = r#"
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_bpf, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog p = { sizeof f / sizeof f[0], f };
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &p)) return 99;
    execv(argv[1], argv + 1);
    return 98;
}
"#;

#[test]
fn bad_input_kernel_without_bpf() {
    if !require(&[Need::Root, Need::Command("cc")]) {
        return;
    }
    let dir = scratch("nobpf");
    let src = dir.join("nobpf.c");
    std::fs::write(&src, NO_BPF_C).unwrap();
    let exe = dir.join("nobpf");
    let o = Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut c = Command::new(&exe);
    c.arg(observer_bin()).args(["attach", "--pid", "1"]);
    expect_one_line_error(&mut c, "no BPF support");
}

#[test]
fn bad_input_kernel_without_uprobes() {
    if !require(&[Need::Root, Need::Command("unshare")]) {
        return;
    }
    // In a private mount namespace, hide the uprobe PMU as a kernel built
    // without CONFIG_UPROBE_EVENTS would not have it.
    let script = format!(
        "mount -t tmpfs none /sys/bus/event_source/devices/uprobe && exec {} attach --pid 1",
        observer_bin().display()
    );
    let mut c = Command::new("unshare");
    c.args(["-m", "--propagation", "private", "sh", "-c", &script]);
    expect_one_line_error(&mut c, "no uprobe support");
}

#[test]
fn bad_input_listen_address_in_use_leaves_the_job_unharmed() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch("inuse");
    let job = start_mix(mpi, &dir, NP, 5);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut c = Command::new(observer_bin());
    c.args([
        "attach",
        "--pid",
        &job.ranks[0].1.to_string(),
        "--listen",
        &addr,
    ]);
    expect_one_line_error(&mut c, "already in use");
    job.go();
    job.finish("OK ");
}

#[test]
fn bad_input_library_without_dynamic_symbols() {
    if !require(&[Need::Root, Need::Command("cc")]) {
        return;
    }
    let dir = scratch("nosyms");
    // A library named like Open MPI's that exports no PMPI entry point.
    std::fs::write(dir.join("fake.c"), "int not_mpi(void) { return 1; }\n").unwrap();
    let lib = dir.join("libmpi.so.99");
    let o = Command::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(dir.join("fake.c"))
        .output()
        .unwrap();
    assert!(o.status.success());
    std::fs::write(
        dir.join("host.c"),
        "#include <dlfcn.h>\n#include <unistd.h>\nint main(int c, char **v) { if (!dlopen(v[1], RTLD_NOW)) return 2; sleep(30); return 0; }\n",
    )
    .unwrap();
    let host = dir.join("host");
    let o = Command::new("cc")
        .arg("-o")
        .arg(&host)
        .arg(dir.join("host.c"))
        .arg("-ldl")
        .output()
        .unwrap();
    assert!(o.status.success());
    let mut h = Command::new(&host).arg(&lib).spawn().unwrap();
    let pid = h.id();
    wait_for(
        "the host to map the fake library",
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(format!("/proc/{pid}/maps"))
                .ok()?
                .contains("libmpi.so.99")
                .then_some(())
        },
    );
    expect_one_line_error(
        &mut attach_cmd(&["--pid", &pid.to_string()]),
        "exports no dynamic PMPI_* symbols",
    );
    let _ = h.kill();
    let _ = h.wait();
}

#[test]
fn bad_functions_pattern_is_named() {
    let mut c = Command::new(observer_bin());
    c.args(["functions", "--functions", "MPI_Sned"]);
    expect_one_line_error(&mut c, "'MPI_Sned' matches no MPI function");
}

#[test]
fn landing_page_and_404() {
    if !require(&[Need::Root]) {
        return;
    }
    let mut daemon = Daemon::start(&["--all".into()]);
    let (code, body) = http_get(&daemon.addr, "/").unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("href=\"/metrics\""), "{body}");
    assert_eq!(http_get(&daemon.addr, "/nope").unwrap().0, 404);
    let (_, s) = daemon.scrape();
    for m in [
        "mpi_observer_attached_processes",
        "mpi_observer_probes",
        "mpi_observer_scrape_duration_seconds",
        "mpi_observer_attach_failures_total",
    ] {
        assert!(s.iter().any(|x| x.name == m), "{m} missing");
    }
    assert!(daemon.stop(signal::TERM).success());
}

/// `--map-memory` bounds the statistics map: with a budget of a few
/// entries most (process, function) pairs find it full. Every call of the
/// counted phase is then either counted or in
/// `mpi_observer_map_update_failures_total{map="stats"}`, never lost
/// silently, no more pairs are exported than fit, and the job is unharmed.
#[test]
fn a_tiny_map_budget_loses_no_call_silently() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    // 376 bytes an entry (observer_common::maps::STATS_ENTRY_BYTES), on
    // any number of CPUs: the map is shared by them.
    let budget = 5 * 376;
    let dir = scratch("tiny-map-budget");
    let job = start_mix(mpi, &dir, NP, ITERS);
    let mut args = job.pid_args();
    args.extend(["--map-memory".to_string(), budget.to_string()]);
    let mut daemon = Daemon::start(&args);
    job.go();
    job.finish("OK ");
    let (_, s) = wait_for(
        "the daemon to notice the exits",
        Duration::from_secs(10),
        || {
            let (b, s) = daemon.scrape();
            (sum(&s, "mpi_rank_up", &[]) == 0.0).then_some((b, s))
        },
    );
    let pairs = s
        .iter()
        .filter(|x| x.name == "mpi_calls_total" && x.value > 0.0)
        .count();
    assert!(
        pairs <= 5,
        "{pairs} (process, function) pairs in a 5-entry map"
    );
    let counted = sum(&s, "mpi_calls_total", &[]) as u64;
    let failed = sum(
        &s,
        "mpi_observer_map_update_failures_total",
        &[("map", "stats")],
    ) as u64;
    let made: u64 = (0..NP)
        .map(|r| expected(r, true).values().map(|v| v.0).sum::<u64>())
        .sum();
    assert!(failed > 0, "a 5-entry map must overflow");
    assert_eq!(counted + failed, made, "every call counted or failed");
    assert!(daemon.stop(signal::TERM).success());
    assert_no_probes_left();
}
