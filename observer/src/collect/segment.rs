//! Reading the shim's stats segments
//! (`/dev/shm/mpi-observer.<uid>.<pid>.<random>`).
//!
//! Trust: a segment is found in the process's own mappings and opened as
//! the file it maps ([`crate::os::shm`]); it belongs to the process only if it
//! is a regular file owned by that process's uid, with no group or other
//! write permission. Labels never come from it. It is mapped read-only and
//! every header field is checked against the layout before any array is
//! read; if the owner truncates the file while we read it, the SIGBUS is
//! caught ([`crate::os::shm::Guarded`]), the faulting page is replaced by
//! zeros, and the figures of that read are discarded. A bad segment is
//! skipped and counted, never fatal.
//!
//! The daemon keeps the segment's file open from the first read on, so a
//! rank's final figures stay readable after it exits and unlinks it.

use std::{
    fs::File,
    os::unix::fs::MetadataExt as _,
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
};

use observer_common::{
    FUNCTION_COUNT,
    generated::functions::SPEC_FINGERPRINT,
    maps::HIST_SLOTS,
    segment::{
        self, Header, Layout, MAGIC, MAX_SEGMENT_BYTES, V2, V3, V3_HEADER_SIZE, VERSION,
        request_state,
    },
    waits,
};

// What a read returns, so `segment::Figures` names it too.
pub use crate::collect::snapshot::{Figures, SegmentProblem};
use crate::{
    collect::snapshot::{Directed, LayerCalls, PeerTraffic, RawSite, Requests, Timing},
    os::procfs,
    os::shm::{self, Guarded, Kind, ShmError},
};

/// An open segment of one rank.
#[derive(Debug)]
pub struct Segment {
    file: File,
    /// Its file name in `/dev/shm` when it was found (not yet unlinked),
    /// for [`Segment::remove_if_orphaned`].
    name: Option<String>,
}

impl Segment {
    /// Opens `pid`'s segment if it has one: the one its maps list under the
    /// shim's naming with its own pid ([`shm::find`]). `Ok(None)`: no
    /// segment (yet), or the process's maps are not readable to the daemon
    /// (an unprivileged daemon and another user's process).
    /// [`SegmentProblem::Gone`]: it maps one, unlinked and out of this
    /// daemon's reach (its figures are lost).
    pub fn open(pid: u32) -> Result<Option<Segment>, SegmentProblem> {
        let Ok(Some(m)) = shm::find(pid, Kind::Segment) else {
            return Ok(None);
        };
        // The size is checked at each read (MAX_SEGMENT_BYTES, corrupt).
        let file = match shm::open_mapped(pid, &m, false, u64::MAX) {
            Ok(f) => f,
            // Unlinked (the kernel's map_files link, which reaches a deleted
            // file, is not this daemon's to follow), or the process ended
            // between the maps and the open.
            Err(ShmError::Open { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(SegmentProblem::Gone);
            }
            Err(_) => return Err(SegmentProblem::Untrusted),
        };
        let name = (!m.deleted)
            .then(|| m.file_name().map(str::to_string))
            .flatten();
        Ok(Some(Segment { file, name }))
    }

    /// Opens a segment by path (tests: a file of this process's that it
    /// does not map).
    #[cfg(test)]
    fn open_at(path: &str, pid: u32) -> Result<Option<Segment>, SegmentProblem> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path)
            .map_err(|_| SegmentProblem::Untrusted)?;
        let file = shm::trusted(pid, file, path.to_string(), u64::MAX)
            .map_err(|_| SegmentProblem::Untrusted)?;
        Ok(Some(Segment { file, name: None }))
    }

    /// Unlinks `pid`'s segment file if it is still this very file (same
    /// device and inode) and the process is gone: what a rank killed by a
    /// signal leaves behind in /dev/shm. Its trace file goes with it.
    pub fn remove_if_orphaned(&self, pid: u32) {
        let (Some(name), Ok(ours)) = (&self.name, self.file.metadata()) else {
            return;
        };
        // Gone, or a zombie nobody has reaped yet.
        let gone = procfs::stat(pid).map_or(true, |st| st.is_dead());
        let dir = Path::new(observer_common::segment::DIR);
        if gone && shm::remove_if_same(dir, name, ours.dev(), ours.ino()) {
            // Its recording rings (`mpi-observer record`), made with it
            // under the same random name: only its creator could have.
            let rings = dir.join(format!("{name}{}", observer_common::trace::PATH_SUFFIX));
            if std::fs::symlink_metadata(&rings)
                .is_ok_and(|m| m.file_type().is_file() && m.uid() == ours.uid())
            {
                let _ = std::fs::remove_file(&rings);
            }
        }
    }

    /// Reads the current figures.
    pub fn read(&self) -> Result<Figures, SegmentProblem> {
        self.with_mapping(|map, size| map.figures(size))
    }

    /// Reads the wait records written since `cursor` into `out` and moves
    /// the cursor on: `None` when the segment has no ring to read (not ready,
    /// an older version, `MPI_OBSERVER_WAITS=0`, or an injected shim, whose
    /// sequence numbers do not line up with the job's other ranks').
    pub fn drain_waits(
        &self,
        cursor: &mut u64,
        out: &mut Vec<waits::Plain>,
    ) -> Result<Option<WaitDrain>, SegmentProblem> {
        let before = out.len();
        let at = *cursor;
        let r = self.with_mapping(|map, size| map.drain_waits(size, cursor, out));
        if r.is_err() {
            // Records read from a mapping that faulted are not believed.
            out.truncate(before);
            *cursor = at;
        }
        r
    }

    /// Runs `f` on a fresh mapping of the whole file, under the SIGBUS
    /// guard: a read during which the owner truncated the file is
    /// [`SegmentProblem::Truncated`], whatever `f` made of it.
    fn with_mapping<T>(
        &self,
        f: impl FnOnce(&Mapping, u64) -> Result<T, SegmentProblem>,
    ) -> Result<T, SegmentProblem> {
        let size = self
            .file
            .metadata()
            .map_err(|_| SegmentProblem::Corrupt)?
            .len();
        if size < size_of::<Header>() as u64 || size > MAX_SEGMENT_BYTES {
            return Err(SegmentProblem::Corrupt);
        }
        let map = Mapping::new(&self.file, size as usize)?;
        let out = f(&map, size);
        let faulted = map.faulted();
        drop(map);
        if faulted {
            return Err(SegmentProblem::Truncated);
        }
        out
    }
}

