//! Writes one OTF2 archive (`DIR/NAME.otf2`, `DIR/NAME.def`, `DIR/NAME/`)
//! through the reference C library, from events handed over one at a time.
//!
//! How the trace is laid out, following the OTF2 3.0 definitions
//! (`/usr/include/otf2/OTF2_Definitions.h`, `OTF2_GlobalDefWriter.h`) and its
//! MPI writer example:
//! - one SystemTreeNode per host (class `node`) under one root (class
//!   `machine`);
//! - one LocationGroup per rank, of type PROCESS, named `MPI Rank N`, whose id
//!   is N: OTF2 asks that the process ids match the MPI ranks when a
//!   COMM_LOCATIONS group is present;
//! - one Location (CPU_THREAD) per thread: `Master thread` for thread 0,
//!   `Thread k` otherwise. Its id is `k << 32 | N`, so a rank's master
//!   location is N. Ids cannot be dense: OTF2 names an event file after its
//!   location on the first buffer flush, long before every thread of every
//!   rank is known;
//! - one COMM_LOCATIONS group (paradigm MPI) whose entry i is the master
//!   location of world rank i, then per communicator a COMM_GROUP listing its
//!   members as world ranks (indexes into that group) and a Comm over it;
//!   this is how a reader turns a peer "rank in comm" into a world rank;
//! - clocks in nanoseconds, the offset the earliest timestamp, the realtime of
//!   that offset given by the caller.
//!
//! World ranks that no rank or event declared but that a communicator lists
//! (a `--pid` subset of a job) still get their LocationGroup and an empty
//! master Location: the COMM_LOCATIONS index must be the world rank.
//!
//! OTF2 reports errors through a process-wide callback, and some failures
//! (writing the anchor file at close) only there: the module installs its own
//! callback, which keeps the messages for the calling thread instead of
//! printing them, and turns them into one [`ArchiveError`].

use std::collections::{BTreeMap, BTreeSet, HashMap, hash_map};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;

use otf2_sys as sys;

mod callbacks;
mod definitions;
mod types;

pub use callbacks::ArchiveError;
use callbacks::{FLUSH_CALLBACKS, check, install_error_handler, otf2_error, take_errors};
use definitions::Definitions;
pub use types::{CollectiveOp, CommDef, Event, RankDef, RegionDef, RegionRole, Summary};

/// Ranks are below this. It bounds the COMM_LOCATIONS group, which is one
/// definition record and must fit in one 16 MiB definition chunk (OTF2's
/// largest) at up to 9 bytes a member.
pub const MAX_RANKS: u32 = 1 << 20;

/// The independent reader (python3-otf2) the tests run on an archive; it
/// prints a JSON summary. See the file for its shape.
pub const READ_OTF2_PY: &str = include_str!("../read_otf2.py");

/// The name of the metric that carries a rank's dropped events.
pub const DROPPED_METRIC_NAME: &str = "dropped_events";

/// The metric class (and member) of [`DROPPED_METRIC_NAME`].
const DROPPED_METRIC: sys::OTF2_MetricRef = 0;

/// Clock ticks per second: timestamps are nanoseconds.
const TICKS_PER_SECOND: u64 = 1_000_000_000;

/// The location of a rank's thread; thread 0 is the master thread, whose
/// location is the rank.
fn location_ref(rank: u32, thread: u32) -> sys::OTF2_LocationRef {
    (u64::from(thread) << 32) | u64::from(rank)
}

/// One thread's event stream.
struct Location {
    writer: *mut sys::OTF2_EvtWriter,
    /// The last timestamp written.
    last: u64,
    /// Records written (Location's `numberOfEvents`).
    records: u64,
}

/// What is known of a rank; `node` is `None` until [`Archive::add_rank`].
#[derive(Default)]
struct Rank {
    node: Option<String>,
    pid: u32,
}

/// An OTF2 archive being written. See the module documentation for its
/// layout. Dropping it without [`Archive::finish`] still closes a valid
/// archive, with no realtime in its clock properties.
pub struct Archive {
    /// Null once closed.
    raw: *mut sys::OTF2_Archive,
    anchor: PathBuf,
    regions: Vec<RegionDef>,
    ranks: BTreeMap<u32, Rank>,
    locations: HashMap<sys::OTF2_LocationRef, Location>,
    comms: BTreeMap<u32, CommDef>,
    /// Caller's communicator id → OTF2 Comm id, dense, in order of first use.
    comm_refs: HashMap<u32, sys::OTF2_CommRef>,
    events: BTreeMap<u32, u64>,
    dropped: BTreeMap<u32, u64>,
    clamped: u64,
    span: Option<(u64, u64)>,
}

