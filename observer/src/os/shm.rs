//! The shim's files in `/dev/shm` (stats segments and recording rings),
//! as the daemon and `mpi-observer record` use them: found, opened,
//! mapped under the SIGBUS guard, and removed once orphaned.
//!
//! - **Found** through the process's own mappings, never by guessing a
//!   name: the shim names its files `mpi-observer.<uid>.<pid>.<random>`
//!   (see `observer_common::segment::Name`) and keeps them mapped, so
//!   `/proc/PID/maps` lists them (` (deleted)` once `MPI_Finalize` unlinked
//!   them). A name is only a hint: the pid in it must be the process's own
//!   (a child forked without exec maps its parent's segment too).
//! - **Opened** through `/proc/PID/map_files/START-END`, the kernel's own
//!   reference to the mapped inode. Where that is refused (it needs
//!   `CAP_SYS_ADMIN` or `CAP_CHECKPOINT_RESTORE`: an unprivileged
//!   `--no-bpf` daemon, the systemd unit, or a `record` run by the job's
//!   user) the path from the maps line is opened with
//!   `O_NOFOLLOW | O_NONBLOCK` and kept only if its device and inode are
//!   the line's. Either way the file must be a regular file owned by the
//!   process's real uid, not writable by group or others, within a cap.
//! - **Mapped** with [`Guarded`]: if the owner truncates the file while it
//!   is mapped, the SIGBUS of the next access is caught, the vanished page
//!   is replaced by an anonymous zero page (writable if the mapping is),
//!   and the mapping reports [`Guarded::faulted`]; its figures or events
//!   from then on are discarded by the caller.
//! - **Removed** when orphaned ([`sweep`]): a regular file whose named
//!   process no longer maps it, older than a grace period.

use std::{
    ffi::CString,
    fs::{File, OpenOptions},
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{
            ffi::OsStrExt as _,
            fs::{MetadataExt as _, OpenOptionsExt as _},
        },
    },
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, AtomicUsize, Ordering},
    time::{Duration, SystemTime},
};

use observer_common::segment::{DIR, Name};
use thiserror::Error;

use crate::os::procfs::{self, MapEntry, ProcError};

/// Why a shim file was not used.
#[derive(Debug, Error)]
pub enum ShmError {
    /// No way of opening the mapped file worked.
    #[error("cannot open {path} of pid {pid}: {source}")]
    Open {
        /// The process.
        pid: u32,
        /// The path in its maps.
        path: String,
        /// The last error.
        source: io::Error,
    },
    /// Not a regular file, not the process's owner's, writable by others,
    /// or not the file mapped.
    #[error(
        "{path} of pid {pid} is not to be trusted (not a regular file owned by the process's user, mode without group/other write, the file it maps)"
    )]
    Untrusted {
        /// The process.
        pid: u32,
        /// The path.
        path: String,
    },
    /// Larger than the cap.
    #[error("{path} of pid {pid} is {size} bytes, over the {cap}-byte cap")]
    TooLarge {
        /// The process.
        pid: u32,
        /// The path.
        path: String,
        /// Its size.
        size: u64,
        /// The cap.
        cap: u64,
    },
    /// `mmap` failed.
    #[error("cannot map {len} bytes: {source}")]
    Map {
        /// The length asked for.
        len: usize,
        /// The OS error.
        source: io::Error,
    },
    /// Every guard slot is taken by concurrent readers: the read is
    /// refused rather than made unguarded.
    #[error("all {GUARD_SLOTS} SIGBUS guard slots are in use; read refused")]
    GuardBusy,
}

/// Which of a process's two shim files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The stats segment.
    Segment,
    /// The recording rings (`.trace`).
    Trace,
}

