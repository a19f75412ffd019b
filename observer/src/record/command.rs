//! `mpi-observer record`: an OTF2 trace of running ranks, on demand.
//!
//! Each rank is recorded the cheapest way it allows. A rank whose shim runs
//! the `stats` layer (preloaded, or injected by `attach --inject`) writes
//! full events into per-thread rings of its segment while the recording is
//! on ([`super::shim`]); any other rank gets the observer's probes with
//! tracing on, and each completed outermost call comes through a BPF ring
//! buffer as its Enter and Leave ([`maps::TraceCall`]). Both are drained
//! every few milliseconds into one archive ([`super::archive`]).
//!
//! The recording stops when every recorded rank has exited, at
//! `--duration`, or on SIGINT/SIGTERM; the archive is always closed valid.
//! Stopping leaves the ranks running untouched: the shim goes back to its
//! one-load idle path, the probes are detached.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use observer_common::{
    FUNCTIONS,
    functions::{Collective as C, Family, FunctionInfo},
    maps::TraceCall,
    trace::{Kind, TraceEvent},
};
use thiserror::Error;

use super::{
    archive::{self, Archive, CollectiveOp, CommDef, Event, RankDef, RegionDef, RegionRole},
    shim::ShimRecorder,
    slice::Slice,
};
use crate::{
    EBPF_OBJECT, attach::datatypes, attach::functions, attach::probes::Probes, attach::symbols,
    cli::RecordArgs, os::procfs,
};

/// The archive's name inside `-o DIR`: `DIR/traces.otf2`, as Score-P names
/// its archives.
pub const ARCHIVE_NAME: &str = "traces";

/// How often the rings are drained while they are quiet.
const DRAIN_EVERY: Duration = Duration::from_millis(10);
/// How often while events come: a ring of 65,536 events then holds what a
/// thread making 30 million events a second writes between two drains.
const DRAIN_BUSY: Duration = Duration::from_millis(1);

/// Why a recording could not start (or finish).
#[derive(Debug, Error)]
pub enum RecordError {
    /// `--pid` names no running process.
    #[error("pid {0} is not running: give the pid of a running MPI rank")]
    NoProcess(u32),
    /// `--pid` names a process without an MPI library.
    #[error("pid {0} has no MPI library loaded: give the pid of an MPI rank, not of its launcher")]
    NotMpi(u32),
    /// `--all` found nothing.
    #[error("no MPI rank is running on this node: start the job first, or give --pid")]
    NoRanks,
    /// `--all` found several jobs.
    #[error("ranks of {} jobs are running ({}): record one with --job ID", .0.len(), .0.join(", "))]
    SeveralJobs(Vec<String>),
    /// `--job` matched nothing.
    #[error("no running rank belongs to job {0}")]
    NoSuchJob(String),
    /// Two processes claim one rank of the job.
    #[error("pids {0} and {1} both claim rank {2} of job {3}: record them separately")]
    DuplicateRank(u32, u32, u32, String),
    /// `-o DIR` unusable.
    #[error("{0}")]
    Output(String),
    /// The probes could not be loaded or attached.
    #[error("probes: {0}")]
    Probes(String),
    /// The archive could not be written.
    #[error(transparent)]
    Archive(#[from] archive::ArchiveError),
}

/// Set by SIGINT and SIGTERM.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// One recorded rank.
struct Target {
    pid: u32,
    ticks: u64,
    rank: u32,
    /// Where its events come from.
    source: Source,
    /// Its threads, in order of first event: index = OTF2 location in the
    /// rank's group (the process's own tid first).
    threads: Vec<Thread>,
    /// The shim's communicator ids → the archive's.
    comms: HashMap<u32, u32>,
    /// A communicator being defined: (id, size, world ranks so far).
    defining: HashMap<u32, (u32, Vec<u32>)>,
    exited: bool,
    /// Its shim's rings were lost mid-recording (the file truncated): it
    /// is recorded no further, and said so once.
    lost: bool,
}

enum Source {
    Shim(ShimRecorder),
    Probes,
}

/// The probes of the ranks recorded without a shim, and their ring.
struct Traced {
    probes: Probes,
    ring: aya::maps::RingBuf<aya::maps::MapData>,
    attached: Vec<(u32, crate::attach::probes::Attachment)>,
}

/// What the archive needs to stay well-formed on one thread: a recording
/// that starts or stops mid-call, or a request started before it, must
/// not leave a Leave without its Enter, or a completion without its start.
#[derive(Default)]
struct Thread {
    tid: u32,
    /// Regions entered and not left.
    open: Vec<u32>,
    /// Requests started in the recording and not completed.
    requests: std::collections::HashSet<u64>,
    /// The last timestamp written.
    last: u64,
}

impl Target {
    fn location(&mut self, tid: u32) -> u32 {
        if let Some(i) = self.threads.iter().position(|t| t.tid == tid) {
            return i as u32;
        }
        self.threads.push(Thread {
            tid,
            ..Thread::default()
        });
        (self.threads.len() - 1) as u32
    }

