//! Raw FFI to the part of OTF2 3.0 (Debian's `libotf2-trace-dev` 3.0.2) that
//! mpi-observer's trace writer (`observer/src/record/archive.rs`) uses: an
//! archive in write mode, its event writers, and the global definitions.
//!
//! Written by hand from `/usr/include/otf2/*.h` (bindgen is not available
//! here, and the subset is small). The C names are kept, so the OTF2
//! documentation applies as is. Enumerations that OTF2 declares as
//! `typedef uint8_t X` (or `uint32_t`) plus an enum of values are a type
//! alias plus constants here, as in C; only the values the writer needs are
//! listed. Every function is `unsafe`: the handles are raw pointers whose
//! lifetime OTF2 manages, as its documentation describes.

#![warn(missing_docs)]
#![expect(
    non_camel_case_types,
    non_snake_case,
    reason = "the C names of OTF2, so that its documentation applies unchanged"
)]

use core::ffi::{c_char, c_int, c_void};
use core::marker::{PhantomData, PhantomPinned};

/// Declares an opaque C struct, only ever used behind a pointer.
macro_rules! opaque {
    ($(#[$doc:meta] $name:ident),* $(,)?) => {$(
        #[$doc]
        #[repr(C)]
        pub struct $name {
            _data: [u8; 0],
            // Not Send, Sync or Unpin: OTF2 owns it.
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }
    )*};
}

opaque!(
    /// An archive handle (`OTF2_Archive.h`).
    OTF2_Archive,
    /// A local event writer, one per location (`OTF2_EvtWriter.h`).
    OTF2_EvtWriter,
    /// A local definition writer, one per location (`OTF2_DefWriter.h`).
    OTF2_DefWriter,
    /// The global definition writer (`OTF2_GlobalDefWriter.h`).
    OTF2_GlobalDefWriter,
    /// Attributes attached to an event; the writer always passes null.
    OTF2_AttributeList,
);

// ___ OTF2_ErrorCodes.h _______________________________________________________

/// Return code of most OTF2 calls: a C enum, so an `int`.
pub type OTF2_ErrorCode = c_int;
/// The call succeeded.
pub const OTF2_SUCCESS: OTF2_ErrorCode = 0;
/// Passed to an error callback for a warning, not an error.
pub const OTF2_WARNING: OTF2_ErrorCode = -1;
/// Passed to an error callback when OTF2 is about to abort.
pub const OTF2_ABORT: OTF2_ErrorCode = -2;
/// Passed to an error callback for a deprecation notice.
pub const OTF2_DEPRECATED: OTF2_ErrorCode = -3;

/// The error callback (`OTF2_ErrorCallback`), called instead of printing the
/// error to standard error.
///
/// `va` is C's `va_list` argument. On the targets this project supports
/// (x86-64 and AArch64 Linux) a `va_list` parameter is passed as a pointer,
/// so it is declared as one; hand it on to [`vsnprintf`], once.
pub type OTF2_ErrorCallback = Option<
    unsafe extern "C" fn(
        userData: *mut c_void,
        file: *const c_char,
        line: u64,
        function: *const c_char,
        errorCode: OTF2_ErrorCode,
        msgFormatString: *const c_char,
        va: *mut c_void,
    ) -> OTF2_ErrorCode,
>;

unsafe extern "C" {
    /// The name of an error code without its `OTF2_` prefix, e.g. `"SUCCESS"`; static storage.
    pub fn OTF2_Error_GetName(errorCode: OTF2_ErrorCode) -> *const c_char;
    /// The description of an error code; static storage.
    pub fn OTF2_Error_GetDescription(errorCode: OTF2_ErrorCode) -> *const c_char;
    /// Replaces the process-wide error handler; returns the previous one.
    pub fn OTF2_Error_RegisterCallback(
        errorCallbackIn: OTF2_ErrorCallback,
        userData: *mut c_void,
    ) -> OTF2_ErrorCallback;
    /// The C library's `vsnprintf`, to format the message an
    /// [`OTF2_ErrorCallback`] receives (the `libc` crate does not declare it).
    pub fn vsnprintf(s: *mut c_char, n: usize, format: *const c_char, ap: *mut c_void) -> c_int;
}

// ___ OTF2_GeneralDefinitions.h _______________________________________________

/// OTF2's "undefined" value for `uint32_t` fields.
pub const OTF2_UNDEFINED_UINT32: u32 = u32::MAX;
/// OTF2's "undefined" value for `uint64_t` fields.
pub const OTF2_UNDEFINED_UINT64: u64 = u64::MAX;