impl std::fmt::Debug for Archive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archive")
            .field("anchor", &self.anchor)
            .field("open", &!self.raw.is_null())
            .field("ranks", &self.ranks.len())
            .field("locations", &self.locations.len())
            .field("comms", &self.comms.len())
            .field("events", &self.events.values().sum::<u64>())
            .finish()
    }
}

// SAFETY: OTF2 handles have no thread affinity (there are no locking
// callbacks, and none are needed: every use goes through `&mut self`), and
// errors are kept per thread, for the thread that makes the call.
unsafe impl Send for Archive {}

impl Archive {
    /// Creates `DIR/NAME.otf2`, with `DIR/NAME.def` and `DIR/NAME/` (made at
    /// [`Archive::finish`]), creating DIR if need be. Refuses if any of the
    /// three exists.
    pub fn create(
        dir: &Path,
        name: &str,
        creator: &str,
        regions: Vec<RegionDef>,
    ) -> Result<Archive, ArchiveError> {
        if name.is_empty() || name.contains(['/', '\0']) || name == "." || name == ".." {
            return Err(ArchiveError::BadName {
                name: name.to_string(),
            });
        }
        let anchor = dir.join(format!("{name}.otf2"));
        for path in [
            anchor.clone(),
            dir.join(format!("{name}.def")),
            dir.join(name),
        ] {
            if path.symlink_metadata().is_ok() {
                return Err(ArchiveError::Exists { path });
            }
        }
        std::fs::create_dir_all(dir).map_err(|source| ArchiveError::CreateDir {
            dir: dir.to_path_buf(),
            source,
        })?;
        let c_dir =
            CString::new(dir.as_os_str().as_bytes()).map_err(|_| ArchiveError::CreateDir {
                dir: dir.to_path_buf(),
                source: io::Error::new(io::ErrorKind::InvalidInput, "the path holds a NUL byte"),
            })?;
        // OTF2 would find out only when it writes, and then say less.
        // SAFETY: c_dir is NUL-terminated.
        if unsafe { libc::access(c_dir.as_ptr(), libc::W_OK | libc::X_OK) } != 0 {
            return Err(ArchiveError::NotWritable {
                dir: dir.to_path_buf(),
                source: io::Error::last_os_error(),
            });
        }
        let c_name = c_string(name);

        install_error_handler();
        take_errors();
        // The definition chunk size is set at finish, when the largest
        // record (the COMM_LOCATIONS group) is known.
        // SAFETY: both strings are NUL-terminated and outlive the call.
        let raw = unsafe {
            sys::OTF2_Archive_Open(
                c_dir.as_ptr(),
                c_name.as_ptr(),
                sys::OTF2_FILEMODE_WRITE,
                sys::OTF2_CHUNK_SIZE_EVENTS_DEFAULT,
                sys::OTF2_UNDEFINED_UINT64,
                sys::OTF2_SUBSTRATE_POSIX,
                sys::OTF2_COMPRESSION_NONE,
            )
        };
        if raw.is_null() {
            return Err(otf2_error(&anchor, "OTF2_Archive_Open", None));
        }
        let mut archive = Archive {
            raw,
            anchor,
            regions,
            ranks: BTreeMap::new(),
            locations: HashMap::new(),
            comms: BTreeMap::new(),
            comm_refs: HashMap::new(),
            events: BTreeMap::new(),
            dropped: BTreeMap::new(),
            clamped: 0,
            span: None,
        };
        if let Err(e) = archive.set_up(creator) {
            // Nothing to keep: close the handle without writing definitions.
            // SAFETY: raw is open, and not used after.
            unsafe { sys::OTF2_Archive_Close(archive.raw) };
            archive.raw = ptr::null_mut();
            take_errors();
            return Err(e);
        }
        Ok(archive)
    }

