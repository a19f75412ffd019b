//! Reading the maps the probes fill, at scrape time: the per-CPU statistics
//! summed per process and function, the per-CPU call-site figures summed
//! per process, function and site, and the per-CPU error counters.

use std::collections::BTreeMap;

use aya::maps::{MapData, PerCpuArray, PerCpuHashMap};
use observer_common::maps::{self, CallStats, ErrorCounter, SiteKey, SiteStats, StatKey};

use crate::snapshot::{CallsByFunction, MapFailures, RawSite};

/// Reads and sums the statistics: batched if the kernel allows, else entry
/// by entry. Empty if the map cannot be opened.
pub(super) fn stats(ebpf: &aya::Ebpf) -> BTreeMap<u32, CallsByFunction> {
    let cpus = aya::util::nr_cpus().unwrap_or(1);
    ebpf.map(maps::STATS)
        .and_then(crate::sys::map_fd)
        .and_then(|fd| {
            let mut out: BTreeMap<u32, CallsByFunction> = BTreeMap::new();
            lookup_batched(
                fd,
                cpus,
                StatKey::default(),
                CallStats::ZERO,
                |key, per_cpu| {
                    let mut total = CallStats::ZERO;
                    for v in per_cpu {
                        total.add(v);
                    }
                    out.entry(key.tgid)
                        .or_default()
                        .insert(key.func as u16, total);
                },
            )
            .then_some(out)
        })
        .or_else(|| {
            let map = PerCpuHashMap::try_from(ebpf.map(maps::STATS)?).ok()?;
            Some(stats_by_entry(&map))
        })
        .unwrap_or_default()
}

/// Reads and sums the per-CPU statistics of every process, entry by entry.
fn stats_by_entry(
    map: &PerCpuHashMap<&MapData, StatKey, CallStats>,
) -> BTreeMap<u32, CallsByFunction> {
    let mut out: BTreeMap<u32, CallsByFunction> = BTreeMap::new();
    for item in map.iter() {
        let Ok((key, per_cpu)) = item else { continue };
        let mut total = CallStats::ZERO;
        for v in per_cpu.iter() {
            total.add(v);
        }
        out.entry(key.tgid)
            .or_default()
            .insert(key.func as u16, total);
    }
    out
}

/// Reads and sums the call sites: batched if the kernel allows, else entry
/// by entry. Empty if the map cannot be opened.
pub(super) fn callsites(ebpf: &aya::Ebpf) -> BTreeMap<u32, Vec<RawSite>> {
    let cpus = aya::util::nr_cpus().unwrap_or(1);
    let Some(map) = ebpf.map(maps::CALLSITES) else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    let batched = crate::sys::map_fd(map).is_some_and(|fd| {
        lookup_batched(
            fd,
            cpus,
            SiteKey::default(),
            SiteStats::default(),
            |k, v| {
                add_site(&mut out, k, v);
            },
        )
    });
    if !batched {
        // A refused batch may have delivered some entries: start again.
        out.clear();
        if let Ok(map) = PerCpuHashMap::<&MapData, SiteKey, SiteStats>::try_from(map) {
            for (key, per_cpu) in map.iter().filter_map(Result::ok) {
                add_site(&mut out, &key, &per_cpu);
            }
        }
    }
    out
}

/// Sums one call site's per-CPU figures into `out`.
fn add_site(out: &mut BTreeMap<u32, Vec<RawSite>>, key: &SiteKey, per_cpu: &[SiteStats]) {
    let (calls, time_ns) = per_cpu
        .iter()
        .fold((0u64, 0u64), |(c, t), v| (c + v.calls, t + v.time_ns));
    out.entry(key.tgid).or_default().push(RawSite {
        function: key.func as u16,
        addr: key.addr,
        calls,
        time_ns,
    });
}

/// Reads a per-CPU hash with `BPF_MAP_LOOKUP_BATCH`, handing `f` each key
/// with its `cpus` values: a few system calls for the whole map instead of
/// two per entry, which at 256 ranks x 60 functions was most of a scrape's
/// time. `false` if the kernel refuses batching (the caller then reads entry
/// by entry, and must drop what `f` was given: a batch may fail midway).
/// `V` must be a multiple of 8 bytes, the per-CPU value stride.
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
        let r = crate::sys::bpf(bpf_cmd::BPF_MAP_LOOKUP_BATCH, &mut attr);
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
    }
}

/// One per-CPU error counter, summed; 0 if the map cannot be opened.
pub(super) fn error_counter(ebpf: &aya::Ebpf, counter: ErrorCounter) -> u64 {
    ebpf.map(maps::ERRORS)
        .and_then(|m| PerCpuArray::<&MapData, u64>::try_from(m).ok())
        .and_then(|map| map.get(&(counter as u32), 0).ok())
        .map_or(0, |v| v.iter().sum())
}
