//! End-to-end tests of `mpi-observer attach --inject` (issue 10): the
//! daemon loads the shim into running ranks and hands them over from their
//! probes to the shim's timing, on Debian's Open MPI and MPICH.
//!
//! - **exact after injection**: ranks paused before their counted phase
//!   (tests/programs/mix.c with MIX_POLL, whose wait makes MPI_Iprobe calls
//!   to stop at) are injected; then calls, bytes and peers of the phase are
//!   exact, and the ranks carry no probes;
//! - **in full traffic**: injected while they run mix.c's phase, the job
//!   stays correct and its calls are counted exactly once across the
//!   handover;
//! - **threads**: 4 threads x MPI_THREAD_MULTIPLE stay exact;
//! - **Fortran** callers are routed through the shim;
//! - **kill -9** of the daemon at random moments of injections: the job
//!   finishes with every payload checked, and no thread is ever left
//!   stopped;
//! - **detach** puts every slot back: after the daemon's SIGTERM the
//!   shim's counts stop;
//! - **long compute**: a rank with no MPI call for 60 s is let go untraced,
//!   its injection armed, and injected at its calls after, exact; a daemon
//!   stopped meanwhile leaves cleanly;
//! - **the handover loop**: 50 handovers in fresh jobs in full traffic,
//!   every count exact;
//! - **bad input** gets one line.

use std::{
    collections::BTreeMap,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, compile, observer_bin, program, require, scratch, sum, wait_for,
};

const NP: u32 = 3;
const ITERS: u64 = 40;

fn needs(mpi: Mpi) -> bool {
    require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")])
}

/// Starts `src` on `np` ranks with `env` set in every rank.
fn start(mpi: Mpi, dir: &Path, src: &str, np: u32, args: &[String], env: &[(&str, &str)]) -> Job {
    let stem = Path::new(src).file_stem().unwrap().to_str().unwrap();
    let exe = dir.join(format!("{stem}-{}", mpi.name()));
    compile(mpi, &program(src), &exe, &[]);
    let mut c = mpi.launcher(np);
    for (k, v) in env {
        if mpi.is_open_mpi() {
            c.args(["-x", &format!("{k}={v}")]);
        } else {
            c.args(["-genv", k, v]);
        }
    }
    c.arg(&exe).args(args);
    Job::spawn(c, np, dir.join("go"))
}

/// mix.c on NP ranks, ITERS rounds, waiting for its go file in MPI_Iprobe
/// calls (MIX_POLL) where the daemon can stop it.
fn polling_mix(mpi: Mpi, test: &str) -> Job {
    let dir = scratch(&format!("inject-{test}-{}", mpi.name()));
    start(
        mpi,
        &dir,
        "mix.c",
        NP,
        &[ITERS.to_string()],
        &[("MIX_POLL", "1")],
    )
}

/// Every rank's calls of mix.c's phase, exact.
fn assert_mix_calls(s: &[Sample], mpi: Mpi) {
    for rank in 0..NP {
        for (f, (n, ..)) in e2e::mix_expected(rank, ITERS, true) {
            assert_eq!(calls(s, rank, f), n, "{mpi:?} rank {rank} {f} calls");
        }
    }
}

fn inject_args(job: &Job) -> Vec<String> {
    let mut a = job.pid_args();
    a.push("--inject".into());
    // A TCG guest under load (the kernels suite's VMs) took over the
    // default 10 s to dlopen the shim; these tests are about what an
    // injection counts, not about that limit.
    a.extend(["--inject-load-timeout".into(), "90".into()]);
    a
}

/// Waits until the daemon has handed `n` ranks over to the shim.
fn wait_injected(d: &mut Daemon, n: u32) -> Vec<Sample> {
    // The handover takes each rank's probes off: with classic uprobes
    // (hundreds of sites a rank, ~0.1 s each here, far more under TCG)
    // that is the daemon's detach time.
    let limit = Duration::from_secs(60).max(d.detach_limit());
    wait_for("the injections and handovers", limit, || {
        let (_, s) = d.scrape();
        (sum(&s, "mpi_observer_injected_processes", &[]) == f64::from(n)
            && sum(&s, "mpi_observer_probes", &[]) == 0.0)
            .then_some(s)
    })
}

