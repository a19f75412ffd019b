//! Names and value layouts of the BPF maps, shared by the programs that
//! write them and the daemon that reads them at scrape time.

/// Per-(process, function) call statistics: one shared hash whose figures the
/// probes add to with atomic adds, so its memory does not grow with the CPUs.
pub const STATS: &str = "MPI_STATS";
/// The per-CPU design [`STATS`] replaced, kept at one entry unless a
/// benchmark asks for it ([`PERCPU_STATS`]), so `cargo xtask bench kmaps`
/// compares the two in one run.
pub const STATS_PERCPU: &str = "MPI_STATS_PERCPU";
/// Global of the eBPF object: non-zero makes the probes write
/// [`STATS_PERCPU`] instead of [`STATS`] (benchmarks only). Read-only data,
/// so the verifier removes the branch not taken.
pub const PERCPU_STATS: &str = "PERCPU_STATS";
/// Globals of the eBPF object: the device (kernel encoding) and inode of
/// the daemon's pid namespace, left 0 for the initial one. Set, the
/// programs name tasks by their pids in that namespace and ignore tasks of
/// any other. Read-only data, so a host daemon's probes keep the plain
/// `bpf_get_current_pid_tgid` path.
pub const PIDNS_DEV: &str = "PIDNS_DEV";
/// See [`PIDNS_DEV`].
pub const PIDNS_INO: &str = "PIDNS_INO";
/// Calls in progress, per thread (LRU hash keyed by pid_tgid).
pub const INFLIGHT: &str = "MPI_INFLIGHT";
/// Per-process facts the probes need ([`ProcConfig`]), keyed by tgid.
pub const PROCS: &str = "MPI_PROCS";
/// Open MPI predefined datatype addresses and their sizes ([`TypeKey`]).
pub const OMPI_TYPES: &str = "MPI_OMPI_TYPES";
/// Per-CPU error counters, indexed by [`ErrorCounter`].
pub const ERRORS: &str = "MPI_ERRORS";
/// A one-element array holding an all-zero [`CallStats`], the template for
/// new stats entries (too large for the BPF stack).
pub const ZERO: &str = "MPI_ZERO";
/// Per-(process, function, call site) calls and time ([`SiteKey`] to
/// [`SiteStats`]), a shared hash updated with atomic adds; written only for
/// processes whose [`ProcConfig::callsites`] is set (`attach --callsites`),
/// at most [`ProcConfig::max_sites`] entries per process.
pub const CALLSITES: &str = "MPI_CALLSITES";
/// Per-process call-site entries created and calls whose site was refused
/// ([`SiteCount`]), keyed by tgid; created by the daemon at attach, only
/// updated by the probes.
pub const SITE_COUNTS: &str = "MPI_SITE_COUNTS";
/// The cookies of a library's probe sites by file offset ([`SiteOffset`]
/// to the cookie [`crate::cookie::encode`] makes), for programs loaded
/// with [`FUNC_BY_ADDRESS`]: on kernels without attach cookies (before
/// 5.15) an entry probe tells its function by the address it hit. One entry
/// at load otherwise; [`SITE_COOKIES_CAPACITY`] with it.
pub const SITE_COOKIES: &str = "MPI_SITE_COOKIES";
/// Entries of [`SITE_COOKIES`] when in use: about 190 libraries of 340
/// probed functions; 5.6 MiB.
pub const SITE_COOKIES_CAPACITY: u32 = 65_536;
/// Global of the eBPF object: non-zero makes the entry probes tell their
/// function by the probed address ([`SITE_COOKIES`]) instead of the attach
/// cookie, and the return probe trust the thread's stack of open calls.
/// Read-only data set at load, so the verifier removes the path not taken
/// (and with it the cookie helper, which kernels before 5.15 lack).
pub const FUNC_BY_ADDRESS: &str = "FUNC_BY_ADDRESS";
/// Name of the ring buffer of traced calls ([`TraceCall`]).
pub const TRACE: &str = "MPI_TRACE";
/// Name of the ring buffer of exec'd pids (one `u64` each), read by
/// `attach --all`.
pub const EXECS: &str = "MPI_EXECS";
/// Name of the per-CPU count of exec events [`EXECS`] had no room for.
pub const EXEC_DROPS: &str = "MPI_EXEC_DROPS";
/// Name of the program on `sched/sched_process_exec`.
pub const EXEC_PROGRAM: &str = "mpi_exec";
/// Bytes of [`EXECS`]: 16 per event (header and pid), so 16,384 execs
/// between two reads of the daemon, which reads as they come.
pub const EXECS_BYTES: u32 = 256 * 1024;

