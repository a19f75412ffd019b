//! `mpi-observer record` (issue 13): OTF2 traces of running ranks, read back
//! by two independent readers, Debian's `otf2-print` and `python3-otf2`
//! (through `observer/src/record/read_otf2.py`, run with `/usr/bin/python3`).
//!
//! - Ranks with the shim's `stats` layer (tests/programs/record/traffic.c:
//!   blocking, nonblocking, persistent and wildcard traffic, a reversed
//!   sub-communicator, collectives), recorded from before their traffic to
//!   their exit, on Open MPI 4 and 5, MPICH 4, and MPICH 5 through the MPI-5
//!   standard ABI: per (sender, receiver) in world
//!   ranks exactly as many send and receive events as the program made,
//!   every request event matched, balanced Enter/Leave, the communicator
//!   defined by its world ranks, collectives with their operation.
//! - A ring too small: events dropped, counted in the archive (the
//!   `dropped_events` metric) and in the last line, the archive still valid.
//! - Stopping a recording (SIGINT) mid-run leaves the job running and
//!   correct, the archive valid and balanced.
//! - Ranks without the shim are recorded through the probes: Enter/Leave of
//!   every call, balanced and in order per thread, on the right ranks; the
//!   job's own checks pass and no probe is left.
//! - Bad input is one line and exit 1, and touches no rank.
//! - Matched receives (tests/programs/record/matched.c: `MPI_Mprobe` +
//!   `MPI_Mrecv`, `MPI_Improbe` + `MPI_Imrecv`, `MPI_Sendrecv`,
//!   `MPI_PROC_NULL`): exact per pair, every request paired.
//! - Threads (tests/programs/record/threads.c, `MPI_THREAD_MULTIPLE`): each
//!   thread's events in a ring of its own, exact per pair; with fewer rings
//!   than threads, the events of the threads without one counted as dropped.
//! - Recordings one after another of the same ranks: each valid and
//!   balanced, the job's results intact (a thread keeps its ring).

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use e2e::{
    Job, Mpi, Need, assert_no_probes_left, compile, observer_bin, program, require,
    run_with_timeout, scratch, shim_launcher, wait_with_timeout, workspace_root,
};
use serde_json::Value;

/// `record ARGS`: (exit code, stderr lines).
pub(crate) fn record(args: &[String], limit: Duration) -> (Option<i32>, Vec<String>) {
    let o = run_with_timeout(Command::new(observer_bin()).arg("record").args(args), limit);
    let err: Vec<String> = String::from_utf8_lossy(&o.stderr)
        .lines()
        .map(str::to_string)
        .collect();
    for l in &err {
        eprintln!("[record] {l}");
    }
    (o.status.code(), err)
}

/// The archive's anchor file in `dir`.
pub(crate) fn anchor(dir: &Path) -> PathBuf {
    dir.join("traces.otf2")
}

/// What `otf2-print` read from the archive.
#[derive(Debug, Default)]
struct Printed {
    /// Event lines by kind (ENTER, LEAVE, MPI_SEND, ...).
    kinds: BTreeMap<String, u64>,
    /// ENTER lines by (location, region name).
    enters: BTreeMap<(u64, String), u64>,
}

/// `otf2-print` reads the archive.
fn otf2_print(dir: &Path) -> Printed {
    let o = Command::new("otf2-print")
        .arg(anchor(dir))
        .output()
        .expect("run otf2-print");
    assert!(
        o.status.success(),
        "otf2-print failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let mut p = Printed::default();
    // Event lines: KIND LOCATION TIMESTAMP ATTRIBUTES...
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (Some(kind), Some(loc), Some(ts)) = (f.first(), f.get(1), f.get(2)) else {
            continue;
        };
        let (Ok(loc), Ok(_)) = (loc.parse::<u64>(), ts.parse::<u64>()) else {
            continue;
        };
        if !kind.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            continue;
        }
        *p.kinds.entry(kind.to_string()).or_default() += 1;
        if *kind == "ENTER" {
            let region = l.split('"').nth(1).unwrap_or("?").to_string();
            *p.enters.entry((loc, region)).or_default() += 1;
        }
    }
    p
}

