//! Call sites: naming the application's return addresses that the probes
//! (`attach --callsites`) and the shim's `stats` layer capture, and keeping
//! the `mpi_callsite_*` series of each rank bounded.
//!
//! **Naming.** An address is turned into (object file, file offset) with the
//! process's `/proc/PID/maps`, read once and again only when an address
//! falls outside every mapping known (a library dlopened later). The name
//! is then looked up, with blazesym, in that file's ELF symbols and DWARF
//! line table, at the offset of the call instruction (the return address
//! minus one), and cached by (device, inode, offset): every rank of a job
//! runs the same binary, so each call site of a library is symbolized once
//! per daemon, at the collection that first sees it, never on the
//! application's path. A name has one of these forms, best first:
//!
//! | what the object has | the call site's name |
//! |---|---|
//! | symbols and DWARF lines | `exchange at halo.c:42` |
//! | symbols only | `exchange+0x2f` (the return address's offset in the function) |
//! | neither (stripped) | `app+0x1a2f` (the object's file name and the return address's file offset) |
//! | an address outside every mapping | `[unknown]` |
//!
//! Two call instructions on one source line share a name, and their figures
//! are added together.
//!
//! **Sharing.** The one symbolizer process is shared between users: the
//! offsets to name wait in one queue per uid, served in turn and within a
//! budget of symbolizer seconds per uid, and a file that failed is poisoned
//! for the uid that asked only ([`schedule`]).
//!
//! **Bounds.** The maps and the shim's table hold every call site; the
//! exposition holds, per (rank, function), the first [`Budget::per_function`]
//! call sites seen (the heaviest first among those seen at one collection),
//! and sums the rest as `callsite="other"`: the rank's calls of that
//! function minus those of its named sites. A site keeps its series for the
//! rank's life, so every counter only grows (a site that moved between its
//! own series and `other` would make both jump). The report reads every
//! site.