/// Capacity of [`STATS`]: every (process, function) pair a full node may
/// create, 768 processes times every default function a library has (about
/// 340), whatever the CPU count: the daemon reserves a process's functions
/// at attach (docs/security.md). 94 MiB preallocated; the daemon lowers it
/// to fit `--map-memory` ([`stats_capacity_within`]).
pub const STATS_CAPACITY: u32 = 262_144;
/// Default kernel memory [`STATS`] may take: more than
/// [`STATS_CAPACITY`] entries need, so by default the capacity is the cap.
pub const STATS_MEMORY_BUDGET: u64 = 256 << 20;

/// Kernel memory of one preallocated entry of a (not per-CPU) BPF hash with
/// `key` and `value` bytes: the kernel's element header (`struct
/// htab_elem`, 48 bytes), key and value rounded up to 8, and the bucket
/// (16 bytes, one per entry rounded up to a power of two: counted once).
/// Checked against `bpftool map show`'s memlock in BENCHMARKS.md.
pub const fn hash_entry_bytes(key: usize, value: usize) -> u64 {
    (48 + key.next_multiple_of(8) + value.next_multiple_of(8) + 16) as u64
}

/// Kernel memory of one [`STATS`] entry: 376 bytes on any number of CPUs.
pub const STATS_ENTRY_BYTES: u64 = hash_entry_bytes(
    core::mem::size_of::<StatKey>(),
    core::mem::size_of::<CallStats>(),
);

/// The [`STATS`] capacity within `budget` bytes: at least one entry (a map
/// cannot be empty), at most [`STATS_CAPACITY`]. The same on every machine:
/// the values are shared by the CPUs, not one per CPU.
pub const fn stats_capacity_within(budget: u64) -> u32 {
    let fit = budget / STATS_ENTRY_BYTES;
    if fit < 1 {
        1
    } else if fit < STATS_CAPACITY as u64 {
        fit as u32
    } else {
        STATS_CAPACITY
    }
}

/// Capacity of [`CALLSITES`]: 512 processes times their 1,024 sites
/// ([`ProcConfig::max_sites`], which the daemon reserves at attach), 48 MiB
/// ([`CALLSITES_ENTRY_BYTES`] each) on any number of CPUs, only with
/// `--callsites`.
/// A call whose site finds the map full is still counted in [`STATS`], and
/// in [`ErrorCounter::CallsiteUpdate`]; one whose process is at its
/// [`ProcConfig::max_sites`] in its [`SiteCount::refused`].
pub const CALLSITES_CAPACITY: u32 = 524_288;
/// Kernel memory of one [`CALLSITES`] entry: 96 bytes.
pub const CALLSITES_ENTRY_BYTES: u64 = hash_entry_bytes(
    core::mem::size_of::<SiteKey>(),
    core::mem::size_of::<SiteStats>(),
);
/// Default [`ProcConfig::max_sites`]: call-site entries one process may
/// create. A real rank calls MPI from tens to a few hundred places.
pub const DEFAULT_MAX_SITES: u32 = 1024;

/// Capacity of [`INFLIGHT`]: threads inside an MPI call at once.
pub const INFLIGHT_CAPACITY: u32 = 65_536;
/// Capacity of [`PROCS`] and of [`SITE_COUNTS`]: processes attached at
/// once.
pub const PROCS_CAPACITY: u32 = 4_096;
/// Capacity of [`OMPI_TYPES`]: about 70 predefined types per rank.
pub const OMPI_TYPES_CAPACITY: u32 = 32_768;
/// [`OMPI_TYPES`] entries one process may get: the predefined types are
/// read from its (user-controlled) library, Open MPI has about 70.
pub const OMPI_TYPES_PER_PROCESS: usize = 256;