/// python3-otf2 reads the archive: the reader's JSON summary.
pub(crate) fn python_read(dir: &Path) -> Value {
    let script = workspace_root().join("observer/src/record/read_otf2.py");
    let o = Command::new("/usr/bin/python3")
        .arg(&script)
        .arg(anchor(dir))
        .output()
        .expect("run /usr/bin/python3");
    assert!(
        o.status.success(),
        "read_otf2.py failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("the reader's JSON")
}

pub(crate) fn readers() -> [Need; 2] {
    [
        Need::Command("otf2-print"),
        Need::Command("/usr/bin/python3"),
    ]
}

/// Starts `record ARGS` in the background; returns it once it printed its
/// `recording` line, with its stderr lines so far.
pub(crate) fn start_record(
    args: &[String],
) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
    use std::io::BufRead as _;
    let mut c = Command::new(observer_bin())
        .arg("record")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start mpi-observer record");
    let err = c.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
            eprintln!("[record] {l}");
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let first = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("record's first line");
    assert!(first.starts_with("mpi-observer: recording"), "{first}");
    (c, rx)
}

/// Waits for `record` to end by itself; its status and remaining lines.
pub(crate) fn end_record(
    c: std::process::Child,
    rx: std::sync::mpsc::Receiver<String>,
) -> (Option<i32>, Vec<String>) {
    let o = wait_with_timeout(c, Duration::from_secs(120));
    let rest: Vec<String> = rx.try_iter().collect();
    (o.status.code(), rest)
}

/// The traffic of tests/programs/record/traffic.c per (sender, receiver)
/// in world ranks, for `n` ranks and `iters` iterations.
fn expected_pairs(n: u32, iters: u64) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for r in 0..n {
        let mut add = |to: u32, k: u64| *m.entry(format!("{r}->{to}")).or_default() += k * iters;
        add((r + 1) % n, 3); // blocking, nonblocking, persistent
        if r != 0 {
            add(0, 1); // wildcard
        }
        add((r + n - 1) % n, 1); // the reversed communicator
    }
    m
}

fn as_pairs(v: &Value) -> BTreeMap<String, u64> {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect()
}

/// Records `tests/programs/record/PROG.c ITERS GOFILE` on `np` ranks of
/// `mpi` under the shim, from before its traffic to its exit; `env` goes
/// to every rank. The reader's summary, record's last lines, the archive.
fn record_program(
    mpi: Mpi,
    prog: &str,
    np: u32,
    name: &str,
    iters: u64,
    env: &[(&str, &str)],
) -> (Value, Vec<String>, PathBuf) {
    let dir = scratch(name);
    let exe = dir.join(prog);
    compile(mpi, &program(&format!("record/{prog}.c")), &exe, &[]);
    let mut l = shim_launcher(mpi, np, "stats");
    for (k, v) in env {
        if mpi.is_open_mpi() {
            l.args(["-x", &format!("{k}={v}")]);
        } else {
            l.args(["-genv", k, v]);
        }
    }
    l.arg(&exe).arg(iters.to_string());
    let job = Job::spawn(l, np, dir.join("go"));
    let out = dir.join("trace");
    let mut args = job.pid_args();
    args.extend(["-o".into(), out.display().to_string()]);
    let (rec, rx) = start_record(&args);
    job.finish("OK");
    let (code, rest) = end_record(rec, rx);
    assert_eq!(code, Some(0), "{rest:?}");
    let last = rest.last().cloned().unwrap_or_default();
    assert!(last.contains("every recorded rank exited"), "{rest:?}");
    (python_read(&out), rest, out)
}

/// [`record_program`] of traffic.c on 3 ranks.
fn record_traffic(
    mpi: Mpi,
    name: &str,
    iters: u64,
    env: &[(&str, &str)],
) -> (Value, Vec<String>, PathBuf) {
    record_program(mpi, "traffic", 3, name, iters, env)
}

