//! Communicator rank → `MPI_COMM_WORLD` rank, cached per communicator, and
//! the small lock-free handle map it (and matched probes) are built on.
//!
//! A communicator's translation is computed once, on its first sight, with
//! one `MPI_Group_translate_ranks` over the whole group (the only allocation,
//! off the common path); every later call is a hash probe and an array load.
//! `MPI_COMM_WORLD` needs no table at all. The cache is bounded
//! ([`COMM_SLOTS`]); a communicator that finds it full is not translated and
//! its messages are counted as unattributed.

use core::{
    ffi::c_int,
    sync::atomic::{AtomicU64, AtomicUsize, Ordering::*},
};

use super::segment::{NULL_PEER, State};

/// A peer the layer cannot name (not in `MPI_COMM_WORLD`, or cache full).
pub(crate) const UNKNOWN_PEER: i32 = -1;

/// Hash probes before a map gives up: keeps a miss cheap and bounded.
const PROBE: usize = 32;
/// A removed key; probes continue past it.
const TOMBSTONE: usize = usize::MAX;

/// A bounded open-addressing map from a handle (never 0) to a `u64`, for
/// any number of threads: insertion claims a key with a CAS, lookups scan
/// the whole probe window (so removals never break a chain).
pub(crate) struct HandleMap<const N: usize> {
    keys: [AtomicUsize; N],
    values: [AtomicU64; N],
}

impl<const N: usize> HandleMap<N> {
    /// An empty map.
    pub(crate) const fn new() -> Self {
        HandleMap {
            keys: [const { AtomicUsize::new(0) }; N],
            values: [const { AtomicU64::new(0) }; N],
        }
    }

    #[inline(always)]
    fn start(key: usize) -> usize {
        // Fibonacci hashing: pointers (aligned) and MPICH's sequential ints
        // both spread over the table.
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) % N
    }

    /// The slot holding `key`.
    #[inline(always)]
    fn find(&self, key: usize) -> Option<usize> {
        let h = Self::start(key);
        (0..PROBE.min(N))
            .map(|i| (h + i) % N)
            .find(|&i| self.keys[i].load(Acquire) == key)
    }

    /// The value stored for `key` (0 while an insertion is publishing it).
    #[inline(always)]
    pub(crate) fn get(&self, key: usize) -> Option<u64> {
        self.find(key).map(|i| self.values[i].load(Acquire))
    }

    /// Stores `value` for `key`; false if the probe window is full.
    pub(crate) fn insert(&self, key: usize, value: u64) -> bool {
        let h = Self::start(key);
        for i in (0..PROBE.min(N)).map(|i| (h + i) % N) {
            let k = self.keys[i].load(Relaxed);
            if (k == 0 || k == TOMBSTONE)
                && self.keys[i]
                    .compare_exchange(k, key, AcqRel, Relaxed)
                    .is_ok()
            {
                self.values[i].store(value, Release);
                return true;
            }
        }
        false
    }

    /// Removes every entry of `key` (two threads may have inserted it at
    /// once) and returns the values removed, so the caller can free them.
    pub(crate) fn remove(&self, key: usize, mut each: impl FnMut(u64)) {
        let h = Self::start(key);
        for i in (0..PROBE.min(N)).map(|i| (h + i) % N) {
            if self.keys[i].load(Acquire) == key {
                each(self.values[i].swap(0, AcqRel));
                self.keys[i].store(TOMBSTONE, Release);
            }
        }
    }
}

/// Communicators cached at once.
pub(crate) const COMM_SLOTS: usize = 1024;

/// What the layer keeps about a communicator.
pub(crate) struct CommInfo {
    /// This process's rank in it.
    pub(crate) rank: i32,
    /// Its size; the remote group's size for an inter-communicator.
    pub(crate) size: i32,
    /// Whether it is an inter-communicator (peers are remote ranks).
    pub(crate) inter: bool,
    /// Peer rank → world rank, `UNKNOWN_PEER` for a process outside
    /// `MPI_COMM_WORLD` (spawned or connected).
    pub(crate) world: Box<[i32]>,
    /// Its id in recordings (`super::trace`): 0 for `MPI_COMM_WORLD`.
    pub(crate) trace_id: u32,
    /// The recording (generation) that last had it defined.
    pub(crate) announced: AtomicU64,
    /// Its id in the wait records, the same on every member
    /// ([`super::waits::derive`]): `waits::WORLD` for `MPI_COMM_WORLD`,
    /// `None` for one whose collectives are not numbered (made before the
    /// shim was there, by a constructor it does not follow, or an
    /// inter-communicator).
    pub(crate) waits_id: Option<u64>,
    /// Blocking collectives this process has made on it: the next one's
    /// number (not used for `MPI_COMM_WORLD`, see `waits::number`).
    pub(crate) coll_seq: AtomicU64,
    /// Communicators constructed from it so far, counted on every member
    /// alike: a constructor is collective over it.
    pub(crate) made: AtomicU64,
}