/// Number of latency histogram slots: slot `i < 31` counts calls that took
/// `[2^i, 2^(i+1))` ns; the last slot everything from 2^31 ns (2.1 s) up.
pub const HIST_SLOTS: usize = 32;

/// Depth of the per-thread stack of probed functions. Deeper nesting is
/// still balanced by the depth counter; only the function check is lost.
pub const STACK_DEPTH: usize = 8;

/// MPI library flavours: how the probes read a process's arguments, chosen
/// per process at attach time and kept in its [`ProcConfig`].
pub mod lib_kind {
    /// Handle conventions not recognised: every byte figure is unknown.
    pub const UNKNOWN: u32 = 0;
    /// Open MPI: handles are pointers, `MPI_IN_PLACE` is `(void *)1`.
    pub const OPEN_MPI: u32 = 1;
    /// MPICH ABI (also Intel MPI, MVAPICH, Cray): handles are `int`s,
    /// `MPI_IN_PLACE` is `(void *)-1`.
    pub const MPICH: u32 = 2;
    /// The MPI-5 standard ABI (`libmpi_abi.so`): pointer-sized handles with
    /// fixed predefined values, `MPI_IN_PLACE` is `(void *)1`; see
    /// [`crate::std_abi`].
    pub const STD_ABI: u32 = 3;
}

/// Key of [`STATS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct StatKey {
    /// Process (thread group) ID.
    pub tgid: u32,
    /// MPI function ID.
    pub func: u32,
}

/// Value of [`STATS`] (and one per CPU of [`STATS_PERCPU`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallStats {
    /// Completed calls.
    pub calls: u64,
    /// Total time inside completed calls.
    pub time_ns: u64,
    /// Bytes per direction (0 = send, 1 = recv).
    pub bytes: [u64; 2],
    /// Calls whose byte figure for that direction could not be known.
    pub bytes_unknown: [u64; 2],
    /// log2 latency histogram, see [`HIST_SLOTS`].
    pub hist: [u64; HIST_SLOTS],
}

impl CallStats {
    /// All zero.
    pub const ZERO: CallStats = CallStats {
        calls: 0,
        time_ns: 0,
        bytes: [0; 2],
        bytes_unknown: [0; 2],
        hist: [0; HIST_SLOTS],
    };

    /// Adds another CPU's (or process's) figures to these.
    pub fn add(&mut self, o: &CallStats) {
        // Saturating: a stats segment's figures are written by the user's
        // process and can be anything; a sum must not wrap to a small value.
        self.calls = self.calls.saturating_add(o.calls);
        self.time_ns = self.time_ns.saturating_add(o.time_ns);
        for i in 0..2 {
            self.bytes[i] = self.bytes[i].saturating_add(o.bytes[i]);
            self.bytes_unknown[i] = self.bytes_unknown[i].saturating_add(o.bytes_unknown[i]);
        }
        for (a, b) in self.hist.iter_mut().zip(o.hist.iter()) {
            *a = a.saturating_add(*b);
        }
    }
}

/// Value of [`INFLIGHT`]: the outermost probed call a thread is in.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Inflight {
    /// `bpf_ktime_get_ns` at entry of the outermost call.
    pub start_ns: u64,
    /// Bytes the outermost call moves, per direction.
    pub bytes: [u64; 2],
    /// Probed calls currently open on this thread (1 = just the outermost).
    pub depth: u32,
    /// Bit `d` set: direction `d`'s byte figure is unknown.
    pub unknown: u32,
    /// Function IDs of the open calls, outermost first.
    pub stack: [u16; STACK_DEPTH],
    /// The outermost call's return address (the application's instruction
    /// after the call), read at its entry when [`ProcConfig::callsites`] is
    /// set; 0 = not captured (off, or the read failed): the call then adds
    /// to [`STATS`] only.
    pub site: u64,
}