fn shim_ranks_give_full_events(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) || !require(&readers()) {
        return;
    }
    let iters = 25;
    let (r, rest, out) = record_traffic(mpi, &format!("record-shim-{}", mpi.name()), iters, &[]);
    // Ranks 1 and 2 were in the first Barrier when the recording began,
    // rank 0 was not: the slice starts at that Barrier's end on all three
    // and runs to the end, every rank having entered MPI_Finalize.
    let last = rest.last().cloned().unwrap_or_default();
    assert!(
        last.contains("the slice runs from the end of blocking collective #1 on MPI_COMM_WORLD on every rank to the end of the recording, every rank having entered MPI_Finalize"),
        "{last}"
    );
    assert_eq!(r["region_files"], serde_json::json!(["MPI"]), "{r}");
    for rank in 0..3 {
        assert_eq!(
            r["rank_collectives"][rank.to_string()],
            serde_json::json!({"ALLREDUCE": iters, "BCAST": iters}),
            "rank {rank}: {r}"
        );
    }
    let want = expected_pairs(3, iters);
    assert_eq!(as_pairs(&r["sends"]), want, "send events per pair: {r}");
    assert_eq!(as_pairs(&r["recvs"]), want, "receive events per pair: {r}");
    // Per rank and iteration: one Isend and one persistent start each way.
    let req = &r["requests"];
    for k in ["isend", "isend_complete", "irecv_request", "irecv"] {
        assert_eq!(req[k], 2 * iters * 3, "{k}: {r}");
    }
    assert_eq!(req["unmatched"], 0, "{r}");
    assert_eq!(r["enter_leave_balanced"], true, "{r}");
    assert_eq!(r["monotonic"], true, "{r}");
    assert_eq!(r["declared_events_match"], true, "{r}");
    assert_eq!(r["collectives"]["ALLREDUCE"], iters * 3, "{r}");
    assert_eq!(r["collectives"]["BCAST"], iters * 3, "{r}");
    assert_eq!(
        r["kinds"]["MpiCollectiveBegin"], r["kinds"]["MpiCollectiveEnd"],
        "{r}"
    );
    let comms = r["comms"].as_object().unwrap();
    assert!(
        comms.values().any(|v| v == &serde_json::json!([2, 1, 0])),
        "the reversed communicator, by world ranks: {r}"
    );
    assert_eq!(r["dropped"], serde_json::json!({}), "{r}");
    for rank in 0..3 {
        assert_eq!(
            r["ranks"][rank.to_string()]["name"],
            format!("MPI Rank {rank}")
        );
    }
    // The other reader agrees.
    let p = otf2_print(&out);
    let sends: u64 = want.values().sum();
    let n = |k: &str| p.kinds.get(k).copied().unwrap_or(0);
    assert_eq!(n("MPI_SEND") + n("MPI_ISEND"), sends, "{p:?}");
    assert_eq!(n("MPI_RECV") + n("MPI_IRECV"), sends, "{p:?}");
    assert_eq!(n("ENTER"), n("LEAVE"), "{p:?}");
}

e2e::per_mpi!(shim_ranks_give_full_events => shim_ranks_give_full_events: openmpi, mpich, openmpi5, mpich5_abi);

