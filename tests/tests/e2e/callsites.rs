//! End-to-end tests of call sites and of `mpi-observer report`: a program
//! of ours (tests/programs/callsites/two_sites.c, built with `-g`) calls
//! MPI_Allreduce from two call sites with known counts; through the probes
//! (`attach --callsites`) and through the shim's `stats` layer (preloaded
//! and injected), the per-site split must be exact. The report made from
//! the daemon's snapshot file and from its live `/report.json` carries the
//! exact figures in text and JSON, and its HTML, opened in headless
//! Chromium, holds them in the rendered DOM.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, compile, free_port, observer_bin, program, rendered_dom,
    require, run_with_timeout, scratch, shim_launcher, signal, sum, wait_for,
};

/// Calls from each site, messages each way.
const A: u64 = 300;
const B: u64 = 700;
const M: u64 = 50;
const NP: u32 = 2;

/// The source line of a call site, found by its mark.
fn line_of(mark: &str) -> usize {
    let src = std::fs::read_to_string(program("callsites/two_sites.c")).unwrap();
    src.lines()
        .position(|l| l.contains(mark))
        .unwrap_or_else(|| panic!("{mark} in two_sites.c"))
        + 1
}

fn site_a() -> String {
    format!("step_a at two_sites.c:{}", line_of("/* SITE_A */"))
}

fn site_b() -> String {
    format!("step_b at two_sites.c:{}", line_of("/* SITE_B */"))
}

/// two_sites.c built for `mpi` with debug information, or stripped.
fn build(mpi: Mpi, dir: &Path, stripped: bool) -> PathBuf {
    let exe = dir.join(format!(
        "two_sites{}-{}",
        if stripped { "-stripped" } else { "" },
        mpi.name()
    ));
    let flag = if stripped { "-s" } else { "-g" };
    compile(mpi, &program("callsites/two_sites.c"), &exe, &[flag]);
    exe
}

/// Starts two_sites on NP ranks, held at its go file; with `with_shim`,
/// the shim and its `stats` layer are preloaded in every rank.
fn start(mpi: Mpi, dir: &Path, exe: &Path, with_shim: bool) -> Job {
    let mut c = if with_shim {
        shim_launcher(mpi, NP, "stats")
    } else {
        mpi.launcher(NP)
    };
    c.arg(exe)
        .args([A.to_string(), B.to_string(), M.to_string()]);
    Job::spawn(c, NP, dir.join(format!("go-{}", std::process::id())))
}

/// Per rank, the named call sites of `function` (not `other`) and their
/// calls, and the calls in `other`.
fn sites(samples: &[Sample], rank: u32, function: &str) -> (BTreeMap<String, u64>, u64) {
    let r = rank.to_string();
    let mut named = BTreeMap::new();
    let mut other = 0;
    for s in samples.iter().filter(|s| {
        s.name == "mpi_callsite_calls_total"
            && s.label("rank") == Some(&r)
            && s.label("function") == Some(function)
    }) {
        let site = s.label("callsite").unwrap().to_string();
        if site == "other" {
            other += s.value as u64;
        } else {
            named.insert(site, s.value as u64);
        }
    }
    (named, other)
}

/// The call-site and naming series of a scrape, one per line, to say why
/// a split is not as expected.
fn naming_figures(samples: &[Sample]) -> String {
    samples
        .iter()
        .filter(|s| {
            s.name.starts_with("mpi_callsite_")
                || s.name.starts_with("mpi_observer_symbolizer")
                || s.name.starts_with("mpi_observer_callsite")
                || s.name == "mpi_observer_user_files_refused_total"
                || s.name == "mpi_observer_map_update_failures_total"
        })
        .map(|s| format!("\n  {}{:?} {}", s.name, s.labels, s.value))
        .collect()
}

