//! eBPF programs of mpi-observer: uprobes and uretprobes on the PMPI entry
//! points of a rank's MPI library. One module per family of calls; all of
//! them share the timing machinery in [`calls`]. [`exec`] tells `attach
//! --all` of program starts.
#![no_std]
#![no_main]
// The BPF target's inline assembly, for the atomic add of calls::add.
#![feature(asm_experimental_arch)]
#![expect(
    clippy::needless_borrows_for_generic_args,
    reason = "aya's map calls take keys and values by address; given them by value, \
              rustc copies them to the BPF stack first: 23 more instructions in \
              mpi_return and 271 over the three entry probes, measured"
)]

mod arch;
mod bytes;
mod calls;
mod collectives;
mod datatype;
mod exec;
mod p2p;
mod pidns;

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
};
use observer_common::maps::{
    CALLSITES_CAPACITY, CallStats, ERROR_COUNTERS, EXECS_BYTES, INFLIGHT_CAPACITY, Inflight,
    OMPI_TYPES_CAPACITY, PROCS_CAPACITY, ProcConfig, STATS_CAPACITY, SiteCount, SiteKey,
    SiteOffset, SiteStats, StatKey, TRACE_BYTES, TypeKey,
};

/// Per-(process, function) statistics, shared by the CPUs: the probes add
/// with atomic adds, so an entry costs one value whatever the CPU count.
/// Preallocated: an on-demand map can fail inserts with ENOMEM in a burst
/// (its element cache refills asynchronously), and a failed insert is an
/// uncounted call. The daemon lowers the capacity to fit `--map-memory`.
#[map(name = "MPI_STATS")]
static STATS: HashMap<StatKey, CallStats> = HashMap::with_max_entries(STATS_CAPACITY, 0);

/// The per-CPU statistics map [`STATS`] replaced, written instead of it
/// only when a benchmark sets [`PERCPU_STATS`]; one entry otherwise.
#[map(name = "MPI_STATS_PERCPU")]
static STATS_PERCPU: PerCpuHashMap<StatKey, CallStats> = PerCpuHashMap::with_max_entries(1, 0);

/// Non-zero: statistics go to [`STATS_PERCPU`] (`cargo xtask bench kmaps`).
/// Read-only data set at load time, so the verifier drops the other path.
#[unsafe(no_mangle)]
static PERCPU_STATS: u32 = 0;

/// Per-(process, function, call site) calls and time, for processes whose
/// configuration asks for it (`attach --callsites`), shared by the CPUs
/// like [`STATS`]; the daemon leaves it at one entry when no process
/// records sites. A process creates at most its `max_sites` entries
/// ([`SITE_COUNTS`]).
#[map(name = "MPI_CALLSITES")]
static CALLSITES: HashMap<SiteKey, SiteStats> = HashMap::with_max_entries(CALLSITES_CAPACITY, 0);

/// Call-site entries each process created and the calls whose site it was
/// refused; the daemon creates an entry at attach, the probes only add.
#[map(name = "MPI_SITE_COUNTS")]
static SITE_COUNTS: HashMap<u32, SiteCount> = HashMap::with_max_entries(PROCS_CAPACITY, 0);

/// The outermost probed call each thread is in, keyed by pid_tgid (in the
/// daemon's pid namespace, [`pidns::pid_tgid`], as the daemon reads it back
/// by pid). LRU, so a thread that never returns (MPI_Abort) cannot fill it
/// up.
#[map(name = "MPI_INFLIGHT")]
static INFLIGHT: LruHashMap<u64, Inflight> = LruHashMap::with_max_entries(INFLIGHT_CAPACITY, 0);

/// Completed calls of traced processes ([`ProcConfig::trace`]), for
/// `mpi-observer record`, which sizes it at load time.
#[map(name = "MPI_TRACE")]
static TRACE: RingBuf = RingBuf::with_byte_size(TRACE_BYTES, 0);

/// Pids of processes that exec'd (exec.rs), for `attach --all`.
#[map(name = "MPI_EXECS")]
static EXECS: RingBuf = RingBuf::with_byte_size(EXECS_BYTES, 0);

/// Exec events [`EXECS`] had no room for, per CPU.
#[map(name = "MPI_EXEC_DROPS")]
static EXEC_DROPS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Non-zero: entry probes tell their function by the probed address
/// ([`SITE_COOKIES`]) rather than by the attach cookie, which kernels
/// before 5.15 do not give. Read-only data set at load time, so the
/// verifier drops the other path, and with it the cookie helper.
#[unsafe(no_mangle)]
static FUNC_BY_ADDRESS: u32 = 0;

/// The cookie of each probe site, by (library slot, file offset), for
/// programs loaded with [`FUNC_BY_ADDRESS`]; written by the daemon only,
/// one entry otherwise.
#[map(name = "MPI_SITE_COOKIES")]
static SITE_COOKIES: HashMap<SiteOffset, u64> = HashMap::with_max_entries(1, 0);

#[map(name = "MPI_PROCS")]
static PROCS: HashMap<u32, ProcConfig> = HashMap::with_max_entries(PROCS_CAPACITY, 0);

#[map(name = "MPI_OMPI_TYPES")]
static OMPI_TYPES: HashMap<TypeKey, u64> = HashMap::with_max_entries(OMPI_TYPES_CAPACITY, 0);

#[map(name = "MPI_ERRORS")]
static ERRORS: PerCpuArray<u64> = PerCpuArray::with_max_entries(ERROR_COUNTERS, 0);

/// Template for new [`STATS`] entries: never written, always zero.
#[map(name = "MPI_ZERO")]
static ZERO: Array<CallStats> = Array::with_max_entries(1, 0);

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

// bpf_probe_read_user is GPL-only; the programs are dual-licensed.
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