use std::{
    collections::{BTreeMap, HashMap},
    num::NonZeroUsize,
    path::Path,
    sync::{
        Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError,
        atomic::{AtomicU64, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::{
    attach::symbolizer::{Client, Limits},
    collect::snapshot::{RawSite, Site},
    os::procfs,
    os::userfile,
};

mod schedule;

pub use schedule::{DEFAULT_BUDGET, Fairness};
use schedule::{Next, Pushed, Request, Scheduler};

/// The name of the series summing a function's call sites beyond the budget
/// (and the calls no site was recorded for).
pub const OTHER: &str = "other";
/// The name of an address outside every mapping.
pub const UNKNOWN: &str = "[unknown]";

/// Default bound of the daemon's name cache (`--max-callsite-names`).
pub const DEFAULT_MAX_NAMES: u64 = 65_536;
/// Bound of the name cache's bytes (names are cut at
/// [`crate::attach::symbolizer::MAX_NAME`] bytes; most are under 60).
pub const DEFAULT_MAX_NAME_BYTES: usize = 16 << 20;
/// Addresses a rank names at most over its life; past it, its new
/// addresses are counted in `callsite="other"` (and refusals counted).
pub const PER_RANK_NAMES: usize = 16_384;
/// How long one collection waits, in all, for names it asked for.
pub const DEFAULT_NAME_WAIT: Duration = Duration::from_millis(300);

/// How many call sites of each (rank, function) get series of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Named call sites per (rank, function).
    pub per_function: usize,
}

impl Default for Budget {
    fn default() -> Self {
        Budget { per_function: 8 }
    }
}

/// One executable mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Mapping {
    /// The maps line, to open the file as mapped.
    entry: procfs::MapEntry,
    /// The file's path, as the process sees it.
    path: String,
}

impl Mapping {
    fn contains(&self, addr: u64) -> bool {
        addr >= self.entry.start && addr < self.entry.end
    }

    /// The file offset of `addr`.
    fn offset_of(&self, addr: u64) -> u64 {
        addr - self.entry.start + self.entry.offset
    }

    fn file(&self) -> FileId {
        (self.entry.dev, self.entry.inode)
    }

    /// The name of an offset without symbols: `object+0xoffset`.
    fn fallback(&self, ret_offset: u64) -> String {
        let object = Path::new(&self.path)
            .file_name()
            .map_or_else(|| self.path.clone(), |n| n.to_string_lossy().into_owned());
        format!("{object}+{ret_offset:#x}")
    }
}

/// A process's executable file mappings.
#[derive(Clone, Debug, Default)]
struct Maps {
    ranges: Vec<Mapping>,
}

impl Maps {
    /// Keeps the executable mappings of files of a parsed `/proc/PID/maps`.
    fn from_entries(entries: Vec<procfs::MapEntry>) -> Maps {
        let ranges = entries
            .into_iter()
            .filter(|m| m.exec)
            .filter_map(|m| {
                let path = m.path.as_ref()?.to_string_lossy().into_owned();
                Some(Mapping { entry: m, path })
            })
            .collect();
        Maps { ranges }
    }

    fn read(pid: u32) -> Result<Maps, procfs::ProcError> {
        procfs::maps(pid).map(Maps::from_entries)
    }

    fn find(&self, addr: u64) -> Option<&Mapping> {
        self.ranges.iter().find(|m| m.contains(addr))
    }
}

/// A file, as a maps line names it: device and inode.
type FileId = ((u32, u32), u64);
/// A file and an offset in it: the cache key of a name.
type Key = (FileId, u64);

/// Counters of the naming, process-wide (one daemon per process), for
/// the self-metrics.
#[derive(Debug, Default)]
pub struct NamingCounters {
    /// Symbolizer failures: timeout, memory, cpu, crash, spawn, protocol.
    failures: Mutex<BTreeMap<&'static str, u64>>,
    /// Files refused before symbolizing (not the mapped file, not
    /// regular, over the size cap).
    pub files_refused: AtomicU64,
    /// Names evicted from the daemon's cache.
    pub evictions: AtomicU64,
    /// Lookups refused: a rank's name map full, or too many pending.
    pub refusals_rank_full: AtomicU64,
    /// Lookups refused because too many offsets were waiting.
    pub refusals_queue_full: AtomicU64,
    /// Names in the daemon's cache now.
    pub cached: AtomicU64,
    /// Call sites of the last collection still waiting for their name.
    pub pending: AtomicU64,
    /// Per uid: how often it spent its symbolizer budget with call sites
    /// still to name.
    throttled: Mutex<BTreeMap<u32, u64>>,
}

impl NamingCounters {
    /// The process's counters.
    pub fn global() -> &'static NamingCounters {
        static C: OnceLock<NamingCounters> = OnceLock::new();
        C.get_or_init(NamingCounters::default)
    }

    fn failed(&self, reason: &'static str) {
        *self
            .failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(reason)
            .or_default() += 1;
    }

    fn throttled(&self, uid: u32) {
        *self
            .throttled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(uid)
            .or_default() += 1;
    }

    /// How often `uid` spent its symbolizer budget with sites to name.
    pub fn throttled_of(&self, uid: u32) -> u64 {
        self.throttled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&uid)
            .copied()
            .unwrap_or(0)
    }

    /// Failures of the symbolizer for `reason`.
    pub fn failures(&self, reason: &str) -> u64 {
        self.failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(reason)
            .copied()
            .unwrap_or(0)
    }
}