    fn set_up(&mut self, creator: &str) -> Result<(), ArchiveError> {
        let creator = c_string(creator);
        let description =
            c_string("MPI events of running ranks, recorded on demand by mpi-observer");
        let a = self.raw;
        // SAFETY: a is an open archive in write mode; the callbacks are a
        // static; the strings are NUL-terminated and OTF2 copies them.
        unsafe {
            check(
                &self.anchor,
                "OTF2_Archive_SetFlushCallbacks",
                sys::OTF2_Archive_SetFlushCallbacks(a, &FLUSH_CALLBACKS, ptr::null_mut()),
            )?;
            // Serial: this one process writes every location. This call
            // also creates the directories.
            check(
                &self.anchor,
                "OTF2_Archive_SetSerialCollectiveCallbacks",
                sys::OTF2_Archive_SetSerialCollectiveCallbacks(a),
            )?;
            check(
                &self.anchor,
                "OTF2_Archive_SetCreator",
                sys::OTF2_Archive_SetCreator(a, creator.as_ptr()),
            )?;
            check(
                &self.anchor,
                "OTF2_Archive_SetDescription",
                sys::OTF2_Archive_SetDescription(a, description.as_ptr()),
            )?;
            check(
                &self.anchor,
                "OTF2_Archive_OpenEvtFiles",
                sys::OTF2_Archive_OpenEvtFiles(a),
            )
        }
    }

    /// The anchor file, `DIR/NAME.otf2`.
    pub fn anchor(&self) -> &Path {
        &self.anchor
    }

    /// Adds a trace file property to the anchor file (`NAMESPACE::NAME`,
    /// `[A-Z0-9_]`, case-insensitive), replacing one of the same name.
    pub fn set_property(&mut self, name: &str, value: &str) -> Result<(), ArchiveError> {
        let (n, v) = (c_string(name), c_string(value));
        // SAFETY: raw is open (only finish/drop close it); NUL-terminated strings.
        let code = unsafe { sys::OTF2_Archive_SetProperty(self.raw, n.as_ptr(), v.as_ptr(), true) };
        check(&self.anchor, "OTF2_Archive_SetProperty", code)
    }

    /// Declares a rank (its host and pid), before or after its events; a
    /// second declaration of the same rank replaces the first. An empty host
    /// name becomes `unknown`; a rank never declared hangs from the root of
    /// the system tree.
    pub fn add_rank(&mut self, def: RankDef) -> Result<(), ArchiveError> {
        check_rank(def.rank)?;
        let node = if def.node.is_empty() {
            "unknown".to_string()
        } else {
            def.node
        };
        self.ranks.insert(
            def.rank,
            Rank {
                node: Some(node),
                pid: def.pid,
            },
        );
        self.events.entry(def.rank).or_insert(0);
        Ok(())
    }

    /// Declares or replaces a communicator, any time before
    /// [`Archive::finish`]. Its members must be distinct world ranks; id 0
    /// must be `MPI_COMM_WORLD`, listing `0..size` in order.
    pub fn add_comm(&mut self, def: CommDef) -> Result<(), ArchiveError> {
        let bad = |why: String| ArchiveError::BadComm {
            id: def.id,
            name: def.name.clone(),
            why,
        };
        if def.id == 0
            && def
                .world_ranks
                .iter()
                .enumerate()
                .any(|(i, &r)| r as usize != i)
        {
            return Err(bad(
                "id 0 is MPI_COMM_WORLD, whose rank i is world rank i".to_string()
            ));
        }
        if def.world_ranks.len() > MAX_RANKS as usize {
            return Err(bad(format!("more than {MAX_RANKS} members")));
        }
        let mut seen = BTreeSet::new();
        for &r in &def.world_ranks {
            if r >= MAX_RANKS {
                return Err(bad(format!("world rank {r} is not below {MAX_RANKS}")));
            }
            if !seen.insert(r) {
                return Err(bad(format!("world rank {r} is listed twice")));
            }
        }
        self.comm_ref(def.id);
        self.comms.insert(def.id, def);
        Ok(())
    }

