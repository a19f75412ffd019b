//! The attach mechanisms and instruction sets sites run (issues 35 and
//! 36): the e2e tests in VMs booted on Debian's own kernels, x86-64 and
//! arm64, each of which must choose its mechanism itself, then on this
//! machine with classic uprobes forced. `E2E_EXPECT_MECHANISM` makes
//! `kernels::` fail if a run used another mechanism.
//!
//! CI's budget sets the lists: a 2-rank test costs about 40 s in an x86-64
//! guest under TCG, and a test that attaches classic probes to a rank
//! with `--pid` about 35 s more to detach them (352 probes at ~0.1 s each,
//! BENCHMARKS.md). So each test runs where it shows something no other
//! run does, by exact name (`--exact`: no name may match more than it
//! means).
//!
//! Every guest also measures what its kernel does with each class of first
//! instruction (`sites --measure`, a few seconds): which classes it
//! emulates, steps or refuses differs between kernels, so the rules
//! `mpi-observer sites` prints are checked on each.

use std::time::Instant;

use anyhow::{Context as _, Result, ensure};

use crate::{cargo, package, setup, test_log, test_log_path, vm, vm::kernels::Arch};

/// The e2e tests the classic mechanism must pass on this machine's kernel
/// with `perf_link` forced (issue 35), beyond what the 6.1 guests run on
/// the kernel that has it: file-wide probes, a process refused by a
/// budget, the planned restart's handover (pinned perf links) and pid
/// namespaces.
pub const KERNELS_SUBSET: &[&str] = &[
    "--exact",
    "kernels::the_mechanism_is_said_exported_and_the_expected_one",
    "kernels::all_probes_a_library_file_once_and_both_jobs_are_exact",
    "kernels::a_process_refused_by_a_budget_is_unharmed_and_not_counted",
    "restart::planned_restart_loses_no_call",
    "pidns::a_daemon_in_a_pid_namespace_counts_its_namespace_ranks_exactly_and_no_others",
];

/// By address, file-wide, with `perf_ioctl` forced: what 5.10 does, here
/// for its own tests.
const IOCTL_SUBSET: &[&str] = &[
    "--exact",
    "kernels::the_mechanism_is_said_exported_and_the_expected_one",
    "kernels::all_probes_a_library_file_once_and_both_jobs_are_exact",
];

/// What the x86-64 guest of 6.1 (perf_link) runs: the probes' part of
/// issue 35's list, that is the mechanism chosen and said, exact counts
/// and bytes with `--pid` on both stacks, threads, `--all` finding a later
/// job, call sites, and `kill -9` leaving no breakpoint. The no-eBPF test
/// forces its mechanism, so no guest adds to what the host's run shows.
pub const PROBES_SUBSET: &[&str] = &[
    "--exact",
    "kernels::the_mechanism_is_said_exported_and_the_expected_one",
    "sites::the_running_kernel_is_measured_for_every_site",
    "kernels::kill_9_leaves_no_breakpoint_in_the_ranks",
    "observer::exact_counts::openmpi",
    "observer::exact_counts::mpich",
    "kmaps::threads_calling_at_once_are_counted_exactly::openmpi",
    "observer::all_mode_picks_up_a_job_started_later_and_retains_it",
    "callsites::probes_split_is_exact::openmpi",
];

/// What the oldest kernel's guest (5.10, perf_ioctl) runs beyond
/// [`PROBES_SUBSET`]: the parts that use the kernel otherwise
/// (`--inject`'s ptrace, the shim's `stats` segment without eBPF), which
/// the arm64 guest of 16 KiB pages runs too.
pub const OLDEST_EXTRA: &[&str] = &[
    "inject::inject_exact_after_injection::openmpi",
    "stats::stats_exact_per_peer_no_bpf::openmpi",
];

/// What a kernel with the mechanism this machine has (uprobe_multi) must
/// show: that it chose it itself, and exact counts.
pub const CONTROL_SUBSET: &[&str] = &[
    "--exact",
    "kernels::the_mechanism_is_said_exported_and_the_expected_one",
    "sites::the_running_kernel_is_measured_for_every_site",
    "observer::exact_counts::openmpi",
];

