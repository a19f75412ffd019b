//! End-to-end tests of the shim's `stats` layer: real four-rank jobs on Open
//! MPI and MPICH with the shim preloaded and `MPI_TOOLS_ENTRY=stats`, their
//! figures scraped from a real `mpi-observer attach`.
//!
//! - exact per-peer messages and bytes for tests/programs/stats/traffic.c
//!   (wildcards with and without a status, Waitany, persistent requests,
//!   a split communicator with a derived datatype, matched probes), with
//!   `--no-bpf` on one Debian library and the eBPF mode on the other, and
//!   in both modes on the PyPI stacks (Open MPI 5, MPICH 5 native, MPICH 5
//!   through the MPI-5 standard ABI);
//! - live request health while a rank holds 5 receives (hold.c);
//! - a segment corrupted under a live job, and `/dev/shm` unavailable.

use std::{
    collections::BTreeMap,
    io::{Seek as _, SeekFrom, Write as _},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, compile, program, require, run_with_timeout, scratch,
    shim_launcher, sum, wait_for,
};

const NP: u32 = 4;

/// A launcher command for `prog` with the shim and the `stats` layer in
/// every rank (not in the launcher).
fn launcher(mpi: Mpi, prog: &Path) -> Command {
    let mut c = shim_launcher(mpi, NP, "stats");
    c.arg(prog);
    c
}

fn build(mpi: Mpi, dir: &Path, name: &str) -> PathBuf {
    let exe = dir.join(format!("{name}-{}", mpi.name()));
    compile(
        mpi,
        &program(&format!("stats/{name}.c")),
        &exe,
        &["-pthread"],
    );
    exe
}

/// Starts tests/programs/stats/`name`.c on NP ranks with the stats layer,
/// held at its go file.
fn start(mpi: Mpi, dir: &Path, name: &str) -> Job {
    let exe = build(mpi, dir, name);
    Job::spawn(launcher(mpi, &exe), NP, dir.join("go"))
}

