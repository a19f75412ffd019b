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

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap, hash_map};
use std::ffi::{CStr, CString, c_char, c_void};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Once;

use otf2_sys as sys;
use thiserror::Error;

/// Ranks are below this. It bounds the COMM_LOCATIONS group, which is one
/// definition record and must fit in one 16 MiB definition chunk (OTF2's
/// largest) at up to 9 bytes a member.
pub const MAX_RANKS: u32 = 1 << 20;

/// The independent reader (python3-otf2) the tests run on an archive; it
/// prints a JSON summary. See the file for its shape.
pub const READ_OTF2_PY: &str = include_str!("read_otf2.py");

/// The name of the metric that carries a rank's dropped events.
pub const DROPPED_METRIC_NAME: &str = "dropped_events";

/// The metric class (and member) of [`DROPPED_METRIC_NAME`].
const DROPPED_METRIC: sys::OTF2_MetricRef = 0;

/// Clock ticks per second: timestamps are nanoseconds.
const TICKS_PER_SECOND: u64 = 1_000_000_000;

/// One MPI rank. It becomes a LocationGroup `MPI Rank N` (type PROCESS) under
/// the SystemTreeNode of its host, with one Location per thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankDef {
    /// Rank in `MPI_COMM_WORLD`.
    pub rank: u32,
    /// Host name of its node.
    pub node: String,
    /// Process id (kept as the location group's `MPI_OBSERVER::PID` property).
    pub pid: u32,
}

/// A communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommDef {
    /// The caller's key, as used in [`Event`]s. 0 must be `MPI_COMM_WORLD`.
    pub id: u32,
    /// Its name, e.g. `MPI_COMM_WORLD` or what `MPI_Comm_set_name` gave.
    pub name: String,
    /// `world_ranks[i]` is the world rank of the communicator's rank i. For
    /// id 0: `0..size`.
    pub world_ranks: Vec<u32>,
}

/// An MPI collective operation, as OTF2 names them
/// (`OTF2_COLLECTIVE_OP_*`; OTF2 has no "other").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectiveOp {
    /// `MPI_Barrier`.
    Barrier,
    /// `MPI_Bcast`.
    Bcast,
    /// `MPI_Gather`.
    Gather,
    /// `MPI_Gatherv`.
    Gatherv,
    /// `MPI_Scatter`.
    Scatter,
    /// `MPI_Scatterv`.
    Scatterv,
    /// `MPI_Allgather`.
    Allgather,
    /// `MPI_Allgatherv`.
    Allgatherv,
    /// `MPI_Alltoall`.
    Alltoall,
    /// `MPI_Alltoallv`.
    Alltoallv,
    /// `MPI_Alltoallw`.
    Alltoallw,
    /// `MPI_Allreduce`.
    Allreduce,
    /// `MPI_Reduce`.
    Reduce,
    /// `MPI_Reduce_scatter`.
    ReduceScatter,
    /// `MPI_Reduce_scatter_block`.
    ReduceScatterBlock,
    /// `MPI_Scan`.
    Scan,
    /// `MPI_Exscan`.
    Exscan,
    /// Collectively create a handle (`MPI_Comm_split`, `MPI_Comm_dup`, ...).
    CreateHandle,
    /// Collectively destroy a handle (`MPI_Comm_free`, ...).
    DestroyHandle,
    /// Collectively allocate memory.
    Allocate,
    /// Collectively free memory.
    Deallocate,
    /// Collectively create a handle and allocate memory (`MPI_Win_allocate`).
    CreateHandleAndAllocate,
    /// Collectively destroy a handle and free memory.
    DestroyHandleAndDeallocate,
}

impl CollectiveOp {
    fn raw(self) -> sys::OTF2_CollectiveOp {
        use CollectiveOp::*;
        match self {
            Barrier => sys::OTF2_COLLECTIVE_OP_BARRIER,
            Bcast => sys::OTF2_COLLECTIVE_OP_BCAST,
            Gather => sys::OTF2_COLLECTIVE_OP_GATHER,
            Gatherv => sys::OTF2_COLLECTIVE_OP_GATHERV,
            Scatter => sys::OTF2_COLLECTIVE_OP_SCATTER,
            Scatterv => sys::OTF2_COLLECTIVE_OP_SCATTERV,
            Allgather => sys::OTF2_COLLECTIVE_OP_ALLGATHER,
            Allgatherv => sys::OTF2_COLLECTIVE_OP_ALLGATHERV,
            Alltoall => sys::OTF2_COLLECTIVE_OP_ALLTOALL,
            Alltoallv => sys::OTF2_COLLECTIVE_OP_ALLTOALLV,
            Alltoallw => sys::OTF2_COLLECTIVE_OP_ALLTOALLW,
            Allreduce => sys::OTF2_COLLECTIVE_OP_ALLREDUCE,
            Reduce => sys::OTF2_COLLECTIVE_OP_REDUCE,
            ReduceScatter => sys::OTF2_COLLECTIVE_OP_REDUCE_SCATTER,
            ReduceScatterBlock => sys::OTF2_COLLECTIVE_OP_REDUCE_SCATTER_BLOCK,
            Scan => sys::OTF2_COLLECTIVE_OP_SCAN,
            Exscan => sys::OTF2_COLLECTIVE_OP_EXSCAN,
            CreateHandle => sys::OTF2_COLLECTIVE_OP_CREATE_HANDLE,
            DestroyHandle => sys::OTF2_COLLECTIVE_OP_DESTROY_HANDLE,
            Allocate => sys::OTF2_COLLECTIVE_OP_ALLOCATE,
            Deallocate => sys::OTF2_COLLECTIVE_OP_DEALLOCATE,
            CreateHandleAndAllocate => sys::OTF2_COLLECTIVE_OP_CREATE_HANDLE_AND_ALLOCATE,
            DestroyHandleAndDeallocate => sys::OTF2_COLLECTIVE_OP_DESTROY_HANDLE_AND_DEALLOCATE,
        }
    }
}