    /// Writes `ev` at `t` on thread `tid` if it keeps the thread's events
    /// well-formed (see [`Thread`]); returns whether it did.
    fn write(
        &mut self,
        archive: &mut Archive,
        tid: u32,
        t: u64,
        ev: &Event,
    ) -> Result<bool, archive::ArchiveError> {
        let loc = self.location(tid);
        let th = &mut self.threads[loc as usize];
        let keep = match ev {
            Event::Enter { region } => {
                th.open.push(*region);
                true
            }
            Event::Leave { region } => {
                if th.open.last() == Some(region) {
                    th.open.pop();
                    true
                } else {
                    false
                }
            }
            Event::MpiIsend { request, .. } | Event::MpiIrecvRequest { request } => {
                th.requests.insert(*request);
                true
            }
            Event::MpiIsendComplete { request }
            | Event::MpiIrecv { request, .. }
            | Event::MpiRequestCancelled { request } => th.requests.remove(request),
            // Only inside a call: the shim writes them there.
            _ => !th.open.is_empty(),
        };
        if keep {
            th.last = th.last.max(t);
            archive.event(self.rank, loc, t, ev)?;
        }
        Ok(keep)
    }

    /// Leaves every call still open at the end of the recording, at the
    /// thread's last timestamp; returns how many.
    fn close(&mut self, archive: &mut Archive) -> Result<u64, archive::ArchiveError> {
        let mut n = 0;
        for (loc, th) in self.threads.iter_mut().enumerate() {
            while let Some(region) = th.open.pop() {
                archive.event(self.rank, loc as u32, th.last, &Event::Leave { region })?;
                n += 1;
            }
        }
        Ok(n)
    }
}

/// The archive's communicators: one per list of world ranks, so the same
/// communicator seen from each of its ranks is one definition.
#[derive(Default)]
struct Comms {
    by_members: HashMap<Vec<u32>, u32>,
}

impl Comms {
    /// The archive's id of the communicator of `world_ranks`, defined in
    /// `archive` on first sight (0 is MPI_COMM_WORLD, defined at start).
    /// `None` when the archive refuses the definition (a rank listed
    /// twice): its events then go on MPI_COMM_WORLD.
    fn id(&mut self, world_ranks: Vec<u32>, archive: &mut Archive) -> Option<u32> {
        if let Some(&id) = self.by_members.get(&world_ranks) {
            return Some(id);
        }
        let id = self.by_members.len() as u32 + 1;
        archive
            .add_comm(CommDef {
                id,
                name: format!("MPI communicator {id} ({} ranks)", world_ranks.len()),
                world_ranks: world_ranks.clone(),
            })
            .ok()?;
        self.by_members.insert(world_ranks, id);
        Some(id)
    }
}

/// What the recording did, for its last line.
#[derive(Default)]
struct Tally {
    events: u64,
    /// Events taken from the rings, written or not: while it grows the
    /// rings are drained at the busy pace (the slice may hold what it
    /// takes, super::slice).
    taken: u64,
    /// Events whose communicator was never defined: written on
    /// MPI_COMM_WORLD.
    unresolved: u64,
    /// Events left out to keep the archive well-formed: the Leave of a
    /// call entered before the recording, the completion of a request
    /// started before it.
    outside: u64,
    /// Calls still open at the end, closed at their thread's last time.
    closed: u64,
}

/// Runs `record`.
pub fn run(args: &RecordArgs) -> Result<(), RecordError> {
    let existed = args.output.exists();
    let dir = check_output(&args.output)?;
    let pids = targets(args).inspect_err(|_| {
        // Bad input leaves nothing behind: not even the directory.
        if !existed {
            let _ = std::fs::remove_dir(&dir);
        }
    })?;
    let regions = regions();
    let mut archive = Archive::create(
        &dir,
        ARCHIVE_NAME,
        concat!("mpi-observer ", env!("CARGO_PKG_VERSION")),
        regions,
    )?;

    // Identify every rank before touching any.
    let mut list: Vec<Target> = Vec::new();
    let mut jobid = String::new();
    let mut size = 0u32;
    for &pid in &pids {
        let ticks = procfs::start_ticks(pid).map_err(|_| RecordError::NoProcess(pid))?;
        let id = crate::attach::identity::identity(pid).map_err(|_| RecordError::NoProcess(pid))?;
        let shim = ShimRecorder::open(pid);
        let rank = id
            .rank
            .parse()
            .ok()
            .or_else(|| shim.as_ref().and_then(ShimRecorder::world_rank))
            .unwrap_or(list.len() as u32);
        size = size.max(id.size.parse().unwrap_or(0));
        if let Some(s) = &shim {
            size = size.max(s.world_size());
        }
        jobid = id.jobid.clone();
        if let Some(other) = list.iter().find(|t| t.rank == rank) {
            return Err(RecordError::DuplicateRank(other.pid, pid, rank, id.jobid));
        }
        list.push(Target {
            pid,
            ticks,
            rank,
            source: match shim {
                Some(s) => Source::Shim(s),
                None => Source::Probes,
            },
            threads: vec![Thread {
                tid: pid,
                ..Thread::default()
            }],
            comms: HashMap::from([(0, 0)]),
            defining: HashMap::new(),
            exited: false,
            lost: false,
        });
    }
    let node = crate::os::host::hostname();
    for t in &list {
        archive.add_rank(RankDef {
            rank: t.rank,
            node: node.clone(),
            pid: t.pid,
        })?;
    }
    let size = size.max(list.iter().map(|t| t.rank + 1).max().unwrap_or(0));
    archive.add_comm(CommDef {
        id: 0,
        name: "MPI_COMM_WORLD".into(),
        world_ranks: (0..size).collect(),
    })?;

    // The probes, only if some rank has no shim to record it.
    let probed: Vec<u32> = list
        .iter()
        .filter(|t| matches!(t.source, Source::Probes))
        .map(|t| t.pid)
        .collect();
    let mut probes = if probed.is_empty() {
        None
    } else {
        let mut p = Probes::load_tracing(EBPF_OBJECT, args.probe_ring_mib << 20)
            .map_err(|e| RecordError::Probes(e.to_string()))?;
        let ring = p
            .take_trace()
            .map_err(|e| RecordError::Probes(e.to_string()))?;
        Some(Traced {
            probes: p,
            ring,
            attached: Vec::new(),
        })
    };

    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    // The epoch: events carry CLOCK_MONOTONIC ns; the archive maps them
    // to wall-clock time through this pair, read together.
    let mono0 = crate::os::clock::monotonic_ns();
    let wall0 = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let epoch_realtime = wall0.saturating_sub(mono0);

    // Start: the shim's rings first (no cost to the rank), then the probes.
    let mut started = Vec::new();
    for t in &mut list {
        match &mut t.source {
            Source::Shim(s) => {
                s.start();
                started.push(t.pid);
            }
            Source::Probes => {
                let tr = probes.as_mut().expect("loaded above");
                match attach_traced(&mut tr.probes, t.pid) {
                    Ok(a) => {
                        tr.attached.push((t.pid, a));
                        started.push(t.pid);
                    }
                    Err(e) => {
                        stop_all(&mut list, &mut probes);
                        return Err(e);
                    }
                }
            }
        }
    }
    if let Some(tr) = probes.as_mut() {
        trace_on(tr, true);
    }
    // Where the archive starts and ends: at points every rank recorded,
    // when they can be known (super::slice).
    let whole = if args.whole {
        Some("as asked (--whole)".to_string())
    } else {
        list.iter()
            .find(|t| matches!(t.source, Source::Probes))
            .map(|t| {
                format!(
                    "rank {} is recorded through the probes, which see no collective's number",
                    t.rank
                )
            })
    };
    let mut slice = Slice::new(&list.iter().map(|t| t.rank).collect::<Vec<_>>(), whole);
    let n_shim = list
        .iter()
        .filter(|t| matches!(t.source, Source::Shim(_)))
        .count();
    log::info!(
        "recording {} rank{} of job {jobid} ({n_shim} through the shim, {} through probes) into {}",
        list.len(),
        if list.len() == 1 { "" } else { "s" },
        list.len() - n_shim,
        dir.join(format!("{ARCHIVE_NAME}.otf2")).display()
    );

    let began = Instant::now();
    let deadline = args.duration.map(|s| began + Duration::from_secs_f64(s));
    let mut tally = Tally::default();
    let mut comms = Comms::default();
    let mut pause = DRAIN_EVERY;
    let outcome = loop {
        std::thread::sleep(pause);
        let before = tally.taken;
        if let Err(e) = drain(
            &mut list,
            &mut probes,
            &mut archive,
            &mut comms,
            &mut tally,
            &mut slice,
        ) {
            break Err(e);
        }
        pause = if tally.taken > before {
            DRAIN_BUSY
        } else {
            DRAIN_EVERY
        };
        for t in &mut list {
            if !t.exited && !procfs::alive(t.pid, t.ticks) {
                t.exited = true;
            }
        }
        if list.iter().all(|t| t.exited) {
            break Ok("every recorded rank exited");
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break Ok("the duration was reached");
        }
        if STOP.load(Ordering::Relaxed) {
            break Ok("interrupted");
        }
    };
    // However it ended: the ranks go back to normal first, then what was
    // written before the stop took effect goes in, and the archive is
    // closed valid.
    stop_all(&mut list, &mut probes);
    let last = drain(
        &mut list,
        &mut probes,
        &mut archive,
        &mut comms,
        &mut tally,
        &mut slice,
    );
    let why = outcome.and_then(|w| last.map(|()| w));
    slice.finish(&mut |i, tid, ev| put(&mut list[i], &mut archive, &mut tally, tid, ev))?;
    for t in &mut list {
        tally.closed += t.close(&mut archive)?;
    }
    let now = crate::os::clock::monotonic_ns();
    let mut dropped_total = 0;
    for t in &list {
        if let Source::Shim(s) = &t.source {
            let (rings, no_ring) = s.dropped();
            let d: u64 = rings.iter().map(|(_, n)| n).sum::<u64>() + no_ring;
            if d > 0 {
                archive.dropped(t.rank, now, d)?;
                dropped_total += d;
            }
        }
    }
    let probe_dropped = probes.as_ref().map_or(0, |t| t.probes.read_trace_dropped());
    drop(probes);
    archive.finish(epoch_realtime)?;
    let why = why?;
    log::info!(
        "recorded {} events of {} ranks in {:.1} s ({why}, {:.3} s of CPU) into {}; dropped: {dropped_total} in the shim's rings, {probe_dropped} in the probes' ring{}; {}",
        tally.events,
        list.len(),
        began.elapsed().as_secs_f64(),
        cpu_seconds(),
        dir.join(format!("{ARCHIVE_NAME}.otf2")).display(),
        if tally.unresolved > 0 {
            format!(
                "; {} events on undefined communicators written on MPI_COMM_WORLD",
                tally.unresolved
            )
        } else {
            String::new()
        },
        slice.said()
    );
    Ok(())
}

/// CPU time this process used so far, user and system.
fn cpu_seconds() -> f64 {
    // SAFETY: rusage is plain integers, for which all zeros is valid.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes only the rusage it is given, which lives here.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0.0;
    }
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

/// `-o DIR`: created if missing; refused if it holds an archive already.
fn check_output(dir: &Path) -> Result<PathBuf, RecordError> {
    let bad = |why: String| RecordError::Output(why);
    std::fs::create_dir_all(dir)
        .map_err(|e| bad(format!("cannot create {}: {e}", dir.display())))?;
    let anchor = dir.join(format!("{ARCHIVE_NAME}.otf2"));
    if anchor.exists() {
        return Err(bad(format!(
            "{} exists: give a new or empty directory with -o, or remove the old archive",
            anchor.display()
        )));
    }
    let probe = dir.join(".mpi-observer-write-test");
    std::fs::write(&probe, b"")
        .map_err(|e| bad(format!("cannot write in {}: {e}", dir.display())))?;
    let _ = std::fs::remove_file(&probe);
    Ok(dir.to_path_buf())
}

/// The pids to record, checked.
fn targets(args: &RecordArgs) -> Result<Vec<u32>, RecordError> {
    if !args.all {
        for &pid in &args.pid {
            procfs::start_ticks(pid).map_err(|_| RecordError::NoProcess(pid))?;
            match procfs::mpi_library(pid) {
                Ok(Some(_)) => {}
                Ok(None) => return Err(RecordError::NotMpi(pid)),
                Err(_) => return Err(RecordError::NoProcess(pid)),
            }
        }
        return Ok(args.pid.clone());
    }
    let me = std::process::id();
    let mut jobs: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for pid in procfs::all_pids() {
        if pid == me || !matches!(procfs::mpi_library(pid), Ok(Some(_))) {
            continue;
        }
        if let Ok(id) = crate::attach::identity::identity(pid) {
            jobs.entry(id.jobid).or_default().push(pid);
        }
    }
    match &args.job {
        Some(j) => jobs
            .remove(j)
            .ok_or_else(|| RecordError::NoSuchJob(j.clone())),
        None if jobs.is_empty() => Err(RecordError::NoRanks),
        None if jobs.len() > 1 => Err(RecordError::SeveralJobs(jobs.into_keys().collect())),
        None => Ok(jobs.into_values().next().unwrap_or_default()),
    }
}

/// Attaches the probes to `pid` with tracing on.
fn attach_traced(
    p: &mut Probes,
    pid: u32,
) -> Result<crate::attach::probes::Attachment, RecordError> {
    let probe_err = |e: String| RecordError::Probes(format!("pid {pid}: {e}"));
    let map = procfs::mpi_library(pid)
        .map_err(|e| probe_err(e.to_string()))?
        .ok_or(RecordError::NotMpi(pid))?;
    let host_path = map.host_path(pid);
    // A user's file: opened as mapped, within the size cap, never blocking.
    let lib = symbols::LibraryCache::global()
        .get_mapped(pid, &map)
        .map_err(|e| probe_err(e.to_string()))?;
    let dt = datatypes::inspect(pid, &lib, &map);
    // Attached untraced: tracing starts for the whole rank at once
    // ([`trace_on`]) once every probe is in, so no function's calls are
    // recorded for longer than another's.
    let config = datatypes::proc_config(&lib, &dt, true);
    let ids = functions::select(None).map_err(|e| probe_err(e.to_string()))?;
    p.attach(pid, &host_path, &map, &lib, config, &dt.sizes, &ids)
        .map_err(|e| probe_err(e.to_string()))
}

/// Turns tracing on or off for every probed rank: the entry probes mark
/// the calls that begin while it is on.
fn trace_on(t: &mut Traced, on: bool) {
    for (pid, _) in &t.attached {
        // A rank that exited has no configuration left to change.
        let _ = t.probes.update_config(*pid, |c| c.trace = u32::from(on));
    }
}

/// Stops every recording: the shims go idle, the probes come off.
fn stop_all(list: &mut [Target], probes: &mut Option<Traced>) {
    for t in list.iter_mut() {
        if let Source::Shim(s) = &mut t.source {
            s.stop();
        }
    }
    if let Some(t) = probes.as_mut() {
        // Calls that began traced still send their record when they
        // return; the last drain takes them before the probes go.
        trace_on(t, false);
        std::thread::sleep(DRAIN_EVERY);
        for (pid, a) in t.attached.drain(..) {
            t.probes.detach(pid, a);
        }
        t.probes.finish_detaching();
    }
}

/// Moves every pending event into the slice, and what the slice lets go
/// into the archive.
fn drain(
    list: &mut [Target],
    probes: &mut Option<Traced>,
    archive: &mut Archive,
    comms: &mut Comms,
    tally: &mut Tally,
    slice: &mut Slice,
) -> Result<(), RecordError> {
    for (i, t) in list.iter_mut().enumerate() {
        let Source::Shim(s) = &mut t.source else {
            continue;
        };
        // Definitions first: a communicator may be announced by one thread
        // and used by another in the same batch.
        let mut batch: Vec<(u32, TraceEvent)> = Vec::new();
        if let Err(e) = s.drain(|tid, ev| batch.push((tid, *ev))) {
            // The batch may hold zeros from a vanished page: not written.
            if !t.lost {
                t.lost = true;
                t.exited = true;
                slice.lose(i);
                log::warn!(
                    "rank {} (pid {}): {e}; the other ranks are still recorded",
                    t.rank,
                    t.pid
                );
            }
            continue;
        }
        for (_, ev) in batch.iter().filter(|(_, e)| is_definition(e)) {
            define(t, ev, archive, comms);
        }
        for (tid, ev) in batch.iter().filter(|(_, e)| !is_definition(e)) {
            slice.push(i, *tid, ev);
            tally.taken += 1;
        }
    }
    slice.flush(&mut |i, tid, ev| put(&mut list[i], archive, tally, tid, ev))?;
    if let Some(tr) = probes.as_mut() {
        while let Some(item) = tr.ring.next() {
            if item.len() < size_of::<TraceCall>() {
                continue;
            }
            // SAFETY: the programs write whole `TraceCall`s; read unaligned.
            let c: TraceCall = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            let Some(t) = list.iter_mut().find(|t| t.pid == c.tgid) else {
                continue;
            };
            let region = c.func;
            t.write(archive, c.tid, c.start_ns, &Event::Enter { region })?;
            t.write(archive, c.tid, c.end_ns, &Event::Leave { region })?;
            tally.events += 2;
            tally.taken += 2;
        }
    }
    Ok(())
}

/// Writes shim event `ev` of thread `tid` of `t` into the archive, if the
/// archive has an event for it and it keeps the thread well-formed.
fn put(
    t: &mut Target,
    archive: &mut Archive,
    tally: &mut Tally,
    tid: u32,
    ev: &TraceEvent,
) -> Result<(), archive::ArchiveError> {
    if let Some(e) = convert(t, ev, tally) {
        if t.write(archive, tid, ev.t_ns, &e)? {
            tally.events += 1;
        } else {
            tally.outside += 1;
        }
    }
    Ok(())
}

fn is_definition(e: &TraceEvent) -> bool {
    matches!(Kind::of(e), Some(Kind::CommDef | Kind::CommRanks))
}

/// Takes in a communicator definition record; once complete, the
/// communicator gets the archive's id of its world ranks (the same
/// communicator seen from every rank becomes one definition).
fn define(t: &mut Target, ev: &TraceEvent, archive: &mut Archive, comms: &mut Comms) {
    match Kind::of(ev) {
        Some(Kind::CommDef) => {
            let size = ev.peer.max(0) as u32;
            t.defining
                .insert(ev.comm, (size, Vec::with_capacity(size as usize)));
        }
        Some(Kind::CommRanks) => {
            let Some((size, ranks)) = t.defining.get_mut(&ev.comm) else {
                return;
            };
            let first = ev.peer.max(0) as usize;
            if first != ranks.len() {
                // Out of order or lost: start over at the next definition.
                return;
            }
            let want = (*size as usize - first).min(observer_common::trace::RANKS_PER_RECORD);
            ranks.extend(ev.comm_ranks().iter().take(want));
            if ranks.len() == *size as usize {
                let ranks = std::mem::take(ranks);
                t.defining.remove(&ev.comm);
                if let Some(id) = comms.id(ranks, archive) {
                    t.comms.insert(ev.comm, id);
                }
            }
        }
        _ => {}
    }
}

/// A shim record as an archive event; `None` for kinds the archive has no
/// event for.
fn convert(t: &Target, ev: &TraceEvent, tally: &mut Tally) -> Option<Event> {
    let comm = match t.comms.get(&ev.comm) {
        Some(&c) => c,
        None => {
            tally.unresolved += 1;
            0
        }
    };
    let peer = ev.peer.max(0) as u32;
    let tag = ev.tag as u32;
    Some(match Kind::of(ev)? {
        Kind::Enter => Event::Enter {
            region: u32::from(ev.func),
        },
        Kind::Leave => Event::Leave {
            region: u32::from(ev.func),
        },
        Kind::MpiSend => Event::MpiSend {
            receiver: peer,
            comm,
            tag,
            len: ev.bytes,
        },
        Kind::MpiRecv => Event::MpiRecv {
            sender: peer,
            comm,
            tag,
            len: ev.bytes,
        },
        Kind::MpiIsend => Event::MpiIsend {
            receiver: peer,
            comm,
            tag,
            len: ev.bytes,
            request: ev.request,
        },
        Kind::MpiIsendComplete => Event::MpiIsendComplete {
            request: ev.request,
        },
        Kind::MpiIrecvRequest => Event::MpiIrecvRequest {
            request: ev.request,
        },
        Kind::MpiIrecv => Event::MpiIrecv {
            sender: peer,
            comm,
            tag,
            len: ev.bytes,
            request: ev.request,
        },
        Kind::MpiRequestCancelled => Event::MpiRequestCancelled {
            request: ev.request,
        },
        // Begin and End both, or neither: a collective OTF2 has no
        // operation for is its Enter and Leave only.
        Kind::CollectiveBegin => {
            collective_op(ev.func)?;
            Event::MpiCollectiveBegin
        }
        Kind::CollectiveEnd => Event::MpiCollectiveEnd {
            op: collective_op(ev.func)?,
            comm,
            root: (ev.peer >= 0).then_some(peer),
            sent: ev.bytes,
            received: ev.bytes2,
        },
        Kind::CommDef | Kind::CommRanks | Kind::WorldMark => return None,
    })
}

/// Every MPI function as a region, indexed by its `FunctionId`.
fn regions() -> Vec<RegionDef> {
    FUNCTIONS
        .iter()
        .map(|f| RegionDef {
            name: f.name.to_string(),
            role: region_role(f),
        })
        .collect()
}

/// OTF2's role of an MPI function, from its family and the collective it
/// performs (observer-common's `FUNCTIONS`, generated from the spec): the
/// barriers are barriers whatever their family.
fn region_role(f: &FunctionInfo) -> RegionRole {
    match (f.family, f.collective) {
        (_, Some(C::Barrier)) => RegionRole::Barrier,
        (Family::PointToPoint, _) => RegionRole::Point2Point,
        (Family::Collective, Some(C::Bcast | C::Scatter | C::Scatterv)) => RegionRole::CollOne2All,
        (Family::Collective, Some(C::Gather | C::Gatherv | C::Reduce)) => RegionRole::CollAll2One,
        (Family::Collective, _) => RegionRole::CollAll2All,
        _ => RegionRole::Function,
    }
}

/// OTF2's collective operation of an MPI function; `None` for those OTF2
/// has no operation for (the neighbourhood collectives). No wildcard arm:
/// a new kind of collective must be decided here.
fn collective_op(func: u16) -> Option<CollectiveOp> {
    Some(match FUNCTIONS.get(usize::from(func))?.collective? {
        C::Barrier => CollectiveOp::Barrier,
        C::Bcast => CollectiveOp::Bcast,
        C::Gather => CollectiveOp::Gather,
        C::Gatherv => CollectiveOp::Gatherv,
        C::Scatter => CollectiveOp::Scatter,
        C::Scatterv => CollectiveOp::Scatterv,
        C::Allgather => CollectiveOp::Allgather,
        C::Allgatherv => CollectiveOp::Allgatherv,
        C::Alltoall => CollectiveOp::Alltoall,
        C::Alltoallv => CollectiveOp::Alltoallv,
        C::Alltoallw => CollectiveOp::Alltoallw,
        C::Allreduce => CollectiveOp::Allreduce,
        C::Reduce => CollectiveOp::Reduce,
        C::ReduceScatter => CollectiveOp::ReduceScatter,
        C::ReduceScatterBlock => CollectiveOp::ReduceScatterBlock,
        C::Scan => CollectiveOp::Scan,
        C::Exscan => CollectiveOp::Exscan,
        C::NeighborAllgather
        | C::NeighborAllgatherv
        | C::NeighborAlltoall
        | C::NeighborAlltoallv
        | C::NeighborAlltoallw => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(name: &str) -> u16 {
        FUNCTIONS.iter().position(|f| f.name == name).unwrap() as u16
    }

    #[test]
    fn collective_names() {
        let op = |n| collective_op(id(n));
        assert_eq!(op("MPI_Bcast"), Some(CollectiveOp::Bcast));
        assert_eq!(op("MPI_Ibcast"), Some(CollectiveOp::Bcast));
        assert_eq!(op("MPI_Bcast_init"), Some(CollectiveOp::Bcast));
        assert_eq!(op("MPI_Allreduce"), Some(CollectiveOp::Allreduce));
        assert_eq!(
            op("MPI_Reduce_scatter_block"),
            Some(CollectiveOp::ReduceScatterBlock)
        );
        assert_eq!(op("MPI_Neighbor_alltoall"), None);
        assert_eq!(op("MPI_Send"), None);
    }

    #[test]
    fn roles() {
        let r = regions();
        assert_eq!(r.len(), FUNCTIONS.len());
        assert!(matches!(
            r[usize::from(id("MPI_Barrier"))].role,
            RegionRole::Barrier
        ));
        assert!(matches!(
            r[usize::from(id("MPI_Send"))].role,
            RegionRole::Point2Point
        ));
        assert!(matches!(
            r[usize::from(id("MPI_Bcast"))].role,
            RegionRole::CollOne2All
        ));
        assert!(matches!(
            r[usize::from(id("MPI_Comm_rank"))].role,
            RegionRole::Function
        ));
    }
}
