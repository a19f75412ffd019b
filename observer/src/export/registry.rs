//! The ranks the daemon observes: attaching to a process, noticing that it
//! exited, keeping its final figures for `--retain-exited`, then forgetting
//! it. One [`State`] behind a mutex is shared by the control loop and the
//! HTTP server. A scrape flows one way: the probes' maps and the stats
//! segments are read into a [`Snapshot`], which [`metrics`] renders.

use std::{
    collections::{BTreeMap, HashSet},
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant, SystemTime},
};

use thiserror::Error;

use crate::{
    attach::budget::{self, Budget, Budgets, Cost, RefusalLog},
    attach::datatypes,
    attach::identity::{self, Identity, JobidSource, Label},
    attach::probes::{Attachment, ProbeError, Probes},
    attach::symbols::{self, SymbolError},
    collect::callsites::{Budget as SiteBudget, Names, RankSites, Who},
    collect::segment::Segment,
    collect::snapshot::{
        CallsByFunction, Health, Labels, RankSnapshot, RawSite, SegmentSnapshot, Snapshot,
    },
    collect::snapshot::{Figures, SegmentProblem},
    export::metrics::{
        self, Carried, RenderOptions, SelfMetrics, departed::DepartedJobs, detail::DetailPicker,
        window::FractionWindow,
    },
    os::procfs::{self, ProcError},
};

/// Completed collections, exported as `mpi_observer_scrapes_total`. Kept
/// here, beside the collections it counts, so the server only reports one
/// ([`count_scrape`]) and the registry needs nothing of the server.
static SCRAPES: AtomicU64 = AtomicU64::new(0);

/// Counts one completed collection (the server, once per scrape or per
/// group of concurrent scrapes that shared one).
pub fn count_scrape() {
    SCRAPES.fetch_add(1, Ordering::Relaxed);
}

/// Collections completed since the daemon started: one per scrape, or per
/// group of concurrent scrapes that shared one.
pub fn scrapes_total() -> u64 {
    SCRAPES.load(Ordering::Relaxed)
}

/// Errors attaching to one process.
#[derive(Debug, Error)]
pub enum AttachError {
    /// Reading /proc failed.
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// The process maps no MPI library.
    #[error(
        "process {pid} ({comm}) has no MPI library mapped (looked for libmpi.so* and libmpich.so* in /proc/{pid}/maps): \
         give the pid of an MPI rank, not of mpirun, and attach after it started"
    )]
    NoMpiLibrary {
        /// The pid.
        pid: u32,
        /// Its command name.
        comm: String,
    },
    /// A statically linked program: no shared MPI library to probe.
    #[error(
        "process {pid} ({comm}) is a statically linked executable: there is no shared MPI library to probe \
         and no dynamic loader to --inject the shim with; link it against the shared libmpi (mpicc's default)"
    )]
    Static {
        /// The pid.
        pid: u32,
        /// Its command name.
        comm: String,
    },
    /// The library could not be read.
    #[error(transparent)]
    Symbols(#[from] SymbolError),
    /// Probes could not be attached.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// Its user is at a budget, or the kernel maps are full.
    #[error(
        "pid {pid} (uid {uid}) not observed: over the {} budget; raise it with {} if this user's jobs need more",
        budget.as_str(),
        budget.flag()
    )]
    Refused {
        /// The process.
        pid: u32,
        /// Its real uid.
        uid: u32,
        /// The budget it would exceed.
        budget: Budget,
    },
    /// The process ended (or was already ending) while it was being
    /// attached: whatever failed (its maps read, a uprobe_multi link made
    /// on /proc/PID/root/...) failed because it was gone, not because of a
    /// fault of ours. Counted in `mpi_observer_attach_exited_total`, not as
    /// an attach failure.
    #[error("rank {pid} exited before its probes were in")]
    Exited {
        /// The pid.
        pid: u32,
    },
}

impl AttachError {
    /// `self`, or [`AttachError::Exited`] if `pid` (started at `ticks`) is
    /// gone or a zombie now, as `/proc/PID/stat` said right after the
    /// failure (`live`). A budget's refusal stays one: it was decided, not
    /// failed. Unknown liveness (the read failed) keeps the error as it is.
    pub fn or_exited(self, pid: u32, live: procfs::Liveness) -> AttachError {
        match self {
            AttachError::Refused { .. } | AttachError::Exited { .. } => self,
            _ if live == procfs::Liveness::Exited => AttachError::Exited { pid },
            _ => self,
        }
    }
}

/// How a process came to be attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Named with `--pid` by whoever started the daemon: attached whatever
    /// the budgets say (a full map still counts its lost calls).
    Named,
    /// Found by `--all`: its user's budgets and the maps' capacity apply.
    Found,
}

/// How often, at most, exited ranks' map entries are released.
const RELEASE_EVERY: Duration = Duration::from_secs(1);

/// Call-site map entries reserved per probed process when call sites are
/// recorded: what the probes may create for it.
pub const SITES_PER_PROCESS: usize = 1_024;

/// A process read and ready to be registered: everything attaching needs
/// from `/proc` and the library's file, gathered without the state lock
/// (see [`prepare`]).
pub struct Prepared {
    /// The pid.
    pub pid: u32,
    /// Its start time in ticks.
    pub ticks: u64,
    /// Its real uid.
    pub uid: u32,
    map: procfs::MappedLib,
    host_path: std::path::PathBuf,
    lib: std::sync::Arc<symbols::Library>,
    datatypes: datatypes::Datatypes,
    identity: Identity,
    comm: String,
    segment: Option<Segment>,
    /// A ready, live shim times every call: no probes.
    timed: bool,
    /// That shim was injected by an earlier daemon.
    adopted: bool,
    sites: RankSites,
}