/// Asserts the exact split of every rank: A calls from step_a's line, B from
/// step_b's, none elsewhere, time in each, and the sends from main.
fn check_split(samples: &[Sample], what: &str) {
    for rank in 0..NP {
        let calls = sum(
            samples,
            "mpi_calls_total",
            &[("rank", &rank.to_string()), ("function", "MPI_Allreduce")],
        );
        assert_eq!(
            calls as u64,
            A + B,
            "{what} rank {rank}: MPI_Allreduce calls"
        );
        let (named, other) = sites(samples, rank, "MPI_Allreduce");
        let want: BTreeMap<String, u64> = [(site_a(), A), (site_b(), B)].into_iter().collect();
        assert_eq!(
            named,
            want,
            "{what} rank {rank}: MPI_Allreduce's call sites; the naming's figures: {}",
            naming_figures(samples)
        );
        assert_eq!(
            other, 0,
            "{what} rank {rank}: no Allreduce call outside them"
        );
        for site in [site_a(), site_b()] {
            let t = sum(
                samples,
                "mpi_callsite_seconds_total",
                &[
                    ("rank", &rank.to_string()),
                    ("function", "MPI_Allreduce"),
                    ("callsite", &site),
                ],
            );
            assert!(t > 0.0, "{what} rank {rank} {site}: time recorded");
        }
        let (named, _) = sites(samples, rank, "MPI_Send");
        assert_eq!(
            named.values().sum::<u64>(),
            M,
            "{what} rank {rank}: MPI_Send"
        );
        assert!(
            named.keys().all(|k| k.starts_with("main at two_sites.c:")),
            "{what} rank {rank}: {named:?}"
        );
    }
}

/// Scrapes until every rank has exited and no call site waits for its
/// name (`mpi_observer_callsite_names_pending` is 0: every call is in a
/// site's series or in `other`); returns that scrape.
fn final_scrape(d: &mut Daemon) -> Vec<Sample> {
    wait_for(
        "every rank's exit, every call site named",
        Duration::from_secs(120),
        || {
            let (_, s) = d.scrape();
            let ranks = s.iter().filter(|x| x.name == "mpi_rank_up").count();
            let pending = sum(&s, "mpi_observer_callsite_names_pending", &[]);
            (ranks == NP as usize && sum(&s, "mpi_rank_up", &[]) == 0.0 && pending == 0.0)
                .then_some(s)
        },
    )
}

/// Runs the job to its end under a daemon started with `daemon_args` (plus
/// --pid for every rank); returns the final scrape and the daemon.
fn observe(
    mpi: Mpi,
    dir: &Path,
    exe: &Path,
    with_shim: bool,
    daemon_args: &[&str],
) -> (Vec<Sample>, Daemon) {
    let job = start(mpi, dir, exe, with_shim);
    let mut args = job.pid_args();
    args.extend(daemon_args.iter().map(|s| s.to_string()));
    let mut d = Daemon::start(&args);
    if with_shim {
        wait_for("the shim's segments", Duration::from_secs(30), || {
            let (body, _) = d.scrape();
            (body.matches("\nmpi_requests_outstanding{").count() >= NP as usize).then_some(())
        });
    }
    job.finish("OK");
    let samples = final_scrape(&mut d);
    (samples, d)
}

fn probes_split(mpi: Mpi) {
    if !require(&[Need::Root, Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("callsites-probes-{}", mpi.name()));
    let exe = build(mpi, &dir, false);
    // The kernels suite runs this in emulated (TCG) guests, where naming
    // a file the first time takes over the default 2 s.
    let (samples, d) = observe(
        mpi,
        &dir,
        &exe,
        false,
        &["--callsites", "--symbolizer-timeout", "60"],
    );
    check_split(&samples, &format!("{mpi:?} probes"));
    d.stop(signal::INT);
}

e2e::per_mpi!(probes_split_is_exact => probes_split: openmpi, mpich);

#[test]
fn without_the_flag_probes_record_no_call_site() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch("callsites-off");
    let exe = build(mpi, &dir, false);
    let (samples, d) = observe(mpi, &dir, &exe, false, &[]);
    assert_eq!(
        sum(
            &samples,
            "mpi_calls_total",
            &[("function", "MPI_Allreduce")]
        ) as u64,
        2 * (A + B),
        "the calls are counted"
    );
    assert!(
        !samples.iter().any(|s| s.name.starts_with("mpi_callsite_")),
        "no call-site series without --callsites"
    );
    d.stop(signal::INT);
}

fn shim_split(mpi: Mpi) {
    if !require(&[Need::Root, Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("callsites-shim-{}", mpi.name()));
    let exe = build(mpi, &dir, false);
    let (samples, d) = observe(mpi, &dir, &exe, true, &[]);
    check_split(&samples, &format!("{mpi:?} shim"));
    d.stop(signal::INT);
}

e2e::per_mpi!(shim_split_is_exact => shim_split: openmpi, mpich, openmpi5, mpich5_abi);

/// A stripped binary: the two sites are still told apart, named by the
/// object and the return address's offset, and nothing fails.
#[test]
fn a_stripped_binary_falls_back_to_object_and_offset() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch("callsites-stripped");
    let exe = build(mpi, &dir, true);
    let object = exe.file_name().unwrap().to_str().unwrap().to_string();
    for with_shim in [false, true] {
        let args: &[&str] = if with_shim { &[] } else { &["--callsites"] };
        let (samples, d) = observe(mpi, &dir, &exe, with_shim, args);
        for rank in 0..NP {
            let (named, other) = sites(&samples, rank, "MPI_Allreduce");
            let mut calls: Vec<u64> = named.values().copied().collect();
            calls.sort_unstable();
            assert_eq!(calls, [A, B], "shim {with_shim} rank {rank}: {named:?}");
            assert_eq!(other, 0);
            for name in named.keys() {
                assert!(
                    name.starts_with(&format!("{object}+0x")),
                    "shim {with_shim} rank {rank}: {name} names the object and offset"
                );
            }
        }
        d.stop(signal::INT);
    }
}

