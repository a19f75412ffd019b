//! End-to-end tests of the shim's call timing (issue 10): with the `stats`
//! layer preloaded, `mpi_calls_total`, `mpi_call_seconds_total` and
//! `mpi_call_duration_seconds` of a rank come from its segment, and the
//! rank carries no probes.
//!
//! - a rank whose segment exists when the daemon attaches gets no probes,
//!   and its counts of tests/programs/mix.c are exact;
//! - a rank the daemon attached to before `MPI_Init` (its segment does not
//!   exist yet) loses its probes when the segment appears mid-run, and no
//!   call is lost or counted twice (tests/programs/timing/late_init.c);
//!
//! on Debian's Open MPI and MPICH.

use std::{collections::BTreeMap, path::Path, process::Command, time::Duration};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, compile, program, require, scratch, shim_launcher, sum,
    wait_for,
};

const NP: u32 = 3;
/// Rounds of mix.c's counted phase.
const ITERS: u64 = 40;
/// Rounds of late_init.c.
const ROUNDS: u64 = 100;

/// A launcher for `exe args` with the shim and `stats` in every rank.
fn launcher(mpi: Mpi, exe: &Path, args: &[String]) -> Command {
    let mut c = shim_launcher(mpi, NP, "stats");
    c.arg(exe).args(args);
    c
}

fn start(mpi: Mpi, dir: &Path, src: &str, args: &[String]) -> Job {
    let stem = Path::new(src).file_stem().unwrap().to_str().unwrap();
    let exe = dir.join(format!("{stem}-{}", mpi.name()));
    compile(mpi, &program(src), &exe, &[]);
    Job::spawn(launcher(mpi, &exe, args), NP, dir.join("go"))
}

/// Per-rank `mpi_calls_total` by function, nonzero ones only.
fn calls(samples: &[Sample], rank: u32) -> BTreeMap<String, u64> {
    let r = rank.to_string();
    samples
        .iter()
        .filter(|s| s.name == "mpi_calls_total" && s.label("rank") == Some(&r))
        .filter(|s| s.value > 0.0)
        .map(|s| (s.label("function").unwrap().to_string(), s.value as u64))
        .collect()
}

/// Time and the histogram come with the counts.
fn check_time(samples: &[Sample], rank: u32, function: &str, n: u64) {
    let r = rank.to_string();
    let secs = sum(
        samples,
        "mpi_call_seconds_total",
        &[("rank", r.as_str()), ("function", function)],
    );
    assert!(secs > 0.0, "rank {rank} {function}: time must be recorded");
    let count = sum(
        samples,
        "mpi_call_duration_seconds_count",
        &[("function", function)],
    );
    assert_eq!(
        count as u64,
        n * u64::from(NP),
        "histogram count of {function}"
    );
}

/// The daemon's arguments: the job's pids.
fn args(job: &Job) -> Vec<String> {
    job.pid_args()
}

fn needs(mpi: Mpi) -> bool {
    require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")])
}

