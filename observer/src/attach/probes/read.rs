//! Reading the maps the probes fill, at scrape time: the statistics per
//! process and function, the call-site figures per process, function and
//! site, the per-process call-site counts, and the per-CPU error counters.

use std::collections::BTreeMap;

use aya::maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap};
use observer_common::maps::{
    self, CallStats, ErrorCounter, SiteCount, SiteKey, SiteStats, StatKey,
};

use super::{CallsByFunction, MapFailures, RawSite};

/// Reads the statistics of the shared map: batched if the kernel allows,
/// else entry by entry. Empty if the map cannot be opened. A value the
/// probes are adding to meanwhile may be read between two of its fields'
/// adds (a call in `calls` not yet in the histogram); the next scrape has
/// it whole.
pub(super) fn stats(ebpf: &aya::Ebpf) -> BTreeMap<u32, CallsByFunction> {
    let Some(map) = ebpf.map(maps::STATS) else {
        return BTreeMap::new();
    };
    let mut out: BTreeMap<u32, CallsByFunction> = BTreeMap::new();
    let mut put = |key: &StatKey, v: &[CallStats]| {
        out.entry(key.tgid)
            .or_default()
            .insert(key.func as u16, v[0]);
    };
    let batched = crate::os::sys::map_fd(map)
        .is_some_and(|fd| lookup_batched(fd, 1, StatKey::default(), CallStats::ZERO, &mut put));
    if !batched {
        // A refused batch may have delivered some entries: start again.
        out.clear();
        if let Ok(map) = HashMap::<&MapData, StatKey, CallStats>::try_from(map) {
            for (key, v) in map.iter().filter_map(Result::ok) {
                out.entry(key.tgid).or_default().insert(key.func as u16, v);
            }
        }
    }
    out
}

/// Reads and sums the per-CPU statistics map (`cargo xtask bench kmaps`'s
/// per-CPU design): batched if the kernel allows, else entry by entry.
pub(super) fn stats_percpu(ebpf: &aya::Ebpf) -> BTreeMap<u32, CallsByFunction> {
    let cpus = aya::util::nr_cpus().unwrap_or(1);
    ebpf.map(maps::STATS_PERCPU)
        .and_then(crate::os::sys::map_fd)
        .and_then(|fd| {
            let mut out: BTreeMap<u32, CallsByFunction> = BTreeMap::new();
            lookup_batched(
                fd,
                cpus,
                StatKey::default(),
                CallStats::ZERO,
                |key, per_cpu| {
                    out.entry(key.tgid)
                        .or_default()
                        .insert(key.func as u16, sum(per_cpu));
                },
            )
            .then_some(out)
        })
        .or_else(|| {
            let map = PerCpuHashMap::<&MapData, StatKey, CallStats>::try_from(
                ebpf.map(maps::STATS_PERCPU)?,
            )
            .ok()?;
            let mut out: BTreeMap<u32, CallsByFunction> = BTreeMap::new();
            for (key, per_cpu) in map.iter().filter_map(Result::ok) {
                out.entry(key.tgid)
                    .or_default()
                    .insert(key.func as u16, sum(&per_cpu));
            }
            Some(out)
        })
        .unwrap_or_default()
}

/// The figures of every CPU added up.
fn sum(per_cpu: &[CallStats]) -> CallStats {
    let mut total = CallStats::ZERO;
    for v in per_cpu {
        total.add(v);
    }
    total
}

/// Reads the call sites: batched if the kernel allows, else entry by
/// entry. Empty if the map cannot be opened.
pub(super) fn callsites(ebpf: &aya::Ebpf) -> BTreeMap<u32, Vec<RawSite>> {
    let Some(map) = ebpf.map(maps::CALLSITES) else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    let batched = crate::os::sys::map_fd(map).is_some_and(|fd| {
        lookup_batched(fd, 1, SiteKey::default(), SiteStats::default(), |k, v| {
            add_site(&mut out, k, &v[0]);
        })
    });
    if !batched {
        out.clear();
        if let Ok(map) = HashMap::<&MapData, SiteKey, SiteStats>::try_from(map) {
            for (key, v) in map.iter().filter_map(Result::ok) {
                add_site(&mut out, &key, &v);
            }
        }
    }
    out
}

