//! Loading the eBPF programs once and attaching them to ranks: one uprobe and
//! one uretprobe per unique PMPI function address, by the mechanism the
//! kernel allows (`crate::attach::kernel`, `crate::attach::links`): a
//! handful of uprobe_multi links per process, or classic uprobes, per
//! process (`--pid`) or once per library file for every rank that maps it
//! (`--all`, [`shared`]); and reading back the maps they fill ([`read`]).

mod closer;
mod detach;
mod error;
mod handover;
mod read;
mod shared;

pub use handover::{Adoption, LAYOUT_VERSION};

use std::{
    collections::{BTreeMap, HashMap},
    os::fd::OwnedFd,
    path::Path,
    sync::{Arc, atomic::AtomicBool},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{HashMap as BpfHashMap, MapData},
};
use observer_common::{
    FUNCTIONS, cookie,
    functions::Family,
    maps::{self, CallStats, Inflight, ProcConfig, SiteCount, TypeKey},
};

use crate::{
    attach::kernel::Choice,
    attach::links::{self, LinkError, Mechanism, Target},
    attach::symbols::Library,
    os::procfs::{self, MappedLib, PidNamespace},
};

use self::{closer::Closer, shared::FileKey};

/// One process's call statistics from the maps: function ID to its figures,
/// summed over CPUs.
pub type CallsByFunction = BTreeMap<u16, CallStats>;

/// One call site's raw figures, as the probes (`attach --callsites`) or the
/// shim's `stats` layer captured them: the application's return address in
/// the process and the calls made from there to one MPI function (the
/// outermost call on the thread, as everywhere else). Symbolized by
/// `crate::collect::callsites`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct RawSite {
    /// MPI function ID.
    pub function: u16,
    /// Return address in the process (the instruction after the call).
    pub addr: u64,
    /// Calls completed from there.
    pub calls: u64,
    /// Their total time in nanoseconds.
    pub time_ns: u64,
}

/// In-kernel map updates that failed (the map was full), summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapFailures {
    /// A statistics entry could not be created.
    pub stats: u64,
    /// An in-flight entry could not be created.
    pub inflight: u64,
    /// A call-site entry could not be created (`attach --callsites`): the
    /// call is counted, its site lands in `callsite="other"`.
    pub callsites: u64,
    /// A call whose function was told by address hit an address the
    /// by-address table did not hold: not counted.
    pub site_cookies: u64,
}

/// The entry program for each family, by name in the eBPF object.
const ENTER_PLAIN: &str = "mpi_enter";
const ENTER_P2P: &str = "mpi_p2p_enter";
const ENTER_COLL: &str = "mpi_coll_enter";
const RETURN: &str = "mpi_return";
const PROGRAMS: [&str; 4] = [ENTER_PLAIN, ENTER_P2P, ENTER_COLL, RETURN];

pub use error::ProbeError;

/// Threads closing probes at once: enough for the parts of their grace
/// periods outside the kernel's locks to overlap (see [`closer`]), few
/// enough to leave forks room.
const CLOSERS: usize = 8;

/// The probes attached to one process.
#[derive(Debug, Default)]
pub struct Attachment {
    links: Vec<OwnedFd>,
    /// Uprobe plus uretprobe sites attached.
    pub probes: usize,
    /// Predefined datatype entries loaded for this process.
    type_keys: Vec<TypeKey>,
    /// When its probes went in, if before this daemon started (adopted at
    /// a planned restart): its figures count from then.
    pub since: Option<std::time::SystemTime>,
    /// Predefined datatypes of this process not loaded: beyond
    /// [`maps::OMPI_TYPES_PER_PROCESS`], or the map was full. Their calls
    /// count with unknown bytes.
    pub types_dropped: usize,
    /// The library file whose probes for every process this one shares
    /// (`--all` on classic uprobes): it holds no links of its own.
    file: Option<FileKey>,
    /// The library file whose entries of [`maps::SITE_COOKIES`] its
    /// configuration names (functions told by address).
    slot: Option<FileKey>,
}