#[test]
fn a_small_ring_drops_and_says_so() {
    if !require(&[Need::Mpi(Mpi::OpenMpi)]) || !require(&readers()) {
        return;
    }
    // 64 events a ring, 300 iterations of ~25 events each in a few ms.
    let (r, rest, out) = record_traffic(
        Mpi::OpenMpi,
        "record-small-ring",
        300,
        &[("MPI_OBSERVER_TRACE_RING_EVENTS", "64")],
    );
    let dropped: u64 = r["dropped"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert!(dropped > 0, "the archive reports dropped events: {r}");
    let last = rest.last().unwrap();
    let said: u64 = last
        .split("dropped: ")
        .nth(1)
        .and_then(|x| x.split_whitespace().next())
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    assert_eq!(said, dropped, "the last line and the archive agree: {last}");
    // What was kept is still a valid, balanced archive.
    assert_eq!(r["enter_leave_balanced"], true, "{r}");
    assert_eq!(r["declared_events_match"], true, "{r}");
    assert!(otf2_print(&out).kinds.get("METRIC").copied().unwrap_or(0) > 0);
}

#[test]
fn stopping_a_recording_leaves_the_job_intact() {
    if !require(&[Need::Mpi(Mpi::OpenMpi)]) || !require(&readers()) {
        return;
    }
    let dir = scratch("record-stop");
    let exe = dir.join("busy");
    compile(Mpi::OpenMpi, &program("top/busy.c"), &exe, &[]);
    let mut l = shim_launcher(Mpi::OpenMpi, 3, "stats");
    l.arg(&exe);
    let job = Job::spawn(l, 3, dir.join("stop"));
    let out = dir.join("trace");
    let mut args = job.pid_args();
    args.extend(["-o".into(), out.display().to_string()]);
    let (rec, rx) = start_record(&args);
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(rec.id() as i32, libc::SIGINT) };
    let (code, rest) = end_record(rec, rx);
    assert_eq!(code, Some(0), "{rest:?}");
    assert!(rest.last().unwrap().contains("(interrupted"), "{rest:?}");
    // The ranks go on, unrecorded, and check their own results.
    std::thread::sleep(Duration::from_millis(500));
    job.finish("OK");
    let r = python_read(&out);
    assert_eq!(r["enter_leave_balanced"], true, "{r}");
    assert_eq!(r["monotonic"], true, "{r}");
    // The slice is cut where every rank ended one blocking collective on
    // MPI_COMM_WORLD: no message of busy.c (a Sendrecv between a Barrier
    // and an Allreduce) is half inside it, and every rank has the same
    // collectives, which is what Scalasca's replay needs.
    let last = rest.last().unwrap();
    assert!(
        last.contains("the slice runs from the ")
            && last.contains("on MPI_COMM_WORLD on every rank ("),
        "{last}"
    );
    let (sends, recvs) = (as_pairs(&r["sends"]), as_pairs(&r["recvs"]));
    assert_eq!(sends.len(), 3, "the ring's three pairs: {r}");
    for (pair, n) in &sends {
        let m = recvs.get(pair).copied().unwrap_or(0);
        assert!(*n > 50 && *n == m, "{pair}: {n} sent, {m} received: {r}");
    }
    let per_rank = &r["rank_collectives"];
    for rank in 1..3 {
        assert_eq!(
            per_rank[rank.to_string()],
            per_rank["0"],
            "rank {rank}: {r}"
        );
    }
}

#[test]
fn probed_ranks_give_enter_and_leave() {
    if !require(&[Need::Root, Need::Mpi(Mpi::OpenMpi)]) || !require(&readers()) {
        return;
    }
    let dir = scratch("record-probes");
    let exe = dir.join("busy");
    compile(Mpi::OpenMpi, &program("top/busy.c"), &exe, &[]);
    let mut l = Mpi::OpenMpi.launcher(3);
    l.arg(&exe);
    let job = Job::spawn(l, 3, dir.join("stop"));
    let out = dir.join("trace");
    let mut args = job.pid_args();
    args.extend(["--duration".into(), "2".into(), "-o".into()]);
    args.push(out.display().to_string());
    let (code, err) = record(&args, Duration::from_secs(60));
    assert_eq!(code, Some(0), "{err:?}");
    assert!(
        err[0].starts_with("mpi-observer: recording 3 ranks")
            && err[0].contains("3 through probes"),
        "{err:?}"
    );
    assert!(
        err.last().unwrap().contains("the duration was reached")
            && err
                .last()
                .unwrap()
                .contains("is recorded through the probes, which see no collective's number"),
        "{err:?}"
    );
    let pids = job.pids();
    // The job goes on unharmed, and checks its own results.
    std::thread::sleep(Duration::from_millis(300));
    job.finish("OK");
    assert_no_probes_left();

    let p = otf2_print(&out);
    let enters = p.kinds.get("ENTER").copied().unwrap_or(0);
    assert!(enters > 300, "{p:?}");
    assert_eq!(p.kinds.get("LEAVE"), Some(&enters), "{p:?}");
    // Every iteration makes one Barrier, one Sendrecv and one Allreduce:
    // tracing starts and stops for a whole rank at once, so each rank's
    // three counts differ by the calls under way at the start and stop.
    for rank in 0..3u64 {
        let n = |f: &str| p.enters.get(&(rank, f.to_string())).copied().unwrap_or(0);
        let counts = [n("MPI_Barrier"), n("MPI_Sendrecv"), n("MPI_Allreduce")];
        let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(*lo > 100 && hi - lo <= 2, "rank {rank}: {counts:?}");
    }
    let r = python_read(&out);
    assert_eq!(r["enter_leave_balanced"], true, "{r}");
    assert_eq!(r["monotonic"], true, "{r}");
    assert_eq!(r["in_clock_range"], true, "{r}");
    assert_eq!(r["declared_events_match"], true, "{r}");
    for rank in 0..3 {
        let g = &r["ranks"][rank.to_string()];
        assert_eq!(g["name"], format!("MPI Rank {rank}"), "{r}");
        assert_eq!(g["pid"], pids[rank], "{r}");
        assert!(g["events"].as_u64().unwrap() > 30, "{r}");
    }
    assert!(r["clock"]["realtime_timestamp"].as_u64().is_some(), "{r}");
}

