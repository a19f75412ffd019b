//! Per-call timing at the `stats` level (issue 10; moved there by issue 24).
//!
//! When the `stats` layer is in the tools list, its wrapper of every row
//! (`timed!`, generated per row into `generated/next.rs`) times the calls
//! that reach its level while no timed call is open on the thread: the
//! outermost calls at that level, measured around the levels below it. With
//! `stats` listed last, right above the MPI library, that is exactly the
//! probes' "outermost call per thread into the library". Calls a tool above
//! `stats` makes on its own (mpiP's `PMPI_Comm_rank` in its `MPI_Init`)
//! reach it and count, as they reach the library and the probes count
//! them; calls a tool swallows never reach it. Before issue 24 the timing
//! sat in the entry points, around the whole stack; it could not stay
//! there once the entry points jump into the first tool rather than call it
//! (crate::dispatch). Fortran calls that reach it (`fort` listed below
//! `stats`) count under their procedure's C function ID.
//!
//! Each timed call reads the clock twice and adds its calls, nanoseconds,
//! log2 histogram slot and bytes to the segment's [`CallTiming`] row, with
//! the stats layer's plain-or-atomic add (`State::add`: atomic under
//! `MPI_THREAD_MULTIPLE`). Calls that end before the segment exists
//! (`MPI_Initialized`, `MPI_Get_version`... before `MPI_Init`) are kept in
//! a process-local block, [`EARLY`](crate::stats::segment::EARLY), that
//! the segment starts from: so the segment holds every application-level
//! call of the process, which is what lets the daemon use it alone for a
//! rank (see docs/stats.md). `MPI_Init`
//! and `MPI_Init_thread` land in the segment itself, which they create
//! before they return.
//!
//! **The clock.** `CLOCK_MONOTONIC` through the vDSO costs about 20 ns
//! here; the CPU's time-stamp counter about 9. When the kernel itself keeps
//! time with the TSC (its clocksource is `tsc`, which it only chooses for an
//! invariant, synchronised counter), calls are timed with `rdtsc`, converted
//! with a ratio measured against `CLOCK_MONOTONIC` over the first
//! [`CALIBRATION_NS`] after timing starts; until then, and on any other
//! clocksource, with `clock_gettime`. A start read from the TSC carries
//! [`TSC`] so a call that straddles the switch is still measured right.
//!
//! **Call sites.** Each timed call also counts, calls and nanoseconds, in
//! the segment's call-site table under (function, call site): the return
//! address the entry point's trampoline stored (`entry!` in
//! [`crate::dispatch`]), the instruction after the application's `call`.
//! Calls between levels do not pass the trampolines, so a call a tool makes
//! on its own counts under the application's call that it serves.
//! `MPI_OBSERVER_CALLSITES=0`, read when the stack is built, turns the
//! table off ([`set_callsites`](crate::stats::segment::set_callsites)).
//! Calls timed before the segment exists are in `EARLY` only, not in the
//! table.
//!
//! **Bytes** follow the probes' definition (README, "Byte conventions"), from
//! the same per-function table (`FunctionInfo::bytes`): count x type size of
//! the named arguments, `MPI_IN_PLACE` counting nothing, a negative count or
//! a type the library cannot size counting as unknown. The type size comes
//! from the stats layer's ABI (the handle for MPICH's builtins and the
//! standard ABI's fixed-size types, else the library's `MPI_Type_size_x`),
//! so derived types are sized too. Fortran calls count their bytes as
//! unknown: their arguments are Fortran handles passed by reference.
//!
//! [`CallTiming`]: observer_common::segment::CallTiming

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use observer_common::{
    FUNCTION_COUNT, FUNCTIONS,
    functions::{CountKind, Family},
    maps::hist_slot,
};

use crate::generated::fortran::FORTRAN;

/// Whether calls are timed: the `stats` layer is in the list.
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Turns timing on; called while the stack is built.
pub(crate) fn enable() {
    start_calibration();
    ENABLED.store(true, Relaxed);
}

/// Whether calls are timed.
#[inline(always)]
pub(crate) fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// `CLOCK_MONOTONIC` in nanoseconds, through the vDSO; never 0, and below
/// [`TSC`].
#[inline(always)]
fn now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    (t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64).clamp(1, TSC - 1)
}

