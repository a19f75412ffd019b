//! Timing shared by every family: entry pushes the function on the thread's
//! stack of open MPI calls, return pops it, and only the outermost call is
//! counted, so an MPI call that the library implements with other PMPI calls
//! counts once, as the application made it.

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        generated::{bpf_get_attach_cookie, bpf_send_signal_thread},
    },
    macros::{uprobe, uretprobe},
    programs::{ProbeContext, RetProbeContext},
};
use observer_common::{
    FunctionId, cookie,
    maps::{
        CallStats, ErrorCounter, INFLIGHT_SKIP, INFLIGHT_TRACE, Inflight, STACK_DEPTH, SiteKey,
        SiteOffset, SiteStats, StatKey, TraceCall, hist_slot,
    },
};

use crate::{
    CALLSITES, ERRORS, FUNC_BY_ADDRESS, INFLIGHT, PERCPU_STATS, PROCS, SITE_COOKIES, SITE_COUNTS,
    STATS, STATS_PERCPU, TRACE, ZERO, arch, bytes, pidns,
};

/// Entry of a call that moves no data of its own (synchronisation, request
/// completion, one-sided, I/O, everything else).
#[uprobe]
pub fn mpi_enter(ctx: ProbeContext) -> u32 {
    enter(&ctx, false);
    0
}

/// Return of any probed call.
#[uretprobe]
pub fn mpi_return(ctx: RetProbeContext) -> u32 {
    leave(&ctx);
    0
}

fn bump(counter: ErrorCounter) {
    if let Some(p) = ERRORS.get_ptr_mut(counter as u32) {
        // SAFETY: this CPU's slot of a per-CPU array, valid for the program's
        // run; only programs on this CPU write it, and they do not nest.
        unsafe { *p += 1 };
    }
}