/// Adds one call site's figures to `out`.
fn add_site(out: &mut BTreeMap<u32, Vec<RawSite>>, key: &SiteKey, v: &SiteStats) {
    out.entry(key.tgid).or_default().push(RawSite {
        function: key.func as u16,
        addr: key.addr,
        calls: v.calls,
        time_ns: v.time_ns,
    });
}

/// Reads every process's call-site count; empty if the map cannot be
/// opened. At most one entry per process attached, so entry by entry.
pub(super) fn site_counts(ebpf: &aya::Ebpf) -> BTreeMap<u32, SiteCount> {
    ebpf.map(maps::SITE_COUNTS)
        .and_then(|m| HashMap::<&MapData, u32, SiteCount>::try_from(m).ok())
        .map(|map| map.iter().filter_map(Result::ok).collect())
        .unwrap_or_default()
}

/// Reads a hash with `BPF_MAP_LOOKUP_BATCH`, handing `f` each key with its
/// `cpus` values (1 for a map shared by the CPUs): a few system calls for
/// the whole map instead of two per entry, which at 256 ranks x 60
/// functions was most of a scrape's time. `false` if the kernel refuses batching (the caller then reads entry
/// by entry, and must drop what `f` was given: a batch may fail midway).
/// `V` must be a multiple of 8 bytes: the per-CPU value stride, and with
/// `cpus` 1 the kernel's value size, copied back to back.
fn lookup_batched<K: Copy, V: Copy>(
    fd: std::os::fd::RawFd,
    cpus: usize,
    zero_key: K,
    zero: V,
    mut f: impl FnMut(&K, &[V]),
) -> bool {
    use aya_obj::generated::{bpf_attr, bpf_cmd};
    let value = std::mem::size_of::<V>();
    debug_assert_eq!(value % 8, 0, "per-CPU values are 8-byte aligned");
    let cpus = cpus.max(1);
    // Bound the buffer to about 4 MiB whatever the CPU count.
    let batch = (4usize << 20) / (value * cpus);
    let batch = batch.clamp(64, 4096);
    let mut keys = vec![zero_key; batch];
    let mut values = vec![zero; batch * cpus];
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut first = true;
    loop {
        // SAFETY: plain old data; all-zero is its default.
        let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
        // SAFETY: writing the batch member of a zeroed union.
        let b = unsafe { &mut attr.batch };
        b.in_batch = if first { 0 } else { &raw mut token_in as u64 };
        b.out_batch = &raw mut token_out as u64;
        b.keys = keys.as_mut_ptr() as u64;
        b.values = values.as_mut_ptr() as u64;
        b.count = batch as u32;
        b.map_fd = fd as u32;
        let r = crate::os::sys::bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
        // SAFETY: the kernel wrote back the count; reading the same member.
        let n = unsafe { attr.batch.count } as usize;
        let done = match r {
            Ok(_) => false,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => true,
            Err(_) => return false,
        };
        for (i, key) in keys.iter().enumerate().take(n.min(batch)) {
            f(key, &values[i * cpus..(i + 1) * cpus]);
        }
        if done {
            return true;
        }
        token_in = token_out;
        first = false;
    }
}

/// Reads the per-CPU error counters, summed; zeros if the map cannot be
/// opened.
pub(super) fn map_failures(ebpf: &aya::Ebpf) -> MapFailures {
    let Some(map) = ebpf
        .map(maps::ERRORS)
        .and_then(|m| PerCpuArray::<&MapData, u64>::try_from(m).ok())
    else {
        return MapFailures::default();
    };
    let sum = |c: ErrorCounter| map.get(&(c as u32), 0).map_or(0, |v| v.iter().sum::<u64>());
    MapFailures {
        stats: sum(ErrorCounter::StatsUpdate),
        inflight: sum(ErrorCounter::InflightUpdate),
        callsites: sum(ErrorCounter::CallsiteUpdate),
        site_cookies: sum(ErrorCounter::SiteUnknown),
    }
}

/// One per-CPU error counter, summed; 0 if the map cannot be opened.
pub(super) fn error_counter(ebpf: &aya::Ebpf, counter: ErrorCounter) -> u64 {
    ebpf.map(maps::ERRORS)
        .and_then(|m| PerCpuArray::<&MapData, u64>::try_from(m).ok())
        .and_then(|map| map.get(&(counter as u32), 0).ok())
        .map_or(0, |v| v.iter().sum())
}