/// Scrapes until every rank in `ranks` has stats-layer figures.
fn scrape_with_figures(d: &mut Daemon, ranks: &[u32]) -> Vec<Sample> {
    wait_for(
        "every rank's segment figures",
        Duration::from_secs(30),
        || {
            let (_, s) = d.scrape();
            ranks
                .iter()
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

/// Whether traffic.c's `#if MPI_VERSION >= 4` part (a large-count
/// Alltoallv_c, a persistent Bcast_init) runs: on MPICH 4 and 5 (native and
/// standard ABI: MPI 4.0 and 5.0), not on Open MPI 4.1 and 5.0 (MPI 3.1).
fn mpi_4(mpi: Mpi) -> bool {
    !mpi.is_open_mpi()
}

/// (rank, peer, direction) → (messages, bytes): what traffic.c sends, by
/// the same parameters.
fn expected_traffic() -> BTreeMap<(u32, u32, &'static str), (u64, u64)> {
    let mut m = BTreeMap::new();
    let mut add = |from: u32, to: u32, msgs: u64, bytes: u64| {
        for key in [(from, to, "send"), (to, from, "recv")] {
            let e = m.entry(key).or_insert((0, 0));
            e.0 += msgs;
            e.1 += bytes;
        }
    };
    // 1. wildcard fan-in: 6 messages of 8*rank ints.
    for p in 1..4 {
        add(p, 0, 6, 6 * 8 * 4 * p as u64);
    }
    for r in 0..4 {
        // 2. ring: 10 + 20 + 30 doubles.
        add(r, (r + 1) % 4, 3, 60 * 8);
        // 3. persistent: 5 rounds of 16 ints.
        add(r, r ^ 2, 5, 5 * 64);
        // 6. Sendrecv: 3 ints.
        add(r, r ^ 1, 1, 12);
    }
    // 4. split communicator, vector type of 24 bytes: 5 elements up, 2 back.
    add(2, 0, 1, 120);
    add(0, 2, 1, 48);
    add(3, 1, 1, 120);
    add(1, 3, 1, 48);
    // 5. matched probes.
    add(3, 1, 1, 28);
    add(2, 1, 1, 36);
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

/// Asserts rank `rank`'s per-peer figures are exactly traffic.c's.
fn assert_traffic(s: &[Sample], rank: u32, mpi: Mpi) {
    let want = expected_traffic();
    let (mut msgs, mut bytes) = (BTreeMap::new(), BTreeMap::new());
    for (&(r, p, d), &(m, b)) in &want {
        if r == rank {
            msgs.insert((p, d.to_string()), m);
            bytes.insert((p, d.to_string()), b);
        }
    }
    assert_eq!(
        peer_series(s, "mpi_peer_messages_total", rank),
        msgs,
        "rank {rank}: messages per (peer, direction)"
    );
    assert_eq!(
        peer_series(s, "mpi_peer_bytes_total", rank),
        bytes,
        "rank {rank}: bytes per (peer, direction)"
    );
    let r = rank.to_string();
    let one = |name: &str| sum(s, name, &[("rank", &r)]);
    for zero in [
        "mpi_unattributed_messages_total",
        "mpi_peer_overflow_messages_total",
        "mpi_request_table_full_total",
        "mpi_requests_outstanding",
        "mpi_requests_persistent",
    ] {
        assert_eq!(one(zero), 0.0, "rank {rank}: {zero}");
    }
    // Rank 0's receive cancelled before it matched.
    assert_eq!(
        one("mpi_requests_cancelled_total"),
        f64::from(u8::from(rank == 0)),
        "rank {rank}: cancelled"
    );
    // No leaked entries: every started request completed. Every rank has
    // the ring's 6, 10 persistent starts, the split phase's Irecv or Isend
    // and the Ibarrier and Iallreduce; rank 1 its Imrecv, rank 0 the
    // cancelled receive; on MPI 4 two starts of the persistent Bcast.
    let started = one("mpi_requests_started_total");
    assert_eq!(started, one("mpi_requests_completed_total"), "rank {rank}");
    let bcast_init = if mpi_4(mpi) { 2.0 } else { 0.0 };
    assert_eq!(
        started,
        16.0 + 1.0 + 2.0 + f64::from(u8::from(rank <= 1)) + bcast_init,
        "rank {rank}"
    );
}

/// Collective figures by the documented definition (docs/stats.md).
fn assert_collectives(s: &[Sample], mpi: Mpi) {
    for rank in 0..NP {
        let r = rank.to_string();
        let calls = |f: &str| sum(s, "mpi_layer_calls_total", &[("rank", &r), ("function", f)]);
        let bytes = |f: &str, d: &str| {
            sum(
                s,
                "mpi_layer_bytes_total",
                &[("rank", &r), ("function", f), ("direction", d)],
            )
        };
        for f in [
            "MPI_Bcast",
            "MPI_Allreduce",
            "MPI_Gather",
            "MPI_Ibarrier",
            "MPI_Iallreduce",
        ] {
            assert_eq!(calls(f), 1.0, "rank {rank} {f}");
        }
        // Iallreduce of 2 doubles; Ibarrier moves no data.
        assert_eq!(bytes("MPI_Iallreduce", "send"), 16.0);
        assert_eq!(bytes("MPI_Iallreduce", "recv"), 16.0);
        assert_eq!(
            bytes("MPI_Ibarrier", "send") + bytes("MPI_Ibarrier", "recv"),
            0.0
        );
        // The large-count form, on MPI 4 only: MPI_Count count arrays.
        let large = if mpi_4(mpi) { 1.0 } else { 0.0 };
        assert_eq!(calls("MPI_Alltoallv_c"), large);
        assert_eq!(bytes("MPI_Alltoallv_c", "send"), 16.0 * large);
        assert_eq!(bytes("MPI_Alltoallv_c", "recv"), 16.0 * large);
        // The persistent Bcast_init from rank 2, started twice: a call per
        // start, 12 bytes each, sent at the root and received elsewhere.
        assert_eq!(calls("MPI_Bcast_init"), 2.0 * large);
        let (send, recv) = if rank == 2 { (24.0, 0.0) } else { (0.0, 24.0) };
        assert_eq!(bytes("MPI_Bcast_init", "send"), send * large);
        assert_eq!(bytes("MPI_Bcast_init", "recv"), recv * large);
        // Bcast of 10 ints from root 0.
        let root = rank == 0;
        assert_eq!(bytes("MPI_Bcast", "send"), if root { 40.0 } else { 0.0 });
        assert_eq!(bytes("MPI_Bcast", "recv"), if root { 0.0 } else { 40.0 });
        // Allreduce of 4 doubles.
        assert_eq!(bytes("MPI_Allreduce", "send"), 32.0);
        assert_eq!(bytes("MPI_Allreduce", "recv"), 32.0);
        // Gather of 2 ints to root 1: the receive side only at the root.
        assert_eq!(bytes("MPI_Gather", "send"), 8.0);
        assert_eq!(
            bytes("MPI_Gather", "recv"),
            if rank == 1 { 32.0 } else { 0.0 }
        );
    }
}

fn exact(mpi: Mpi, no_bpf: bool) {
    // The eBPF run needs root; the shim's own figures do not.
    let needs: &[Need] = if no_bpf {
        &[Need::Mpi(mpi)]
    } else {
        &[Need::Root, Need::Mpi(mpi)]
    };
    if !require(needs) {
        return;
    }
    let mode = if no_bpf { "no-bpf" } else { "ebpf" };
    let dir = scratch(&format!("stats-exact-{}-{mode}", mpi.name()));
    let job = start(mpi, &dir, "traffic");
    let mut args = job.pid_args();
    if no_bpf {
        args.insert(0, "--no-bpf".into());
    }
    let mut d = Daemon::start(&args);
    let s = scrape_with_figures(&mut d, &[0, 1, 2, 3]);
    for rank in 0..NP {
        assert_traffic(&s, rank, mpi);
    }
    assert_collectives(&s, mpi);
    job.finish("DONE ");
}

e2e::per_mpi!(stats_exact_per_peer_no_bpf => exact(true): openmpi, openmpi5, mpich5, mpich5_abi);
e2e::per_mpi!(stats_exact_per_peer_ebpf => exact(false): mpich, openmpi5, mpich5, mpich5_abi);

fn health(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("stats-health-{}", mpi.name()));
    let job = start(mpi, &dir, "hold");
    let mut d = Daemon::start(&[vec!["--no-bpf".to_string()], job.pid_args()].concat());
    let r0 = [("rank", "0")];
    let first = scrape_with_figures(&mut d, &[0]);
    let outstanding = sum(&first, "mpi_requests_outstanding", &r0);
    assert!(
        outstanding >= 5.0,
        "outstanding during the hold: {outstanding}"
    );
    let age1 = sum(&first, "mpi_request_oldest_age_seconds", &r0);
    assert!(age1 > 0.0, "oldest age during the hold: {age1}");
    std::thread::sleep(Duration::from_millis(1500));
    let second = d.scrape().1;
    let age2 = sum(&second, "mpi_request_oldest_age_seconds", &r0);
    assert!(
        age2 >= age1 + 1.0,
        "the oldest age must grow: {age1} then {age2}"
    );
    assert!(sum(&second, "mpi_requests_outstanding", &r0) >= 5.0);
    let pid0 = job.pid(0);
    job.finish("DONE ");
    // The daemon kept the unlinked segment open: final figures, no leak.
    let last = d.scrape().1;
    let r0 = [("rank", "0")];
    assert_eq!(
        sum(&last, "mpi_requests_outstanding", &r0),
        0.0,
        "pid {pid0}"
    );
    assert_eq!(sum(&last, "mpi_requests_started_total", &r0), 5.0);
    assert_eq!(sum(&last, "mpi_requests_completed_total", &r0), 5.0);
    assert_eq!(
        sum(
            &last,
            "mpi_peer_messages_total",
            &[("rank", "0"), ("peer", "1"), ("direction", "recv")]
        ),
        5.0
    );
}

e2e::per_mpi!(stats_request_health => health: openmpi, mpich);

/// `MPI_THREAD_MULTIPLE`: 4 threads per rank exchanging with both ring
/// neighbours at once (threads.c); the lock-free counters must be exact.
fn threads(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("stats-threads-{}", mpi.name()));
    let job = start(mpi, &dir, "threads");
    let mut d = Daemon::start(&[vec!["--no-bpf".to_string()], job.pid_args()].concat());
    let s = scrape_with_figures(&mut d, &[0, 1, 2, 3]);
    // Per thread t: 200 messages of 8 (t + 1) bytes; 4 threads.
    let (msgs, bytes) = (4 * 200, 200 * 8 * (1 + 2 + 3 + 4));
    for rank in 0..NP {
        let (right, left) = ((rank + 1) % NP, (rank + NP - 1) % NP);
        let want: BTreeMap<(u32, String), u64> = [
            ((right, "send".to_string()), msgs),
            ((left, "recv".to_string()), msgs),
        ]
        .into();
        assert_eq!(
            peer_series(&s, "mpi_peer_messages_total", rank),
            want,
            "rank {rank}"
        );
        let want: BTreeMap<(u32, String), u64> = [
            ((right, "send".to_string()), bytes),
            ((left, "recv".to_string()), bytes),
        ]
        .into();
        assert_eq!(
            peer_series(&s, "mpi_peer_bytes_total", rank),
            want,
            "rank {rank}"
        );
        let r = rank.to_string();
        let one = |name: &str| sum(&s, name, &[("rank", &r)]);
        // Every message's send is a request (Isend), and a third of the
        // receives (Irecv): 200 + 67 per thread.
        assert_eq!(one("mpi_requests_started_total"), 4.0 * (200.0 + 67.0));
        assert_eq!(one("mpi_requests_completed_total"), 4.0 * (200.0 + 67.0));
        assert_eq!(one("mpi_requests_outstanding"), 0.0);
        assert_eq!(one("mpi_unattributed_messages_total"), 0.0);
    }
    job.finish("DONE ");
}

e2e::per_mpi!(stats_thread_multiple => threads: openmpi, mpich);

/// The request table's bound: 5000 receives held at once on rank 0
/// (table.c) overflow the 4096 slots; the overflow is counted, never
/// tracked, and counted as unattributed; nothing leaks.
fn table_bound(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("stats-table-{}", mpi.name()));
    let job = start(mpi, &dir, "table");
    let mut d = Daemon::start(&[vec!["--no-bpf".to_string()], job.pid_args()].concat());
    let r0 = [("rank", "0")];
    let during = scrape_with_figures(&mut d, &[0]);
    let full = sum(&during, "mpi_request_table_full_total", &r0);
    let outstanding = sum(&during, "mpi_requests_outstanding", &r0);
    assert!(full >= 904.0, "5000 posted, 4096 slots: table full {full}");
    assert_eq!(
        outstanding + full,
        5000.0,
        "every receive tracked or counted"
    );
    // The hash spreads handles: the table fills before a probe window does.
    assert!((4000.0..=4096.0).contains(&outstanding), "{outstanding}");
    job.finish("DONE ");
    let last = d.scrape().1;
    let recv = [("rank", "0"), ("peer", "1"), ("direction", "recv")];
    assert_eq!(sum(&last, "mpi_requests_outstanding", &r0), 0.0, "no leak");
    assert_eq!(sum(&last, "mpi_requests_started_total", &r0), outstanding);
    assert_eq!(sum(&last, "mpi_requests_completed_total", &r0), outstanding);
    assert_eq!(sum(&last, "mpi_unattributed_messages_total", &r0), full);
    assert_eq!(sum(&last, "mpi_peer_messages_total", &recv), outstanding);
    assert_eq!(sum(&last, "mpi_peer_bytes_total", &recv), 4.0 * outstanding);
    let sent = [("rank", "1"), ("peer", "0"), ("direction", "send")];
    assert_eq!(sum(&last, "mpi_peer_messages_total", &sent), 5000.0);
}

e2e::per_mpi!(stats_request_table_bound => table_bound: openmpi, mpich);

/// Overwrites `len` bytes of `pid`'s live segment at `offset`.
fn corrupt(pid: u32, offset: u64, bytes: &[u8]) {
    let path = e2e::shm::segment_of(pid);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(bytes).unwrap();
}

#[test]
fn stats_corrupt_segment_is_skipped() {
    if !require(&[Need::Mpi(Mpi::OpenMpi)]) {
        return;
    }
    let dir = scratch("stats-corrupt");
    let job = start(Mpi::OpenMpi, &dir, "traffic");
    let mut d = Daemon::start(&[vec!["--no-bpf".to_string()], job.pid_args()].concat());
    let before = scrape_with_figures(&mut d, &[0, 1, 2, 3]);
    let errors = |s: &[Sample]| {
        sum(
            s,
            "mpi_observer_segment_errors_total",
            &[("reason", "corrupt")],
        )
    };
    assert_eq!(errors(&before), 0.0);
    // Rank 0: a wrong magic. Rank 2: a peer count that disagrees with the
    // segment's size (Header.peer_slots is at byte 36).
    corrupt(job.pid(0), 0, b"GARBAGE!");
    corrupt(job.pid(2), 36, &1_000_000u32.to_ne_bytes());
    let after = wait_for(
        "two corrupt segments counted",
        Duration::from_secs(20),
        || {
            let s = d.scrape().1;
            (errors(&s) >= 2.0).then_some(s)
        },
    );
    for rank in ["0", "2"] {
        assert!(
            !after
                .iter()
                .any(|x| x.name.starts_with("mpi_peer_") && x.label("rank") == Some(rank)),
            "rank {rank}'s corrupt segment must be skipped"
        );
    }
    // The others are still served, exactly.
    assert_traffic(&after, 1, Mpi::OpenMpi);
    assert_traffic(&after, 3, Mpi::OpenMpi);
    job.finish("DONE ");
    assert!(
        d.scrape()
            .1
            .iter()
            .any(|x| x.name == "mpi_observer_segment_errors_total")
    );
}

/// The job under a private mount namespace whose `/dev/shm` is a read-only
/// tmpfs: the segment cannot be created, the job must run on.
fn no_shm(mpi: Mpi) {
    if !require(&[Need::Root, Need::Command("unshare"), Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("stats-noshm-{}", mpi.name()));
    let exe = build(mpi, &dir, "traffic");
    let inner = launcher(mpi, &exe);
    let mut c = Command::new("unshare");
    c.args([
        "-m",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        "mount -t tmpfs -o ro,size=64k tmpfs /dev/shm && exec \"$@\"",
        "sh",
    ])
    .arg(inner.get_program())
    .args(inner.get_args())
    // Both libraries' shared-memory transports keep their files in /dev/shm
    // by default; the test is about the layer, not the transport: Open MPI's
    // vader goes to /tmp, MPICH's UCX uses System V memory instead.
    .env("OMPI_MCA_btl_vader_backing_directory", "/tmp")
    .env("UCX_TLS", "self,sysv,cma");
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    let o = run_with_timeout(&mut c, Duration::from_secs(120));
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "the job must run on: {}\n{out}\n{err}",
        o.status
    );
    assert_eq!(
        out.lines().filter(|l| l.starts_with("DONE ")).count(),
        NP as usize,
        "{out}"
    );
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("mpi-observer-shim"))
        .collect();
    assert_eq!(said.len(), NP as usize, "one line per rank: {err}");
    for l in &said {
        assert!(
            l.contains(&format!(
                "stats: cannot create /dev/shm/mpi-observer.{}.",
                // SAFETY: getuid cannot fail.
                unsafe { libc::getuid() }
            )) && l.contains("passes calls through"),
            "{l}"
        );
    }
}