    /// Appends an event of thread `thread` (0 = master) of `rank`, at `t_ns`
    /// nanoseconds since the caller's epoch. Timestamps must not decrease on
    /// one thread: a lower one is written as the previous one and counted in
    /// [`Summary::clamped`]. A rank not declared yet is declared with an
    /// unknown host.
    pub fn event(
        &mut self,
        rank: u32,
        thread: u32,
        t_ns: u64,
        ev: &Event,
    ) -> Result<(), ArchiveError> {
        check_rank(rank)?;
        if let Event::Enter { region } | Event::Leave { region } = *ev
            && region as usize >= self.regions.len()
        {
            return Err(ArchiveError::UnknownRegion {
                region,
                regions: self.regions.len(),
            });
        }
        let comm = match *ev {
            Event::MpiSend { comm, .. }
            | Event::MpiRecv { comm, .. }
            | Event::MpiIsend { comm, .. }
            | Event::MpiIrecv { comm, .. }
            | Event::MpiCollectiveEnd { comm, .. } => self.comm_ref(comm),
            _ => sys::OTF2_UNDEFINED_COMM,
        };
        let (w, t) = self.slot(rank, thread, t_ns)?;
        let al = ptr::null_mut();
        // SAFETY: w is this location's open event writer (slot got it; only
        // close() closes it); a null attribute list means none.
        let (call, code) = unsafe {
            match *ev {
                Event::Enter { region } => (
                    "OTF2_EvtWriter_Enter",
                    sys::OTF2_EvtWriter_Enter(w, al, t, region),
                ),
                Event::Leave { region } => (
                    "OTF2_EvtWriter_Leave",
                    sys::OTF2_EvtWriter_Leave(w, al, t, region),
                ),
                Event::MpiSend {
                    receiver, tag, len, ..
                } => (
                    "OTF2_EvtWriter_MpiSend",
                    sys::OTF2_EvtWriter_MpiSend(w, al, t, receiver, comm, tag, len),
                ),
                Event::MpiRecv {
                    sender, tag, len, ..
                } => (
                    "OTF2_EvtWriter_MpiRecv",
                    sys::OTF2_EvtWriter_MpiRecv(w, al, t, sender, comm, tag, len),
                ),
                Event::MpiIsend {
                    receiver,
                    tag,
                    len,
                    request,
                    ..
                } => (
                    "OTF2_EvtWriter_MpiIsend",
                    sys::OTF2_EvtWriter_MpiIsend(w, al, t, receiver, comm, tag, len, request),
                ),
                Event::MpiIsendComplete { request } => (
                    "OTF2_EvtWriter_MpiIsendComplete",
                    sys::OTF2_EvtWriter_MpiIsendComplete(w, al, t, request),
                ),
                Event::MpiIrecvRequest { request } => (
                    "OTF2_EvtWriter_MpiIrecvRequest",
                    sys::OTF2_EvtWriter_MpiIrecvRequest(w, al, t, request),
                ),
                Event::MpiIrecv {
                    sender,
                    tag,
                    len,
                    request,
                    ..
                } => (
                    "OTF2_EvtWriter_MpiIrecv",
                    sys::OTF2_EvtWriter_MpiIrecv(w, al, t, sender, comm, tag, len, request),
                ),
                Event::MpiRequestTest { request } => (
                    "OTF2_EvtWriter_MpiRequestTest",
                    sys::OTF2_EvtWriter_MpiRequestTest(w, al, t, request),
                ),
                Event::MpiRequestCancelled { request } => (
                    "OTF2_EvtWriter_MpiRequestCancelled",
                    sys::OTF2_EvtWriter_MpiRequestCancelled(w, al, t, request),
                ),
                Event::MpiCollectiveBegin => (
                    "OTF2_EvtWriter_MpiCollectiveBegin",
                    sys::OTF2_EvtWriter_MpiCollectiveBegin(w, al, t),
                ),
                Event::MpiCollectiveEnd {
                    op,
                    root,
                    sent,
                    received,
                    ..
                } => (
                    "OTF2_EvtWriter_MpiCollectiveEnd",
                    sys::OTF2_EvtWriter_MpiCollectiveEnd(
                        w,
                        al,
                        t,
                        op.raw(),
                        comm,
                        root.unwrap_or(sys::OTF2_COLLECTIVE_ROOT_NONE),
                        sent,
                        received,
                    ),
                ),
            }
        };
        if code != sys::OTF2_SUCCESS {
            return Err(otf2_error(&self.anchor, call, Some(code)));
        }
        *self.events.entry(rank).or_insert(0) += 1;
        Ok(())
    }

    /// Records that `rank`'s capture has dropped `cumulative` events so far
    /// (its ring was full), as the OTF2 metric `dropped_events` (an unsigned
    /// counter, mode ACCUMULATED_START, unit `events`) on the rank's master
    /// thread at `t_ns`, so that any reader can find the gap.
    pub fn dropped(&mut self, rank: u32, t_ns: u64, cumulative: u64) -> Result<(), ArchiveError> {
        check_rank(rank)?;
        let (w, t) = self.slot(rank, 0, t_ns)?;
        let types = [sys::OTF2_TYPE_UINT64];
        let values = [sys::OTF2_MetricValue {
            unsigned_int: cumulative,
        }];
        // SAFETY: w is an open event writer; one type and one value, as the
        // metric class has one member.
        let code = unsafe {
            sys::OTF2_EvtWriter_Metric(
                w,
                ptr::null_mut(),
                t,
                DROPPED_METRIC,
                1,
                types.as_ptr(),
                values.as_ptr(),
            )
        };
        if code != sys::OTF2_SUCCESS {
            return Err(otf2_error(
                &self.anchor,
                "OTF2_EvtWriter_Metric",
                Some(code),
            ));
        }
        self.events.entry(rank).or_insert(0);
        let d = self.dropped.entry(rank).or_insert(0);
        *d = (*d).max(cumulative);
        Ok(())
    }

