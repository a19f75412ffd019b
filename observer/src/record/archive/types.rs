//! What a caller hands the archive: ranks, communicators, regions and
//! events, as plain values.

use std::collections::BTreeMap;
use std::path::PathBuf;

use otf2_sys as sys;

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
    pub(super) fn raw(self) -> sys::OTF2_CollectiveOp {
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
    pub(super) fn raw(self) -> sys::OTF2_RegionRole {
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