/// Reads what attaching `pid` (started at `ticks`) needs: its MPI library
/// (parsed, a user's file read with bounds), identity, datatypes, segment
/// and maps. Takes no lock and may take a while: the attacher runs it on a
/// thread of its own.
pub fn prepare(pid: u32, ticks: u64) -> Result<Prepared, AttachError> {
    prepare_inner(pid, ticks).map_err(|e| e.or_exited(pid, procfs::liveness(pid, ticks)))
}

fn prepare_inner(pid: u32, ticks: u64) -> Result<Prepared, AttachError> {
    let map = procfs::mpi_library(pid)?.ok_or_else(|| AttachError::no_library(pid))?;
    let uid = procfs::uid(pid)?;
    let identity = identity::identity(pid)?;
    let host_path = map.host_path(pid);
    // Opened as mapped, within the size cap, parsed once per file.
    let lib = symbols::LibraryCache::global().get_mapped(pid, &map)?;
    let datatypes = datatypes::inspect(pid, &lib, &map);
    // A rank whose shim already times its calls gets no probes: the
    // segment counts them all (see `rank_calls`), and a live shim an
    // earlier daemon injected is adopted. One detached since counts
    // nothing more: probes.
    // The segment is kept open from here: a rank that exits before the
    // next collection still has its figures read (the mapping outlives
    // the shim's unlink at exit).
    let segment = Segment::open(pid).ok().flatten();
    let (timed, adopted) = match segment.as_ref().map(Segment::read) {
        Some(Ok(f)) if f.ready && !f.ejected => (true, f.injected),
        _ => (false, false),
    };
    // The maps as they are now, so call sites can still be named after
    // the process exits.
    let mut sites = RankSites::default();
    sites.prime(pid);
    // Still the same process: a pid reused meanwhile is someone else.
    if procfs::start_ticks(pid)? != ticks {
        return Err(ProcError::NoSuchProcess { pid }.into());
    }
    Ok(Prepared {
        pid,
        ticks,
        uid,
        comm: procfs::comm(pid),
        map,
        host_path,
        lib,
        datatypes,
        identity,
        segment,
        timed,
        adopted,
        sites,
    })
}

impl AttachError {
    /// Why `pid`, which maps no MPI library, cannot be attached to.
    pub fn no_library(pid: u32) -> AttachError {
        let comm = procfs::comm(pid);
        if procfs::is_static(pid) {
            AttachError::Static { pid, comm }
        } else {
            AttachError::NoMpiLibrary { pid, comm }
        }
    }
}

/// One observed rank.
#[derive(Debug)]
pub struct Rank {
    /// Process ID.
    pub pid: u32,
    /// Start time in ticks since boot; identifies the process with the pid.
    pub ticks: u64,
    /// Its real uid: whose budgets it counts against.
    pub uid: u32,
    /// Map entries reserved for it (see [`crate::attach::budget`]).
    pub reserved: Cost,
    /// Rank, size, job and uid, from /proc (see [`identity`]).
    pub identity: Identity,
    /// The labels made of the identity, unlike every other rank's.
    pub labels: Labels,
    /// "openmpi" or "mpich".
    pub library: &'static str,
    /// Library version, cut to the label cap.
    pub version: String,
    /// Command name.
    pub comm: String,
    /// When the process started.
    pub started_at: SystemTime,
    /// When the probes went in.
    pub attached_at: SystemTime,
    /// When we noticed it exited.
    pub exited_at: Option<Instant>,
    /// The same, as wall-clock time.
    pub exited_wall: Option<SystemTime>,
    attachment: Option<Attachment>,
    /// The shim's stats segment, held open once found.
    segment: Option<Segment>,
    /// The last problem met with the segment, counted once per change.
    segment_problem: Option<SegmentProblem>,
    /// The segment's figures as of the last read.
    pub figures: Option<Figures>,
    /// Its calls are counted by a shim injected into it (`attach
    /// --inject`), by this daemon or, see `adopted`, an earlier one.
    pub injected: bool,
    /// The injected shim was there, counting, before this daemon attached
    /// (a daemon restarted after `kill -9`): its timing replaces what the
    /// probes counted instead of adding to it.
    pub adopted: bool,
    /// This daemon is injecting the shim into it now: the injector, not
    /// `read_segments`, decides when the probes go.
    pub injecting: bool,
    /// How the probes read its library's handles (`maps::lib_kind`).
    pub lib_kind: u32,
    /// Its MPI library's path, as the process sees it.
    pub lib_path: std::path::PathBuf,
    /// Its call sites' names and which have series of their own.
    sites: RankSites,
    /// An Open MPI rank attached before its library initialised its
    /// datatypes (found as it started): what to look at them again with,
    /// until they check out (see [`State::datatypes_pending`]).
    pending_datatypes: Option<(std::sync::Arc<symbols::Library>, procfs::MappedLib)>,
    /// It exited, its final figures are kept in [`State`]'s
    /// `exited_figures`, and its map entries are freed (and its budget
    /// with them): a user's retained short jobs never crowd out their
    /// next ones.
    released: bool,
    /// Once it exited: the call sites its final figures were named from,
    /// kept while some of their names are still to be made (the
    /// symbolizer is busy, or its user spent its budget), so that they are
    /// named after it is released instead of never.
    exited_sites: Vec<RawSite>,
}

impl Rank {
    /// Whether its shim segment is held open (crate::daemon::exit_handover).
    pub fn has_segment(&self) -> bool {
        self.segment.is_some()
    }

    /// Whether probes are attached to this rank now.
    pub fn is_probed(&self) -> bool {
        self.attachment.is_some()
    }

    /// Its probes, if attached now (a planned restart pins their links).
    pub fn attachment(&self) -> Option<&Attachment> {
        self.attachment.as_ref()
    }

    /// Uprobes plus uretprobes attached to this rank now.
    pub fn probes(&self) -> usize {
        self.attachment.as_ref().map_or(0, |a| a.probes)
    }

