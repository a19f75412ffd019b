//! Project automation: `cargo xtask <setup|codegen|build|package|test|demo|bench|fuzz|vm>`.
mod bench_callsites;
mod bench_common;
mod bench_finalize;
mod bench_inject;
mod bench_insns;
mod bench_kmaps;
mod bench_mechanisms;
mod bench_observer;
mod bench_record;
mod bench_scale;
mod bench_scan;
mod bench_shim;
mod bench_shim_profile;
mod bench_sites;
mod bench_stats;
mod bench_waits;
mod codegen;
mod codegen_qmpi;
mod codegen_shim;
mod codegen_slurm;
mod demo;
mod layout;
mod package;
mod qemu_shim;
mod semantics;
mod setup;
mod spec;
mod suite;
mod test_log;
mod vm;

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use vm::kernels::Arch;

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
    /// Build the Debian package (cargo-deb): the binary, the shim, the
    /// systemd unit and its /etc/default file, the Slurm SPANK plugin, the
    /// dashboards and rules. Written to target/debian/mpi-observer.deb;
    /// with `--arch arm64`, cross-built to
    /// target/debian/mpi-observer_<version>_arm64.deb.
    Package {
        /// The package's architecture: this machine's (x86_64, Debian's
        /// amd64), or arm64.
        #[arg(long, value_enum, default_value_t = Arch::X86_64)]
        arch: Arch,
    },
    /// Check the workspace's layout (docs/architecture.md, "The rule"):
    /// observer/src's one-way folders, no import circles between the
    /// modules of a folder in any crate, no hand-written code file over
    /// 1,000 lines outside tests; one line per offence.
    Layout,
    /// The aarch64 shim's unit tests under qemu-user, then the shim
    /// cross-built and run there with a stand-in MPI library and a PMPI tool
    /// (part of `test`; xtask/src/qemu_shim.rs).
    QemuShim,
    /// The main job: a real 4-rank Open MPI job, observed live.
    Demo {
        /// How long the job runs.
        #[arg(long, default_value_t = 20)]
        seconds: u32,
    },
    /// Everything CI runs: setup, generated-code check, fmt, clippy (the
    /// eBPF crate for the BPF target too, for x86_64 and aarch64), the
    /// shim checked, linted and run under qemu-user for aarch64, unit and
    /// end-to-end tests.
    Test {
        /// Only run end-to-end tests whose name contains this.
        filter: Option<String>,
        /// Only the attach mechanisms' and instruction sets' part (after
        /// the build): the VMs of other kernels, x86-64 and arm64, and the
        /// host's forced classic runs (xtask/src/suite.rs).
        #[arg(long, conflicts_with = "filter")]
        kernels: bool,
        /// Only the arm64 guests (the package cross-built, then each
        /// guest's tests).
        #[arg(long, conflicts_with_all = ["filter", "kernels"])]
        arm64: bool,
    },
    /// Run a command as root in a QEMU guest on one of Debian's own kernels
    /// (5.10, 6.1, 6.12), this machine's root file system read-only under
    /// overlays: `cargo xtask vm --kernel 6.1 -- uname -r` (docs/vm.md).
    Vm(vm::VmArgs),
    /// Run by `vm`'s guest script: holds the perf_sched_events static key
    /// enabled for the guest's life (xtask/src/vm/steady.rs).
    #[command(hide = true)]
    GuestHoldPerfKey,
    /// Fetch (once, pinned) and unpack Debian's arm64 MPI libraries into
    /// target/foreign/arm64, as `test` does (xtask/src/vm/foreign.rs).
    #[command(hide = true)]
    FetchForeign,
    /// Benchmarks: `shim` (the layering shim's dispatch cost and latency),
    /// `observer` (probe cost, attach, scrape), `stats` (the argument
    /// layer), `inject` (`attach --inject`: latency, injection time),
    /// `insns` (instructions per MPI call on the shim's hot path, x86-64
    /// here against aarch64 in an arm64 guest, counted by callgrind),
    /// `callsites` (what recording call sites adds per call), `record`
    /// (what an OTF2 recording costs the job, and its drain rate), `kmaps`
    /// (the statistics map shared by the CPUs against the per-CPU one),
    /// `scale` (64 k simulated ranks through sharded vmagents into
    /// VictoriaMetrics, with vmalert: series, samples/s, query times),
    /// `finalize` (what the shim's exit knock costs `MPI_Finalize`), `scan`
    /// (the daemon's CPU per `--all` fallback scan of /proc, by how many
    /// processes it remembers as not MPI), `scan-reads` (the scan's reads
    /// of one process, the daemon's way against a single read),
    /// `mechanisms` (each attach mechanism's probe cost, what an unobserved
    /// process pays under `--all`, attach and detach time and descriptors
    /// at 1, 16 and 64 ranks), `mechanisms-guest` (the probe cost of each
    /// mechanism the running kernel has, for a `cargo xtask vm` guest),
    /// `waits` (the daemon's CPU for matching wait records at 128 ranks a
    /// node, collectives and messages, on one node and on three).
    Bench {
        /// Which benchmark to run.
        which: String,
    },
    /// The property tests of the parsers of user-controlled input
    /// (observer/tests/fuzz.rs) with many more cases than CI runs, and a
    /// fresh seed each time unless --seed replays one.
    Fuzz {
        /// Cases per property (CI runs a few hundred).
        #[arg(long, default_value_t = 20_000)]
        cases: u32,
        /// The seed to replay (printed by an earlier run).
        #[arg(long)]
        seed: Option<u64>,
        /// Only the properties whose name contains this (e.g. `segment`).
        filter: Option<String>,
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
const RELEASE_PACKAGES: &[&str] = &[
    "mpi-observer",
    "mpi-observer-shim",
    "mpi-observer-qmpi-stubs",
];

fn build() -> Result<()> {
    let mut c = cargo();
    c.args(["build", "--release"]);
    for p in RELEASE_PACKAGES {
        c.args(["-p", p]);
    }
    setup::run_cmd(&mut c)?;
    qmpi_header_beside(&workspace_root().join("target/release"))
}

/// Copies the QMPI header into `include/` of a build's output directory
/// (`target/release`, or an instruction set's): `mpi-observer qmpi-flags`
/// looks for it beside the executable, as an install has it.
pub(crate) fn qmpi_header_beside(release: &std::path::Path) -> Result<()> {
    let include = release.join("include");
    let header = workspace_root().join(codegen_qmpi::HEADER);
    std::fs::create_dir_all(&include)
        .and_then(|()| std::fs::copy(&header, include.join("mpi_observer_qmpi.h")))
        .with_context(|| format!("copying {} to {}", header.display(), include.display()))?;
    Ok(())
}

fn test(filter: Option<String>) -> Result<()> {
    // First: it takes a moment and needs nothing built.
    layout::run(&workspace_root())?;
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
    for arch in BPF_TARGET_ARCHES {
        clippy_bpf(arch)?;
    }
    check_aarch64()?;
    qemu_shim::run()?;
    build()?;
    // The package tests (tests/tests/e2e/package.rs) install it; the
    // arm64 one is built and held to it before the arm64 guests
    // (`suite`).
    package::deb(Arch::X86_64, false)?;
    // tests/tests/e2e/sites.rs reads Debian's arm64 MPI libraries.
    vm::foreign::arm64_mpi()?;
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
    if let Some(f) = &filter {
        e2e.arg(f);
    }
    // The tests share two cores, BPF and mpirun: one at a time.
    e2e.args(["--test-threads=1"]);
    let host = test_log::run(&mut e2e, &test_log_path("e2e"));
    if filter.is_some() {
        return host;
    }
    // The guests run whatever the host's tests did: one run says every
    // failure, not only the first step's.
    match (host, suite::run(suite::Parts::All)) {
        (Ok(()), guests) => guests,
        (Err(host), Ok(())) => Err(host),
        (Err(host), Err(guests)) => Err(anyhow::anyhow!("{host:#}\n{guests:#}")),
    }
}

/// Where a test run's whole output is kept (`test_log`).
fn test_log_path(name: &str) -> PathBuf {
    workspace_root()
        .join("target/e2e/logs")
        .join(format!("{name}.log"))
}

/// The `bpf_target_arch`es the eBPF crate has an `arch/` file for, each
/// linted: aya-build sets the cfg from the userspace crate's target, so an
/// aarch64 build of the observer embeds the aarch64 programs.
const BPF_TARGET_ARCHES: &[&str] = &["x86_64", "aarch64"];

/// The daemon, the shim and the QMPI stubs for aarch64: clippy (which
/// type-checks everything `cargo check` does) with warnings denied for
/// `aarch64-unknown-linux-gnu`, in the environment the arm64 package is
/// built in (`vm::foreign::cross_env`); the daemon is not linked here. The shim's
/// instruction-set half is `shim/src/arch/aarch64.rs`; the daemon's
/// `attach --inject` has no aarch64 stub yet and refuses in one line
/// (`attach/inject/regs.rs`).
fn check_aarch64() -> Result<()> {
    setup::run_cmd(
        vm::foreign::cross_env(&mut cargo())
            .args([
                "clippy",
                "--release",
                "--all-targets",
                "--target",
                setup::AARCH64,
            ])
            .args(["-p", "mpi-observer-shim", "-p", "mpi-observer-qmpi-stubs"])
            .args(["-p", "mpi-observer"])
            .args(["--", "-D", "warnings"]),
    )
}

/// Clippy on the eBPF programs, for the BPF target they run on (the host
/// clippy above skips observer-ebpf: it is not a default member, and does
/// not build for the host). As aya's xtask lints its eBPF crates: nightly,
/// `-Z build-std=core`, warnings denied. The toolchain is observer/build.rs's
/// choice: nightly when installed, otherwise stable with RUSTC_BOOTSTRAP=1;
/// and the `bpf_target_arch` cfg is `arch`'s, as aya-build sets it for a
/// build for that architecture, so the code that ships is the code linted.
fn clippy_bpf(arch: &str) -> Result<()> {
    let toolchain = if setup::have_nightly() {
        "nightly"
    } else {
        "stable"
    };
    let mut c = Command::new("rustup");
    c.current_dir(workspace_root())
        .args(["run", toolchain, "cargo", "clippy", "--release"])
        .args(["--package", "observer-ebpf", "--target", bpf_target()])
        .args(["-Z", "build-std=core", "--", "-D", "warnings"])
        // aya-build's flag, as it sets it for a build for `arch`.
        .env(
            "CARGO_ENCODED_RUSTFLAGS",
            format!("--cfg=bpf_target_arch=\"{arch}\""),
        )
        // Set by the cargo running xtask; they would pick its toolchain.
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO");
    if toolchain == "stable" {
        c.env("RUSTC_BOOTSTRAP", "1");
    }
    setup::run_cmd(&mut c)
}

/// The BPF target aya-build builds for: the host's byte order.
fn bpf_target() -> &'static str {
    if cfg!(target_endian = "big") {
        "bpfeb-unknown-none"
    } else {
        "bpfel-unknown-none"
    }
}