#[test]
fn bad_input_is_one_line_and_exit_1() {
    if !require(&[Need::Root]) {
        return;
    }
    let dir = scratch("record-bad");
    let taken = dir.join("taken");
    std::fs::create_dir_all(&taken).unwrap();
    std::fs::write(anchor(&taken), b"an archive").unwrap();
    let file = dir.join("a-file");
    std::fs::write(&file, b"").unwrap();
    let me = std::process::id().to_string();
    let dead = "4000000".to_string();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "--pid".into(),
                dead.clone(),
                "-o".into(),
                dir.join("x").display().to_string(),
            ],
            "is not running",
        ),
        (
            vec![
                "--pid".into(),
                me.clone(),
                "-o".into(),
                dir.join("y").display().to_string(),
            ],
            "has no MPI library",
        ),
        (
            vec![
                "--pid".into(),
                me.clone(),
                "-o".into(),
                taken.display().to_string(),
            ],
            "exists",
        ),
        (
            vec![
                "--pid".into(),
                me.clone(),
                "-o".into(),
                file.join("sub").display().to_string(),
            ],
            "cannot create",
        ),
        (
            vec![
                "--pid".into(),
                me.clone(),
                "--duration".into(),
                "0".into(),
                "-o".into(),
                dir.join("z").display().to_string(),
            ],
            "positive number of seconds",
        ),
    ];
    for (args, want) in &cases {
        let (code, err) = record(args, Duration::from_secs(30));
        let err: Vec<&String> = err.iter().filter(|l| !l.trim().is_empty()).collect();
        assert_ne!(code, Some(0), "record {args:?}: {err:?}");
        assert!(
            err.iter().any(|l| l.contains(want)),
            "record {args:?} should say {want:?}: {err:?}"
        );
        if *want != "positive number of seconds" {
            // clap's own usage errors have their usage lines; ours are one.
            assert_eq!(code, Some(1), "record {args:?}: {err:?}");
            assert_eq!(err.len(), 1, "one line for record {args:?}: {err:?}");
        }
    }
    assert!(
        !dir.join("x").exists() && !dir.join("y").exists(),
        "a refused recording leaves no directory behind"
    );
    assert_eq!(
        std::fs::read(anchor(&taken)).unwrap(),
        b"an archive",
        "an existing archive is never touched"
    );
}

fn matched_receives_are_recorded(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) || !require(&readers()) {
        return;
    }
    let (np, iters) = (3u32, 20u64);
    let name = format!("record-matched-{}", mpi.name());
    let (r, _, _) = record_program(mpi, "matched", np, &name, iters, &[]);
    let want: BTreeMap<String, u64> = (0..np)
        .map(|s| (format!("{s}->{}", (s + 1) % np), 3 * iters))
        .collect();
    assert_eq!(as_pairs(&r["sends"]), want, "send events per pair: {r}");
    assert_eq!(as_pairs(&r["recvs"]), want, "receive events per pair: {r}");
    let req = &r["requests"];
    // Two Isends and one Imrecv per rank and iteration; nothing for
    // MPI_PROC_NULL.
    let n = u64::from(np) * iters;
    assert_eq!(req["isend"], 2 * n, "{r}");
    assert_eq!(req["isend_complete"], 2 * n, "{r}");
    assert_eq!(req["irecv_request"], n, "{r}");
    assert_eq!(req["irecv"], n, "{r}");
    assert_eq!(req["unmatched"], 0, "{r}");
    assert_eq!(r["enter_leave_balanced"], true, "{r}");
    assert_eq!(r["dropped"], serde_json::json!({}), "{r}");
}