/// Waits until every rank has exited and returns the final scrape.
fn final_scrape(d: &mut Daemon) -> Vec<Sample> {
    wait_for(
        "the daemon to notice the exits",
        Duration::from_secs(10),
        || {
            let (_, s) = d.scrape();
            (sum(&s, "mpi_observer_attached_processes", &[]) == 0.0
                && sum(&s, "mpi_observer_injected_processes", &[]) == 0.0)
                .then_some(s)
        },
    )
}

fn calls(s: &[Sample], rank: u32, function: &str) -> u64 {
    sum(
        s,
        "mpi_calls_total",
        &[("rank", &rank.to_string()), ("function", function)],
    ) as u64
}

/// mix.c's point-to-point traffic per (rank, peer, direction): (messages,
/// bytes), with 3 ranks: the Isend/Irecv and Sendrecv rings (64 B each way
/// to the right, from the left), rank 0's 100-byte Send to 1 and its
/// 24-byte Ssend of a derived type to 2.
fn mix_peers(iters: u64) -> BTreeMap<(u32, u32, &'static str), (u64, u64)> {
    let mut m = BTreeMap::new();
    let mut add = |r: u32, p: u32, d: &'static str, msgs: u64, bytes: u64| {
        let e = m.entry((r, p, d)).or_insert((0, 0));
        e.0 += msgs * iters;
        e.1 += bytes * iters;
    };
    for r in 0..NP {
        add(r, (r + 1) % NP, "send", 2, 128);
        add(r, (r + NP - 1) % NP, "recv", 2, 128);
    }
    add(0, 1, "send", 1, 100);
    add(1, 0, "recv", 1, 100);
    add(0, 2, "send", 1, 24);
    add(2, 0, "recv", 1, 24);
    m
}

fn check_peers(s: &[Sample], mpi: Mpi) {
    for ((r, p, d), (msgs, bytes)) in mix_peers(ITERS) {
        let l = [
            ("rank", r.to_string()),
            ("peer", p.to_string()),
            ("direction", d.to_string()),
        ];
        let l: Vec<(&str, &str)> = l.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            (
                sum(s, "mpi_peer_messages_total", &l) as u64,
                sum(s, "mpi_peer_bytes_total", &l) as u64
            ),
            (msgs, bytes),
            "{mpi:?} rank {r} peer {p} {d}: (messages, bytes)"
        );
    }
}

/// mix.c's calls of one round on `rank`, in the order it makes them.
fn mix_round(rank: u32) -> Vec<&'static str> {
    let mut v = vec!["MPI_Isend", "MPI_Irecv", "MPI_Waitall", "MPI_Sendrecv"];
    if rank == 0 {
        v.extend(["MPI_Send", "MPI_Ssend"]);
    } else {
        v.push("MPI_Recv");
    }
    v.extend([
        "MPI_Bcast",
        "MPI_Allreduce",
        "MPI_Reduce",
        "MPI_Barrier",
        "MPI_Gather",
        "MPI_Alltoall",
        "MPI_Allgather",
    ]);
    v
}

/// The counts of a rank the daemon attached to in the middle of mix.c's
/// phase of `iters` rounds: every function counts from one call on (the
/// attach makes every function start counting at one instant), each call
/// once across the handover, so along the round's order the counts are
/// `c` up to some call and `c + 1` after it. A call counted twice, or
/// missed, or a family that started counting late, breaks the pattern.
fn assert_one_cut(s: &[Sample], mpi: Mpi, rank: u32, iters: u64) {
    let low = assert_cut(s, mpi, rank, &mix_round(rank));
    assert!(low < iters, "{mpi:?} rank {rank}: {low} rounds of {iters}");
}

/// The counts of `round`'s functions, the calls of one round in order, on
/// a rank attached in the middle of a phase: `c` up to one call, `c + 1`
/// after it (see [`assert_one_cut`]); returns `c`, which is not 0.
fn assert_cut(s: &[Sample], mpi: Mpi, rank: u32, round: &[&str]) -> u64 {
    let counts: Vec<(&str, u64)> = round.iter().map(|&f| (f, calls(s, rank, f))).collect();
    let low = counts.iter().map(|c| c.1).min().unwrap();
    let cut = counts.windows(2).all(|w| w[0].1 <= w[1].1)
        && counts.iter().all(|c| c.1 == low || c.1 == low + 1);
    assert!(
        cut && low > 0,
        "{mpi:?} rank {rank}: counts along a round are not one cut: {counts:?}"
    );
    low
}