/// The arm64 guest of 16 KiB pages (uprobe_multi): issue 36's list, on
/// real 2-rank jobs of Debian's arm64 Open MPI and MPICH. Probes with
/// `--pid` (exact counts and bytes, both stacks; threads; call sites;
/// Fortran under its C names; `kill -9` leaving no breakpoint); the shim
/// (`stats` exact per peer on both stacks, with a PMPI tool stacked whose
/// return address, backtrace and libunwind walk name the application, in
/// C on both stacks and in Fortran; threads; Fortran); `attach --inject`
/// (exact after injection on both stacks, and `kill -9` of the daemon;
/// on by default there, as on x86-64); `record`, read by
/// `otf2-print` and the python bindings; the arm64 package installed,
/// used and purged with dpkg; QMPI tools in a stack with a PMPI tool and
/// `stats` (Open MPI) and from 4 threads (MPICH); and four modules of mpi4py's own suite on
/// PyPI's aarch64 Open MPI 5 and MPICH 5, bare and under `stats`, the same
/// test by test.
pub const ARM64_SUBSET: &[&str] = &[
    "--exact",
    "kernels::the_mechanism_is_said_exported_and_the_expected_one",
    "sites::the_running_kernel_is_measured_for_every_site",
    "kernels::kill_9_leaves_no_breakpoint_in_the_ranks",
    "observer::exact_counts::openmpi",
    "observer::exact_counts::mpich",
    "observer::fortran_calls_are_counted_under_their_c_names",
    "kmaps::threads_calling_at_once_are_counted_exactly::openmpi",
    "callsites::probes_split_is_exact::openmpi",
    "callers::callers_c::openmpi",
    "callers::callers_c::mpich",
    "callers::callers_fortran::openmpi",
    "callers::callers_exact_counts::openmpi",
    "shim::shim_threads::openmpi",
    "shim::shim_fortran_openmpi",
    "shim::shim_fortran_mpich",
    "stats::stats_exact_per_peer_no_bpf::openmpi",
    "stats::stats_exact_per_peer_ebpf::mpich",
    "record::shim_ranks_give_full_events::openmpi",
    "record::probed_ranks_give_enter_and_leave",
    "inject::inject_exact_after_injection::openmpi",
    "inject::inject_exact_after_injection::mpich",
    "inject::inject_kill9::openmpi",
    "package::install_observe_remove_purge",
    "qmpi::qmpi_mixed_entry::openmpi",
    "qmpi::qmpi_threads::mpich",
    "mpi4py::mpi4py_suite_shim_stats::openmpi5",
    "mpi4py::mpi4py_suite_shim_stats::mpich5",
];

/// The modules of mpi4py's suite the arm64 guest runs (its
/// `MPI4PY_SUITE_MODULES`): point-to-point with objects, communicators,
/// buffer collectives and requests, 277 tests a rank.
const MPI4PY_MODULES: &str = "test_p2p_obj,test_comm,test_cco_buf,test_request";

/// The arm64 guests of 4 KiB pages: each kernel's mechanism, chosen and
/// said, and exact counts, one stack each (classic probes cost their
/// detach: 6.1 runs two tests only).
const ARM64_PAGES_4K_SUBSET: &[&str] = &[
    "--exact",
    "kernels::the_mechanism_is_said_exported_and_the_expected_one",
    "sites::the_running_kernel_is_measured_for_every_site",
    "observer::exact_counts::openmpi",
];
const ARM64_CONTROL_SUBSET: &[&str] = &[
    "--exact",
    "kernels::the_mechanism_is_said_exported_and_the_expected_one",
    "sites::the_running_kernel_is_measured_for_every_site",
    "observer::exact_counts::mpich",
];

/// Which parts of the suite to run.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Parts {
    All,
    Arm64,
}