/// What one [`Segment::drain_waits`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitDrain {
    /// Records read and lost.
    pub drained: waits::Drained,
    /// log2 of the rank's sampling period.
    pub sample_shift: u32,
    /// `MPI_COMM_WORLD`'s size as the rank saw it.
    pub world_size: u32,
}

/// A checked header.
struct Parsed {
    version: u32,
    layout: Layout,
    world_size: u32,
    peer_slots: u32,
    function_slots: u32,
    request_slots: u32,
    callsite_slots: u32,
    wait_slots: u32,
    wait_shift: u32,
    flags: u32,
}

/// A read-only mapping of a segment under the SIGBUS guard.
struct Mapping {
    guard: Guarded,
    base: *const u8,
    len: usize,
}

impl Mapping {
    fn new(file: &File, len: usize) -> Result<Self, SegmentProblem> {
        let guard = Guarded::new(file, len, false).map_err(|e| match e {
            ShmError::GuardBusy => SegmentProblem::Busy,
            _ => SegmentProblem::Corrupt,
        })?;
        Ok(Mapping {
            base: guard.base(),
            len: guard.len(),
            guard,
        })
    }

    fn faulted(&self) -> bool {
        self.guard.faulted()
    }

    /// An atomic u64 load at a validated, aligned offset.
    fn u64_at(&self, off: u64) -> u64 {
        debug_assert!(off as usize + 8 <= self.len && off.is_multiple_of(8));
        // SAFETY: callers pass offsets checked against the mapping's length
        // and 8-byte aligned; a relaxed atomic load is a plain load (on
        // x86-64 and arm64) and never writes, so read-only memory is fine.
        unsafe { (*(self.base.add(off as usize) as *const AtomicU64)).load(Ordering::Relaxed) }
    }

    fn u32_at(&self, off: u64) -> u32 {
        let w = self.u64_at(off & !7);
        if off.is_multiple_of(8) {
            w as u32
        } else {
            (w >> 32) as u32
        }
    }