fn fuzz(cases: u32, seed: Option<u64>, filter: Option<String>) -> Result<()> {
    // A fresh seed explores new inputs; printing it makes a failure replayable.
    let seed = seed.unwrap_or_else(|| {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_secs() ^ (u64::from(t.subsec_nanos()) << 32) ^ u64::from(std::process::id())
    });
    eprintln!("fuzz: {cases} cases per property, seed {seed} (replay with --seed {seed})");
    let mut c = cargo();
    c.args(["test", "--release", "-p", "mpi-observer", "--test", "fuzz"])
        .env("PROPTEST_CASES", cases.to_string())
        .env("PROPTEST_RNG_SEED", seed.to_string());
    if let Some(f) = filter {
        c.args(["--", &f]);
    }
    setup::run_cmd(&mut c)
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
        Cmd::Package { arch } => {
            setup::run()?;
            // The arm64 package cross-builds its own binaries.
            if arch == Arch::X86_64 {
                build()?;
            }
            let deb = package::deb(arch, false)?;
            if arch == Arch::Arm64 {
                // Held to the amd64 package if one was built.
                let amd64 = package::deb_path();
                if amd64.is_file() {
                    package::same_but_arm64(&amd64, &deb)?;
                    eprintln!(
                        "the arm64 package has what {} has, built for arm64",
                        amd64.display()
                    );
                } else {
                    eprintln!(
                        "not compared with the amd64 package: {} is not built (cargo xtask package)",
                        amd64.display()
                    );
                }
            }
            println!("{}", deb.display());
            Ok(())
        }
        Cmd::Layout => layout::run(&root),
        Cmd::QemuShim => {
            setup::run()?;
            qemu_shim::run()
        }
        Cmd::Test { kernels: true, .. } => {
            setup::run()?;
            build()?;
            suite::run(suite::Parts::All)
        }
        Cmd::Test { arm64: true, .. } => {
            setup::run()?;
            suite::run(suite::Parts::Arm64)
        }
        Cmd::Test { filter, .. } => test(filter),
        Cmd::Vm(a) => vm::cli(a),
        Cmd::GuestHoldPerfKey => vm::steady::hold(),
        Cmd::FetchForeign => vm::foreign::arm64_mpi().map(|d| println!("{}", d.display())),
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
            "insns" => bench_insns::run(&root),
            "callsites" => bench_callsites::run(&root),
            "record" => bench_record::run(&root),
            "kmaps" => bench_kmaps::run(&root),
            "scale" => bench_scale::run(&root),
            "finalize" => bench_finalize::run(&root),
            "scan" => bench_scan::run(&root),
            "scan-reads" => bench_scan::run_reads(&root),
            "mechanisms" => bench_mechanisms::run(&root),
            "mechanisms-guest" => bench_mechanisms::guest::run_guest(&root),
            "waits" => bench_waits::run(&root),
            other => {
                anyhow::bail!(
                    "unknown benchmark `{other}` (known: shim, observer, stats, inject, insns, callsites, record, kmaps, scale, finalize, scan, scan-reads, mechanisms, mechanisms-guest, waits)"
                )
            }
        },
        Cmd::Fuzz {
            cases,
            seed,
            filter,
        } => fuzz(cases, seed, filter),
    }
}
