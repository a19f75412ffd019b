//! End-to-end test of the shim's `stats` layer on the MPI-5 standard ABI: a
//! three-rank job built with MPICH 5's `mpicc_abi` (`libmpi_abi.so`: pointer
//! handles, `MPI_COMM_WORLD` = 0x101, the 32-byte status) with the shim
//! preloaded and `MPI_TOOLS_ENTRY=stats`, its figures scraped from
//! `mpi-observer attach --no-bpf`.
//!
//! tests/programs/stats/abi.c exercises what the layer must read there:
//! statuses and `MPI_STATUS(ES)_IGNORE`, wildcard receives, derived
//! datatypes, nonblocking and persistent requests, a split communicator,
//! matched probes and `MPI_MESSAGE_NO_PROC`, `MPI_PROC_NULL`, a cancelled
//! receive and collectives with `MPI_IN_PLACE`. Every figure must be exact.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use e2e::{Daemon, Job, Mpi, Need, Sample, program, require, scratch, shim, sum, wait_for};

const NP: u32 = 3;

/// Compiles tests/programs/stats/abi.c with `mpicc_abi`.
fn build(dir: &Path) -> PathBuf {
    let exe = dir.join("abi");
    let cc = Mpi::Mpich5Abi.mpicc();
    let o = Command::new(&cc)
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(program("stats/abi.c"))
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        o.status.success(),
        "{cc} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    exe
}

/// `mpirun` for `prog` with the shim and the `stats` layer in every rank.
fn launcher(prog: &Path) -> Command {
    let mut c = Mpi::Mpich5Abi.launcher(NP);
    c.args(["-genv", "LD_PRELOAD", shim().to_str().unwrap()])
        .args(["-genv", "MPI_TOOLS_ENTRY", "stats"])
        .arg(prog);
    c
}

/// Scrapes until every rank has stats-layer figures.
fn scrape_with_figures(d: &mut Daemon) -> Vec<Sample> {
    wait_for(
        "every rank's segment figures",
        Duration::from_secs(30),
        || {
            let (_, s) = d.scrape();
            (0..NP)
                .all(|r| {
                    s.iter().any(|x| {
                        x.name == "mpi_requests_outstanding"
                            && x.label("rank") == Some(&r.to_string())
                    })
                })
                .then_some(s)
        },
    )
}

/// (rank, peer, direction) → (messages, bytes): what abi.c sends, by the
/// same parameters.
fn expected() -> BTreeMap<(u32, u32, &'static str), (u64, u64)> {
    let mut m = BTreeMap::new();
    let mut add = |from: u32, to: u32, msgs: u64, bytes: u64| {
        for key in [(from, to, "send"), (to, from, "recv")] {
            let e = m.entry(key).or_insert((0, 0));
            e.0 += msgs;
            e.1 += bytes;
        }
    };
    // 1. wildcard fan-in: 4 messages of 5·rank int32_t.
    for p in 1..NP {
        add(p, 0, 4, 4 * 5 * 4 * u64::from(p));
    }
    for r in 0..NP {
        let (right, left) = ((r + 1) % NP, (r + NP - 1) % NP);
        // 2. ring: 7 + 14 + 21 doubles.
        add(r, right, 3, 42 * 8);
        // 3. 100 + 200 bytes.
        add(r, right, 2, 300);
        // 4. 2 vectors of 48 bytes to the right, 3 of 32 to the left.
        add(r, right, 1, 96);
        add(r, left, 1, 96);
        // 5. reversed communicator: 5 uint16_t to the world left.
        add(r, left, 1, 10);
        // 8. persistent: 3 rounds of 16 ints.
        add(r, right, 3, 3 * 64);
    }
    // 6. matched probes: 6 chars from 1, 9 bytes from 2.
    add(1, 0, 1, 6);
    add(2, 0, 1, 9);
    m
}

/// One rank's non-zero `name` series as (peer, direction) → value.
fn peer_series(s: &[Sample], name: &str, rank: u32) -> BTreeMap<(u32, String), u64> {
    s.iter()
        .filter(|x| x.name == name && x.label("rank") == Some(&rank.to_string()) && x.value != 0.0)
        .map(|x| {
            (
                (
                    x.label("peer").unwrap().parse().unwrap(),
                    x.label("direction").unwrap().to_string(),
                ),
                x.value as u64,
            )
        })
        .collect()
}

