use super::*;
use serde_json::Value;
use std::process::Command;

/// A fresh directory under the system's temporary directory.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mpi-observer-otf2-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Whether a tool the test needs is here. Under CI it must be: a missing
/// tool fails the test instead of skipping it.
fn have(what: &str, probe: &mut Command) -> bool {
    let ok = probe.output().is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{what} is missing (cargo xtask setup installs it)");
        }
        eprintln!("skipped: {what} is missing");
    }
    ok
}

fn have_otf2_print() -> bool {
    have(
        "otf2-print (Debian otf2-tools)",
        Command::new("otf2-print").arg("--version"),
    )
}

fn have_python_otf2() -> bool {
    have(
        "python3-otf2 (Debian python3-otf2)",
        Command::new("/usr/bin/python3").args(["-c", "import otf2"]),
    )
}

/// `otf2-print` on the archive: it must read it whole; returns its output.
fn otf2_print(anchor: &Path) -> String {
    let out = Command::new("otf2-print")
        .arg(anchor)
        .output()
        .expect("otf2-print runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "otf2-print failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The independent reader's summary of the archive.
fn read_otf2(anchor: &Path) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/record/read_otf2.py");
    let out = Command::new("/usr/bin/python3")
        .arg(script)
        .arg(anchor)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "read_otf2.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("read_otf2.py prints JSON")
}

/// Lines of otf2-print's event listing that start with this record name.
fn records(printed: &str, name: &str) -> usize {
    printed
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(name))
        .count()
}

const SEND: u32 = 0;
const RECV: u32 = 1;
const ISEND: u32 = 2;
const IRECV: u32 = 3;
const WAIT: u32 = 4;
const ALLREDUCE: u32 = 5;
const BCAST: u32 = 6;

fn regions() -> Vec<RegionDef> {
    [
        ("MPI_Send", RegionRole::Point2Point),
        ("MPI_Recv", RegionRole::Point2Point),
        ("MPI_Isend", RegionRole::Point2Point),
        ("MPI_Irecv", RegionRole::Point2Point),
        ("MPI_Wait", RegionRole::Function),
        ("MPI_Allreduce", RegionRole::CollAll2All),
        ("MPI_Bcast", RegionRole::CollOne2All),
    ]
    .into_iter()
    .map(|(name, role)| RegionDef {
        name: name.to_string(),
        role,
    })
    .collect()
}

/// Writes one call: Enter, the events inside, Leave, 10 ns apart.
fn call(a: &mut Archive, rank: u32, thread: u32, t: &mut u64, region: u32, inner: &[Event]) {
    let mut at = |a: &mut Archive, ev: Event| {
        *t += 10;
        a.event(rank, thread, *t, &ev).unwrap();
    };
    at(a, Event::Enter { region });
    for &ev in inner {
        at(a, ev);
    }
    at(a, Event::Leave { region });
}

