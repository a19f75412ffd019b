use super::*;

fn function(name: &str, calls: u64, time_ns: u64) -> FunctionData {
    let mut hist = vec![0; HIST_SLOTS];
    hist[10] = calls;
    FunctionData {
        name: name.into(),
        calls,
        time_ns,
        bytes_sent: 8 * calls,
        bytes_recv: 0,
        hist,
    }
}

fn rank(r: u32, barrier_ns: u64, stats: bool) -> RankData {
    RankData {
        jobid: "job7".into(),
        uid: None,
        rank: r.to_string(),
        size: "2".into(),
        pid: 100 + r,
        host: "node1".into(),
        library: "openmpi".into(),
        version: "4.1.4".into(),
        since: 1000.0,
        exited: Some(1010.0),
        source: "shim".into(),
        functions: vec![
            function("MPI_Barrier", 1000, barrier_ns),
            function("MPI_Send", 10, 1_000_000),
        ],
        callsites: vec![
            SiteData {
                function: "MPI_Barrier".into(),
                site: "main at two.c:10".into(),
                calls: 300,
                time_ns: barrier_ns / 4,
            },
            SiteData {
                function: "MPI_Barrier".into(),
                site: "main at two.c:20".into(),
                calls: 700,
                time_ns: barrier_ns / 4 * 3,
            },
        ],
        stats: stats.then(|| StatsData {
            peers: vec![PeerData {
                peer: 1 - r,
                messages_sent: 10,
                bytes_sent: 80 + u64::from(r),
                messages_recv: 10,
                bytes_recv: 80,
            }],
            sizes_sent: {
                let mut v = vec![0; HIST_SLOTS];
                v[3] = 10;
                v
            },
            sizes_recv: vec![0; HIST_SLOTS],
        }),
        scheduler: None,
    }
}

fn data() -> Data {
    Data {
        format: FORMAT.into(),
        host: "node1".into(),
        taken: 1011.0,
        ranks: vec![rank(1, 4_000_000_000, true), rank(0, 2_000_000_000, true)],
        waits: Vec::new(),
    }
}

#[test]
fn analysis_has_exact_figures() {
    let reps = analyse(&[data()], Limits::default());
    assert_eq!(reps.len(), 1);
    let r = &reps[0];
    assert_eq!(r.jobid, "job7");
    assert_eq!(
        r.ranks.iter().map(|l| l.rank.as_str()).collect::<Vec<_>>(),
        ["0", "1"]
    );
    assert_eq!(r.ranks[0].wall_seconds, 10.0);
    assert!((r.ranks[1].mpi_percent - 40.01).abs() < 1e-9);
    assert_eq!(r.totals.calls, 2020);
    assert_eq!(r.functions[0].name, "MPI_Barrier");
    assert_eq!(r.functions[0].calls, 2000);
    let s: Vec<(&str, u64, usize)> = r
        .callsites
        .iter()
        .map(|s| (s.site.as_str(), s.calls, s.ranks))
        .collect();
    assert_eq!(
        s,
        [("main at two.c:20", 1400, 2), ("main at two.c:10", 600, 2)]
    );
    let b = &r.imbalance[0];
    assert_eq!((b.name.as_str(), b.max_rank.as_str()), ("MPI_Barrier", "1"));
    assert_eq!((b.min_seconds, b.max_seconds), (2.0, 4.0));
    assert!((b.max_over_mean - 4.0 / 3.0).abs() < 1e-9);
    assert_eq!(r.message_sizes.sent[3], 20);
    assert_eq!(r.matrix_ranks, [0, 1]);
    assert_eq!(r.matrix, [[0, 80], [81, 0]]);
    assert_eq!((r.peer_pairs[0].from, r.peer_pairs[0].bytes), (1, 81));
}