/// A timestamp, in the ticks of the trace's clock.
pub type OTF2_TimeStamp = u64;
/// No timestamp (e.g. an unknown realtime in the clock properties).
pub const OTF2_UNDEFINED_TIMESTAMP: OTF2_TimeStamp = OTF2_UNDEFINED_UINT64;

/// Reference to a String definition.
pub type OTF2_StringRef = u32;
/// No string.
pub const OTF2_UNDEFINED_STRING: OTF2_StringRef = OTF2_UNDEFINED_UINT32;
/// Reference to a SystemTreeNode definition.
pub type OTF2_SystemTreeNodeRef = u32;
/// No system tree node (the parent of the root).
pub const OTF2_UNDEFINED_SYSTEM_TREE_NODE: OTF2_SystemTreeNodeRef = OTF2_UNDEFINED_UINT32;
/// Reference to a LocationGroup definition.
pub type OTF2_LocationGroupRef = u32;
/// No location group.
pub const OTF2_UNDEFINED_LOCATION_GROUP: OTF2_LocationGroupRef = OTF2_UNDEFINED_UINT32;
/// Reference to a Location definition (64-bit).
pub type OTF2_LocationRef = u64;
/// No location.
pub const OTF2_UNDEFINED_LOCATION: OTF2_LocationRef = OTF2_UNDEFINED_UINT64;
/// Reference to a Region definition.
pub type OTF2_RegionRef = u32;
/// Reference to a Group definition.
pub type OTF2_GroupRef = u32;
/// Reference to a MetricMember definition.
pub type OTF2_MetricMemberRef = u32;
/// Reference to a MetricClass or MetricInstance definition.
pub type OTF2_MetricRef = u32;
/// Reference to a Comm definition.
pub type OTF2_CommRef = u32;
/// No communicator (e.g. the parent of a communicator without one).
pub const OTF2_UNDEFINED_COMM: OTF2_CommRef = OTF2_UNDEFINED_UINT32;

/// Archive file mode.
pub type OTF2_FileMode = u8;
/// Open an archive to write it.
pub const OTF2_FILEMODE_WRITE: OTF2_FileMode = 0;

/// Compression of the archive's files.
pub type OTF2_Compression = u8;
/// No compression.
pub const OTF2_COMPRESSION_NONE: OTF2_Compression = 1;

/// How the archive's logical files are stored.
pub type OTF2_FileSubstrate = u8;
/// One POSIX file per logical file.
pub const OTF2_SUBSTRATE_POSIX: OTF2_FileSubstrate = 1;

/// Smallest chunk size OTF2 accepts.
pub const OTF2_CHUNK_SIZE_MIN: u64 = 256 * 1024;
/// Largest chunk size OTF2 accepts.
pub const OTF2_CHUNK_SIZE_MAX: u64 = 16 * 1024 * 1024;
/// OTF2's recommended event chunk size (`OTF2_Archive.h`).
pub const OTF2_CHUNK_SIZE_EVENTS_DEFAULT: u64 = 1024 * 1024;
/// OTF2's recommended definition chunk size (`OTF2_Archive.h`).
pub const OTF2_CHUNK_SIZE_DEFINITIONS_DEFAULT: u64 = 4 * 1024 * 1024;

/// What the pre-flush callback answers.
pub type OTF2_FlushType = u8;
/// Do not write the buffer to its file.
pub const OTF2_NO_FLUSH: OTF2_FlushType = 0;
/// Write the buffer to its file.
pub const OTF2_FLUSH: OTF2_FlushType = 1;

/// Kind of logical file, as passed to the flush callbacks.
pub type OTF2_FileType = u8;

/// Type of a value (attributes, metric values, properties).
pub type OTF2_Type = u8;
/// `uint64_t`.
pub const OTF2_TYPE_UINT64: OTF2_Type = 4;
/// A String definition reference.
pub const OTF2_TYPE_STRING: OTF2_Type = 11;

/// A typed value (of a property or attribute); the accompanying
/// [`OTF2_Type`] says which field. The C union has more fields, all of at
/// most 8 bytes, so this subset has the same size, alignment and (being
/// integer and floating point, like the C one) calling convention.
#[repr(C)]
#[derive(Clone, Copy)]
pub union OTF2_AttributeValue {
    /// For [`OTF2_TYPE_UINT64`].
    pub uint64: u64,
    /// For `INT64`.
    pub int64: i64,
    /// For `DOUBLE`.
    pub float64: f64,
    /// For [`OTF2_TYPE_STRING`].
    pub stringRef: OTF2_StringRef,
}

