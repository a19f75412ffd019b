//! The shared-memory segment through which the shim's `stats` layer exports
//! argument-level figures to the daemon: one segment per process, created
//! `0600` by the process itself at `/dev/shm/mpi-observer.<uid>.<pid>.<random>`
//! (see [`Name`]).
//!
//! The layout is fixed and versioned. Every counter is an atomic the process
//! updates lock-free; the daemon only reads. The daemon never takes identity
//! from here (pid, uid, rank and job come from `/proc`), and it validates
//! every size and offset before reading, so a truncated, corrupt or hostile
//! segment can only be skipped, never believed beyond its own figures.
//!
//! ```text
//! Header | RankCounters | PeerCounters[peer_slots] | FunctionCounters[function_slots] | RequestSlot[request_slots]
//!        | CallTiming[function_slots] | CallsiteSlot[callsite_slots]
//!        | waits::RingHeader waits::Record[wait_slots]
//! ```
//!
//! Version 3 is version 2 with fields appended: the [`Header`] gains the
//! call-site table's offset and length, the [`RankCounters`] gain
//! `callsite_table_full` and the message-size histogram, and the call-site
//! table follows the timing block. Every field of version 2 keeps its
//! offset inside its struct; only the structs' sizes, and so the arrays'
//! offsets, differ. [`Layout::new`] gives both versions' offsets, so a
//! reader of version 3 reads version 2 too ([`V2`]).
//!
//! Version 4 appends the wait-state ring ([`crate::waits`]) after the
//! call-site table, and its offset, length and sampling period to the
//! [`Header`]; readers accept versions 2 to 4 ([`V3`]).

use core::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

use crate::maps::HIST_SLOTS;

/// First bytes of every segment.
pub const MAGIC: [u8; 8] = *b"MPIOSEG\0";
/// Layout version; bump on any change below.
pub const VERSION: u32 = 4;
/// The version before the wait-state ring, which readers still accept.
pub const V3: u32 = 3;
/// `size_of::<Header>()` in version 3: the fields up to `reserved`.
pub const V3_HEADER_SIZE: u64 = 112;
/// The previous layout version, which readers still accept: no call-site
/// table, no message-size histogram (see [`Layout::new`]).
pub const V2: u32 = 2;
/// `size_of::<Header>()` in version 2: the fields up to `flags`.
pub const V2_HEADER_SIZE: u64 = 96;
/// `size_of::<RankCounters>()` in version 2: the fields up to
/// `unattributed_messages`.
pub const V2_RANK_COUNTERS_SIZE: u64 = 56;
/// The directory of the segments and trace files.
pub const DIR: &str = "/dev/shm";
/// Segment path prefix: `<uid>.<pid>.<random>` follows (see [`Name`]).
pub const PATH_PREFIX: &str = "/dev/shm/mpi-observer.";
/// The file-name prefix in [`DIR`].
pub const NAME_PREFIX: &str = "mpi-observer.";
/// Where the shim knocks at exit so the daemon holds its segment before it
/// is unlinked (the daemon's `--handover-socket`, the shim's
/// `MPI_OBSERVER_HANDOVER_SOCKET`).
pub const HANDOVER_SOCKET: &str = "/run/mpi-observer/handover.sock";
/// Where a user's runtime directories are (`/run/user/UID`, made by the
/// login manager, mode 0700) when `XDG_RUNTIME_DIR` names none: a daemon
/// run by that user (not root) listens for its ranks' knocks under it.
pub const USER_RUNTIME_ROOT: &str = "/run/user";
/// The variable naming a user's runtime directory.
pub const USER_RUNTIME_VAR: &str = "XDG_RUNTIME_DIR";
/// A user's own handover socket, relative to their runtime directory: its
/// directory is the user's, mode 0700, the socket 0600.
pub const USER_HANDOVER_SOCKET: &str = "mpi-observer/handover.sock";
/// The knock's one message: a name and a version.
pub const HANDOVER_MAGIC: &[u8; 8] = b"MPIOHO01";