/// The role of a region (`OTF2_REGION_ROLE_*`), which tells a viewer what
/// kind of MPI call it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RegionRole {
    /// Unknown.
    Unknown,
    /// A function that is none of the below (`MPI_Init`, `MPI_Wait`, ...).
    Function,
    /// A wrapper around another function.
    Wrapper,
    /// A barrier.
    Barrier,
    /// One to all: Bcast, Scatter(v).
    CollOne2All,
    /// All to one: Gather(v), Reduce.
    CollAll2One,
    /// All to all: Allreduce, Allgather(v), Alltoall(v/w), Reduce_scatter.
    CollAll2All,
    /// Another collective: Scan, Exscan.
    CollOther,
    /// Point-to-point: Send, Recv, Isend, Irecv, Sendrecv, ...
    Point2Point,
    /// File I/O.
    FileIo,
    /// File I/O metadata: open, close, seek.
    FileIoMetadata,
    /// One-sided communication.
    Rma,
    /// A region made up by the measurement.
    Artificial,
    /// Memory allocation (`MPI_Alloc_mem`).
    Allocate,
    /// Memory release (`MPI_Free_mem`).
    Deallocate,
}

impl RegionRole {
    fn raw(self) -> sys::OTF2_RegionRole {
        use RegionRole::*;
        match self {
            Unknown => sys::OTF2_REGION_ROLE_UNKNOWN,
            Function => sys::OTF2_REGION_ROLE_FUNCTION,
            Wrapper => sys::OTF2_REGION_ROLE_WRAPPER,
            Barrier => sys::OTF2_REGION_ROLE_BARRIER,
            CollOne2All => sys::OTF2_REGION_ROLE_COLL_ONE2ALL,
            CollAll2One => sys::OTF2_REGION_ROLE_COLL_ALL2ONE,
            CollAll2All => sys::OTF2_REGION_ROLE_COLL_ALL2ALL,
            CollOther => sys::OTF2_REGION_ROLE_COLL_OTHER,
            Point2Point => sys::OTF2_REGION_ROLE_POINT2POINT,
            FileIo => sys::OTF2_REGION_ROLE_FILE_IO,
            FileIoMetadata => sys::OTF2_REGION_ROLE_FILE_IO_METADATA,
            Rma => sys::OTF2_REGION_ROLE_RMA,
            Artificial => sys::OTF2_REGION_ROLE_ARTIFICIAL,
            Allocate => sys::OTF2_REGION_ROLE_ALLOCATE,
            Deallocate => sys::OTF2_REGION_ROLE_DEALLOCATE,
        }
    }
}

/// A region (an MPI function), of paradigm MPI. Its index in the list given
/// to [`Archive::create`] is its id in [`Event::Enter`] and [`Event::Leave`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionDef {
    /// Its name, e.g. `MPI_Send`.
    pub name: String,
    /// What kind of call it is.
    pub role: RegionRole,
}

/// One event of one thread of one rank.
///
/// Peers and roots are ranks in `comm` (as OTF2's MpiSend and MpiRecv define
/// them); `comm` is a [`CommDef::id`]; request ids are the caller's, unique
/// among a rank's requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Entering a region.
    Enter {
        /// Index in the region list.
        region: u32,
    },
    /// Leaving a region.
    Leave {
        /// Index in the region list.
        region: u32,
    },
    /// A blocking send was started.
    MpiSend {
        /// Destination, a rank in `comm`.
        receiver: u32,
        /// Communicator id.
        comm: u32,
        /// Tag.
        tag: u32,
        /// Bytes.
        len: u64,
    },
    /// A blocking receive completed (at its actual source).
    MpiRecv {
        /// Source, a rank in `comm`.
        sender: u32,
        /// Communicator id.
        comm: u32,
        /// Tag.
        tag: u32,
        /// Bytes.
        len: u64,
    },
    /// A nonblocking send was started.
    MpiIsend {
        /// Destination, a rank in `comm`.
        receiver: u32,
        /// Communicator id.
        comm: u32,
        /// Tag.
        tag: u32,
        /// Bytes.
        len: u64,
        /// Request id.
        request: u64,
    },
    /// A nonblocking send completed.
    MpiIsendComplete {
        /// Request id of its MpiIsend.
        request: u64,
    },
    /// A nonblocking receive was posted.
    MpiIrecvRequest {
        /// Request id.
        request: u64,
    },
    /// A nonblocking receive completed (at its actual source).
    MpiIrecv {
        /// Source, a rank in `comm`.
        sender: u32,
        /// Communicator id.
        comm: u32,
        /// Tag.
        tag: u32,
        /// Bytes.
        len: u64,
        /// Request id of its MpiIrecvRequest.
        request: u64,
    },
    /// A request was tested and had not completed.
    MpiRequestTest {
        /// Request id.
        request: u64,
    },
    /// A request was cancelled.
    MpiRequestCancelled {
        /// Request id.
        request: u64,
    },
    /// A collective operation begins.
    MpiCollectiveBegin,
    /// A collective operation ends.
    MpiCollectiveEnd {
        /// Which one.
        op: CollectiveOp,
        /// Communicator id.
        comm: u32,
        /// Its root, a rank in `comm`; `None` for rootless operations.
        root: Option<u32>,
        /// Bytes this rank sent.
        sent: u64,
        /// Bytes this rank received.
        received: u64,
    },
}

/// What [`Archive::finish`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// The anchor file, `DIR/NAME.otf2`: what readers open.
    pub anchor: PathBuf,
    /// Events written by [`Archive::event`] per rank (all its threads), for
    /// every rank declared or seen, 0 included. The dropped-events metric
    /// records are not counted here.
    pub events: BTreeMap<u32, u64>,
    /// The highest cumulative count given to [`Archive::dropped`], per rank
    /// that reported one.
    pub dropped: BTreeMap<u32, u64>,
    /// Events whose timestamp was below the previous one of their thread, and
    /// were written at that previous timestamp instead.
    pub clamped: u64,
    /// World ranks that only a communicator listed: defined with no events.
    pub unrecorded_ranks: Vec<u32>,
    /// Communicator ids that events used but [`Archive::add_comm`] never
    /// defined: written with an empty group, named `comm N (undefined)`.
    pub undefined_comms: Vec<u32>,
    /// The earliest and latest timestamps written, if any.
    pub span_ns: Option<(u64, u64)>,
}

