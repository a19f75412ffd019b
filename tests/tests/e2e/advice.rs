//! The report's findings on a real job (issue 37): the demo's own program
//! (xtask/demo/traffic.c: 4 ranks, rank 3 computing eight times as long),
//! run as the demo runs it, under the shim's `stats` layer with every
//! message recorded (`MPI_OBSERVER_WAITS_P2P=1`), on Open MPI and MPICH,
//! observed by a
//! daemon that writes its report data when the job ends. The report's
//! first finding must name rank 3 as the rank the others wait for, in the
//! text, the JSON and the HTML as Chromium renders it, with the time split
//! and the wait states beside it.

use std::{path::Path, process::Command, time::Duration};

use e2e::{
    Daemon, Job, Mpi, Need, compile, observer_bin, rendered_dom, require, run_with_timeout,
    scratch, shim_launcher, signal, wait_for, workspace_root,
};

const NP: u32 = 4;
/// Seconds the job runs: a few hundred steps.
const SECONDS: &str = "6";

fn report(args: &[&str]) -> String {
    let o = run_with_timeout(
        Command::new(observer_bin()).arg("report").args(args),
        Duration::from_secs(60),
    );
    assert!(
        o.status.success(),
        "report {args:?} failed: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Runs the demo's job under `stats`, observed; the report data file.
fn observed_demo_job(mpi: Mpi, dir: &Path) -> std::path::PathBuf {
    let exe = dir.join(format!("traffic-{}", mpi.name()));
    compile(
        mpi,
        &workspace_root().join("xtask/demo/traffic.c"),
        &exe,
        &["-O2", "-g"],
    );
    let snap = dir.join("report.json");
    let _ = std::fs::remove_file(&snap);
    let mut launcher = shim_launcher(mpi, NP, "stats");
    // As the demo runs it: every message recorded, so each wait passed on
    // through a message is followed to its root cause.
    if mpi.is_open_mpi() {
        launcher.args(["-x", "MPI_OBSERVER_WAITS_P2P=1"]);
    } else {
        launcher.args(["-genv", "MPI_OBSERVER_WAITS_P2P", "1"]);
    }
    launcher.arg(&exe).arg(SECONDS);
    // The program ignores the go file Job appends: it starts at once.
    let job = Job::spawn(launcher, NP, dir.join("go"));
    let daemon = Daemon::start(
        &[
            vec![
                "--no-bpf".to_string(),
                "--report-file".to_string(),
                snap.display().to_string(),
            ],
            job.pid_args(),
        ]
        .concat(),
    );
    job.finish("DONE ");
    // Written when the last rank exited.
    wait_for("the report data file", Duration::from_secs(15), || {
        snap.exists().then_some(())
    });
    let _ = daemon.stop(signal::TERM);
    snap
}

fn the_first_finding_names_the_late_rank(mpi: Mpi) {
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("chromium")]) {
        return;
    }
    let dir = scratch(&format!("advice-{}", mpi.name()));
    let snap = observed_demo_job(mpi, &dir);
    let snap_s = snap.to_str().unwrap();
    let what = mpi.name();

    // JSON: the analysis a program reads.
    let j: serde_json::Value =
        serde_json::from_str(&report(&["--format", "json", snap_s])).unwrap();
    let r = &j["reports"][0];
    let first = &r["findings"][0];
    assert!(
        first["rule"].as_str().unwrap().starts_with("culprit"),
        "{what}: the first finding: {first}"
    );
    assert_eq!(first["ranks"], serde_json::json!([3]), "{what}: {first}");
    let w = &r["waits"];
    assert_eq!(w["culprits"][0]["rank"], 3, "{what}: {w}");
    // Rank 3 is the root cause of most of the job's waiting: it is the
    // only rank that computes longer.
    let share = w["culprits"][0]["wait_percent"].as_f64().unwrap();
    assert!(
        share > 50.0,
        "{what}: rank 3 caused {share}% of the waiting"
    );
    // The others waited, rank 3 hardly; the waiting is a real part of the
    // MPI time, never more than all of it.
    let waited = w["seconds"].as_f64().unwrap();
    let mpi_s = r["totals"]["mpi_seconds"].as_f64().unwrap();
    assert!(
        waited > 0.2 * mpi_s && waited < 1.05 * mpi_s,
        "{what}: waited {waited} s of {mpi_s} s in MPI"
    );
    let waiting: Vec<u64> = w["waiting"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["rank"].as_u64().unwrap())
        .collect();
    assert!(
        waiting.iter().take(3).all(|&r| r != 3),
        "{what}: the ranks that waited most: {waiting:?}"
    );
    // Nothing unresolved or lost in a job on one node.
    assert_eq!(w["unresolved"], serde_json::json!([]), "{what}: {w}");
    assert_eq!(w["records_lost"], 0, "{what}");
    // The split adds up: computation + waiting + the rest = wall.
    let s = &r["split"];
    let parts = s["compute_seconds"].as_f64().unwrap()
        + s["waiting"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[1].as_f64().unwrap())
            .sum::<f64>()
        + s["other_mpi_seconds"].as_f64().unwrap();
    let wall = s["wall_seconds"].as_f64().unwrap();
    assert!((parts - wall).abs() < 1e-6 * wall.max(1.0), "{what}: {s}");

    // Text: the findings come first, the first naming rank 3.
    let text = report(&[snap_s]);
    let findings = text
        .split("@--- Findings")
        .nth(1)
        .unwrap_or_else(|| panic!("{what}: no findings in:\n{text}"));
    let line1 = findings.lines().find(|l| l.starts_with("1. ")).unwrap();
    assert!(
        line1.contains("mostly for rank 3 ("),
        "{what}: the first finding: {line1}"
    );
    // The call the ranks wait in, with the line of the demo's source they
    // call it from.
    assert!(
        line1.contains("(called from ") && line1.contains("traffic.c:"),
        "{what}: the first finding names no call site: {line1}"
    );
    // Each call named once, though MPI_Waitall waits under two patterns.
    let named: Vec<&str> = line1
        .split("MPI_")
        .skip(1)
        .filter_map(|c| c.split_once(" (called from ").map(|(f, _)| f))
        .collect();
    let mut once = named.clone();
    once.sort();
    once.dedup();
    assert_eq!(
        once.len(),
        named.len(),
        "{what}: a call named twice: {line1}"
    );
    eprintln!("{what}: {line1}");
    for want in ["@--- Time split", "@--- Wait states"] {
        assert!(text.contains(want), "{what}: {want} in:\n{text}");
    }
    assert!(
        text.find("@--- Findings") < text.find("@--- MPI time per rank"),
        "{what}: the findings before the tables"
    );

    // HTML, as Chromium renders it: the findings list, first naming rank
    // 3, and the time split plot.
    let html = dir.join("report.html");
    report(&["--format", "html", "-o", html.to_str().unwrap(), snap_s]);
    let dom = rendered_dom(&html);
    let at = dom
        .find("<li class=\"finding\"")
        .unwrap_or_else(|| panic!("{what}: no finding in the DOM"));
    let li = &dom[at..at + dom[at..].find("</li>").unwrap()];
    assert!(li.contains("data-ranks=\"3\""), "{what}: {li}");
    assert!(
        dom.contains("<svg id=\"time-split\""),
        "{what}: the time split"
    );
    assert!(dom.contains("class=\"culprit\" data-rank=\"3\""), "{what}");
}

e2e::per_mpi!(
    the_first_finding_names_the_late_rank => the_first_finding_names_the_late_rank: openmpi, mpich
);
