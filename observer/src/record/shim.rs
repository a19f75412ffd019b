//! The recorder's side of the shim's event rings
//! (`/dev/shm/mpi-observer.<pid>.trace`, layout in
//! `observer_common::trace`): start a recording, drain it, stop it.
//!
//! The file is validated before use (owner, mode, magic, version, sizes
//! against the file's own size), and only its atomics and records are
//! touched. The mapping outlives the shim's unlink at `MPI_Finalize`, so a
//! rank that exits mid-recording still has its last events read. Dropping
//! a recorder stops its recording, so an error path leaves the shim idle.
//! A recorder killed with SIGKILL leaves `active` set: the shim then fills
//! its rings and drops (counted) until the next recording's start, costing
//! the rank a clock read and a ring test per event, never a wait.

use std::{
    fs::File,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    ptr::NonNull,
    sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release},
};

use observer_common::{
    segment::PATH_PREFIX,
    trace::{self as t, RingHeader, TraceEvent, TraceHeader},
};

/// One process's rings, mapped.
pub struct ShimRecorder {
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

/// The trace file of `pid`.
pub fn path(pid: u32) -> String {
    format!("{PATH_PREFIX}{pid}{}", t::PATH_SUFFIX)
}

impl ShimRecorder {
    /// Maps `pid`'s trace file; `None` when it has none (no shim, or no
    /// `stats` layer, or a shim of an earlier version), or when the file
    /// is not one to trust.
    pub fn open(pid: u32) -> Option<ShimRecorder> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(path(pid))
            .ok()?;
        let meta = file.metadata().ok()?;
        let owner = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
        if !meta.file_type().is_file() || meta.uid() != owner || meta.mode() & 0o022 != 0 {
            return None;
        }
        let len = meta.len();
        if !(t::HEADER_BYTES..=t::MAX_BYTES).contains(&len) {
            return None;
        }
        let base = map(&file, len as usize)?;
        let mut r = ShimRecorder {
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
        if !ok {
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

    /// This process's rank in `MPI_COMM_WORLD`, as the shim read it.
    pub fn world_rank(&self) -> Option<u32> {
        Some(self.header().world_rank)
    }

    /// `MPI_COMM_WORLD`'s size.
    pub fn world_size(&self) -> u32 {
        self.header().world_size
    }

    /// Starts a recording: every ring free and empty, a new generation,
    /// then `active`.
    pub fn start(&mut self) {
        self.no_ring_at_start = self.header().no_ring.load(Relaxed);
        let h = self.header();
        h.active.store(0, Release);
        let mut dropped = Vec::with_capacity(self.rings as usize);
        for i in 0..self.rings {
            let (r, _) = self.ring(i);
            r.tail.store(r.head.load(Acquire), Release);
            r.owner.store(0, Release);
            dropped.push(r.dropped.load(Relaxed));
        }
        h.generation.fetch_add(1, AcqRel);
        h.active.store(1, Release);
        self.dropped_at_start = dropped;
        self.recording = true;
    }

    /// Moves every event written since the last call out, ring by ring, in
    /// each ring's order: `f(owner thread id, event)`. Returns how many.
    pub fn drain(&mut self, mut f: impl FnMut(u32, &TraceEvent)) -> u64 {
        let mut n = 0;
        for i in 0..self.rings {
            let (r, recs) = self.ring(i);
            let owner = r.owner.load(Acquire);
            // SAFETY: the ring's records, one consumer (us).
            n += unsafe { t::drain(r, recs, self.events, |e| f(owner, e)) };
        }
        n
    }

    /// Events dropped since the start: per ring (its owner and count), and
    /// those of threads that found no ring.
    pub fn dropped(&self) -> (Vec<(u32, u64)>, u64) {
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
        self.stop();
        // SAFETY: our mapping, no reference outlives `self`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

fn map(file: &File, len: usize) -> Option<NonNull<u8>> {
    use std::os::fd::AsRawFd as _;
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
    if p == libc::MAP_FAILED {
        return None;
    }
    NonNull::new(p.cast())
}