/// The guests, then the forced runs on this machine. Every part runs
/// whatever an earlier one did: one run says every kernel that fails.
pub fn run(parts: Parts) -> Result<()> {
    let mut failed = Vec::new();
    let oldest: Vec<&str> = PROBES_SUBSET.iter().chain(OLDEST_EXTRA).copied().collect();
    let mut guests: Vec<(&str, Arch, &str, &[&str])> = Vec::new();
    if parts == Parts::All {
        // Bullseye's 5.10 has neither uprobe_multi nor attach cookies, nor
        // BPF links on perf events; bookworm's 6.1 has the two last;
        // bookworm-backports' 6.12 has uprobe_multi whose PID filter
        // covers every thread.
        guests.extend([
            ("5.10", Arch::X86_64, "perf_ioctl", oldest.as_slice()),
            ("6.1", Arch::X86_64, "perf_link", PROBES_SUBSET),
            ("6.12", Arch::X86_64, "uprobe_multi", CONTROL_SUBSET),
        ]);
    }
    guests.extend([
        ("6.1", Arch::Arm64, "perf_link", ARM64_PAGES_4K_SUBSET),
        ("6.12", Arch::Arm64, "uprobe_multi", ARM64_CONTROL_SUBSET),
        ("6.12-16k", Arch::Arm64, "uprobe_multi", ARM64_SUBSET),
    ]);
    if let Err(e) = arm64_package() {
        failed.push(format!("the arm64 package for its guests: {e:#}"));
    }
    for (kernel, arch, mechanism, subset) in guests {
        let t = Instant::now();
        let r = vm::run_suite(
            kernel,
            arch,
            subset,
            &[
                ("E2E_EXPECT_MECHANISM", mechanism),
                // mpi4py's suite is too slow whole under TCG (over 170 s a
                // run); these modules take 25-30 s.
                ("MPI4PY_SUITE_MODULES", MPI4PY_MODULES),
            ],
        );
        eprintln!(
            "test: the {arch} {kernel} guest: {:.0} s",
            t.elapsed().as_secs_f64()
        );
        if let Err(e) = r {
            failed.push(format!("the {arch} {kernel} guest: {e:#}"));
        }
    }
    if parts == Parts::All {
        for (mechanism, subset) in [("perf_link", KERNELS_SUBSET), ("perf_ioctl", IOCTL_SUBSET)] {
            let mut e2e = cargo();
            e2e.args(["test", "--release", "-p", "e2e", "--tests", "--"])
                .args(subset)
                .arg("--test-threads=1")
                .env("MPI_OBSERVER_ATTACH_MECHANISM", mechanism)
                .env("E2E_EXPECT_MECHANISM", mechanism);
            eprintln!("test: the kernels subset with {mechanism} forced on this kernel");
            let t = Instant::now();
            let r = test_log::run(&mut e2e, &test_log_path(&format!("forced-{mechanism}")));
            eprintln!(
                "test: {mechanism} forced: {:.0} s",
                t.elapsed().as_secs_f64()
            );
            if let Err(e) = r {
                failed.push(format!("{mechanism} forced here: {e:#}"));
            }
        }
    }
    ensure!(
        failed.is_empty(),
        "the kernels suite failed:\n{}",
        failed.join("\n")
    );
    Ok(())
}

/// The arm64 package, cross-built (which builds the daemon, shim and
/// stubs the arm64 guests run) and held to the amd64 one when that is
/// built, put where the guests' `package::` tests look for it: the
/// aarch64 target directory's `debian/mpi-observer.deb`.
fn arm64_package() -> Result<()> {
    let t = Instant::now();
    let deb = package::deb(Arch::Arm64, true)?;
    let amd64 = package::deb_path();
    if amd64.is_file() {
        package::same_but_arm64(&amd64, &deb)?;
    }
    let to = setup::target_dir()
        .join(setup::AARCH64)
        .join(e2e::package::DEB);
    std::fs::create_dir_all(to.parent().expect("a file in a directory"))?;
    std::fs::copy(&deb, &to)
        .with_context(|| format!("copying {} to {}", deb.display(), to.display()))?;
    eprintln!(
        "test: the arm64 package: {:.0} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