/// Why an archive could not be created or written.
#[derive(Debug, Error)]
pub enum ArchiveError {
    /// The archive name cannot name files in one directory.
    #[error(
        "bad OTF2 archive name {name:?}: it names DIR/NAME.otf2, so it must be non-empty, without '/' or NUL"
    )]
    BadName {
        /// The name given.
        name: String,
    },
    /// One of the archive's paths already exists; nothing is overwritten.
    #[error("{path} already exists: refusing to overwrite a trace; choose another directory")]
    Exists {
        /// The path.
        path: PathBuf,
    },
    /// The output directory could not be created.
    #[error("cannot create the trace directory {dir}: {source}")]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The output directory exists but cannot be written.
    #[error("cannot write in the trace directory {dir}: {source}")]
    NotWritable {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A rank at or above [`MAX_RANKS`].
    #[error("rank {rank} is out of range: a trace holds ranks below {MAX_RANKS}")]
    RankOutOfRange {
        /// The rank.
        rank: u32,
    },
    /// An Enter or Leave of a region that is not in the list.
    #[error("region {region} is not defined: the archive has {regions} regions")]
    UnknownRegion {
        /// The region id.
        region: u32,
        /// How many regions there are.
        regions: usize,
    },
    /// A communicator definition that cannot be written.
    #[error("bad communicator {id} ({name}): {why}")]
    BadComm {
        /// Its id.
        id: u32,
        /// Its name.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// The OTF2 library failed.
    #[error("cannot write the OTF2 archive {anchor}: {message} (in {call})")]
    Otf2 {
        /// The anchor file.
        anchor: PathBuf,
        /// The OTF2 function that failed.
        call: &'static str,
        /// OTF2's own message, or its error code's description.
        message: String,
    },
}

// ___ OTF2's error callback ___________________________________________________

thread_local! {
    /// The errors OTF2 reported on this thread since they were last taken.
    static OTF2_ERRORS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Keeps the first errors (the cause comes first; the rest are its echoes up
/// OTF2's call stack).
const KEPT_ERRORS: usize = 8;

/// Replaces OTF2's default error handler, which prints to standard error.
unsafe extern "C" fn keep_otf2_error(
    _user: *mut c_void,
    _file: *const c_char,
    _line: u64,
    _function: *const c_char,
    code: sys::OTF2_ErrorCode,
    format: *const c_char,
    va: *mut c_void,
) -> sys::OTF2_ErrorCode {
    // Warnings and deprecation notices are not failures.
    if code == sys::OTF2_WARNING || code == sys::OTF2_DEPRECATED || code == sys::OTF2_SUCCESS {
        return code;
    }
    let mut text = [0 as c_char; 512];
    let message = if format.is_null() {
        String::new()
    } else {
        // SAFETY: OTF2 hands us its printf format and the matching va_list,
        // used once; vsnprintf writes at most text.len() bytes, NUL included.
        let n = unsafe { sys::vsnprintf(text.as_mut_ptr(), text.len(), format, va) };
        if n < 0 {
            String::new()
        } else {
            // SAFETY: vsnprintf NUL-terminated text.
            unsafe { CStr::from_ptr(text.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        }
    };
    let line = match (describe(code), message.is_empty()) {
        (d, true) => d,
        (d, false) => format!("{d}: {message}"),
    };
    let _ = OTF2_ERRORS.try_with(|errors| {
        if let Ok(mut errors) = errors.try_borrow_mut()
            && errors.len() < KEPT_ERRORS
        {
            errors.push(line);
        }
    });
    code
}

/// OTF2's description of an error code.
fn describe(code: sys::OTF2_ErrorCode) -> String {
    // SAFETY: OTF2 returns a static NUL-terminated string (or null).
    let d = unsafe { sys::OTF2_Error_GetDescription(code) };
    if d.is_null() {
        return format!("OTF2 error {code}");
    }
    // SAFETY: non-null, static, NUL-terminated.
    unsafe { CStr::from_ptr(d) }.to_string_lossy().into_owned()
}

fn install_error_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the callback has the signature OTF2 calls (va_list is a
        // pointer on the supported targets) and needs no user data.
        unsafe { sys::OTF2_Error_RegisterCallback(Some(keep_otf2_error), ptr::null_mut()) };
    });
}

/// Takes the errors OTF2 reported on this thread.
fn take_errors() -> Vec<String> {
    OTF2_ERRORS
        .try_with(|e| {
            e.try_borrow_mut()
                .map(|mut e| std::mem::take(&mut *e))
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// The error for a failed OTF2 call: OTF2's first message, else the code.
fn otf2_error(
    anchor: &Path,
    call: &'static str,
    code: Option<sys::OTF2_ErrorCode>,
) -> ArchiveError {
    let message = take_errors()
        .into_iter()
        .next()
        .unwrap_or_else(|| match code {
            Some(code) => describe(code),
            None => "failed without saying why".to_string(),
        });
    ArchiveError::Otf2 {
        anchor: anchor.to_path_buf(),
        call,
        message,
    }
}

/// A call is good if it returned success and reported no error on the way
/// (some, like writing the anchor file at close, only report).
fn check(anchor: &Path, call: &'static str, code: sys::OTF2_ErrorCode) -> Result<(), ArchiveError> {
    let reported = OTF2_ERRORS
        .try_with(|e| e.try_borrow().map(|e| !e.is_empty()).unwrap_or(false))
        .unwrap_or(false);
    if code == sys::OTF2_SUCCESS && !reported {
        Ok(())
    } else {
        Err(otf2_error(anchor, call, Some(code)))
    }
}

// ___ The archive ______________________________________________________________

/// Buffers are flushed to their files whenever they fill up.
unsafe extern "C" fn always_flush(
    _user: *mut c_void,
    _file_type: sys::OTF2_FileType,
    _location: sys::OTF2_LocationRef,
    _caller: *mut c_void,
    _final: bool,
) -> sys::OTF2_FlushType {
    sys::OTF2_FLUSH
}

/// No post-flush callback: OTF2 then writes no BufferFlush events, which
/// would carry its idea of time rather than the caller's.
static FLUSH_CALLBACKS: sys::OTF2_FlushCallbacks = sys::OTF2_FlushCallbacks {
    otf2_pre_flush: Some(always_flush),
    otf2_post_flush: None,
};

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

// ___ Global definitions _______________________________________________________

/// The global definitions, with their strings interned first: OTF2 wants a
/// string defined before a definition refers to it.
struct Definitions {
    strings: Vec<CString>,
    string_refs: HashMap<String, sys::OTF2_StringRef>,
    /// (name, class, parent, domain).
    nodes: Vec<(u32, u32, u32, sys::OTF2_SystemTreeDomain)>,
    /// (rank, name, node, pid).
    groups: Vec<(u32, u32, u32, u32)>,
    /// (id, name, rank).
    locations: Vec<(sys::OTF2_LocationRef, u32, u32, u64)>,
    /// (name, role).
    regions: Vec<(u32, sys::OTF2_RegionRole)>,
    world: u32,
    /// (comm ref, name, world ranks), by comm ref.
    comms: Vec<(sys::OTF2_CommRef, u32, Vec<u64>)>,
    s_empty: u32,
    s_mpi: u32,
    s_comm_locations: u32,
    s_pid: u32,
    s_metric: [u32; 3],
}

impl Definitions {
    fn new(a: &Archive, world: u32, locations: &[(sys::OTF2_LocationRef, u64)]) -> Definitions {
        let mut d = Definitions {
            strings: Vec::new(),
            string_refs: HashMap::new(),
            nodes: Vec::new(),
            groups: Vec::new(),
            locations: Vec::new(),
            regions: Vec::new(),
            world,
            comms: Vec::new(),
            s_empty: 0,
            s_mpi: 0,
            s_comm_locations: 0,
            s_pid: 0,
            s_metric: [0; 3],
        };
        d.s_empty = d.string("");
        d.s_mpi = d.string("MPI");
        d.s_comm_locations = d.string("MPI_COMM_WORLD locations");
        d.s_pid = d.string("MPI_OBSERVER::PID");
        d.s_metric = [
            d.string(DROPPED_METRIC_NAME),
            d.string("events the capture dropped because its ring was full, since recording began"),
            d.string("events"),
        ];

        let (cluster, machine, node_class) =
            (d.string("cluster"), d.string("machine"), d.string("node"));
        d.nodes.push((
            cluster,
            machine,
            sys::OTF2_UNDEFINED_SYSTEM_TREE_NODE,
            sys::OTF2_SYSTEM_TREE_DOMAIN_MACHINE,
        ));
        let mut node_refs: HashMap<&str, u32> = HashMap::new();
        for (&rank, info) in &a.ranks {
            // Ranks of unknown host hang from the root.
            let node = match &info.node {
                None => 0,
                Some(host) => match node_refs.get(host.as_str()) {
                    Some(&n) => n,
                    None => {
                        let n = d.nodes.len() as u32;
                        let name = d.string(host);
                        d.nodes.push((
                            name,
                            node_class,
                            0,
                            sys::OTF2_SYSTEM_TREE_DOMAIN_SHARED_MEMORY,
                        ));
                        node_refs.insert(host, n);
                        n
                    }
                },
            };
            let name = d.string(&format!("MPI Rank {rank}"));
            d.groups.push((rank, name, node, info.pid));
        }
        for &(id, records) in locations {
            let (rank, thread) = ((id & 0xffff_ffff) as u32, (id >> 32) as u32);
            let name = if thread == 0 {
                d.string("Master thread")
            } else {
                d.string(&format!("Thread {thread}"))
            };
            d.locations.push((id, name, rank, records));
        }
        for r in &a.regions {
            let name = d.string(&r.name);
            d.regions.push((name, r.role.raw()));
        }
        let mut comms: Vec<(u32, sys::OTF2_CommRef)> =
            a.comm_refs.iter().map(|(&id, &r)| (id, r)).collect();
        comms.sort_unstable_by_key(|&(_, r)| r);
        for (id, r) in comms {
            let (name, members) = match a.comms.get(&id) {
                Some(c) => (
                    d.string(&c.name),
                    c.world_ranks.iter().map(|&w| u64::from(w)).collect(),
                ),
                None => (d.string(&format!("comm {id} (undefined)")), Vec::new()),
            };
            d.comms.push((r, name, members));
        }
        d
    }

    fn string(&mut self, s: &str) -> sys::OTF2_StringRef {
        if let Some(&r) = self.string_refs.get(s) {
            return r;
        }
        let r = self.strings.len() as sys::OTF2_StringRef;
        self.strings.push(c_string(s));
        self.string_refs.insert(s.to_string(), r);
        r
    }

    /// Writes them all, in an order where everything is defined before use.
    fn write(
        &self,
        g: *mut sys::OTF2_GlobalDefWriter,
        anchor: &Path,
        offset: u64,
        length: u64,
        realtime: u64,
    ) -> Result<(), ArchiveError> {
        let ok = |call, code| check(anchor, call, code);
        let mpi = sys::OTF2_PARADIGM_MPI;
        // SAFETY: g is the open global definition writer; every pointer
        // passed points to live data of the stated length.
        unsafe {
            ok(
                "OTF2_GlobalDefWriter_WriteClockProperties",
                sys::OTF2_GlobalDefWriter_WriteClockProperties(
                    g,
                    TICKS_PER_SECOND,
                    offset,
                    length,
                    realtime,
                ),
            )?;
            for (r, s) in self.strings.iter().enumerate() {
                ok(
                    "OTF2_GlobalDefWriter_WriteString",
                    sys::OTF2_GlobalDefWriter_WriteString(g, r as u32, s.as_ptr()),
                )?;
            }
            ok(
                "OTF2_GlobalDefWriter_WriteParadigm",
                sys::OTF2_GlobalDefWriter_WriteParadigm(
                    g,
                    mpi,
                    self.s_mpi,
                    sys::OTF2_PARADIGM_CLASS_PROCESS,
                ),
            )?;
            for (r, &(name, class, parent, domain)) in self.nodes.iter().enumerate() {
                ok(
                    "OTF2_GlobalDefWriter_WriteSystemTreeNode",
                    sys::OTF2_GlobalDefWriter_WriteSystemTreeNode(g, r as u32, name, class, parent),
                )?;
                ok(
                    "OTF2_GlobalDefWriter_WriteSystemTreeNodeDomain",
                    sys::OTF2_GlobalDefWriter_WriteSystemTreeNodeDomain(g, r as u32, domain),
                )?;
            }
            for &(rank, name, node, _) in &self.groups {
                ok(
                    "OTF2_GlobalDefWriter_WriteLocationGroup",
                    sys::OTF2_GlobalDefWriter_WriteLocationGroup(
                        g,
                        rank,
                        name,
                        sys::OTF2_LOCATION_GROUP_TYPE_PROCESS,
                        node,
                        sys::OTF2_UNDEFINED_LOCATION_GROUP,
                    ),
                )?;
            }
            for &(rank, _, _, pid) in self.groups.iter().filter(|g| g.3 != 0) {
                ok(
                    "OTF2_GlobalDefWriter_WriteLocationGroupProperty",
                    sys::OTF2_GlobalDefWriter_WriteLocationGroupProperty(
                        g,
                        rank,
                        self.s_pid,
                        sys::OTF2_TYPE_UINT64,
                        sys::OTF2_AttributeValue {
                            uint64: u64::from(pid),
                        },
                    ),
                )?;
            }
            for &(id, name, rank, records) in &self.locations {
                ok(
                    "OTF2_GlobalDefWriter_WriteLocation",
                    sys::OTF2_GlobalDefWriter_WriteLocation(
                        g,
                        id,
                        name,
                        sys::OTF2_LOCATION_TYPE_CPU_THREAD,
                        records,
                        rank,
                    ),
                )?;
            }
            for (r, &(name, role)) in self.regions.iter().enumerate() {
                ok(
                    "OTF2_GlobalDefWriter_WriteRegion",
                    sys::OTF2_GlobalDefWriter_WriteRegion(
                        g,
                        r as u32,
                        name,
                        name,
                        self.s_empty,
                        role,
                        mpi,
                        sys::OTF2_REGION_FLAG_NONE,
                        self.s_empty,
                        0,
                        0,
                    ),
                )?;
            }
            // Group 0: world rank i → its master location, which is i.
            let masters: Vec<u64> = (0..u64::from(self.world)).collect();
            ok(
                "OTF2_GlobalDefWriter_WriteGroup",
                sys::OTF2_GlobalDefWriter_WriteGroup(
                    g,
                    0,
                    self.s_comm_locations,
                    sys::OTF2_GROUP_TYPE_COMM_LOCATIONS,
                    mpi,
                    sys::OTF2_GROUP_FLAG_NONE,
                    self.world,
                    masters.as_ptr(),
                ),
            )?;
            // Group 1 + c: communicator c's members, as world ranks.
            for (r, _, members) in &self.comms {
                ok(
                    "OTF2_GlobalDefWriter_WriteGroup",
                    sys::OTF2_GlobalDefWriter_WriteGroup(
                        g,
                        1 + r,
                        self.s_empty,
                        sys::OTF2_GROUP_TYPE_COMM_GROUP,
                        mpi,
                        sys::OTF2_GROUP_FLAG_NONE,
                        members.len() as u32,
                        members.as_ptr(),
                    ),
                )?;
            }
            for &(r, name, _) in &self.comms {
                ok(
                    "OTF2_GlobalDefWriter_WriteComm",
                    sys::OTF2_GlobalDefWriter_WriteComm(
                        g,
                        r,
                        name,
                        1 + r,
                        sys::OTF2_UNDEFINED_COMM,
                        sys::OTF2_COMM_FLAG_NONE,
                    ),
                )?;
            }
            let [name, description, unit] = self.s_metric;
            ok(
                "OTF2_GlobalDefWriter_WriteMetricMember",
                sys::OTF2_GlobalDefWriter_WriteMetricMember(
                    g,
                    0,
                    name,
                    description,
                    sys::OTF2_METRIC_TYPE_OTHER,
                    sys::OTF2_METRIC_ACCUMULATED_START,
                    sys::OTF2_TYPE_UINT64,
                    sys::OTF2_BASE_DECIMAL,
                    0,
                    unit,
                ),
            )?;
            let members = [0];
            ok(
                "OTF2_GlobalDefWriter_WriteMetricClass",
                sys::OTF2_GlobalDefWriter_WriteMetricClass(
                    g,
                    DROPPED_METRIC,
                    1,
                    members.as_ptr(),
                    sys::OTF2_METRIC_ASYNCHRONOUS,
                    sys::OTF2_RECORDER_KIND_CPU,
                ),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::process::Command;

    /// A fresh directory under the system's temporary directory.
    fn scratch(test: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("mpi-observer-otf2-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Whether a tool the test needs is here. Under CI it must be: a missing
    /// tool fails the test instead of skipping it.
    fn have(what: &str, probe: &mut Command) -> bool {
        let ok = probe.output().is_ok_and(|o| o.status.success());
        if !ok {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{what} is missing (cargo xtask setup installs it)");
            }
            eprintln!("skipped: {what} is missing");
        }
        ok
    }

    fn have_otf2_print() -> bool {
        have(
            "otf2-print (Debian otf2-tools)",
            Command::new("otf2-print").arg("--version"),
        )
    }

    fn have_python_otf2() -> bool {
        have(
            "python3-otf2 (Debian python3-otf2)",
            Command::new("/usr/bin/python3").args(["-c", "import otf2"]),
        )
    }

    /// `otf2-print` on the archive: it must read it whole; returns its output.
    fn otf2_print(anchor: &Path) -> String {
        let out = Command::new("otf2-print")
            .arg(anchor)
            .output()
            .expect("otf2-print runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "otf2-print failed: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// The independent reader's summary of the archive.
    fn read_otf2(anchor: &Path) -> Value {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/record/read_otf2.py");
        let out = Command::new("/usr/bin/python3")
            .arg(script)
            .arg(anchor)
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "read_otf2.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("read_otf2.py prints JSON")
    }

    /// Lines of otf2-print's event listing that start with this record name.
    fn records(printed: &str, name: &str) -> usize {
        printed
            .lines()
            .filter(|l| l.split_whitespace().next() == Some(name))
            .count()
    }

    const SEND: u32 = 0;
    const RECV: u32 = 1;
    const ISEND: u32 = 2;
    const IRECV: u32 = 3;
    const WAIT: u32 = 4;
    const ALLREDUCE: u32 = 5;
    const BCAST: u32 = 6;

    fn regions() -> Vec<RegionDef> {
        [
            ("MPI_Send", RegionRole::Point2Point),
            ("MPI_Recv", RegionRole::Point2Point),
            ("MPI_Isend", RegionRole::Point2Point),
            ("MPI_Irecv", RegionRole::Point2Point),
            ("MPI_Wait", RegionRole::Function),
            ("MPI_Allreduce", RegionRole::CollAll2All),
            ("MPI_Bcast", RegionRole::CollOne2All),
        ]
        .into_iter()
        .map(|(name, role)| RegionDef {
            name: name.to_string(),
            role,
        })
        .collect()
    }

    /// Writes one call: Enter, the events inside, Leave, 10 ns apart.
    fn call(a: &mut Archive, rank: u32, thread: u32, t: &mut u64, region: u32, inner: &[Event]) {
        let mut at = |a: &mut Archive, ev: Event| {
            *t += 10;
            a.event(rank, thread, *t, &ev).unwrap();
        };
        at(a, Event::Enter { region });
        for &ev in inner {
            at(a, ev);
        }
        at(a, Event::Leave { region });
    }

    /// Two ranks on two hosts, MPI_COMM_WORLD and a communicator whose rank
    /// order is reversed, blocking, nonblocking and a second thread's
    /// traffic, two collectives, dropped events and one late timestamp: what
    /// `otf2-print` and python3-otf2 find is what was written.
    #[test]
    fn archive_reads_back_in_two_independent_readers() {
        let dir = scratch("full");
        let mut a = Archive::create(&dir, "trace", "mpi-observer test", regions()).unwrap();
        a.set_property("MPI_OBSERVER::TEST", "yes").unwrap();
        a.add_rank(RankDef {
            rank: 0,
            node: "node-a".into(),
            pid: 100,
        })
        .unwrap();
        a.add_rank(RankDef {
            rank: 1,
            node: "node-b".into(),
            pid: 200,
        })
        .unwrap();
        a.add_comm(CommDef {
            id: 0,
            name: "MPI_COMM_WORLD".into(),
            world_ranks: vec![0, 1],
        })
        .unwrap();
        // Its rank 0 is world rank 1 and its rank 1 is world rank 0.
        const REV: u32 = 7;

        let (mut t0, mut t1, mut t1b) = (1_000, 1_005, 1_007);
        // Rank 0 → rank 1: three blocking sends on MPI_COMM_WORLD.
        for i in 0..3 {
            let send = Event::MpiSend {
                receiver: 1,
                comm: 0,
                tag: i,
                len: 8,
            };
            call(&mut a, 0, 0, &mut t0, SEND, &[send]);
            let recv = Event::MpiRecv {
                sender: 0,
                comm: 0,
                tag: i,
                len: 8,
            };
            call(&mut a, 1, 0, &mut t1, RECV, &[recv]);
        }
        // Rank 1 → rank 0: two Isends on REV (its rank 1 = world 0), received
        // by two Irecvs whose source is REV rank 0 (= world 1).
        for request in [11, 12] {
            let isend = Event::MpiIsend {
                receiver: 1,
                comm: REV,
                tag: 5,
                len: 1000,
                request,
            };
            call(&mut a, 1, 0, &mut t1, ISEND, &[isend]);
            call(
                &mut a,
                0,
                0,
                &mut t0,
                IRECV,
                &[Event::MpiIrecvRequest {
                    request: request + 100,
                }],
            );
        }
        for request in [11, 12] {
            let done = [
                Event::MpiRequestTest { request },
                Event::MpiIsendComplete { request },
            ];
            call(&mut a, 1, 0, &mut t1, WAIT, &done);
            let irecv = Event::MpiIrecv {
                sender: 0,
                comm: REV,
                tag: 5,
                len: 1000,
                request: request + 100,
            };
            call(&mut a, 0, 0, &mut t0, WAIT, &[irecv]);
        }
        // The comm is defined after its first use, as the caller may learn of
        // it late.
        a.add_comm(CommDef {
            id: REV,
            name: "reversed".into(),
            world_ranks: vec![1, 0],
        })
        .unwrap();
        // Rank 1's second thread → rank 0, blocking.
        let send = Event::MpiSend {
            receiver: 1,
            comm: REV,
            tag: 9,
            len: 4,
        };
        call(&mut a, 1, 1, &mut t1b, SEND, &[send]);
        let recv = Event::MpiRecv {
            sender: 1,
            comm: 0,
            tag: 9,
            len: 4,
        };
        call(&mut a, 0, 0, &mut t0, RECV, &[recv]);
        // Collectives: Allreduce on the world, Bcast on REV from its rank 0.
        for (rank, t) in [(0, &mut t0), (1, &mut t1)] {
            let end = Event::MpiCollectiveEnd {
                op: CollectiveOp::Allreduce,
                comm: 0,
                root: None,
                sent: 8,
                received: 8,
            };
            call(
                &mut a,
                rank,
                0,
                t,
                ALLREDUCE,
                &[Event::MpiCollectiveBegin, end],
            );
            let end = Event::MpiCollectiveEnd {
                op: CollectiveOp::Bcast,
                comm: REV,
                root: Some(0),
                sent: if rank == 1 { 64 } else { 0 },
                received: if rank == 1 { 0 } else { 64 },
            };
            call(&mut a, rank, 0, t, BCAST, &[Event::MpiCollectiveBegin, end]);
        }
        // Rank 1 dropped 5, then 12 in all.
        a.dropped(1, t1 + 1, 5).unwrap();
        a.dropped(1, t1 + 2, 12).unwrap();
        // A timestamp from the past is written at the last one, not refused.
        a.event(0, 0, 10, &Event::Enter { region: WAIT }).unwrap();
        a.event(0, 0, t0 + 10, &Event::Leave { region: WAIT })
            .unwrap();
        let last = t0 + 10;

        let epoch = 1_700_000_000_000_000_000;
        let s = a.finish(epoch).unwrap();
        assert_eq!(s.anchor, dir.join("trace.otf2"));
        assert_eq!(s.clamped, 1);
        assert_eq!(s.dropped, BTreeMap::from([(1, 12)]));
        assert!(
            s.unrecorded_ranks.is_empty() && s.undefined_comms.is_empty(),
            "{s:?}"
        );
        // call() steps 10 ns before each event.
        assert_eq!(s.span_ns, Some((1_010, last.max(t1 + 2))));
        // Rank 0: 3 sends (3 each), 2 Irecv posts (3), 2 waits (3), 1 recv
        // (3), 2 collectives (4 each), 2 late (1 each).
        assert_eq!(s.events[&0], 9 + 6 + 6 + 3 + 8 + 2);
        // Rank 1: 3 recvs, 2 Isends, 2 waits (4 each), 1 send on thread 1,
        // 2 collectives.
        assert_eq!(s.events[&1], 9 + 6 + 8 + 3 + 8);

        if have_otf2_print() {
            let printed = otf2_print(&s.anchor);
            assert_eq!(records(&printed, "MPI_SEND"), 4, "{printed}");
            assert_eq!(records(&printed, "MPI_RECV"), 4);
            assert_eq!(records(&printed, "MPI_ISEND"), 2);
            assert_eq!(records(&printed, "MPI_ISEND_COMPLETE"), 2);
            assert_eq!(records(&printed, "MPI_IRECV_REQUEST"), 2);
            assert_eq!(records(&printed, "MPI_IRECV"), 2);
            assert_eq!(records(&printed, "MPI_REQUEST_TEST"), 2);
            assert_eq!(records(&printed, "MPI_COLLECTIVE_BEGIN"), 4);
            assert_eq!(records(&printed, "MPI_COLLECTIVE_END"), 4);
            assert_eq!(records(&printed, "METRIC"), 2);
            assert_eq!(records(&printed, "ENTER"), records(&printed, "LEAVE"));
        }
        if have_python_otf2() {
            let r = read_otf2(&s.anchor);
            let rank = |n: &str| &r["ranks"][n];
            assert_eq!(rank("0")["name"], "MPI Rank 0", "{r}");
            assert_eq!(rank("1")["name"], "MPI Rank 1");
            assert_eq!(rank("0")["node"], "node-a");
            assert_eq!(rank("1")["node"], "node-b");
            assert_eq!(rank("0")["pid"], 100);
            assert_eq!(rank("1")["pid"], 200);
            assert_eq!(rank("1")["threads"]["Thread 1"], 3);
            // The reader counts the two metric records too.
            assert_eq!(rank("0")["events"], s.events[&0]);
            assert_eq!(rank("1")["events"], s.events[&1] + 2);
            assert_eq!(r["events"], s.events[&0] + s.events[&1] + 2);
            // Peers resolved to world ranks through each communicator.
            assert_eq!(r["sends"], serde_json::json!({"0->1": 3, "1->0": 3}));
            assert_eq!(r["recvs"], serde_json::json!({"0->1": 3, "1->0": 3}));
            assert_eq!(
                r["send_bytes"],
                serde_json::json!({"0->1": 24, "1->0": 2004})
            );
            assert_eq!(r["recv_bytes"], r["send_bytes"]);
            assert_eq!(
                r["requests"],
                serde_json::json!({"isend": 2, "isend_complete": 2, "irecv_request": 2, "irecv": 2,
                                   "cancelled": 0, "test": 2, "unmatched": 0})
            );
            assert_eq!(
                r["collectives"],
                serde_json::json!({"ALLREDUCE": 2, "BCAST": 2})
            );
            assert_eq!(r["collective_begin"], 4);
            assert_eq!(
                r["comms"],
                serde_json::json!({"MPI_COMM_WORLD": [0, 1], "reversed": [1, 0]})
            );
            assert_eq!(r["enter_leave_balanced"], true, "{}", r["unbalanced"]);
            assert_eq!(r["monotonic"], true);
            assert_eq!(r["in_clock_range"], true);
            assert_eq!(r["declared_events_match"], true);
            assert_eq!(r["dropped"], serde_json::json!({"1": 12}));
            assert_eq!(r["regions"]["MPI_Send"], 4);
            let clock = &r["clock"];
            assert_eq!(clock["timer_resolution"], 1_000_000_000);
            assert_eq!(clock["global_offset"], 1_010);
            assert_eq!(clock["trace_length"], last.max(t1 + 2) - 1_010);
            assert_eq!(clock["realtime_timestamp"], epoch + 1_010);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// No events at all, and a job where only one rank of three was recorded
    /// while another was declared without events: both archives are whole.
    #[test]
    fn empty_ranks_still_make_a_valid_archive() {
        let dir = scratch("empty");
        let s = Archive::create(&dir, "none", "test", regions())
            .unwrap()
            .finish(0)
            .unwrap();
        assert!(s.events.is_empty() && s.span_ns.is_none());
        assert_eq!(s.unrecorded_ranks, [0]);

        let mut a = Archive::create(&dir, "sparse", "test", regions()).unwrap();
        a.add_comm(CommDef {
            id: 0,
            name: "MPI_COMM_WORLD".into(),
            world_ranks: vec![0, 1, 2],
        })
        .unwrap();
        a.add_rank(RankDef {
            rank: 0,
            node: "n".into(),
            pid: 1,
        })
        .unwrap();
        let mut t = 0;
        call(&mut a, 1, 0, &mut t, BCAST, &[]);
        let sparse = a.finish(0).unwrap();
        assert_eq!(sparse.unrecorded_ranks, [2]);
        assert_eq!(sparse.events, BTreeMap::from([(0, 0), (1, 2)]));

        if have_otf2_print() {
            otf2_print(&s.anchor);
            let printed = otf2_print(&sparse.anchor);
            assert_eq!(records(&printed, "ENTER"), 1);
        }
        if have_python_otf2() {
            let r = read_otf2(&s.anchor);
            assert_eq!(r["events"], 0, "{r}");
            assert_eq!(r["ranks"]["0"]["events"], 0);
            assert_eq!(r["clock"]["trace_length"], 0);
            let r = read_otf2(&sparse.anchor);
            assert_eq!(r["events"], 2, "{r}");
            assert_eq!(r["ranks"]["0"]["events"], 0);
            assert_eq!(r["ranks"]["1"]["node"], Value::Null);
            assert_eq!(r["ranks"]["2"]["name"], "MPI Rank 2");
            assert_eq!(r["comms"]["MPI_COMM_WORLD"], serde_json::json!([0, 1, 2]));
            assert_eq!(r["enter_leave_balanced"], true);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// An archive dropped without finish (the caller failed half-way) is
    /// still closed whole, with communicators it never defined.
    #[test]
    fn a_dropped_archive_is_closed_valid() {
        let dir = scratch("drop");
        let anchor = {
            let mut a = Archive::create(&dir, "trace", "test", regions()).unwrap();
            let mut t = 5;
            let send = Event::MpiSend {
                receiver: 0,
                comm: 3,
                tag: 0,
                len: 1,
            };
            call(&mut a, 0, 0, &mut t, SEND, &[send]);
            a.anchor().to_path_buf()
        };
        if have_otf2_print() {
            assert_eq!(records(&otf2_print(&anchor), "MPI_SEND"), 1);
        }
        if have_python_otf2() {
            let r = read_otf2(&anchor);
            assert_eq!(r["clock"]["realtime_timestamp"], Value::Null, "{r}");
            assert_eq!(r["comms"]["comm 3 (undefined)"], serde_json::json!([]));
            // A peer in a communicator nobody defined cannot be resolved.
            assert_eq!(r["sends"], serde_json::json!({"0->?": 1}));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Enough events to fill many event chunks (OTF2 flushes each one as it
    /// fills), on many threads.
    #[test]
    fn many_events_span_many_chunks() {
        let dir = scratch("many");
        let mut a = Archive::create(&dir, "trace", "test", regions()).unwrap();
        let per_thread = 40_000;
        for rank in 0..2 {
            for thread in 0..3 {
                let mut t = 0;
                for _ in 0..per_thread / 2 {
                    call(&mut a, rank, thread, &mut t, WAIT, &[]);
                }
            }
        }
        let s = a.finish(0).unwrap();
        assert_eq!(
            s.events,
            BTreeMap::from([(0, 3 * per_thread), (1, 3 * per_thread)])
        );
        let size: u64 = std::fs::read_dir(dir.join("trace"))
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(
            size > 2 * sys::OTF2_CHUNK_SIZE_EVENTS_DEFAULT,
            "{size} bytes"
        );
        if have_otf2_print() {
            let printed = otf2_print(&s.anchor);
            assert_eq!(records(&printed, "LEAVE"), 6 * per_thread as usize / 2);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Bad places and bad input get one clear line each, and nothing already
    /// there is overwritten.
    #[test]
    fn bad_places_and_input_are_refused_in_one_line() {
        let dir = scratch("bad");
        Archive::create(&dir, "trace", "test", Vec::new())
            .unwrap()
            .finish(0)
            .unwrap();
        let anchor = dir.join("trace.otf2");
        let before = std::fs::read(&anchor).unwrap();
        let e = Archive::create(&dir, "trace", "test", Vec::new())
            .err()
            .unwrap();
        let line = crate::one_line(&e);
        assert!(matches!(e, ArchiveError::Exists { .. }), "{line}");
        assert_eq!(
            line,
            format!(
                "{} already exists: refusing to overwrite a trace; choose another directory",
                anchor.display()
            )
        );
        assert_eq!(std::fs::read(&anchor).unwrap(), before);
        // A leftover trace directory alone is refused too.
        std::fs::create_dir(dir.join("other")).unwrap();
        let e = Archive::create(&dir, "other", "test", Vec::new())
            .err()
            .unwrap();
        assert!(matches!(e, ArchiveError::Exists { .. }), "{e}");

        let file = dir.join("a-file");
        std::fs::write(&file, "").unwrap();
        let e = Archive::create(&file.join("sub"), "trace", "test", Vec::new())
            .err()
            .unwrap();
        let line = crate::one_line(&e);
        assert!(
            line.starts_with(&format!(
                "cannot create the trace directory {}/sub: ",
                file.display()
            )),
            "{line}"
        );
        assert!(!line.contains('\n'));

        let e = Archive::create(&dir, "a/b", "test", Vec::new())
            .err()
            .unwrap();
        assert!(matches!(e, ArchiveError::BadName { .. }), "{e}");

        // Root may write anywhere; others meet a read-only directory.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            use std::os::unix::fs::PermissionsExt;
            let ro = dir.join("ro");
            std::fs::create_dir(&ro).unwrap();
            std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o500)).unwrap();
            let e = Archive::create(&ro, "trace", "test", Vec::new())
                .err()
                .unwrap();
            assert!(matches!(e, ArchiveError::NotWritable { .. }), "{e}");
        }

        // A failure inside OTF2 (its files vanished under it) is one line
        // too, with OTF2's own words, and still closes what it can.
        let mut a = Archive::create(&dir, "gone", "test", regions()).unwrap();
        a.event(0, 0, 1, &Event::MpiCollectiveBegin).unwrap();
        std::fs::remove_dir(dir.join("gone")).unwrap();
        let e = a.finish(0).unwrap_err();
        let line = crate::one_line(&e);
        assert!(matches!(e, ArchiveError::Otf2 { .. }), "{line}");
        let evt = dir.join("gone/0.evt");
        assert!(
            line.starts_with(&format!(
                "cannot write the OTF2 archive {}: ",
                dir.join("gone.otf2").display()
            )) && line.contains(&format!("'{}'", evt.display()))
                && line.ends_with(" (in OTF2_Archive_CloseEvtWriter)"),
            "{line}"
        );

        let mut a = Archive::create(&dir, "input", "test", regions()).unwrap();
        let e = a.event(0, 0, 1, &Event::Enter { region: 99 }).unwrap_err();
        assert_eq!(
            e.to_string(),
            "region 99 is not defined: the archive has 7 regions"
        );
        let e = a
            .event(MAX_RANKS, 0, 1, &Event::MpiCollectiveBegin)
            .unwrap_err();
        assert!(matches!(e, ArchiveError::RankOutOfRange { .. }), "{e}");
        let comm = |id, world_ranks| CommDef {
            id,
            name: "c".into(),
            world_ranks,
        };
        let e = a.add_comm(comm(0, vec![1, 0])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad communicator 0 (c): id 0 is MPI_COMM_WORLD, whose rank i is world rank i"
        );
        let e = a.add_comm(comm(4, vec![2, 2])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bad communicator 4 (c): world rank 2 is listed twice"
        );
        a.finish(0).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