fn assert_rank(s: &[Sample], rank: u32) {
    let (mut msgs, mut bytes) = (BTreeMap::new(), BTreeMap::new());
    for (&(r, p, d), &(m, b)) in &expected() {
        if r == rank {
            msgs.insert((p, d.to_string()), m);
            bytes.insert((p, d.to_string()), b);
        }
    }
    let got_msgs = peer_series(s, "mpi_peer_messages_total", rank);
    let got_bytes = peer_series(s, "mpi_peer_bytes_total", rank);
    eprintln!("rank {rank}: messages {got_msgs:?}");
    eprintln!("rank {rank}: bytes {got_bytes:?}");
    assert_eq!(
        got_msgs, msgs,
        "rank {rank}: messages per (peer, direction)"
    );
    assert_eq!(got_bytes, bytes, "rank {rank}: bytes per (peer, direction)");
    let r = rank.to_string();
    let one = |name: &str| sum(s, name, &[("rank", &r)]);
    // MPI_PROC_NULL (phase 7) and MPI_MESSAGE_NO_PROC (phase 6) count
    // nothing, not even as unattributed.
    for zero in [
        "mpi_unattributed_messages_total",
        "mpi_peer_overflow_messages_total",
        "mpi_request_table_full_total",
        "mpi_requests_outstanding",
        "mpi_requests_persistent",
    ] {
        assert_eq!(one(zero), 0.0, "rank {rank}: {zero}");
    }
    assert_eq!(
        one("mpi_requests_cancelled_total"),
        f64::from(u8::from(rank == 0)),
        "rank {rank}: cancelled"
    );
    // Every started request completed: the ring's 6, phase 3's 4, phase
    // 4's Irecv, phase 5's Isend, phase 7's 2, 6 persistent starts and the
    // Iallreduce; rank 0 also its Imrecv and the cancelled receive.
    let started = one("mpi_requests_started_total");
    assert_eq!(started, one("mpi_requests_completed_total"), "rank {rank}");
    assert_eq!(
        started,
        21.0 + 2.0 * f64::from(u8::from(rank == 0)),
        "rank {rank}: requests started"
    );
    // Collectives, by docs/stats.md's definition.
    let calls = |f: &str| sum(s, "mpi_layer_calls_total", &[("rank", &r), ("function", f)]);
    let cbytes = |f: &str, d: &str| {
        sum(
            s,
            "mpi_layer_bytes_total",
            &[("rank", &r), ("function", f), ("direction", d)],
        )
    };
    for f in ["MPI_Bcast", "MPI_Allreduce", "MPI_Gather", "MPI_Iallreduce"] {
        assert_eq!(calls(f), 1.0, "rank {rank} {f}");
    }
    // Bcast of 10 int32_t from rank 1.
    let root = rank == 1;
    assert_eq!(cbytes("MPI_Bcast", "send"), if root { 40.0 } else { 0.0 });
    assert_eq!(cbytes("MPI_Bcast", "recv"), if root { 0.0 } else { 40.0 });
    // Allreduce of 3 doubles, Iallreduce of 2 int64_t.
    assert_eq!(cbytes("MPI_Allreduce", "send"), 24.0);
    assert_eq!(cbytes("MPI_Allreduce", "recv"), 24.0);
    assert_eq!(cbytes("MPI_Iallreduce", "send"), 16.0);
    assert_eq!(cbytes("MPI_Iallreduce", "recv"), 16.0);
    // Gather of 2 ints to rank 0, which passes MPI_IN_PLACE: its own block
    // is its contribution.
    assert_eq!(cbytes("MPI_Gather", "send"), 8.0, "rank {rank}");
    assert_eq!(
        cbytes("MPI_Gather", "recv"),
        if rank == 0 { 24.0 } else { 0.0 },
        "rank {rank}"
    );
}

#[test]
fn stats_exact_per_peer_standard_abi() {
    if !require(&[Need::Mpi(Mpi::Mpich5Abi)]) {
        return;
    }
    let dir = scratch("stats-exact-abi");
    let exe = build(&dir);
    let job = Job::spawn(launcher(&exe), NP, dir.join("go"));
    let mut d = Daemon::start(&[vec!["--no-bpf".to_string()], job.pid_args()].concat());
    let s = scrape_with_figures(&mut d);
    for rank in 0..NP {
        assert_rank(&s, rank);
    }
    job.finish("DONE ");
}