/// A parallel programming paradigm.
pub type OTF2_Paradigm = u8;
/// MPI.
pub const OTF2_PARADIGM_MPI: OTF2_Paradigm = 4;

/// Class of a paradigm.
pub type OTF2_ParadigmClass = u8;
/// Process-based (MPI).
pub const OTF2_PARADIGM_CLASS_PROCESS: OTF2_ParadigmClass = 0;

// ___ OTF2_Callbacks.h ________________________________________________________

/// Called before a buffer is flushed; answers [`OTF2_FLUSH`] or
/// [`OTF2_NO_FLUSH`].
pub type OTF2_PreFlushCallback = Option<
    unsafe extern "C" fn(
        userData: *mut c_void,
        fileType: OTF2_FileType,
        location: OTF2_LocationRef,
        callerData: *mut c_void,
        final_: bool,
    ) -> OTF2_FlushType,
>;

/// Called after an event buffer was flushed, for the time the flush ended.
/// May be `None`: then OTF2 writes no BufferFlush event.
pub type OTF2_PostFlushCallback = Option<
    unsafe extern "C" fn(
        userData: *mut c_void,
        fileType: OTF2_FileType,
        location: OTF2_LocationRef,
    ) -> OTF2_TimeStamp,
>;

/// The flush callbacks, as given to [`OTF2_Archive_SetFlushCallbacks`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct OTF2_FlushCallbacks {
    /// Called before a flush.
    pub otf2_pre_flush: OTF2_PreFlushCallback,
    /// Called after a flush of an event buffer.
    pub otf2_post_flush: OTF2_PostFlushCallback,
}

// ___ OTF2_Definitions.h ______________________________________________________

/// Domain of a system tree node.
pub type OTF2_SystemTreeDomain = u8;
/// The whole machine (the root).
pub const OTF2_SYSTEM_TREE_DOMAIN_MACHINE: OTF2_SystemTreeDomain = 0;
/// One shared-memory domain (a node).
pub const OTF2_SYSTEM_TREE_DOMAIN_SHARED_MEMORY: OTF2_SystemTreeDomain = 1;

/// Type of a location group.
pub type OTF2_LocationGroupType = u8;
/// A process (an MPI rank).
pub const OTF2_LOCATION_GROUP_TYPE_PROCESS: OTF2_LocationGroupType = 1;

/// Type of a location.
pub type OTF2_LocationType = u8;
/// A CPU thread.
pub const OTF2_LOCATION_TYPE_CPU_THREAD: OTF2_LocationType = 1;

/// Role of a region.
pub type OTF2_RegionRole = u8;
/// Unknown role.
pub const OTF2_REGION_ROLE_UNKNOWN: OTF2_RegionRole = 0;
/// A function.
pub const OTF2_REGION_ROLE_FUNCTION: OTF2_RegionRole = 1;
/// A wrapper around another function.
pub const OTF2_REGION_ROLE_WRAPPER: OTF2_RegionRole = 2;
/// A barrier.
pub const OTF2_REGION_ROLE_BARRIER: OTF2_RegionRole = 15;
/// A collective from one to all (Bcast, Scatter).
pub const OTF2_REGION_ROLE_COLL_ONE2ALL: OTF2_RegionRole = 23;
/// A collective from all to one (Gather, Reduce).
pub const OTF2_REGION_ROLE_COLL_ALL2ONE: OTF2_RegionRole = 24;
/// A collective from all to all (Allreduce, Alltoall).
pub const OTF2_REGION_ROLE_COLL_ALL2ALL: OTF2_RegionRole = 25;
/// Another collective (Scan).
pub const OTF2_REGION_ROLE_COLL_OTHER: OTF2_RegionRole = 26;
/// File I/O.
pub const OTF2_REGION_ROLE_FILE_IO: OTF2_RegionRole = 27;
/// Point-to-point communication.
pub const OTF2_REGION_ROLE_POINT2POINT: OTF2_RegionRole = 28;
/// One-sided communication.
pub const OTF2_REGION_ROLE_RMA: OTF2_RegionRole = 29;
/// A region made up by the measurement system.
pub const OTF2_REGION_ROLE_ARTIFICIAL: OTF2_RegionRole = 31;
/// Memory allocation.
pub const OTF2_REGION_ROLE_ALLOCATE: OTF2_RegionRole = 35;
/// Memory release.
pub const OTF2_REGION_ROLE_DEALLOCATE: OTF2_RegionRole = 36;
/// File I/O metadata (open, close, seek).
pub const OTF2_REGION_ROLE_FILE_IO_METADATA: OTF2_RegionRole = 38;