/// Common entry: `with_bytes` decodes the call's data arguments too.
#[inline(always)]
pub fn enter(ctx: &ProbeContext, with_bytes: bool) {
    // SAFETY: a global of the object, constant once loaded.
    let by_address = unsafe { core::ptr::read_volatile(&FUNC_BY_ADDRESS) } != 0;
    // A task outside the daemon's pid namespace is no rank of its.
    let Some(id) = pidns::pid_tgid(bpf_get_current_pid_tgid()) else {
        return;
    };
    let cookie = if by_address {
        0
    } else {
        // SAFETY: the context pointer the kernel passed this program, which
        // is what the helper expects.
        unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
    };
    if let Some(e) = INFLIGHT.get_ptr_mut(&id) {
        // Nested inside another probed call: remember it, count nothing.
        // SAFETY: an INFLIGHT value (preallocated), valid for the program's
        // run; its key is this thread's pid_tgid, so only this thread's
        // probes, which run one at a time, use it.
        let e = unsafe { &mut *e };
        let d = e.depth as usize;
        if d < STACK_DEPTH {
            // By address, a nested call is not looked up (only its depth
            // matters): 0, which the return probe then does not check.
            e.stack[d] = cookie::function(cookie) as u16;
        }
        e.depth += 1;
        return;
    }
    // Only processes the daemon configured are recorded: a process sharing
    // an attached one's memory (clone with CLONE_VM, no CLONE_THREAD) also
    // hits its probes, and must not create statistics entries under its own
    // tgid; so a process's entries are bounded by the functions it was
    // attached with (the cookie), never by anything it controls. Such a
    // process is not observed, as no process the daemon did not attach is.
    // With probes on a whole library file (`attach --all` on classic
    // uprobes), every process mapping it hits them: the same lookup leaves
    // all but the configured ones.
    let tgid = (id >> 32) as u32;
    let Some(cfg) = PROCS.get_ptr_mut(&tgid) else {
        return;
    };
    let cookie = if by_address {
        // SAFETY: a PROCS value, valid for the program's run.
        let (slot, bias) = unsafe { ((*cfg).lib_slot, (*cfg).text_bias) };
        let key = SiteOffset {
            slot,
            pad: 0,
            offset: arch::instruction_pointer(ctx).wrapping_sub(bias),
        };
        // SAFETY: a SITE_COOKIES value, only read, valid for the program's
        // run.
        match unsafe { SITE_COOKIES.get(&key) } {
            Some(c) => *c,
            None => {
                bump(ErrorCounter::SiteUnknown);
                return;
            }
        }
    } else {
        cookie
    };
    let func = cookie::function(cookie) as u16;
    let mut e = Inflight {
        start_ns: 0,
        bytes: [0; 2],
        depth: 1,
        unknown: 0,
        stack: [0; STACK_DEPTH],
        site: 0,
    };
    e.stack[0] = func;
    {
        // SAFETY: a PROCS value, valid for the program's run and kept until
        // the process's probe links are closed. The one write,
        // `inject_signal = 0`, may race with another thread's same write,
        // which only means both stop (the daemon expects that).
        let cfg = unsafe { &mut *cfg };
        if cfg.handed_over != 0 {
            // The injected shim counts every call from now on: finish the
            // open ones, track new ones so their nested calls stay nested,
            // record none.
            e.unknown = INFLIGHT_SKIP;
            if INFLIGHT.insert(&id, &e, 0).is_err() {
                bump(ErrorCounter::InflightUpdate);
            }
            return;
        }
        // One read of the return address serves the skip range, the
        // injection's stop point and the call site; with none of them set,
        // a process pays these three tests and no read.
        if cfg.skip_hi != 0 || cfg.inject_signal != 0 || cfg.callsites != 0 {
            // 0 if it cannot be read: the call then has no site.
            let from = arch::return_address(ctx).unwrap_or(0);
            if cfg.callsites != 0 {
                e.site = from;
            }
            if from >= cfg.skip_lo && from < cfg.skip_hi {
                // Made by the injected shim, which counts it: track it so
                // its nested calls stay nested, never record it.
                e.unknown = INFLIGHT_SKIP;
                if INFLIGHT.insert(&id, &e, 0).is_err() {
                    bump(ErrorCounter::InflightUpdate);
                }
                return;
            }
            let sig = cfg.inject_signal;
            // Not at MPI_Init: the shim needs MPI initialised, and a rank
            // found by `--all` as it starts would be refused for good.
            let init = func == FunctionId::Init as u16 || func == FunctionId::InitThread as u16;
            if sig != 0 && !init && !(from >= cfg.lib_lo && from < cfg.lib_hi) {
                // The injection's stop point: the application's own call,
                // at its entry. One thread is enough; the daemon sends any
                // other that raced here on its way.
                cfg.inject_signal = 0;
                // SAFETY: signals the current thread with the number the
                // daemon configured; no memory is involved.
                unsafe { bpf_send_signal_thread(sig) };
            }
        }
        if cfg.trace != 0 {
            e.unknown |= INFLIGHT_TRACE;
        }
    }
    if with_bytes && cookie::has_bytes(cookie) {
        bytes::account(ctx, cookie, tgid, &mut e);
    }
    // Read the clock last so argument decoding is not charged to the call.
    // SAFETY: reads the monotonic clock; no arguments, no memory.
    e.start_ns = unsafe { bpf_ktime_get_ns() };
    if INFLIGHT.insert(&id, &e, 0).is_err() {
        bump(ErrorCounter::InflightUpdate);
    }
}