    /// A rank with no process behind it, for benchmarks of the metric model
    /// (scrape time and memory at scale with synthetic map entries) and its
    /// golden test.
    #[doc(hidden)]
    pub fn synthetic(pid: u32, rank: u32, jobid: &str) -> Rank {
        let identity = Identity::new(jobid, &rank.to_string(), "256", 0, JobidSource::Environment);
        Rank {
            pid,
            ticks: 0,
            uid: 0,
            reserved: Cost::default(),
            labels: Labels::new(&identity),
            identity,
            library: "openmpi",
            version: "synthetic".into(),
            comm: "synthetic".into(),
            started_at: SystemTime::now(),
            attached_at: SystemTime::now(),
            exited_at: None,
            exited_wall: None,
            attachment: None,
            segment: None,
            segment_problem: None,
            figures: None,
            injected: false,
            adopted: false,
            injecting: false,
            lib_kind: observer_common::maps::lib_kind::OPEN_MPI,
            lib_path: "/synthetic/libmpi.so.40".into(),
            sites: RankSites::default(),
            pending_datatypes: None,
            released: false,
            exited_sites: Vec::new(),
        }
    }

    /// Call-site addresses this rank has names for (for a per-user bound
    /// on call-site names; at most `callsites::PER_RANK_NAMES`).
    pub fn callsite_names(&self) -> usize {
        self.sites.len()
    }

    /// Names the call site `addr` of a synthetic rank (no process to read).
    #[doc(hidden)]
    pub fn name_site(&mut self, addr: u64, name: &str) {
        self.sites.preset(addr, name);
    }

    /// When the counting its figures stand for began: the process's start
    /// for a shim there from its start, else the attach.
    pub fn counted_since(&self) -> SystemTime {
        match &self.figures {
            Some(f) if f.ready && !f.injected => self.started_at,
            _ => self.attached_at,
        }
    }
}

/// The line for a rank whose live shim an earlier daemon injected.
fn adoption_line(pid: u32) -> String {
    format!(
        "pid {pid} runs a shim injected before this daemon attached; it counts the rank's calls, so the rank carries no probes"
    )
}

/// A rank's call statistics: from the probes, or from a ready segment's
/// timing, which replaces them (the shim was there from the process's start,
/// or from before this daemon attached, and counted every call the probes
/// saw) or, for a shim this daemon injected (`add`), adds to them (the
/// probes counted up to the handover, the shim from it on; see
/// docs/inject.md). Without `bytes`, no byte figures.
fn rank_calls(
    probed: Option<CallsByFunction>,
    f: Option<&Figures>,
    add: bool,
    bytes: bool,
) -> Option<CallsByFunction> {
    let Some(f) = f.filter(|f| f.ready) else {
        return probed;
    };
    let mut out = if add {
        probed.unwrap_or_default()
    } else {
        CallsByFunction::default()
    };
    for (&id, t) in &f.timing {
        let mut s = observer_common::maps::CallStats::ZERO;
        s.calls = t.calls;
        s.time_ns = t.time_ns;
        s.hist = t.hist;
        if bytes {
            s.bytes = t.bytes;
            s.bytes_unknown = t.bytes_unknown;
        }
        out.entry(id)
            .or_insert(observer_common::maps::CallStats::ZERO)
            .add(&s);
    }
    Some(out)
}

