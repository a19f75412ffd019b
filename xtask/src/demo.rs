//! `cargo xtask demo`: a real Open MPI job, observed live.
//!
//! Builds everything, starts the bundled 4-rank job (xtask/demo/traffic.c,
//! about 20 s of mixed traffic, rank 3 slower) under the shim's `stats`
//! layer (`mpi-observer run --tools stats`, so the report can say who makes
//! the others wait), attaches `mpi-observer` to every rank as
//! soon as they print their pids (with call sites), shows the job live while
//! /metrics is served (in `mpi-observer top` on a terminal, as the daemon's
//! per-rank table every second otherwise), and ends when the job does, with
//! the job's report (`mpi-observer report`) from the snapshot the daemon
//! wrote.

use std::{
    io::{BufRead as _, BufReader},
    net::TcpListener,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::workspace_root;

const RANKS: usize = 4;

pub fn run(seconds: u32) -> Result<()> {
    let root = workspace_root();
    let out_dir = root.join("target/demo");
    std::fs::create_dir_all(&out_dir)?;
    let exe = out_dir.join("traffic");
    crate::setup::run_cmd(
        Command::new("mpicc.openmpi")
            // -g: call sites named by file and line in the report.
            .args(["-O2", "-g", "-o"])
            .arg(&exe)
            .arg(root.join("xtask/demo/traffic.c")),
    )?;
    let observer = root.join("target/release/mpi-observer");
    // The documented port, or any free one if something already has it.
    let listen = match TcpListener::bind("127.0.0.1:9479") {
        Ok(_) => "127.0.0.1:9479".to_string(),
        Err(_) => TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string(),
    };
    eprintln!(
        "demo: starting a 4-rank Open MPI job ({seconds} s of mixed traffic) under the shim's stats layer"
    );
    let mut job = Command::new("mpirun.openmpi")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_btl", "self,vader")
        .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
        .args(["--oversubscribe", "-np", &RANKS.to_string()])
        // Every message recorded (not one in 8 per envelope): the report
        // then follows each wait passed on through a message back to its
        // root cause (docs/waits.md, "Root causes").
        .args(["-x", "MPI_OBSERVER_WAITS_P2P=1"])
        // Each rank execs the job with the shim preloaded: the pid it
        // prints is the rank's.
        .arg(&observer)
        .args(["run", "--tools", "stats", "--"])
        .arg(&exe)
        .arg(seconds.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting mpirun.openmpi")?;
    let mut lines = BufReader::new(job.stdout.take().expect("piped")).lines();
    let mut pids = Vec::new();
    let started = Instant::now();
    while pids.len() < RANKS {
        let Some(line) = lines.next() else {
            bail!("the job ended before its {RANKS} ranks started");
        };
        let line = line?;
        if let Some(rest) = line.strip_prefix("READY ") {
            pids.push(
                rest.split_whitespace()
                    .nth(1)
                    .context("READY line")?
                    .to_string(),
            );
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!("the ranks did not start within a minute");
        }
    }
    // Keep echoing the job's own output (its DONE line) after the table.
    let echo = std::thread::spawn(move || {
        let mut out = Vec::new();
        for l in lines.map_while(Result::ok) {
            out.push(l);
        }
        out
    });
    eprintln!(
        "demo: ranks are pids {}; attaching, metrics at http://{listen}/metrics",
        pids.join(" ")
    );
    let mut cmd = Command::new(&observer);
    cmd.arg("attach");
    for p in &pids {
        cmd.args(["--pid", p]);
    }
    // --retain-exited 0: the observer ends with the job, after writing
    // the report data.
    let snapshot = out_dir.join("report.json");
    let _ = std::fs::remove_file(&snapshot);
    cmd.args(["--callsites", "--retain-exited", "0", "--listen", &listen])
        .arg("--report-file")
        .arg(&snapshot);
    // On a terminal the job is watched live in `mpi-observer top`; otherwise
    // (CI, a pipe) the daemon prints its per-rank table every second.
    let daemon = if on_terminal() {
        let log = out_dir.join("observer.log");
        let mut daemon = cmd
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .context("starting mpi-observer")?;
        wait_serving(&listen, &mut daemon, &log)?;
        let top = Command::new(&observer)
            .args(["top", "--endpoint", &listen, "--exit-when-done"])
            .status()
            .context("running mpi-observer top")?;
        if !top.success() {
            eprintln!("demo: mpi-observer top failed ({top}); the job goes on");
        }
        eprintln!(
            "demo: waiting for the job to end (the observer's log: {})",
            log.display()
        );
        daemon.wait()?
    } else {
        cmd.arg("--summary")
            .status()
            .context("running mpi-observer")?
    };
    let job_status = job.wait()?;
    for l in echo.join().unwrap_or_default() {
        println!("job: {l}");
    }
    if !daemon.success() {
        bail!("mpi-observer failed: {daemon}");
    }
    if !job_status.success() {
        bail!("the MPI job failed: {job_status}");
    }
    eprintln!("demo: the job finished and the observer detached cleanly; its report:");
    let report = Command::new(&observer)
        .arg("report")
        .arg(&snapshot)
        .status()
        .context("running mpi-observer report")?;
    if !report.success() {
        bail!("mpi-observer report failed: {report}");
    }
    eprintln!(
        "demo: the same as one HTML file with plots: {} report --format html -o report.html {}",
        observer.display(),
        snapshot.display()
    );
    Ok(())
}

/// Whether the demo runs on a terminal a person watches.
fn on_terminal() -> bool {
    use std::io::IsTerminal as _;
    std::io::stdout().is_terminal() && std::io::stdin().is_terminal()
}

/// Waits until the daemon serves /metrics at `listen`; fails with its log if
/// it exits first.
fn wait_serving(
    listen: &str,
    daemon: &mut std::process::Child,
    log: &std::path::Path,
) -> Result<()> {
    let start = Instant::now();
    while std::net::TcpStream::connect(listen).is_err() {
        if let Some(st) = daemon.try_wait()? {
            bail!(
                "mpi-observer exited ({st}) before serving: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        if start.elapsed() > Duration::from_secs(60) {
            bail!("mpi-observer did not serve {listen} within a minute");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}
