//! The metric model: renders a [`Snapshot`] as the text exposition, then
//! the daemon's own health. It reads nothing itself; the snapshot is built
//! at scrape time from the live BPF maps and stats segments, and the daemon
//! keeps no per-call state of its own. Names and labels here are a stable
//! interface, documented in the README.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use observer_common::{
    FUNCTIONS,
    functions::{CountKind, Direction},
    maps::{CallStats, HIST_SLOTS},
};
use prometheus::{
    Encoder as _, Gauge, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::{
    segment::{Directed, Figures},
    snapshot::{CallsByFunction, Health, MapFailures, RankSnapshot, Snapshot, escape},
};

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
    /// Ranks the shim was injected into and that are alive.
    pub injected: IntGauge,
    /// Duration of the last scrape's collection.
    pub scrape_seconds: Gauge,
    scrapes: IntCounter,
    map_failures: IntCounterVec,
    segment_errors: IntCounterVec,
    /// Processes refused by a budget (crate::budget), by uid and budget.
    refused: IntCounterVec,
    /// Reads of /proc/PID/stat that failed for another reason than the
    /// process being gone: the rank's state stayed unknown, not exited.
    pub proc_read_errors: IntCounter,
    /// Candidate processes the attacher's queue had no room for (they are
    /// found again by the next scan).
    pub attach_queue_dropped: IntCounter,
    /// The exec watcher's counters (crate::procevents), shared with it.
    pub exec_watch: std::sync::Arc<crate::procevents::WatchStats>,
    exec_events: IntCounter,
    exec_dropped: IntCounter,
    exec_found: IntCounter,
    /// Orphaned shim files removed from /dev/shm (crate::shm::sweep).
    pub shm_orphans_removed: IntCounter,
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
        let injected = IntGauge::new(
            "mpi_observer_injected_processes",
            "Live MPI processes whose calls an injected shim counts (attach --inject, by this daemon or adopted from an earlier one); they carry no probes.",
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
                "In-kernel map updates that failed (map full): a call that fails on map=\"stats\" or \"inflight\" is not counted; one that fails on map=\"callsites\" is, its site in callsite=\"other\".",
            ),
            &["map"],
        )
        .expect("valid metric");
        let segment_errors = IntCounterVec::new(
            Opts::new(
                "mpi_observer_segment_errors_total",
                "Stats segments skipped: untrusted (owner or permissions), corrupt, version (layout or function IDs), truncated (shrank while read), busy (every SIGBUS guard slot taken by concurrent reads).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let shm_orphans_removed = IntCounter::new(
            "mpi_observer_shm_orphans_removed_total",
            "Files of the shim (stats segments, recording rings) removed from /dev/shm because no live process maps them any more.",
        )
        .expect("valid metric");
        for reason in ["untrusted", "corrupt", "version", "truncated", "busy"] {
            segment_errors.with_label_values(&[reason]);
        }
        let refused = IntCounterVec::new(
            Opts::new(
                "mpi_observer_refused_processes_total",
                "MPI processes not observed because their user was at a budget (budget=\"processes\", \"probes\", \"map_entries\"; docs/security.md) or the kernel maps were full (budget=\"capacity\"), by the process's real uid.",
            ),
            &["uid", "budget"],
        )
        .expect("valid metric");
        let proc_read_errors = IntCounter::new(
            "mpi_observer_proc_read_errors_total",
            "Reads of a rank's /proc/PID/stat that failed while the process may still run (out of descriptors or memory): its state stayed unknown, never taken for an exit.",
        )
        .expect("valid metric");
        let exec_events = IntCounter::new(
            "mpi_observer_exec_events_total",
            "Program starts (exec) reported by the kernel's process connector, each looked at for an MPI library as it starts (attach --all).",
        )
        .expect("valid metric");
        let exec_dropped = IntCounter::new(
            "mpi_observer_exec_events_dropped_total",
            "Exec events lost (the kernel's buffer overflowed, or too many processes were watched at once); the once-a-second scan finds their MPI processes instead.",
        )
        .expect("valid metric");
        let exec_found = IntCounter::new(
            "mpi_observer_exec_found_total",
            "MPI processes found through an exec event rather than by the scan.",
        )
        .expect("valid metric");
        let attach_queue_dropped = IntCounter::new(
            "mpi_observer_attach_queue_dropped_total",
            "New MPI processes the attach queue had no room for; the next scan finds them again.",
        )
        .expect("valid metric");
        for m in [
            Box::new(segment_errors.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(attached.clone()),
            Box::new(probes.clone()),
            Box::new(attach_failures.clone()),
            Box::new(injected.clone()),
            Box::new(scrape_seconds.clone()),
            Box::new(scrapes.clone()),
            Box::new(map_failures.clone()),
            Box::new(refused.clone()),
            Box::new(proc_read_errors.clone()),
            Box::new(attach_queue_dropped.clone()),
            Box::new(exec_events.clone()),
            Box::new(exec_dropped.clone()),
            Box::new(exec_found.clone()),
            Box::new(shm_orphans_removed.clone()),
        ] {
            registry.register(m).expect("unique metric names");
        }
        Self {
            registry,
            attached,
            probes,
            attach_failures,
            injected,
            scrape_seconds,
            scrapes,
            map_failures,
            segment_errors,
            refused,
            proc_read_errors,
            attach_queue_dropped,
            exec_watch: Default::default(),
            exec_events,
            exec_dropped,
            exec_found,
            shm_orphans_removed,
        }
    }

    /// Counts a process refused by `budget`, owned by `uid`.
    pub fn refused(&self, uid: u32, budget: crate::budget::Budget) {
        self.refused
            .with_label_values(&[&uid.to_string(), budget.as_str()])
            .inc();
    }

    /// Counts a skipped stats segment.
    pub fn segment_error(&self, p: crate::segment::SegmentProblem) {
        self.segment_errors.with_label_values(&[p.as_str()]).inc();
    }

    fn set_map_failures(&self, failures: MapFailures) {
        for (label, want) in [
            ("stats", failures.stats),
            ("inflight", failures.inflight),
            ("callsites", failures.callsites),
        ] {
            let m = self.map_failures.with_label_values(&[label]);
            let have = m.get();
            if want > have {
                m.inc_by(want - have);
            }
        }
    }

    /// Catches up with the exec watcher's counters.
    fn set_exec_watch(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        for (c, want) in [
            (&self.exec_events, self.exec_watch.execs.load(Relaxed)),
            (&self.exec_dropped, self.exec_watch.dropped.load(Relaxed)),
            (&self.exec_found, self.exec_watch.found.load(Relaxed)),
        ] {
            let have = c.get();
            if want > have {
                c.inc_by(want - have);
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

    /// Brings the figures up to date with `health` and the scrape's
    /// duration, then appends their exposition.
    fn render(&self, out: &mut String, health: Health, scrape: Duration) {
        self.set_map_failures(health.map_failures);
        self.scrape_seconds.set(scrape.as_secs_f64());
        self.set_scrapes(health.scrapes_total);
        self.set_exec_watch();
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

/// Renders the full exposition: the MPI metrics of the ranks in `snap`,
/// then the self-metrics, with `elapsed` (asked for once the MPI metrics
/// are rendered) as the scrape's duration.
pub fn render(
    snap: &Snapshot,
    selfm: &SelfMetrics,
    opts: RenderOptions,
    elapsed: impl FnOnce() -> Duration,
) -> String {
    let labelled: Vec<(&RankSnapshot, &CallsByFunction)> = snap
        .ranks
        .iter()
        .filter_map(|r| r.calls.as_ref().map(|s| (r, s)))
        .collect();
    let mut out = String::with_capacity(64 * 1024 + labelled.len() * 8 * 1024);

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
                r.labels.rank, FUNCTIONS[*id as usize].name, st.calls
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
                r.labels.rank,
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
                        r.labels.rank,
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
                        r.labels.rank,
                        FUNCTIONS[*id as usize].name,
                        d.as_str(),
                        st.bytes_unknown[d as usize]
                    );
                }
            }
        }
    }

    render_callsites(&mut out, &labelled);

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
                histogram(&mut out, &r.labels.rank, *id, st);
            }
            per_job
                .entry((r.labels.job.as_str(), *id))
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
    for r in &snap.ranks {
        let _ = writeln!(
            out,
            "mpi_rank_info{{{},pid=\"{}\",size=\"{}\",library=\"{}\",version=\"{}\"}} 1",
            r.labels.rank,
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
    for r in &snap.ranks {
        let _ = writeln!(
            out,
            "mpi_rank_up{{{}}} {}",
            r.labels.rank,
            u8::from(r.running())
        );
    }
    header(
        &mut out,
        "mpi_rank_start_time_seconds",
        "gauge",
        "Unix time the rank's process started.",
    );
    for r in &snap.ranks {
        let _ = writeln!(
            out,
            "mpi_rank_start_time_seconds{{{}}} {}",
            r.labels.rank,
            unix(r.started)
        );
    }
    header(
        &mut out,
        "mpi_rank_attach_time_seconds",
        "gauge",
        "Unix time the observer attached to the rank: the wall-clock base of its counters.",
    );
    for r in &snap.ranks {
        let _ = writeln!(
            out,
            "mpi_rank_attach_time_seconds{{{}}} {}",
            r.labels.rank,
            unix(r.attached)
        );
    }
    header(
        &mut out,
        "mpi_rank_exit_time_seconds",
        "gauge",
        "Unix time the observer saw the rank exit; absent while it runs.",
    );
    for r in &snap.ranks {
        if let Some(t) = r.exited {
            let _ = writeln!(
                out,
                "mpi_rank_exit_time_seconds{{{}}} {}",
                r.labels.rank,
                unix(t)
            );
        }
    }
    render_segments(&mut out, &snap.ranks);
    selfm.render(&mut out, snap.health, elapsed());
    out
}

/// One call site series' figures: calls and nanoseconds.
type SiteFigures = (u64, u64);

/// `mpi_callsite_calls_total` and `mpi_callsite_seconds_total` of the ranks
/// with call sites: each site with series of its own (see
/// [`crate::callsites`]), and `callsite="other"` for the rest of the
/// function's calls, while there are any.
fn render_callsites(out: &mut String, ranks: &[(&RankSnapshot, &CallsByFunction)]) {
    let mut series: Vec<(&RankSnapshot, u16, &str, SiteFigures)> = Vec::new();
    for (r, calls) in ranks {
        if r.callsites.is_empty() {
            continue;
        }
        let mut named: BTreeMap<u16, SiteFigures> = BTreeMap::new();
        for s in r.callsites.iter().filter(|s| s.exported) {
            series.push((r, s.function, &s.name, (s.calls, s.time_ns)));
            let n = named.entry(s.function).or_default();
            n.0 += s.calls;
            n.1 += s.time_ns;
        }
        for (&id, st) in calls.iter() {
            let n = named.get(&id).copied().unwrap_or_default();
            let other = (st.calls.saturating_sub(n.0), st.time_ns.saturating_sub(n.1));
            if other.0 > 0 {
                series.push((r, id, crate::callsites::OTHER, other));
            }
        }
    }
    if series.is_empty() {
        return;
    }
    series.sort_by_key(|a| (a.0.pid, a.1));
    header(
        out,
        "mpi_callsite_calls_total",
        "counter",
        "MPI calls completed per rank, function and call site: the calling function in the application (docs/callsites.md); callsite=\"other\" counts the calls beyond each (rank, function)'s named sites.",
    );
    for (r, id, site, (calls, _)) in &series {
        let _ = writeln!(
            out,
            "mpi_callsite_calls_total{{{},function=\"{}\",callsite=\"{}\"}} {calls}",
            r.labels.rank,
            FUNCTIONS[*id as usize].name,
            escape(site)
        );
    }
    header(
        out,
        "mpi_callsite_seconds_total",
        "counter",
        "Time inside completed MPI calls per rank, function and call site, as mpi_callsite_calls_total.",
    );
    for (r, id, site, (_, ns)) in &series {
        let _ = writeln!(
            out,
            "mpi_callsite_seconds_total{{{},function=\"{}\",callsite=\"{}\"}} {}",
            r.labels.rank,
            FUNCTIONS[*id as usize].name,
            escape(site),
            *ns as f64 / 1e9
        );
    }
}

/// The shim's argument-level figures, from each rank's stats segment.
fn render_segments(out: &mut String, ranks: &[RankSnapshot]) {
    let with: Vec<(&RankSnapshot, &Figures)> = ranks
        .iter()
        .filter_map(|r| r.segment.as_ref().map(|s| (r, &s.figures)))
        .collect();
    if with.is_empty() {
        return;
    }
    header(
        out,
        "mpi_peer_messages_total",
        "counter",
        "Point-to-point messages per peer (its MPI_COMM_WORLD rank) and direction, from the shim's stats layer.",
    );
    for (r, f) in &with {
        for (peer, t) in &f.peers {
            for (d, n) in directions(t.messages) {
                let _ = writeln!(
                    out,
                    "mpi_peer_messages_total{{{},peer=\"{peer}\",direction=\"{d}\"}} {n}",
                    r.labels.rank
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
        for (peer, t) in &f.peers {
            for (d, n) in directions(t.bytes) {
                let _ = writeln!(
                    out,
                    "mpi_peer_bytes_total{{{},peer=\"{peer}\",direction=\"{d}\"}} {n}",
                    r.labels.rank
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
            r.labels.rank, f.outstanding
        );
    }
    header(
        out,
        "mpi_request_oldest_age_seconds",
        "gauge",
        "Age of the oldest outstanding request; 0 when none, and for exited ranks.",
    );
    for r in ranks {
        if let Some(s) = &r.segment {
            let _ = writeln!(
                out,
                "mpi_request_oldest_age_seconds{{{}}} {}",
                r.labels.rank,
                s.oldest_request_age.as_nanos() as f64 / 1e9
            );
        }
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
            r.labels.rank, f.persistent_active
        );
        let _ = writeln!(
            out,
            "mpi_requests_persistent{{{},state=\"inactive\"}} {}",
            r.labels.rank, f.persistent_inactive
        );
    }
    type Counter = fn(&Figures) -> u64;
    for (name, help, value) in [
        (
            "mpi_requests_started_total",
            "Nonblocking and persistent requests started.",
            (|f| f.requests.started) as Counter,
        ),
        (
            "mpi_requests_completed_total",
            "Requests seen completing through the Wait and Test families.",
            |f| f.requests.completed,
        ),
        ("mpi_requests_cancelled_total", "Requests cancelled.", |f| {
            f.requests.cancelled
        }),
        (
            "mpi_request_table_full_total",
            "Requests not tracked because the per-process table (4096 slots) was full.",
            |f| f.requests.table_full,
        ),
        (
            "mpi_callsite_table_full_total",
            "Timed calls whose call site found the per-process call-site table (1024 slots) full: counted, their site in callsite=\"other\".",
            |f| f.callsite_table_full,
        ),
        (
            "mpi_peer_overflow_messages_total",
            "Messages with world ranks beyond the segment's 65536 peer slots.",
            |f| f.peer_overflow_messages,
        ),
        (
            "mpi_unattributed_messages_total",
            "Messages whose peer or size the stats layer could not determine.",
            |f| f.unattributed_messages,
        ),
    ] {
        header(out, name, "counter", help);
        for (r, f) in &with {
            let _ = writeln!(out, "{name}{{{}}} {}", r.labels.rank, value(f));
        }
    }
    header(
        out,
        "mpi_layer_calls_total",
        "counter",
        "Calls seen by the shim's stats layer, per function (collectives and point-to-point).",
    );
    for (r, f) in &with {
        for (id, c) in &f.functions {
            let _ = writeln!(
                out,
                "mpi_layer_calls_total{{{},function=\"{}\"}} {}",
                r.labels.rank, FUNCTIONS[*id as usize].name, c.calls
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
        for (id, c) in &f.functions {
            for (d, n) in directions(c.bytes) {
                let _ = writeln!(
                    out,
                    "mpi_layer_bytes_total{{{},function=\"{}\",direction=\"{d}\"}} {n}",
                    r.labels.rank, FUNCTIONS[*id as usize].name
                );
            }
        }
    }
}

/// The direction label values and their figures, send first.
fn directions(d: Directed) -> [(&'static str, u64); 2] {
    [("send", d.send), ("recv", d.recv)]
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

#[cfg(test)]
mod tests {
    use super::*;

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