/// A rank's raw call sites, by the same rule as [`rank_calls`]: the
/// segment's replace the probes', or add to them for a shim this daemon
/// injected.
fn rank_sites(probed: Option<Vec<RawSite>>, f: Option<&Figures>, add: bool) -> Vec<RawSite> {
    let Some(f) = f.filter(|f| f.ready) else {
        return probed.unwrap_or_default();
    };
    let mut out = if add {
        probed.unwrap_or_default()
    } else {
        Vec::new()
    };
    out.extend_from_slice(&f.callsites);
    out
}

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
        }
    }

    /// Attaches to `pid` now, on this thread: [`prepare`] then
    /// [`State::commit`]. Holding the state lock across the file reads is
    /// what the daemon avoids (its attacher prepares without the lock); this
    /// is for callers that hold nothing else up. Re-attaching to a pid
    /// already observed is a no-op.
    pub fn attach(&mut self, pid: u32) -> Result<(), AttachError> {
        let ticks = procfs::start_ticks(pid)?;
        if self.ranks.get(&pid).is_some_and(|r| r.ticks == ticks) {
            return Ok(());
        }
        let prepared = prepare(pid, ticks);
        self.commit(prepared, Admission::Named)
    }

    /// Registers a prepared process: for one `--all` found, checks its
    /// user's budgets and the maps' capacity; attaches its probes (unless
    /// its shim times it) and records it. Counts a failure. Re-attaching to
    /// a pid already observed (same start time) is a no-op.
    pub fn commit(
        &mut self,
        prepared: Result<Prepared, AttachError>,
        admission: Admission,
    ) -> Result<(), AttachError> {
        let result = prepared.and_then(|p| {
            if self.ranks.get(&p.pid).is_some_and(|r| r.ticks == p.ticks) {
                return Ok(());
            }
            let (pid, ticks) = (p.pid, p.ticks);
            // A rank exiting as its links are made fails them (its
            // /proc/PID/root/... is gone): looked at right after.
            self.try_commit(p, admission)
                .map_err(|e| e.or_exited(pid, procfs::liveness(pid, ticks)))
        });
        if let Err(e) = &result {
            match e {
                AttachError::Refused { uid, budget, .. } => self.selfm.refused(*uid, *budget),
                AttachError::Exited { .. } => self.selfm.attach_exited.inc(),
                _ => self.selfm.attach_failures.inc(),
            }
        }
        result
    }

    /// What attaching `pid` would cost: its probes and map entries, and
    /// whether its shim times it (then it gets no probes).
    fn cost(&self, p: &Prepared) -> Cost {
        if p.timed || self.probes.is_none() {
            return Cost::default();
        }
        let functions = self
            .functions
            .iter()
            .filter(|id| p.lib.entries.contains_key(id))
            .count();
        let sites = if self.probes.as_ref().is_some_and(Probes::callsites) {
            SITES_PER_PROCESS
        } else {
            0
        };
        Cost {
            probes: 2 * functions,
            map_entries: functions,
            site_entries: sites,
        }
    }

    /// The budget attaching `p` would exceed, if any: its user's, then the
    /// node's map capacity.
    fn over_budget(&self, p: &Prepared, cost: Cost) -> Option<Budget> {
        let usage = budget::usage_by_uid(
            self.ranks
                .values()
                .map(|r| (r.uid, r.exited_at.is_none(), r.probes(), r.reserved)),
        );
        if let Some(b) = self
            .budgets
            .check(usage.get(&p.uid).copied().unwrap_or_default(), cost)
        {
            return Some(b);
        }
        // Each map on its own: neither may be overcommitted.
        if let Some(probes) = &self.probes {
            let stats: usize = usage.values().map(|u| u.map_entries).sum();
            let sites: usize = usage.values().map(|u| u.site_entries).sum();
            if stats + cost.map_entries > probes.stats_capacity() as usize
                || sites + cost.site_entries > probes.callsites_capacity() as usize
            {
                return Some(Budget::Capacity);
            }
        }
        (!budget::descriptors_left()).then_some(Budget::Descriptors)
    }

    fn try_commit(&mut self, p: Prepared, admission: Admission) -> Result<(), AttachError> {
        let pid = p.pid;
        let cost = self.cost(&p);
        let over = match admission {
            Admission::Found => self.over_budget(&p, cost),
            Admission::Named => None,
        };
        if let Some(budget) = over {
            if let Some(line) = self.refusals.line(p.uid, pid, budget, &self.budgets) {
                eprintln!("mpi-observer: {line}");
            }
            self.refused.insert((pid, p.ticks), p.uid);
            return Err(AttachError::Refused {
                pid,
                uid: p.uid,
                budget,
            });
        }
        // A new process reusing the pid of an exited rank: the maps are
        // keyed by pid, so the old rank's figures, probes and datatype
        // entries must go before the new ones go in; its final figures go
        // to its job's departed sums first, as at its expiry.
        if self.ranks.contains_key(&pid) {
            let last = match self.exited_figures.remove(&pid) {
                Some(r) => Some(r),
                None => self.collect().ranks.into_iter().find(|r| r.pid == pid),
            };
            if let Some(r) = last {
                self.fold_departed(&r);
            }
            self.forget(pid);
        }
        let config = datatypes::proc_config(&p.lib, &p.datatypes, self.bytes);
        let pending_datatypes = (self.bytes
            && !p.timed
            && self.probes.is_some()
            && p.lib.kind == observer_common::maps::lib_kind::OPEN_MPI
            && p.datatypes.derived.is_none())
        .then(|| (p.lib.clone(), p.map.clone()));
        let attachment = match self.probes.as_mut() {
            Some(probes) if !p.timed => Some(probes.attach(
                pid,
                &p.host_path,
                &p.lib,
                config,
                &p.datatypes.sizes,
                &self.functions,
            )?),
            _ => None,
        };
        if let Some(a) = &attachment {
            self.selfm.probes.add(a.probes as i64);
        }
        self.selfm.count_identity(&p.identity);
        self.ranks.insert(
            pid,
            Rank {
                pid,
                ticks: p.ticks,
                uid: p.uid,
                reserved: cost,
                labels: self.distinct_labels(&p.identity, pid),
                identity: p.identity,
                library: p.lib.name,
                version: self.selfm.capped(Label::Version, &p.lib.version),
                comm: p.comm,
                started_at: procfs::ticks_to_time(p.ticks),
                // An adopted rank's figures count from its first attach.
                attached_at: attachment
                    .as_ref()
                    .and_then(|a| a.since)
                    .unwrap_or_else(SystemTime::now),
                exited_at: None,
                exited_wall: None,
                attachment,
                segment: p.segment,
                segment_problem: None,
                figures: None,
                injected: p.adopted,
                adopted: p.adopted,
                injecting: false,
                lib_kind: config.lib,
                lib_path: p.map.path.clone(),
                sites: p.sites,
                pending_datatypes,
                released: false,
                exited_sites: Vec::new(),
            },
        );
        self.selfm.attached.set(self.attached_count() as i64);
        if p.adopted {
            self.selfm.injected.inc();
            eprintln!("mpi-observer: {}", adoption_line(pid));
        }
        Ok(())
    }

    /// What to inspect rank `pid`'s datatypes again with, if they did not
    /// check out when it was attached (it had not initialised MPI yet) and
    /// it still carries its probes.
    pub fn datatypes_pending(
        &self,
        pid: u32,
        ticks: u64,
    ) -> Option<(std::sync::Arc<symbols::Library>, procfs::MappedLib)> {
        let r = self.ranks.get(&pid).filter(|r| r.ticks == ticks)?;
        if r.exited_at.is_some() || r.attachment.is_none() {
            return None;
        }
        r.pending_datatypes.clone()
    }

    /// Applies datatypes found once rank `pid` initialised MPI: from then
    /// on, derived types' bytes are read too.
    pub fn apply_datatypes(&mut self, pid: u32, dt: &datatypes::Datatypes) {
        let Some(derived) = dt.derived else { return };
        let (Some(r), Some(probes)) = (self.ranks.get_mut(&pid), self.probes.as_mut()) else {
            return;
        };
        let Some(att) = r.attachment.as_mut() else {
            return;
        };
        if probes
            .update_datatypes(pid, att, &dt.sizes, derived)
            .is_ok()
        {
            r.pending_datatypes = None;
        }
    }

    /// Holds `rank` from now on as an attach does: with labels unlike every
    /// other rank's (see [`State::distinct_labels`]), what was cut of its
    /// identity counted. For synthetic ranks (the golden test).
    #[doc(hidden)]
    pub fn register(&mut self, mut rank: Rank) {
        rank.labels = self.distinct_labels(&rank.identity, rank.pid);
        self.selfm.count_identity(&rank.identity);
        self.ranks.insert(rank.pid, rank);
    }

    /// The labels of `pid`, a rank about to be registered, unlike those of
    /// every rank held (running or retained). A rank of another step of the
    /// job than the holder of its plain labels (a batch job's next `srun`,
    /// while the last one's ranks are retained) is no conflict: it gets
    /// [`Labels::of_step`]. Any other conflict is counted and said once.
    fn distinct_labels(&self, identity: &Identity, pid: u32) -> Labels {
        self.check_scheduler(identity);
        let taken: HashSet<&str> = self
            .ranks
            .values()
            .map(|r| r.labels.rank.as_str())
            .collect();
        let plain = Labels::new(identity);
        let step = |i: &Identity| i.scheduler.as_deref().map(|f| f.step.clone());
        if let Some(holder) = self.ranks.values().find(|r| r.labels.rank == plain.rank)
            && step(&holder.identity) != step(identity)
            && let Some(labels) = Labels::of_step(identity, &taken)
        {
            return labels;
        }
        let (labels, conflict) = Labels::distinct(identity, pid, &taken);
        if conflict {
            self.selfm.identity_conflicts.inc();
            eprintln!(
                "mpi-observer: pid {pid} claims rank {:?} of job {:?} (uid {}), which another process holds; its series carry {}",
                identity.rank, identity.jobid, identity.uid, labels.rank
            );
        }
        labels
    }

    /// Counts, and says once per rank, a rank whose scheduler facts differ
    /// from those of a running rank of its job (job id and uid) already
    /// held: one series per job and node shows one rank's. Exited ranks do
    /// not count: a job's next step on this node follows its last.
    fn check_scheduler(&self, identity: &Identity) {
        let job = Labels::new(identity).job;
        let Some(other) = self.ranks.values().find(|r| {
            r.exited_at.is_none()
                && r.labels.job == job
                && r.identity.scheduler != identity.scheduler
        }) else {
            return;
        };
        self.selfm.scheduler_conflict();
        eprintln!(
            "mpi-observer: rank {:?} of job {:?} (uid {}) has other scheduler facts ({:?}) than pid {} ({:?}); the job's lowest rank's are exported",
            identity.rank,
            identity.jobid,
            identity.uid,
            identity.scheduler.as_deref().map(|f| f.labels()),
            other.pid,
            other.identity.scheduler.as_deref().map(|f| f.labels()),
        );
    }

    fn attached_count(&self) -> usize {
        self.ranks
            .values()
            .filter(|r| r.attachment.is_some())
            .count()
    }

    /// Notices ranks that exited, detaching their probes; their figures stay.
    /// Returns the pids that just exited.
    pub fn notice_exits(&mut self) -> Vec<u32> {
        let mut exited = Vec::new();
        for r in self.ranks.values_mut() {
            if r.exited_at.is_some() {
                continue;
            }
            match procfs::liveness(r.pid, r.ticks) {
                procfs::Liveness::Alive => {}
                procfs::Liveness::Exited => {
                    r.exited_at = Some(Instant::now());
                    r.exited_wall = Some(SystemTime::now());
                    exited.push(r.pid);
                }
                // Out of descriptors or memory: nothing is known, and a
                // live rank must never be detached as exited. Counted, and
                // asked again at the next tick.
                procfs::Liveness::Unknown => self.selfm.proc_read_errors.inc(),
            }
        }
        // Room freed: that user's refused processes get another chance.
        let freed: std::collections::HashSet<u32> = exited
            .iter()
            .filter_map(|pid| self.ranks.get(pid).map(|r| r.uid))
            .collect();
        self.refused.retain(|_, uid| !freed.contains(uid));
        for pid in &exited {
            self.detach(*pid);
            if self.ranks.get(pid).is_some_and(|r| r.injected) {
                self.selfm.injected.dec();
            }
        }
        // Exited ranks' final figures, kept, and their map entries freed
        // now, not after --retain-exited (see `release_exited`); at most
        // once a second, as a collection holds the state a while.
        if self.probes.is_some()
            && self.last_release.elapsed() >= RELEASE_EVERY
            && self
                .ranks
                .values()
                .any(|r| r.exited_at.is_some() && !r.released)
        {
            self.last_release = Instant::now();
            self.collect();
        }
        exited
    }

    /// Folds `r`, the final figures of a rank about to be forgotten, into
    /// its job's [`DepartedJobs`], so the job's counters never fall.
    fn fold_departed(&mut self, r: &RankSnapshot) {
        let node = self.render.node();
        let held = |rank: &str| {
            self.ranks
                .values()
                .any(|h| h.labels.job == r.labels.job && h.identity.rank == rank)
        };
        self.departed.fold(r, held, node);
    }

    /// Frees the map entries of the exited ranks whose final figures
    /// [`State::collect`] has kept, and the budget they held: from then on
    /// a snapshot shows those kept figures. Without this, a user's many
    /// short jobs filled their map budget with ranks long gone, and their
    /// next ranks were refused for the whole of --retain-exited.
    fn release_exited(&mut self) {
        let done: Vec<u32> = self
            .ranks
            .values()
            .filter(|r| {
                r.exited_at.is_some() && !r.released && self.exited_figures.contains_key(&r.pid)
            })
            .map(|r| r.pid)
            .collect();
        for pid in done {
            if let Some(p) = self.probes.as_mut() {
                p.forget(pid);
            }
            if let Some(r) = self.ranks.get_mut(&pid) {
                r.released = true;
                r.reserved = Cost::default();
            }
        }
    }

    /// Forgets ranks that exited longer than `retain` ago, and the
    /// configuration of processes whose probes are all gone.
    ///
    /// A forgotten rank's final figures are folded into its job's
    /// [`DepartedJobs`] while other ranks of the job remain, so the job's
    /// counters never fall.
    pub fn expire(&mut self, retain: Duration) {
        let expired: Vec<u32> = self
            .ranks
            .values()
            .filter(|r| r.exited_at.is_some_and(|t| t.elapsed() >= retain))
            .map(|r| r.pid)
            .collect();
        if expired.is_empty() {
            return self.expire_rest();
        }
        if expired.iter().any(|p| !self.exited_figures.contains_key(p)) {
            // Exited and expired between two collections: read them now.
            self.collect();
        }
        for pid in &expired {
            if let Some(r) = self.exited_figures.remove(pid) {
                self.fold_departed(&r);
            }
        }
        for pid in expired {
            self.forget(pid);
        }
        let ranks = &self.ranks;
        self.departed
            .retain(|job| ranks.values().any(|r| r.labels.job == job));
        self.expire_rest();
    }

    /// The rest of [`State::expire`]: refusals of processes gone, and the
    /// probes' own leftovers.
    fn expire_rest(&mut self) {
        self.refused
            .retain(|(pid, ticks), _| procfs::liveness(*pid, *ticks) != procfs::Liveness::Exited);
        if let Some(p) = self.probes.as_mut() {
            p.reap();
        }
    }

    /// Ends the probes of a rank the shim was injected into, once the
    /// probes have no call of it open (docs/inject.md, "Handover"): what
    /// they counted stays in the map and the segment adds to it.
    pub fn hand_over_injected(&mut self, pid: u32) {
        self.detach(pid);
        if let Some(r) = self.ranks.get_mut(&pid) {
            r.injecting = false;
            // Held from now on, so the shim's figures are read even if the
            // rank exits before the next collection.
            if r.segment.is_none() {
                r.segment = Segment::open(pid).ok().flatten();
            }
            if !r.injected {
                r.injected = true;
                self.selfm.injected.inc();
            }
        }
    }

    /// Holds `seg` as rank `pid`'s segment (started at `ticks`) unless it
    /// has one: the shim's exit handover (crate::daemon::exit_handover).
    pub fn hold_segment(&mut self, pid: u32, ticks: u64, seg: Segment) {
        if let Some(r) = self.ranks.get_mut(&pid)
            && r.ticks == ticks
            && r.segment.is_none()
        {
            r.segment = Some(seg);
        }
    }

    /// The rank of `pid`, if attached.
    pub fn rank(&self, pid: u32) -> Option<&Rank> {
        self.ranks.get(&pid)
    }

    fn detach(&mut self, pid: u32) {
        if let Some(att) = self.ranks.get_mut(&pid).and_then(|r| r.attachment.take()) {
            self.selfm.probes.sub(att.probes as i64);
            if let Some(p) = self.probes.as_mut() {
                p.detach(pid, att);
            }
        }
        self.selfm.attached.set(self.attached_count() as i64);
    }

    /// Drops a rank and its statistics.
    pub fn forget(&mut self, pid: u32) {
        self.exited_figures.remove(&pid);
        self.detach(pid);
        if let Some(seg) = self.ranks.remove(&pid).and_then(|r| r.segment) {
            // A rank killed by a signal never unlinked its segment.
            seg.remove_if_orphaned(pid);
        }
        if let Some(p) = self.probes.as_mut() {
            p.forget(pid);
        }
    }

    /// Detaches everything (shutdown).
    pub fn detach_all(&mut self) {
        let pids: Vec<u32> = self.ranks.keys().copied().collect();
        for pid in pids {
            self.detach(pid);
        }
        if let Some(p) = self.probes.as_mut() {
            p.finish_detaching();
        }
    }

    /// Finds segments not found yet and reads every segment's figures.
    /// A segment that fails is skipped (its figures are dropped) and counted
    /// once per change of problem.
    ///
    /// A rank whose segment is ready loses its probes at that moment: the
    /// shim times every call of the process from its first (see
    /// `rank_calls`), so the probes would only count calls twice. A shim
    /// this daemon is injecting is handed over by the injector
    /// (docs/inject.md); one injected before it attached and still live is
    /// adopted: the probes go, and its timing stands for the rank.
    pub fn read_segments(&mut self) {
        let mut handover = Vec::new();
        let mut adopt = Vec::new();
        for r in self.ranks.values_mut() {
            if r.segment.is_none() && r.exited_at.is_none() {
                match Segment::open(r.pid) {
                    Ok(seg) => r.segment = seg,
                    Err(p) => {
                        if r.segment_problem != Some(p) {
                            self.selfm.segment_error(p);
                            r.segment_problem = Some(p);
                        }
                        continue;
                    }
                }
            }
            let Some(seg) = &r.segment else { continue };
            match seg.read() {
                Ok(f) => {
                    if f.ready && r.attachment.is_some() && !r.injecting {
                        if !f.injected {
                            handover.push(r.pid);
                        } else if !f.ejected && !r.injected {
                            adopt.push(r.pid);
                        }
                    }
                    r.figures = Some(f);
                    r.segment_problem = None;
                }
                Err(p) => {
                    r.figures = None;
                    if r.segment_problem != Some(p) {
                        self.selfm.segment_error(p);
                        r.segment_problem = Some(p);
                    }
                }
            }
        }
        for pid in handover {
            self.detach(pid);
        }
        for pid in adopt {
            eprintln!("mpi-observer: {}", adoption_line(pid));
            self.detach(pid);
            if let Some(r) = self.ranks.get_mut(&pid) {
                r.injected = true;
                r.adopted = true;
                self.selfm.injected.inc();
            }
        }
    }

    /// Marks `pid` as being injected into by this daemon, or no longer.
    pub fn set_injecting(&mut self, pid: u32, on: bool) {
        if let Some(r) = self.ranks.get_mut(&pid) {
            r.injecting = on;
        }
    }

    /// The ranks as they stand, with `calls` and `sites`, the call
    /// statistics and call sites read from the maps (those of processes not
    /// registered here are dropped: identity only ever comes from the
    /// registry), the daemon's `health`, and `now_ns`, `CLOCK_MONOTONIC`
    /// now, to age outstanding requests by. New call sites are named here.
    pub fn snapshot(
        &mut self,
        mut calls: BTreeMap<u32, CallsByFunction>,
        mut sites: BTreeMap<u32, Vec<RawSite>>,
        health: Health,
        now_ns: u64,
    ) -> Snapshot {
        let mut names = self.names.session();
        let budget = self.callsite_budget;
        let bytes = self.bytes;
        let kept = &mut self.exited_figures;
        let ranks = self
            .ranks
            .values_mut()
            .map(|r| {
                let who = Who {
                    pid: r.pid,
                    uid: r.uid,
                    alive: r.exited_at.is_none(),
                };
                // Gone from the maps: its final figures as kept, with the
                // names of its sites made since.
                if r.released
                    && let Some(k) = kept.get_mut(&r.pid)
                {
                    if k.callsites.iter().any(|s| s.pending) {
                        k.callsites = r.sites.resolve(&mut names, who, &r.exited_sites, budget);
                    }
                    if !k.callsites.iter().any(|s| s.pending) {
                        r.exited_sites = Vec::new();
                    }
                    return k.clone();
                }
                let add = r.figures.as_ref().is_some_and(|f| f.injected) && !r.adopted;
                let raw = rank_sites(sites.remove(&r.pid), r.figures.as_ref(), add);
                let callsites = r.sites.resolve(&mut names, who, &raw, budget);
                if r.exited_at.is_some() {
                    r.exited_sites = raw;
                }
                RankSnapshot {
                    pid: r.pid,
                    identity: r.identity.clone(),
                    labels: r.labels.clone(),
                    library: r.library,
                    version: r.version.clone(),
                    started: r.started_at,
                    attached: r.attached_at,
                    counted_since: r.counted_since(),
                    exited: r.exited_wall,
                    calls: rank_calls(calls.remove(&r.pid), r.figures.as_ref(), add, bytes),
                    callsites,
                    segment: r.figures.as_ref().map(|f| SegmentSnapshot {
                        figures: f.clone(),
                        // Zero for a rank that exited.
                        oldest_request_age: match (f.oldest_started_ns, r.exited_at) {
                            (Some(t), None) => Duration::from_nanos(now_ns.saturating_sub(t)),
                            _ => Duration::ZERO,
                        },
                    }),
                }
            })
            .collect();
        Snapshot {
            ranks,
            health,
            taken: SystemTime::now(),
        }
    }

    /// Reads the stats segments and the maps, now.
    pub fn collect(&mut self) -> Snapshot {
        self.read_segments();
        // Call sites before the statistics: a call adds to its function's
        // figures first, so the sites never exceed the function's calls.
        let (sites, calls, map_failures) = self
            .probes
            .as_ref()
            .map(|p| {
                let sites = p.read_callsites();
                let mut failures = p.read_map_failures();
                failures.callsites = p.read_callsite_failures();
                (sites, p.read_stats(), failures)
            })
            .unwrap_or_default();
        let health = Health {
            map_failures,
            scrapes_total: scrapes_total(),
        };
        let snap = self.snapshot(calls, sites, health, crate::os::clock::monotonic_ns());
        for r in snap.ranks.iter().filter(|r| r.exited.is_some()) {
            self.exited_figures
                .entry(r.pid)
                .or_insert_with(|| r.clone());
        }
        self.release_exited();
        snap
    }

    /// The ranks' report data now (`/report.json`, `attach --report-file`).
    pub fn report_data(&mut self) -> crate::export::report::Data {
        let snap = self.collect();
        crate::export::report::Data::from_snapshot(&snap, &self.host, SystemTime::now())
    }

    /// [`State::report_data`] as JSON.
    pub fn report_json(&mut self) -> Vec<u8> {
        serde_json::to_vec(&self.report_data()).unwrap_or_default()
    }

    /// One scrape's exposition text (`/metrics`); the detail ranks and
    /// the window's samples are updated with it.
    pub fn scrape(&mut self) -> String {
        let started = Instant::now();
        let snap = self.collect();
        let detail = self.picker.update(&snap, self.render.detail_ranks);
        let recent = self.window.update(&snap);
        let carried = Carried {
            detail: &detail,
            recent: &recent,
            departed: &self.departed,
        };
        metrics::render_metrics(&snap, &self.selfm, self.render, carried, || {
            started.elapsed()
        })
    }

    /// The full per-rank series of the jobs named (`/metrics/ranks`; every
    /// job with `None`).
    pub fn scrape_ranks(&mut self, jobids: Option<&[String]>) -> String {
        let snap = self.collect();
        metrics::render_ranks(&snap, &self.selfm, self.render, jobids)
    }

    /// Whether any rank is still running.
    pub fn any_running(&self) -> bool {
        self.ranks.values().any(|r| r.exited_at.is_none())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::collect::snapshot::STEP_SUFFIX_CAP;
    use crate::{
        attach::identity::scheduler::{Facts, Scheduler},
        export::metrics::RenderOptions,
    };

    fn of_step(pid: u32, rank: u32, step: Option<&str>) -> Rank {
        let mut r = Rank::synthetic(pid, rank, "27");
        r.identity.scheduler = step.map(|s| {
            let mut f = Facts::bare(Scheduler::Slurm);
            f.step = s.into();
            Arc::new(f)
        });
        r
    }

    fn rank_label(st: &State, pid: u32) -> String {
        let l = &st.ranks[&pid].labels.rank;
        l.rsplit_once("rank=\"")
            .unwrap()
            .1
            .trim_end_matches('"')
            .into()
    }

    #[test]
    fn an_attach_error_of_a_rank_gone_or_a_zombie_is_its_exit() {
        use crate::attach::multi::MultiError;
        use procfs::{Liveness, ProcError, Stat};
        let link = || {
            AttachError::Probe(crate::attach::probes::ProbeError::Attach {
                pid: 41,
                source: MultiError::Link {
                    program: "mpi_enter",
                    path: "/proc/41/root/usr/lib/libmpi.so.40".into(),
                    source: std::io::Error::from_raw_os_error(libc::ENOENT),
                },
            })
        };
        let stat = |state| {
            Ok(Stat {
                state,
                ppid: 1,
                start_ticks: 7,
            })
        };
        let gone = Err(ProcError::NoSuchProcess { pid: 41 });
        let unreadable = Err(ProcError::Unreadable {
            pid: 41,
            file: "stat",
            source: std::io::Error::from_raw_os_error(libc::EMFILE),
        });
        // Gone, a zombie, dead, or the pid now someone else's: its exit.
        for (s, ticks) in [
            (&gone, 7),
            (&stat('Z'), 7),
            (&stat('X'), 7),
            (&stat('R'), 8),
        ] {
            let e = link().or_exited(41, Liveness::of(s, ticks));
            assert!(matches!(e, AttachError::Exited { pid: 41 }), "{s:?}: {e}");
            assert_eq!(e.to_string(), "rank 41 exited before its probes were in");
        }
        // Running, or /proc unreadable: the failure stays one.
        for s in [&stat('R'), &stat('S'), &stat('D'), &unreadable] {
            let e = link().or_exited(41, Liveness::of(s, 7));
            assert!(e.to_string().contains("uprobe_multi"), "{s:?}: {e}");
        }
        // A budget's refusal is a decision, not a failure, whatever became
        // of the process.
        let refused = AttachError::Refused {
            pid: 41,
            uid: 1000,
            budget: Budget::Processes,
        };
        assert!(matches!(
            refused.or_exited(41, Liveness::Exited),
            AttachError::Refused { .. }
        ));
    }

    #[test]
    fn a_jobs_next_step_is_labelled_by_its_step_not_as_a_conflict() {
        let mut st = State::new(None, Vec::new(), true, RenderOptions::default());
        st.register(of_step(10, 0, Some("0")));
        st.register(of_step(11, 1, Some("0")));
        // Step 1's ranks while step 0's are held (running or retained).
        st.register(of_step(20, 0, Some("1")));
        st.register(of_step(21, 1, Some("1")));
        st.register(of_step(30, 0, Some("2")));
        assert_eq!(rank_label(&st, 10), "0");
        assert_eq!(rank_label(&st, 11), "1");
        assert_eq!(rank_label(&st, 20), "0#step1");
        assert_eq!(rank_label(&st, 21), "1#step1");
        assert_eq!(rank_label(&st, 30), "0#step2");
        assert_eq!(st.selfm.identity_conflicts.get(), 0);
        // Two processes claiming one rank of one step are a conflict.
        st.register(of_step(40, 0, Some("1")));
        assert_eq!(rank_label(&st, 40), "0#pid40");
        // As is a rank with no step (a batch script's) after one with.
        st.register(of_step(50, 1, None));
        assert_eq!(rank_label(&st, 50), "1#pid50");
        assert_eq!(st.selfm.identity_conflicts.get(), 2);
    }

    #[test]
    fn a_rank_released_before_its_call_sites_are_named_gets_them_named() {
        use crate::collect::{
            callsites::NamesConfig,
            snapshot::{Figures, RawSite},
        };
        let mut st = State::new(None, Vec::new(), true, RenderOptions::default());
        // No wait: the first collection cannot have the name yet.
        st.names = Names::with_config(NamesConfig {
            wait: Duration::ZERO,
            limits: crate::attach::symbolizer::Limits {
                deadline: Duration::from_secs(30),
                ..Default::default()
            },
            program: Some(crate::attach::symbolizer::tests::child_program()),
            ..NamesConfig::default()
        });
        let pid = std::process::id();
        let mut r = Rank::synthetic(pid, 0, "34");
        r.sites.prime(pid);
        let addr =
            a_rank_released_before_its_call_sites_are_named_gets_them_named as *const () as u64;
        r.figures = Some(Figures {
            ready: true,
            callsites: vec![RawSite {
                function: 1,
                addr: addr + 1,
                calls: 3,
                time_ns: 5,
            }],
            ..Figures::default()
        });
        r.exited_at = Some(Instant::now());
        r.exited_wall = Some(SystemTime::now());
        st.register(r);
        let first = st.collect();
        assert!(first.ranks[0].callsites[0].pending, "{first:?}");
        assert!(st.ranks[&pid].released, "its final figures are kept");
        let start = Instant::now();
        let site = loop {
            let s = st.collect();
            let site = s.ranks[0].callsites[0].clone();
            if !site.pending {
                break site;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "never named");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            site.name
                .contains("a_rank_released_before_its_call_sites_are_named"),
            "{site:?}"
        );
        assert!(site.exported && site.calls == 3, "{site:?}");
        assert!(st.ranks[&pid].exited_sites.is_empty(), "kept no longer");
    }

    #[test]
    fn a_step_label_is_only_made_of_a_short_plain_step() {
        let mut st = State::new(None, Vec::new(), true, RenderOptions::default());
        st.register(of_step(10, 0, Some("0")));
        st.register(of_step(20, 0, Some("x\"y")));
        st.register(of_step(30, 0, Some(&"9".repeat(STEP_SUFFIX_CAP + 1))));
        assert_eq!(rank_label(&st, 20), "0#pid20");
        assert_eq!(rank_label(&st, 30), "0#pid30");
    }
}