fn segment_from_the_start(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    let dir = scratch(&format!("timing-mix-{}", mpi.name()));
    let job = start(mpi, &dir, "mix.c", &[ITERS.to_string()]);
    let mut daemon = Daemon::start(&args(&job));
    let (_, s) = daemon.scrape();
    assert_eq!(
        sum(&s, "mpi_observer_probes", &[]),
        0.0,
        "no probes for timed ranks"
    );
    job.go();
    job.finish("OK ");
    let s = daemon.final_scrape();
    assert_eq!(sum(&s, "mpi_observer_probes", &[]), 0.0);
    for rank in 0..NP {
        let seen = calls(&s, rank);
        let i = ITERS;
        let mut want: BTreeMap<String, u64> = [
            ("MPI_Init", 1),
            ("MPI_Comm_rank", 1),
            ("MPI_Comm_size", 1),
            ("MPI_Type_contiguous", 1),
            ("MPI_Type_commit", 1),
            ("MPI_Type_free", 1),
            ("MPI_Isend", i),
            ("MPI_Irecv", i),
            ("MPI_Waitall", i),
            ("MPI_Sendrecv", i),
            ("MPI_Bcast", i),
            ("MPI_Allreduce", i),
            ("MPI_Reduce", i),
            ("MPI_Barrier", i),
            ("MPI_Gather", i),
            ("MPI_Alltoall", i),
            ("MPI_Allgather", i),
            ("MPI_Finalize", 1),
        ]
        .into_iter()
        .map(|(f, n)| (f.to_string(), n))
        .collect();
        match rank {
            0 => {
                want.insert("MPI_Send".into(), i);
                want.insert("MPI_Ssend".into(), i);
            }
            _ => {
                want.insert("MPI_Recv".into(), i);
            }
        }
        // Anything else mix.c calls outside its counted phase is listed
        // above; a function not there is an error in the timing.
        assert_eq!(seen, want, "{mpi:?} rank {rank}: per-function call counts");
    }
    check_time(&s, 0, "MPI_Allreduce", ITERS);
    check_bytes(&s, mpi);
    let _ = daemon.stop(e2e::signal::TERM);
    e2e::assert_no_probes_left();
}

/// `mpi_bytes_total` and `mpi_bytes_unknown_calls_total` of a timed rank
/// follow the probes' definition (tests/tests/e2e/observer.rs checks the same
/// figures from the probes); the shim sizes derived types on both
/// libraries, where MPICH's probes cannot.
fn check_bytes(samples: &[Sample], mpi: Mpi) {
    for rank in 0..NP {
        let r = rank.to_string();
        for (f, (_, send, recv, unknown)) in e2e::mix_expected(rank, ITERS, true) {
            let l = |d: &'static str| [("rank", r.as_str()), ("function", f), ("direction", d)];
            let got = (
                sum(samples, "mpi_bytes_total", &l("send")) as u64,
                sum(samples, "mpi_bytes_total", &l("recv")) as u64,
                sum(samples, "mpi_bytes_unknown_calls_total", &l("send")) as u64,
            );
            assert_eq!(
                got,
                (send, recv, unknown),
                "{mpi:?} rank {rank} {f}: (send, recv, unknown send calls)"
            );
        }
    }
}

fn handover_mid_run(mpi: Mpi) {
    if !needs(mpi) {
        return;
    }
    let dir = scratch(&format!("timing-late-{}", mpi.name()));
    let job = start(mpi, &dir, "timing/late_init.c", &[ROUNDS.to_string()]);
    let mut daemon = Daemon::start(&args(&job));
    let (_, s) = daemon.scrape();
    assert!(
        sum(&s, "mpi_observer_probes", &[]) > 0.0,
        "before MPI_Init the ranks carry probes"
    );
    job.go();
    // The segments appear at MPI_Init; the probes go at the next read.
    wait_for("the handover", Duration::from_secs(30), || {
        let (_, s) = daemon.scrape();
        (sum(&s, "mpi_observer_probes", &[]) == 0.0).then_some(())
    });
    job.finish("OK ");
    let s = daemon.final_scrape();
    for rank in 0..NP {
        let seen = calls(&s, rank);
        let want: BTreeMap<String, u64> = [
            ("MPI_Init", 1),
            ("MPI_Comm_rank", 1),
            ("MPI_Allreduce", ROUNDS),
            ("MPI_Barrier", ROUNDS),
            ("MPI_Finalize", 1),
        ]
        .into_iter()
        .map(|(f, n)| (f.to_string(), n))
        .collect();
        assert_eq!(seen, want, "{mpi:?} rank {rank}: per-function call counts");
    }
    check_time(&s, 1, "MPI_Barrier", ROUNDS);
    let _ = daemon.stop(e2e::signal::TERM);
    e2e::assert_no_probes_left();
}

e2e::per_mpi!(segment_from_the_start => segment_from_the_start: openmpi, mpich);
e2e::per_mpi!(handover_mid_run => handover_mid_run: openmpi, mpich);