fn exact_after_injection(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    let job = polling_mix(mpi, "exact");
    let mut d = Daemon::start(&inject_args(&job));
    wait_injected(&mut d, NP);
    let injected: Vec<String> = d
        .log()
        .into_iter()
        .filter(|l| l.contains("injected the shim into pid"))
        .collect();
    assert_eq!(
        injected.len(),
        NP as usize,
        "one line per rank: {injected:?}"
    );
    job.go();
    job.finish("OK ");
    let s = final_scrape(&mut d);
    for rank in 0..NP {
        let r = rank.to_string();
        // The whole phase ran under the shim, which sizes the derived type
        // on both libraries.
        for (f, (n, send, recv, unknown)) in e2e::mix_expected(rank, ITERS, true) {
            assert_eq!(calls(&s, rank, f), n, "{mpi:?} rank {rank} {f} calls");
            let l = |dir: &'static str| [("rank", r.as_str()), ("function", f), ("direction", dir)];
            assert_eq!(
                (
                    sum(&s, "mpi_bytes_total", &l("send")) as u64,
                    sum(&s, "mpi_bytes_total", &l("recv")) as u64,
                    sum(&s, "mpi_bytes_unknown_calls_total", &l("send")) as u64,
                ),
                (send, recv, unknown),
                "{mpi:?} rank {rank} {f}: (send, recv, unknown send calls)"
            );
            if n > 0 {
                assert!(
                    sum(
                        &s,
                        "mpi_call_seconds_total",
                        &[("rank", r.as_str()), ("function", f)]
                    ) > 0.0
                );
            }
        }
    }
    check_peers(&s, mpi);
    assert_eq!(sum(&s, "mpi_observer_probes", &[]), 0.0);
    let _ = d.stop(e2e::signal::TERM);
    e2e::assert_no_probes_left();
}

fn in_full_traffic(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    // The phase runs until the test says stop (MIX_STOP), so the daemon
    // attaches and injects in its middle however fast the ranks are: a
    // fixed 4000 rounds once ended before the daemon had started. The
    // cap is never reached.
    let cap: u64 = 100_000_000;
    let dir = scratch(&format!("inject-traffic-{}", mpi.name()));
    let stop = dir.join("stop");
    let _ = std::fs::remove_file(&stop);
    let job = start(
        mpi,
        &dir,
        "mix.c",
        NP,
        &[cap.to_string()],
        &[("MIX_STOP", stop.to_str().unwrap())],
    );
    job.go();
    let mut d = Daemon::start(&inject_args(&job));
    wait_injected(&mut d, NP);
    std::fs::write(&stop, b"stop").unwrap();
    job.finish("OK ");
    let s = final_scrape(&mut d);
    // Probes before the handover plus the shim after it: every call of the
    // phase once. (The daemon attached after the phase began, so each
    // function counts the rounds from the attach on.)
    for rank in 0..NP {
        assert_one_cut(&s, mpi, rank, cap);
    }
    let _ = d.stop(e2e::signal::TERM);
    e2e::assert_no_probes_left();
}

fn threads(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    const ROUNDS: u64 = 200;
    let dir = scratch(&format!("inject-threads-{}", mpi.name()));
    let job = start(mpi, &dir, "inject/threads.c", 2, &[ROUNDS.to_string()], &[]);
    let mut d = Daemon::start(&inject_args(&job));
    wait_injected(&mut d, 2);
    job.go();
    job.finish("OK ");
    let s = final_scrape(&mut d);
    for rank in 0..2 {
        assert_eq!(
            calls(&s, rank, "MPI_Sendrecv"),
            4 * ROUNDS,
            "{mpi:?} rank {rank}: Sendrecv calls of 4 threads"
        );
        let r = rank.to_string();
        let peer = (1 - rank).to_string();
        for dir in ["send", "recv"] {
            assert_eq!(
                sum(
                    &s,
                    "mpi_peer_bytes_total",
                    &[("rank", &r), ("peer", &peer), ("direction", dir)]
                ) as u64,
                4 * ROUNDS * 32,
                "{mpi:?} rank {rank} {dir} bytes"
            );
        }
    }
    let _ = d.stop(e2e::signal::TERM);
    e2e::assert_no_probes_left();
}