    /// The header, checked against the layout it claims: `None` while the
    /// segment is not ready.
    fn header(&self, size: u64) -> Result<Option<Parsed>, SegmentProblem> {
        use std::mem::{offset_of, size_of};
        let mut magic = [0u8; 8];
        magic.copy_from_slice(&self.u64_at(0).to_ne_bytes());
        if magic != MAGIC {
            return Err(SegmentProblem::Corrupt);
        }
        let h = |field: usize| field as u64;
        if self.u32_at(h(offset_of!(Header, ready))) != 1 {
            // Not initialised yet: nothing to read, not an error.
            return Ok(None);
        }
        // Pairs with the shim's Release store of `ready`: the header read
        // next is the one written before it (x86-64 keeps loads in order
        // anyway; arm64 does not).
        std::sync::atomic::fence(Ordering::Acquire);
        let version = self.u32_at(h(offset_of!(Header, version)));
        if !(V2..=VERSION).contains(&version)
            || self.u64_at(h(offset_of!(Header, spec_fingerprint))) != SPEC_FINGERPRINT
        {
            return Err(SegmentProblem::Version);
        }
        let world_size = self.u32_at(h(offset_of!(Header, world_size)));
        let peer_slots = self.u32_at(h(offset_of!(Header, peer_slots)));
        let function_slots = self.u32_at(h(offset_of!(Header, function_slots)));
        let request_slots = self.u32_at(h(offset_of!(Header, request_slots)));
        // A later version's header fields lie past an earlier version's
        // header: read only once the header is known to be that long.
        let header_size = u64::from(self.u32_at(h(offset_of!(Header, header_size))));
        let long = |v: u64| header_size >= v;
        let callsite_slots = if version > V2 && long(V3_HEADER_SIZE) {
            self.u32_at(h(offset_of!(Header, callsite_slots)))
        } else {
            0
        };
        let (wait_slots, wait_shift) = if version > V3 && long(size_of::<Header>() as u64) {
            (
                self.u32_at(h(offset_of!(Header, wait_slots))),
                self.u32_at(h(offset_of!(Header, wait_sample_shift))),
            )
        } else {
            (0, 0)
        };
        let l = Layout::new(
            version,
            peer_slots,
            function_slots,
            request_slots,
            callsite_slots,
            wait_slots,
        );
        let header_ok = header_size == l.header_size
            && peer_slots <= segment::MAX_PEER_SLOTS
            && peer_slots <= world_size
            && function_slots as usize == FUNCTION_COUNT
            && request_slots <= segment::REQUEST_SLOTS
            && callsite_slots <= segment::CALLSITE_SLOTS
            && wait_slots <= waits::MAX_RING_SLOTS
            && (wait_slots == 0 || wait_slots.is_power_of_two())
            && wait_shift < 32
            && self.u64_at(h(offset_of!(Header, total_size))) == size
            && l.size == size;
        let offsets_ok = self.u64_at(h(offset_of!(Header, counters_offset))) == l.counters
            && self.u64_at(h(offset_of!(Header, peers_offset))) == l.peers
            && self.u64_at(h(offset_of!(Header, functions_offset))) == l.functions
            && self.u64_at(h(offset_of!(Header, requests_offset))) == l.requests
            && self.u64_at(h(offset_of!(Header, timing_offset))) == l.timing
            && (version == V2
                || self.u64_at(h(offset_of!(Header, callsites_offset))) == l.callsites)
            && (version <= V3 || self.u64_at(h(offset_of!(Header, waits_offset))) == l.waits)
            && self.u32_at(h(offset_of!(Header, flags))) & !segment::flags::KNOWN == 0;
        if !header_ok || !offsets_ok {
            return Err(SegmentProblem::Corrupt);
        }
        Ok(Some(Parsed {
            version,
            layout: l,
            world_size,
            peer_slots,
            function_slots,
            request_slots,
            callsite_slots,
            wait_slots,
            wait_shift,
            flags: self.u32_at(h(offset_of!(Header, flags))),
        }))
    }

    /// Drains the wait ring from `cursor` into `out` (see
    /// [`Segment::drain_waits`]).
    fn drain_waits(
        &self,
        size: u64,
        cursor: &mut u64,
        out: &mut Vec<waits::Plain>,
    ) -> Result<Option<WaitDrain>, SegmentProblem> {
        let Some(p) = self.header(size)? else {
            return Ok(None);
        };
        if p.wait_slots == 0 || p.flags & segment::flags::INJECTED != 0 {
            return Ok(None);
        }
        let base = p.layout.waits;
        let d = waits::drain(
            |i| self.u64_at(base + 8 * i),
            p.wait_slots,
            cursor,
            |r| out.push(r),
        );
        Ok(Some(WaitDrain {
            drained: d,
            sample_shift: p.wait_shift,
            world_size: p.world_size,
        }))
    }

