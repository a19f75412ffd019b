//! The metric model: renders a [`Snapshot`] as the text exposition, then
//! the daemon's own health. It reads nothing itself; the snapshot is built
//! at scrape time from the live BPF maps and stats segments, and the daemon
//! keeps no per-call state of its own. Names and labels here are a stable
//! interface, documented in the README and docs/cardinality.md.
//!
//! Two expositions come out of one renderer: the bounded `/metrics`
//! ([`render`]: per job and node in [`job`], a few series per rank and the
//! full per-rank series of the [`detail`] ranks in [`rank`]) and
//! `/metrics/ranks` ([`render_ranks`]: the full per-rank series of chosen
//! jobs). Both are held to `--max-series` by [`budget`].

pub mod budget;
pub mod departed;
pub mod detail;
mod job;
mod peers;
mod rank;
mod waits;
pub mod window;

use std::{
    fmt::Write as _,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use observer_common::{
    FUNCTIONS,
    functions::{CountKind, Direction},
    maps::{CallStats, HIST_SLOTS},
};
use prometheus::{
    Encoder as _, Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

use self::{
    budget::{BudgetStats, Family},
    departed::DepartedJobs,
    detail::{Detail, DetailPicker},
    rank::Labelled,
    window::Recent,
};
use crate::{
    attach::identity::{self, Identity, Label},
    collect::snapshot::Directed,
    collect::snapshot::{Health, Labels, MapFailures, RankSnapshot, Snapshot, escape},
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
    /// Attaches cut short by the rank's own exit (not failures).
    pub attach_exited: IntCounter,
    /// Ranks the shim was injected into and that are alive.
    pub injected: IntGauge,
    /// Live Open MPI ranks whose datatypes have not checked out yet.
    pub datatypes_pending: IntGauge,
    /// Duration of the last scrape's collection.
    pub scrape_seconds: Gauge,
    scrapes: IntCounter,
    map_failures: IntCounterVec,
    segment_errors: IntCounterVec,
    /// Processes refused by a budget (crate::attach::budget), by uid and budget.
    refused: IntCounterVec,
    /// Reads of /proc/PID/stat that failed for another reason than the
    /// process being gone: the rank's state stayed unknown, not exited.
    pub proc_read_errors: IntCounter,
    /// Candidate processes the attacher's queue had no room for (they are
    /// found again by the next scan).
    pub attach_queue_dropped: IntCounter,
    /// The exec watcher's counters (crate::os::procevents), shared with it.
    pub exec_watch: std::sync::Arc<crate::os::procevents::WatchStats>,
    exec_events: IntCounter,
    exec_dropped: IntCounter,
    exec_found: IntCounter,
    /// Ranks registered with the (job, uid, rank) of another rank held.
    pub identity_conflicts: IntCounter,
    label_truncations: IntCounterVec,
    scheduler_conflicts: IntCounterVec,
    oversized_environments: IntCounter,
    /// Orphaned shim files removed from /dev/shm (crate::os::shm::sweep).
    pub shm_orphans_removed: IntCounter,
    /// The shim's exit knocks, by outcome (crate::daemon::exit_handover).
    pub exit_handovers: IntCounterVec,
    /// Ranks an earlier daemon handed over at a planned restart, by
    /// outcome: their probes adopted, or dropped (attached afresh).
    pub restart_handovers: IntCounterVec,
    /// What the series budget kept and dropped, by path.
    pub budget: BudgetStats,
    kernel_info: IntGaugeVec,
    /// Wait records of jobs spanning nodes no peer fetched
    /// (crate::export::registry::outbox).
    pub waits_outbox_dropped: IntCounter,
    /// Records a peer's outbox dropped before this daemon fetched them
    /// (crate::daemon::peers).
    pub waits_peer_records_lost: IntCounter,
    /// Pulls from a peer that failed (crate::daemon::peers).
    pub waits_peer_errors: IntCounter,
}

/// The labels of `mpi_observer_kernel_info`: the attach mechanism, then
/// each feature the daemon probed (crate::attach::kernel).
pub const KERNEL_LABELS: [&str; 7] = [
    "mechanism",
    "uprobe_multi",
    "perf_link",
    "attach_cookie",
    "ringbuf",
    "ns_pid",
    "btf",
];

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
        let datatypes_pending = IntGauge::new(
            "mpi_observer_datatypes_pending_processes",
            "Live Open MPI ranks attached before their MPI_Init set up the datatypes, whose datatypes are looked at again every second until they check out: until then their calls with a derived datatype count in mpi_bytes_unknown_calls_total, not in mpi_bytes_total.",
        )
        .expect("valid metric");
        let attach_failures = IntCounter::new(
            "mpi_observer_attach_failures_total",
            "Attempts to attach to an MPI process that failed.",
        )
        .expect("valid metric");
        let attach_exited = IntCounter::new(
            "mpi_observer_attach_exited_total",
            "Processes that exited (or were exiting) while being attached, so their probes never went in; not counted in mpi_observer_attach_failures_total.",
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
                "In-kernel map updates that failed (map full): a call that fails on map=\"stats\" or \"inflight\" is not counted; one that fails on map=\"callsites\" is, its site in callsite=\"other\"; map=\"site_cookies\" counts calls of ranks whose probes tell functions by address (kernels without attach cookies) that hit an address the table did not hold, not counted.",
            ),
            &["map"],
        )
        .expect("valid metric");
        let segment_errors = IntCounterVec::new(
            Opts::new(
                "mpi_observer_segment_errors_total",
                "Stats segments skipped: untrusted (owner or permissions), corrupt, version (layout or function IDs), truncated (shrank while read), busy (every SIGBUS guard slot taken by concurrent reads), gone (unlinked at its rank's MPI_Finalize before this daemon could open it: its figures are lost, and a rank found so is not shown).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        let shm_orphans_removed = IntCounter::new(
            "mpi_observer_shm_orphans_removed_total",
            "Files of the shim (stats segments, recording rings) removed from /dev/shm because no live process maps them any more.",
        )
        .expect("valid metric");
        for reason in [
            "untrusted",
            "corrupt",
            "version",
            "truncated",
            "busy",
            "gone",
        ] {
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
            "Program starts (exec) reported by the eBPF exec tracepoint (or, under --no-bpf, the kernel's process connector), each looked at for an MPI library as it starts (attach --all).",
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
            "Ranks registered with the job, uid, rank and step of a rank already held: the later one's rank label gets #pidPID appended (another step's gets #stepS, uncounted).",
        )
        .expect("valid metric");
        let label_truncations = IntCounterVec::new(
            Opts::new(
                "mpi_observer_label_truncations_total",
                "Label values from a process (jobid, rank, size, version, callsite; scheduler: any of its job's scheduler facts) cut to 128 bytes.",
            ),
            &["label"],
        )
        .expect("valid metric");
        for l in Label::ALL {
            label_truncations.with_label_values(&[l.as_str()]);
        }
        let scheduler_conflicts = IntCounterVec::new(
            Opts::new(
                "mpi_observer_scheduler_conflicts_total",
                "Ranks whose scheduler facts were not exported: reason=\"ranks\", they differ from those of a rank of the same job already held on this node (mpi_job_scheduler_info shows the lowest rank's; two steps of one job on one node do); reason=\"cgroup\", the environment names another Slurm job than the rank's cgroup (only scheduler=\"slurm\" is exported).",
            ),
            &["reason"],
        )
        .expect("valid metric");
        for reason in ["ranks", "cgroup"] {
            scheduler_conflicts.with_label_values(&[reason]);
        }
        let oversized_environments = IntCounter::new(
            "mpi_observer_oversized_environments_total",
            "Ranks whose environment exceeded 1 MiB: only its first 1 MiB was searched for the job and rank.",
        )
        .expect("valid metric");
        let exit_handovers = IntCounterVec::new(
            Opts::new(
                "mpi_observer_exit_handovers_total",
                "Exit knocks of shim ranks on the handover socket, by result: held (the rank's segment is held, its final figures kept), no_segment, not_observed (not a process this daemon observes or may attach), queue_full, malformed, stale (served after the shim stopped waiting), not_mpi (judged not MPI before: closed without a look), refused (refused by a budget, or its attach failed, before), uid_mismatch (the process's real, effective, saved and filesystem uids are not all the uid that knocked).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let restart_handovers = IntCounterVec::new(
            Opts::new(
                "mpi_observer_handover_ranks_total",
                "Ranks whose probes an earlier daemon pinned at a planned restart (a package upgrade): outcome=\"adopted\", their probes and figures carried on; outcome=\"dropped\", their probes were removed (another map layout, the rank gone, a pin unusable) and a live one was attached afresh, counting from then.",
            ),
            &["outcome"],
        )
        .expect("valid metric");
        for outcome in ["adopted", "dropped"] {
            restart_handovers.with_label_values(&[outcome]);
        }
        let kernel_info = IntGaugeVec::new(
            Opts::new(
                "mpi_observer_kernel_info",
                "The attach mechanism the daemon chose (uprobe_multi, perf_link, perf_ioctl, or none: the shim's figures only) and what it found this kernel to do, each feature tried, never read off the version: uprobe_multi (yes, main_thread_only where its PID filter misses a process's other threads, no), perf_link (BPF links on uprobe perf events), attach_cookie, ringbuf, ns_pid (bpf_get_ns_current_pid_tgid), btf; unknown where not probed (--no-bpf).",
            ),
            &KERNEL_LABELS,
        )
        .expect("valid metric");
        let waits_outbox_dropped = IntCounter::new(
            "mpi_observer_waits_outbox_dropped_total",
            "Wait records of jobs spanning nodes that no other node's daemon fetched, once one has asked for any: dropped from the outbox (65,536 records, 10 s) before they were fetched, or never kept there (their times on a counter this daemon could not convert yet).",
        )
        .expect("valid metric");
        let waits_peer_records_lost = IntCounter::new(
            "mpi_observer_waits_peer_records_lost_total",
            "Wait records the daemons of --waits.peers dropped from their outbox before this daemon fetched them.",
        )
        .expect("valid metric");
        let waits_peer_errors = IntCounter::new(
            "mpi_observer_waits_peer_errors_total",
            "Fetches of wait records from a daemon of --waits.peers that failed: no answer, an error status, or an answer that is not a valid /waits/records.",
        )
        .expect("valid metric");
        for m in [
            Box::new(exit_handovers.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(segment_errors.clone()),
            Box::new(attached.clone()),
            Box::new(probes.clone()),
            Box::new(attach_failures.clone()),
            Box::new(attach_exited.clone()),
            Box::new(injected.clone()),
            Box::new(datatypes_pending.clone()),
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
            Box::new(scheduler_conflicts.clone()),
            Box::new(oversized_environments.clone()),
            Box::new(shm_orphans_removed.clone()),
            Box::new(restart_handovers.clone()),
            Box::new(kernel_info.clone()),
            Box::new(waits_outbox_dropped.clone()),
            Box::new(waits_peer_records_lost.clone()),
            Box::new(waits_peer_errors.clone()),
        ] {
            registry.register(m).expect("unique metric names");
        }
        Self {
            registry,
            attached,
            probes,
            attach_failures,
            attach_exited,
            injected,
            datatypes_pending,
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
            scheduler_conflicts,
            oversized_environments,
            shm_orphans_removed,
            exit_handovers,
            restart_handovers,
            budget: BudgetStats::default(),
            kernel_info,
            waits_outbox_dropped,
            waits_peer_records_lost,
            waits_peer_errors,
        }
    }

    /// Sets `mpi_observer_kernel_info`: `values` in the order of
    /// [`KERNEL_LABELS`] (the mechanism first).
    pub fn set_kernel(&self, values: &[&str; 7]) {
        self.kernel_info.reset();
        self.kernel_info.with_label_values(values).set(1);
    }

    /// Counts a process refused by `budget`, owned by `uid`.
    pub fn refused(&self, uid: u32, budget: crate::attach::budget::Budget) {
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
        if id.scheduler_disowned {
            self.scheduler_conflicts
                .with_label_values(&["cgroup"])
                .inc();
        }
    }

    /// Counts a rank registered with scheduler facts unlike those of a rank
    /// of its job already held.
    pub fn scheduler_conflict(&self) {
        self.scheduler_conflicts.with_label_values(&["ranks"]).inc();
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
    pub fn segment_error(&self, p: crate::collect::snapshot::SegmentProblem) {
        self.segment_errors.with_label_values(&[p.as_str()]).inc();
    }

    fn set_map_failures(&self, failures: MapFailures) {
        for (label, want) in [
            ("stats", failures.stats),
            ("inflight", failures.inflight),
            ("callsites", failures.callsites),
            ("site_cookies", failures.site_cookies),
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
        crate::collect::callsites::render_self_metrics(out);
        self.budget.render(out);
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

/// `--detail-ranks`'s default: one most and one least loaded rank per job
/// and node.
pub const DEFAULT_DETAIL_RANKS: usize = 2;
/// `--max-series`'s default, per exposition.
pub const DEFAULT_MAX_SERIES: usize = 50_000;

/// Options that change the exposition.
#[derive(Clone, Copy, Debug)]
pub struct RenderOptions {
    /// Export the latency histogram per rank too, for the ranks whose full
    /// series are exported (more series).
    pub per_rank_histograms: bool,
    /// Full per-rank series for every rank on `/metrics`, as before issue
    /// 22, besides the job-level families.
    pub per_rank_detail: bool,
    /// Detail ranks per job and node on the bounded `/metrics`.
    pub detail_ranks: usize,
    /// Series per exposition at most (self-metrics not counted).
    pub max_series: usize,
    /// This node's name in `node` and `peer_node`; `None`: the hostname
    /// ([`crate::attach::identity::layout::this_node`]).
    pub node: Option<&'static str>,
}

impl Default for RenderOptions {
    fn default() -> Self {
        Self {
            per_rank_histograms: false,
            per_rank_detail: false,
            detail_ranks: DEFAULT_DETAIL_RANKS,
            max_series: DEFAULT_MAX_SERIES,
            node: None,
        }
    }
}

impl RenderOptions {
    /// This node's name.
    pub fn node(&self) -> &'static str {
        self.node
            .unwrap_or_else(crate::attach::identity::layout::this_node)
    }
}

/// What the bounded `/metrics` carries from one collection to the next
/// (kept by [`crate::export::registry::State`]): the detail ranks, the ranks'
/// fractions over the last minute, and the figures of ranks forgotten
/// while others of their job remain.
#[derive(Clone, Copy, Debug)]
pub struct Carried<'a> {
    /// The detail ranks of this collection.
    pub detail: &'a Detail,
    /// The running ranks' MPI fractions over the last minute.
    pub recent: &'a Recent,
    /// The job sums of ranks no longer held.
    pub departed: &'a DepartedJobs,
    /// The jobs' wait states.
    pub waits: &'a crate::collect::waits::Waits,
}

/// Which exposition to render.
enum Path<'a> {
    /// The bounded `/metrics`, with what it carries across collections.
    Metrics(Carried<'a>),
    /// `/metrics/ranks`: full per-rank series of these jobs (`None`: all),
    /// with the jobs' wait states.
    Ranks(Option<&'a [String]>, &'a crate::collect::waits::Waits),
}

impl Path<'_> {
    fn as_str(&self) -> &'static str {
        match self {
            Path::Metrics(..) => budget::PATHS[0],
            Path::Ranks(..) => budget::PATHS[1],
        }
    }
}

/// Renders the bounded `/metrics` exposition: the MPI metrics of the ranks
/// in `snap`, then the self-metrics, with `elapsed` (asked for once the MPI
/// metrics are rendered) as the scrape's duration. The detail ranks are
/// chosen from `snap` alone, and with no history there are no fractions
/// over the last minute; the daemon keeps both across scrapes with
/// [`render_metrics`] instead.
pub fn render(
    snap: &Snapshot,
    selfm: &SelfMetrics,
    opts: RenderOptions,
    elapsed: impl FnOnce() -> Duration,
) -> String {
    let detail = DetailPicker::default().update(snap, opts.detail_ranks);
    let carried = Carried {
        detail: &detail,
        recent: &Recent::new(),
        departed: &DepartedJobs::default(),
        waits: &crate::collect::waits::Waits::default(),
    };
    render_metrics(snap, selfm, opts, carried, elapsed)
}

/// [`render`] with what the daemon keeps across collections: the detail
/// ranks chosen by a [`DetailPicker`], the fractions over the last minute
/// of a [`window::FractionWindow`], and the [`DepartedJobs`].
pub fn render_metrics(
    snap: &Snapshot,
    selfm: &SelfMetrics,
    opts: RenderOptions,
    carried: Carried<'_>,
    elapsed: impl FnOnce() -> Duration,
) -> String {
    let mut out = exposition(snap, selfm, opts, Path::Metrics(carried));
    selfm.render(&mut out, snap.health, elapsed());
    let _ = writeln!(
        out,
        "# HELP mpi_observer_node_info This node's name, as the node and peer_node labels of peer traffic give it: joins instance to node.\n# TYPE mpi_observer_node_info gauge\nmpi_observer_node_info{{node=\"{}\"}} 1",
        escape(opts.node())
    );
    out
}

/// Renders `/metrics/ranks`: the full per-rank series (as `/metrics` with
/// `--per-rank-detail` has them) of the ranks of the jobs named in
/// `jobids` (every job without), their wait states per rank from `waits`,
/// no self-metrics. What the budget dropped is counted in `selfm`, shown
/// on `/metrics`.
pub fn render_ranks(
    snap: &Snapshot,
    selfm: &SelfMetrics,
    opts: RenderOptions,
    jobids: Option<&[String]>,
    waits: &crate::collect::waits::Waits,
) -> String {
    let mut out = String::from(crate::export::names::RANKS_MARK);
    out.push('\n');
    out.push_str(&exposition(snap, selfm, opts, Path::Ranks(jobids, waits)));
    out
}

/// The MPI series of one exposition, held to the budget.
fn exposition(snap: &Snapshot, selfm: &SelfMetrics, opts: RenderOptions, path: Path<'_>) -> String {
    let unique;
    let snap = match with_unique_labels(snap) {
        Some(s) => {
            unique = s;
            &unique
        }
        None => snap,
    };
    let ranks: Vec<&RankSnapshot> = match &path {
        Path::Metrics(..) | Path::Ranks(None, _) => snap.ranks.iter().collect(),
        Path::Ranks(Some(jobs), _) => snap
            .ranks
            .iter()
            .filter(|r| jobs.contains(&r.identity.jobid))
            .collect(),
    };
    // The ranks with full per-rank series, and of those, the ones with
    // their call sites, peers and layer counts too: on the bounded
    // `/metrics` the detail ranks have only their per-function figures
    // (rank × peer and rank × call site are for `/metrics/ranks`).
    let (full, wide): (Vec<&RankSnapshot>, Vec<&RankSnapshot>) = match &path {
        Path::Metrics(c) if !opts.per_rank_detail => (
            ranks
                .iter()
                .copied()
                .filter(|r| c.detail.contains_key(&r.pid))
                .collect(),
            Vec::new(),
        ),
        _ => (ranks.clone(), ranks.clone()),
    };
    fn labelled<'a>(rs: &[&'a RankSnapshot]) -> Vec<Labelled<'a>> {
        rs.iter()
            .filter_map(|r| r.calls.as_ref().map(|s| (*r, s)))
            .collect()
    }
    let full_labelled: Vec<Labelled<'_>> = labelled(&full);
    let mut fams: Vec<Family> = Vec::with_capacity(64);
    rank::calls(&mut fams, &full_labelled);
    rank::callsites(&mut fams, &labelled(&wide));
    let mut hist = Family::always(
        "mpi_call_duration_seconds",
        "histogram",
        "Latency of completed MPI calls, per job and function, over this node's ranks (per rank too with --per-rank-histograms: select rank=\"\" for the job's).",
    );
    if opts.per_rank_histograms {
        rank::histograms(&mut hist, &full_labelled);
    }
    if let Path::Metrics(c) = path {
        job::histograms(&mut hist, &labelled(&ranks), c.departed);
    }
    fams.push(hist);
    rank::minimal(&mut fams, &ranks, &full, snap.taken);
    rank::segments(&mut fams, &full, &wide);
    match &path {
        Path::Metrics(c) => waits::ranks(&mut fams, &full, c.waits),
        Path::Ranks(_, w) => waits::ranks(&mut fams, &full, w),
    }
    if let Path::Metrics(c) = path {
        rank::marks(&mut fams, &ranks, c.detail);
        job::families(
            &mut fams,
            &snap.ranks,
            &labelled(&ranks),
            opts.node(),
            snap.taken,
            c.recent,
            c.departed,
        );
        waits::families(&mut fams, c.waits);
    }
    let mut out = String::with_capacity(64 * 1024 + fams.len() * 256);
    let outcome = budget::write(&fams, opts.max_series, &mut out);
    selfm.budget.record(path.as_str(), opts.max_series, outcome);
    out
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
mod tests;