/// Flags of a region (a bit set).
pub type OTF2_RegionFlag = u32;
/// No flag.
pub const OTF2_REGION_FLAG_NONE: OTF2_RegionFlag = 0;

/// Type of a group.
pub type OTF2_GroupType = u8;
/// The locations of a paradigm, indexed by rank in `MPI_COMM_WORLD`.
pub const OTF2_GROUP_TYPE_COMM_LOCATIONS: OTF2_GroupType = 4;
/// A communicator's group: indexes into the `COMM_LOCATIONS` group of the
/// same paradigm.
pub const OTF2_GROUP_TYPE_COMM_GROUP: OTF2_GroupType = 5;

/// Flags of a group (a bit set).
pub type OTF2_GroupFlag = u32;
/// No flag.
pub const OTF2_GROUP_FLAG_NONE: OTF2_GroupFlag = 0;

/// Flags of a communicator (a bit set).
pub type OTF2_CommFlag = u32;
/// No flag (no CommCreate/CommDestroy events are written).
pub const OTF2_COMM_FLAG_NONE: OTF2_CommFlag = 0;

/// Base of a metric's scale.
pub type OTF2_Base = u8;
/// Decimal.
pub const OTF2_BASE_DECIMAL: OTF2_Base = 1;

/// Where a metric class occurs.
pub type OTF2_MetricOccurrence = u8;
/// Anywhere, not tied to Enter/Leave.
pub const OTF2_METRIC_ASYNCHRONOUS: OTF2_MetricOccurrence = 2;

/// Type of a metric.
pub type OTF2_MetricType = u8;
/// Neither PAPI nor rusage nor a user metric.
pub const OTF2_METRIC_TYPE_OTHER: OTF2_MetricType = 0;

/// Mode of a metric: value property and timing.
pub type OTF2_MetricMode = u8;
/// Accumulated since the start of the measurement.
pub const OTF2_METRIC_ACCUMULATED_START: OTF2_MetricMode = 0;

/// Which locations record a metric class.
pub type OTF2_RecorderKind = u8;
/// Locations of type CPU thread.
pub const OTF2_RECORDER_KIND_CPU: OTF2_RecorderKind = 2;

// ___ OTF2_Events.h ___________________________________________________________