/// Marks a start read from the TSC (a count below 2^63: a century at 3 GHz);
/// the wait records read starts back ([`crate::depth::start_in`]).
const TSC: u64 = crate::depth::START_TICKS;
/// How long the TSC is measured against `CLOCK_MONOTONIC` before it is used.
const CALIBRATION_NS: u64 = 5_000_000;

/// Nanoseconds per TSC tick in 32.32 fixed point; 0 until calibrated, and
/// for ever where the kernel does not keep time with the TSC.
static TSC_MULT: AtomicU64 = AtomicU64::new(0);
/// The calibration's start: (TSC, `CLOCK_MONOTONIC`); TSC 0 = no TSC.
static CAL_TSC: AtomicU64 = AtomicU64::new(0);
static CAL_NS: AtomicU64 = AtomicU64::new(0);

/// The CPU's counter ([`crate::arch::ticks`]): the TSC on x86_64, the
/// generic timer's virtual count on aarch64. The name stays for the
/// profiles that look for it (xtask's bench_shim_profile).
#[inline(always)]
fn rdtsc() -> u64 {
    crate::arch::ticks()
}

/// Whether the kernel's clocksource is the CPU's counter (`tsc`, or
/// `arch_sys_counter` on aarch64): read once, when timing starts, with
/// plain system calls.
fn kernel_uses_tsc() -> bool {
    const PATH: &core::ffi::CStr =
        c"/sys/devices/system/clocksource/clocksource0/current_clocksource";
    // Room for the longest name compared and more: a buffer the name fills
    // exactly would match a longer name's prefix.
    let mut buf = [0u8; 32];
    // SAFETY: open/read/close of a NUL-terminated path into an owned buffer.
    let n = unsafe {
        let fd = libc::open(PATH.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return false;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    n > 0 && &buf[..n as usize] == crate::arch::COUNTER_CLOCKSOURCE
}

/// Whether a calibrated `mult` (nanoseconds per tick, 32.32) agrees within
/// 1% with the frequency the ISA says the counter runs at, where it says
/// one (aarch64's `cntfrq_el0`); always where it says none (x86_64).
fn agrees_with_frequency(mult: u64, hz: Option<u64>) -> bool {
    let Some(hz) = hz else {
        return true;
    };
    let said = (1_000_000_000u128 << 32) / u128::from(hz);
    u128::from(mult).abs_diff(said) <= said / 100
}

/// Starts measuring the TSC against the clock, if the kernel trusts it.
fn start_calibration() {
    if kernel_uses_tsc() {
        CAL_NS.store(now_ns(), Relaxed);
        CAL_TSC.store(rdtsc().max(1), Relaxed);
    }
}

/// Finishes the calibration once [`CALIBRATION_NS`] have passed since it
/// started; `now` is `CLOCK_MONOTONIC`.
#[cold]
fn try_calibrate(now: u64) {
    let t0 = CAL_TSC.load(Relaxed);
    let n0 = CAL_NS.load(Relaxed);
    if t0 == 0 || now < n0 + CALIBRATION_NS {
        return;
    }
    let ticks = rdtsc().wrapping_sub(t0);
    let ns = now_ns() - n0;
    if ticks == 0 || ticks >= TSC {
        // A counter that stood still or went back: keep the clock.
        CAL_TSC.store(0, Relaxed);
        return;
    }
    let mult = ((u128::from(ns) << 32) / u128::from(ticks)) as u64;
    if !agrees_with_frequency(mult, crate::arch::counter_hz()) {
        // A counter that runs at another rate than it says: keep the clock.
        CAL_TSC.store(0, Relaxed);
        return;
    }
    TSC_MULT.store(mult.max(1), Relaxed);
    crate::stats::counter_rate(mult.max(1));
}

/// Whether calls are timed with the CPU's counter, or will be once it is
/// calibrated: the kernel keeps time with it, so it is one counter for
/// every process of the node (the wait records' clock, `stats::waits`).
pub(crate) fn counter_trusted() -> bool {
    CAL_TSC.load(Relaxed) != 0 || TSC_MULT.load(Relaxed) != 0
}

/// The start of a timed call: a TSC count with [`TSC`] set, or nanoseconds.
#[inline(always)]
fn start() -> u64 {
    if TSC_MULT.load(Relaxed) != 0 {
        rdtsc() | TSC
    } else {
        now_ns()
    }
}

/// Nanoseconds since `t0`, a value of [`start`].
#[inline(always)]
fn elapsed(t0: u64) -> u64 {
    if t0 & TSC != 0 {
        let ticks = rdtsc().wrapping_sub(t0 & !TSC);
        if ticks >= TSC {
            // Read on another CPU a little behind: no time.
            return 0;
        }
        ((u128::from(ticks) * u128::from(TSC_MULT.load(Relaxed))) >> 32) as u64
    } else {
        let now = now_ns();
        if CAL_TSC.load(Relaxed) != 0 && TSC_MULT.load(Relaxed) == 0 {
            try_calibrate(now);
        }
        now.saturating_sub(t0)
    }
}

/// Opens a timed call if none is open on this thread: returns its start,
/// or 0 (a call nested in a timed one).
///
/// # Safety
/// `depth` is this thread's depth variable ([`crate::depth::slot`]).
#[inline(always)]
pub(crate) unsafe fn enter(depth: *mut u32, row: usize) -> u64 {
    // SAFETY: the word after the depth is this thread's timing flag.
    let flag = unsafe { depth.add(1) };
    // SAFETY: as above.
    if unsafe { flag.read() } != 0 {
        return 0;
    }
    // SAFETY: as above.
    unsafe { flag.write(1) };
    let t0 = start();
    // SAFETY: this thread's block; the wait records read it back.
    unsafe { crate::depth::set_call(depth, t0, row as u32) };
    t0
}

/// A timed call's bytes by the probes' definition: per direction, and bit
/// `d` of `unknown` when direction `d`'s figure could not be known.
#[derive(Clone, Copy, Default)]
pub(crate) struct Bytes {
    bytes: [u64; 2],
    unknown: u8,
}

/// Whether row `row` is a C procedure that moves data by the probes'
/// definition; Fortran rows (`row >= FUNCTION_COUNT`) are counted as
/// unknown in [`leave`] instead.
pub(crate) const fn has_bytes(row: usize) -> bool {
    row < FUNCTION_COUNT
        && (!matches!(FUNCTIONS[row].bytes[0].kind, CountKind::None)
            || !matches!(FUNCTIONS[row].bytes[1].kind, CountKind::None))
}

/// The bytes of a call of C procedure `row` with argument words `args`,
/// read at entry as the probe does (`observer-ebpf/src/bytes.rs`).
#[inline(never)]
pub(crate) fn bytes(row: usize, args: &[usize]) -> Bytes {
    let info = &FUNCTIONS[row];
    let mut out = Bytes::default();
    let state = crate::stats::segment::state();
    for p in &info.bytes {
        let dir = p.direction as usize & 1;
        let word = |i: u8| args.get(usize::from(i)).copied();
        let count = match p.kind {
            CountKind::None => continue,
            CountKind::Unknowable => None,
            CountKind::Int32 => word(p.count).map(|w| i64::from(w as u32 as i32)),
            CountKind::Count64 => word(p.count).map(|w| w as i64),
        };
        // Before MPI_Init no call moves data; after it, the segment knows
        // the ABI.
        let Some(s) = state else {
            out.unknown |= 1 << dir;
            continue;
        };
        if matches!(info.family, Family::Collective) && word(p.buf) == Some(s.abi.c.in_place) {
            continue;
        }
        let size = match (count, word(p.datatype)) {
            (Some(0), _) => Some(0),
            (Some(n), Some(dt)) if n > 0 => s.abi.bytes(n, s.abi.handle(dt)),
            _ => None,
        };
        match size {
            Some(b) => out.bytes[dir] += b,
            None => out.unknown |= 1 << dir,
        }
    }
    out
}

/// The `stats` layer's wrapper of row `$row`: a function taking the row's
/// words and returning `$ret`, which times the call (see the module's
/// documentation) around the layer's own wrapper of the row, or around the
/// next level for the rows the layer only times ([`crate::stats::inner`]).
/// Expands to its address.
macro_rules! timed {
    ($row:expr, $ret:ty, ($($a:ident),*)) => {{
        #[doc = "A `stats` timing wrapper: see `timed!`."]
        unsafe extern "C" fn timed($($a: usize),*) -> $ret {
            let f = $crate::stats::inner($row);
            // SAFETY: the layer's wrapper of this row or the next level,
            // both taking these words and returning this type.
            let f: unsafe extern "C" fn($(word!($a)),*) -> $ret = unsafe { core::mem::transmute(f) };
            let block = $crate::depth::slot();
            // SAFETY: this thread's block.
            let t0 = if $crate::timing::enabled() { unsafe { $crate::timing::enter(block, $row) } } else { 0 };
            if t0 == 0 {
                // SAFETY: the words this call was made with.
                return unsafe { f($($a),*) };
            }
            // SAFETY: this thread's block; read before any nested call.
            let site = unsafe { $crate::depth::site(block) };
            // Bytes by the probes' definition, read at entry as the probe
            // does; only for the procedures that move data.
            let b = if const { $crate::timing::has_bytes($row) } {
                $crate::timing::bytes($row, &[$($a),*])
            } else {
                $crate::timing::Bytes::default()
            };
            // Enter and Leave for `mpi-observer record`: one load while no
            // recording is on.
            let traced = $crate::stats::trace::enter($row);
            // SAFETY: the words this call was made with, passed on unchanged.
            let r = unsafe { f($($a),*) };
            if traced {
                $crate::stats::trace::leave($row);
            }
            $crate::timing::leave($row, t0, b, site);
            r
        }
        $crate::rows::Raw(timed as *const core::ffi::c_void)
    }};
}

/// Closes the timed call of `row` started at `t0` and records it with its
/// bytes `b` and its call site `site` (0: not known, not recorded).
#[inline(never)]
pub(crate) fn leave(row: usize, t0: u64, b: Bytes, site: u64) {
    let ns = elapsed(t0);
    // SAFETY: this thread's depth variable, the flag after it, and the
    // call's start, which no record may take once the call is over.
    unsafe {
        let block = crate::depth::slot_again();
        block.add(1).write(0);
        crate::depth::set_call(block, 0, 0);
    }
    crate::got::poll();
    let (id, b) = if row < FUNCTION_COUNT {
        (row, b)
    } else {
        let f = FORTRAN[row - FUNCTION_COUNT].function as usize;
        let unknown = if has_bytes(f) {
            let info = &FUNCTIONS[f];
            info.bytes
                .iter()
                .filter(|p| !matches!(p.kind, CountKind::None))
                .fold(0, |u, p| u | 1 << (p.direction as u8 & 1))
        } else {
            0
        };
        (
            f,
            Bytes {
                bytes: [0; 2],
                unknown,
            },
        )
    };
    let Some(s) = crate::stats::segment::state() else {
        // Before MPI_Init: rare, so always atomic.
        let c = &crate::stats::segment::EARLY[id];
        c.calls.fetch_add(1, Relaxed);
        c.time_ns.fetch_add(ns, Relaxed);
        c.hist[hist_slot(ns)].fetch_add(1, Relaxed);
        for d in 0..2 {
            if b.unknown & (1 << d) != 0 {
                c.bytes_unknown[d].fetch_add(1, Relaxed);
            }
        }
        return;
    };
    let c = &s.timing[id];
    s.add(&c.calls, 1);
    s.add(&c.time_ns, ns);
    if site != 0 {
        s.callsite(id, site, ns);
    }
    s.add(&c.hist[hist_slot(ns)], 1);
    for d in 0..2 {
        if b.unknown & (1 << d) != 0 {
            s.add(&c.bytes_unknown[d], 1);
        } else if b.bytes[d] != 0 {
            s.add(&c.bytes[d], b.bytes[d]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calibration_must_agree_with_the_said_frequency() {
        // 1 GHz: 1 ns a tick; 62.5 MHz (QEMU's counter): 16 ns a tick.
        for (hz, ns_per_tick) in [(1_000_000_000u64, 1u64), (62_500_000, 16)] {
            let mult = ns_per_tick << 32;
            assert!(agrees_with_frequency(mult, Some(hz)));
            assert!(agrees_with_frequency(mult + mult / 200, Some(hz)));
            assert!(!agrees_with_frequency(mult + mult / 50, Some(hz)));
            assert!(!agrees_with_frequency(mult - mult / 50, Some(hz)));
            assert!(!agrees_with_frequency(2 * mult, Some(hz)));
        }
        // No frequency said (the TSC): the calibration alone decides.
        assert!(agrees_with_frequency(12345, None));
    }

    #[test]
    fn the_clocksource_name_fits_the_buffer_with_room() {
        assert!(crate::arch::COUNTER_CLOCKSOURCE.len() < 32);
        assert!(b"arch_sys_counter\n".len() < 32);
    }
}