fn fortran(mpi: Mpi) {
    // `Need::Command` holds a `&'static str`: leaked, once per test.
    let mpifort = mpi.mpifort().leak();
    if !needs(mpi) || !require(&[Need::Command(mpifort)]) {
        return;
    }
    let dir = scratch(&format!("inject-fortran-{}", mpi.name()));
    // FORTRAN_POLL: the wait makes MPI_IPROBE calls to stop at, so the
    // whole phase runs under the shim.
    let job = start(mpi, &dir, "fortran.f90", 2, &[], &[("FORTRAN_POLL", "1")]);
    let mut d = Daemon::start(&inject_args(&job));
    wait_injected(&mut d, 2);
    job.go();
    job.finish("OK ");
    let s = final_scrape(&mut d);
    assert_eq!(calls(&s, 0, "MPI_Send"), 10, "{mpi:?}: rank 0's MPI_SEND");
    assert_eq!(calls(&s, 1, "MPI_Recv"), 10, "{mpi:?}: rank 1's MPI_RECV");
    for rank in 0..2 {
        assert_eq!(calls(&s, rank, "MPI_Barrier"), 5, "{mpi:?} rank {rank}");
    }
    let _ = d.stop(e2e::signal::TERM);
    e2e::assert_no_probes_left();
}

/// Threads of `pids` in a stopped state (T or t).
fn stopped(pids: &[u32]) -> Vec<String> {
    let mut out = Vec::new();
    for pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next());
            if matches!(state, Some("T") | Some("t")) {
                out.push(format!("{pid}/{}", t.file_name().to_string_lossy()));
            }
        }
    }
    out
}

