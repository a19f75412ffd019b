//! End-to-end test of `mpi-observer attach` on the MPI-5 standard ABI:
//! MPICH 5.0.2's `libmpi_abi.so.1` (a program built with `mpicc_abi`), real
//! eBPF probes, real scrapes. Byte figures come from the standard ABI's
//! fixed predefined handles: sizes the handle encodes (`MPI_INT32_T`,
//! `MPI_BYTE`, `MPI_UINT64_T`), sizes x86-64 fixes (`MPI_INT`, `MPI_DOUBLE`,
//! `MPI_DOUBLE_INT`) and `MPI_IN_PLACE` (1 here, not MPICH's -1); a derived
//! type and `MPI_INTEGER` (its size follows the Fortran compiler's flags)
//! are counted as unknown.

use std::{collections::BTreeMap, time::Duration};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, assert_no_probes_left, compile, program, require, scratch,
    signal, sum, wait_for,
};

/// Iterations of the counted phase of tests/programs/abi_traffic.c.
const ITERS: u64 = 40;
/// abi_traffic.c runs on exactly 3 ranks.
const NP: u32 = 3;

/// Per function: (calls, send bytes, recv bytes, unknown send calls,
/// unknown recv calls) for one rank, as abi_traffic.c documents them.
type Figures = (u64, u64, u64, u64, u64);

fn expected(rank: u32) -> BTreeMap<&'static str, Figures> {
    let i = ITERS;
    let mut e = BTreeMap::new();
    // 64 MPI_BYTE + 4 MPI_UINT64_T, recv on every rank, root included.
    e.insert("MPI_Bcast", (2 * i, 0, 96 * i, 0, 0));
    // 4 MPI_DOUBLE both ways; MPI_IN_PLACE + 3 MPI_INT; 2 MPI_DOUBLE_INT
    // (12 bytes each: MPI_Type_size counts the members, not the padding).
    e.insert(
        "MPI_Allreduce",
        (3 * i, (32 + 24) * i, (32 + 12 + 24) * i, 0, 0),
    );
    e.insert("MPI_Finalize", (1, 0, 0, 0, 0));
    match rank {
        0 => {
            // 25 MPI_INT32_T to rank 1, and 2 triples (derived).
            e.insert("MPI_Send", (2 * i, 100 * i, 0, i, 0));
            // 10 MPI_INT from rank 2.
            e.insert("MPI_Recv", (i, 0, 40 * i, 0, 0));
        }
        1 => {
            e.insert("MPI_Recv", (2 * i, 0, 100 * i, 0, i));
            // 8 MPI_DOUBLE to rank 2, and 4 MPI_INTEGER.
            e.insert("MPI_Send", (2 * i, 64 * i, 0, i, 0));
        }
        2 => {
            e.insert("MPI_Recv", (2 * i, 0, 64 * i, 0, i));
            e.insert("MPI_Send", (i, 40 * i, 0, 0, 0));
        }
        _ => unreachable!("3 ranks"),
    }
    e
}

fn check_exact(samples: &[Sample], jobid: &str) {
    for rank in 0..NP {
        let r = rank.to_string();
        let want = expected(rank);
        let seen: BTreeMap<String, u64> = samples
            .iter()
            .filter(|s| {
                s.name == "mpi_calls_total"
                    && s.label("rank") == Some(&r)
                    && s.label("jobid") == Some(jobid)
                    && s.value > 0.0
            })
            .map(|s| (s.label("function").unwrap().to_string(), s.value as u64))
            .collect();
        let want_calls: BTreeMap<String, u64> =
            want.iter().map(|(f, v)| (f.to_string(), v.0)).collect();
        assert_eq!(seen, want_calls, "rank {rank}: per-function call counts");
        for (f, &(_, send, recv, unknown_send, unknown_recv)) in &want {
            let got = |metric: &str, d: &str| {
                let l = [
                    ("jobid", jobid),
                    ("rank", r.as_str()),
                    ("function", *f),
                    ("direction", d),
                ];
                sum(samples, metric, &l) as u64
            };
            assert_eq!(
                (
                    got("mpi_bytes_total", "send"),
                    got("mpi_bytes_total", "recv"),
                    got("mpi_bytes_unknown_calls_total", "send"),
                    got("mpi_bytes_unknown_calls_total", "recv"),
                ),
                (send, recv, unknown_send, unknown_recv),
                "rank {rank} {f}: (send bytes, recv bytes, unknown send calls, unknown recv calls)"
            );
        }
    }
}

#[test]
fn standard_abi_calls_and_bytes_are_exact() {
    let mpi = Mpi::Mpich5Abi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    let dir = scratch(&format!("abi-traffic-{}", mpi.name()));
    let exe = dir.join("abi_traffic");
    compile(mpi, &program("abi_traffic.c"), &exe, &[]);
    let mut launcher = mpi.launcher(NP);
    launcher.arg(&exe).arg(ITERS.to_string());
    let job = Job::spawn(launcher, NP, dir.join(format!("go-{}", std::process::id())));
    // The ranks really run on the standard ABI library.
    for pid in job.pids() {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        assert!(
            maps.contains("/libmpi_abi.so.1"),
            "rank {pid} does not map libmpi_abi.so.1:\n{maps}"
        );
    }

    let mut daemon = Daemon::start(&job.pid_args());
    let (_, s) = daemon.scrape();
    assert_eq!(sum(&s, "mpi_observer_attached_processes", &[]) as u32, NP);
    assert!(sum(&s, "mpi_observer_probes", &[]) > 0.0);
    let info: Vec<&Sample> = s.iter().filter(|x| x.name == "mpi_rank_info").collect();
    assert_eq!(info.len(), NP as usize, "one mpi_rank_info per rank");
    let jobid = info[0].label("jobid").unwrap().to_string();
    for (rank, pid) in &job.ranks {
        let pid = pid.to_string();
        let i = info
            .iter()
            .find(|x| x.label("pid") == Some(&pid))
            .unwrap_or_else(|| panic!("mpi_rank_info for pid {pid}"));
        let labels = ["jobid", "rank", "size", "library", "version"].map(|k| i.label(k));
        let rank = rank.to_string();
        assert_eq!(
            labels,
            [
                Some(jobid.as_str()),
                Some(rank.as_str()),
                Some("3"),
                Some("mpich-abi"),
                Some("5.0.2"),
            ],
            "mpi_rank_info of pid {pid}"
        );
    }

    job.go();
    job.finish("OK ");
    // The ranks exited: their final figures are retained and exact.
    let s = wait_for(
        "the daemon to notice the exits",
        Duration::from_secs(10),
        || {
            let (_, s) = daemon.scrape();
            (sum(&s, "mpi_rank_up", &[]) == 0.0).then_some(s)
        },
    );
    check_exact(&s, &jobid);
    assert_eq!(sum(&s, "mpi_observer_attached_processes", &[]), 0.0);
    assert_eq!(sum(&s, "mpi_observer_probes", &[]), 0.0);
    let status = daemon.stop(signal::TERM);
    assert!(status.success(), "daemon exit on SIGTERM: {status}");
    assert_no_probes_left();
}