/// Value of [`PROCS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcConfig {
    /// One of [`lib_kind`].
    pub lib: u32,
    /// Non-zero: account bytes for this process.
    pub bytes: u32,
    /// Address of Open MPI's `ompi_datatype_t_class` in this process, 0 if
    /// derived-datatype sizes cannot be read safely.
    pub ompi_dt_class: u64,
    /// Offset of the `size` field in Open MPI's datatype object, validated
    /// at attach time against predefined types; 0 if not validated.
    pub ompi_dt_size_offset: u64,
    /// Calls made from code in `[skip_lo, skip_hi)` are not counted, nor
    /// anything nested in them: the code of a shim injected into the
    /// process, which counts those calls itself (`attach --inject`). 0, 0
    /// when there is none.
    pub skip_lo: u64,
    /// See [`ProcConfig::skip_lo`].
    pub skip_hi: u64,
    /// The MPI library's code: a call made from inside it is never an
    /// injection's stop point (the library may hold its locks there).
    pub lib_lo: u64,
    /// See [`ProcConfig::lib_lo`].
    pub lib_hi: u64,
    /// Non-zero: the next application-level call of this process (the
    /// outermost on its thread, made from outside the library) sends this
    /// signal to its own thread, which the daemon, tracing it, catches
    /// there; then it is cleared. See docs/inject.md.
    pub inject_signal: u32,
    /// Non-zero while the probes must record no new call of the process,
    /// only finish the calls already open: while its probes are being
    /// attached (so every function starts counting at one instant, not
    /// link by link), and once an injected shim has rewritten the
    /// process's slots and counts its calls (docs/inject.md, "Handover").
    pub handed_over: u32,
    /// Non-zero: record this process's call sites in [`CALLSITES`] (`attach
    /// --callsites`): the entry of each outermost call reads its return
    /// address, one user-memory read per call.
    pub callsites: u32,
    /// Non-zero: every outermost call of this process is also sent to
    /// [`TRACE`] as a [`TraceCall`] when it returns (`mpi-observer record`
    /// on a rank without the shim).
    pub trace: u32,
    /// Call-site entries ([`CALLSITES`]) this process may create; a call
    /// from a further new site is counted in [`STATS`] and in its
    /// [`SiteCount::refused`]. 0: none. Set by the daemon at attach
    /// ([`DEFAULT_MAX_SITES`]).
    pub max_sites: u32,
    /// The slot of this process's MPI library file in [`SITE_COOKIES`]
    /// (programs loaded with [`FUNC_BY_ADDRESS`] only): processes mapping
    /// the same file share its entries.
    pub lib_slot: u32,
    /// The library's executable mapping in this process: its address minus
    /// its file offset, so a probed address minus this is the probe's file
    /// offset in [`SITE_COOKIES`] ([`FUNC_BY_ADDRESS`] only).
    pub text_bias: u64,
}

/// Bit of [`Inflight::unknown`] marking a call made from
/// [`ProcConfig::skip_lo`]'s range, or begun after
/// [`ProcConfig::handed_over`]: it is tracked, so the calls nested in it
/// stay nested, but never recorded.
pub const INFLIGHT_SKIP: u32 = 1 << 31;

/// Bit of [`Inflight::unknown`] marking a call of a process traced
/// ([`ProcConfig::trace`]) when it began: its return sends a [`TraceCall`].
pub const INFLIGHT_TRACE: u32 = 1 << 30;

/// One completed outermost call, as [`TRACE`] carries it to `mpi-observer
/// record`: the Enter and Leave of the OTF2 trace, and what the entry probe
/// decoded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceCall {
    /// Process (thread group) ID.
    pub tgid: u32,
    /// Thread ID.
    pub tid: u32,
    /// MPI function ID.
    pub func: u32,
    /// Bit `d` set: direction `d`'s bytes could not be decoded.
    pub unknown: u32,
    /// Entry time, `bpf_ktime_get_ns` (CLOCK_MONOTONIC).
    pub start_ns: u64,
    /// Return time, same clock.
    pub end_ns: u64,
    /// Bytes sent and received by the call, as decoded at its entry.
    pub bytes: [u64; 2],
}

/// Default size of [`TRACE`] in bytes; `mpi-observer record` sizes it at
/// load time, the daemon, which never traces, keeps it as small as the
/// kernel allows: the loader rounds it up to a power-of-two number of
/// pages (one 16 or 64 KiB page on such arm64 kernels).
pub const TRACE_BYTES: u32 = 4096;

