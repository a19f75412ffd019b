//! The shared-memory segment through which the shim's `stats` layer exports
//! argument-level figures to the daemon: one segment per process, created
//! `0600` by the process itself at `/dev/shm/mpi-observer.<pid>`.
//!
//! The layout is fixed and versioned. Every counter is an atomic the process
//! updates lock-free; the daemon only reads. The daemon never takes identity
//! from here (pid, uid, rank and job come from `/proc`), and it validates
//! every size and offset before reading, so a truncated, corrupt or hostile
//! segment can only be skipped, never believed beyond its own figures.
//!
//! ```text
//! Header | RankCounters | PeerCounters[peer_slots] | FunctionCounters[function_slots] | RequestSlot[request_slots]
//!        | CallTiming[function_slots]
//! ```

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

use crate::maps::HIST_SLOTS;

/// First bytes of every segment.
pub const MAGIC: [u8; 8] = *b"MPIOSEG\0";
/// Layout version; bump on any change below.
pub const VERSION: u32 = 2;
/// Segment path prefix; the pid follows.
pub const PATH_PREFIX: &str = "/dev/shm/mpi-observer.";
/// Most peers with a counter of their own; traffic with world ranks at or
/// beyond this is counted in [`RankCounters::peer_overflow_messages`].
pub const MAX_PEER_SLOTS: u32 = 65_536;
/// Outstanding requests tracked at once; more are counted in
/// [`RankCounters::request_table_full`] and not tracked.
pub const REQUEST_SLOTS: u32 = 4_096;
/// Largest segment the daemon accepts.
pub const MAX_SEGMENT_BYTES: u64 = 64 << 20;

/// Direction index: data this rank sent.
pub const SEND: usize = 0;
/// Direction index: data this rank received.
pub const RECV: usize = 1;

/// The segment header. `ready` is set (Release) last, once the whole segment
/// is initialised; a reader ignores a segment that is not ready.
#[repr(C)]
pub struct Header {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`VERSION`].
    pub version: u32,
    /// `size_of::<Header>()`.
    pub header_size: u32,
    /// Size of the whole segment in bytes.
    pub total_size: u64,
    /// The function ID space this segment's function array uses
    /// (`generated::functions::SPEC_FINGERPRINT`).
    pub spec_fingerprint: u64,
    /// `MPI_COMM_WORLD` size as the process saw it.
    pub world_size: u32,
    /// Length of the peer array: `min(world_size, MAX_PEER_SLOTS)`.
    pub peer_slots: u32,
    /// Length of the function array (`FUNCTION_COUNT`).
    pub function_slots: u32,
    /// Length of the request table ([`REQUEST_SLOTS`]).
    pub request_slots: u32,
    /// Byte offset of the [`RankCounters`].
    pub counters_offset: u64,
    /// Byte offset of the [`PeerCounters`] array.
    pub peers_offset: u64,
    /// Byte offset of the [`FunctionCounters`] array.
    pub functions_offset: u64,
    /// Byte offset of the [`RequestSlot`] array.
    pub requests_offset: u64,
    /// Byte offset of the [`CallTiming`] array (`function_slots` long).
    pub timing_offset: u64,
    /// 1 once initialised.
    pub ready: AtomicU32,
    /// [`flags`]: how the segment's figures relate to the process.
    pub flags: AtomicU32,
}

/// Bits of [`Header::flags`].
pub mod flags {
    /// The shim was injected into the running process (`mpi-observer attach
    /// --inject`): the timing block counts the calls made from the
    /// injection on, not from the process's start, so a reader adds it to
    /// what it counted before instead of replacing that.
    pub const INJECTED: u32 = 1;
    /// Set with `INJECTED` when the daemon detached the injected shim: its
    /// slots are back, it counts nothing more, and a daemon attaching later
    /// probes the rank again (the timing block keeps what it counted).
    pub const EJECTED: u32 = 2;
    /// Every bit a reader of this version knows.
    pub const KNOWN: u32 = INJECTED | EJECTED;
}

/// Rank-wide counters.
#[repr(C)]
#[derive(Default)]
pub struct RankCounters {
    /// Nonblocking and persistent requests started (Isend, Irecv, Start...).
    pub requests_started: AtomicU64,
    /// Requests seen completing through the Wait/Test families.
    pub requests_completed: AtomicU64,
    /// Requests cancelled (MPI_Cancel followed by completion).
    pub requests_cancelled: AtomicU64,
    /// Requests not tracked because the table was full.
    pub request_table_full: AtomicU64,
    /// Persistent requests created and not yet freed.
    pub persistent_requests: AtomicI32,
    /// Zero.
    pub reserved: u32,
    /// Messages to or from world ranks beyond the peer array.
    pub peer_overflow_messages: AtomicU64,
    /// Messages whose peer or size could not be determined.
    pub unattributed_messages: AtomicU64,
}

/// Point-to-point traffic with one peer (a world rank), per direction
/// ([`SEND`], [`RECV`]).
#[repr(C)]
#[derive(Default)]
pub struct PeerCounters {
    /// Messages.
    pub messages: [AtomicU64; 2],
    /// Bytes.
    pub bytes: [AtomicU64; 2],
}