/// The next communicator id for recordings.
static NEXT_TRACE_ID: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(1);

static COMMS: HandleMap<COMM_SLOTS> = HandleMap::new();

/// The cached description of `comm`, building it on first sight; `None` if
/// the cache is full or the library refuses the queries.
#[inline(always)]
pub(crate) fn info(s: &State, comm: usize) -> Option<&'static CommInfo> {
    match COMMS.get(comm) {
        // SAFETY: a leaked CommInfo, freed only when the communicator is
        // freed (using it after that would be the program's error).
        Some(p) if p != 0 => Some(unsafe { &*(p as *const CommInfo) }),
        _ => first_sight(s, comm),
    }
}

#[cold]
#[inline(never)]
fn first_sight(s: &State, comm: usize) -> Option<&'static CommInfo> {
    if let Some(p) = COMMS.get(comm) {
        // Another thread is publishing it: wait the few instructions left.
        for _ in 0..1000 {
            let v = COMMS.get(comm).unwrap_or(p);
            if v != 0 {
                // SAFETY: as in `info`.
                return Some(unsafe { &*(v as *const CommInfo) });
            }
            std::thread::yield_now();
        }
        return None;
    }
    let built = Box::into_raw(Box::new(describe(s, comm)?));
    if COMMS.insert(comm, built as u64) {
        // SAFETY: just leaked, now owned by the map.
        Some(unsafe { &*built })
    } else {
        // SAFETY: not published; ours to free.
        drop(unsafe { Box::from_raw(built) });
        None
    }
}

/// Asks the library about `comm` once.
fn describe(s: &State, comm: usize) -> Option<CommInfo> {
    let a = &s.abi;
    let (mut rank, mut inter, mut size) = (0 as c_int, 0 as c_int, 0 as c_int);
    // SAFETY: the library's queries with out-pointers.
    unsafe {
        if (a.comm_rank)(comm, &mut rank) != 0 || (a.comm_test_inter)(comm, &mut inter) != 0 {
            return None;
        }
        let rc = if inter != 0 {
            (a.comm_remote_size)(comm, &mut size)
        } else {
            (a.comm_size)(comm, &mut size)
        };
        if rc != 0 || size < 0 {
            return None;
        }
    }
    let world = if comm == a.comm_world {
        (0..size).collect::<Box<[i32]>>()
    } else {
        let (mut g, mut wg) = (0usize, 0usize);
        let ranks: Vec<c_int> = (0..size).collect();
        let mut out = vec![a.c.undefined; size as usize];
        // SAFETY: the library's group queries; `ranks` and `out` hold
        // `size` ints; both groups are freed before returning.
        unsafe {
            let get = if inter != 0 {
                a.comm_remote_group
            } else {
                a.comm_group
            };
            if get(comm, &mut g) != 0 {
                return None;
            }
            if (a.comm_group)(a.comm_world, &mut wg) != 0 {
                (a.group_free)(&mut g);
                return None;
            }
            let rc = (a.group_translate_ranks)(g, size, ranks.as_ptr(), wg, out.as_mut_ptr());
            (a.group_free)(&mut g);
            (a.group_free)(&mut wg);
            if rc != 0 {
                return None;
            }
        }
        out.into_iter()
            .map(|w| if w < 0 { UNKNOWN_PEER } else { w })
            .collect()
    };
    Some(CommInfo {
        rank,
        size,
        inter: inter != 0,
        world,
        trace_id: if comm == a.comm_world {
            0
        } else {
            NEXT_TRACE_ID.fetch_add(1, Relaxed)
        },
        announced: AtomicU64::new(0),
        waits_id: (comm == a.comm_world).then_some(observer_common::waits::WORLD),
        coll_seq: AtomicU64::new(0),
        made: AtomicU64::new(0),
    })
}