/// Key of [`OMPI_TYPES`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TypeKey {
    /// Process ID.
    pub tgid: u32,
    /// Padding, always zero.
    pub pad: u32,
    /// Address of the predefined datatype object in that process.
    pub addr: u64,
}

/// Key of [`SITE_COOKIES`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SiteOffset {
    /// The library's slot ([`ProcConfig::lib_slot`]).
    pub slot: u32,
    /// Padding, always zero.
    pub pad: u32,
    /// The probe's file offset in the library.
    pub offset: u64,
}

/// Key of [`CALLSITES`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SiteKey {
    /// Process (thread group) ID.
    pub tgid: u32,
    /// MPI function ID.
    pub func: u32,
    /// Return address of the call in that process ([`Inflight::site`]).
    pub addr: u64,
}

/// Value of [`SITE_COUNTS`]: a process's call-site budget in use.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteCount {
    /// [`CALLSITES`] entries the process's calls created. Checked before
    /// and added after each insert, so threads of the process that create
    /// new sites at the same instant on different CPUs can overshoot
    /// [`ProcConfig::max_sites`], by at most one entry per CPU.
    pub sites: u64,
    /// Calls whose site was not recorded because the process was at its
    /// [`ProcConfig::max_sites`] (or had no configuration).
    pub refused: u64,
}

/// Value of [`CALLSITES`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteStats {
    /// Completed calls from this site.
    pub calls: u64,
    /// Total time inside them.
    pub time_ns: u64,
}

/// Indices of [`ERRORS`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCounter {
    /// A stats entry could not be created (map full).
    StatsUpdate = 0,
    /// An in-flight entry could not be created.
    InflightUpdate = 1,
    /// A call-site entry could not be created (map full): the call is
    /// counted in [`STATS`] but its site is lost.
    CallsiteUpdate = 2,
    /// A traced call could not be sent: [`TRACE`] was full.
    TraceDropped = 3,
    /// An entry probe of a process loaded with [`FUNC_BY_ADDRESS`] hit an
    /// address [`SITE_COOKIES`] does not hold for its library: the call is
    /// not counted.
    SiteUnknown = 4,
}

/// Number of [`ErrorCounter`]s.
pub const ERROR_COUNTERS: u32 = 5;

/// The slot of a duration in the histogram: floor(log2(ns)), capped.
///
/// On the host one count of leading zeros (the shim's hot path, issue 24);
/// BPF has no such instruction, so there a binary search
/// ([`hist_slot_search`], which the tests hold equal).
#[cfg(not(target_arch = "bpf"))]
#[inline(always)]
pub const fn hist_slot(ns: u64) -> usize {
    let l = 63 - (ns | 1).leading_zeros() as usize;
    if l >= HIST_SLOTS { HIST_SLOTS - 1 } else { l }
}

/// The slot of a duration in the histogram: floor(log2(ns)), capped.
#[cfg(target_arch = "bpf")]
#[inline(always)]
pub const fn hist_slot(ns: u64) -> usize {
    hist_slot_search(ns)
}