/// The mapping of `pid`'s shim file of `kind` in its maps (the one at file
/// offset 0), if it has one. An exited process has none.
pub fn find(pid: u32, kind: Kind) -> Result<Option<MapEntry>, ProcError> {
    let maps = match procfs::maps(pid) {
        Ok(m) => m,
        Err(ProcError::NoSuchProcess { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(maps.into_iter().find(|m| {
        m.offset == 0
            && m.shared
            && m.path
                .as_deref()
                .is_some_and(|p| p.parent() == Some(Path::new(DIR)))
            && m.file_name().and_then(Name::parse).is_some_and(|n| {
                n.uid.is_some() && n.pid == pid && n.trace == (kind == Kind::Trace)
            })
    }))
}

fn open_flags(path: &Path, write: bool, nofollow: bool) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(flags)
        .open(path)
}

/// Opens the file of mapping `m` of `pid` (for writing too if `write`),
/// checked as the module says, at most `cap` bytes.
pub fn open_mapped(pid: u32, m: &MapEntry, write: bool, cap: u64) -> Result<File, ShmError> {
    let shown = m
        .path
        .as_deref()
        .map_or_else(|| "[anonymous]".to_string(), |p| p.display().to_string());
    let map_files = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    // The kernel's own link to the mapped inode: following it is safe.
    let file = match open_flags(&map_files, write, false) {
        Ok(f) => f,
        Err(first) => {
            let mut last = first;
            let mut found = None;
            for p in [m.host_path(pid), m.path.clone()].into_iter().flatten() {
                match open_flags(&p, write, true) {
                    Ok(f) => {
                        found = Some(f);
                        break;
                    }
                    Err(e) => last = e,
                }
            }
            let f = found.ok_or(ShmError::Open {
                pid,
                path: shown.clone(),
                source: last,
            })?;
            let meta = f.metadata().map_err(|source| ShmError::Open {
                pid,
                path: shown.clone(),
                source,
            })?;
            let want = (libc::makedev(m.dev.0, m.dev.1), m.inode);
            if !crate::os::userfile::is_mapped_file(&f, &meta, want) {
                return Err(ShmError::Untrusted { pid, path: shown });
            }
            f
        }
    };
    trusted(pid, file, shown, cap)
}

/// `file` if it is a regular file owned by `pid`'s real uid, without group
/// or other write permission, and at most `cap` bytes.
pub fn trusted(pid: u32, file: File, shown: String, cap: u64) -> Result<File, ShmError> {
    let meta = file.metadata().map_err(|source| ShmError::Open {
        pid,
        path: shown.clone(),
        source,
    })?;
    let owner_ok = procfs::uid(pid).is_ok_and(|uid| uid == meta.uid());
    if !meta.file_type().is_file() || !owner_ok || meta.mode() & 0o022 != 0 {
        return Err(ShmError::Untrusted { pid, path: shown });
    }
    if meta.len() > cap {
        return Err(ShmError::TooLarge {
            pid,
            path: shown,
            size: meta.len(),
            cap,
        });
    }
    Ok(file)
}

// ---------------------------------------------------------------------
// The SIGBUS guard.

/// Mappings under the guard at once. Readers in several threads (scrapes)
/// each hold one for the length of a read, and `record` one per recorded
/// rank for the whole recording, so there are more than a node has ranks;
/// the fixed size keeps the handler lock-free (it scans them only on a
/// SIGBUS). A reader that finds none free is refused
/// ([`ShmError::GuardBusy`]) and says or counts so, never left unguarded.
pub const GUARD_SLOTS: usize = 1024;
/// Slot states in `GUARD_START`: free, being set up (a start no mapping
/// has), or the mapping's start.
const FREE: usize = 0;
const CLAIMED: usize = usize::MAX;
static GUARD_START: [AtomicUsize; GUARD_SLOTS] = [const { AtomicUsize::new(FREE) }; GUARD_SLOTS];
static GUARD_LEN: [AtomicUsize; GUARD_SLOTS] = [const { AtomicUsize::new(0) }; GUARD_SLOTS];
static GUARD_WRITABLE: [AtomicBool; GUARD_SLOTS] = [const { AtomicBool::new(false) }; GUARD_SLOTS];
static GUARD_FAULT: [AtomicBool; GUARD_SLOTS] = [const { AtomicBool::new(false) }; GUARD_SLOTS];
static HANDLER: std::sync::Once = std::sync::Once::new();

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for i in 0..GUARD_SLOTS {
        let start = GUARD_START[i].load(Ordering::Acquire);
        let len = GUARD_LEN[i].load(Ordering::Acquire);
        if start != FREE && start != CLAIMED && addr >= start && addr - start < len {
            GUARD_FAULT[i].store(true, Ordering::Release);
            let prot = if GUARD_WRITABLE[i].load(Ordering::Acquire) {
                libc::PROT_READ | libc::PROT_WRITE
            } else {
                libc::PROT_READ
            };
            // Put a zero page where the file's page vanished and resume.
            let size = PAGE.load(Ordering::Relaxed);
            let page = addr & !(size - 1);
            // SAFETY: the page lies inside our own mapping of the file;
            // replacing it with anonymous zeros cannot affect anything else.
            let zeroed = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    size,
                    prot,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if zeroed != libc::MAP_FAILED {
                return;
            }
            // Retrying the load would fault forever: die of the fault.
            break;
        }
    }
    // Not ours, or no zero page could take the vanished one's place:
    // restore the default action and let the fault kill us.
    // SAFETY: plain signal-disposition calls.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

/// The page size the handler replaces, read before it is installed (the
/// handler calls nothing that is not async-signal-safe).
static PAGE: AtomicUsize = AtomicUsize::new(4096);

fn install_handler() {
    HANDLER.call_once(|| {
        PAGE.store(crate::os::sys::page_size(), Ordering::Relaxed);
        // SAFETY: installs a handler that only touches atomics and mmap.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigbus as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    });
}

/// A shared mapping of a user's file under the SIGBUS guard while it
/// lives: read-only, or read-write for the recorder's ring indices.
#[derive(Debug)]
pub struct Guarded {
    base: *mut u8,
    len: usize,
    slot: usize,
}

// SAFETY: the mapping is plain memory; its guard slot is per mapping, and
// the handler finds it by address from whichever thread faults.
unsafe impl Send for Guarded {}

impl Guarded {
    /// Maps the first `len` bytes of `file`, writable if `write`.
    pub fn new(file: &File, len: usize, write: bool) -> Result<Self, ShmError> {
        install_handler();
        let slot = (0..GUARD_SLOTS)
            .find(|i| {
                GUARD_START[*i]
                    .compare_exchange(FREE, CLAIMED, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .ok_or(ShmError::GuardBusy)?;
        let prot = if write {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of a file we hold open.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let source = io::Error::last_os_error();
            GUARD_START[slot].store(FREE, Ordering::Release);
            return Err(ShmError::Map { len, source });
        }
        GUARD_FAULT[slot].store(false, Ordering::Release);
        GUARD_WRITABLE[slot].store(write, Ordering::Release);
        GUARD_LEN[slot].store(len, Ordering::Release);
        GUARD_START[slot].store(p as usize, Ordering::Release);
        Ok(Guarded {
            base: p.cast(),
            len,
            slot,
        })
    }

    /// The first byte.
    pub fn base(&self) -> *mut u8 {
        self.base
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: a mapping has at least one byte (kept for clippy's sake).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a page vanished under an access (the file shrank): what
    /// was read since may be zeros, not the file's.
    pub fn faulted(&self) -> bool {
        GUARD_FAULT[self.slot].load(Ordering::Acquire)
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // Unmap first, then free the slot: a fault can no longer happen in
        // a mapping that is gone, and the slot is not reused while the
        // address range still belongs to it.
        // SAFETY: unmapping our own mapping, no references to it remain.
        unsafe { libc::munmap(self.base.cast(), self.len) };
        GUARD_START[self.slot].store(FREE, Ordering::Release);
    }
}

// ---------------------------------------------------------------------
// Orphans.

/// Bounds of one [`sweep`].
#[derive(Clone, Copy, Debug)]
pub struct SweepLimits {
    /// A file younger than this is spared (a shim between creating and
    /// mapping its file).
    pub grace: Duration,
    /// Entries of the directory looked at, at most.
    pub max_examined: usize,
    /// Files removed, at most.
    pub max_removed: usize,
    /// Only this user's files (an unprivileged daemon); `None`: anyone's.
    pub only_uid: Option<u32>,
}

impl Default for SweepLimits {
    fn default() -> Self {
        SweepLimits {
            grace: Duration::from_secs(30),
            max_examined: 20_000,
            max_removed: 1_000,
            only_uid: None,
        }
    }
}

/// How often the daemon sweeps.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Whether `pid` maps the inode `(dev, ino)`: `Some(false)` if it does not
/// or does not exist, `None` if that cannot be told (its maps unreadable),
/// which spares the file.
fn mapped_by(pid: u32, dev: u64, ino: u64) -> Option<bool> {
    match procfs::maps(pid) {
        Ok(maps) => Some(
            maps.iter()
                .any(|m| m.inode == ino && libc::makedev(m.dev.0, m.dev.1) == dev),
        ),
        Err(ProcError::NoSuchProcess { .. }) => Some(false),
        Err(ProcError::Unreadable { .. }) => None,
    }
}

/// Removes the orphaned shim files (segments and trace files, of the
/// current and the old naming) of directory `dir`: a regular file (a
/// symlink or anything else named so is left alone) of a process that no
/// longer maps it, older than the grace period. Entries are looked at
/// through a descriptor of the directory, `fstatat` without following, and
/// removed with `unlinkat`, so no path component can be swapped. Returns
/// how many files were removed.
pub fn sweep(dir: &Path, lim: SweepLimits) -> usize {
    let Ok(cdir) = CString::new(dir.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: a NUL-terminated path; the descriptor is owned below.
    let fd = unsafe {
        libc::open(
            cdir.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return 0;
    }
    // SAFETY: a descriptor we just opened and own.
    let dirfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for entry in entries.take(lim.max_examined).flatten() {
        if removed >= lim.max_removed {
            break;
        }
        let name = entry.file_name();
        let Some(parsed) = name.to_str().and_then(Name::parse) else {
            continue;
        };
        let Ok(cname) = CString::new(name.as_bytes()) else {
            continue;
        };
        // SAFETY: a zeroed stat is a valid out-buffer.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: our directory descriptor, a NUL-terminated name, an
        // out-pointer; AT_SYMLINK_NOFOLLOW describes a symlink itself.
        if unsafe {
            libc::fstatat(
                dirfd.as_raw_fd(),
                cname.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        } != 0
        {
            continue;
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            continue;
        }
        if lim.only_uid.is_some_and(|u| u != st.st_uid) {
            continue;
        }
        // Its age by modification time (creation sets it; writes through
        // the mapping do not move it on tmpfs): a file being set up is
        // spared. Only its owner (or root) can move it back in time.
        let age = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64)
            .saturating_sub(st.st_mtime);
        if age < lim.grace.as_secs() as i64 {
            continue;
        }
        if mapped_by(parsed.pid, st.st_dev, st.st_ino) != Some(false) {
            continue;
        }
        // SAFETY: our directory descriptor and a NUL-terminated name;
        // unlinkat removes the entry itself, never what it might point to.
        if unsafe { libc::unlinkat(dirfd.as_raw_fd(), cname.as_ptr(), 0) } == 0 {
            removed += 1;
        }
    }
    removed
}

/// Removes `dir/name` if it is still the regular file `(dev, ino)`.
pub fn remove_if_same(dir: &Path, name: &str, dev: u64, ino: u64) -> bool {
    let p = dir.join(name);
    match std::fs::symlink_metadata(&p) {
        Ok(m) if m.file_type().is_file() && m.dev() == dev && m.ino() == ino => {
            std::fs::remove_file(&p).is_ok()
        }
        _ => false,
    }
}

/// Held by the unit tests that map under the guard, so the one that takes
/// every slot cannot starve the others.
#[cfg(test)]
pub(crate) fn guard_test_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("shm-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn old(p: &Path) {
        let f = File::options().write(true).open(p).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(3600))
            .unwrap();
    }

    #[test]
    fn a_truncated_file_faults_into_zeros_read_only_and_writable() {
        let _g = guard_test_lock();
        for write in [false, true] {
            let d = scratch(&format!("trunc-{write}"));
            let p = d.join("f");
            std::fs::write(&p, [7u8; 4096]).unwrap();
            let f = File::options().read(true).write(true).open(&p).unwrap();
            let m = Guarded::new(&f, 8192, write).unwrap();
            // SAFETY: within the mapping; the second page is past EOF.
            unsafe {
                assert_eq!(*m.base(), 7);
                assert!(!m.faulted());
                assert_eq!(m.base().add(4096).read_volatile(), 0);
                assert!(m.faulted());
                if write {
                    m.base().add(4096).write_volatile(1);
                    assert_eq!(m.base().add(4096).read_volatile(), 1);
                }
            }
            drop(m);
            let _ = std::fs::remove_dir_all(&d);
        }
    }

    #[test]
    fn guard_slots_run_out_cleanly_and_come_back() {
        let _g = guard_test_lock();
        let d = scratch("slots");
        let p = d.join("f");
        std::fs::write(&p, [1u8; 4096]).unwrap();
        let f = File::open(&p).unwrap();
        let mut held = Vec::new();
        loop {
            match Guarded::new(&f, 4096, false) {
                Ok(m) => held.push(m),
                Err(ShmError::GuardBusy) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(held.len(), GUARD_SLOTS);
        held.pop();
        assert!(Guarded::new(&f, 4096, false).is_ok());
        drop(held);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn found_in_the_maps_and_opened_either_way() {
        let _g = guard_test_lock();
        let me = std::process::id();
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        let mut b = [0u8; observer_common::segment::NAME_MAX];
        let n = Name {
            uid: Some(uid),
            pid: me,
            random: Some(0xabcd),
            trace: false,
        }
        .write(&mut b);
        let p = Path::new(DIR).join(std::str::from_utf8(&b[..n]).unwrap());
        std::fs::write(&p, [0u8; 4096]).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let f = File::options().read(true).write(true).open(&p).unwrap();
        let m = Guarded::new(&f, 4096, true).unwrap();
        let e = find(me, Kind::Segment)
            .unwrap()
            .expect("in this process's maps");
        assert_eq!(e.path.as_deref(), Some(p.as_path()));
        assert!(find(me, Kind::Trace).unwrap().is_none());
        // Through map_files (root), or the path.
        let opened = open_mapped(me, &e, false, 1 << 20).unwrap();
        assert_eq!(opened.metadata().unwrap().ino(), e.inode);
        // The path route alone (no such map_files link): the device and
        // inode must be the maps line's.
        let by_path = MapEntry {
            start: 1,
            end: 2,
            ..e.clone()
        };
        assert!(open_mapped(me, &by_path, true, 1 << 20).is_ok());
        let other = MapEntry {
            inode: e.inode + 1,
            ..by_path.clone()
        };
        assert!(matches!(
            open_mapped(me, &other, false, 1 << 20),
            Err(ShmError::Untrusted { .. })
        ));
        assert!(matches!(
            open_mapped(me, &e, false, 100),
            Err(ShmError::TooLarge { .. })
        ));
        // Writable by others: refused.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert!(matches!(
            open_mapped(me, &e, false, 1 << 20),
            Err(ShmError::Untrusted { .. })
        ));
        // Unlinked: still found (deleted) and opened through map_files.
        std::fs::remove_file(&p).unwrap();
        let e = find(me, Kind::Segment).unwrap().expect("still mapped");
        assert!(e.deleted);
        drop(m);
        assert!(find(me, Kind::Segment).unwrap().is_none());
    }

    #[test]
    fn the_sweep_removes_orphans_only() {
        let _g = guard_test_lock();
        let d = scratch("sweep");
        let me = std::process::id();
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        // A pid that cannot exist (beyond pid_max's largest value).
        let dead = 4_194_305;
        let name = |pid: u32, trace: bool| {
            let mut b = [0u8; observer_common::segment::NAME_MAX];
            let n = Name {
                uid: Some(uid),
                pid,
                random: Some(0xfeed),
                trace,
            }
            .write(&mut b);
            String::from_utf8(b[..n].to_vec()).unwrap()
        };
        let orphan = d.join(name(dead, false));
        let orphan_trace = d.join(name(dead, true));
        let old_form = d.join(format!("mpi-observer.{dead}"));
        let young = d.join(name(dead + 1, false));
        let live = d.join(name(me, false));
        let link = d.join(format!("mpi-observer.{}", dead + 2));
        let stranger = d.join("mpi-observer-test.1.x");
        for p in [&orphan, &orphan_trace, &old_form, &live, &stranger] {
            std::fs::write(p, b"x").unwrap();
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
            old(p);
        }
        std::fs::write(&young, b"x").unwrap();
        std::os::unix::fs::symlink(&orphan, &link).unwrap();
        // This process maps `live`.
        let f = File::open(&live).unwrap();
        let m = Guarded::new(&f, 1, false).unwrap();
        let n = sweep(&d, SweepLimits::default());
        assert_eq!(n, 3);
        for p in [&orphan, &orphan_trace, &old_form] {
            assert!(!p.exists(), "{} must be removed", p.display());
        }
        for p in [&young, &live, &stranger] {
            assert!(p.exists(), "{} must stay", p.display());
        }
        assert!(
            std::fs::symlink_metadata(&link).is_ok(),
            "a symlink is not removed"
        );
        // The bound on removals, and another user's files spared.
        for i in 0..3 {
            let p = d.join(name(dead + 10 + i, false));
            std::fs::write(&p, b"x").unwrap();
            old(&p);
        }
        let one = SweepLimits {
            max_removed: 1,
            ..SweepLimits::default()
        };
        assert_eq!(sweep(&d, one), 1);
        let other = SweepLimits {
            only_uid: Some(uid + 1),
            ..SweepLimits::default()
        };
        assert_eq!(sweep(&d, other), 0);
        assert_eq!(sweep(&d, SweepLimits::default()), 2);
        drop(m);
        let _ = std::fs::remove_dir_all(&d);
    }
}
