//! Timing shared by every family: entry pushes the function on the thread's
//! stack of open MPI calls, return pops it, and only the outermost call is
//! counted, so an MPI call that the library implements with other PMPI calls
//! counts once, as the application made it.

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user,
        generated::{bpf_get_attach_cookie, bpf_send_signal_thread},
    },
    macros::{uprobe, uretprobe},
    maps::PerCpuHashMap,
    programs::{ProbeContext, RetProbeContext},
};
use observer_common::{
    FunctionId, cookie,
    maps::{
        ErrorCounter, INFLIGHT_SKIP, INFLIGHT_TRACE, Inflight, STACK_DEPTH, SiteKey, SiteStats,
        StatKey, TraceCall, hist_slot,
    },
};

use crate::{CALLSITES, ERRORS, INFLIGHT, PROCS, STATS, TRACE, ZERO, bytes};

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
        unsafe { *p += 1 };
    }
}

/// Common entry: `with_bytes` decodes the call's data arguments too.
#[inline(always)]
pub fn enter(ctx: &ProbeContext, with_bytes: bool) {
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let func = cookie::function(cookie) as u16;
    let id = bpf_get_current_pid_tgid();
    if let Some(e) = INFLIGHT.get_ptr_mut(&id) {
        // Nested inside another probed call: remember it, count nothing.
        let e = unsafe { &mut *e };
        let d = e.depth as usize;
        if d < STACK_DEPTH {
            e.stack[d] = func;
        }
        e.depth += 1;
        return;
    }
    let mut e = Inflight {
        start_ns: 0,
        bytes: [0; 2],
        depth: 1,
        unknown: 0,
        stack: [0; STACK_DEPTH],
        site: 0,
    };
    e.stack[0] = func;
    if let Some(cfg) = PROCS.get_ptr_mut(&((id >> 32) as u32)) {
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
            // At the entry, before the first instruction, rsp points at the
            // return address: the caller's code.
            let rsp = unsafe { core::ptr::read_volatile(&(*ctx.regs).rsp) };
            let from = unsafe { bpf_probe_read_user(rsp as *const u64) }.unwrap_or(0);
            if cfg.callsites != 0 {
                // 0 if the read failed: the call then has no site.
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
                unsafe { bpf_send_signal_thread(sig) };
            }
        }
        if cfg.trace != 0 {
            e.unknown |= INFLIGHT_TRACE;
        }
    }
    if with_bytes && cookie::has_bytes(cookie) {
        bytes::account(ctx, cookie, (id >> 32) as u32, &mut e);
    }
    // Read the clock last so argument decoding is not charged to the call.
    e.start_ns = unsafe { bpf_ktime_get_ns() };
    if INFLIGHT.insert(&id, &e, 0).is_err() {
        bump(ErrorCounter::InflightUpdate);
    }
}

#[inline(always)]
fn leave(ctx: &RetProbeContext) {
    let now = unsafe { bpf_ktime_get_ns() };
    let cookie = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) };
    let func = cookie::function(cookie) as u16;
    let id = bpf_get_current_pid_tgid();
    let Some(e) = INFLIGHT.get_ptr_mut(&id) else {
        // The call began before we attached: it is not ours to time.
        return;
    };
    let e = unsafe { &mut *e };
    let d = e.depth as usize;
    if d == 0 {
        return;
    }
    // A return whose entry we never saw (its entry probe was not attached
    // yet when the call began) must not unwind someone else's call.
    if d <= STACK_DEPTH && e.stack[(d - 1) & (STACK_DEPTH - 1)] != func {
        return;
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

/// Adds a completed call to its call site's figures (`attach --callsites`).
/// After [`record`], so a scrape that reads the sites before the statistics
/// never sees more calls at a function's sites than at the function.
#[inline(always)]
fn record_site(key: SiteKey, ns: u64) {
    let Some(s) = entry(
        &CALLSITES,
        &key,
        &SiteStats::default(),
        ErrorCounter::CallsiteUpdate,
    ) else {
        return;
    };
    let s = unsafe { &mut *s };
    s.calls += 1;
    s.time_ns += ns;
}

/// This CPU's value of `key` in `map`, created from `zero` if absent;
/// `None`, counted in `failure`, when the map is full. Another CPU may
/// create it meanwhile: NOEXIST failing is fine. (An insert from a program
/// zeroes the other CPUs' values, which is why the key is created once.)
#[inline(always)]
fn entry<K, V>(
    map: &PerCpuHashMap<K, V>,
    key: &K,
    zero: &V,
    failure: ErrorCounter,
) -> Option<*mut V> {
    if let Some(v) = map.get_ptr_mut(key) {
        return Some(v);
    }
    let _ = map.insert(key, zero, u64::from(BPF_NOEXIST));
    let v = map.get_ptr_mut(key);
    if v.is_none() {
        bump(failure);
    }
    v
}

#[inline(always)]
fn record(key: StatKey, ns: u64, done: &Inflight) {
    let s = match STATS.get_ptr_mut(&key) {
        Some(s) => s,
        None => {
            // The template lives in a map: too large for the BPF stack.
            let Some(zero) = ZERO.get_ptr(0) else { return };
            let Some(s) = entry(&STATS, &key, unsafe { &*zero }, ErrorCounter::StatsUpdate) else {
                return;
            };
            s
        }
    };
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