/// An MPI collective operation, in MpiCollectiveEnd.
pub type OTF2_CollectiveOp = u8;
/// `MPI_Barrier`.
pub const OTF2_COLLECTIVE_OP_BARRIER: OTF2_CollectiveOp = 0;
/// `MPI_Bcast`.
pub const OTF2_COLLECTIVE_OP_BCAST: OTF2_CollectiveOp = 1;
/// `MPI_Gather`.
pub const OTF2_COLLECTIVE_OP_GATHER: OTF2_CollectiveOp = 2;
/// `MPI_Gatherv`.
pub const OTF2_COLLECTIVE_OP_GATHERV: OTF2_CollectiveOp = 3;
/// `MPI_Scatter`.
pub const OTF2_COLLECTIVE_OP_SCATTER: OTF2_CollectiveOp = 4;
/// `MPI_Scatterv`.
pub const OTF2_COLLECTIVE_OP_SCATTERV: OTF2_CollectiveOp = 5;
/// `MPI_Allgather`.
pub const OTF2_COLLECTIVE_OP_ALLGATHER: OTF2_CollectiveOp = 6;
/// `MPI_Allgatherv`.
pub const OTF2_COLLECTIVE_OP_ALLGATHERV: OTF2_CollectiveOp = 7;
/// `MPI_Alltoall`.
pub const OTF2_COLLECTIVE_OP_ALLTOALL: OTF2_CollectiveOp = 8;
/// `MPI_Alltoallv`.
pub const OTF2_COLLECTIVE_OP_ALLTOALLV: OTF2_CollectiveOp = 9;
/// `MPI_Alltoallw`.
pub const OTF2_COLLECTIVE_OP_ALLTOALLW: OTF2_CollectiveOp = 10;
/// `MPI_Allreduce`.
pub const OTF2_COLLECTIVE_OP_ALLREDUCE: OTF2_CollectiveOp = 11;
/// `MPI_Reduce`.
pub const OTF2_COLLECTIVE_OP_REDUCE: OTF2_CollectiveOp = 12;
/// `MPI_Reduce_scatter`.
pub const OTF2_COLLECTIVE_OP_REDUCE_SCATTER: OTF2_CollectiveOp = 13;
/// `MPI_Scan`.
pub const OTF2_COLLECTIVE_OP_SCAN: OTF2_CollectiveOp = 14;
/// `MPI_Exscan`.
pub const OTF2_COLLECTIVE_OP_EXSCAN: OTF2_CollectiveOp = 15;
/// `MPI_Reduce_scatter_block`.
pub const OTF2_COLLECTIVE_OP_REDUCE_SCATTER_BLOCK: OTF2_CollectiveOp = 16;
/// Collectively create a handle (`MPI_Comm_split`, `MPI_Win_create`, ...).
pub const OTF2_COLLECTIVE_OP_CREATE_HANDLE: OTF2_CollectiveOp = 17;
/// Collectively destroy a handle (`MPI_Comm_free`, ...).
pub const OTF2_COLLECTIVE_OP_DESTROY_HANDLE: OTF2_CollectiveOp = 18;
/// Collectively allocate memory.
pub const OTF2_COLLECTIVE_OP_ALLOCATE: OTF2_CollectiveOp = 19;
/// Collectively free memory.
pub const OTF2_COLLECTIVE_OP_DEALLOCATE: OTF2_CollectiveOp = 20;
/// Collectively create a handle and allocate memory (`MPI_Win_allocate`).
pub const OTF2_COLLECTIVE_OP_CREATE_HANDLE_AND_ALLOCATE: OTF2_CollectiveOp = 21;
/// Collectively destroy a handle and free memory.
pub const OTF2_COLLECTIVE_OP_DESTROY_HANDLE_AND_DEALLOCATE: OTF2_CollectiveOp = 22;

/// The root argument of MpiCollectiveEnd for a collective without a root.
pub const OTF2_COLLECTIVE_ROOT_NONE: u32 = OTF2_UNDEFINED_UINT32;

/// One value of a Metric event; its member's value type says which field.
#[repr(C)]
#[derive(Clone, Copy)]
pub union OTF2_MetricValue {
    /// For [`OTF2_Type`] `INT64`.
    pub signed_int: i64,
    /// For [`OTF2_TYPE_UINT64`].
    pub unsigned_int: u64,
    /// For `DOUBLE`.
    pub floating_point: f64,
}

// ___ OTF2_Archive.h __________________________________________________________