/// A detach in progress: the process whose configuration leaves
/// `MPI_PROCS` once its probes are closed (`None` once it is attached
/// again, or for a library's shared probes), the by-address slot it
/// releases then, and the flag the closer sets.
struct Closing {
    pid: Option<u32>,
    slot: Option<FileKey>,
    done: Arc<AtomicBool>,
}

/// The loaded eBPF object: maps (created by aya) and programs.
pub struct Probes {
    ebpf: Ebpf,
    progs: HashMap<&'static str, OwnedFd>,
    /// How programs go on sites.
    mechanism: Box<dyn Mechanism>,
    /// `attach --all` on a mechanism that probes each library file once
    /// for every process mapping it ([`Mechanism::per_file`]).
    per_file: bool,
    /// The library files probed that way, and the slots of
    /// [`maps::SITE_COOKIES`] (see [`shared`]).
    shared: shared::Files,
    /// Probes being closed in the background.
    closing: Vec<Closing>,
    /// The threads that close links (see [`Closer`]).
    closer: Closer,
    /// Every process attached records its call sites (`attach
    /// --callsites`): set at load time, which sizes the call-site map.
    callsites: bool,
    /// Entries of `MPI_STATS` and `MPI_CALLSITES` as loaded.
    stats_capacity: u32,
    callsites_capacity: u32,
    /// Statistics go to the per-CPU map (`cargo xtask bench kmaps` only).
    percpu_stats: bool,
    /// Predefined datatypes not loaded, over every attach so far.
    types_dropped: u64,
    /// The hash of the maps' layout (see [`handover`]): a daemon adopts
    /// another's pinned maps only if theirs is the same.
    layout: u64,
    /// Links an earlier daemon pinned for a planned restart, by pid, not
    /// yet claimed by [`Probes::attach`].
    adopted: HashMap<u32, handover::Pinned>,
    /// The daemon's pid namespace, `None` for the initial one: set, the
    /// programs name tasks by their pids in it and count no other task.
    pidns: Option<PidNamespace>,
}

/// What to load the programs with.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Kernel memory for the statistics map ([`maps::stats_capacity_within`]).
    pub stats_budget: u64,
    /// Every process attached records its call sites (`attach
    /// --callsites`), which sizes the call-site map.
    pub callsites: bool,
    /// Bytes of the trace ring (`record`).
    pub trace_bytes: u32,
    /// `attach --all`: where the mechanism costs per site
    /// ([`Mechanism::per_file`]), each library file is probed once for
    /// every process that maps it, and ranks are told apart in the
    /// programs by their configuration.
    pub all: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            stats_budget: maps::STATS_MEMORY_BUDGET,
            callsites: false,
            trace_bytes: maps::TRACE_BYTES,
            all: false,
        }
    }
}

