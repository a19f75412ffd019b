//! End-to-end test of "no job is missed" (issue 26): 100 jobs of 0.2 to 1 s
//! each, Open MPI and MPICH mixed, a few at a time, under one `attach
//! --all` that is not scraped while they run. After the last one, one
//! scrape and the report data must hold every rank of every job with its
//! exact calls: through the probes (eBPF), and through the shim's `stats`
//! layer under `--no-bpf`, where a rank's segment must reach the daemon
//! even if it exits before any scrape (docs/shim.md, "Exit handover").
//!
//! Probes count the calls made after they are attached, so each probed
//! job's ranks wait, before their calls, until the daemon has said it
//! attached them: found by their exec, or by the scan, however long a
//! loaded machine makes that (within a minute). A fixed head start of
//! 300 ms was not enough beside a heavy compile: one rank of 200 was
//! attached 510 ms after its job's other rank, and one not before its job
//! ended.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, assert_no_probes_left, compile, program, require, scratch,
    shim_launcher, signal, sum, wait_for, wait_with_timeout,
};

/// Jobs per mode.
const JOBS: usize = 100;
/// Jobs running at once.
const AT_ONCE: usize = 4;
/// Ranks per job.
const NP: u32 = 2;
/// What each rank of short.c calls, and how often.
const CALLS: [(&str, u64); 2] = [("MPI_Barrier", 7), ("MPI_Allreduce", 11)];

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// The probes, no shim.
    Ebpf,
    /// `--no-bpf` and the shim's `stats` layer.
    Shim,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Ebpf => "ebpf",
            Mode::Shim => "shim",
        }
    }
}

/// Job `i`'s launcher command: its library alternates, its id is in
/// SLURM_JOB_ID (so each job has a `jobid` of its own), its ranks wait
/// 150 to 850 ms after MPI_Init (probes: after their go file) before their
/// calls. With the shim, ranks knock at `socket` at exit.
fn job(mode: Mode, i: usize, exes: &[(Mpi, PathBuf); 2], socket: &Path) -> Command {
    let (mpi, exe) = &exes[i % 2];
    let mut c = match mode {
        Mode::Ebpf => mpi.launcher(NP),
        Mode::Shim => shim_launcher(*mpi, NP, "stats"),
    };
    let mut vars = vec![("SLURM_JOB_ID", jobid(mode, i))];
    if mode == Mode::Shim {
        vars.push((
            "MPI_OBSERVER_HANDOVER_SOCKET",
            socket.to_str().unwrap().into(),
        ));
    }
    for (k, v) in vars {
        if mpi.is_open_mpi() {
            c.args(["-x", &format!("{k}={v}")]);
        } else {
            c.args(["-genv", k, &v]);
        }
    }
    c.arg(exe).arg((150 + (i * 53) % 700).to_string());
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

/// The go file of probed job `i`.
fn go_file(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("go-{i}"))
}

/// Runs probed jobs `batch` at once: each rank waits until the daemon says
/// it attached it, then makes its calls.
fn probed_batch(daemon: &Daemon, dir: &Path, batch: &[usize], exes: &[(Mpi, PathBuf); 2]) {
    let socket = dir.join("unused.sock");
    let jobs: Vec<(usize, Job)> = batch
        .iter()
        .map(|&i| {
            let c = job(Mode::Ebpf, i, exes, &socket);
            (i, Job::spawn(c, NP, go_file(dir, i)))
        })
        .collect();
    for (i, j) in &jobs {
        for pid in j.pids() {
            let said = format!("attached to pid {pid} (");
            wait_for(
                &format!("the daemon to attach rank pid {pid} of job {i}"),
                Duration::from_secs(60),
                || daemon.log().iter().any(|l| l.contains(&said)).then_some(()),
            );
        }
        j.go();
    }
    for (_, j) in jobs {
        j.finish("OK ");
    }
}

fn jobid(mode: Mode, i: usize) -> String {
    format!("short-{}-{i}", mode.name())
}

/// The jobs (of `JOBS`) whose every rank has exactly [`CALLS`], by `calls`
/// (jobid, rank, function) → calls.
fn exact_jobs(mode: Mode, calls: impl Fn(&str, u32, &str) -> u64) -> Vec<usize> {
    (0..JOBS)
        .filter(|&i| {
            let id = jobid(mode, i);
            (0..NP).all(|r| CALLS.iter().all(|(f, n)| calls(&id, r, f) == *n))
        })
        .collect()
}

