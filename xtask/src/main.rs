//! Project automation: `cargo xtask <setup|codegen|build|test|demo|bench>`.
mod bench_callsites;
mod bench_common;
mod bench_inject;
mod bench_kmaps;
mod bench_observer;
mod bench_record;
mod bench_shim;
mod bench_stats;
mod codegen;
mod codegen_shim;
mod demo;
mod semantics;
mod setup;

use std::{path::PathBuf, process::Command};

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "mpi-observer project tasks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what this machine lacks: MPI, bpftool, Prometheus, rust-src,
    /// bpf-linker.
    Setup,
    /// Regenerate code from the MPI Forum's apis.json.
    Codegen {
        /// Fail if the committed output is stale instead of rewriting it.
        #[arg(long)]
        check: bool,
    },
    /// Build the daemon (with its eBPF object) and the shim, release mode.
    Build,
    /// The main job: a real 4-rank Open MPI job, observed live.
    Demo {
        /// How long the job runs.
        #[arg(long, default_value_t = 20)]
        seconds: u32,
    },
    /// Everything CI runs: setup, generated-code check, fmt, clippy, unit
    /// and end-to-end tests.
    Test {
        /// Only run end-to-end tests whose name contains this.
        filter: Option<String>,
    },
    /// Benchmarks: `shim` (the layering shim's dispatch cost and latency),
    /// `observer` (probe cost, attach, scrape), `stats` (the argument
    /// layer), `inject` (`attach --inject`: latency, injection time),
    /// `callsites` (what recording call sites adds per call), `record`
    /// (what an OTF2 recording costs the job, and its drain rate), `kmaps`
    /// (the statistics map shared by the CPUs against the per-CPU one).
    Bench {
        /// Which benchmark to run.
        which: String,
    },
}

pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_path_buf()
}

/// `cargo` with the workspace root as working directory.
pub fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

/// Packages built in release mode for the demo and the tests.
const RELEASE_PACKAGES: &[&str] = &["mpi-observer", "mpi-observer-shim"];

fn build() -> Result<()> {
    let mut c = cargo();
    c.args(["build", "--release"]);
    for p in RELEASE_PACKAGES {
        c.args(["-p", p]);
    }
    setup::run_cmd(&mut c)
}

fn test(filter: Option<String>) -> Result<()> {
    setup::run()?;
    codegen::run(&workspace_root(), true)?;
    setup::run_cmd(cargo().args(["fmt", "--all", "--", "--check"]))?;
    setup::run_cmd(cargo().args([
        "clippy",
        "--release",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    build()?;
    setup::run_cmd(cargo().args([
        "test",
        "--release",
        "--workspace",
        "--exclude",
        "observer-ebpf",
        "--exclude",
        "e2e",
    ]))?;
    let mut e2e = cargo();
    // --tests: no doc-test run after the real ones, so the log ends on the
    // end-to-end results.
    e2e.args(["test", "--release", "-p", "e2e", "--tests", "--"]);
    if let Some(f) = filter {
        e2e.arg(f);
    }
    // The tests share two cores, BPF and mpirun: one at a time.
    e2e.args(["--test-threads=1"]);
    setup::run_cmd(&mut e2e)
}

fn main() -> Result<()> {
    let root = workspace_root();
    match Cli::parse().cmd {
        Cmd::Setup => setup::run(),
        Cmd::Codegen { check } => codegen::run(&root, check),
        Cmd::Build => {
            setup::run()?;
            build()
        }
        Cmd::Test { filter } => test(filter),
        Cmd::Demo { seconds } => {
            setup::run()?;
            build()?;
            demo::run(seconds)
        }
        Cmd::Bench { which } => match which.as_str() {
            "shim" => bench_shim::run(&root),
            "observer" => bench_observer::run(&root),
            "stats" => bench_stats::run(&root),
            "inject" => bench_inject::run(&root),
            "callsites" => bench_callsites::run(&root),
            "record" => bench_record::run(&root),
            "kmaps" => bench_kmaps::run(&root),
            other => {
                anyhow::bail!(
                    "unknown benchmark `{other}` (known: shim, observer, stats, inject, callsites, record, kmaps)"
                )
            }
        },
    }
}