#[inline(always)]
fn leave(ctx: &RetProbeContext) {
    // SAFETY: reads the monotonic clock; no arguments, no memory.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a global of the object, constant once loaded.
    let by_address = unsafe { core::ptr::read_volatile(&FUNC_BY_ADDRESS) } != 0;
    let Some(id) = pidns::pid_tgid(bpf_get_current_pid_tgid()) else {
        return;
    };
    let Some(e) = INFLIGHT.get_ptr_mut(&id) else {
        // The call began before we attached: it is not ours to time.
        return;
    };
    // SAFETY: an INFLIGHT value, valid for the program's run and used only
    // by this thread's probes (its key is this thread's pid_tgid).
    let e = unsafe { &mut *e };
    let d = e.depth as usize;
    if d == 0 {
        return;
    }
    // A return whose entry we never saw (its entry probe was not attached
    // yet when the call began) must not unwind someone else's call. By
    // address there is no cookie to check against: the stack is trusted,
    // which only matters while a process's probes are going in, when its
    // calls are not recorded anyway (`ProcConfig::handed_over`).
    if !by_address {
        // SAFETY: the context pointer the kernel passed this program, which
        // is what the helper expects.
        let func = cookie::function(unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }) as u16;
        if d <= STACK_DEPTH && e.stack[(d - 1) & (STACK_DEPTH - 1)] != func {
            return;
        }
    }
    if d > 1 {
        e.depth -= 1;
        return;
    }
    let done = *e;
    let _ = INFLIGHT.remove(&id);
    if done.unknown & INFLIGHT_SKIP != 0 {
        return;
    }
    let tgid = (id >> 32) as u32;
    let func = u32::from(done.stack[0]);
    let ns = now.saturating_sub(done.start_ns);
    record(StatKey { tgid, func }, ns, &done);
    if done.unknown & INFLIGHT_TRACE != 0 {
        let call = TraceCall {
            tgid,
            tid: id as u32,
            func,
            unknown: done.unknown & 3,
            start_ns: done.start_ns,
            end_ns: now,
            bytes: done.bytes,
        };
        if TRACE.output::<TraceCall>(&call, 0).is_err() {
            bump(ErrorCounter::TraceDropped);
        }
    }
    if done.site != 0 {
        record_site(
            SiteKey {
                tgid,
                func,
                addr: done.site,
            },
            ns,
        );
    }
}

/// Adds `v` to the u64 at `p` with one BPF atomic add, `lock *(u64 *)(r +
/// 0) += r` (BPF_STX | BPF_ATOMIC, imm BPF_ADD without BPF_FETCH: the old
/// XADD, which every kernel with BPF accepts). Written out because core's
/// `AtomicU64` has no `fetch_add` on the BPF target (no compare-and-swap
/// there), and the fetching form would need a newer kernel.
///
/// # Safety
/// `p` points into a map value the program looked up, 8-aligned (the value
/// layouts are u64s); the kernel keeps it alive for the program's run.
#[inline(always)]
unsafe fn add(p: *mut u64, v: u64) {
    // SAFETY: the caller's contract; the instruction touches only `*p`.
    unsafe {
        core::arch::asm!(
            "lock *(u64 *)({p} + 0) += {v}",
            p = in(reg) p,
            v = in(reg) v,
            options(nostack, preserves_flags),
        )
    };
}

/// Adds a completed call to its call site's figures (`attach --callsites`).
/// After [`record`], so a scrape that reads the sites before the statistics
/// never sees more calls at a function's sites than at the function. A new
/// site is created only while its process is within its
/// [`observer_common::maps::ProcConfig::max_sites`]: the site address is
/// the process's to choose, so without the cap one process could fill the
/// map for everyone.
#[inline(always)]
fn record_site(key: SiteKey, ns: u64) {
    if let Some(s) = CALLSITES.get_ptr_mut(&key) {
        // SAFETY: a CALLSITES value, valid for the program's run; its fields
        // are 8-aligned u64s: add's contract.
        unsafe {
            add(&raw mut (*s).calls, 1);
            add(&raw mut (*s).time_ns, ns);
        }
        return;
    }
    let Some(count) = SITE_COUNTS.get_ptr_mut(&key.tgid) else {
        // Attached without its entry (the daemon's insert failed).
        bump(ErrorCounter::CallsiteUpdate);
        return;
    };
    // SAFETY: a PROCS value (a preallocated map), whose memory the kernel
    // keeps for the program's run; the daemon removes a process's entry
    // only after every probe link of that process is closed.
    let max = unsafe { PROCS.get(&key.tgid) }.map_or(0, |c| c.max_sites);
    // SAFETY: a map value, alive for the program's run; another CPU may add
    // to it meanwhile, hence the volatile read (the overshoot this allows
    // is bounded by the CPUs, see SiteCount::sites).
    let sites = unsafe { core::ptr::read_volatile(&raw const (*count).sites) };
    if sites >= u64::from(max) {
        // SAFETY: a SITE_COUNTS value, valid for the program's run; an
        // 8-aligned u64 field: add's contract.
        unsafe { add(&raw mut (*count).refused, 1) };
        return;
    }
    // Created holding this call, so no second lookup on success.
    let first = SiteStats {
        calls: 1,
        time_ns: ns,
    };
    if CALLSITES
        .insert(&key, &first, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        // SAFETY: as above, add's contract.
        unsafe { add(&raw mut (*count).sites, 1) };
        return;
    }
    // Another CPU created it meanwhile, or the map is full.
    match CALLSITES.get_ptr_mut(&key) {
        // SAFETY: a CALLSITES value, as at the top: add's contract.
        Some(s) => unsafe {
            add(&raw mut (*s).calls, 1);
            add(&raw mut (*s).time_ns, ns);
        },
        None => bump(ErrorCounter::CallsiteUpdate),
    }
}

