//! The recorder's side of the shim's event rings
//! (`/dev/shm/mpi-observer.<uid>.<pid>.<random>.trace`, layout in
//! `observer_common::trace`): start a recording, drain it, stop it.
//!
//! The file is found in the process's maps and opened as the file it maps
//! ([`crate::os::shm`]), validated before use (owner, mode, magic, version,
//! sizes against the file's own size), and only its atomics and records
//! are touched, through a mapping under the SIGBUS guard: if the owner
//! truncates the file mid-recording, the recorder does not die; the rank's
//! rings are reported lost ([`RingsLost`]) and its events from then on are
//! not believed. The mapping outlives the shim's unlink at `MPI_Finalize`, so a
//! rank that exits mid-recording still has its last events read. Dropping
//! a recorder stops its recording, so an error path leaves the shim idle.
//! A recorder killed with SIGKILL leaves `active` set: the shim then fills
//! its rings and drops (counted) until the next recording's start, costing
//! the rank a clock read and a ring test per event, never a wait.

use std::{
    fs::File,
    os::fd::AsRawFd as _,
    ptr::NonNull,
    sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use observer_common::trace::{self as t, RingHeader, TraceEvent, TraceHeader};
use thiserror::Error;

use crate::os::shm::{self, Guarded, Kind};

/// A rank's rings stopped being readable mid-recording.
#[derive(Debug, Error)]
#[error(
    "its recording rings shrank or vanished under the recorder (the file was truncated); its events from then on are lost"
)]
pub struct RingsLost;

/// One process's rings, mapped.
pub struct ShimRecorder {
    pid: u32,
    /// The open file, holding its `flock`.
    _lock: File,
    /// The guarded mapping; `base` is its start.
    map: Guarded,
    base: NonNull<u8>,
    len: usize,
    rings: u32,
    events: u32,
    /// Each ring's `dropped` when the recording started.
    dropped_at_start: Vec<u64>,
    no_ring_at_start: u64,
    recording: bool,
}

// SAFETY: the mapping is used through atomics and the ring protocol only.
unsafe impl Send for ShimRecorder {}