e2e::per_mpi!(matched_receives_are_recorded => matched_receives_are_recorded: openmpi, mpich);

#[test]
fn recordings_one_after_another() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Mpi(mpi)]) || !require(&readers()) {
        return;
    }
    let np = 3u32;
    let dir = scratch("record-again");
    let exe = dir.join("busy");
    compile(mpi, &program("top/busy.c"), &exe, &[]);
    // busy.c stops when its one argument, the job's go file, exists.
    let mut l = shim_launcher(mpi, np, "stats");
    l.arg(&exe);
    let job = Job::spawn(l, np, dir.join("go"));
    // The third is asked whole: each rank from its own start to its own
    // stop, as `record` did before it cut its slices.
    for k in 0..3 {
        let out = dir.join(format!("trace{k}"));
        let mut args = job.pid_args();
        args.extend([
            "--duration".into(),
            "1".into(),
            "-o".into(),
            out.display().to_string(),
        ]);
        if k == 2 {
            args.push("--whole".into());
        }
        let (code, err) = record(&args, Duration::from_secs(60));
        assert_eq!(code, Some(0), "recording {k}: {err:?}");
        let last = err.last().cloned().unwrap_or_default();
        if k == 2 {
            assert!(last.ends_with("own stop: as asked (--whole)"), "{last}");
        } else {
            assert!(last.contains("the slice runs from the "), "{last}");
        }
        let r = python_read(&out);
        assert_eq!(r["enter_leave_balanced"], true, "recording {k}: {r}");
        assert_eq!(r["requests"]["unmatched"], 0, "recording {k}: {r}");
        assert_eq!(r["dropped"], serde_json::json!({}), "recording {k}: {r}");
        for s in 0..np {
            let pair = format!("{s}->{}", (s + 1) % np);
            assert!(
                r["sends"][&pair].as_u64().unwrap_or(0) > 0
                    && r["recvs"][&pair].as_u64().unwrap_or(0) > 0,
                "recording {k}: traffic {pair}: {r}"
            );
        }
        for rank in 0..np {
            let threads = r["ranks"][rank.to_string()]["threads"].as_object().unwrap();
            assert_eq!(threads.len(), 1, "recording {k}, rank {rank}: {r}");
        }
    }
    job.finish("OK");
}

/// Records tests/programs/record/threads.c (2 ranks, 3 threads each, and
/// the main thread) with `env` on every rank: the reader's summary.
fn record_threads(name: &str, iters: u64, env: &[(&str, &str)]) -> Value {
    record_program(Mpi::OpenMpi, "threads", 2, name, iters, env).0
}

#[test]
fn threads_each_have_a_ring() {
    if !require(&[Need::Mpi(Mpi::OpenMpi)]) || !require(&readers()) {
        return;
    }
    let iters = 50;
    let r = record_threads("record-threads", iters, &[]);
    let want: BTreeMap<String, u64> = [
        ("0->1".to_string(), 3 * iters),
        ("1->0".to_string(), 3 * iters),
    ]
    .into();
    assert_eq!(as_pairs(&r["sends"]), want, "{r}");
    assert_eq!(as_pairs(&r["recvs"]), want, "{r}");
    assert_eq!(r["requests"]["isend"], 2 * 3 * iters, "{r}");
    assert_eq!(r["requests"]["unmatched"], 0, "{r}");
    assert_eq!(r["enter_leave_balanced"], true, "{r}");
    assert_eq!(r["dropped"], serde_json::json!({}), "{r}");
    for rank in 0..2 {
        let threads = r["ranks"][rank.to_string()]["threads"].as_object().unwrap();
        // The three workers and the main thread (its MPI_Barrier calls).
        assert_eq!(threads.len(), 4, "rank {rank}: {r}");
    }
}

#[test]
fn fewer_rings_than_threads_counts_the_rest_as_dropped() {
    if !require(&[Need::Mpi(Mpi::OpenMpi)]) || !require(&readers()) {
        return;
    }
    let r = record_threads("record-few-rings", 50, &[("MPI_OBSERVER_TRACE_RINGS", "2")]);
    assert_eq!(r["enter_leave_balanced"], true, "{r}");
    for rank in 0..2 {
        let threads = r["ranks"][rank.to_string()]["threads"].as_object().unwrap();
        // A location a ring, and the rank's first one for the dropped
        // count's Metric record.
        let busy = threads.values().filter(|n| n.as_u64() > Some(1)).count();
        assert!(busy <= 2, "rank {rank}: at most one location a ring: {r}");
        assert!(
            r["dropped"][rank.to_string()].as_u64().unwrap_or(0) > 0,
            "rank {rank}: the ringless threads' events counted: {r}"
        );
    }
}