e2e::per_mpi!(stats_no_dev_shm => no_shm: openmpi, mpich);

/// A rank killed by a signal cannot unlink its segment (nor its trace
/// file); once its figures have been retained long enough, the daemon
/// removes both orphans.
#[test]
fn stats_segment_of_a_killed_job_is_removed() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch("stats-killed");
    let job = start(mpi, &dir, "hold");
    let mut d = Daemon::start(
        &[
            vec!["--no-bpf".to_string(), "--retain-exited".into(), "1".into()],
            job.pid_args(),
        ]
        .concat(),
    );
    scrape_with_figures(&mut d, &[0, 1, 2, 3]);
    // The segment and its recording rings (`mpi-observer record`).
    let segments: Vec<PathBuf> = job
        .pids()
        .iter()
        .flat_map(|p| e2e::shm::files_of(*p))
        .collect();
    assert_eq!(segments.len(), 2 * NP as usize, "{segments:?}");
    for s in &segments {
        assert!(s.exists(), "{} must exist while the job runs", s.display());
    }
    for p in job.pids() {
        // SAFETY: kill(2) on a rank this test started.
        unsafe { kill(p as i32, 9) };
    }
    drop(job);
    wait_for(
        "the orphaned segments to be removed",
        Duration::from_secs(20),
        || segments.iter().all(|s| !s.exists()).then_some(()),
    );
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// Issue 21, attack 10: an unprivileged user pre-creates 4,000 files under
/// every name of the shim's it can guess for the next pids (the old
/// `mpi-observer.<pid>` and `.trace`, the new form with a guessed random
/// part). The next job's shim still creates its segment (its random name
/// cannot be taken in advance), and its figures are exact.
#[test]
fn stats_squatted_names_do_not_push_the_shim_out() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Command("useradd"), Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch("stats-squat");
    let exe = build(mpi, &dir, "traffic");
    let squat = e2e::shm::squat(0, 1000);
    assert_eq!(squat.files.len(), 4000);
    for f in &squat.files {
        let m = std::fs::symlink_metadata(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!(m.uid(), squat.attacker, "{} is the attacker's", f.display());
    }
    let job = Job::spawn(launcher(mpi, &exe), NP, dir.join("go"));
    for p in job.pids() {
        let seg = e2e::shm::segment_of(p);
        assert!(!squat.files.contains(&seg), "{}", seg.display());
        assert_eq!(std::fs::metadata(&seg).unwrap().uid(), 0);
    }
    let mut d = Daemon::start(&[vec!["--no-bpf".to_string()], job.pid_args()].concat());
    let s = scrape_with_figures(&mut d, &[0, 1, 2, 3]);
    for rank in 0..NP {
        assert_traffic(&s, rank, mpi);
    }
    assert_collectives(&s, mpi);
    job.finish("DONE ");
    // The attacker's files are young: the daemon's sweep spares them.
    assert!(squat.files.iter().all(|f| f.exists()));
}