impl ShimRecorder {
    /// Maps `pid`'s trace file; `None` when it has none (no shim, or no
    /// `stats` layer, or a shim of an earlier version, whose file has the
    /// old name), when the file is not one to trust, or when another
    /// recorder has it open.
    pub fn open(pid: u32) -> Option<ShimRecorder> {
        let m = shm::find(pid, Kind::Trace).ok()??;
        let file = shm::open_mapped(pid, &m, true, t::MAX_BYTES).ok()?;
        let meta = file.metadata().ok()?;
        let len = meta.len();
        if !(t::HEADER_BYTES..=t::MAX_BYTES).contains(&len) {
            return None;
        }
        // One recorder a process: two would both move the rings' tails (the
        // rings have one consumer). The lock goes with the descriptor.
        // SAFETY: our descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return None;
        }
        let map = match Guarded::new(&file, len as usize, true) {
            Ok(m) => m,
            Err(e) => {
                log::warn!("pid {pid}: {e}; this rank is recorded through the probes");
                return None;
            }
        };
        let base = NonNull::new(map.base())?;
        let mut r = ShimRecorder {
            pid,
            _lock: file,
            map,
            base,
            len: len as usize,
            rings: 0,
            events: 0,
            dropped_at_start: Vec::new(),
            no_ring_at_start: 0,
            recording: false,
        };
        let h = r.header();
        let ok = h.magic == t::MAGIC
            && h.version == t::VERSION
            && h.ready.load(Acquire) == 1
            && h.total_size == len
            && t::RINGS.contains(&h.ring_count)
            && h.ring_events.is_power_of_two()
            && t::RING_EVENTS.contains(&h.ring_events)
            && h.rings_offset == t::HEADER_BYTES
            && t::file_bytes(h.ring_count, h.ring_events) == len;
        if !ok || r.map.faulted() {
            return None;
        }
        let (rings, events) = (h.ring_count, h.ring_events);
        (r.rings, r.events) = (rings, events);
        Some(r)
    }

    fn header(&self) -> &TraceHeader {
        // SAFETY: the mapping is at least a header page long.
        unsafe { &*self.base.as_ptr().cast::<TraceHeader>() }
    }

    fn ring(&self, i: u32) -> (&RingHeader, *const TraceEvent) {
        let off = t::ring_offset(i, self.events) as usize;
        debug_assert!(off + t::ring_bytes(self.events) as usize <= self.len);
        // SAFETY: validated in `open`: every ring lies within the mapping.
        unsafe {
            let p = self.base.as_ptr().add(off);
            (
                &*p.cast::<RingHeader>(),
                p.add(size_of::<RingHeader>()).cast::<TraceEvent>(),
            )
        }
    }

    /// Whether thread `tid` of the process still runs (its `/proc` entry:
    /// the shim's ids are the recorder's when both share a pid namespace;
    /// otherwise every ring is freed at each start, as if its thread had
    /// exited).
    fn thread_alive(&self, tid: u32) -> bool {
        std::path::Path::new(&format!("/proc/{}/task/{tid}", self.pid)).exists()
    }

    /// This process's rank in `MPI_COMM_WORLD`, as the shim read it.
    pub fn world_rank(&self) -> Option<u32> {
        Some(self.header().world_rank)
    }

    /// `MPI_COMM_WORLD`'s size.
    pub fn world_size(&self) -> u32 {
        self.header().world_size
    }

    /// Starts a recording: every ring empty, the rings of exited threads
    /// free, a new generation, then `active`.
    ///
    /// A live thread keeps its ring: it may be writing to it right now (a
    /// Leave, or an event it began before this start), so giving the ring
    /// to another thread could make two producers. A thread that exited
    /// writes nothing; its ring goes back to 0 (a thread that took over its
    /// id takes the ring back, see the shim's `claim`).
    pub fn start(&mut self) {
        self.no_ring_at_start = self.header().no_ring.load(Relaxed);
        let h = self.header();
        h.active.store(0, Release);
        let mut dropped = Vec::with_capacity(self.rings as usize);
        for i in 0..self.rings {
            let (r, _) = self.ring(i);
            r.tail.store(r.head.load(Acquire), Release);
            let owner = r.owner.load(Acquire);
            if owner != 0 && !self.thread_alive(owner) {
                let _ = r.owner.compare_exchange(owner, 0, AcqRel, Relaxed);
            }
            dropped.push(r.dropped.load(Relaxed));
        }
        h.generation.fetch_add(1, AcqRel);
        h.active.store(1, Release);
        self.dropped_at_start = dropped;
        self.recording = true;
    }

    /// Whether the rings were lost: a page of the file vanished under an
    /// access (the owner truncated it).
    pub fn lost(&self) -> bool {
        self.map.faulted()
    }

    /// Moves every event written since the last call out, ring by ring, in
    /// each ring's order: `f(owner thread id, event)`. Returns how many.
    /// Once the rings are lost ([`ShimRecorder::lost`]) it returns
    /// [`RingsLost`], and the events it passed to `f` in that call are not
    /// to be believed (some may be zeros from a vanished page).
    pub fn drain(&mut self, mut f: impl FnMut(u32, &TraceEvent)) -> Result<u64, RingsLost> {
        if self.lost() {
            return Err(RingsLost);
        }
        let mut n = 0;
        for i in 0..self.rings {
            let (r, recs) = self.ring(i);
            let owner = r.owner.load(Acquire);
            // SAFETY: the ring's records, one consumer (us).
            n += unsafe { t::drain(r, recs, self.events, |e| f(owner, e)) };
        }
        if self.lost() {
            return Err(RingsLost);
        }
        Ok(n)
    }

    /// Events dropped since the start: per ring (its owner and count), and
    /// those of threads that found no ring.
    pub fn dropped(&self) -> (Vec<(u32, u64)>, u64) {
        if self.lost() {
            return (Vec::new(), 0);
        }
        let rings = (0..self.rings)
            .map(|i| {
                let (r, _) = self.ring(i);
                let at = self.dropped_at_start.get(i as usize).copied().unwrap_or(0);
                (
                    r.owner.load(Relaxed),
                    r.dropped.load(Relaxed).saturating_sub(at),
                )
            })
            .filter(|(_, d)| *d > 0)
            .collect();
        let no_ring = self
            .header()
            .no_ring
            .load(Relaxed)
            .saturating_sub(self.no_ring_at_start);
        (rings, no_ring)
    }

    /// Stops the recording; the process goes on as before. Drain once more
    /// afterwards for what was written meanwhile.
    pub fn stop(&mut self) {
        if self.recording {
            self.header().active.store(0, Release);
            self.recording = false;
        }
    }
}