/// Issue 21, attack 9: the job's user truncates a rank's `.trace` file
/// mid-recording. `record` does not die of SIGBUS: it says so in one line
/// naming the rank, records the others, exits 0 with a valid archive, and
/// the job finishes correctly.
#[test]
fn a_truncated_trace_file_loses_one_rank_only() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Mpi(mpi), Need::Command("truncate")]) || !require(&readers()) {
        return;
    }
    let dir = scratch("record-truncated");
    let exe = dir.join("traffic");
    compile(mpi, &program("record/traffic.c"), &exe, &[]);
    let mut l = shim_launcher(mpi, 3, "stats");
    l.arg(&exe).arg("20");
    let job = Job::spawn(l, 3, dir.join("go"));
    let out = dir.join("trace");
    let mut args = job.pid_args();
    args.extend(["-o".into(), out.display().to_string()]);
    let (rec, rx) = start_record(&args);
    // Rank 0 waits for the go file outside any MPI call, with no ring
    // claimed yet: cut its file to the header page. The recorder's next
    // drain touches the vanished rings; rank 0 reserves its ring again
    // (posix_fallocate) at its first event, so the job runs on.
    let trace = e2e::shm::trace_of(job.pid(0));
    let o = Command::new("truncate")
        .args(["-s", "4096"])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let mut seen = Vec::new();
    let said = loop {
        let l = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no line about the lost rank: {seen:?}"));
        if l.contains("recording rings") {
            break l;
        }
        seen.push(l);
    };
    assert!(
        said.contains("rank 0") && said.contains(&format!("pid {}", job.pid(0))),
        "{said}"
    );
    job.finish("OK");
    let (code, rest) = end_record(rec, rx);
    assert_eq!(code, Some(0), "{rest:?}");
    assert!(
        !rest.iter().any(|l| l.contains("recording rings")),
        "one line only: {rest:?}"
    );
    assert!(
        rest.last().unwrap().contains("every recorded rank exited")
            && rest
                .last()
                .unwrap()
                .ends_with("own stop: rank 0's rings were lost mid-recording"),
        "{rest:?}"
    );
    // The archive is valid, and ranks 1 and 2 are in it in full: their
    // sends to each other and rank 1's to rank 0.
    let r = python_read(&out);
    assert_eq!(r["enter_leave_balanced"], true, "{r}");
    assert_eq!(r["declared_events_match"], true, "{r}");
    let sends = as_pairs(&r["sends"]);
    let want = expected_pairs(3, 20);
    for pair in ["1->2", "2->1", "1->0", "2->0"] {
        assert_eq!(sends.get(pair), want.get(pair), "{pair}: {r}");
    }
    assert!(
        !sends.keys().any(|k| k.starts_with("0->")),
        "rank 0 is not recorded after its loss: {r}"
    );
    let p = otf2_print(&out);
    assert_eq!(
        p.kinds.get("ENTER").copied().unwrap_or(0),
        p.kinds.get("LEAVE").copied().unwrap_or(0),
        "{p:?}"
    );
}

/// Issue 21, attack 10, for `record`: with every guessable name of the
/// next pids squatted by another user, the job's rings are still made
/// and recorded in full.
#[test]
fn squatted_names_do_not_stop_recording() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Command("useradd"), Need::Mpi(mpi)]) || !require(&readers()) {
        return;
    }
    // 1,000 pids: the compiler's and the job's.
    let squat = e2e::shm::squat(0, 1000);
    let (r, _, _) = record_traffic(mpi, "record-squat", 10, &[]);
    let want = expected_pairs(3, 10);
    assert_eq!(as_pairs(&r["sends"]), want, "{r}");
    assert_eq!(as_pairs(&r["recvs"]), want, "{r}");
    assert_eq!(r["enter_leave_balanced"], true, "{r}");
    drop(squat);
}