/// A constructor made `comm` (never `MPI_COMM_NULL`): describes it afresh
/// (a handle value freed and reused names a new communicator), under the
/// wait-record id `waits_id` for an intra-communicator. `dup_of`: it is a
/// duplicate of that communicator whose request has not completed
/// (`MPI_Comm_idup`), which may not be used yet, not even to describe it;
/// a duplicate has its parent's group in its parent's order, so it is
/// described as its parent is (nothing if the parent is not known).
pub(crate) fn made(
    s: &State,
    comm: usize,
    dup_of: Option<usize>,
    waits_id: impl FnOnce(&CommInfo) -> Option<u64>,
) {
    forget(comm);
    let built = match dup_of {
        None => describe(s, comm),
        Some(parent) => info(s, parent).map(|p| CommInfo {
            rank: p.rank,
            size: p.size,
            inter: p.inter,
            world: p.world.clone(),
            trace_id: NEXT_TRACE_ID.fetch_add(1, Relaxed),
            announced: AtomicU64::new(0),
            waits_id: None,
            coll_seq: AtomicU64::new(0),
            made: AtomicU64::new(0),
        }),
    };
    let Some(mut built) = built else {
        return;
    };
    if !built.inter {
        built.waits_id = waits_id(&built);
    }
    let built = Box::into_raw(Box::new(built));
    if !COMMS.insert(comm, built as u64) {
        // SAFETY: not published; ours to free.
        drop(unsafe { Box::from_raw(built) });
    }
}

/// The world rank of `rank` in `comm`: [`NULL_PEER`] for `MPI_PROC_NULL`,
/// [`UNKNOWN_PEER`] when it cannot be named (wildcards included).
#[inline(always)]
pub(crate) fn peer(s: &State, comm: usize, rank: i32) -> i32 {
    if rank == s.abi.c.proc_null {
        return NULL_PEER;
    }
    // MPI_ANY_SOURCE, or a bad rank the library will reject.
    if rank == s.abi.c.any_source || rank < 0 {
        return UNKNOWN_PEER;
    }
    if comm == s.abi.comm_world {
        return if (rank as u32) < s.world_size {
            rank
        } else {
            UNKNOWN_PEER
        };
    }
    info(s, comm)
        .and_then(|i| i.world.get(rank as usize).copied())
        .unwrap_or(UNKNOWN_PEER)
}

/// Forgets `comm` (after `MPI_Comm_free` or `MPI_Comm_disconnect`): MPICH
/// reuses handle values, so a stale entry would misname a later
/// communicator's peers.
pub(crate) fn forget(comm: usize) {
    COMMS.remove(comm, |p| {
        if p != 0 {
            // SAFETY: the map owned this leaked CommInfo; the communicator
            // is gone, so no call can be using it.
            drop(unsafe { Box::from_raw(p as *mut CommInfo) });
        }
    });
}

/// Matched-probe messages waiting for their `MPI_Mrecv`/`MPI_Imrecv`: the
/// message handle → the sender's world rank (the receive itself names no
/// communicator). Bounded like the communicator cache.
pub(crate) static MESSAGES: HandleMap<1024> = HandleMap::new();

/// Marks a world rank stored in [`MESSAGES`] (whose 0 means "none").
pub(crate) const MESSAGE_TAG: u64 = 1 << 40;
/// Marks a message in [`MESSAGES`] that came on `MPI_COMM_WORLD`.
pub(crate) const MESSAGE_WORLD: u64 = 1 << 41;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_map_inserts_finds_and_removes() {
        let m: HandleMap<64> = HandleMap::new();
        assert_eq!(m.get(0x1234), None);
        assert!(m.insert(0x1234, 7));
        assert!(m.insert(0x5678, 8));
        assert_eq!(m.get(0x1234), Some(7));
        assert_eq!(m.get(0x5678), Some(8));
        // Two entries of one key (two threads' first sight): both removed.
        assert!(m.insert(0x1234, 9));
        let mut gone = Vec::new();
        m.remove(0x1234, |v| gone.push(v));
        gone.sort();
        assert_eq!(gone, [7, 9]);
        assert_eq!(m.get(0x1234), None);
        assert_eq!(
            m.get(0x5678),
            Some(8),
            "removal must not break other chains"
        );
        // Tombstones are reused; the map is bounded by its probe window.
        let mut inserted = 0;
        for k in 1..=200usize {
            inserted += usize::from(m.insert(k << 4, 1));
        }
        // 0x5678 keeps one of the 64 slots.
        assert!(inserted < 64, "bounded: {inserted}");
        assert_eq!(m.get(0x5678), Some(8));
    }
}