/// Appends the naming's self-metrics to an exposition.
pub fn render_self_metrics(out: &mut String) {
    use std::fmt::Write as _;
    let c = NamingCounters::global();
    let lib = crate::attach::symbols::LibraryCache::global();
    let failures = c.failures.lock().unwrap_or_else(PoisonError::into_inner);
    let _ = writeln!(
        out,
        "# HELP mpi_observer_symbolizer_failures_total Files whose call sites the symbolizer process could not name (timeout, memory, cpu, crash, spawn, protocol): their sites keep object+offset names.\n# TYPE mpi_observer_symbolizer_failures_total counter"
    );
    for reason in ["timeout", "memory", "cpu", "crash", "spawn", "protocol"] {
        let n = failures.get(reason).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "mpi_observer_symbolizer_failures_total{{reason=\"{reason}\"}} {n}"
        );
    }
    drop(failures);
    let _ = writeln!(
        out,
        "# HELP mpi_observer_symbolizer_throttled_total Times a uid spent its symbolizer budget (--symbolizer-budget seconds a minute) with call sites still to name: they waited, named object+offset, until it refilled; other users were served meanwhile.\n# TYPE mpi_observer_symbolizer_throttled_total counter"
    );
    for (uid, n) in c
        .throttled
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
    {
        let _ = writeln!(
            out,
            "mpi_observer_symbolizer_throttled_total{{uid=\"{uid}\"}} {n}"
        );
    }
    let lines: [(&str, &str, &str, String); 7] = [
        (
            "mpi_observer_user_files_refused_total",
            "counter",
            "Files of user processes refused before symbolizing: replaced, not a regular file, or over --max-file-size.",
            c.files_refused.load(Ordering::Relaxed).to_string(),
        ),
        (
            "mpi_observer_callsite_names",
            "gauge",
            "Call-site names in the daemon's cache (bounded by --max-callsite-names).",
            c.cached.load(Ordering::Relaxed).to_string(),
        ),
        (
            "mpi_observer_callsite_names_pending",
            "gauge",
            "Call sites of this scrape's ranks still waiting for their name: their calls are in no mpi_callsite_* series (nor in callsite=\"other\") until named, usually by the next scrape; 0: every call is in a site's series or in other.",
            c.pending.load(Ordering::Relaxed).to_string(),
        ),
        (
            "mpi_observer_callsite_name_evictions_total",
            "counter",
            "Call-site names evicted from the daemon's cache (named again when needed).",
            c.evictions.load(Ordering::Relaxed).to_string(),
        ),
        (
            "mpi_observer_callsite_name_refusals_total",
            "counter",
            "Call-site lookups refused, per collection and address: reason=\"rank_full\" (the rank named 16384 addresses; the rest go to callsite=\"other\"), \"queue_full\" (asked again at the next collection).",
            String::new(),
        ),
        (
            "mpi_observer_library_parses_total",
            "counter",
            "MPI libraries read and parsed (once per file contents).",
            lib.parses().to_string(),
        ),
        (
            "mpi_observer_library_cache_hits_total",
            "counter",
            "Attaches that found their MPI library already parsed.",
            lib.hits().to_string(),
        ),
    ];
    for (name, kind, help, value) in lines {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        if value.is_empty() {
            for (reason, v) in [
                ("queue_full", &c.refusals_queue_full),
                ("rank_full", &c.refusals_rank_full),
            ] {
                let _ = writeln!(
                    out,
                    "{name}{{reason=\"{reason}\"}} {}",
                    v.load(Ordering::Relaxed)
                );
            }
        } else {
            let _ = writeln!(out, "{name} {value}");
        }
    }
}

/// The naming's bounds.
#[derive(Clone, Debug)]
pub struct NamesConfig {
    /// Names in the cache at most.
    pub max_names: usize,
    /// Bytes of names in the cache at most.
    pub max_bytes: usize,
    /// The symbolizer process's bounds.
    pub limits: Limits,
    /// How the symbolizer is shared between users.
    pub fairness: Fairness,
    /// How long one collection waits, in all, for names.
    pub wait: Duration,
    /// The symbolizer program and its arguments, when not this binary's
    /// `__symbolizer` (tests).
    pub program: Option<(std::path::PathBuf, Vec<String>)>,
}

impl Default for NamesConfig {
    fn default() -> Self {
        NamesConfig {
            max_names: DEFAULT_MAX_NAMES as usize,
            max_bytes: DEFAULT_MAX_NAME_BYTES,
            limits: Limits::default(),
            fairness: Fairness::default(),
            wait: DEFAULT_NAME_WAIT,
            program: None,
        }
    }
}

struct Inner {
    cache: lru::LruCache<Key, Arc<str>>,
    bytes: usize,
    max_bytes: usize,
    /// What waits to be named, per uid, and the uids' budgets and
    /// poisoned files.
    sched: Scheduler,
    /// The [`Names`] is gone: the naming thread ends.
    closed: bool,
}

impl Inner {
    fn insert(&mut self, key: Key, name: Arc<str>) {
        // Every name becomes a label value: capped (and the cut counted).
        let name = match crate::attach::identity::cap_callsite(&name) {
            std::borrow::Cow::Borrowed(_) => name,
            std::borrow::Cow::Owned(cut) => Arc::from(cut),
        };
        let c = NamingCounters::global();
        self.bytes += name.len();
        if let Some((_, old)) = self.cache.push(key, name) {
            // Replaced or evicted.
            self.bytes -= old.len();
            c.evictions.fetch_add(1, Ordering::Relaxed);
        }
        while self.bytes > self.max_bytes {
            let Some((_, old)) = self.cache.pop_lru() else {
                break;
            };
            self.bytes -= old.len();
            c.evictions.fetch_add(1, Ordering::Relaxed);
        }
        c.cached.store(self.cache.len() as u64, Ordering::Relaxed);
    }
}