/// Two ranks on two hosts, MPI_COMM_WORLD and a communicator whose rank
/// order is reversed, blocking, nonblocking and a second thread's
/// traffic, two collectives, dropped events and one late timestamp: what
/// `otf2-print` and python3-otf2 find is what was written.
#[test]
fn archive_reads_back_in_two_independent_readers() {
    let dir = scratch("full");
    let mut a = Archive::create(&dir, "trace", "mpi-observer test", regions()).unwrap();
    a.set_property("MPI_OBSERVER::TEST", "yes").unwrap();
    a.add_rank(RankDef {
        rank: 0,
        node: "node-a".into(),
        pid: 100,
    })
    .unwrap();
    a.add_rank(RankDef {
        rank: 1,
        node: "node-b".into(),
        pid: 200,
    })
    .unwrap();
    a.add_comm(CommDef {
        id: 0,
        name: "MPI_COMM_WORLD".into(),
        world_ranks: vec![0, 1],
    })
    .unwrap();
    // Its rank 0 is world rank 1 and its rank 1 is world rank 0.
    const REV: u32 = 7;

    let (mut t0, mut t1, mut t1b) = (1_000, 1_005, 1_007);
    // Rank 0 → rank 1: three blocking sends on MPI_COMM_WORLD.
    for i in 0..3 {
        let send = Event::MpiSend {
            receiver: 1,
            comm: 0,
            tag: i,
            len: 8,
        };
        call(&mut a, 0, 0, &mut t0, SEND, &[send]);
        let recv = Event::MpiRecv {
            sender: 0,
            comm: 0,
            tag: i,
            len: 8,
        };
        call(&mut a, 1, 0, &mut t1, RECV, &[recv]);
    }
    // Rank 1 → rank 0: two Isends on REV (its rank 1 = world 0), received
    // by two Irecvs whose source is REV rank 0 (= world 1).
    for request in [11, 12] {
        let isend = Event::MpiIsend {
            receiver: 1,
            comm: REV,
            tag: 5,
            len: 1000,
            request,
        };
        call(&mut a, 1, 0, &mut t1, ISEND, &[isend]);
        call(
            &mut a,
            0,
            0,
            &mut t0,
            IRECV,
            &[Event::MpiIrecvRequest {
                request: request + 100,
            }],
        );
    }
    for request in [11, 12] {
        let done = [
            Event::MpiRequestTest { request },
            Event::MpiIsendComplete { request },
        ];
        call(&mut a, 1, 0, &mut t1, WAIT, &done);
        let irecv = Event::MpiIrecv {
            sender: 0,
            comm: REV,
            tag: 5,
            len: 1000,
            request: request + 100,
        };
        call(&mut a, 0, 0, &mut t0, WAIT, &[irecv]);
    }
    // The comm is defined after its first use, as the caller may learn of
    // it late.
    a.add_comm(CommDef {
        id: REV,
        name: "reversed".into(),
        world_ranks: vec![1, 0],
    })
    .unwrap();
    // Rank 1's second thread → rank 0, blocking.
    let send = Event::MpiSend {
        receiver: 1,
        comm: REV,
        tag: 9,
        len: 4,
    };
    call(&mut a, 1, 1, &mut t1b, SEND, &[send]);
    let recv = Event::MpiRecv {
        sender: 1,
        comm: 0,
        tag: 9,
        len: 4,
    };
    call(&mut a, 0, 0, &mut t0, RECV, &[recv]);
    // Collectives: Allreduce on the world, Bcast on REV from its rank 0.
    for (rank, t) in [(0, &mut t0), (1, &mut t1)] {
        let end = Event::MpiCollectiveEnd {
            op: CollectiveOp::Allreduce,
            comm: 0,
            root: None,
            sent: 8,
            received: 8,
        };
        call(
            &mut a,
            rank,
            0,
            t,
            ALLREDUCE,
            &[Event::MpiCollectiveBegin, end],
        );
        let end = Event::MpiCollectiveEnd {
            op: CollectiveOp::Bcast,
            comm: REV,
            root: Some(0),
            sent: if rank == 1 { 64 } else { 0 },
            received: if rank == 1 { 0 } else { 64 },
        };
        call(&mut a, rank, 0, t, BCAST, &[Event::MpiCollectiveBegin, end]);
    }
    // Rank 1 dropped 5, then 12 in all.
    a.dropped(1, t1 + 1, 5).unwrap();
    a.dropped(1, t1 + 2, 12).unwrap();
    // A timestamp from the past is written at the last one, not refused.
    a.event(0, 0, 10, &Event::Enter { region: WAIT }).unwrap();
    a.event(0, 0, t0 + 10, &Event::Leave { region: WAIT })
        .unwrap();
    let last = t0 + 10;

    let epoch = 1_700_000_000_000_000_000;
    let s = a.finish(epoch).unwrap();
    assert_eq!(s.anchor, dir.join("trace.otf2"));
    assert_eq!(s.clamped, 1);
    assert_eq!(s.dropped, BTreeMap::from([(1, 12)]));
    assert!(
        s.unrecorded_ranks.is_empty() && s.undefined_comms.is_empty(),
        "{s:?}"
    );
    // call() steps 10 ns before each event.
    assert_eq!(s.span_ns, Some((1_010, last.max(t1 + 2))));
    // Rank 0: 3 sends (3 each), 2 Irecv posts (3), 2 waits (3), 1 recv
    // (3), 2 collectives (4 each), 2 late (1 each).
    assert_eq!(s.events[&0], 9 + 6 + 6 + 3 + 8 + 2);
    // Rank 1: 3 recvs, 2 Isends, 2 waits (4 each), 1 send on thread 1,
    // 2 collectives.
    assert_eq!(s.events[&1], 9 + 6 + 8 + 3 + 8);

    if have_otf2_print() {
        let printed = otf2_print(&s.anchor);
        assert_eq!(records(&printed, "MPI_SEND"), 4, "{printed}");
        assert_eq!(records(&printed, "MPI_RECV"), 4);
        assert_eq!(records(&printed, "MPI_ISEND"), 2);
        assert_eq!(records(&printed, "MPI_ISEND_COMPLETE"), 2);
        assert_eq!(records(&printed, "MPI_IRECV_REQUEST"), 2);
        assert_eq!(records(&printed, "MPI_IRECV"), 2);
        assert_eq!(records(&printed, "MPI_REQUEST_TEST"), 2);
        assert_eq!(records(&printed, "MPI_COLLECTIVE_BEGIN"), 4);
        assert_eq!(records(&printed, "MPI_COLLECTIVE_END"), 4);
        assert_eq!(records(&printed, "METRIC"), 2);
        assert_eq!(records(&printed, "ENTER"), records(&printed, "LEAVE"));
    }
    if have_python_otf2() {
        let r = read_otf2(&s.anchor);
        let rank = |n: &str| &r["ranks"][n];
        assert_eq!(rank("0")["name"], "MPI Rank 0", "{r}");
        assert_eq!(rank("1")["name"], "MPI Rank 1");
        assert_eq!(rank("0")["node"], "node-a");
        assert_eq!(rank("1")["node"], "node-b");
        assert_eq!(rank("0")["pid"], 100);
        assert_eq!(rank("1")["pid"], 200);
        assert_eq!(rank("1")["threads"]["Thread 1"], 3);
        // The reader counts the two metric records too.
        assert_eq!(rank("0")["events"], s.events[&0]);
        assert_eq!(rank("1")["events"], s.events[&1] + 2);
        assert_eq!(r["events"], s.events[&0] + s.events[&1] + 2);
        // Peers resolved to world ranks through each communicator.
        assert_eq!(r["sends"], serde_json::json!({"0->1": 3, "1->0": 3}));
        assert_eq!(r["recvs"], serde_json::json!({"0->1": 3, "1->0": 3}));
        assert_eq!(
            r["send_bytes"],
            serde_json::json!({"0->1": 24, "1->0": 2004})
        );
        assert_eq!(r["recv_bytes"], r["send_bytes"]);
        assert_eq!(
            r["requests"],
            serde_json::json!({"isend": 2, "isend_complete": 2, "irecv_request": 2, "irecv": 2,
                               "cancelled": 0, "test": 2, "unmatched": 0})
        );
        assert_eq!(
            r["collectives"],
            serde_json::json!({"ALLREDUCE": 2, "BCAST": 2})
        );
        assert_eq!(r["collective_begin"], 4);
        assert_eq!(
            r["comms"],
            serde_json::json!({"MPI_COMM_WORLD": [0, 1], "reversed": [1, 0]})
        );
        assert_eq!(r["enter_leave_balanced"], true, "{}", r["unbalanced"]);
        assert_eq!(r["monotonic"], true);
        assert_eq!(r["in_clock_range"], true);
        assert_eq!(r["declared_events_match"], true);
        assert_eq!(r["dropped"], serde_json::json!({"1": 12}));
        assert_eq!(r["regions"]["MPI_Send"], 4);
        // Score-P's convention, which Scalasca's region classes read.
        assert_eq!(r["region_files"], serde_json::json!(["MPI"]));
        let clock = &r["clock"];
        assert_eq!(clock["timer_resolution"], 1_000_000_000);
        assert_eq!(clock["global_offset"], 1_010);
        assert_eq!(clock["trace_length"], last.max(t1 + 2) - 1_010);
        assert_eq!(clock["realtime_timestamp"], epoch + 1_010);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// No events at all, and a job where only one rank of three was recorded
/// while another was declared without events: both archives are whole.
#[test]
fn empty_ranks_still_make_a_valid_archive() {
    let dir = scratch("empty");
    let s = Archive::create(&dir, "none", "test", regions())
        .unwrap()
        .finish(0)
        .unwrap();
    assert!(s.events.is_empty() && s.span_ns.is_none());
    assert_eq!(s.unrecorded_ranks, [0]);

    let mut a = Archive::create(&dir, "sparse", "test", regions()).unwrap();
    a.add_comm(CommDef {
        id: 0,
        name: "MPI_COMM_WORLD".into(),
        world_ranks: vec![0, 1, 2],
    })
    .unwrap();
    a.add_rank(RankDef {
        rank: 0,
        node: "n".into(),
        pid: 1,
    })
    .unwrap();
    let mut t = 0;
    call(&mut a, 1, 0, &mut t, BCAST, &[]);
    let sparse = a.finish(0).unwrap();
    assert_eq!(sparse.unrecorded_ranks, [2]);
    assert_eq!(sparse.events, BTreeMap::from([(0, 0), (1, 2)]));

    if have_otf2_print() {
        otf2_print(&s.anchor);
        let printed = otf2_print(&sparse.anchor);
        assert_eq!(records(&printed, "ENTER"), 1);
    }
    if have_python_otf2() {
        let r = read_otf2(&s.anchor);
        assert_eq!(r["events"], 0, "{r}");
        assert_eq!(r["ranks"]["0"]["events"], 0);
        assert_eq!(r["clock"]["trace_length"], 0);
        let r = read_otf2(&sparse.anchor);
        assert_eq!(r["events"], 2, "{r}");
        assert_eq!(r["ranks"]["0"]["events"], 0);
        assert_eq!(r["ranks"]["1"]["node"], Value::Null);
        assert_eq!(r["ranks"]["2"]["name"], "MPI Rank 2");
        assert_eq!(r["comms"]["MPI_COMM_WORLD"], serde_json::json!([0, 1, 2]));
        assert_eq!(r["enter_leave_balanced"], true);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An archive dropped without finish (the caller failed half-way) is
/// still closed whole, with communicators it never defined.
#[test]
fn a_dropped_archive_is_closed_valid() {
    let dir = scratch("drop");
    let anchor = {
        let mut a = Archive::create(&dir, "trace", "test", regions()).unwrap();
        let mut t = 5;
        let send = Event::MpiSend {
            receiver: 0,
            comm: 3,
            tag: 0,
            len: 1,
        };
        call(&mut a, 0, 0, &mut t, SEND, &[send]);
        a.anchor().to_path_buf()
    };
    if have_otf2_print() {
        assert_eq!(records(&otf2_print(&anchor), "MPI_SEND"), 1);
    }
    if have_python_otf2() {
        let r = read_otf2(&anchor);
        assert_eq!(r["clock"]["realtime_timestamp"], Value::Null, "{r}");
        assert_eq!(r["comms"]["comm 3 (undefined)"], serde_json::json!([]));
        // A peer in a communicator nobody defined cannot be resolved.
        assert_eq!(r["sends"], serde_json::json!({"0->?": 1}));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Enough events to fill many event chunks (OTF2 flushes each one as it
/// fills), on many threads.
#[test]
fn many_events_span_many_chunks() {
    let dir = scratch("many");
    let mut a = Archive::create(&dir, "trace", "test", regions()).unwrap();
    let per_thread = 40_000;
    for rank in 0..2 {
        for thread in 0..3 {
            let mut t = 0;
            for _ in 0..per_thread / 2 {
                call(&mut a, rank, thread, &mut t, WAIT, &[]);
            }
        }
    }
    let s = a.finish(0).unwrap();
    assert_eq!(
        s.events,
        BTreeMap::from([(0, 3 * per_thread), (1, 3 * per_thread)])
    );
    let size: u64 = std::fs::read_dir(dir.join("trace"))
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    assert!(
        size > 2 * sys::OTF2_CHUNK_SIZE_EVENTS_DEFAULT,
        "{size} bytes"
    );
    if have_otf2_print() {
        let printed = otf2_print(&s.anchor);
        assert_eq!(records(&printed, "LEAVE"), 6 * per_thread as usize / 2);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Bad places and bad input get one clear line each, and nothing already
/// there is overwritten.
#[test]
fn bad_places_and_input_are_refused_in_one_line() {
    let dir = scratch("bad");
    Archive::create(&dir, "trace", "test", Vec::new())
        .unwrap()
        .finish(0)
        .unwrap();
    let anchor = dir.join("trace.otf2");
    let before = std::fs::read(&anchor).unwrap();
    let e = Archive::create(&dir, "trace", "test", Vec::new())
        .err()
        .unwrap();
    let line = crate::one_line(&e);
    assert!(matches!(e, ArchiveError::Exists { .. }), "{line}");
    assert_eq!(
        line,
        format!(
            "{} already exists: refusing to overwrite a trace; choose another directory",
            anchor.display()
        )
    );
    assert_eq!(std::fs::read(&anchor).unwrap(), before);
    // A leftover trace directory alone is refused too.
    std::fs::create_dir(dir.join("other")).unwrap();
    let e = Archive::create(&dir, "other", "test", Vec::new())
        .err()
        .unwrap();
    assert!(matches!(e, ArchiveError::Exists { .. }), "{e}");

    let file = dir.join("a-file");
    std::fs::write(&file, "").unwrap();
    let e = Archive::create(&file.join("sub"), "trace", "test", Vec::new())
        .err()
        .unwrap();
    let line = crate::one_line(&e);
    assert!(
        line.starts_with(&format!(
            "cannot create the trace directory {}/sub: ",
            file.display()
        )),
        "{line}"
    );
    assert!(!line.contains('\n'));

    let e = Archive::create(&dir, "a/b", "test", Vec::new())
        .err()
        .unwrap();
    assert!(matches!(e, ArchiveError::BadName { .. }), "{e}");

    // Root may write anywhere; others meet a read-only directory.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        let ro = dir.join("ro");
        std::fs::create_dir(&ro).unwrap();
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o500)).unwrap();
        let e = Archive::create(&ro, "trace", "test", Vec::new())
            .err()
            .unwrap();
        assert!(matches!(e, ArchiveError::NotWritable { .. }), "{e}");
    }

    // A failure inside OTF2 (its files vanished under it) is one line
    // too, with OTF2's own words, and still closes what it can.
    let mut a = Archive::create(&dir, "gone", "test", regions()).unwrap();
    a.event(0, 0, 1, &Event::MpiCollectiveBegin).unwrap();
    std::fs::remove_dir(dir.join("gone")).unwrap();
    let e = a.finish(0).unwrap_err();
    let line = crate::one_line(&e);
    assert!(matches!(e, ArchiveError::Otf2 { .. }), "{line}");
    let evt = dir.join("gone/0.evt");
    assert!(
        line.starts_with(&format!(
            "cannot write the OTF2 archive {}: ",
            dir.join("gone.otf2").display()
        )) && line.contains(&format!("'{}'", evt.display()))
            && line.ends_with(" (in OTF2_Archive_CloseEvtWriter)"),
        "{line}"
    );

    let mut a = Archive::create(&dir, "input", "test", regions()).unwrap();
    let e = a.event(0, 0, 1, &Event::Enter { region: 99 }).unwrap_err();
    assert_eq!(
        e.to_string(),
        "region 99 is not defined: the archive has 7 regions"
    );
    let e = a
        .event(MAX_RANKS, 0, 1, &Event::MpiCollectiveBegin)
        .unwrap_err();
    assert!(matches!(e, ArchiveError::RankOutOfRange { .. }), "{e}");
    let comm = |id, world_ranks| CommDef {
        id,
        name: "c".into(),
        world_ranks,
    };
    let e = a.add_comm(comm(0, vec![1, 0])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "bad communicator 0 (c): id 0 is MPI_COMM_WORLD, whose rank i is world rank i"
    );
    let e = a.add_comm(comm(4, vec![2, 2])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "bad communicator 4 (c): world rank 2 is listed twice"
    );
    a.finish(0).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