/// [`hist_slot`] by a branch-light binary search: BPF has no
/// count-leading-zeros.
#[inline(always)]
pub const fn hist_slot_search(ns: u64) -> usize {
    let mut v = ns;
    let mut l = 0;
    if v >> 32 != 0 {
        v >>= 32;
        l += 32;
    }
    if v >> 16 != 0 {
        v >>= 16;
        l += 16;
    }
    if v >> 8 != 0 {
        v >>= 8;
        l += 8;
    }
    if v >> 4 != 0 {
        v >>= 4;
        l += 4;
    }
    if v >> 2 != 0 {
        v >>= 2;
        l += 2;
    }
    if v >> 1 != 0 {
        l += 1;
    }
    if l >= HIST_SLOTS { HIST_SLOTS - 1 } else { l }
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    // aya reads and writes these as raw bytes of the maps' values and keys.
    // SAFETY: repr(C), Copy, integers with explicit padding: any bit
    // pattern is a valid StatKey.
    unsafe impl aya::Pod for StatKey {}
    // SAFETY: repr(C), Copy, integers with explicit padding: any bit
    // pattern is a valid CallStats.
    unsafe impl aya::Pod for CallStats {}
    // SAFETY: repr(C), Copy, integers with explicit padding: any bit
    // pattern is a valid Inflight.
    unsafe impl aya::Pod for Inflight {}
    // SAFETY: repr(C), Copy, integers with explicit padding: any bit
    // pattern is a valid ProcConfig.
    unsafe impl aya::Pod for ProcConfig {}
    // SAFETY: repr(C), Copy, integers with explicit padding: any bit
    // pattern is a valid TypeKey.
    unsafe impl aya::Pod for TypeKey {}
    // SAFETY: repr(C), Copy, integers with explicit padding: any bit
    // pattern is a valid SiteKey.
    unsafe impl aya::Pod for SiteKey {}
    // SAFETY: repr(C), Copy, integers with explicit padding: any bit
    // pattern is a valid SiteStats.
    unsafe impl aya::Pod for SiteStats {}
    // SAFETY: repr(C), Copy, integers with explicit padding: any bit
    // pattern is a valid SiteCount.
    unsafe impl aya::Pod for SiteCount {}
    // SAFETY: repr(C), Copy, integers with explicit padding: any bit
    // pattern is a valid SiteOffset.
    unsafe impl aya::Pod for SiteOffset {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_capacity_is_bounded_by_memory() {
        assert_eq!(STATS_ENTRY_BYTES, 376);
        assert_eq!(CALLSITES_ENTRY_BYTES, 96);
        // The default budget holds the full cap: 768 processes x 340
        // functions and more, 94 MiB.
        assert_eq!(stats_capacity_within(STATS_MEMORY_BUDGET), STATS_CAPACITY);
        assert_eq!(u64::from(STATS_CAPACITY) * STATS_ENTRY_BYTES, 47 << 21);
        // A tiny budget still makes a map; a large one is capped.
        assert_eq!(stats_capacity_within(1), 1);
        assert_eq!(stats_capacity_within(10 * STATS_ENTRY_BYTES), 10);
        assert_eq!(stats_capacity_within(u64::MAX), STATS_CAPACITY);
    }

    #[test]
    fn layouts_have_no_implicit_padding() {
        use core::mem::size_of;
        // Shared with the BPF programs: sizes are the sum of the fields.
        assert_eq!(size_of::<ProcConfig>(), 4 * 2 + 8 * 6 + 4 * 6 + 8);
        assert_eq!(size_of::<SiteOffset>(), 16);
        assert_eq!(size_of::<ProcConfig>() % 8, 0);
        assert_eq!(size_of::<SiteKey>(), 16);
        assert_eq!(size_of::<SiteStats>(), 16);
        assert_eq!(size_of::<SiteCount>(), 16);
        assert_eq!(size_of::<CallStats>(), 304);
        assert_eq!(size_of::<TraceCall>(), 4 * 4 + 2 * 8 + 2 * 8);
        assert_eq!(size_of::<Inflight>(), 8 + 16 + 4 + 4 + 2 * STACK_DEPTH + 8);
    }

    #[test]
    fn error_counters_are_dense() {
        assert_eq!(ErrorCounter::StatsUpdate as u32, 0);
        assert_eq!(ErrorCounter::InflightUpdate as u32, 1);
        assert_eq!(ErrorCounter::CallsiteUpdate as u32, 2);
        assert_eq!(ErrorCounter::TraceDropped as u32, 3);
        assert_eq!(ErrorCounter::SiteUnknown as u32, 4);
        assert_eq!(ERROR_COUNTERS, ErrorCounter::SiteUnknown as u32 + 1);
    }

    #[test]
    fn histogram_slots() {
        assert_eq!(hist_slot(0), 0);
        assert_eq!(hist_slot(1), 0);
        assert_eq!(hist_slot(1023), 9);
        assert_eq!(hist_slot(1024), 10);
        assert_eq!(hist_slot(u64::MAX), HIST_SLOTS - 1);
        for shift in 0..64 {
            for v in [1u64 << shift, (1u64 << shift) - 1, (1u64 << shift) + 1] {
                assert_eq!(hist_slot(v), hist_slot_search(v), "{v}");
            }
        }
    }
}