unsafe extern "C" {
    /// Creates an archive handle: `archivePath/archiveName.otf2` (the anchor
    /// file), `archiveName.def` and the directory `archiveName/`. Null on
    /// failure.
    pub fn OTF2_Archive_Open(
        archivePath: *const c_char,
        archiveName: *const c_char,
        fileMode: OTF2_FileMode,
        chunkSizeEvents: u64,
        chunkSizeDefs: u64,
        fileSubstrate: OTF2_FileSubstrate,
        compression: OTF2_Compression,
    ) -> *mut OTF2_Archive;
    /// Closes the archive, and every writer still open; writes the anchor
    /// file in write mode.
    pub fn OTF2_Archive_Close(archive: *mut OTF2_Archive) -> OTF2_ErrorCode;
    /// Sets the size of the definition chunks, for an archive opened with
    /// [`OTF2_UNDEFINED_UINT64`] as `chunkSizeDefs`, before any definition
    /// writer is requested.
    pub fn OTF2_Archive_SetDefChunkSize(
        archive: *mut OTF2_Archive,
        chunkSize: u64,
    ) -> OTF2_ErrorCode;
    /// Sets the trace's description (optional).
    pub fn OTF2_Archive_SetDescription(
        archive: *mut OTF2_Archive,
        description: *const c_char,
    ) -> OTF2_ErrorCode;
    /// Sets who created the trace (optional).
    pub fn OTF2_Archive_SetCreator(
        archive: *mut OTF2_Archive,
        creator: *const c_char,
    ) -> OTF2_ErrorCode;
    /// Sets the name of the machine the trace was recorded on (optional).
    pub fn OTF2_Archive_SetMachineName(
        archive: *mut OTF2_Archive,
        machineName: *const c_char,
    ) -> OTF2_ErrorCode;
    /// Adds a trace file property (`NAMESPACE::NAME`, case-insensitive,
    /// `[A-Z0-9_]`), stored in the anchor file.
    pub fn OTF2_Archive_SetProperty(
        archive: *mut OTF2_Archive,
        name: *const c_char,
        value: *const c_char,
        overwrite: bool,
    ) -> OTF2_ErrorCode;
    /// Sets the flush callbacks; `flushCallbacks` is copied.
    pub fn OTF2_Archive_SetFlushCallbacks(
        archive: *mut OTF2_Archive,
        flushCallbacks: *const OTF2_FlushCallbacks,
        flushData: *mut c_void,
    ) -> OTF2_ErrorCode;
    /// Sets the collective callbacks to OTF2's serial implementation: one
    /// process writes the whole archive.
    pub fn OTF2_Archive_SetSerialCollectiveCallbacks(archive: *mut OTF2_Archive) -> OTF2_ErrorCode;
    /// Opens the event file container (collective).
    pub fn OTF2_Archive_OpenEvtFiles(archive: *mut OTF2_Archive) -> OTF2_ErrorCode;
    /// Closes the event file container (collective).
    pub fn OTF2_Archive_CloseEvtFiles(archive: *mut OTF2_Archive) -> OTF2_ErrorCode;
    /// Opens the local definition file container (collective).
    pub fn OTF2_Archive_OpenDefFiles(archive: *mut OTF2_Archive) -> OTF2_ErrorCode;
    /// Closes the local definition file container (collective).
    pub fn OTF2_Archive_CloseDefFiles(archive: *mut OTF2_Archive) -> OTF2_ErrorCode;
    /// The event writer of a location; null on failure.
    pub fn OTF2_Archive_GetEvtWriter(
        archive: *mut OTF2_Archive,
        location: OTF2_LocationRef,
    ) -> *mut OTF2_EvtWriter;
    /// Flushes and closes an event writer.
    pub fn OTF2_Archive_CloseEvtWriter(
        archive: *mut OTF2_Archive,
        writer: *mut OTF2_EvtWriter,
    ) -> OTF2_ErrorCode;
    /// The local definition writer of a location; null on failure.
    pub fn OTF2_Archive_GetDefWriter(
        archive: *mut OTF2_Archive,
        location: OTF2_LocationRef,
    ) -> *mut OTF2_DefWriter;
    /// Flushes and closes a local definition writer.
    pub fn OTF2_Archive_CloseDefWriter(
        archive: *mut OTF2_Archive,
        writer: *mut OTF2_DefWriter,
    ) -> OTF2_ErrorCode;
    /// The global definition writer (primary archive only); null on failure.
    pub fn OTF2_Archive_GetGlobalDefWriter(archive: *mut OTF2_Archive)
    -> *mut OTF2_GlobalDefWriter;
    /// Flushes and closes the global definition writer.
    pub fn OTF2_Archive_CloseGlobalDefWriter(
        archive: *mut OTF2_Archive,
        writer: *mut OTF2_GlobalDefWriter,
    ) -> OTF2_ErrorCode;
}

// ___ OTF2_GlobalDefWriter.h __________________________________________________