#[test]
fn renderings_carry_the_figures() {
    let reps = analyse(&[data()], Limits::default());
    let t = text::render(&reps);
    assert!(t.contains("job job7 (2 ranks on node1)"), "{t}");
    assert!(t.contains("main at two.c:20"), "{t}");
    assert!(t.contains(" 1400 "), "{t}");
    let j: serde_json::Value = serde_json::from_str(&json(&reps)).unwrap();
    assert_eq!(j["reports"][0]["callsites"][0]["calls"], 1400);
    let h = html::render(&reps);
    assert!(h.contains("data-site=\"main at two.c:20\""));
    assert!(h.contains("data-from=\"1\" data-to=\"0\" data-bytes=\"81\""));
    assert!(h.contains("<svg id=\"mpi-percent\""));
    assert!(!h.contains("<script"), "self-contained, no script");
}

#[test]
fn data_round_trips_and_bad_data_is_refused() {
    let d = data();
    let dir = std::env::temp_dir().join(format!("mpio-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("snap.json");
    d.write(&p).unwrap();
    assert_eq!(Data::read(&p).unwrap(), d);
    std::fs::write(
        &p,
        b"{\"format\":\"other/9\",\"host\":\"x\",\"taken\":0,\"ranks\":[]}",
    )
    .unwrap();
    let e = Data::read(&p).unwrap_err().to_string();
    assert!(e.contains("its format is `other/9`"), "{e}");
    std::fs::write(&p, b"# HELP mpi_calls_total\n").unwrap();
    let e = Data::read(&p).unwrap_err().to_string();
    assert!(e.contains("is not mpi-observer report data"), "{e}");
    assert!(!e.contains('\n'));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_newest_data_of_a_rank_wins() {
    let mut old = data();
    old.taken = 1.0;
    old.ranks[0].functions[0].calls = 1;
    let reps = analyse(&[data(), old], Limits::default());
    assert_eq!(reps[0].totals.calls, 2020);
}

#[test]
fn html_escapes_names() {
    let mut d = data();
    d.ranks[0].callsites[0].site = "<script>x</script>".into();
    let h = html::render(&analyse(&[d], Limits::default()));
    assert!(!h.contains("<script>x"));
    assert!(h.contains("&lt;script&gt;x"));
}

#[test]
fn one_job_id_claimed_by_two_users_is_two_jobs() {
    let mut d = data();
    for r in &mut d.ranks {
        r.uid = Some(0);
    }
    // Another user's process claims the job and rank 0, with figures that
    // would wrap any sum.
    let mut forged = rank(0, u64::MAX, true);
    forged.uid = Some(1001);
    forged.pid = 999;
    forged.functions[0].calls = u64::MAX;
    d.ranks.push(forged);
    let reps = analyse(&[d], Limits::default());
    assert_eq!(reps.len(), 2, "{reps:?}");
    let honest = &reps[0];
    assert_eq!((honest.jobid.as_str(), honest.uid), ("job7", Some(0)));
    assert_eq!(honest.totals.ranks, 2);
    assert_eq!(
        analyse(&[data()], Limits::default())[0].totals.calls,
        honest.totals.calls
    );
    let other = &reps[1];
    assert_eq!((other.totals.ranks, other.uid), (1, Some(1001)));
    assert_eq!(other.totals.calls, u64::MAX, "saturated, not wrapped");
    assert!(text::render(&reps).contains("job job7 of uid 1001 (1 ranks on node1)"));
    // Data without uids (older daemons) still reads and groups by job.
    let old: Data = serde_json::from_str(&serde_json::to_string(&data()).unwrap()).unwrap();
    assert!(old.ranks.iter().all(|r| r.uid.is_none()));
}

#[test]
fn uid_keeps_the_users_own_job_only() {
    let mut d = data();
    for r in &mut d.ranks {
        r.uid = Some(1004);
    }
    // Another user's process claims the victim's job id: its own group,
    // listed first (lower uid).
    let mut forged = rank(0, 5, false);
    forged.uid = Some(1003);
    forged.pid = 999;
    forged.callsites[0].site = "her_secret at her.c:1".into();
    d.ranks.push(forged);
    let all = analyse(&[d], Limits::default());
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].uid, Some(1003), "the claim sorts first");

    let mine = select(all.clone(), Some("job7"), Some(1004)).unwrap();
    assert_eq!(mine.len(), 1);
    assert_eq!((mine[0].uid, mine[0].totals.ranks), (Some(1004), 2));
    let text = text::render(&mine);
    assert!(text.contains("job job7 of uid 1004 (2 ranks"), "{text}");
    assert!(
        !text.contains("uid 1003") && !text.contains("her_secret"),
        "{text}"
    );
    // --uid alone: every job of that user; nothing of hers.
    assert_eq!(select(all.clone(), None, Some(1003)).unwrap().len(), 1);
    // Without either: everything, as before.
    assert_eq!(select(all.clone(), None, None).unwrap().len(), 2);
    // A job of that id run by nobody of that uid is one clear error.
    let e = select(all.clone(), Some("job7"), Some(1005)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "no job `job7` of uid 1005 in the data (jobs there: job7 of uid 1003, job7 of uid 1004); \
         give one of those to --job and its uid to --uid"
    );
    let e = select(all, Some("job8"), None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "no job `job8` in the data (jobs there: job7 of uid 1003, job7 of uid 1004); \
         give one of those to --job"
    );
}

#[test]
fn the_header_names_the_lowest_ranks_scheduler_facts() {
    let mut d = data();
    let facts = |step: &str, task: &str| SchedulerData {
        scheduler: "slurm".into(),
        step: step.into(),
        user: "alice".into(),
        account: "physics".into(),
        partition: "debug".into(),
        array_job: "4".into(),
        array_task: task.into(),
    };
    // Rank 1 comes first in the data; rank 0's facts are the job's.
    d.ranks[0].scheduler = Some(facts("1", "9"));
    d.ranks[1].scheduler = Some(facts("0", "2"));
    let reps = analyse(&[d.clone()], Limits::default());
    assert_eq!(reps[0].scheduler, Some(facts("0", "2")));
    let t = text::render(&reps);
    assert!(
        t.contains(
            "\nScheduler: slurm job job7 step 0, user alice, account physics, partition debug, array job 4 task 2\n"
        ),
        "{t}"
    );
    let j: serde_json::Value = serde_json::from_str(&json(&reps)).unwrap();
    assert_eq!(j["reports"][0]["scheduler"]["partition"], "debug");
    // Absent facts are left out, in the line and in the data.
    d.ranks[1].scheduler = Some(SchedulerData {
        scheduler: "pbs".into(),
        partition: "<b>q</b>".into(),
        ..Default::default()
    });
    let reps = analyse(&[d.clone()], Limits::default());
    assert!(text::render(&reps).contains("\nScheduler: pbs job job7, partition <b>q</b>\n"));
    assert!(
        html::render(&reps).contains("Scheduler: pbs job job7, partition &lt;b&gt;q&lt;/b&gt;")
    );
    let json = serde_json::to_string(&d).unwrap();
    assert!(
        json.contains("\"scheduler\":{\"scheduler\":\"pbs\",\"partition\":\"<b>q</b>\"}"),
        "{json}"
    );
    assert_eq!(Data::parse(json.as_bytes(), "t").unwrap(), d);
    // Without facts, no line.
    assert!(!text::render(&analyse(&[data()], Limits::default())).contains("Scheduler:"));
}

#[test]
fn a_job_of_two_steps_says_each_ranks_step() {
    let step = |s: &str| {
        Some(SchedulerData {
            scheduler: "slurm".into(),
            step: s.into(),
            ..Default::default()
        })
    };
    let mut d = data();
    let (mut second, mut third) = (d.ranks[0].clone(), d.ranks[1].clone());
    d.ranks[0].scheduler = step("0");
    d.ranks[1].scheduler = step("0");
    second.scheduler = step("1");
    second.pid += 100;
    third.scheduler = step("1");
    third.pid += 100;
    d.ranks.extend([second, third]);
    let r = &analyse(&[d.clone()], Limits::default())[0];
    let lines: Vec<(&str, &str)> = r
        .ranks
        .iter()
        .map(|l| (l.rank.as_str(), l.step.as_str()))
        .collect();
    assert_eq!(lines.len(), 4);
    for want in [("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")] {
        assert!(lines.contains(&want), "{want:?} in {lines:?}");
    }
    let t = text::render(std::slice::from_ref(r));
    assert!(t.contains(", step 1"), "{t}");
    assert!(html::render(std::slice::from_ref(r)).contains(", step 0"));
    // One step: no step note.
    d.ranks.truncate(2);
    let r = &analyse(&[d], Limits::default())[0];
    assert!(r.ranks.iter().all(|l| l.step.is_empty()));
    assert!(!text::render(std::slice::from_ref(r)).contains(", step"));
}

/// The daemon's pattern labels, in its order (docs/waits.md).
const PATTERN_LABELS: [&str; 6] = [
    "wait_barrier",
    "wait_nxn",
    "late_broadcast",
    "early_reduce",
    "late_sender",
    "late_receiver",
];

/// Job 7's wait data on `host`: Wait at Barrier `ns`, rank `waiter`
/// waiting for rank `culprit`.
fn waits_on(host: &str, taken: f64, ns: u64, waiter: u32, culprit: u32) -> Data {
    let six = |v: u64| vec![v, 0, 0, 0, 0, 0];
    Data {
        format: FORMAT.into(),
        host: host.into(),
        taken,
        ranks: Vec::new(),
        waits: vec![WaitData {
            jobid: "job7".into(),
            uid: None,
            patterns: PATTERN_LABELS
                .iter()
                .enumerate()
                .map(|(i, p)| PatternWaitData {
                    pattern: (*p).into(),
                    waited_ns: if i == 0 { ns } else { 0 },
                    instances: if i == 0 { 10 } else { 0 },
                })
                .collect(),
            unresolved: vec![CountData {
                reason: "incomplete".into(),
                count: 1,
            }],
            pending: 2,
            records_lost: 0,
            records_invalid: 0,
            sample_period: 1,
            p2p_sample_period: 8,
            ranks: vec![
                RankWaitData {
                    rank: waiter,
                    waited_ns: six(ns),
                    caused_ns: six(0),
                    late_ns: six(0),
                },
                RankWaitData {
                    rank: culprit,
                    waited_ns: six(0),
                    caused_ns: six(ns),
                    late_ns: six(ns),
                },
            ],
            functions: vec![FunctionWaitData {
                function: "MPI_Barrier".into(),
                pattern: "wait_barrier".into(),
                waited_ns: ns,
            }],
            // Across nodes: node2's clock is bound within 0.3 ms.
            clock_uncertainty_ns: (host == "node2").then_some(300_000),
        }],
    }
}

#[test]
fn waits_are_summed_over_nodes_and_split_the_job_time() {
    // Node 1 (the ranks' data, then its waits: 3 s of rank 0 waiting for
    // rank 1, and an older reading of it that must not count); node 2: 1 s
    // of rank 1 waiting for rank 0.
    let reps = analyse(
        &[
            data(),
            waits_on("node1", 1011.0, 3_000_000_000, 0, 1),
            waits_on("node1", 1005.0, 9_000_000_000, 0, 1),
            waits_on("node2", 1011.0, 1_000_000_000, 1, 0),
        ],
        Limits::default(),
    );
    let r = &reps[0];
    let w = r.waits.as_ref().expect("waits");
    assert_eq!(w.seconds, 4.0);
    assert_eq!(w.pattern_seconds("wait_barrier"), 4.0);
    assert_eq!(w.patterns[0].instances, 20);
    assert_eq!(w.unresolved, [("incomplete".to_string(), 2)]);
    assert_eq!((w.pending, w.p2p_sample_period), (4, 8));
    // The largest of the nodes' clock uncertainties, as the text says it.
    assert_eq!(w.clock_uncertainty_ns, Some(300_000));
    assert_eq!(w.clocks(), "; the nodes' clocks agree within ±0.300 ms");
    let waiting: Vec<(u32, f64)> = w.waiting.iter().map(|l| (l.rank, l.seconds)).collect();
    assert_eq!(waiting, [(0, 3.0), (1, 1.0)]);
    let culprits: Vec<(u32, f64)> = w
        .culprits
        .iter()
        .map(|l| (l.rank, l.wait_percent))
        .collect();
    assert_eq!(culprits, [(1, 75.0), (0, 25.0)]);
    // Rank 0's own MPI time is 2.001 s: it waited 3 s of it by the
    // figures (sampled figures may exceed the measured time).
    assert!((w.waiting[0].mpi_percent - 3.0 / 2.001 * 100.0).abs() < 1e-9);
    assert_eq!(w.functions[0].function, "MPI_Barrier");
    assert_eq!(w.functions[0].seconds, 4.0);
    assert!(w.passers.is_empty());
    // The split: 20 s of wall, 6.002 of MPI, 4 of it waiting.
    let s = &r.split;
    assert_eq!(s.wall_seconds, 20.0);
    assert!((s.compute_seconds - 13.998).abs() < 1e-9);
    assert_eq!(s.waiting, [("wait_barrier".to_string(), 4.0)]);
    assert!((s.other_mpi_seconds - 2.002).abs() < 1e-9);
    // The findings name rank 1 first.
    assert_eq!(r.findings[0].ranks, [1]);
    // More waiting than MPI time (sampled): scaled to the MPI time.
    let reps = analyse(
        &[data(), waits_on("node1", 1011.0, 12_004_000_000, 0, 1)],
        Limits::default(),
    );
    let s = &reps[0].split;
    assert!((s.waiting_seconds() - 6.002).abs() < 1e-9, "{s:?}");
    assert!(s.other_mpi_seconds.abs() < 1e-9, "{s:?}");
    // Without wait data: no waits, and the report says so.
    let reps = analyse(&[data()], Limits::default());
    assert!(reps[0].waits.is_none() && reps[0].split.waiting.is_empty());
    assert!(reps[0].findings.iter().any(|f| f.rule == "not_measured"));
    let text = text::render(&reps);
    assert!(text.contains("waiting not measured"), "{text}");
}

#[test]
fn each_nodes_figures_are_read_by_its_own_pattern_labels() {
    // Node 1: a daemon of six patterns, 3 s of rank 0 waiting for rank 1
    // at a barrier. Node 2: its patterns in another order, with its ranks'
    // figures in that order: rank 1's MPI_Ssend waited 2 s for rank 0 to
    // post the receive. Node 3: a daemon of five patterns, before Late
    // Receiver: 1 s more at the barrier.
    let mut node2 = waits_on("node2", 1011.0, 0, 1, 0);
    {
        let w = &mut node2.waits[0];
        w.patterns = vec![
            PatternWaitData {
                pattern: "late_receiver".into(),
                waited_ns: 2_000_000_000,
                instances: 4,
            },
            PatternWaitData {
                pattern: "wait_barrier".into(),
                waited_ns: 0,
                instances: 0,
            },
        ];
        w.ranks[0].waited_ns = vec![2_000_000_000, 0];
        w.ranks[0].caused_ns = vec![0, 0];
        w.ranks[0].late_ns = vec![0, 0];
        w.ranks[1].waited_ns = vec![0, 0];
        w.ranks[1].caused_ns = vec![2_000_000_000, 0];
        w.ranks[1].late_ns = vec![2_000_000_000, 0];
        w.functions = vec![FunctionWaitData {
            function: "MPI_Ssend".into(),
            pattern: "late_receiver".into(),
            waited_ns: 2_000_000_000,
        }];
    }
    let mut node3 = waits_on("node3", 1011.0, 1_000_000_000, 0, 1);
    {
        let w = &mut node3.waits[0];
        w.patterns.truncate(5);
        for r in &mut w.ranks {
            r.waited_ns.truncate(5);
            r.caused_ns.truncate(5);
            r.late_ns.truncate(5);
        }
    }
    let reps = analyse(
        &[
            data(),
            waits_on("node1", 1011.0, 3_000_000_000, 0, 1),
            node2,
            node3,
        ],
        Limits::default(),
    );
    let r = &reps[0];
    let w = r.waits.as_ref().expect("waits");
    let labels: Vec<&str> = w.patterns.iter().map(|p| p.pattern.as_str()).collect();
    assert_eq!(labels, PATTERN_LABELS);
    assert_eq!(w.patterns[5].name, "Late Receiver");
    assert_eq!(w.patterns[5].instances, 4);
    assert_eq!(w.seconds, 6.0);
    assert_eq!(w.pattern_seconds("wait_barrier"), 4.0);
    assert_eq!(w.pattern_seconds("late_receiver"), 2.0);
    let waiting: Vec<(u32, f64, &str)> = w
        .waiting
        .iter()
        .map(|l| (l.rank, l.seconds, l.pattern.as_str()))
        .collect();
    assert_eq!(
        waiting,
        [(0, 4.0, "wait_barrier"), (1, 2.0, "late_receiver")]
    );
    let culprits: Vec<(u32, f64, &str, f64)> = w
        .culprits
        .iter()
        .map(|c| (c.rank, c.seconds, c.pattern.as_str(), c.late_seconds))
        .collect();
    assert_eq!(
        culprits,
        [
            (1, 4.0, "wait_barrier", 4.0),
            (0, 2.0, "late_receiver", 2.0)
        ]
    );
    assert_eq!(
        r.split.waiting,
        [
            ("wait_barrier".to_string(), 4.0),
            ("late_receiver".to_string(), 2.0)
        ]
    );
    let f = r
        .findings
        .iter()
        .find(|f| f.rule == "late_receiver")
        .expect("a Late Receiver finding");
    assert_eq!(
        f.text,
        "2.00 s of waiting (33% of all waiting) is sends waiting for their receivers to post the \
         receive, most in MPI_Ssend."
    );
    let text = text::render(&reps);
    assert!(text.contains("  waiting: Late Receiver"), "{text}");
    assert!(text.contains("MPI_Ssend"), "{text}");
    let html = html::render(&reps);
    assert!(
        html.contains(
            "<tr class=\"pattern\" data-pattern=\"late_receiver\"><td>Late Receiver</td>"
        ),
        "{html}"
    );
    // Its part of the time split has a colour of its own.
    let part = html
        .find("data-part=\"late_receiver\"")
        .map(|i| &html[i..i + html[i..].find("</g>").unwrap()])
        .expect("a Late Receiver part");
    assert!(part.contains("waiting: Late Receiver"), "{part}");
    assert!(part.contains("fill=\"#9c755f\""), "{part}");
}

#[test]
fn the_findings_and_waits_are_rendered() {
    let reps = analyse(
        &[data(), waits_on("node1", 1011.0, 3_000_000_000, 0, 1)],
        Limits::default(),
    );
    let text = text::render(&reps);
    let f = text.find("@--- Findings").expect("findings");
    assert!(f < text.find("@--- MPI time per rank").unwrap(), "{text}");
    assert!(text.contains("\n1. Rank 0 waits 3.00 s"), "{text}");
    // The call waited in, with the site the job spent most of its time in
    // it from.
    assert!(
        text.contains("in MPI_Barrier (called from main at two.c:20), mostly for rank 1"),
        "{text}"
    );
    assert!(text.contains("@--- Wait states"), "{text}");
    assert!(text.contains("Wait at Barrier"), "{text}");
    let html = html::render(&reps);
    assert!(
        html.contains("<li class=\"finding\" data-rule=\"culprit_"),
        "{html}"
    );
    assert!(html.contains("data-ranks=\"1\""));
    assert!(html.contains("<svg id=\"time-split\""));
    assert!(html.contains("<tr class=\"culprit\" data-rank=\"1\">"));
    let json: serde_json::Value = serde_json::from_str(&json(&reps)).unwrap();
    assert_eq!(json["reports"][0]["findings"][0]["ranks"][0], 1);
    assert_eq!(json["reports"][0]["waits"]["culprits"][0]["rank"], 1);
}
