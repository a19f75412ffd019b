//! The shim's event rings (`shim/src/stats/trace.rs`) for the receives
//! tests/tests/record.rs's program does not make: `MPI_Mprobe` +
//! `MPI_Mrecv`, `MPI_Improbe` + `MPI_Imrecv` completed in a `MPI_Waitall`
//! that ignores statuses, `MPI_Sendrecv`, and traffic with `MPI_PROC_NULL`
//! (which is no message and must leave no request unmatched). Recorded with
//! `mpi-observer record` from before the traffic to the job's exit and read
//! back with `python3-otf2`: exactly the program's messages per (sender,
//! receiver), every request event paired, Enter/Leave balanced.
//!
//! Threads (tests/programs/record/threads.c, `MPI_THREAD_MULTIPLE`): each
//! thread's events in a ring of its own, exact per pair; with fewer rings
//! than threads, the events of the threads without one counted as dropped.
//!
//! And recordings one after another of the same ranks
//! (tests/programs/top/busy.c): each a valid, balanced archive with the
//! ranks' traffic, the job's results intact (a thread keeps its ring from
//! one recording to the next).

use std::{collections::BTreeMap, path::Path, process::Command, time::Duration};

use e2e::{
    Job, Mpi, Need, compile, observer_bin, program, require, run_with_timeout, scratch,
    shim_launcher, wait_with_timeout, workspace_root,
};
use serde_json::Value;

/// Starts `record ARGS`; returns it once it printed its `recording` line.
fn start_record(args: &[String]) -> (std::process::Child, std::sync::mpsc::Receiver<String>) {
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

/// python3-otf2 reads the archive in `dir`: the reader's JSON summary.
fn python_read(dir: &Path) -> Value {
    let o = Command::new("/usr/bin/python3")
        .arg(workspace_root().join("observer/src/record/read_otf2.py"))
        .arg(dir.join("traces.otf2"))
        .output()
        .expect("run /usr/bin/python3");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("the reader's JSON")
}

fn matched_receives_are_recorded(mpi: Mpi) {
    if !require(&[
        Need::Mpi(mpi),
        Need::Command("otf2-print"),
        Need::Command("/usr/bin/python3"),
    ]) {
        return;
    }
    let (np, iters) = (3u32, 20u64);
    let dir = scratch(&format!("trace-rings-{}", mpi.name()));
    let exe = dir.join("matched");
    compile(mpi, &program("record/matched.c"), &exe, &[]);
    let mut l = shim_launcher(mpi, np, "stats");
    l.arg(&exe).arg(iters.to_string());
    let job = Job::spawn(l, np, dir.join("go"));
    let out = dir.join("trace");
    let mut args = job.pid_args();
    args.extend(["-o".into(), out.display().to_string()]);
    let (rec, rx) = start_record(&args);
    job.finish("OK");
    let o = wait_with_timeout(rec, Duration::from_secs(120));
    let rest: Vec<String> = rx.try_iter().collect();
    assert_eq!(o.status.code(), Some(0), "{rest:?}");

    let r = python_read(&out);

    let want: BTreeMap<String, u64> = (0..np)
        .map(|s| (format!("{s}->{}", (s + 1) % np), 3 * iters))
        .collect();
    let pairs = |v: &Value| -> BTreeMap<String, u64> {
        v.as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect()
    };
    assert_eq!(pairs(&r["sends"]), want, "send events per pair: {r}");
    assert_eq!(pairs(&r["recvs"]), want, "receive events per pair: {r}");
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

#[test]
fn matched_receives_are_recorded_open_mpi() {
    matched_receives_are_recorded(Mpi::OpenMpi);
}

#[test]
fn matched_receives_are_recorded_mpich() {
    matched_receives_are_recorded(Mpi::Mpich);
}

#[test]
fn recordings_one_after_another() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Mpi(mpi), Need::Command("/usr/bin/python3")]) {
        return;
    }
    let np = 3u32;
    let dir = scratch("trace-rings-again");
    let exe = dir.join("busy");
    compile(mpi, &program("top/busy.c"), &exe, &[]);
    // busy.c stops when its one argument, the job's go file, exists.
    let mut l = shim_launcher(mpi, np, "stats");
    l.arg(&exe);
    let job = Job::spawn(l, np, dir.join("go"));
    for k in 0..3 {
        let out = dir.join(format!("trace{k}"));
        let mut args = job.pid_args();
        args.extend([
            "--duration".into(),
            "1".into(),
            "-o".into(),
            out.display().to_string(),
        ]);
        let o = run_with_timeout(
            Command::new(observer_bin()).arg("record").args(&args),
            Duration::from_secs(60),
        );
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "recording {k}: {err}");
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
    let mpi = Mpi::OpenMpi;
    let np = 2;
    let dir = scratch(name);
    let exe = dir.join("threads");
    compile(mpi, &program("record/threads.c"), &exe, &[]);
    let mut l = shim_launcher(mpi, np, "stats");
    for (k, v) in env {
        l.args(["-x", &format!("{k}={v}")]);
    }
    l.arg(&exe).arg(iters.to_string());
    let job = Job::spawn(l, np, dir.join("go"));
    let out = dir.join("trace");
    let mut args = job.pid_args();
    args.extend(["-o".into(), out.display().to_string()]);
    let (rec, rx) = start_record(&args);
    job.finish("OK");
    let o = wait_with_timeout(rec, Duration::from_secs(120));
    let rest: Vec<String> = rx.try_iter().collect();
    assert_eq!(o.status.code(), Some(0), "{rest:?}");
    python_read(&out)
}

#[test]
fn threads_each_have_a_ring() {
    if !require(&[Need::Mpi(Mpi::OpenMpi), Need::Command("/usr/bin/python3")]) {
        return;
    }
    let iters = 50;
    let r = record_threads("trace-rings-threads", iters, &[]);
    let want: BTreeMap<String, u64> = [
        ("0->1".to_string(), 3 * iters),
        ("1->0".to_string(), 3 * iters),
    ]
    .into();
    let pairs = |v: &Value| -> BTreeMap<String, u64> {
        v.as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect()
    };
    assert_eq!(pairs(&r["sends"]), want, "{r}");
    assert_eq!(pairs(&r["recvs"]), want, "{r}");
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
    if !require(&[Need::Mpi(Mpi::OpenMpi), Need::Command("/usr/bin/python3")]) {
        return;
    }
    let r = record_threads("trace-rings-few", 50, &[("MPI_OBSERVER_TRACE_RINGS", "2")]);
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