/// A segment's or trace file's name in [`DIR`]:
/// `mpi-observer.<uid>.<pid>.<16 hex digits>`, plus
/// [`crate::trace::PATH_SUFFIX`] for the trace file.
///
/// The random part (64 bits from `getrandom`) is what makes the name
/// unsquattable: earlier shims named the segment
/// `mpi-observer.<pid>`, and a user could pre-create the names of the next
/// pids, so another user's shim found its name taken and fell back to
/// pass-through. Nobody needs to guess the name: the shim keeps both files
/// mapped, and the daemon and `record` find them in `/proc/PID/maps`. The
/// old form is still recognised ([`Name::parse`], `uid` = `None`), only so
/// that orphans of older shims can be removed; nothing reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Name {
    /// The creator's real uid; `None` in the old form.
    pub uid: Option<u32>,
    /// The creating process.
    pub pid: u32,
    /// The random part; `None` in the old form.
    pub random: Option<u64>,
    /// The trace file (`.trace`), not the segment.
    pub trace: bool,
}

impl Name {
    /// Parses a file name (no directory); `None` for anything else.
    pub fn parse(name: &str) -> Option<Name> {
        let rest = name.strip_prefix(NAME_PREFIX)?;
        let (rest, trace) = match rest.strip_suffix(crate::trace::PATH_SUFFIX) {
            Some(r) => (r, true),
            None => (rest, false),
        };
        let num = |s: &str| -> Option<u32> {
            if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        let mut parts = rest.split('.');
        let (a, b, c) = (parts.next()?, parts.next(), parts.next());
        if parts.next().is_some() {
            return None;
        }
        match (b, c) {
            (None, None) => Some(Name {
                uid: None,
                pid: num(a)?,
                random: None,
                trace,
            }),
            (Some(b), Some(c))
                if c.len() == 16 && c.bytes().all(|x| matches!(x, b'0'..=b'9' | b'a'..=b'f')) =>
            {
                Some(Name {
                    uid: Some(num(a)?),
                    pid: num(b)?,
                    random: Some(u64::from_str_radix(c, 16).ok()?),
                    trace,
                })
            }
            _ => None,
        }
    }

    /// Writes the file name (no directory) into `out`; returns its length.
    /// `out` of [`NAME_MAX`] bytes always suffices.
    pub fn write(&self, out: &mut [u8; NAME_MAX]) -> usize {
        struct W<'a>(&'a mut [u8; NAME_MAX], usize);
        impl core::fmt::Write for W<'_> {
            fn write_str(&mut self, s: &str) -> core::fmt::Result {
                let end = self.1 + s.len();
                self.0
                    .get_mut(self.1..end)
                    .ok_or(core::fmt::Error)?
                    .copy_from_slice(s.as_bytes());
                self.1 = end;
                Ok(())
            }
        }
        let mut w = W(out, 0);
        let suffix = if self.trace {
            crate::trace::PATH_SUFFIX
        } else {
            ""
        };
        let _ = match (self.uid, self.random) {
            (Some(u), Some(r)) => core::fmt::write(
                &mut w,
                format_args!("{NAME_PREFIX}{u}.{}.{r:016x}{suffix}", self.pid),
            ),
            _ => core::fmt::write(&mut w, format_args!("{NAME_PREFIX}{}{suffix}", self.pid)),
        };
        w.1
    }
}