impl Drop for ShimRecorder {
    fn drop(&mut self) {
        // The mapping goes with `map`, after this.
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use std::{io::Write as _, os::unix::fs::PermissionsExt as _};

    use observer_common::trace::{Kind, TraceEvent};

    use super::*;

    /// A shared read-write mapping of `len` bytes of `file`, as the shim
    /// makes (so the file is in this process's maps).
    fn map(file: &File, len: usize) -> Option<NonNull<u8>> {
        // SAFETY: a shared mapping of a regular file of `len` bytes.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        (p != libc::MAP_FAILED)
            .then(|| NonNull::new(p.cast()))
            .flatten()
    }

    /// This process's trace file path under the shim's naming.
    fn path(pid: u32) -> String {
        let mut b = [0u8; observer_common::segment::NAME_MAX];
        let n = observer_common::segment::Name {
            // SAFETY: getuid cannot fail.
            uid: Some(unsafe { libc::getuid() }),
            pid,
            random: Some(0x5eed),
            trace: true,
        }
        .write(&mut b);
        format!(
            "{}/{}",
            observer_common::segment::DIR,
            std::str::from_utf8(&b[..n]).unwrap()
        )
    }

    /// A trace file for this test process, as a shim would write it, with
    /// `rings` rings of 64 events; removed on drop.
    struct Fake {
        path: String,
        map: NonNull<u8>,
        len: usize,
    }

    impl Fake {
        fn new(rings: u32) -> Fake {
            let path = path(std::process::id());
            let len = t::file_bytes(rings, 64);
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .unwrap();
            f.set_permissions(std::fs::Permissions::from_mode(0o600))
                .unwrap();
            f.set_len(len).unwrap();
            f.flush().unwrap();
            let map = map(&f, len as usize).unwrap();
            // SAFETY: a fresh zeroed mapping at least a header long.
            let h = unsafe { &mut *map.as_ptr().cast::<TraceHeader>() };
            h.magic = t::MAGIC;
            h.version = t::VERSION;
            h.header_size = size_of::<TraceHeader>() as u32;
            h.total_size = len;
            h.ring_count = rings;
            h.ring_events = 64;
            h.rings_offset = t::HEADER_BYTES;
            h.world_rank = 3;
            h.world_size = 4;
            h.ready.store(1, Release);
            Fake {
                path,
                map,
                len: len as usize,
            }
        }

        fn header(&self) -> &TraceHeader {
            // SAFETY: as in `new`.
            unsafe { &*self.map.as_ptr().cast::<TraceHeader>() }
        }

        fn edit(&mut self) -> &mut TraceHeader {
            // SAFETY: as in `new`.
            unsafe { &mut *self.map.as_ptr().cast::<TraceHeader>() }
        }

        /// The producer's side of ring `i`, as owner `tid`.
        fn push(&self, i: u32, tid: u32, ev: &TraceEvent) -> bool {
            let off = t::ring_offset(i, 64) as usize;
            // SAFETY: ring `i` of the mapping; this test is its producer.
            unsafe {
                let p = self.map.as_ptr().add(off);
                let h = &*p.cast::<RingHeader>();
                h.owner.store(tid, Release);
                t::push(
                    h,
                    p.add(size_of::<RingHeader>()).cast::<TraceEvent>(),
                    64,
                    ev,
                )
            }
        }
    }

    impl Drop for Fake {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
            // SAFETY: our mapping.
            unsafe { libc::munmap(self.map.as_ptr().cast(), self.len) };
        }
    }