/// Injected into running ranks: the probes (`--callsites`) count up to the
/// handover, the shim's trampolines, reached through the rewritten slots,
/// after it; the split adds up exactly.
#[test]
fn injected_split_is_exact_openmpi() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch("callsites-inject");
    let exe = build(mpi, &dir, false);
    // No MPI call while held at the go file: the injection's stop point is
    // the first Allreduce.
    let job = start(mpi, &dir, &exe, false);
    let mut args = job.pid_args();
    args.extend(["--inject".to_string(), "--callsites".to_string()]);
    let mut d = Daemon::start(&args);
    job.finish("OK");
    let samples = final_scrape(&mut d);
    let injected = d
        .log()
        .iter()
        .filter(|l| l.contains("injected the shim into pid"))
        .count();
    assert_eq!(injected, NP as usize, "both ranks injected: {:?}", d.log());
    check_split(&samples, "injected");
    d.stop(signal::INT);
}

// ---------------------------------------------------------------------------
// `mpi-observer report`.

fn report(args: &[&str]) -> std::process::Output {
    run_with_timeout(
        Command::new(observer_bin()).arg("report").args(args),
        Duration::from_secs(60),
    )
}

fn ok_stdout(o: &std::process::Output) -> String {
    assert!(
        o.status.success(),
        "report failed: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Checks the exact figures of two_sites' job in the JSON analysis.
fn check_json(j: &serde_json::Value) {
    let r = &j["reports"][0];
    assert_eq!(r["totals"]["ranks"], 2);
    let f = r["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "MPI_Allreduce")
        .expect("MPI_Allreduce in the top functions");
    assert_eq!(f["calls"], 2 * (A + B));
    let sites: BTreeMap<String, (u64, u64)> = r["callsites"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["function"] == "MPI_Allreduce")
        .map(|s| {
            (
                s["site"].as_str().unwrap().to_string(),
                (s["calls"].as_u64().unwrap(), s["ranks"].as_u64().unwrap()),
            )
        })
        .collect();
    let want: BTreeMap<String, (u64, u64)> = [(site_a(), (2 * A, 2)), (site_b(), (2 * B, 2))]
        .into_iter()
        .collect();
    assert_eq!(sites, want, "call sites summed over ranks");
    for l in r["ranks"].as_array().unwrap() {
        let p = l["mpi_percent"].as_f64().unwrap();
        assert!(p > 0.0 && p <= 100.0, "MPI % of rank {}: {p}", l["rank"]);
        assert!(l["wall_seconds"].as_f64().unwrap() >= l["mpi_seconds"].as_f64().unwrap());
    }
    let imb = r["imbalance"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "MPI_Allreduce")
        .expect("imbalance of MPI_Allreduce");
    assert!(imb["min_seconds"].as_f64().unwrap() <= imb["max_seconds"].as_f64().unwrap());
    // 400 B messages (log2 slot 8) from rank 0, 4000 B (slot 11) from rank 1.
    let sent = &r["message_sizes"]["sent"];
    assert_eq!((sent[8].as_u64(), sent[11].as_u64()), (Some(M), Some(M)));
    let recv = &r["message_sizes"]["recv"];
    assert_eq!((recv[8].as_u64(), recv[11].as_u64()), (Some(M), Some(M)));
    let pairs: Vec<(u64, u64, u64, u64)> = r["peer_pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["from"].as_u64().unwrap(),
                p["to"].as_u64().unwrap(),
                p["messages"].as_u64().unwrap(),
                p["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(pairs, [(1, 0, M, 4000 * M), (0, 1, M, 400 * M)]);
    assert_eq!(
        r["matrix"],
        serde_json::json!([[0, 400 * M], [4000 * M, 0]])
    );
}

#[test]
fn report_carries_the_exact_figures() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("chromium")]) {
        return;
    }
    let dir = scratch("report");
    let exe = build(mpi, &dir, false);
    let snap = dir.join("snapshot.json");
    let _ = std::fs::remove_file(&snap);
    let (_, d) = observe(
        mpi,
        &dir,
        &exe,
        true,
        &["--report-file", snap.to_str().unwrap()],
    );
    // Written when the last rank exited.
    wait_for("the snapshot file", Duration::from_secs(10), || {
        snap.exists().then_some(())
    });
    let snap_s = snap.to_str().unwrap();

    // Text, from the file.
    let text = ok_stdout(&report(&[snap_s]));
    for want in [
        "@--- MPI time per rank",
        "@--- Top functions",
        "@--- Top call sites",
        "@--- Imbalance",
        "@--- Message sizes",
        "@--- Busiest peer pairs",
    ] {
        assert!(text.contains(want), "{want} in:\n{text}");
    }
    let line = |site: &str| {
        text.lines()
            .find(|l| l.starts_with("MPI_Allreduce") && l.contains(site))
            .unwrap_or_else(|| panic!("{site} in:\n{text}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    // Function, the site's words, calls, time, mean, ranks.
    let a = line(&site_a());
    assert_eq!(a[a.len() - 4], (2 * A).to_string(), "{a:?}");
    assert_eq!(a[a.len() - 1], "2");
    let b = line(&site_b());
    assert_eq!(b[b.len() - 4], (2 * B).to_string(), "{b:?}");
    let pair = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.len() == 4 && w[0] == "1" && w[1] == "0")
        .expect("the 1 -> 0 pair");
    assert_eq!(pair[2..], [M.to_string(), (4000 * M).to_string()]);

    // JSON, from the file and from the live daemon: the same figures.
    let from_file: serde_json::Value =
        serde_json::from_str(&ok_stdout(&report(&["--format", "json", snap_s]))).unwrap();
    check_json(&from_file);
    let url = format!("http://{}", d.addr);
    let live: serde_json::Value =
        serde_json::from_str(&ok_stdout(&report(&["--format", "json", "--url", &url]))).unwrap();
    check_json(&live);

    // HTML, rendered by Chromium.
    let html = dir.join("report.html");
    ok_stdout(&report(&[
        "--format",
        "html",
        "-o",
        html.to_str().unwrap(),
        snap_s,
    ]));
    let dom = rendered_dom(&html);
    for (site, calls) in [(site_a(), 2 * A), (site_b(), 2 * B)] {
        let at = dom
            .find(&format!("data-site=\"{site}\""))
            .unwrap_or_else(|| panic!("{site} in the DOM"));
        let row = &dom[at..at + dom[at..].find("</tr>").unwrap()];
        assert!(
            row.contains(&format!("<td class=\"n calls\">{calls}</td>")),
            "{calls} calls in {row}"
        );
    }
    assert!(dom.contains("<svg id=\"mpi-percent\""), "the MPI % plot");
    assert_eq!(
        dom.matches("class=\"bar\" data-rank=").count(),
        2,
        "one bar per rank"
    );
    assert!(dom.contains("class=\"plot latency\""), "latency histograms");
    assert!(
        dom.contains(&format!(
            "data-from=\"1\" data-to=\"0\" data-bytes=\"{}\"",
            4000 * M
        )),
        "the heatmap's cell 1 -> 0"
    );
    assert!(
        dom.contains(&format!("data-from=\"2KiB\" data-count=\"{M}\"")),
        "the size histogram's 4000 B bin"
    );
    d.stop(signal::INT);
}

#[test]
fn report_bad_input_is_one_line() {
    let dir = scratch("report-bad");
    let one_line = |o: std::process::Output, want: &str| {
        assert_eq!(o.status.code(), Some(1), "exit status");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains(want), "{want} in {err}");
        assert!(o.stdout.is_empty());
    };
    one_line(
        report(&[dir.join("nope.json").to_str().unwrap()]),
        "cannot read the report snapshot",
    );
    let metrics = dir.join("metrics.txt");
    std::fs::write(&metrics, "# HELP mpi_calls_total x\nmpi_calls_total 1\n").unwrap();
    one_line(
        report(&[metrics.to_str().unwrap()]),
        "is not mpi-observer report data",
    );
    let closed = format!("http://127.0.0.1:{}", free_port());
    one_line(report(&["--url", &closed]), "no answer from");
    one_line(report(&[]), "give a snapshot file");
    one_line(report(&["--url", "https://127.0.0.1:1"]), "give --ca-file");
    // Something that is not an observer: a server answering garbage.
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        use std::io::Write as _;
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.2\r\n");
        }
    });
    one_line(
        report(&["--url", &format!("http://{addr}")]),
        "that is not HTTP",
    );
}