/// The maps given a size at load (name, max entries), and whether
/// statistics go to the per-CPU map ([`BENCH_PERCPU_STATS`]).
fn map_sizes(opts: &LoadOptions, by_address: bool) -> ([(&'static str, u32); 5], bool) {
    let capacity = maps::stats_capacity_within(opts.stats_budget);
    let site_capacity = if opts.callsites {
        maps::CALLSITES_CAPACITY
    } else {
        1
    };
    let percpu_stats = std::env::var_os(BENCH_PERCPU_STATS).is_some_and(|v| v == "1");
    // Only the map written gets the capacity; the other keeps one entry.
    let (shared, percpu) = if percpu_stats {
        (1, capacity)
    } else {
        (capacity, 1)
    };
    let cookies = if by_address {
        maps::SITE_COOKIES_CAPACITY
    } else {
        1
    };
    (
        [
            (maps::STATS, shared),
            (maps::STATS_PERCPU, percpu),
            (maps::CALLSITES, site_capacity),
            (
                maps::TRACE,
                crate::os::sys::ring_bytes(opts.trace_bytes, crate::os::sys::page_size()),
            ),
            (maps::SITE_COOKIES, cookies),
        ],
        percpu_stats,
    )
}

/// What, besides the maps, must match for a daemon to adopt another's
/// pins: the mechanism, whether libraries are probed per file, and how
/// functions are told (see [`handover::layout`]).
fn variant(mechanism: &dyn Mechanism, per_file: bool) -> String {
    format!(
        "{}/{}/{}",
        mechanism.name(),
        if per_file { "file" } else { "process" },
        if mechanism.cookies() {
            "cookie"
        } else {
            "address"
        }
    )
}

/// Environment variable that makes the probes keep their statistics in the
/// per-CPU map the shared one replaced: only for `cargo xtask bench kmaps`,
/// which compares the two designs in one run.
pub const BENCH_PERCPU_STATS: &str = "MPI_OBSERVER_BENCH_PERCPU_STATS";

/// The daemon's pid namespace, for the programs' [`maps::PIDNS_DEV`] and
/// [`maps::PIDNS_INO`]; `None` for the initial one.
fn pid_namespace() -> Result<Option<PidNamespace>, ProbeError> {
    procfs::own_pid_namespace().map_err(|source| ProbeError::PidNamespace { source })
}

/// The mechanism this kernel allows (`crate::attach::kernel`), for the
/// loaders that do not choose one themselves.
fn detect() -> Result<Choice, ProbeError> {
    crate::attach::kernel::detect()
        .1
        .map_err(|source| ProbeError::Kernel { source })
}

impl Probes {
    /// Loads the embedded eBPF object with the default options, by the
    /// mechanism the kernel allows; see [`Probes::load_chosen`].
    pub fn load(object: &[u8]) -> Result<Self, ProbeError> {
        Self::load_chosen(object, LoadOptions::default(), detect()?)
    }

    /// [`Probes::load`] with a statistics budget and call sites.
    pub fn load_within(
        object: &[u8],
        stats_budget: u64,
        callsites: bool,
    ) -> Result<Self, ProbeError> {
        let opts = LoadOptions {
            stats_budget,
            callsites,
            ..LoadOptions::default()
        };
        Self::load_chosen(object, opts, detect()?)
    }

    /// Loads the object for `mpi-observer record`: the default statistics
    /// budget, and a trace ring of `trace_bytes` (a power-of-two number of
    /// pages) that processes attached with [`ProcConfig::trace`] send
    /// their completed calls to; read it with [`Probes::take_trace`].
    pub fn load_tracing(object: &[u8], trace_bytes: u32) -> Result<Self, ProbeError> {
        let opts = LoadOptions {
            trace_bytes,
            ..LoadOptions::default()
        };
        Self::load_chosen(object, opts, detect()?)
    }

    /// Loads the embedded eBPF object: creates its maps and loads its
    /// programs into the kernel for `choice`'s mechanism. The statistics
    /// map, shared by the CPUs, gets as many entries as fit in
    /// `opts.stats_budget` bytes ([`maps::stats_capacity_within`], the same
    /// on any number of CPUs); calls of a (process, function) that finds it
    /// full are counted in `mpi_observer_map_update_failures_total`.
    ///
    /// With `opts.callsites`, every process attached also records its call
    /// sites ([`ProcConfig::callsites`], read back by
    /// [`Probes::read_callsites`]) in a map of [`maps::CALLSITES_CAPACITY`]
    /// entries; without, that map is left at one entry, so it costs no
    /// memory.
    pub fn load_chosen(
        object: &[u8],
        opts: LoadOptions,
        choice: Choice,
    ) -> Result<Self, ProbeError> {
        Self::load_with(object, opts, choice.mechanism, None)
    }

    /// Loads the object with its maps sized; with `pinned` (map name, pin
    /// path), those maps are the pinned ones (a handover whose layout is
    /// ours, see [`handover`]) instead of new ones.
    fn load_with(
        object: &[u8],
        opts: LoadOptions,
        mechanism: Box<dyn Mechanism>,
        pinned: Option<&[(String, std::path::PathBuf)]>,
    ) -> Result<Self, ProbeError> {
        let by_address = !mechanism.cookies();
        let per_file = opts.all && mechanism.per_file();
        let (sizes, percpu_stats) = map_sizes(&opts, by_address);
        let (capacity, site_capacity) =
            (maps::stats_capacity_within(opts.stats_budget), sizes[2].1);
        let percpu_flag = u32::from(percpu_stats);
        let pidns = pid_namespace()?;
        let (layout, _) = handover::layout(
            object,
            &sizes,
            percpu_stats,
            pidns,
            &variant(&*mechanism, per_file),
        )
        .map_err(|source| ProbeError::Layout { source })?;
        let mut loader = EbpfLoader::new();
        loader.override_global(maps::PERCPU_STATS, &percpu_flag, true);
        // 0 on the host: the programs keep bpf_get_current_pid_tgid.
        let (ns_dev, ns_ino) = pidns.map_or((0, 0), |n| (n.dev, n.ino));
        loader.override_global(maps::PIDNS_DEV, &ns_dev, true);
        loader.override_global(maps::PIDNS_INO, &ns_ino, true);
        // 0 with cookies: the programs keep the cookie helper, and the
        // verifier drops the lookup by address (and, at 1, the reverse:
        // kernels before 5.15 have no such helper).
        let by_address_flag = u32::from(by_address);
        loader.override_global(maps::FUNC_BY_ADDRESS, &by_address_flag, true);
        for (name, size) in sizes {
            loader.map_max_entries(name, size);
        }
        for (name, path) in pinned.unwrap_or_default() {
            loader.map_pin_path(name.as_str(), path.as_path());
        }
        let ebpf = loader.load(object).map_err(|e| ProbeError::Object {
            source: Box::new(e),
        })?;
        let progs = links::load_programs(object, &ebpf, &PROGRAMS, mechanism.attach_type())
            .map_err(|source| {
                if let (Some(_), LinkError::Load { log, .. }) =
                    (std::env::var_os("MPI_OBSERVER_VERIFIER_LOG"), &source)
                {
                    eprintln!("{log}");
                }
                ProbeError::Programs {
                    mechanism: mechanism.name(),
                    source,
                }
            })?;
        Ok(Self {
            ebpf,
            progs,
            mechanism,
            per_file,
            shared: shared::Files::default(),
            closing: Vec::new(),
            closer: Closer::start(CLOSERS),
            callsites: opts.callsites,
            stats_capacity: capacity,
            callsites_capacity: site_capacity,
            percpu_stats,
            types_dropped: 0,
            layout,
            adopted: HashMap::new(),
            pidns,
        })
    }

    /// The attach mechanism the programs were loaded for.
    pub fn mechanism(&self) -> &dyn Mechanism {
        &*self.mechanism
    }

    /// Whether each library file is probed once for all its ranks.
    pub fn per_file(&self) -> bool {
        self.per_file
    }

    /// The daemon's pid namespace if it is not the initial one: the probes
    /// then count only the processes of that namespace.
    pub fn pid_namespace(&self) -> Option<PidNamespace> {
        self.pidns
    }

    /// Entries of the statistics map: (process, function) pairs it holds.
    /// A process creates at most one per function it is attached with, so
    /// the daemon can reserve a process's share at attach.
    pub fn stats_capacity(&self) -> u32 {
        self.stats_capacity
    }

    /// Entries of the call-site map (1 without call sites); a process
    /// creates at most its [`ProcConfig::max_sites`].
    pub fn callsites_capacity(&self) -> u32 {
        self.callsites_capacity
    }

    /// Processes that can be attached at once (entries of `MPI_PROCS`): an
    /// attach beyond it fails.
    pub fn procs_capacity(&self) -> u32 {
        maps::PROCS_CAPACITY
    }

    /// Entries of the Open MPI datatype map; a process gets at most
    /// [`maps::OMPI_TYPES_PER_PROCESS`].
    pub fn types_capacity(&self) -> u32 {
        maps::OMPI_TYPES_CAPACITY
    }

    /// Predefined datatypes not loaded over every attach so far (see
    /// [`Attachment::types_dropped`] for one process's).
    pub fn types_dropped(&self) -> u64 {
        self.types_dropped
    }

    /// Whether attached processes record their call sites (`attach
    /// --callsites`, [`Probes::load_within`]).
    pub fn callsites(&self) -> bool {
        self.callsites
    }

    /// The call statistics of every process in the maps, summed over CPUs.
    pub fn read_stats(&self) -> BTreeMap<u32, CallsByFunction> {
        if self.percpu_stats {
            return read::stats_percpu(&self.ebpf);
        }
        read::stats(&self.ebpf)
    }

    /// The call sites of every process in the maps (pid to its sites, in
    /// no particular order), per-CPU figures summed. Empty unless loaded
    /// with call sites. Read it before [`Probes::read_stats`]: the probes
    /// add a call to its function before its site, so the sites then never
    /// exceed their function's calls.
    pub fn read_callsites(&self) -> BTreeMap<u32, Vec<RawSite>> {
        if !self.callsites {
            return BTreeMap::new();
        }
        read::callsites(&self.ebpf)
    }

    /// The in-kernel map update failures so far, summed over CPUs.
    pub fn read_map_failures(&self) -> MapFailures {
        read::map_failures(&self.ebpf)
    }

    /// Calls whose call site could not be recorded because `MPI_CALLSITES`
    /// was full (they are still counted in the statistics), summed over
    /// CPUs.
    pub fn read_callsite_failures(&self) -> u64 {
        read::error_counter(&self.ebpf, maps::ErrorCounter::CallsiteUpdate)
    }

    /// Per process, the call-site entries it created and the calls whose
    /// site was refused because it was at its [`ProcConfig::max_sites`]
    /// (those calls are still counted in the statistics). Kept until
    /// [`Probes::forget`]. Empty unless loaded with call sites.
    pub fn read_site_counts(&self) -> BTreeMap<u32, SiteCount> {
        if !self.callsites {
            return BTreeMap::new();
        }
        read::site_counts(&self.ebpf)
    }

    /// Per process, the calls whose site was refused at its
    /// [`ProcConfig::max_sites`] ([`Probes::read_site_counts`]'s `refused`).
    pub fn read_site_refusals(&self) -> BTreeMap<u32, u64> {
        self.read_site_counts()
            .into_iter()
            .map(|(pid, c)| (pid, c.refused))
            .collect()
    }

    /// The ring of traced calls ([`maps::TraceCall`] records), taken out of
    /// the object; once only.
    pub fn take_trace(&mut self) -> Result<aya::maps::RingBuf<aya::maps::MapData>, ProbeError> {
        let map = self.ebpf.take_map(maps::TRACE).ok_or(ProbeError::Map {
            map: maps::TRACE,
            source: aya::maps::MapError::InvalidName {
                name: maps::TRACE.into(),
            },
        })?;
        aya::maps::RingBuf::try_from(map).map_err(|source| ProbeError::Map {
            map: maps::TRACE,
            source,
        })
    }

    /// Starts the program on `sched/sched_process_exec` (a raw tracepoint:
    /// no tracefs needed) and takes its ring
    /// of exec'd pids and its per-CPU drop count out of the object, for
    /// `attach --all`'s exec watcher (crate::os::procevents). The program
    /// lives as long as the object.
    pub fn exec_events(
        &mut self,
    ) -> Result<
        (
            aya::maps::RingBuf<MapData>,
            aya::maps::PerCpuArray<MapData, u64>,
        ),
        ProbeError,
    > {
        fn failed(e: impl std::error::Error + Send + Sync + 'static) -> ProbeError {
            ProbeError::ExecEvents {
                program: maps::EXEC_PROGRAM,
                source: Box::new(e),
            }
        }
        let prog: &mut aya::programs::RawTracePoint = self
            .ebpf
            .program_mut(maps::EXEC_PROGRAM)
            .ok_or_else(|| failed(aya::programs::ProgramError::UnexpectedProgramType))?
            .try_into()
            .map_err(failed)?;
        prog.load().map_err(failed)?;
        prog.attach("sched_process_exec").map_err(failed)?;
        let take = |ebpf: &mut Ebpf, name: &'static str| {
            ebpf.take_map(name).ok_or(ProbeError::Map {
                map: name,
                source: aya::maps::MapError::InvalidName { name: name.into() },
            })
        };
        let ring =
            aya::maps::RingBuf::try_from(take(&mut self.ebpf, maps::EXECS)?).map_err(|source| {
                ProbeError::Map {
                    map: maps::EXECS,
                    source,
                }
            })?;
        let drops = aya::maps::PerCpuArray::try_from(take(&mut self.ebpf, maps::EXEC_DROPS)?)
            .map_err(|source| ProbeError::Map {
                map: maps::EXEC_DROPS,
                source,
            })?;
        Ok((ring, drops))
    }

    /// Traced calls lost because the trace ring was full, summed over CPUs.
    pub fn read_trace_dropped(&self) -> u64 {
        read::error_counter(&self.ebpf, maps::ErrorCounter::TraceDropped)
    }

    /// Mutable access to the maps (benchmarks fill them with synthetic
    /// figures).
    pub fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    /// Attaches to `functions` (IDs) of `lib` in process `pid`, which maps
    /// it as `map` (reached at `lib_path`). Return probes go in before entry
    /// probes, so no call can be entered without its return being seen; on
    /// failure everything attached so far is removed. With probes per
    /// library file ([`Probes::per_file`]), a file already probed for
    /// another rank attaches nothing: the rank's configuration makes the
    /// programs count it. The process records its call sites if the probes
    /// were loaded with them, whatever `config` says, at most
    /// `config.max_sites` of them. At most [`maps::OMPI_TYPES_PER_PROCESS`]
    /// of `datatypes` are loaded ([`Attachment::types_dropped`] counts the
    /// rest).
    #[expect(clippy::too_many_arguments, reason = "one rank's attach, spelt out")]
    pub fn attach(
        &mut self,
        pid: u32,
        lib_path: &Path,
        map: &MappedLib,
        lib: &Library,
        mut config: ProcConfig,
        datatypes: &BTreeMap<u64, u64>,
        functions: &[u16],
    ) -> Result<Attachment, ProbeError> {
        if let Some(att) = self.claim(pid, map) {
            return Ok(att);
        }
        // A process the programs cannot see (a nested pid namespace's)
        // would be attached and count nothing: refused, so it is counted.
        // One gone meanwhile fails below as before.
        if let Some(ns) = self.pidns
            && procfs::pid_namespace_ino(pid).is_ok_and(|ino| ino != ns.ino)
        {
            return Err(ProbeError::ForeignNamespace { pid });
        }
        // An earlier detach of this pid must not remove the new config.
        for c in &mut self.closing {
            if c.pid == Some(pid) {
                c.pid = None;
            }
        }
        config.callsites = u32::from(self.callsites);
        let sites = sites(lib, functions, config.bytes != 0);
        let file = FileKey::of(map);
        let mut att = Attachment::default();
        if !self.mechanism.cookies() {
            // Before any probe can fire for it: a configured process whose
            // site is missing from the table would lose the call.
            let bias = text_bias(map, &sites).ok_or(ProbeError::NoText { pid })?;
            config.lib_slot = self.take_slot(pid, file, &sites)?;
            config.text_bias = bias;
            att.slot = Some(file);
        }
        let shared = self.per_file && self.shared.is_probed(file);
        // Links going live one after another (return, then each family's
        // entries) while a running rank makes calls: until the last one is
        // live, the programs record no new call (as after an injection's
        // handover), so every function starts counting at the same
        // instant, the one the flag is cleared below. A file's shared
        // probes are all live already.
        let counting = config;
        if !shared {
            config.handed_over = 1;
        }
        let inserted = BpfHashMap::<&mut MapData, u32, ProcConfig>::try_from(
            self.ebpf.map_mut(maps::PROCS).expect("PROCS map in object"),
        )
        .and_then(|mut procs| procs.insert(pid, config, 0));
        if let Err(source) = inserted {
            self.detach(pid, att);
            return Err(ProbeError::Map {
                map: maps::PROCS,
                source,
            });
        }
        if let Err(e) = self.insert_types(pid, datatypes, &mut att) {
            self.detach(pid, att);
            return Err(e);
        }
        if self.callsites {
            // The probes only add to this entry; kept if a previous process
            // of this pid's sites are still in the map (until forget).
            // Failing (map full) leaves the process without sites, each
            // call counted in the call-site failures.
            if let Some(Ok(mut counts)) = self
                .ebpf
                .map_mut(maps::SITE_COUNTS)
                .map(BpfHashMap::<&mut MapData, u32, SiteCount>::try_from)
            {
                let _ = counts.insert(
                    pid,
                    SiteCount::default(),
                    u64::from(aya_obj::generated::BPF_NOEXIST),
                );
            }
        }
        if self.per_file {
            if !shared {
                let mut links = Vec::new();
                match self.attach_sites(&sites, lib_path, Target::File, &mut links) {
                    Ok(probes) => {
                        // The file's probes hold a slot of their own.
                        if !self.mechanism.cookies() {
                            let _ = self.take_slot(pid, file, &sites);
                        }
                        self.shared.add(file, links, probes);
                    }
                    Err(source) => {
                        att.links = links;
                        self.detach(pid, att);
                        return Err(ProbeError::AttachFile {
                            path: lib_path.display().to_string(),
                            source,
                        });
                    }
                }
            }
            att.probes = self.shared.join(file, pid);
            att.file = Some(file);
        } else {
            let mut links = Vec::new();
            let r = self.attach_sites(&sites, lib_path, Target::Process(pid), &mut links);
            att.links = links;
            match r {
                Ok(n) => att.probes = n,
                Err(source) => {
                    self.detach(pid, att);
                    return Err(ProbeError::Attach { pid, source });
                }
            }
        }
        if config.handed_over != counting.handed_over
            && let Err(e) = self.update_config(pid, |c| c.handed_over = counting.handed_over)
        {
            self.detach(pid, att);
            return Err(e);
        }
        Ok(att)
    }

    /// Attaches every program to its sites of the file at `path` for
    /// `target`, returns first (see [`Probes::attach`]), into `links`;
    /// returns the sites attached. On error, `links` holds what was
    /// attached before it.
    fn attach_sites(
        &self,
        sites: &shared::Sites,
        path: &Path,
        target: Target,
        links: &mut Vec<OwnedFd>,
    ) -> Result<usize, LinkError> {
        let mut n = 0;
        for prog in [RETURN, ENTER_PLAIN, ENTER_P2P, ENTER_COLL] {
            let Some((offs, cookies)) = sites.get(prog) else {
                continue;
            };
            let fds = self.mechanism.attach(
                prog,
                &self.progs[prog],
                path,
                offs,
                cookies,
                target,
                prog == RETURN,
            )?;
            links.extend(fds);
            n += offs.len();
        }
        Ok(n)
    }

    /// `file`'s slot of the by-address table for process `pid`.
    fn take_slot(
        &mut self,
        pid: u32,
        file: FileKey,
        sites: &shared::Sites,
    ) -> Result<u32, ProbeError> {
        self.shared
            .take_slot(&mut self.ebpf, file, sites)
            .map_err(|e| match e {
                shared::SlotError::Full => ProbeError::SlotsFull {
                    pid,
                    entries: maps::SITE_COOKIES_CAPACITY,
                },
                shared::SlotError::Map(source) => ProbeError::Map {
                    map: maps::SITE_COOKIES,
                    source,
                },
            })
    }

    /// Adds predefined datatype sizes of process `pid` (runtime address to
    /// size) to the map the probes size arguments with; an address already
    /// there keeps its entry.
    fn insert_types(
        &mut self,
        pid: u32,
        datatypes: &BTreeMap<u64, u64>,
        att: &mut Attachment,
    ) -> Result<(), ProbeError> {
        let mut types: BpfHashMap<&mut MapData, TypeKey, u64> = BpfHashMap::try_from(
            self.ebpf
                .map_mut(maps::OMPI_TYPES)
                .expect("OMPI_TYPES map in object"),
        )
        .map_err(|source| ProbeError::Map {
            map: maps::OMPI_TYPES,
            source,
        })?;
        // The table comes from the process's own library: bounded, so one
        // process cannot fill the map for the others.
        let mut dropped = 0;
        for (&addr, &size) in datatypes {
            let key = TypeKey {
                tgid: pid,
                pad: 0,
                addr,
            };
            if att.type_keys.contains(&key) {
                continue;
            }
            if att.type_keys.len() >= maps::OMPI_TYPES_PER_PROCESS {
                dropped += 1;
                continue;
            }
            if types.insert(key, size, 0).is_ok() {
                att.type_keys.push(key);
            } else {
                dropped += 1;
            }
        }
        att.types_dropped += dropped;
        self.types_dropped += dropped as u64;
        Ok(())
    }

    /// Gives process `pid` the datatypes found once its MPI library
    /// initialised them (see `datatypes::inspect`): the sizes of its
    /// predefined types, and how to read a derived type's size.
    pub fn update_datatypes(
        &mut self,
        pid: u32,
        att: &mut Attachment,
        datatypes: &BTreeMap<u64, u64>,
        derived: (u64, u64),
    ) -> Result<(), ProbeError> {
        self.insert_types(pid, datatypes, att)?;
        self.update_config(pid, |c| {
            c.ompi_dt_class = derived.0;
            c.ompi_dt_size_offset = derived.1;
        })
    }

    /// Changes process `pid`'s configuration in the programs' map (the
    /// injection's trigger and skip range, docs/inject.md); the programs see
    /// the new value at their next lookup.
    pub fn update_config(
        &mut self,
        pid: u32,
        change: impl FnOnce(&mut ProcConfig),
    ) -> Result<(), ProbeError> {
        let map_err = |source| ProbeError::Map {
            map: maps::PROCS,
            source,
        };
        let mut procs: BpfHashMap<&mut MapData, u32, ProcConfig> =
            BpfHashMap::try_from(self.ebpf.map_mut(maps::PROCS).expect("PROCS map in object"))
                .map_err(map_err)?;
        let mut c = procs.get(&pid, 0).map_err(map_err)?;
        change(&mut c);
        procs.insert(pid, c, 0).map_err(map_err)
    }

    /// Process `pid`'s configuration as the programs see it now (read
    /// only: an armed injection's trigger is cleared by the entry program,
    /// and the armed-injection watcher of `crate::daemon::inject` reads it).
    pub fn config(&self, pid: u32) -> Option<ProcConfig> {
        let procs: BpfHashMap<&MapData, u32, ProcConfig> =
            BpfHashMap::try_from(self.ebpf.map(maps::PROCS)?).ok()?;
        procs.get(&pid, 0).ok()
    }

    /// Calls of process `pid` the probes are timing now and will record:
    /// those open on some thread, less the ones made by an injected shim.
    pub fn open_calls(&self, pid: u32) -> usize {
        let Some(Ok(inflight)) = self
            .ebpf
            .map(maps::INFLIGHT)
            .map(BpfHashMap::<&MapData, u64, Inflight>::try_from)
        else {
            return 0;
        };
        inflight
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, e)| (k >> 32) as u32 == pid && e.unknown & maps::INFLIGHT_SKIP == 0)
            .count()
    }
}