/// Adds a completed call to its (process, function) statistics, creating
/// the entry from the zero template if absent (another CPU may create it
/// meanwhile: NOEXIST failing is fine); a full map is counted in
/// [`ErrorCounter::StatsUpdate`].
#[inline(always)]
fn record(key: StatKey, ns: u64, done: &Inflight) {
    // SAFETY: a global of the object, constant once loaded.
    if unsafe { core::ptr::read_volatile(&PERCPU_STATS) } != 0 {
        record_percpu(key, ns, done);
        return;
    }
    let s = match STATS.get_ptr_mut(&key) {
        Some(s) => s,
        None => {
            // The template lives in a map: too large for the BPF stack.
            let Some(zero) = ZERO.get_ptr(0) else { return };
            // SAFETY: ZERO's one entry, alive as long as the map and never
            // written.
            let _ = STATS.insert(&key, unsafe { &*zero }, u64::from(BPF_NOEXIST));
            let Some(s) = STATS.get_ptr_mut(&key) else {
                bump(ErrorCounter::StatsUpdate);
                return;
            };
            s
        }
    };
    let s: *mut CallStats = s;
    // SAFETY: a value of STATS, alive for the program's run; every field
    // is a u64 other CPUs add to atomically too.
    unsafe {
        add(&raw mut (*s).calls, 1);
        add(&raw mut (*s).time_ns, ns);
        add(&raw mut (*s).hist[hist_slot(ns)], 1);
        for dir in 0..2 {
            if done.unknown & (1 << dir) != 0 {
                add(&raw mut (*s).bytes_unknown[dir], 1);
            } else if done.bytes[dir] != 0 {
                add(&raw mut (*s).bytes[dir], done.bytes[dir]);
            }
        }
    }
}

/// [`record`] into the per-CPU map, as before the shared one: plain adds to
/// this CPU's value. Only for `cargo xtask bench kmaps`.
#[inline(always)]
fn record_percpu(key: StatKey, ns: u64, done: &Inflight) {
    let s = match STATS_PERCPU.get_ptr_mut(&key) {
        Some(s) => s,
        None => {
            let Some(zero) = ZERO.get_ptr(0) else { return };
            // SAFETY: ZERO's one entry, alive as long as the map and never
            // written.
            let _ = STATS_PERCPU.insert(&key, unsafe { &*zero }, u64::from(BPF_NOEXIST));
            let Some(s) = STATS_PERCPU.get_ptr_mut(&key) else {
                bump(ErrorCounter::StatsUpdate);
                return;
            };
            s
        }
    };
    // SAFETY: this CPU's copy of a per-CPU map value, valid for the
    // program's run; only programs on this CPU write it, and they do not
    // nest.
    let s = unsafe { &mut *s };
    s.calls += 1;
    s.time_ns += ns;
    s.hist[hist_slot(ns)] += 1;
    for dir in 0..2 {
        if done.unknown & (1 << dir) != 0 {
            s.bytes_unknown[dir] += 1;
        } else {
            s.bytes[dir] += done.bytes[dir];
        }
    }
}