    /// Writes the definitions and closes every file: clock properties
    /// (nanoseconds; offset the earliest timestamp; length the span; the
    /// realtime of the offset from `epoch_realtime_ns`, the wall-clock
    /// nanoseconds since 1970 of the caller's t = 0), strings, the system
    /// tree, ranks and threads with their event counts, regions, the MPI
    /// groups and communicators, and the dropped-events metric. The archive
    /// is valid even with no events at all.
    pub fn finish(mut self, epoch_realtime_ns: u64) -> Result<Summary, ArchiveError> {
        self.close(Some(epoch_realtime_ns))
    }

    /// The OTF2 Comm id of a caller's communicator id.
    fn comm_ref(&mut self, id: u32) -> sys::OTF2_CommRef {
        let next = self.comm_refs.len() as sys::OTF2_CommRef;
        *self.comm_refs.entry(id).or_insert(next)
    }

    /// The writer of a thread (opened on first use) and the timestamp to
    /// write, counted as one record.
    fn slot(
        &mut self,
        rank: u32,
        thread: u32,
        t_ns: u64,
    ) -> Result<(*mut sys::OTF2_EvtWriter, u64), ArchiveError> {
        let loc = self.location(rank, thread)?;
        let clamped = t_ns < loc.last;
        let t = t_ns.max(loc.last);
        loc.last = t;
        loc.records += 1;
        let w = loc.writer;
        self.clamped += u64::from(clamped);
        self.span = Some(match self.span {
            None => (t, t),
            Some((a, b)) => (a.min(t), b.max(t)),
        });
        Ok((w, t))
    }

    fn location(&mut self, rank: u32, thread: u32) -> Result<&mut Location, ArchiveError> {
        self.ranks.entry(rank).or_default();
        let id = location_ref(rank, thread);
        match self.locations.entry(id) {
            hash_map::Entry::Occupied(e) => Ok(e.into_mut()),
            hash_map::Entry::Vacant(e) => {
                // SAFETY: raw is open and its event files are open.
                let writer = unsafe { sys::OTF2_Archive_GetEvtWriter(self.raw, id) };
                if writer.is_null() {
                    return Err(otf2_error(&self.anchor, "OTF2_Archive_GetEvtWriter", None));
                }
                Ok(e.insert(Location {
                    writer,
                    last: 0,
                    records: 0,
                }))
            }
        }
    }

    /// Writes what remains and closes the archive, even after a failure.
    fn close(&mut self, realtime: Option<u64>) -> Result<Summary, ArchiveError> {
        let written = self.write_definitions(realtime);
        // SAFETY: raw is open; it is not used after this.
        let code = unsafe { sys::OTF2_Archive_Close(self.raw) };
        self.raw = ptr::null_mut();
        let closed = check(&self.anchor, "OTF2_Archive_Close", code);
        take_errors();
        let summary = written?;
        closed?;
        Ok(summary)
    }

