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
    identity::{self, Identity, Label},
    segment::{Directed, Figures},
    snapshot::{CallsByFunction, Health, Labels, MapFailures, RankSnapshot, Snapshot, escape},
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
    /// Ranks registered with the (job, uid, rank) of another rank held.
    pub identity_conflicts: IntCounter,
    label_truncations: IntCounterVec,
    oversized_environments: IntCounter,
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
        let identity_conflicts = IntCounter::new(
            "mpi_observer_identity_conflicts_total",
            "Ranks registered with the job, uid and rank of a rank already held: the later one's rank label gets #pidPID appended.",
        )
        .expect("valid metric");
        let label_truncations = IntCounterVec::new(
            Opts::new(
                "mpi_observer_label_truncations_total",
                "Label values from a process (jobid, rank, size, version, callsite) cut to 128 bytes.",
            ),
            &["label"],
        )
        .expect("valid metric");
        for l in Label::ALL {
            label_truncations.with_label_values(&[l.as_str()]);
        }
        let oversized_environments = IntCounter::new(
            "mpi_observer_oversized_environments_total",
            "Ranks whose environment exceeded 1 MiB: only its first 1 MiB was searched for the job and rank.",
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
            Box::new(identity_conflicts.clone()),
            Box::new(label_truncations.clone()),
            Box::new(oversized_environments.clone()),
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
            identity_conflicts,
            label_truncations,
            oversized_environments,
            shm_orphans_removed,
        }
    }

    /// Counts a process refused by `budget`, owned by `uid`.
    pub fn refused(&self, uid: u32, budget: crate::budget::Budget) {
        self.refused
            .with_label_values(&[&uid.to_string(), budget.as_str()])
            .inc();
    }

    /// Counts what was cut of a rank's identity as it is registered.
    pub fn count_identity(&self, id: &Identity) {
        for l in &id.truncated {
            self.label_truncations
                .with_label_values(&[l.as_str()])
                .inc();
        }
        if id.environ_cut {
            self.oversized_environments.inc();
        }
    }

    /// `v` cut to the label cap, the cut counted as one of `label`.
    pub fn capped(&self, label: Label, v: &str) -> String {
        let c = identity::cut(v, identity::LABEL_CAP);
        if c.len() < v.len() {
            self.label_truncations
                .with_label_values(&[label.as_str()])
                .inc();
        }
        c.to_string()
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
        let sites = self
            .label_truncations
            .with_label_values(&[Label::Callsite.as_str()]);
        let (have, want) = (sites.get(), identity::callsite_truncations());
        if want > have {
            sites.inc_by(want - have);
        }
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        out.push_str(&String::from_utf8_lossy(&buf));
        // The call-site naming's own counters (symbolizer failures, name
        // cache, library cache), kept process-wide by the naming thread.
        crate::callsites::render_self_metrics(out);
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
    let unique;
    let snap = match with_unique_labels(snap) {
        Some(s) => {
            unique = s;
            &unique
        }
        None => snap,
    };
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
        "One series per observed rank, with its pid, world size, MPI library and where its job id came from (jobid_source: cgroup, verified; environment or launcher, claimed).",
    );
    for r in &snap.ranks {
        let _ = writeln!(
            out,
            "mpi_rank_info{{{},pid=\"{}\",size=\"{}\",library=\"{}\",version=\"{}\",jobid_source=\"{}\"}} 1",
            r.labels.rank,
            r.pid,
            escape(&r.identity.size),
            r.library,
            escape(&r.version),
            r.identity.jobid_source.as_str()
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
        // A site still being named is in neither its own series nor
        // `other` until it is named, so `other` never decreases.
        for s in r.callsites.iter().filter(|s| s.exported || s.pending) {
            if s.exported {
                series.push((r, s.function, &s.name, (s.calls, s.time_ns)));
            }
            let n = named.entry(s.function).or_default();
            n.0 = n.0.saturating_add(s.calls);
            n.1 = n.1.saturating_add(s.time_ns);
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

/// A snapshot like `snap` in which no two ranks share a label set, when
/// `snap` has ranks that do; `None` when it has none. The registry never
/// registers such ranks ([`Labels::distinct`]); this keeps the exposition
/// free of duplicate series whatever the snapshot was built from.
fn with_unique_labels(snap: &Snapshot) -> Option<Snapshot> {
    let mut seen = std::collections::HashSet::new();
    if snap
        .ranks
        .iter()
        .all(|r| seen.insert(r.labels.rank.as_str()))
    {
        return None;
    }
    let mut out = snap.clone();
    let mut taken = std::collections::HashSet::new();
    for r in &mut out.ranks {
        if !taken.contains(r.labels.rank.as_str()) {
            taken.insert(r.labels.rank.clone());
            continue;
        }
        let held: std::collections::HashSet<&str> = taken.iter().map(String::as_str).collect();
        let (l, _) = Labels::distinct(&r.identity, r.pid, &held);
        taken.insert(l.rank.clone());
        r.labels = l;
    }
    Some(out)
}

/// One histogram. Buckets are cumulative and saturate, and never exceed
/// the call count, so that they rise monotonically to `+Inf`, which equals
/// `_count`, whatever the slots hold (a stats segment's are written by the
/// user's process).
fn histogram(out: &mut String, labels: &str, id: u16, st: &CallStats) {
    let name = FUNCTIONS[id as usize].name;
    let mut cum = 0u64;
    let mut slot = 0usize;
    for p in BUCKET_POWERS {
        while slot < p as usize && slot < HIST_SLOTS {
            cum = cum.saturating_add(st.hist[slot]).min(st.calls);
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
    use std::{collections::HashSet, sync::Arc};

    use super::*;
    use crate::{
        callsites::Site,
        identity::{JobidSource, LABEL_CAP},
        segment::{LayerCalls, PeerTraffic, SegmentProblem},
        snapshot::SegmentSnapshot,
    };

    /// A rank with figures in every family: calls, call sites, a segment.
    fn rank(pid: u32, id: Identity, value: u64) -> RankSnapshot {
        let mut st = CallStats::ZERO;
        st.calls = value;
        st.time_ns = value;
        st.bytes = [value, value];
        st.bytes_unknown = [value, 0];
        st.hist = [value; HIST_SLOTS];
        let calls: CallsByFunction = [(0, st), (5, st)].into();
        let mut figures = Figures {
            ready: true,
            outstanding: value,
            ..Default::default()
        };
        figures.peers.insert(
            1,
            PeerTraffic {
                messages: Directed {
                    send: value,
                    recv: value,
                },
                bytes: Directed {
                    send: value,
                    recv: value,
                },
            },
        );
        figures.functions.insert(
            5,
            LayerCalls {
                calls: value,
                bytes: Directed {
                    send: value,
                    recv: value,
                },
            },
        );
        let site = |name: &str| Site {
            function: 0,
            name: Arc::from(crate::identity::cap_callsite(name)),
            calls: value / 2,
            time_ns: value / 2,
            exported: true,
            pending: false,
        };
        RankSnapshot {
            pid,
            labels: Labels::new(&id),
            identity: id,
            library: "openmpi",
            version: "4.1.4".into(),
            started: UNIX_EPOCH,
            attached: UNIX_EPOCH,
            counted_since: UNIX_EPOCH,
            exited: pid.is_multiple_of(2).then_some(UNIX_EPOCH),
            calls: Some(calls),
            segment: Some(SegmentSnapshot {
                figures,
                oldest_request_age: Duration::ZERO,
            }),
            callsites: vec![site("main"), site("solve")],
        }
    }

    /// Every sample line's (name, label set), which must all differ.
    fn assert_unique(out: &str) {
        let mut seen = HashSet::new();
        for line in out.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
            let (series, _) = line.rsplit_once(' ').expect("a sample has a value");
            assert!(seen.insert(series), "duplicate series {series}");
        }
        assert!(seen.len() > 10, "{out}");
    }

    fn xorshift(s: &mut u64) -> u64 {
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        *s
    }

    #[test]
    fn no_two_series_share_a_label_set_whatever_the_ranks_claim() {
        let long = "9".repeat(200);
        // Claims chosen to collide: the same rank of the same job, values
        // equal only once cut, a rank that claims a conflict's suffix, label
        // text trying to close the value, another user's claim of the job.
        let jobs = [
            "4242",
            "4242",
            &long,
            &format!("{long}x"),
            "a\",uid=\"0",
            "",
        ];
        let ranks = [
            "0",
            "0",
            "0#pid3",
            "0#pid3.2",
            &long,
            &format!("{long}y"),
            "1",
        ];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..200 {
            let n = 2 + (xorshift(&mut seed) % 12) as usize;
            let ranks: Vec<RankSnapshot> = (0..n)
                .map(|i| {
                    let r = |s: &mut u64, len: usize| (xorshift(s) % len as u64) as usize;
                    let id = Identity::new(
                        jobs[r(&mut seed, jobs.len())],
                        ranks[r(&mut seed, ranks.len())],
                        "2",
                        [0, 0, 1000][r(&mut seed, 3)],
                        JobidSource::Environment,
                    );
                    rank(1 + i as u32, id, xorshift(&mut seed) >> (round % 64))
                })
                .collect();
            let snap = Snapshot {
                ranks,
                health: Health::default(),
            };
            for per_rank_histograms in [false, true] {
                let out = render(
                    &snap,
                    &SelfMetrics::new(),
                    RenderOptions {
                        per_rank_histograms,
                    },
                    || Duration::ZERO,
                );
                assert_unique(&out);
            }
        }
    }

    #[test]
    fn two_users_claiming_one_rank_make_two_series() {
        let honest = Identity::new("4242", "0", "2", 0, JobidSource::Environment);
        let forged = Identity::new("4242", "0", "2", 1001, JobidSource::Environment);
        let snap = Snapshot {
            ranks: vec![rank(10, honest, 2000), rank(11, forged, u64::MAX - 999)],
            health: Health::default(),
        };
        let out = render(&snap, &SelfMetrics::new(), RenderOptions::default(), || {
            Duration::ZERO
        });
        let f0 = FUNCTIONS[0].name;
        assert!(
            out.contains(&format!(
                "mpi_calls_total{{jobid=\"4242\",uid=\"0\",rank=\"0\",function=\"{f0}\"}} 2000\n"
            )),
            "{out}"
        );
        assert!(out.contains("uid=\"1001\",rank=\"0\""), "{out}");
        // The per-job histogram is per (job, uid): the honest one's count is
        // its own.
        assert!(
            out.contains(&format!("mpi_call_duration_seconds_count{{jobid=\"4242\",uid=\"0\",function=\"{f0}\"}} 2000\n")),
            "{out}"
        );
        assert_unique(&out);
    }

    #[test]
    fn sums_saturate_and_histograms_stay_monotonic() {
        // Two ranks of one job at u64::MAX: the per-job sum saturates.
        let id = |r: &str| Identity::new("j", r, "2", 0, JobidSource::Environment);
        let snap = Snapshot {
            ranks: vec![rank(1, id("0"), u64::MAX), rank(3, id("1"), u64::MAX)],
            health: Health::default(),
        };
        let out = render(&snap, &SelfMetrics::new(), RenderOptions::default(), || {
            Duration::ZERO
        });
        let max = u64::MAX.to_string();
        let f0 = FUNCTIONS[0].name;
        let count = format!(
            "mpi_call_duration_seconds_count{{jobid=\"j\",uid=\"0\",function=\"{f0}\"}} {max}\n"
        );
        assert!(out.contains(&count), "{out}");
        let mut a = CallStats::ZERO;
        a.calls = u64::MAX - 1;
        a.hist[3] = u64::MAX;
        let mut b = a;
        b.add(&a);
        assert_eq!((b.calls, b.hist[3]), (u64::MAX, u64::MAX));

        // Hostile slots: more in the slots than calls, and slots that would
        // wrap a cumulative sum. Buckets rise to +Inf, which is _count.
        for (calls, slots) in [
            (5u64, [u64::MAX; HIST_SLOTS]),
            (u64::MAX, [u64::MAX / 2 + 1; HIST_SLOTS]),
            (0, [7; HIST_SLOTS]),
            (100, [0; HIST_SLOTS]),
        ] {
            let mut st = CallStats::ZERO;
            st.calls = calls;
            st.hist = slots;
            let mut out = String::new();
            histogram(&mut out, "jobid=\"j\"", 0, &st);
            let values: Vec<u64> = out
                .lines()
                .filter(|l| l.contains("_bucket"))
                .map(|l| l.rsplit_once(' ').unwrap().1.parse().unwrap())
                .collect();
            assert!(values.windows(2).all(|w| w[0] <= w[1]), "{out}");
            assert_eq!(*values.last().unwrap(), calls, "{out}");
            assert!(
                out.contains(&format!(
                    "_count{{jobid=\"j\",function=\"{f0}\"}} {calls}\n"
                )),
                "{out}"
            );
        }
    }

    #[test]
    fn exposition_per_rank_is_bounded_whatever_the_claims() {
        let huge = "x".repeat(131 * 1024);
        let small = Identity::new("1", "0", "2", 0, JobidSource::Environment);
        let big = Identity::new(&huge, &huge, &huge, 0, JobidSource::Environment);
        assert_eq!(big.truncated, vec![Label::Jobid, Label::Rank, Label::Size]);
        let size = |id: Identity| {
            let mut r = rank(1, id, 1);
            r.callsites[0].name = Arc::from(crate::identity::cap_callsite(&huge));
            let snap = Snapshot {
                ranks: vec![r],
                health: Health::default(),
            };
            render(&snap, &SelfMetrics::new(), RenderOptions::default(), || {
                Duration::ZERO
            })
            .len()
        };
        let (small, big) = (size(small), size(big));
        println!("exposition of one rank: {small} bytes with short claims, {big} with 131 kB ones");
        // Every label value is at most LABEL_CAP bytes, so a line grows by at
        // most a few caps.
        let lines = 60;
        assert!(big < small + lines * 4 * LABEL_CAP, "{small} -> {big}");
    }

    #[test]
    fn truncations_and_conflicts_are_counted() {
        let m = SelfMetrics::new();
        let huge = "1".repeat(131 * 1024);
        let mut id = Identity::new(&huge, "0", "2", 0, JobidSource::Environment);
        id.environ_cut = true;
        m.count_identity(&id);
        assert_eq!(m.capped(Label::Version, &huge).len(), LABEL_CAP);
        m.identity_conflicts.inc();
        m.segment_error(SegmentProblem::Corrupt);
        let mut out = String::new();
        m.render(&mut out, Health::default(), Duration::ZERO);
        for want in [
            "mpi_observer_label_truncations_total{label=\"jobid\"} 1\n",
            "mpi_observer_label_truncations_total{label=\"version\"} 1\n",
            "mpi_observer_label_truncations_total{label=\"rank\"} 0\n",
            "mpi_observer_oversized_environments_total 1\n",
            "mpi_observer_identity_conflicts_total 1\n",
        ] {
            assert!(out.contains(want), "{want} in {out}");
        }
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