    fn figures(&self, size: u64) -> Result<Figures, SegmentProblem> {
        use std::mem::{offset_of, size_of};
        let Some(p) = self.header(size)? else {
            return Ok(Figures::default());
        };
        let v3 = p.version > V2;
        let Parsed {
            layout: l,
            world_size,
            peer_slots,
            function_slots,
            request_slots,
            callsite_slots,
            ..
        } = p;
        use observer_common::segment::{
            CallTiming as T, CallsiteSlot as S, FunctionCounters as F, PeerCounters as P,
            RankCounters as C, RequestSlot as R,
        };
        let (co, po, fo, ro, to, so) = (
            l.counters,
            l.peers,
            l.functions,
            l.requests,
            l.timing,
            l.callsites,
        );
        let mut out = Figures {
            ready: true,
            injected: p.flags & segment::flags::INJECTED != 0,
            ejected: p.flags & segment::flags::EJECTED != 0,
            world_size,
            ..Figures::default()
        };
        let c = |f: usize| self.u64_at(co + f as u64);
        out.requests = Requests {
            started: c(offset_of!(C, requests_started)),
            completed: c(offset_of!(C, requests_completed)),
            cancelled: c(offset_of!(C, requests_cancelled)),
            table_full: c(offset_of!(C, request_table_full)),
        };
        out.peer_overflow_messages = c(offset_of!(C, peer_overflow_messages));
        out.unattributed_messages = c(offset_of!(C, unattributed_messages));
        if v3 {
            out.callsite_table_full = c(offset_of!(C, callsite_table_full));
            for (d, hist) in out.msg_sizes.iter_mut().enumerate() {
                for (i, v) in hist.iter_mut().enumerate() {
                    *v = c(offset_of!(C, msg_size_hist) + 8 * (d * HIST_SLOTS + i));
                }
            }
        }
        let directed = |at: u64| Directed {
            send: self.u64_at(at),
            recv: self.u64_at(at + 8),
        };
        for peer in 0..u64::from(peer_slots) {
            let b = po + peer * size_of::<P>() as u64;
            let t = PeerTraffic {
                messages: directed(b + offset_of!(P, messages) as u64),
                bytes: directed(b + offset_of!(P, bytes) as u64),
            };
            if t != PeerTraffic::default() {
                out.peers.insert(peer as u32, t);
            }
        }
        for f in 0..u64::from(function_slots) {
            let b = fo + f * size_of::<F>() as u64;
            let calls = self.u64_at(b + offset_of!(F, calls) as u64);
            if calls != 0 {
                out.functions.insert(
                    f as u16,
                    LayerCalls {
                        calls,
                        bytes: directed(b + offset_of!(F, bytes) as u64),
                    },
                );
            }
        }
        for f in 0..u64::from(function_slots) {
            let b = to + f * size_of::<T>() as u64;
            let calls = self.u64_at(b + offset_of!(T, calls) as u64);
            if calls != 0 {
                let d = |field: usize, i: usize| self.u64_at(b + (field + 8 * i) as u64);
                let mut t = Timing {
                    calls,
                    time_ns: self.u64_at(b + offset_of!(T, time_ns) as u64),
                    bytes: [d(offset_of!(T, bytes), 0), d(offset_of!(T, bytes), 1)],
                    bytes_unknown: [
                        d(offset_of!(T, bytes_unknown), 0),
                        d(offset_of!(T, bytes_unknown), 1),
                    ],
                    hist: [0; HIST_SLOTS],
                };
                for (i, v) in t.hist.iter_mut().enumerate() {
                    *v = self.u64_at(b + (offset_of!(T, hist) + 8 * i) as u64);
                }
                out.timing.insert(f as u16, t);
            }
        }
        let mut oldest = u64::MAX;
        for r in 0..u64::from(request_slots) {
            let b = ro + r * size_of::<R>() as u64;
            let state = self.u32_at(b + offset_of!(R, state) as u64);
            match state {
                request_state::ACTIVE | request_state::PERSISTENT_ACTIVE => {
                    out.outstanding += 1;
                    oldest = oldest.min(self.u64_at(b + offset_of!(R, started_ns) as u64));
                    if state == request_state::PERSISTENT_ACTIVE {
                        out.persistent_active += 1;
                    }
                }
                request_state::PERSISTENT_INACTIVE => out.persistent_inactive += 1,
                _ => {}
            }
        }
        out.oldest_started_ns = (oldest != u64::MAX).then_some(oldest);
        for i in 0..u64::from(callsite_slots) {
            let b = so + i * size_of::<S>() as u64;
            let key = self.u64_at(b + offset_of!(S, key) as u64);
            let calls = self.u64_at(b + offset_of!(S, calls) as u64);
            // Free, a key no shim writes, or claimed and not counted yet.
            let Some((function, addr)) = segment::callsite_decode(key) else {
                continue;
            };
            if calls == 0 || u32::from(function) >= function_slots {
                continue;
            }
            out.callsites.push(RawSite {
                function,
                addr,
                calls,
                time_ns: self.u64_at(b + offset_of!(S, time_ns) as u64),
            });
        }
        // The shim never claims a key twice; a segment that does gets its
        // slots summed, so each site appears once.
        out.callsites.sort_unstable();
        out.callsites.dedup_by(|later, first| {
            let same = (later.function, later.addr) == (first.function, first.addr);
            if same {
                first.calls = first.calls.saturating_add(later.calls);
                first.time_ns = first.time_ns.saturating_add(later.time_ns);
            }
            same
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