    fn write_definitions(&mut self, realtime: Option<u64>) -> Result<Summary, ArchiveError> {
        // The world: every rank seen or declared, and every world rank a
        // communicator lists; at least rank 0, which every job has, as
        // readers refuse an archive without locations.
        let world = self.ranks.keys().next_back().map_or(1, |&r| r + 1).max(
            self.comms
                .values()
                .flat_map(|c| c.world_ranks.iter())
                .max()
                .map_or(0, |&r| r + 1),
        );
        let mut unrecorded_ranks = Vec::new();
        for r in 0..world {
            if !self.ranks.contains_key(&r) {
                unrecorded_ranks.push(r);
            }
            // Every rank needs its master location (COMM_LOCATIONS lists it),
            // and every location an event file, even empty, or readers fail.
            self.location(r, 0)?;
        }
        if !self.comms.contains_key(&0) {
            self.add_comm(CommDef {
                id: 0,
                name: "MPI_COMM_WORLD".to_string(),
                world_ranks: (0..world).collect(),
            })?;
        }
        let mut undefined_comms: Vec<u32> = self
            .comm_refs
            .keys()
            .copied()
            .filter(|id| !self.comms.contains_key(id))
            .collect();
        undefined_comms.sort_unstable();

        // Event files, then the (empty) local definition files, for every
        // location, in order.
        let mut locations: Vec<(sys::OTF2_LocationRef, u64)> = self
            .locations
            .iter()
            .map(|(&id, l)| (id, l.records))
            .collect();
        locations.sort_unstable();
        let mut first_error = None;
        for (id, _) in &locations {
            let loc = &self.locations[id];
            // SAFETY: the writer is open and not used after (raw is closed next).
            let code = unsafe { sys::OTF2_Archive_CloseEvtWriter(self.raw, loc.writer) };
            if let Err(e) = check(&self.anchor, "OTF2_Archive_CloseEvtWriter", code) {
                first_error.get_or_insert(e);
            }
        }
        self.locations
            .values_mut()
            .for_each(|l| l.writer = ptr::null_mut());
        if let Some(e) = first_error {
            return Err(e);
        }
        let a = self.raw;
        let anchor = self.anchor.clone();
        let ok = |call, code| check(&anchor, call, code);
        // The largest definition record: the COMM_LOCATIONS group, up to 9
        // bytes a member; OTF2 also wants 10 bytes per location.
        let needed = (u64::from(world) * 9 + 4096).max(locations.len() as u64 * 10);
        let chunk = needed.next_multiple_of(sys::OTF2_CHUNK_SIZE_MIN).clamp(
            sys::OTF2_CHUNK_SIZE_DEFINITIONS_DEFAULT,
            sys::OTF2_CHUNK_SIZE_MAX,
        );
        // SAFETY: a is the open archive; the writers are used only between
        // their get and close (and so in the blocks below).
        unsafe {
            ok(
                "OTF2_Archive_CloseEvtFiles",
                sys::OTF2_Archive_CloseEvtFiles(a),
            )?;
            ok(
                "OTF2_Archive_SetDefChunkSize",
                sys::OTF2_Archive_SetDefChunkSize(a, chunk),
            )?;
            ok(
                "OTF2_Archive_OpenDefFiles",
                sys::OTF2_Archive_OpenDefFiles(a),
            )?;
            for &(id, _) in &locations {
                let d = sys::OTF2_Archive_GetDefWriter(a, id);
                if d.is_null() {
                    return Err(otf2_error(&anchor, "OTF2_Archive_GetDefWriter", None));
                }
                ok(
                    "OTF2_Archive_CloseDefWriter",
                    sys::OTF2_Archive_CloseDefWriter(a, d),
                )?;
            }
            ok(
                "OTF2_Archive_CloseDefFiles",
                sys::OTF2_Archive_CloseDefFiles(a),
            )?;
        }

        let defs = Definitions::new(self, world, &locations);
        // SAFETY: as above.
        let g = unsafe { sys::OTF2_Archive_GetGlobalDefWriter(a) };
        if g.is_null() {
            return Err(otf2_error(&anchor, "OTF2_Archive_GetGlobalDefWriter", None));
        }
        let (offset, length) = self.span.map_or((0, 0), |(lo, hi)| (lo, hi - lo));
        let realtime = realtime.map_or(sys::OTF2_UNDEFINED_TIMESTAMP, |e| e.saturating_add(offset));
        let written = defs.write(g, &anchor, offset, length, realtime);
        // SAFETY: g is the open global definition writer, not used after.
        let code = unsafe { sys::OTF2_Archive_CloseGlobalDefWriter(a, g) };
        written?;
        ok("OTF2_Archive_CloseGlobalDefWriter", code)?;

        Ok(Summary {
            anchor,
            events: self.events.clone(),
            dropped: self.dropped.clone(),
            clamped: self.clamped,
            unrecorded_ranks,
            undefined_comms,
            span_ns: self.span,
        })
    }
}

impl Drop for Archive {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            let _ = self.close(None);
        }
    }
}

fn check_rank(rank: u32) -> Result<(), ArchiveError> {
    if rank < MAX_RANKS {
        Ok(())
    } else {
        Err(ArchiveError::RankOutOfRange { rank })
    }
}

/// A C string of a name; NUL bytes (which C strings cannot hold) are dropped.
fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "")).unwrap_or_default()
}

#[cfg(test)]
mod tests;