    fn ev(t_ns: u64) -> TraceEvent {
        TraceEvent {
            t_ns,
            kind: Kind::Enter as u16,
            ..TraceEvent::default()
        }
    }

    // One test, as every case uses this process's one trace file path.
    #[test]
    fn start_drain_drop_stop_and_refusals() {
        let _g = crate::os::shm::guard_test_lock();
        let me = std::process::id();
        // No file: no recorder.
        let _ = std::fs::remove_file(path(me));
        assert!(ShimRecorder::open(me).is_none());

        let mut f = Fake::new(2);
        let mut r = ShimRecorder::open(me).expect("a valid file");
        assert_eq!((r.world_rank(), r.world_size()), (Some(3), 4));
        // A second recorder of the same process is refused.
        assert!(ShimRecorder::open(me).is_none());

        // Leftovers from before the start are discarded.
        assert!(f.push(0, 11, &ev(1)));
        let g = f.header().generation.load(Relaxed);
        r.start();
        assert_eq!(f.header().active.load(Relaxed), 1);
        assert_eq!(f.header().generation.load(Relaxed), g + 1);
        // A live thread keeps its ring; one that never existed (an exited
        // thread) loses it.
        let ring_owner = |i: u32| {
            let off = t::ring_offset(i, 64) as usize;
            // SAFETY: ring `i`'s header.
            unsafe { &*f.map.as_ptr().add(off).cast::<RingHeader>() }
                .owner
                .load(Relaxed)
        };
        assert_eq!(ring_owner(0), 0, "tid 11 is no thread of this process");
        assert!(f.push(1, me, &ev(2)));
        r.start();
        assert_eq!(ring_owner(1), me, "a live thread keeps its ring");

        let mut got = Vec::new();
        assert_eq!(r.drain(|tid, e| got.push((tid, e.t_ns))).ok(), Some(0));
        for k in 0..70 {
            f.push(1, me, &ev(100 + k));
        }
        f.header().no_ring.fetch_add(5, Relaxed);
        assert_eq!(r.drain(|tid, e| got.push((tid, e.t_ns))).ok(), Some(64));
        assert_eq!(got.first(), Some(&(me, 100)));
        assert_eq!(got.last(), Some(&(me, 163)));
        assert_eq!(r.dropped(), (vec![(me, 6)], 5));

        r.stop();
        assert_eq!(f.header().active.load(Relaxed), 0);
        drop(r);
        // The lock goes with the recorder.
        let mut r = ShimRecorder::open(me).expect("free again");
        r.start();
        drop(r);
        assert_eq!(f.header().active.load(Relaxed), 0, "stopped on drop");

        // Files not to trust.
        f.edit().version = t::VERSION + 1;
        assert!(ShimRecorder::open(me).is_none(), "another version");
        f.edit().version = t::VERSION;
        f.edit().ring_count = 3;
        assert!(ShimRecorder::open(me).is_none(), "rings beyond the file");
        f.edit().ring_count = 2;
        f.edit().ring_events = 63;
        assert!(ShimRecorder::open(me).is_none(), "not a power of two");
        f.edit().ring_events = 64;
        std::fs::set_permissions(&f.path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(ShimRecorder::open(me).is_none(), "writable by others");
        std::fs::set_permissions(&f.path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(ShimRecorder::open(me).is_some());

        // Truncated under a recording: lost, said so, no SIGBUS.
        let mut r = ShimRecorder::open(me).expect("valid again");
        r.start();
        assert_eq!(r.drain(|_, _| ()).ok(), Some(0));
        File::options()
            .write(true)
            .open(&f.path)
            .unwrap()
            .set_len(t::HEADER_BYTES)
            .unwrap();
        assert!(r.drain(|_, _| ()).is_err(), "the rings are lost");
        assert!(r.lost());
        assert_eq!(r.dropped(), (Vec::new(), 0));
        drop(r);
    }
}