/// Issue 21, attack 12 (orphans): ranks SIGKILLed while no daemon runs
/// leave their files in /dev/shm; a daemon started later removes them in
/// its first sweep, counted, and never removes a live rank's files, nor
/// follows or removes a symlink named like a segment.
#[test]
fn stats_orphans_are_swept_at_start() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi)]) {
        return;
    }
    let dead = start(mpi, &scratch("stats-orphans-dead"), "hold");
    let dead_pids = dead.pids();
    let orphans: Vec<PathBuf> = dead_pids
        .iter()
        .flat_map(|p| e2e::shm::files_of(*p))
        .collect();
    assert_eq!(orphans.len(), 2 * NP as usize, "{orphans:?}");
    for p in &dead_pids {
        // SAFETY: kill(2) on a rank this test started.
        unsafe { kill(*p as i32, 9) };
    }
    drop(dead);
    wait_for(
        "the killed ranks to be gone",
        Duration::from_secs(20),
        || {
            dead_pids
                .iter()
                .all(|p| !Path::new(&format!("/proc/{p}")).exists())
                .then_some(())
        },
    );
    let live = start(mpi, &scratch("stats-orphans-live"), "hold");
    let kept: Vec<PathBuf> = live
        .pids()
        .iter()
        .flat_map(|p| e2e::shm::files_of(*p))
        .collect();
    assert_eq!(kept.len(), 2 * NP as usize, "{kept:?}");
    // Past the grace period, all of them: only the live ranks' mappings
    // spare theirs.
    for f in orphans.iter().chain(&kept) {
        std::fs::File::options()
            .write(true)
            .open(f)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
            .unwrap();
    }
    // A symlink named like a dead rank's segment, to a live one.
    let link = PathBuf::from(format!(
        "/dev/shm/mpi-observer.0.{}.00000000000000aa",
        dead_pids[0]
    ));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&kept[0], &link).unwrap();
    let mut d = Daemon::start(&[vec!["--no-bpf".to_string()], live.pid_args()].concat());
    wait_for("the orphans to be removed", Duration::from_secs(10), || {
        orphans.iter().all(|f| !f.exists()).then_some(())
    });
    let s = scrape_with_figures(&mut d, &[0, 1, 2, 3]);
    assert!(
        sum(&s, "mpi_observer_shm_orphans_removed_total", &[]) >= orphans.len() as f64,
        "the removals are counted"
    );
    for f in &kept {
        assert!(f.exists(), "a live rank's {} must stay", f.display());
    }
    assert!(
        std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()),
        "the symlink is left alone"
    );
    let _ = std::fs::remove_file(&link);
    live.finish("DONE ");
    assert!(
        d.log().iter().any(|l| l.contains("orphaned shim file")),
        "the sweep says what it removed"
    );
}