unsafe extern "C" {
    /// ClockProperties: ticks per second, a timestamp no event precedes, a
    /// span covering every event, and the realtime (ns since the Unix epoch)
    /// of `globalOffset`, or [`OTF2_UNDEFINED_TIMESTAMP`].
    pub fn OTF2_GlobalDefWriter_WriteClockProperties(
        writerHandle: *mut OTF2_GlobalDefWriter,
        timerResolution: u64,
        globalOffset: u64,
        traceLength: u64,
        realtimeTimestamp: u64,
    ) -> OTF2_ErrorCode;
    /// Paradigm: attests that a paradigm was available, with its name.
    pub fn OTF2_GlobalDefWriter_WriteParadigm(
        writerHandle: *mut OTF2_GlobalDefWriter,
        paradigm: OTF2_Paradigm,
        name: OTF2_StringRef,
        paradigmClass: OTF2_ParadigmClass,
    ) -> OTF2_ErrorCode;
    /// String.
    pub fn OTF2_GlobalDefWriter_WriteString(
        writerHandle: *mut OTF2_GlobalDefWriter,
        self_: OTF2_StringRef,
        string: *const c_char,
    ) -> OTF2_ErrorCode;
    /// SystemTreeNode; the root's parent is
    /// [`OTF2_UNDEFINED_SYSTEM_TREE_NODE`].
    pub fn OTF2_GlobalDefWriter_WriteSystemTreeNode(
        writerHandle: *mut OTF2_GlobalDefWriter,
        self_: OTF2_SystemTreeNodeRef,
        name: OTF2_StringRef,
        className: OTF2_StringRef,
        parent: OTF2_SystemTreeNodeRef,
    ) -> OTF2_ErrorCode;
    /// SystemTreeNodeDomain: a domain a system tree node belongs to.
    pub fn OTF2_GlobalDefWriter_WriteSystemTreeNodeDomain(
        writerHandle: *mut OTF2_GlobalDefWriter,
        systemTreeNode: OTF2_SystemTreeNodeRef,
        systemTreeDomain: OTF2_SystemTreeDomain,
    ) -> OTF2_ErrorCode;
    /// LocationGroup (a process).
    pub fn OTF2_GlobalDefWriter_WriteLocationGroup(
        writerHandle: *mut OTF2_GlobalDefWriter,
        self_: OTF2_LocationGroupRef,
        name: OTF2_StringRef,
        locationGroupType: OTF2_LocationGroupType,
        systemTreeParent: OTF2_SystemTreeNodeRef,
        creatingLocationGroup: OTF2_LocationGroupRef,
    ) -> OTF2_ErrorCode;
    /// LocationGroupProperty: a named, typed value attached to a location
    /// group.
    pub fn OTF2_GlobalDefWriter_WriteLocationGroupProperty(
        writerHandle: *mut OTF2_GlobalDefWriter,
        locationGroup: OTF2_LocationGroupRef,
        name: OTF2_StringRef,
        type_: OTF2_Type,
        value: OTF2_AttributeValue,
    ) -> OTF2_ErrorCode;
    /// Location (a thread), with the number of events it recorded.
    pub fn OTF2_GlobalDefWriter_WriteLocation(
        writerHandle: *mut OTF2_GlobalDefWriter,
        self_: OTF2_LocationRef,
        name: OTF2_StringRef,
        locationType: OTF2_LocationType,
        numberOfEvents: u64,
        locationGroup: OTF2_LocationGroupRef,
    ) -> OTF2_ErrorCode;
    /// Region.
    pub fn OTF2_GlobalDefWriter_WriteRegion(
        writerHandle: *mut OTF2_GlobalDefWriter,
        self_: OTF2_RegionRef,
        name: OTF2_StringRef,
        canonicalName: OTF2_StringRef,
        description: OTF2_StringRef,
        regionRole: OTF2_RegionRole,
        paradigm: OTF2_Paradigm,
        regionFlags: OTF2_RegionFlag,
        sourceFile: OTF2_StringRef,
        beginLineNumber: u32,
        endLineNumber: u32,
    ) -> OTF2_ErrorCode;
    /// Group; `members` has `numberOfMembers` entries.
    pub fn OTF2_GlobalDefWriter_WriteGroup(
        writerHandle: *mut OTF2_GlobalDefWriter,
        self_: OTF2_GroupRef,
        name: OTF2_StringRef,
        groupType: OTF2_GroupType,
        paradigm: OTF2_Paradigm,
        groupFlags: OTF2_GroupFlag,
        numberOfMembers: u32,
        members: *const u64,
    ) -> OTF2_ErrorCode;
    /// MetricMember: one metric (name, unit, mode, value type).
    pub fn OTF2_GlobalDefWriter_WriteMetricMember(
        writerHandle: *mut OTF2_GlobalDefWriter,
        self_: OTF2_MetricMemberRef,
        name: OTF2_StringRef,
        description: OTF2_StringRef,
        metricType: OTF2_MetricType,
        metricMode: OTF2_MetricMode,
        valueType: OTF2_Type,
        base: OTF2_Base,
        exponent: i64,
        unit: OTF2_StringRef,
    ) -> OTF2_ErrorCode;
    /// MetricClass: the members a Metric event carries, in order.
    pub fn OTF2_GlobalDefWriter_WriteMetricClass(
        writerHandle: *mut OTF2_GlobalDefWriter,
        self_: OTF2_MetricRef,
        numberOfMetrics: u8,
        metricMembers: *const OTF2_MetricMemberRef,
        metricOccurrence: OTF2_MetricOccurrence,
        recorderKind: OTF2_RecorderKind,
    ) -> OTF2_ErrorCode;
    /// Comm: an MPI communicator over a `COMM_GROUP` group.
    pub fn OTF2_GlobalDefWriter_WriteComm(
        writerHandle: *mut OTF2_GlobalDefWriter,
        self_: OTF2_CommRef,
        name: OTF2_StringRef,
        group: OTF2_GroupRef,
        parent: OTF2_CommRef,
        flags: OTF2_CommFlag,
    ) -> OTF2_ErrorCode;
}