fn kill9(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    let dir = scratch(&format!("inject-kill9-{}", mpi.name()));
    // Full traffic, every payload checked, until the stop file exists.
    let job = start(mpi, &dir, "inject/kill9.c", NP, &[], &[]);
    let pids: Vec<u32> = job.pids();
    job.go();
    // Kill the daemon at moments spread over the injection: before the
    // stop, while the stub runs, after the handover.
    let mut injected = 0;
    for i in 0..12u64 {
        let d = Daemon::start(&inject_args(&job));
        std::thread::sleep(Duration::from_millis(i * 7 % 60));
        injected += d
            .log()
            .iter()
            .filter(|l| l.contains("injected the shim"))
            .count();
        let _ = d.stop(e2e::signal::KILL);
        // The kernel releases traced threads with their tracer: none may
        // stay stopped.
        let t = Instant::now();
        loop {
            let s = stopped(&pids);
            if s.is_empty() {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "{mpi:?}: threads left stopped after kill -9 #{i}: {s:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    eprintln!("{mpi:?}: {injected} injections finished before their daemon was killed");
    // Let the ranks end their phase; each checks every payload it got.
    std::fs::write(dir.join("go.stop"), b"stop").unwrap();
    job.finish("OK ");
    e2e::assert_no_probes_left();
}

/// A rank found before its MPI_Init (as `--all` finds ranks that start) is
/// not stopped at MPI_Init, where the shim would refuse, but at its first
/// call after it; its barriers are then exact.
fn before_init(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    let dir = scratch(&format!("inject-before-init-{}", mpi.name()));
    let job = start(mpi, &dir, "inject/late_init.c", 2, &[], &[]);
    let mut d = Daemon::start(&inject_args(&job));
    job.go();
    wait_injected(&mut d, 2);
    job.finish("OK ");
    let s = final_scrape(&mut d);
    for rank in 0..2 {
        assert_eq!(calls(&s, rank, "MPI_Barrier"), 10, "{mpi:?} rank {rank}");
        assert_eq!(calls(&s, rank, "MPI_Init"), 1, "{mpi:?} rank {rank}");
    }
    assert!(
        !d.log().iter().any(|l| l.contains("not initialised")),
        "{:?}",
        d.log()
    );
    let _ = d.stop(e2e::signal::TERM);
    e2e::assert_no_probes_left();
}

/// A daemon killed after injecting leaves live shims behind; the next one
/// (here without --inject) adopts them: no probes, and their timing, which
/// counted every call since the injection, stands for the ranks, exact.
fn restarted_daemon_adopts(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    let job = polling_mix(mpi, "adopt");
    let mut first = Daemon::start(&inject_args(&job));
    wait_injected(&mut first, NP);
    let _ = first.stop(e2e::signal::KILL);
    let mut d = Daemon::start(&job.pid_args());
    wait_injected(&mut d, NP);
    let adopted = d
        .log()
        .iter()
        .filter(|l| l.contains("runs a shim injected before this daemon attached"))
        .count();
    assert_eq!(adopted, NP as usize, "{:?}", d.log());
    job.go();
    job.finish("OK ");
    let s = final_scrape(&mut d);
    assert_mix_calls(&s, mpi);
    check_peers(&s, mpi);
    let _ = d.stop(e2e::signal::TERM);
    e2e::assert_no_probes_left();
}

fn detach_puts_slots_back(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    let job = polling_mix(mpi, "detach");
    let mut d = Daemon::start(&inject_args(&job));
    wait_injected(&mut d, NP);
    // The daemon asks each shim to detach and waits for it to say so: the
    // ranks' polls reach the shim every 2 ms.
    let (status, log) = d.stop_and_log(e2e::signal::TERM);
    assert!(status.success(), "{mpi:?}: the daemon's exit: {status}");
    let detached = log
        .iter()
        .filter(|l| l.ends_with("the shim is detached"))
        .count();
    assert_eq!(detached, NP as usize, "{mpi:?}: {log:?}");
    // A daemon without probes reads the segments: after the detach the
    // shim sees no call, so the phase's calls never reach them.
    let mut reader = Daemon::start(&[job.pid_args(), vec!["--no-bpf".into()]].concat());
    job.go();
    job.finish("OK ");
    let s = final_scrape(&mut reader);
    for rank in 0..NP {
        assert!(
            calls(&s, rank, "MPI_Iprobe") > 0,
            "{mpi:?} rank {rank}: the waits' calls before the detach are counted"
        );
        assert_eq!(
            calls(&s, rank, "MPI_Allreduce"),
            0,
            "{mpi:?} rank {rank}: no call reaches the shim after the detach"
        );
    }
    e2e::assert_no_probes_left();
}

fn bad_input() {
    if !require(&[Need::Root, Need::Mpi(Mpi::OpenMpi), Need::Command("gcc")]) {
        return;
    }
    let one_line = |args: &[&str], want: &str| {
        let o = Command::new(observer_bin())
            .arg("attach")
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    };
    let me = std::process::id().to_string();
    // Checked before any pid: the list is the daemon's own input.
    one_line(
        &["--pid", &me, "--inject", "--inject-tools", "/tmp/tool.so"],
        "lacks `stats`",
    );
    // A static program: nothing to probe, no loader to inject with.
    let dir = scratch("inject-bad-input");
    let src = dir.join("static.c");
    std::fs::write(
        &src,
        "#include <unistd.h>\nint main(void) { sleep(60); return 0; }\n",
    )
    .unwrap();
    let exe = dir.join("static");
    let o = Command::new("gcc")
        .args(["-static", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut st = Command::new(&exe).spawn().unwrap();
    one_line(
        &["--pid", &st.id().to_string(), "--inject"],
        "statically linked executable",
    );
    let _ = st.kill();
    let _ = st.wait();
}

/// A rank that cannot be injected (here another tracer holds it, as a
/// debugger would) gets one line, stays exactly as it was, and its probes
/// keep counting it exactly; the other ranks are injected.
fn refused_rank_stays_probed(mpi: Mpi) {
    if !needs(mpi) || !require(&[Need::Command("strace")]) {
        return;
    }
    let job = polling_mix(mpi, "refused");
    let traced = job.pid(1);
    let mut strace = Command::new("strace")
        .args(["-o", "/dev/null", "-p", &traced.to_string()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for("strace to hold the rank", Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{traced}/status"))
            .ok()?
            .lines()
            .any(|l| l.starts_with("TracerPid:") && l.trim_end() != "TracerPid:\t0")
            .then_some(())
    });
    let mut d = Daemon::start(&inject_args(&job));
    let line = wait_for("the refusal", Duration::from_secs(30), || {
        d.log()
            .into_iter()
            .find(|l| l.contains(&format!("pid {traced} is already traced")))
    });
    assert!(
        line.contains("(strace)") && line.ends_with("it stays observed by probes"),
        "{line}"
    );
    wait_for("the other injections", Duration::from_secs(60), || {
        let (_, s) = d.scrape();
        (sum(&s, "mpi_observer_injected_processes", &[]) == f64::from(NP - 1)
            && sum(&s, "mpi_observer_probes", &[]) > 0.0)
            .then_some(())
    });
    job.go();
    job.finish("OK ");
    let s = final_scrape(&mut d);
    assert_mix_calls(&s, mpi);
    let _ = strace.kill();
    let _ = strace.wait();
    let _ = d.stop(e2e::signal::TERM);
    e2e::assert_no_probes_left();
}

/// The handover, again and again, each time in a fresh job of mix.c on NP
/// ranks in full traffic, every count exact:
/// - even runs: the daemon attaches and arms the injection while the ranks
///   wait without MPI calls, then the phase starts: each rank is stopped at
///   one of its first calls and handed over while the others exchange
///   messages with it; every call of the phase counts exactly once, by the
///   probes before the handover or the shim after it;
/// - odd runs: the daemon attaches in the middle of the traffic of
///   inject/kill9.c (rings and an Allreduce, every payload checked, until a
///   stop file exists), and the ranks are stopped after the handover: the
///   counts along a round cut cleanly at one call ([`assert_cut`]).
fn handover_loop(mpi: Mpi, runs: u32) {
    if !needs(mpi) {
        return;
    }
    let dir = scratch(&format!("inject-loop-{}", mpi.name()));
    let mix = dir.join(format!("mix-{}", mpi.name()));
    compile(mpi, &program("mix.c"), &mix, &[]);
    let rounds = dir.join(format!("kill9-{}", mpi.name()));
    compile(mpi, &program("inject/kill9.c"), &rounds, &[]);
    let started = Instant::now();
    let iters: u64 = 1500;
    for run in 0..runs {
        let armed_before = run % 2 == 0;
        let mut c = mpi.launcher(NP);
        if armed_before {
            c.arg(&mix).arg(iters.to_string());
        } else {
            c.arg(&rounds);
        }
        let go = dir.join("go");
        let _ = std::fs::remove_file(dir.join("go.stop"));
        let job = Job::spawn(c, NP, go);
        if !armed_before {
            job.go();
        }
        let mut d = Daemon::start(&inject_args(&job));
        // The probes are attached before the daemon serves.
        job.go();
        wait_injected(&mut d, NP);
        std::fs::write(dir.join("go.stop"), b"stop").unwrap();
        job.finish("OK ");
        let s = final_scrape(&mut d);
        for rank in 0..NP {
            if armed_before {
                for (f, (n, ..)) in e2e::mix_expected(rank, iters, true) {
                    assert_eq!(
                        calls(&s, rank, f),
                        n,
                        "{mpi:?} run {run} rank {rank} {f} calls (each once across the handover)"
                    );
                }
            } else {
                assert_cut(
                    &s,
                    mpi,
                    rank,
                    &[
                        "MPI_Irecv",
                        "MPI_Isend",
                        "MPI_Waitall",
                        "MPI_Sendrecv",
                        "MPI_Allreduce",
                    ],
                );
            }
        }
        let (status, _) = d.stop_and_log(e2e::signal::TERM);
        assert!(
            status.success(),
            "{mpi:?} run {run}: the daemon's exit: {status}"
        );
    }
    eprintln!(
        "{mpi:?}: {runs} handovers of {NP} ranks in full traffic, every count exact, in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    e2e::assert_no_probes_left();
}

/// Tracer of each thread of `pid` (`TracerPid`), nonzero ones only.
fn tracers(pid: u32) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        if let Some(v) = status.lines().find_map(|l| l.strip_prefix("TracerPid:"))
            && v.trim() != "0"
        {
            out.push(format!(
                "{pid}/{} traced by {}",
                t.file_name().to_string_lossy(),
                v.trim()
            ));
        }
    }
    out
}

/// A rank in a long compute phase (60 s without an MPI call) when the
/// daemon comes, with --inject-timeout 2: after 2 s the daemon says the
/// injection stays armed and lets the rank go (no tracer holds it while it
/// computes), then injects it at its calls after the phase. Probes before
/// the handover plus the shim after it count exactly the program's calls.
fn long_compute(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    const SECS: u64 = 60;
    const CALLS: u64 = 200;
    let dir = scratch(&format!("inject-long-{}", mpi.name()));
    let job = start(
        mpi,
        &dir,
        "inject/long_compute.c",
        2,
        &[SECS.to_string(), CALLS.to_string()],
        &[],
    );
    let mut args = inject_args(&job);
    args.extend(["--inject-timeout".into(), "2".into()]);
    let mut d = Daemon::start(&args);
    job.go();
    let computing = Instant::now();
    for pid in job.pids() {
        wait_for("the armed line", Duration::from_secs(20), || {
            d.log().into_iter().find(|l| {
                l.contains(&format!("pid {pid} made no MPI call within 2 s"))
                    && l.contains("stays armed")
            })
        });
    }
    // Untraced while it computes: its signals and exit are its own, and a
    // debugger may attach.
    wait_for("the tracers to let go", Duration::from_secs(5), || {
        job.pids()
            .iter()
            .all(|&p| tracers(p).is_empty())
            .then_some(())
    });
    assert!(stopped(&job.pids()).is_empty());
    let (_, s) = d.scrape();
    assert_eq!(sum(&s, "mpi_observer_injected_processes", &[]), 0.0);
    assert!(sum(&s, "mpi_observer_probes", &[]) > 0.0);
    assert!(
        computing.elapsed() < Duration::from_secs(SECS - 10),
        "the armed state must be seen during the compute phase"
    );
    wait_for(
        "the injections after the compute phase",
        Duration::from_secs(SECS + 60),
        || {
            let (_, s) = d.scrape();
            (sum(&s, "mpi_observer_injected_processes", &[]) == 2.0
                && sum(&s, "mpi_observer_probes", &[]) == 0.0)
                .then_some(())
        },
    );
    assert!(
        computing.elapsed() >= Duration::from_secs(SECS),
        "injected only once the rank calls again"
    );
    job.finish("OK ");
    let s = final_scrape(&mut d);
    for rank in 0..2 {
        assert_eq!(
            calls(&s, rank, "MPI_Barrier"),
            CALLS,
            "{mpi:?} rank {rank}: probes before the handover plus the shim after it"
        );
    }
    let log = d.log();
    assert_eq!(
        log.iter()
            .filter(|l| l.contains("injected the shim into pid"))
            .count(),
        2,
        "{log:?}"
    );
    let _ = d.stop(e2e::signal::TERM);
    e2e::assert_no_probes_left();
}

/// A daemon stopped while ranks wait armed and untraced for their next MPI
/// call clears their triggers and leaves at once; the ranks, untouched,
/// finish their calls correct, with no tracer and no probe left.
fn shutdown_while_armed(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    let dir = scratch(&format!("inject-shutdown-armed-{}", mpi.name()));
    let job = start(
        mpi,
        &dir,
        "inject/long_compute.c",
        2,
        &["6".to_string(), "50".to_string()],
        &[],
    );
    let mut args = inject_args(&job);
    args.extend(["--inject-timeout".into(), "1".into()]);
    let d = Daemon::start(&args);
    job.go();
    for pid in job.pids() {
        wait_for("the armed line", Duration::from_secs(10), || {
            d.log()
                .into_iter()
                .find(|l| l.contains(&format!("pid {pid} made no MPI call")))
        });
    }
    let t = Instant::now();
    let (status, log) = d.stop_and_log(e2e::signal::TERM);
    assert!(status.success(), "{mpi:?}: the daemon's exit: {status}");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "{mpi:?}: the daemon took {:?} to leave",
        t.elapsed()
    );
    assert!(
        !log.iter().any(|l| l.contains("injected the shim")),
        "{log:?}"
    );
    assert!(job.pids().iter().all(|&p| tracers(p).is_empty()));
    e2e::assert_no_probes_left();
    job.finish("OK ");
}

e2e::per_mpi!(inject_shutdown_while_armed => shutdown_while_armed: openmpi);
e2e::per_mpi!(inject_long_compute => long_compute: openmpi);
e2e::per_mpi!(inject_handover_loop => handover_loop(50): openmpi);
e2e::per_mpi!(inject_refused_rank_stays_probed => refused_rank_stays_probed: openmpi);
e2e::per_mpi!(inject_restarted_daemon_adopts => restarted_daemon_adopts: openmpi);
e2e::per_mpi!(inject_before_init => before_init: openmpi, mpich);
e2e::per_mpi!(inject_exact_after_injection => exact_after_injection: openmpi, mpich);
e2e::per_mpi!(inject_in_full_traffic => in_full_traffic: openmpi, mpich);
e2e::per_mpi!(inject_threads => threads: openmpi, mpich);
e2e::per_mpi!(inject_fortran => fortran: openmpi, mpich);
e2e::per_mpi!(inject_kill9 => kill9: openmpi, mpich);
e2e::per_mpi!(inject_detach => detach_puts_slots_back: openmpi, mpich);

#[test]
fn inject_bad_input() {
    bad_input();
}