/// Per-function figures of the stats layer, indexed by function ID; used
/// for collectives (calls and bytes by the layer's documented definition).
#[repr(C)]
#[derive(Default)]
pub struct FunctionCounters {
    /// Calls.
    pub calls: AtomicU64,
    /// Bytes per direction.
    pub bytes: [AtomicU64; 2],
}

/// The shim's timing of one function at the application's level: only
/// the outermost MPI call of each thread counts, as with the probes
/// (`observer-ebpf/src/calls.rs`), indexed by function ID.
#[repr(C)]
#[derive(Default)]
pub struct CallTiming {
    /// Calls completed.
    pub calls: AtomicU64,
    /// Their total time in nanoseconds (`CLOCK_MONOTONIC`'s rate).
    pub time_ns: AtomicU64,
    /// Bytes per direction ([`SEND`], [`RECV`]) by the probes' definition
    /// (README, "Byte conventions"): count x type size of the arguments
    /// each function's [`crate::functions::BytePart`]s name.
    pub bytes: [AtomicU64; 2],
    /// Calls whose byte figure for that direction could not be known.
    pub bytes_unknown: [AtomicU64; 2],
    /// log2 latency histogram: slot [`crate::maps::hist_slot`] of each
    /// call's nanoseconds, the probes' buckets.
    pub hist: [AtomicU64; HIST_SLOTS],
}

/// State of a [`RequestSlot`].
pub mod request_state {
    /// Unused.
    pub const FREE: u32 = 0;
    /// A nonblocking operation in progress.
    pub const ACTIVE: u32 = 1;
    /// A persistent request, created or completed, not started.
    pub const PERSISTENT_INACTIVE: u32 = 2;
    /// A persistent request started and not yet completed.
    pub const PERSISTENT_ACTIVE: u32 = 3;
    /// A slot being claimed or released by the process.
    pub const BUSY: u32 = 4;
}

/// One tracked request. The process owns the slot while `state` is
/// [`request_state::BUSY`]; readers skip such slots.
#[repr(C)]
#[derive(Default)]
pub struct RequestSlot {
    /// The request handle's value (pointer or int), 0 when free.
    pub handle: AtomicU64,
    /// One of [`request_state`].
    pub state: AtomicU32,
    /// Peer world rank, or -1 for a wildcard or collective.
    pub peer: AtomicI32,
    /// `CLOCK_MONOTONIC` nanoseconds when the operation started (the
    /// coarse variant is fine: it is the same clock at tick resolution).
    pub started_ns: AtomicU64,
    /// Expected bytes (posted size for receives).
    pub bytes: AtomicU64,
}

/// Byte size of a segment for a world of `peer_slots` peers.
pub const fn segment_size(peer_slots: u32, function_slots: u32, request_slots: u32) -> u64 {
    let h = core::mem::size_of::<Header>() as u64;
    let c = core::mem::size_of::<RankCounters>() as u64;
    let p = core::mem::size_of::<PeerCounters>() as u64 * peer_slots as u64;
    let f = core::mem::size_of::<FunctionCounters>() as u64 * function_slots as u64;
    let r = core::mem::size_of::<RequestSlot>() as u64 * request_slots as u64;
    let t = core::mem::size_of::<CallTiming>() as u64 * function_slots as u64;
    h + c + p + f + r + t
}

/// The offset of the [`CallTiming`] array of a well-formed segment: after
/// the request table.
pub const fn timing_offset(peer_slots: u32, function_slots: u32, request_slots: u32) -> u64 {
    let (_, _, _, requests) = offsets(peer_slots, function_slots);
    requests + core::mem::size_of::<RequestSlot>() as u64 * request_slots as u64
}

/// The offsets a well-formed segment has: (counters, peers, functions,
/// requests). Both sides compute them the same way; the daemon rejects a
/// header that disagrees.
pub const fn offsets(peer_slots: u32, function_slots: u32) -> (u64, u64, u64, u64) {
    let counters = core::mem::size_of::<Header>() as u64;
    let peers = counters + core::mem::size_of::<RankCounters>() as u64;
    let functions = peers + core::mem::size_of::<PeerCounters>() as u64 * peer_slots as u64;
    let requests =
        functions + core::mem::size_of::<FunctionCounters>() as u64 * function_slots as u64;
    (counters, peers, functions, requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stable() {
        // A change here is a layout change: bump VERSION with it.
        assert_eq!(core::mem::size_of::<Header>(), 96);
        assert_eq!(core::mem::size_of::<RankCounters>(), 56);
        assert_eq!(core::mem::size_of::<PeerCounters>(), 32);
        assert_eq!(core::mem::size_of::<FunctionCounters>(), 24);
        assert_eq!(core::mem::size_of::<RequestSlot>(), 32);
        assert_eq!(core::mem::size_of::<CallTiming>(), 304);
        let (c, p, f, r) = offsets(4, 10);
        assert_eq!((c, p, f, r), (96, 152, 280, 520));
        let t = timing_offset(4, 10, 2);
        assert_eq!(t, 520 + 64);
        assert_eq!(segment_size(4, 10, 2), t + 304 * 10);
        // Every array starts 8-byte aligned, so its atomics are naturally aligned.
        for o in [c, p, f, r, t] {
            assert_eq!(o % 8, 0);
        }
    }
}