// ___ OTF2_EvtWriter.h ________________________________________________________

unsafe extern "C" {
    /// Enter a region.
    pub fn OTF2_EvtWriter_Enter(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        region: OTF2_RegionRef,
    ) -> OTF2_ErrorCode;
    /// Leave a region.
    pub fn OTF2_EvtWriter_Leave(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        region: OTF2_RegionRef,
    ) -> OTF2_ErrorCode;
    /// A blocking send; `receiver` is a rank in `communicator`.
    pub fn OTF2_EvtWriter_MpiSend(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        receiver: u32,
        communicator: OTF2_CommRef,
        msgTag: u32,
        msgLength: u64,
    ) -> OTF2_ErrorCode;
    /// A nonblocking send was started.
    pub fn OTF2_EvtWriter_MpiIsend(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        receiver: u32,
        communicator: OTF2_CommRef,
        msgTag: u32,
        msgLength: u64,
        requestID: u64,
    ) -> OTF2_ErrorCode;
    /// A nonblocking send completed.
    pub fn OTF2_EvtWriter_MpiIsendComplete(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        requestID: u64,
    ) -> OTF2_ErrorCode;
    /// A nonblocking receive was posted.
    pub fn OTF2_EvtWriter_MpiIrecvRequest(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        requestID: u64,
    ) -> OTF2_ErrorCode;
    /// A nonblocking receive completed; `sender` is a rank in `communicator`.
    pub fn OTF2_EvtWriter_MpiIrecv(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        sender: u32,
        communicator: OTF2_CommRef,
        msgTag: u32,
        msgLength: u64,
        requestID: u64,
    ) -> OTF2_ErrorCode;
    /// A blocking receive completed; `sender` is a rank in `communicator`.
    pub fn OTF2_EvtWriter_MpiRecv(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        sender: u32,
        communicator: OTF2_CommRef,
        msgTag: u32,
        msgLength: u64,
    ) -> OTF2_ErrorCode;
    /// A request was tested without completing.
    pub fn OTF2_EvtWriter_MpiRequestTest(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        requestID: u64,
    ) -> OTF2_ErrorCode;
    /// A request was cancelled.
    pub fn OTF2_EvtWriter_MpiRequestCancelled(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        requestID: u64,
    ) -> OTF2_ErrorCode;
    /// A collective operation begins.
    pub fn OTF2_EvtWriter_MpiCollectiveBegin(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
    ) -> OTF2_ErrorCode;
    /// A collective operation ends; `root` is a rank in `communicator` or
    /// [`OTF2_COLLECTIVE_ROOT_NONE`].
    pub fn OTF2_EvtWriter_MpiCollectiveEnd(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        collectiveOp: OTF2_CollectiveOp,
        communicator: OTF2_CommRef,
        root: u32,
        sizeSent: u64,
        sizeReceived: u64,
    ) -> OTF2_ErrorCode;
    /// Metric values of a metric class, one per member.
    pub fn OTF2_EvtWriter_Metric(
        writer: *mut OTF2_EvtWriter,
        attributeList: *mut OTF2_AttributeList,
        time: OTF2_TimeStamp,
        metric: OTF2_MetricRef,
        numberOfMetrics: u8,
        typeIDs: *const OTF2_Type,
        metricValues: *const OTF2_MetricValue,
    ) -> OTF2_ErrorCode;
    /// The number of events written so far.
    pub fn OTF2_EvtWriter_GetNumberOfEvents(
        writer: *mut OTF2_EvtWriter,
        numberOfEvents: *mut u64,
    ) -> OTF2_ErrorCode;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The library links and answers: the error names are OTF2's (without the prefix).
    #[test]
    fn links_and_names_errors() {
        // SAFETY: OTF2_Error_GetName returns a static NUL-terminated string.
        let name = unsafe { core::ffi::CStr::from_ptr(OTF2_Error_GetName(OTF2_SUCCESS)) };
        assert_eq!(name.to_str().unwrap(), "SUCCESS");
    }
}