/// The sites of `functions` in `lib`, grouped by entry program, each with
/// its cookie; every site also gets a return probe.
fn sites(lib: &Library, functions: &[u16], bytes: bool) -> shared::Sites {
    let mut sites = shared::Sites::new();
    for &id in functions {
        let Some(entry) = lib.entries.get(&id) else {
            continue;
        };
        let info = &FUNCTIONS[id as usize];
        let enter = match info.family {
            Family::PointToPoint => ENTER_P2P,
            Family::Collective => ENTER_COLL,
            _ => ENTER_PLAIN,
        };
        let c = cookie::encode(id, info, bytes);
        for prog in [RETURN, enter] {
            let (offs, cookies) = sites.entry(prog).or_default();
            offs.push(entry.file_offset);
            cookies.push(c);
        }
    }
    sites
}

/// The executable mapping's address minus its file offset, if every site
/// of `sites` lies in it: a probed address minus this is the site's file
/// offset.
fn text_bias(map: &MappedLib, sites: &shared::Sites) -> Option<u64> {
    let (start, end, offset) = map.text?;
    let inside = |o: u64| o >= offset && o - offset < end - start;
    sites
        .values()
        .flat_map(|(offs, _)| offs)
        .all(|&o| inside(o))
        .then(|| start.wrapping_sub(offset))
}