/// Longest name [`Name::write`] makes, with room to spare.
pub const NAME_MAX: usize = 64;
/// Most peers with a counter of their own; traffic with world ranks at or
/// beyond this is counted in [`RankCounters::peer_overflow_messages`].
pub const MAX_PEER_SLOTS: u32 = 65_536;
/// Outstanding requests tracked at once; more are counted in
/// [`RankCounters::request_table_full`] and not tracked.
pub const REQUEST_SLOTS: u32 = 4_096;
/// Slots of the call-site table ([`CallsiteSlot`]); a power of two.
pub const CALLSITE_SLOTS: u32 = 1_024;
/// Slots a call site probes, from its hash on, before it counts in
/// [`RankCounters::callsite_table_full`] instead.
pub const CALLSITE_PROBE: usize = 16;
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
    /// Byte offset of the [`CallsiteSlot`] array (version 3): after the
    /// timing block.
    pub callsites_offset: u64,
    /// Length of the call-site table: [`CALLSITE_SLOTS`], or 0 when the
    /// process records no call sites (`MPI_OBSERVER_CALLSITES=0`).
    pub callsite_slots: u32,
    /// Zero.
    pub reserved: u32,
    /// Byte offset of the wait-state ring (version 4): after the call-site
    /// table.
    pub waits_offset: u64,
    /// Records the ring holds (a power of two): [`crate::waits::RING_SLOTS`],
    /// or 0 when the process keeps none (`MPI_OBSERVER_WAITS=0`, or a shim
    /// injected into a running process, whose sequence numbers would not
    /// line up with its job's other ranks').
    pub wait_slots: u32,
    /// log2 of the sampling period: the process records collective
    /// instances whose sequence number is a multiple of `1 << shift`.
    pub wait_sample_shift: u32,
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
    /// Application calls timed while the call-site table had no free slot
    /// in their probe window: not in the table (version 3).
    pub callsite_table_full: AtomicU64,
    /// Message sizes per direction ([`SEND`], [`RECV`]): slot
    /// [`crate::maps::hist_slot`] of each message's bytes, counted with
    /// each message a [`PeerCounters`] entry counts (so each direction's
    /// slots sum to that direction's messages over the peer array; actual
    /// sizes for receives). Version 3.
    pub msg_size_hist: [[AtomicU64; HIST_SLOTS]; 2],
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

/// One slot of the call-site table: the calls an application made of one
/// function from one call site, and their time, as the timing block
/// counts them (outermost calls, at the application's level).
///
/// The table is an open-addressing hash: a key starts its search at
/// [`callsite_hash`] and probes up to [`CALLSITE_PROBE`] slots onward
/// (wrapping), taking the first that holds its key or, with a
/// compare-and-swap from 0, the first free one. Keys never leave a slot.
#[repr(C)]
#[derive(Default)]
pub struct CallsiteSlot {
    /// [`callsite_key`]: the return address and the function; 0 = free.
    pub key: AtomicU64,
    /// Calls completed from there.
    pub calls: AtomicU64,
    /// Their total time in nanoseconds.
    pub time_ns: AtomicU64,
}

/// Bits of a call-site key that hold the return address (user addresses
/// are below 2^47).
pub const CALLSITE_ADDR_MASK: u64 = (1 << 48) - 1;

/// A call-site table key: the return address `addr` (the instruction after
/// the application's call) in bits 0..48, `function + 1` in bits 48..64,
/// so no key is 0.
pub const fn callsite_key(function: u16, addr: u64) -> u64 {
    (addr & CALLSITE_ADDR_MASK) | ((function as u64 + 1) << 48)
}

/// The function ID and return address of a key; `None` for a free slot or
/// a key no writer makes (an address at or above 2^47).
pub const fn callsite_decode(key: u64) -> Option<(u16, u64)> {
    let f = key >> 48;
    let addr = key & CALLSITE_ADDR_MASK;
    if f == 0 || addr >> 47 != 0 {
        return None;
    }
    Some(((f - 1) as u16, addr))
}

