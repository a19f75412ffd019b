//! The ranks the daemon observes: attaching to a process, noticing that it
//! exited, keeping its final figures for `--retain-exited`, then forgetting
//! it. One [`State`] behind a mutex is shared by the control loop and the
//! HTTP server. A scrape flows one way: the probes' maps and the stats
//! segments are read into a [`Snapshot`](crate::collect::snapshot::Snapshot),
//! which [`metrics`](crate::export::metrics) renders.
//!
//! [`State`] is one type; its methods are spread over the files of this
//! folder, one job each:
//!
//! - `prepare.rs`: reading a process before it is registered, off the
//!   state lock ([`prepare()`], [`Prepared`], [`AttachError`]);
//! - `admission.rs`: whether a process found by `--all` fits its user's
//!   budgets and the maps' capacity ([`Admission`], what it costs);
//! - `rank.rs`: one observed rank ([`Rank`]);
//! - `labels.rs`: the labels a rank is held under, unlike every other's;
//! - `lifecycle.rs`: a rank's life in the state: committed, handed over to
//!   an injected shim, noticed exited, released, retained, forgotten;
//! - `scrape.rs`: one collection (segments and maps read into a snapshot)
//!   and what is made of it (`/metrics`, `/metrics/ranks`, the report data);
//! - `waits.rs`: the ranks' wait records drained into the matcher;
//! - `outbox.rs`: the wait records of jobs that span nodes, kept for the
//!   other nodes' daemons to fetch.

mod admission;
mod labels;
mod lifecycle;
pub mod outbox;
mod prepare;
mod rank;
mod scrape;
mod waits;

use std::{collections::BTreeMap, time::Instant};

pub use self::{
    admission::{Admission, SITES_PER_PROCESS},
    prepare::{AttachError, Prepared, prepare},
    rank::Rank,
    scrape::{count_scrape, scrapes_total},
};
use crate::{
    attach::budget::{Budgets, RefusalLog},
    attach::probes::Probes,
    collect::callsites::{Budget as SiteBudget, Names},
    collect::snapshot::RankSnapshot,
    collect::waits::Waits,
    export::metrics::{
        RenderOptions, SelfMetrics, departed::DepartedJobs, detail::DetailPicker,
        window::FractionWindow,
    },
};

/// What the daemon knows and holds.
pub struct State {
    /// The loaded programs and maps; `None` with `--no-bpf`.
    pub probes: Option<Probes>,
    /// Observed ranks by pid.
    pub ranks: BTreeMap<u32, Rank>,
    /// Self-metrics.
    pub selfm: SelfMetrics,
    /// Function IDs to probe.
    pub functions: Vec<u16>,
    /// Whether to account bytes.
    pub bytes: bool,
    /// Exposition options.
    pub render: RenderOptions,
    /// The detail ranks of `/metrics`, kept across its collections.
    pub picker: DetailPicker,
    /// The ranks' samples behind their fractions over the last minute.
    pub window: FractionWindow,
    /// The job sums of ranks forgotten while others of their job remain.
    pub departed: DepartedJobs,
    /// The final figures of exited ranks, as the first collection after
    /// their exit saw them: folded into `departed` when they are forgotten.
    exited_figures: std::collections::HashMap<u32, RankSnapshot>,
    /// When [`State::notice_exits`] last collected to release exited
    /// ranks' map entries.
    last_release: Instant,
    /// Call-site names, cached by file and offset for every rank.
    pub names: Names,
    /// Call sites with series of their own per (rank, function).
    pub callsite_budget: SiteBudget,
    /// This node's host name, for the report data.
    pub host: String,
    /// Every user's budgets.
    pub budgets: Budgets,
    refusals: RefusalLog,
    /// Processes `--all` found and a budget refused, with their uid: not
    /// offered again (nor counted again) until one of that user's ranks
    /// exits and frees room.
    pub refused: std::collections::HashMap<(u32, u64), u32>,
    /// The wait states of every job, from the ranks' wait records (and,
    /// for jobs that span nodes, those other nodes' daemons shipped).
    pub waits: Waits,
    /// The wait records of jobs that span nodes, for the other nodes'
    /// daemons (`/waits/records`).
    pub outbox: outbox::Outbox,
    /// The CPU's counter in `CLOCK_MONOTONIC`, for the records shipped.
    clock: crate::os::clock::CounterClock,
    /// Whether the daemon has peers (`--waits.peers`): every job's records
    /// are then matched on `CLOCK_MONOTONIC`, whether or not it spans
    /// nodes yet (see `waits.rs`).
    pub ship_waits: bool,
}

impl State {
    /// A state with nothing attached yet.
    pub fn new(
        probes: Option<Probes>,
        functions: Vec<u16>,
        bytes: bool,
        render: RenderOptions,
    ) -> Self {
        Self {
            probes,
            ranks: BTreeMap::new(),
            selfm: SelfMetrics::new(),
            functions,
            bytes,
            render,
            picker: DetailPicker::default(),
            window: FractionWindow::default(),
            departed: DepartedJobs::default(),
            exited_figures: Default::default(),
            last_release: Instant::now(),
            names: Names::new(),
            callsite_budget: SiteBudget::default(),
            host: crate::os::host::hostname(),
            budgets: Budgets::for_cpus(
                std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
            ),
            refusals: RefusalLog::default(),
            refused: std::collections::HashMap::new(),
            waits: Waits::default(),
            outbox: outbox::Outbox::random(),
            clock: Default::default(),
            ship_waits: false,
        }
    }
}
