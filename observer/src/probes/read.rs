//! Reading the maps the probes fill, at scrape time: the per-CPU statistics
//! summed per process and function, and the per-CPU error counters.

use std::collections::BTreeMap;

use aya::maps::{MapData, PerCpuArray, PerCpuHashMap};
use observer_common::maps::{self, CallStats, ErrorCounter, StatKey};

use crate::snapshot::{CallsByFunction, MapFailures};

/// Reads and sums the statistics: batched if the kernel allows, else entry
/// by entry. Empty if the map cannot be opened.
pub(super) fn stats(ebpf: &aya::Ebpf) -> BTreeMap<u32, CallsByFunction> {
    let cpus = aya::util::nr_cpus().unwrap_or(1);
    ebpf.map(maps::STATS)
        .and_then(crate::sys::map_fd)
        .and_then(|fd| stats_batched(fd, cpus))
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

/// Reads and sums the statistics with `BPF_MAP_LOOKUP_BATCH`: a few system
/// calls for the whole map instead of two per entry, which at 256 ranks x 60
/// functions was most of a scrape's time. `None` if the kernel refuses
/// batching, in which case [`stats_by_entry`] does it entry by entry.
fn stats_batched(fd: std::os::fd::RawFd, cpus: usize) -> Option<BTreeMap<u32, CallsByFunction>> {
    use aya_obj::generated::{bpf_attr, bpf_cmd};
    const VALUE: usize = std::mem::size_of::<CallStats>();
    // Bound the buffer to about 4 MiB whatever the CPU count.
    let batch = (4usize << 20) / (VALUE * cpus.max(1));
    let batch = batch.clamp(64, 4096);
    let mut keys = vec![StatKey::default(); batch];
    let mut values = vec![CallStats::ZERO; batch * cpus];
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut out: BTreeMap<u32, CallsByFunction> = BTreeMap::new();
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
            Err(_) => return None,
        };
        for (i, key) in keys.iter().enumerate().take(n.min(batch)) {
            let mut total = CallStats::ZERO;
            for v in &values[i * cpus..(i + 1) * cpus] {
                total.add(v);
            }
            out.entry(key.tgid)
                .or_default()
                .insert(key.func as u16, total);
        }
        if done {
            return Some(out);
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
    }
}