struct Shared {
    inner: Mutex<Inner>,
    /// Names were made (collections wait on it).
    answered: Condvar,
    /// Work was queued, or the [`Names`] closed (the naming thread waits
    /// on it).
    work: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Call-site names, cached by file and offset: one per daemon. Names are
/// made by a background thread that drives the symbolizer process (see
/// [`crate::attach::symbolizer`]); a collection asks for what it lacks and waits
/// for it only within a small budget.
pub struct Names {
    shared: Arc<Shared>,
    config: NamesConfig,
    /// The naming thread, started at the first lookup.
    worker: Option<JoinHandle<()>>,
    unknown: Arc<str>,
    other: Arc<str>,
}

impl Drop for Names {
    fn drop(&mut self) {
        // The thread ends at its next look (after the request in flight),
        // and its symbolizer process with it.
        self.shared.lock().closed = true;
        self.shared.work.notify_all();
    }
}

impl Default for Names {
    fn default() -> Self {
        Names::new()
    }
}

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Names")
            .field("cached", &self.cached())
            .finish()
    }
}

impl Names {
    /// An empty cache with the default bounds.
    pub fn new() -> Names {
        Names::with_config(NamesConfig::default())
    }

    /// An empty cache with these bounds.
    pub fn with_config(config: NamesConfig) -> Names {
        let cap = |n: usize| NonZeroUsize::new(n.max(1)).expect("at least one");
        Names {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    cache: lru::LruCache::new(cap(config.max_names)),
                    bytes: 0,
                    max_bytes: config.max_bytes,
                    sched: Scheduler::new(config.fairness),
                    closed: false,
                }),
                answered: Condvar::new(),
                work: Condvar::new(),
            }),
            config,
            worker: None,
            unknown: Arc::from(UNKNOWN),
            other: Arc::from(OTHER),
        }
    }

    /// Call-site names cached now.
    pub fn cached(&self) -> usize {
        self.shared.lock().cache.len()
    }

    /// Offsets waiting to be named now.
    pub fn pending(&self) -> usize {
        self.shared.lock().sched.pending()
    }

    /// A naming session for one collection: it waits for names, in all,
    /// at most the configured budget.
    pub fn session(&mut self) -> Session<'_> {
        let deadline = Instant::now() + self.config.wait;
        Session {
            names: self,
            deadline,
        }
    }

    /// Starts the naming thread if it is not running; whether it runs (a
    /// thread that panicked runs no more).
    fn worker_runs(&mut self) -> bool {
        if self.worker.is_none() {
            let shared = self.shared.clone();
            let client = match self.config.program.clone() {
                Some((p, args)) => Client::with_program(p, args, self.config.limits),
                None => Client::new(self.config.limits),
            };
            self.worker = Some(
                std::thread::Builder::new()
                    .name("callsite-names".into())
                    .spawn(move || worker(&shared, client))
                    .expect("spawn the call-site naming thread"),
            );
        }
        self.worker.as_ref().is_some_and(|w| !w.is_finished())
    }

    /// The cached name of `key`, or the fallback of a file poisoned for
    /// `uid`, or `None` after queuing it for `uid`, whose process `pid`
    /// maps it.
    fn lookup(&mut self, uid: u32, pid: u32, m: &Mapping, ret_offset: u64) -> Option<Arc<str>> {
        let key = (m.file(), ret_offset);
        let fallback = || -> Arc<str> { Arc::from(m.fallback(ret_offset)) };
        let runs = self.worker_runs();
        let mut inner = self.shared.lock();
        if let Some(n) = inner.cache.get(&key) {
            return Some(n.clone());
        }
        // Not cached: a file that failed for this uid says nothing about
        // the same file for another, who pays for its own try.
        if inner.sched.is_poisoned(uid, m.file()) {
            return Some(fallback());
        }
        if !runs {
            // The naming thread is gone (it panicked): names fall back.
            let name = fallback();
            inner.insert(key, name.clone());
            return Some(name);
        }
        match inner.sched.push(uid, pid, m, ret_offset, Instant::now()) {
            Pushed::Queued => {
                drop(inner);
                self.shared.work.notify_one();
            }
            Pushed::Already => {}
            Pushed::Full => {
                NamingCounters::global()
                    .refusals_queue_full
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        None
    }

    /// Waits until the names of `keys` that `uid` asked for are made or
    /// `deadline` passes.
    fn wait_for(&self, uid: u32, keys: &[Key], deadline: Instant) {
        let mut inner = self.shared.lock();
        while keys
            .iter()
            .any(|k| inner.sched.is_pending(uid, k) && !inner.cache.contains(k))
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            inner = self
                .shared
                .answered
                .wait_timeout(inner, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

/// The naming thread: takes the next request, users in turn (see
/// [`schedule`]), names it in the symbolizer process, and charges its uid
/// the time it took.
fn worker(shared: &Shared, mut client: Client) {
    // The file of the last request, kept open for the next of that file.
    let mut open: Option<(FileId, userfile::UserFile)> = None;
    loop {
        let request = {
            let mut inner = shared.lock();
            loop {
                if inner.closed {
                    return;
                }
                let now = Instant::now();
                let Inner { sched, cache, .. } = &mut *inner;
                let next = sched.next(now, |k| cache.contains(k));
                let lines = sched.take_lines();
                if !lines.is_empty() {
                    // Not under the lock: stderr may be a slow pipe.
                    drop(inner);
                    for l in lines {
                        log::warn!("{l}");
                    }
                    inner = shared.lock();
                }
                if !matches!(next, Next::Serve(_)) {
                    // Idle: hold no user's file open (it could keep a
                    // deleted file's space, or a file system, busy).
                    open = None;
                }
                match next {
                    Next::Serve(r) => break r,
                    Next::Wait(until) => {
                        let left = until.saturating_duration_since(Instant::now());
                        inner = shared
                            .work
                            .wait_timeout(inner, left)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0;
                    }
                    Next::Idle => {
                        inner = shared
                            .work
                            .wait(inner)
                            .unwrap_or_else(PoisonError::into_inner);
                    }
                }
            }
        };
        let file = request.mapping.file();
        let started = Instant::now();
        let names = name_request(&mut client, &mut open, &request);
        let spent = started.elapsed();
        let mut inner = shared.lock();
        if let Some(names) = &names {
            for (i, off) in request.offsets.iter().enumerate() {
                let name = names
                    .get(i)
                    .cloned()
                    .flatten()
                    .unwrap_or_else(|| request.mapping.fallback(*off));
                inner.insert((file, *off), Arc::from(name));
            }
        }
        inner
            .sched
            .done(&request, spent, names.is_none(), Instant::now());
        drop(inner);
        shared.answered.notify_all();
    }
}

/// The names of `r`'s offsets in its file, `None` where it has no symbol
/// there; `None` in all when the file cannot be symbolized (logged: the
/// scheduler marks the file for the uid). `open` keeps the last file open.
fn name_request(
    client: &mut Client,
    open: &mut Option<(FileId, userfile::UserFile)>,
    r: &Request,
) -> Option<Vec<Option<String>>> {
    let counters = NamingCounters::global();
    let file = r.mapping.file();
    if open.as_ref().is_none_or(|(f, _)| *f != file) {
        *open = None;
        match userfile::open_mapped(
            r.pid,
            &r.mapping.entry,
            crate::attach::symbols::max_file_size(),
        ) {
            Ok(f) => *open = Some((file, f)),
            Err(e) => {
                counters.files_refused.fetch_add(1, Ordering::Relaxed);
                log::warn!("call sites of pid {} not symbolized: {e}", r.pid);
                return None;
            }
        }
    }
    let f = &open.as_ref().expect("just opened").1;
    // The call instruction: the byte before the return address.
    let calls: Vec<u64> = r.offsets.iter().map(|o| o.saturating_sub(1)).collect();
    match client.symbolize(&f.file, &f.shown, &calls) {
        Ok(names) => Some(names),
        Err(e) => {
            *open = None;
            counters.failed(e.reason());
            log::warn!("{e}");
            None
        }
    }
}

/// Names call sites during one collection; see [`Names::session`].
pub struct Session<'a> {
    names: &'a mut Names,
    deadline: Instant,
}

/// One rank's call sites: its maps, the names of its addresses, and which
/// sites have series of their own. Dropped with the rank.
#[derive(Debug, Default)]
pub struct RankSites {
    maps: Option<Maps>,
    names: HashMap<u64, Arc<str>>,
    exported: BTreeMap<u16, Vec<Arc<str>>>,
}

/// The process whose call sites are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Who {
    /// Its pid.
    pub pid: u32,
    /// Its real uid: whose share of the symbolizer its names take.
    pub uid: u32,
    /// Whether it still runs (its maps may be read again).
    pub alive: bool,
}

/// A site after the first naming pass: function, name if made, address,
/// calls, time.
type FirstPass = (u16, Option<Arc<str>>, u64, u64, u64);

/// What naming one address gave.
enum Naming {
    Named(Arc<str>),
    /// Asked for; the key to wait on and the name to show meanwhile.
    Pending(Key, Arc<str>),
}

impl RankSites {
    /// Addresses this rank has names for (at most [`PER_RANK_NAMES`]).
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether no address is named yet.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// The name of `addr` in `who`'s address space.
    fn name(&mut self, names: &mut Names, who: Who, addr: u64) -> Naming {
        let Who { pid, uid, alive } = who;
        if let Some(n) = self.names.get(&addr) {
            return Naming::Named(n.clone());
        }
        if self.names.len() >= PER_RANK_NAMES {
            // For good: the map never shrinks while the rank lives, so the
            // address stays in `other` at every collection.
            NamingCounters::global()
                .refusals_rank_full
                .fetch_add(1, Ordering::Relaxed);
            return Naming::Named(names.other.clone());
        }
        let covered = self.maps.as_ref().and_then(|m| m.find(addr)).is_some();
        if !covered
            && alive
            && let Ok(m) = Maps::read(pid)
        {
            self.maps = Some(m);
        }
        let Some(m) = self.maps.as_ref().and_then(|m| m.find(addr)).cloned() else {
            // Not kept: the process may map it later.
            return Naming::Named(names.unknown.clone());
        };
        let ret_offset = m.offset_of(addr);
        match names.lookup(uid, pid, &m, ret_offset) {
            Some(name) => {
                self.names.insert(addr, name.clone());
                Naming::Named(name)
            }
            None => Naming::Pending((m.file(), ret_offset), Arc::from(m.fallback(ret_offset))),
        }
    }

    /// Names `addr` by hand (a synthetic rank, with no process to read).
    pub fn preset(&mut self, addr: u64, name: &str) {
        self.names
            .insert(addr, Arc::from(crate::attach::identity::cap_callsite(name)));
    }

    /// Reads the maps now, so that addresses can still be named after the
    /// process exits (its files stay where they were).
    pub fn prime(&mut self, pid: u32) {
        if self.maps.is_none() {
            self.maps = Maps::read(pid).ok();
        }
    }

    /// Names `raw` and merges sites of one name; marks which have series of
    /// their own within `budget`. Sorted by function, then time, heaviest
    /// first. Names not made yet are asked for and waited for within the
    /// session's budget; those still missing are marked pending.
    pub fn resolve(
        &mut self,
        session: &mut Session<'_>,
        who: Who,
        raw: &[RawSite],
        budget: Budget,
    ) -> Vec<Site> {
        // (function, name if made, address, calls, time).
        let mut named: Vec<FirstPass> = Vec::new();
        let mut waiting: Vec<Key> = Vec::new();
        for r in raw.iter().filter(|r| r.calls > 0) {
            let n = match self.name(session.names, who, r.addr) {
                Naming::Named(n) => Some(n),
                Naming::Pending(k, _) => {
                    waiting.push(k);
                    None
                }
            };
            named.push((r.function, n, r.addr, r.calls, r.time_ns));
        }
        if !waiting.is_empty() {
            session.names.wait_for(who.uid, &waiting, session.deadline);
        }
        let mut merged: BTreeMap<(u16, bool, Arc<str>), (u64, u64)> = BTreeMap::new();
        for (function, n, addr, calls, time_ns) in named {
            let (pending, name) = match n {
                Some(n) => (false, n),
                None => match self.name(session.names, who, addr) {
                    Naming::Named(n) => (false, n),
                    Naming::Pending(_, shown) => (true, shown),
                },
            };
            let e = merged.entry((function, pending, name)).or_default();
            e.0 = e.0.saturating_add(calls);
            e.1 = e.1.saturating_add(time_ns);
        }
        // Newly seen sites take the free places, heaviest first.
        let mut by_function: BTreeMap<u16, Vec<Site>> = BTreeMap::new();
        for ((function, pending, name), (calls, time_ns)) in merged {
            by_function.entry(function).or_default().push(Site {
                function,
                name,
                calls,
                time_ns,
                exported: false,
                pending,
            });
        }
        let mut out = Vec::new();
        for (function, mut sites) in by_function {
            sites.sort_by(|a, b| b.time_ns.cmp(&a.time_ns).then(a.name.cmp(&b.name)));
            let exported = self.exported.entry(function).or_default();
            for s in sites.iter_mut().filter(|s| !s.pending) {
                if exported.contains(&s.name) {
                    s.exported = true;
                } else if exported.len() < budget.per_function && &*s.name != OTHER {
                    exported.push(s.name.clone());
                    s.exported = true;
                }
            }
            out.extend(sites);
        }
        out
    }
}

#[cfg(test)]
mod tests;
