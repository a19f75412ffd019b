//! The metric model. Everything is built at scrape time from the live BPF
//! maps; the daemon keeps no per-call state of its own. Names and labels
//! here are a stable interface, documented in the README.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use aya::maps::{MapData, PerCpuArray, PerCpuHashMap};
use observer_common::{
    FUNCTIONS,
    functions::{CountKind, Direction},
    maps::{self, CallStats, ERROR_COUNTERS, ErrorCounter, HIST_SLOTS, StatKey},
};
use prometheus::{
    Encoder as _, Gauge, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::registry::Rank;

/// Histogram bucket bounds, as powers of two of nanoseconds: 1.02 us,
/// 4.1 us, ... 1.07 s. A factor of 4 keeps the series count low; each bound
/// is a slot boundary of the in-kernel log2 histogram, so buckets are exact.
pub const BUCKET_POWERS: [u32; 11] = [10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30];

/// The daemon's own health, exported as `mpi_observer_*`.
pub struct SelfMetrics {
    registry: Registry,
    /// Processes with probes attached now.
    pub attached: IntGauge,
    /// Probes (uprobes plus uretprobes) attached now.
    pub probes: IntGauge,
    /// Failed attach attempts.
    pub attach_failures: IntCounter,
    /// Duration of the last scrape's collection.
    pub scrape_seconds: Gauge,
    scrapes: IntCounter,
    map_failures: IntCounterVec,
    segment_errors: IntCounterVec,
}

impl SelfMetrics {
    /// Registers the self-metrics.
    pub fn new() -> Self {
        let registry = Registry::new();
        let attached = IntGauge::new(
            "mpi_observer_attached_processes",
            "MPI processes the observer currently has probes attached to.",
        )
        .expect("valid metric");
        let probes = IntGauge::new(
            "mpi_observer_probes",
            "Uprobes and uretprobes currently attached.",
        )
        .expect("valid metric");
        let attach_failures = IntCounter::new(
            "mpi_observer_attach_failures_total",
            "Attempts to attach to an MPI process that failed.",
        )
        .expect("valid metric");
        let scrape_seconds = Gauge::new(
            "mpi_observer_scrape_duration_seconds",
            "Time taken to collect the MPI metrics of this scrape.",
        )
        .expect("valid metric");
        let scrapes = IntCounter::new(
            "mpi_observer_scrapes_total",
            "Collections of the metrics completed; concurrent scrapes share one.",
        )
        .expect("valid metric");
        let map_failures = IntCounterVec::new(
            Opts::new(
                "mpi_observer_map_update_failures_total",
                "In-kernel map updates that failed (map full); such calls are not counted.",
            ),
            &["map"],
        )
        .expect("valid metric");
        let segment_errors = IntCounterVec::new(
            Opts::new(
                "mpi_observer_segment_errors_total",
                "Stats segments skipped: untrusted (owner or permissions), corrupt, version (layout or function IDs), truncated (shrank while read).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        for reason in ["untrusted", "corrupt", "version", "truncated"] {
            segment_errors.with_label_values(&[reason]);
        }
        for m in [
            Box::new(segment_errors.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(attached.clone()),
            Box::new(probes.clone()),
            Box::new(attach_failures.clone()),
            Box::new(scrape_seconds.clone()),
            Box::new(scrapes.clone()),
            Box::new(map_failures.clone()),
        ] {
            registry.register(m).expect("unique metric names");
        }
        Self {
            registry,
            attached,
            probes,
            attach_failures,
            scrape_seconds,
            scrapes,
            map_failures,
            segment_errors,
        }
    }

    /// Counts a skipped stats segment.
    pub fn segment_error(&self, p: crate::segment::SegmentProblem) {
        self.segment_errors.with_label_values(&[p.as_str()]).inc();
    }

    fn set_map_failures(&self, errors: &[u64; ERROR_COUNTERS as usize]) {
        for (label, c) in [
            ("stats", ErrorCounter::StatsUpdate),
            ("inflight", ErrorCounter::InflightUpdate),
        ] {
            let m = self.map_failures.with_label_values(&[label]);
            let want = errors[c as usize];
            let have = m.get();
            if want > have {
                m.inc_by(want - have);
            }
        }
    }

    /// Catches up with the server's count of completed collections.
    fn set_scrapes(&self, total: u64) {
        let have = self.scrapes.get();
        if total > have {
            self.scrapes.inc_by(total - have);
        }
    }

    fn encode(&self, out: &mut String) {
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        out.push_str(&String::from_utf8_lossy(&buf));
    }
}

impl Default for SelfMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Escapes a label value for the text exposition format.
pub fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// Per-process totals read from the maps: function ID to summed stats.
pub type ProcStats = BTreeMap<u16, CallStats>;

/// Reads and sums the per-CPU statistics of every process in the map.
pub fn read_stats(map: &PerCpuHashMap<&MapData, StatKey, CallStats>) -> BTreeMap<u32, ProcStats> {
    let mut out: BTreeMap<u32, ProcStats> = BTreeMap::new();
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
/// batching, in which case [`read_stats`] does it entry by entry.
pub fn read_stats_batched(fd: std::os::fd::RawFd, cpus: usize) -> Option<BTreeMap<u32, ProcStats>> {
    use aya_obj::generated::{bpf_attr, bpf_cmd};
    const VALUE: usize = std::mem::size_of::<CallStats>();
    // Bound the buffer to about 4 MiB whatever the CPU count.
    let batch = (4usize << 20) / (VALUE * cpus.max(1));
    let batch = batch.clamp(64, 4096);
    let mut keys = vec![StatKey::default(); batch];
    let mut values = vec![CallStats::ZERO; batch * cpus];
    let (mut token_in, mut token_out) = (0u64, 0u64);
    let mut out: BTreeMap<u32, ProcStats> = BTreeMap::new();
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

/// Reads the per-CPU error counters, summed.
pub fn read_errors(map: &PerCpuArray<&MapData, u64>) -> [u64; ERROR_COUNTERS as usize] {
    let mut out = [0; ERROR_COUNTERS as usize];
    for (i, slot) in out.iter_mut().enumerate() {
        if let Ok(v) = map.get(&(i as u32), 0) {
            *slot = v.iter().sum();
        }
    }
    out
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs_f64()
}

fn has_direction(id: u16, d: Direction) -> bool {
    FUNCTIONS[id as usize]
        .bytes
        .iter()
        .any(|p| p.kind != CountKind::None && p.direction == d)
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// Options that change the exposition.
#[derive(Clone, Copy, Debug, Default)]
pub struct RenderOptions {
    /// Export the latency histogram per rank too (more series).
    pub per_rank_histograms: bool,
}

/// Renders the full exposition: the MPI metrics from `stats` for the ranks
/// in `ranks`, then the self-metrics. Processes in the map that are not in
/// `ranks` are skipped: identity only ever comes from the registry.
pub fn render(
    ranks: &BTreeMap<u32, Rank>,
    stats: &BTreeMap<u32, ProcStats>,
    errors: &[u64; ERROR_COUNTERS as usize],
    selfm: &SelfMetrics,
    opts: RenderOptions,
    started: std::time::Instant,
    extra: &str,
) -> String {
    let mut out = String::with_capacity(64 * 1024 + stats.len() * 8 * 1024);
    let labelled: Vec<(&Rank, &ProcStats)> = ranks
        .values()
        .filter_map(|r| stats.get(&r.pid).map(|s| (r, s)))
        .collect();

    header(
        &mut out,
        "mpi_calls_total",
        "counter",
        "MPI calls completed, per rank and function (outermost calls only).",
    );
    for (r, s) in &labelled {
        for (id, st) in s.iter() {
            let _ = writeln!(
                out,
                "mpi_calls_total{{{},function=\"{}\"}} {}",
                r.labels, FUNCTIONS[*id as usize].name, st.calls
            );
        }
    }
    header(
        &mut out,
        "mpi_call_seconds_total",
        "counter",
        "Time spent inside completed MPI calls, per rank and function.",
    );
    for (r, s) in &labelled {
        for (id, st) in s.iter() {
            let _ = writeln!(
                out,
                "mpi_call_seconds_total{{{},function=\"{}\"}} {}",
                r.labels,
                FUNCTIONS[*id as usize].name,
                st.time_ns as f64 / 1e9
            );
        }
    }
    header(
        &mut out,
        "mpi_bytes_total",
        "counter",
        "Bytes in the data arguments of completed calls (count x datatype size), per rank, function and direction; see the README for the conventions.",
    );
    for (r, s) in &labelled {
        for (id, st) in s.iter() {
            for d in [Direction::Send, Direction::Recv] {
                if has_direction(*id, d) {
                    let _ = writeln!(
                        out,
                        "mpi_bytes_total{{{},function=\"{}\",direction=\"{}\"}} {}",
                        r.labels,
                        FUNCTIONS[*id as usize].name,
                        d.as_str(),
                        st.bytes[d as usize]
                    );
                }
            }
        }
    }
    header(
        &mut out,
        "mpi_bytes_unknown_calls_total",
        "counter",
        "Completed calls whose byte figure could not be known exactly (derived or unreadable datatype, count arrays) and so is not in mpi_bytes_total; absent while zero.",
    );
    for (r, s) in &labelled {
        for (id, st) in s.iter() {
            for d in [Direction::Send, Direction::Recv] {
                // Only where it happened: most calls never have an unknown
                // figure, and this halves the byte series of a typical rank.
                if st.bytes_unknown[d as usize] > 0 {
                    let _ = writeln!(
                        out,
                        "mpi_bytes_unknown_calls_total{{{},function=\"{}\",direction=\"{}\"}} {}",
                        r.labels,
                        FUNCTIONS[*id as usize].name,
                        d.as_str(),
                        st.bytes_unknown[d as usize]
                    );
                }
            }
        }
    }

    header(
        &mut out,
        "mpi_call_duration_seconds",
        "histogram",
        "Latency of completed MPI calls, per job and function, over this node's ranks (per rank too with --per-rank-histograms).",
    );
    let mut per_job: BTreeMap<(&str, u16), CallStats> = BTreeMap::new();
    for (r, s) in &labelled {
        for (id, st) in s.iter() {
            if opts.per_rank_histograms {
                histogram(&mut out, &r.labels, *id, st);
            }
            per_job
                .entry((r.jobid_label.as_str(), *id))
                .or_insert(CallStats::ZERO)
                .add(st);
        }
    }
    if !opts.per_rank_histograms {
        for ((job, id), st) in &per_job {
            histogram(&mut out, job, *id, st);
        }
    }

    header(
        &mut out,
        "mpi_rank_info",
        "gauge",
        "One series per observed rank, with its pid, world size and MPI library.",
    );
    for r in ranks.values() {
        let _ = writeln!(
            out,
            "mpi_rank_info{{{},pid=\"{}\",size=\"{}\",library=\"{}\",version=\"{}\"}} 1",
            r.labels,
            r.pid,
            escape(&r.identity.size),
            r.library,
            escape(&r.version)
        );
    }
    header(
        &mut out,
        "mpi_rank_up",
        "gauge",
        "1 while the rank runs, 0 once it exited (its figures are kept for --retain-exited).",
    );
    for r in ranks.values() {
        let _ = writeln!(
            out,
            "mpi_rank_up{{{}}} {}",
            r.labels,
            u8::from(r.exited_at.is_none())
        );
    }
    header(
        &mut out,
        "mpi_rank_start_time_seconds",
        "gauge",
        "Unix time the rank's process started.",
    );
    for r in ranks.values() {
        let _ = writeln!(
            out,
            "mpi_rank_start_time_seconds{{{}}} {}",
            r.labels,
            unix(r.started_at)
        );
    }
    header(
        &mut out,
        "mpi_rank_attach_time_seconds",
        "gauge",
        "Unix time the observer attached to the rank: the wall-clock base of its counters.",
    );
    for r in ranks.values() {
        let _ = writeln!(
            out,
            "mpi_rank_attach_time_seconds{{{}}} {}",
            r.labels,
            unix(r.attached_at)
        );
    }
    header(
        &mut out,
        "mpi_rank_exit_time_seconds",
        "gauge",
        "Unix time the observer saw the rank exit; absent while it runs.",
    );
    for r in ranks.values() {
        if let Some(t) = r.exited_wall {
            let _ = writeln!(
                out,
                "mpi_rank_exit_time_seconds{{{}}} {}",
                r.labels,
                unix(t)
            );
        }
    }
    render_segments(&mut out, ranks);
    out.push_str(extra);
    selfm.set_map_failures(errors);
    selfm.scrape_seconds.set(started.elapsed().as_secs_f64());
    selfm.set_scrapes(crate::server::scrapes_total());
    selfm.encode(&mut out);
    out
}

/// The shim's argument-level figures, from each rank's stats segment.
fn render_segments(out: &mut String, ranks: &BTreeMap<u32, Rank>) {
    let with: Vec<(&Rank, &crate::segment::Figures)> = ranks
        .values()
        .filter_map(|r| r.figures.as_ref().map(|f| (r, f)))
        .collect();
    if with.is_empty() {
        return;
    }
    const DIRS: [&str; 2] = ["send", "recv"];
    header(
        out,
        "mpi_peer_messages_total",
        "counter",
        "Point-to-point messages per peer (its MPI_COMM_WORLD rank) and direction, from the shim's stats layer.",
    );
    for (r, f) in &with {
        for (peer, (m, _)) in &f.peers {
            for d in 0..2 {
                let _ = writeln!(
                    out,
                    "mpi_peer_messages_total{{{},peer=\"{peer}\",direction=\"{}\"}} {}",
                    r.labels, DIRS[d], m[d]
                );
            }
        }
    }
    header(
        out,
        "mpi_peer_bytes_total",
        "counter",
        "Point-to-point bytes per peer and direction (actual received sizes), from the shim's stats layer.",
    );
    for (r, f) in &with {
        for (peer, (_, b)) in &f.peers {
            for d in 0..2 {
                let _ = writeln!(
                    out,
                    "mpi_peer_bytes_total{{{},peer=\"{peer}\",direction=\"{}\"}} {}",
                    r.labels, DIRS[d], b[d]
                );
            }
        }
    }
    header(
        out,
        "mpi_requests_outstanding",
        "gauge",
        "Nonblocking and started persistent requests not yet completed.",
    );
    for (r, f) in &with {
        let _ = writeln!(
            out,
            "mpi_requests_outstanding{{{}}} {}",
            r.labels, f.outstanding
        );
    }
    header(
        out,
        "mpi_request_oldest_age_seconds",
        "gauge",
        "Age of the oldest outstanding request; 0 when none (frozen at exit for exited ranks).",
    );
    let now = crate::segment::monotonic_ns();
    for (r, f) in &with {
        let age = match (f.oldest_started_ns, r.exited_at) {
            (Some(t), None) => now.saturating_sub(t) as f64 / 1e9,
            _ => 0.0,
        };
        let _ = writeln!(out, "mpi_request_oldest_age_seconds{{{}}} {age}", r.labels);
    }
    header(
        out,
        "mpi_requests_persistent",
        "gauge",
        "Persistent requests by state: active (started, not completed) or inactive.",
    );
    for (r, f) in &with {
        let _ = writeln!(
            out,
            "mpi_requests_persistent{{{},state=\"active\"}} {}",
            r.labels, f.persistent.0
        );
        let _ = writeln!(
            out,
            "mpi_requests_persistent{{{},state=\"inactive\"}} {}",
            r.labels, f.persistent.1
        );
    }
    for (i, (name, help)) in [
        (
            "mpi_requests_started_total",
            "Nonblocking and persistent requests started.",
        ),
        (
            "mpi_requests_completed_total",
            "Requests seen completing through the Wait and Test families.",
        ),
        ("mpi_requests_cancelled_total", "Requests cancelled."),
        (
            "mpi_request_table_full_total",
            "Requests not tracked because the per-process table (4096 slots) was full.",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        header(out, name, "counter", help);
        for (r, f) in &with {
            let _ = writeln!(out, "{name}{{{}}} {}", r.labels, f.requests[i]);
        }
    }
    header(
        out,
        "mpi_peer_overflow_messages_total",
        "counter",
        "Messages with world ranks beyond the segment's 65536 peer slots.",
    );
    for (r, f) in &with {
        let _ = writeln!(
            out,
            "mpi_peer_overflow_messages_total{{{}}} {}",
            r.labels, f.overflow[0]
        );
    }
    header(
        out,
        "mpi_unattributed_messages_total",
        "counter",
        "Messages whose peer or size the stats layer could not determine.",
    );
    for (r, f) in &with {
        let _ = writeln!(
            out,
            "mpi_unattributed_messages_total{{{}}} {}",
            r.labels, f.overflow[1]
        );
    }
    header(
        out,
        "mpi_layer_calls_total",
        "counter",
        "Calls seen by the shim's stats layer, per function (collectives and point-to-point).",
    );
    for (r, f) in &with {
        for (id, (calls, _)) in &f.functions {
            let _ = writeln!(
                out,
                "mpi_layer_calls_total{{{},function=\"{}\"}} {calls}",
                r.labels, FUNCTIONS[*id as usize].name
            );
        }
    }
    header(
        out,
        "mpi_layer_bytes_total",
        "counter",
        "Bytes per function and direction by the stats layer's definition (root-only arguments at the root only); see the README.",
    );
    for (r, f) in &with {
        for (id, (_, b)) in &f.functions {
            for d in 0..2 {
                let _ = writeln!(
                    out,
                    "mpi_layer_bytes_total{{{},function=\"{}\",direction=\"{}\"}} {}",
                    r.labels, FUNCTIONS[*id as usize].name, DIRS[d], b[d]
                );
            }
        }
    }
}

fn histogram(out: &mut String, labels: &str, id: u16, st: &CallStats) {
    let name = FUNCTIONS[id as usize].name;
    let mut cum = 0u64;
    let mut slot = 0usize;
    for p in BUCKET_POWERS {
        while slot < p as usize && slot < HIST_SLOTS {
            cum += st.hist[slot];
            slot += 1;
        }
        let le = (1u64 << p) as f64 / 1e9;
        let _ = writeln!(
            out,
            "mpi_call_duration_seconds_bucket{{{labels},function=\"{name}\",le=\"{le}\"}} {cum}"
        );
    }
    let _ = writeln!(
        out,
        "mpi_call_duration_seconds_bucket{{{labels},function=\"{name}\",le=\"+Inf\"}} {}",
        st.calls
    );
    let _ = writeln!(
        out,
        "mpi_call_duration_seconds_sum{{{labels},function=\"{name}\"}} {}",
        st.time_ns as f64 / 1e9
    );
    let _ = writeln!(
        out,
        "mpi_call_duration_seconds_count{{{labels},function=\"{name}\"}} {}",
        st.calls
    );
}

/// Opens the maps the collector reads.
pub fn stats_map(ebpf: &aya::Ebpf) -> Option<PerCpuHashMap<&MapData, StatKey, CallStats>> {
    PerCpuHashMap::try_from(ebpf.map(maps::STATS)?).ok()
}

/// The per-CPU error counter array.
pub fn errors_map(ebpf: &aya::Ebpf) -> Option<PerCpuArray<&MapData, u64>> {
    PerCpuArray::try_from(ebpf.map(maps::ERRORS)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("x\ny"), "x\\ny");
    }

    #[test]
    fn histogram_is_cumulative_and_complete() {
        let mut st = CallStats::ZERO;
        st.hist[0] = 1; // < 2 ns
        st.hist[11] = 2; // [2048, 4096) ns -> le 4.096 us
        st.hist[31] = 3; // >= 2.1 s
        st.calls = 6;
        let mut out = String::new();
        histogram(&mut out, "jobid=\"j\"", 0, &st);
        assert!(out.contains("le=\"0.000001024\"} 1"), "{out}");
        assert!(out.contains("le=\"0.000004096\"} 3"), "{out}");
        assert!(out.contains("le=\"1.073741824\"} 3"), "{out}");
        assert!(out.contains("le=\"+Inf\"} 6"), "{out}");
    }
}