/// The first slot a key probes in a table of `slots`: Fibonacci hashing
/// (every bit of the key mixes into the product's high half), scaled to the
/// table. For [`CALLSITE_SLOTS`] it is the product's top 10 bits.
pub const fn callsite_hash(key: u64, slots: u32) -> usize {
    let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
    ((h * slots as u64) >> 32) as usize
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

/// Where a segment's parts lie, for one layout version and one set of
/// array lengths. The writer and the reader compute it the same way; the
/// reader rejects a header that disagrees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `size_of::<Header>()` of that version.
    pub header_size: u64,
    /// The [`RankCounters`].
    pub counters: u64,
    /// The [`PeerCounters`] array.
    pub peers: u64,
    /// The [`FunctionCounters`] array.
    pub functions: u64,
    /// The [`RequestSlot`] array.
    pub requests: u64,
    /// The [`CallTiming`] array.
    pub timing: u64,
    /// The [`CallsiteSlot`] array (version 3; in version 2 the end).
    pub callsites: u64,
    /// The wait-state ring (version 4; before it, the end).
    pub waits: u64,
    /// The whole segment's size.
    pub size: u64,
}

impl Layout {
    /// The layout of a segment of `version` ([`VERSION`], [`V3`] or [`V2`])
    /// with these array lengths; `callsite_slots` counts from version 3 on,
    /// `wait_slots` from version 4 on.
    pub const fn new(
        version: u32,
        peer_slots: u32,
        function_slots: u32,
        request_slots: u32,
        callsite_slots: u32,
        wait_slots: u32,
    ) -> Layout {
        use core::mem::size_of;
        let (header_size, counters_size, callsite_slots, wait_slots) = if version == V2 {
            (V2_HEADER_SIZE, V2_RANK_COUNTERS_SIZE, 0, 0)
        } else if version == V3 {
            (
                V3_HEADER_SIZE,
                size_of::<RankCounters>() as u64,
                callsite_slots as u64,
                0,
            )
        } else {
            (
                size_of::<Header>() as u64,
                size_of::<RankCounters>() as u64,
                callsite_slots as u64,
                wait_slots,
            )
        };
        let counters = header_size;
        let peers = counters + counters_size;
        let functions = peers + size_of::<PeerCounters>() as u64 * peer_slots as u64;
        let requests = functions + size_of::<FunctionCounters>() as u64 * function_slots as u64;
        let timing = requests + size_of::<RequestSlot>() as u64 * request_slots as u64;
        let callsites = timing + size_of::<CallTiming>() as u64 * function_slots as u64;
        let waits = callsites + size_of::<CallsiteSlot>() as u64 * callsite_slots;
        let size = waits + crate::waits::ring_bytes(wait_slots);
        Layout {
            header_size,
            counters,
            peers,
            functions,
            requests,
            timing,
            callsites,
            waits,
            size,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_strangers_are_refused() {
        let n = Name {
            uid: Some(1000),
            pid: 4242,
            random: Some(0x0123_4567_89ab_cdef),
            trace: false,
        };
        let mut b = [0u8; NAME_MAX];
        let len = n.write(&mut b);
        let s = core::str::from_utf8(&b[..len]).unwrap();
        assert_eq!(s, "mpi-observer.1000.4242.0123456789abcdef");
        assert_eq!(Name::parse(s), Some(n));
        let t = Name { trace: true, ..n };
        let len = t.write(&mut b);
        let s = core::str::from_utf8(&b[..len]).unwrap();
        assert_eq!(s, "mpi-observer.1000.4242.0123456789abcdef.trace");
        assert_eq!(Name::parse(s), Some(t));
        // The longest name fits.
        let max = Name {
            uid: Some(u32::MAX),
            pid: u32::MAX,
            random: Some(u64::MAX),
            trace: true,
        };
        let len = max.write(&mut b);
        assert_eq!(
            Name::parse(core::str::from_utf8(&b[..len]).unwrap()),
            Some(max)
        );
        // The old form, for orphans only.
        assert_eq!(
            Name::parse("mpi-observer.77.trace"),
            Some(Name {
                uid: None,
                pid: 77,
                random: None,
                trace: true
            })
        );
        for bad in [
            "mpi-observer.",
            "mpi-observer.x",
            "mpi-observer.1.2",
            "mpi-observer.1.2.0123456789ABCDEF",
            "mpi-observer.1.2.0123456789abcde",
            "mpi-observer.1.2.0123456789abcdef.x",
            "mpi-observer.1.2.3.4",
            "mpi-observer.99999999999",
            "mpi-observer-test.1.ok",
            "mpi-observer.+1",
        ] {
            assert_eq!(Name::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn layout_is_stable() {
        // A change here is a layout change: bump VERSION with it.
        assert_eq!(core::mem::size_of::<Header>(), 128);
        assert_eq!(core::mem::size_of::<RankCounters>(), 576);
        assert_eq!(core::mem::size_of::<PeerCounters>(), 32);
        assert_eq!(core::mem::size_of::<FunctionCounters>(), 24);
        assert_eq!(core::mem::size_of::<RequestSlot>(), 32);
        assert_eq!(core::mem::size_of::<CallTiming>(), 304);
        assert_eq!(core::mem::size_of::<CallsiteSlot>(), 24);
        let l = Layout::new(VERSION, 4, 10, 2, 8, 16);
        assert_eq!(l.header_size, 128);
        assert_eq!(
            (l.counters, l.peers, l.functions, l.requests),
            (128, 704, 832, 1072)
        );
        assert_eq!(l.timing, 1072 + 64);
        assert_eq!(l.callsites, l.timing + 304 * 10);
        assert_eq!(l.waits, l.callsites + 24 * 8);
        assert_eq!(l.size, l.waits + 64 + 64 * 16);
        // Every array starts 8-byte aligned, so its atomics are naturally
        // aligned; the ring starts on a cache line of the mapping.
        for o in [
            l.counters,
            l.peers,
            l.functions,
            l.requests,
            l.timing,
            l.callsites,
            l.waits,
        ] {
            assert_eq!(o % 8, 0);
        }
        // Version 2's fields kept their offsets: v2 is v3's prefix, v3 v4's.
        use core::mem::offset_of;
        assert_eq!(offset_of!(Header, flags) + 4, V2_HEADER_SIZE as usize);
        assert_eq!(offset_of!(Header, reserved) + 4, V3_HEADER_SIZE as usize);
        assert_eq!(offset_of!(Header, timing_offset), 80);
        assert_eq!(
            offset_of!(RankCounters, unattributed_messages) + 8,
            V2_RANK_COUNTERS_SIZE as usize
        );
        // Version 3 as it was: no ring, whatever the slots given.
        let v3 = Layout::new(V3, 4, 10, 2, 8, 16);
        assert_eq!(
            (v3.counters, v3.peers, v3.functions, v3.requests),
            (112, 688, 816, 1056)
        );
        assert_eq!(v3.callsites, v3.timing + 304 * 10);
        assert_eq!((v3.waits, v3.size), (v3.callsites + 24 * 8, v3.waits));
        // Version 2 as it was.
        let v2 = Layout::new(V2, 4, 10, 2, 8, 16);
        assert_eq!(
            (v2.counters, v2.peers, v2.functions, v2.requests),
            (96, 152, 280, 520)
        );
        assert_eq!(v2.timing, 520 + 64);
        assert_eq!(v2.callsites, v2.timing + 304 * 10);
        assert_eq!(v2.size, v2.callsites);
    }

    #[test]
    fn callsite_keys_round_trip() {
        let k = callsite_key(7, 0x5555_1234_5678);
        assert_eq!(k >> 48, 8);
        assert_eq!(callsite_decode(k), Some((7, 0x5555_1234_5678)));
        assert_ne!(callsite_key(0, 0), 0);
        assert_eq!(callsite_decode(0), None);
        // An address no user process has.
        assert_eq!(callsite_decode((1 << 48) | (1 << 47)), None);
        for k in [1, u64::MAX, k] {
            assert!(callsite_hash(k, CALLSITE_SLOTS) < CALLSITE_SLOTS as usize);
        }
    }
}