fn run(mode: Mode) {
    let mut needs = vec![Need::Mpi(Mpi::OpenMpi), Need::Mpi(Mpi::Mpich)];
    if mode == Mode::Ebpf {
        needs.extend([Need::Root, Need::Command("bpftool")]);
    }
    if !require(&needs) {
        return;
    }
    let dir = scratch(&format!("shortjobs-{}", mode.name()));
    let exes = [Mpi::OpenMpi, Mpi::Mpich].map(|mpi| {
        let exe = dir.join(format!("short-{}", mpi.name()));
        compile(mpi, &program("shortjobs/short.c"), &exe, &[]);
        (mpi, exe)
    });
    let report = dir.join("report.json");
    let mut args: Vec<String> = ["--all", "--retain-exited", "3600", "--report-file"]
        .map(String::from)
        .into();
    args.push(report.to_str().unwrap().into());
    // A socket of the test's own (the default one, in /run, is shared by
    // every daemon on the machine).
    let socket = dir.join("handover.sock");
    args.extend(["--handover-socket".into(), socket.to_str().unwrap().into()]);
    // The default budgets: 200 ranks retained for an hour fit in them
    // because an exited rank's map entries are freed once its figures are
    // kept (the default per-user budget, 25,600 entries here, is about
    // 100 live ranks).
    if let Mode::Shim = mode {
        args.push("--no-bpf".into());
    }
    let mut daemon = Daemon::start(&args);

    // No scrape from here until every job has ended.
    for batch in (0..JOBS).collect::<Vec<_>>().chunks(AT_ONCE) {
        if mode == Mode::Ebpf {
            probed_batch(&daemon, &dir, batch, &exes);
            continue;
        }
        let children: Vec<_> = batch
            .iter()
            .map(|&i| {
                (
                    i,
                    job(mode, i, &exes, &socket).spawn().expect("start a job"),
                )
            })
            .collect();
        for (i, c) in children {
            let o = wait_with_timeout(c, Duration::from_secs(60));
            assert!(
                o.status.success(),
                "job {i} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }

    // The scrape after the jobs: every one of them is in it, exact.
    let s: Vec<Sample> = daemon.final_scrape();
    let scraped = exact_jobs(mode, |id, r, f| {
        sum(
            &s,
            "mpi_calls_total",
            &[("jobid", id), ("rank", &r.to_string()), ("function", f)],
        ) as u64
    });
    let (status, log) = daemon.stop_and_log(signal::TERM);
    assert!(status.success(), "daemon exit on TERM: {status}");
    if mode == Mode::Ebpf {
        assert_no_probes_left();
    }

    // The report data written at shutdown: every job, exact.
    let data: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("the report data")).unwrap();
    let mut calls: BTreeMap<(String, u32, String), u64> = BTreeMap::new();
    for r in data["ranks"].as_array().expect("ranks") {
        let (Some(id), Some(rank)) = (r["jobid"].as_str(), r["rank"].as_str()) else {
            continue;
        };
        let Ok(rank) = rank.parse::<u32>() else {
            continue;
        };
        for f in r["functions"].as_array().into_iter().flatten() {
            *calls
                .entry((id.into(), rank, f["name"].as_str().unwrap_or("").into()))
                .or_default() += f["calls"].as_u64().unwrap_or(0);
        }
    }
    let reported = exact_jobs(mode, |id, r, f| {
        calls
            .get(&(id.to_string(), r, f.to_string()))
            .copied()
            .unwrap_or(0)
    });
    eprintln!(
        "shortjobs {}: {} of {JOBS} jobs exact in the scrape, {} in the report",
        mode.name(),
        scraped.len(),
        reported.len()
    );
    let missing =
        |exact: &[usize]| -> Vec<usize> { (0..JOBS).filter(|i| !exact.contains(i)).collect() };
    assert_eq!(
        scraped.len(),
        JOBS,
        "jobs not exact in the scrape: {:?}\ndaemon log:\n{}",
        missing(&scraped),
        log.join("\n")
    );
    assert_eq!(
        reported.len(),
        JOBS,
        "jobs not exact in the report data {}: {:?}",
        report.display(),
        missing(&reported)
    );
}

#[test]
fn every_short_job_is_exact_through_the_probes() {
    run(Mode::Ebpf);
}

#[test]
fn every_short_job_is_exact_through_the_shim_without_bpf() {
    run(Mode::Shim);
}
