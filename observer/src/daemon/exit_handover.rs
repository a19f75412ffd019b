//! The shim's exit handover: a rank that ends before any scrape still
//! gives the daemon its final figures.
//!
//! The shim unlinks its segment at `MPI_Finalize` (or exit); the daemon
//! keeps a segment readable only if it opened it before. A rank attached
//! as it started has no segment yet, and one that lives 0.2 s can be gone
//! before the next scrape opens it. So just before it unlinks, the shim
//! connects to this socket and waits (a bounded wait, [`SHIM_WAIT`]) for
//! one byte: by then the daemon has opened the segment through its usual
//! trusted path ([`Segment::open`]: the rank's own maps, its uid, a
//! regular file), attaching the rank first if `--all` had not yet.
//!
//! Only a knock crosses the socket, no data and no descriptor: who knocks
//! is the kernel's word (`SO_PEERCRED`), and the daemon only ever looks at
//! that process, which must still run with that uid. A knock is therefore
//! worth no more than the once-a-second scan's look at the same process,
//! only sooner. Hostile input (docs/security.md, "The handover socket"):
//! - a directory of root's, not writable by others, holds the socket;
//! - knocks wait in one bounded queue per uid, served round-robin
//!   ([`MAX_PENDING`], [`MAX_PER_UID`]); past it, and for a process gone,
//!   not observed, or of another namespace, the connection is closed
//!   unanswered and counted in `mpi_observer_exit_handovers_total{result}`;
//! - the message is a fixed 8-byte magic, read without blocking; anything
//!   else is refused.

use std::{
    collections::{BTreeMap, VecDeque},
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
        unix::{ffi::OsStrExt as _, fs::MetadataExt as _, fs::PermissionsExt as _},
    },
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use thiserror::Error;

use crate::{
    collect::segment::Segment,
    export::registry::{self, State},
    os::procfs,
};

/// The socket's default path (`attach --handover-socket`); the shim's
/// default too (`MPI_OBSERVER_HANDOVER_SOCKET`).
pub const DEFAULT_SOCKET: &str = observer_common::segment::HANDOVER_SOCKET;
/// What a knock says: a version, so a future shim is refused, not misread.
pub const MAGIC: &[u8; 8] = observer_common::segment::HANDOVER_MAGIC;
/// Knocks waiting, all users together.
pub const MAX_PENDING: usize = 1024;
/// Knocks waiting of one uid.
pub const MAX_PER_UID: usize = 256;
/// How long the shim waits for the answer (documented here; the shim has
/// its own copy).
pub const SHIM_WAIT: Duration = Duration::from_millis(250);
/// A knock older than this is not served: the shim stopped waiting.
const STALE: Duration = Duration::from_millis(250);

/// Why the handover socket could not be set up.
#[derive(Debug, Error)]
pub enum HandoverError {
    /// The directory is missing and could not be made, or is not safe.
    #[error(
        "cannot use {path} for the handover socket: {reason}; give --handover-socket a path in a directory of root's, or `none`"
    )]
    Directory {
        /// The directory.
        path: String,
        /// What was wrong.
        reason: String,
    },
    /// A system call on the socket failed.
    #[error("cannot listen on {path}: {what}: {source}")]
    Socket {
        /// The socket's path.
        path: String,
        /// The failing step.
        what: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// Another daemon answers on it.
    #[error(
        "{path} is in use by another daemon; give this one its own --handover-socket, or `none`"
    )]
    InUse {
        /// The socket's path.
        path: String,
    },
}

/// What became of a knock, as `mpi_observer_exit_handovers_total`'s `result`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The rank's segment is held (found now or before).
    Held,
    /// The rank had no segment to hold (none, or not trusted).
    NoSegment,
    /// The process is not one this daemon observes (not attached and not
    /// attachable, another namespace, gone, another uid).
    NotObserved,
    /// The queue was full: closed unanswered.
    QueueFull,
    /// Not a knock (wrong or missing message).
    Malformed,
    /// Waited past the shim's patience.
    Stale,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Held => "held",
            Outcome::NoSegment => "no_segment",
            Outcome::NotObserved => "not_observed",
            Outcome::QueueFull => "queue_full",
            Outcome::Malformed => "malformed",
            Outcome::Stale => "stale",
        }
    }
}

/// How the daemon takes knocks.
#[derive(Clone, Debug)]
pub struct Config {
    /// Attach an unknown knocker (`--all`).
    pub all: bool,
    /// With `--same-netns`, the daemon's network namespace.
    pub netns: Option<PathBuf>,
}

/// The listening socket; its file is removed when dropped.
#[derive(Debug)]
pub struct Listener {
    fd: OwnedFd,
    path: PathBuf,
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Makes `path`'s directory if needed (root's, mode 0755) and checks it:
/// a real directory, owned by root or by us, writable by nobody else.
fn check_directory(dir: &Path) -> Result<(), HandoverError> {
    let bad = |reason: String| HandoverError::Directory {
        path: dir.display().to_string(),
        reason,
    };
    match std::fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir(dir).map_err(|e| bad(e.to_string()))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| bad(e.to_string()))?;
        }
        Err(e) => return Err(bad(e.to_string())),
        Ok(_) => {}
    }
    let m = std::fs::symlink_metadata(dir).map_err(|e| bad(e.to_string()))?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if !m.file_type().is_dir() {
        return Err(bad("not a directory (or a symbolic link)".into()));
    }
    if m.uid() != 0 && m.uid() != me {
        return Err(bad(format!("owned by uid {}, not root", m.uid())));
    }
    if m.mode() & 0o022 != 0 {
        return Err(bad(format!(
            "writable by group or others (mode {:o})",
            m.mode() & 0o7777
        )));
    }
    Ok(())
}

fn socket_error(path: &Path, what: &'static str) -> HandoverError {
    HandoverError::Socket {
        path: path.display().to_string(),
        what,
        source: io::Error::last_os_error(),
    }
}

fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t), HandoverError> {
    // SAFETY: an all-zero sockaddr_un is valid; the path is set below.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= sa.sun_path.len() || bytes.contains(&0) {
        return Err(HandoverError::Socket {
            path: path.display().to_string(),
            what: "path",
            source: io::Error::from_raw_os_error(libc::ENAMETOOLONG),
        });
    }
    for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    Ok((sa, len))
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the result is checked.
    let raw = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just created and own.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

impl Listener {
    /// Listens on `path`, replacing a stale socket left by a daemon killed
    /// with -9, never one another daemon answers on.
    pub fn bind(path: &Path) -> Result<Listener, HandoverError> {
        if let Some(dir) = path.parent() {
            check_directory(dir)?;
        }
        let (sa, len) = sockaddr(path)?;
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket_like() => {
                let probe = seqpacket().map_err(|source| HandoverError::Socket {
                    path: path.display().to_string(),
                    what: "socket",
                    source,
                })?;
                // SAFETY: `sa` is a valid sockaddr_un of length `len`.
                let rc = unsafe { libc::connect(probe.as_raw_fd(), (&raw const sa).cast(), len) };
                let err = io::Error::last_os_error();
                if rc == 0 || err.raw_os_error() == Some(libc::EAGAIN) {
                    return Err(HandoverError::InUse {
                        path: path.display().to_string(),
                    });
                }
                let _ = std::fs::remove_file(path);
            }
            Ok(_) => {
                return Err(HandoverError::Directory {
                    path: path.display().to_string(),
                    reason: "not a socket".into(),
                });
            }
            Err(_) => {}
        }
        let fd = seqpacket().map_err(|source| HandoverError::Socket {
            path: path.display().to_string(),
            what: "socket",
            source,
        })?;
        // SAFETY: `sa` is a valid sockaddr_un of length `len`.
        if unsafe { libc::bind(fd.as_raw_fd(), (&raw const sa).cast(), len) } != 0 {
            return Err(socket_error(path, "bind"));
        }
        let listener = Listener {
            fd,
            path: path.to_path_buf(),
        };
        // Any user's rank knocks: who it is, is the kernel's word.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).map_err(
            |source| HandoverError::Socket {
                path: path.display().to_string(),
                what: "chmod",
                source,
            },
        )?;
        // SAFETY: listen(2) on our socket.
        if unsafe { libc::listen(listener.fd.as_raw_fd(), 512) } != 0 {
            return Err(socket_error(path, "listen"));
        }
        Ok(listener)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

trait SocketLike {
    fn is_socket_like(&self) -> bool;
}

impl SocketLike for std::fs::FileType {
    fn is_socket_like(&self) -> bool {
        use std::os::unix::fs::FileTypeExt as _;
        self.is_socket()
    }
}

/// One accepted knock.
struct Knock {
    conn: OwnedFd,
    pid: u32,
    uid: u32,
    at: Instant,
}

/// Connections accepted per round at most: a flood of connects cannot keep
/// the thread accepting (and the daemon's stop waiting) for ever.
const ACCEPT_BATCH: usize = 64;

/// What [`accept_all`] met.
#[derive(PartialEq)]
enum Accepted {
    /// The backlog is empty, or the batch is done.
    Done,
    /// Out of descriptors: the listener stays readable, so the caller
    /// rests before it tries again.
    OutOfDescriptors,
}

/// Accepts up to [`ACCEPT_BATCH`] waiting connections into `queue` (per
/// uid, bounded).
fn accept_all(
    listener: &Listener,
    queue: &mut BTreeMap<u32, VecDeque<Knock>>,
    pending: &mut usize,
    count: &dyn Fn(Outcome),
) -> Accepted {
    for _ in 0..ACCEPT_BATCH {
        // SAFETY: accept4 on our listening socket, no address wanted.
        let raw = unsafe {
            libc::accept4(
                listener.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if raw < 0 {
            let e = std::io::Error::last_os_error().raw_os_error();
            return if e == Some(libc::EMFILE) || e == Some(libc::ENFILE) {
                Accepted::OutOfDescriptors
            } else {
                Accepted::Done
            };
        }
        // SAFETY: a descriptor accept4 just gave us.
        let conn = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero ucred is valid; getsockopt fills it.
        let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: SO_PEERCRED into a ucred of its size.
        let rc = unsafe {
            libc::getsockopt(
                conn.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&raw mut cred).cast(),
                &mut len,
            )
        };
        // A pid of 0: the knocker is in a pid namespace we cannot see.
        if rc != 0 || cred.pid <= 0 {
            count(Outcome::NotObserved);
            continue;
        }
        // The bounds before any entry is made: a uid refused here must
        // leave no empty queue behind.
        let queued = queue.get(&cred.uid).map_or(0, VecDeque::len);
        if *pending >= MAX_PENDING || queued >= MAX_PER_UID {
            count(Outcome::QueueFull);
            continue;
        }
        queue.entry(cred.uid).or_default().push_back(Knock {
            conn,
            pid: cred.pid as u32,
            uid: cred.uid,
            at: Instant::now(),
        });
        *pending += 1;
    }
    Accepted::Done
}

/// How long a connection may take to say its magic: the shim sends it
/// right after it connects, but the daemon may accept in between.
const SAY_WAIT: Duration = Duration::from_millis(50);

/// Whether `k` carries the magic, within [`SAY_WAIT`] of its accept (not
/// of its turn: connections that never speak cost the thread 50 ms per
/// batch accepted together, not 50 ms each).
fn is_knock(k: &Knock) -> bool {
    let conn = &k.conn;
    let mut pfd = libc::pollfd {
        fd: conn.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let left = SAY_WAIT.saturating_sub(k.at.elapsed());
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut pfd, 1, left.as_millis() as libc::c_int) };
    let mut buf = [0u8; 16];
    // SAFETY: receives into our buffer, without blocking.
    let got = unsafe {
        libc::recv(
            conn.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    };
    usize::try_from(got).is_ok_and(|n| buf[..n] == MAGIC[..])
}

/// Serves one knock: the process must run with the uid that knocked; an
/// observed rank has its segment opened now if it was not, an unknown one
/// is attached first under `--all`. The answer byte is sent only once the
/// segment is held (or found missing).
fn serve(state: &Mutex<State>, config: &Config, k: &Knock) -> Outcome {
    if k.at.elapsed() > STALE {
        return Outcome::Stale;
    }
    if !is_knock(k) {
        return Outcome::Malformed;
    }
    let Ok(ticks) = procfs::start_ticks(k.pid) else {
        return Outcome::NotObserved;
    };
    if procfs::uid(k.pid).ok() != Some(k.uid) {
        return Outcome::NotObserved;
    }
    if config
        .netns
        .as_ref()
        .is_some_and(|n| procfs::net_namespace(k.pid).as_ref() != Some(n))
    {
        return Outcome::NotObserved;
    }
    let known = |st: &State| {
        st.ranks
            .get(&k.pid)
            .filter(|r| r.ticks == ticks)
            .map(|r| r.has_segment())
    };
    let held = known(&state.lock().unwrap_or_else(PoisonError::into_inner));
    let outcome = match held {
        Some(true) => Outcome::Held,
        Some(false) => {
            // Opened without the lock, kept under it.
            match Segment::open(k.pid).ok().flatten() {
                Some(seg) => {
                    let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
                    st.hold_segment(k.pid, ticks, seg);
                    Outcome::Held
                }
                None => Outcome::NoSegment,
            }
        }
        None if config.all => {
            // Not attached yet (found by neither the events nor the scan
            // in time): attached now, which opens its segment.
            let prepared = registry::prepare(k.pid, ticks);
            let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
            match known(&st) {
                Some(true) => Outcome::Held,
                Some(false) => Outcome::NoSegment,
                None => match st.commit(prepared, registry::Admission::Found) {
                    Ok(()) => {
                        drop(st);
                        eprintln!(
                            "mpi-observer: attached to pid {} ({}, uid {}) at its exit handover",
                            k.pid,
                            procfs::comm(k.pid),
                            k.uid
                        );
                        let st = state.lock().unwrap_or_else(PoisonError::into_inner);
                        if known(&st) == Some(true) {
                            Outcome::Held
                        } else {
                            Outcome::NoSegment
                        }
                    }
                    Err(_) => Outcome::NotObserved,
                },
            }
        }
        None => Outcome::NotObserved,
    };
    if outcome == Outcome::Held || outcome == Outcome::NoSegment {
        // SAFETY: sends one byte of ours, without blocking or SIGPIPE.
        unsafe {
            libc::send(
                k.conn.as_raw_fd(),
                b"k".as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }
    outcome
}

/// Runs the handover on a thread of its own until `stop` is set: accepts
/// knocks into per-uid queues and serves them round-robin.
pub fn start(
    listener: Listener,
    state: Arc<Mutex<State>>,
    config: Config,
    stop: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("exit-handover".into())
        .spawn(move || {
            let counter = state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .selfm
                .exit_handovers
                .clone();
            let count = |o: Outcome| counter.with_label_values(&[o.as_str()]).inc();
            let mut queue: BTreeMap<u32, VecDeque<Knock>> = BTreeMap::new();
            let mut pending = 0usize;
            let mut last_uid: Option<u32> = None;
            while !stop.load(Ordering::Relaxed) {
                if pending == 0 {
                    let mut pfd = libc::pollfd {
                        fd: listener.fd.as_raw_fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut pfd, 1, 200) };
                }
                if accept_all(&listener, &mut queue, &mut pending, &count)
                    == Accepted::OutOfDescriptors
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                // The next uid after the last one served.
                let uid = last_uid
                    .and_then(|l| queue.range(l + 1..).next().map(|(u, _)| *u))
                    .or_else(|| queue.keys().next().copied());
                let Some(uid) = uid else { continue };
                last_uid = Some(uid);
                let Some(k) = queue.get_mut(&uid).and_then(VecDeque::pop_front) else {
                    queue.remove(&uid);
                    continue;
                };
                if queue.get(&uid).is_some_and(VecDeque::is_empty) {
                    queue.remove(&uid);
                }
                pending -= 1;
                count(serve(&state, &config, &k));
            }
            drop(listener);
        })
        .expect("spawn the exit handover thread")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("handover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn an_unsafe_directory_is_refused() {
        let d = dir("unsafe");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Listener::bind(&d.join("s")).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        let link = d.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let e = Listener::bind(&link.join("s")).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_live_socket_is_not_taken_over_and_a_stale_one_is() {
        let d = dir("live");
        let p = d.join("s");
        let first = Listener::bind(&p).unwrap();
        assert!(matches!(
            Listener::bind(&p),
            Err(HandoverError::InUse { .. })
        ));
        // A daemon killed with -9 leaves its socket file behind, with
        // nobody listening.
        let fd = first.fd.as_raw_fd();
        std::mem::forget(first);
        // SAFETY: the descriptor `first` owned, closed once, never used again.
        unsafe { libc::close(fd) };
        assert!(p.exists());
        let again = Listener::bind(&p).expect("a stale socket is replaced");
        drop(again);
        assert!(!p.exists(), "the socket file goes with the listener");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn knocks_are_queued_per_uid_and_bounded() {
        let d = dir("queue");
        let p = d.join("s");
        let l = Listener::bind(&p).unwrap();
        let (sa, len) = sockaddr(&p).unwrap();
        let mut conns = Vec::new();
        for _ in 0..MAX_PER_UID + 3 {
            let c = seqpacket().unwrap();
            // SAFETY: a valid sockaddr_un of length `len`.
            let rc = unsafe { libc::connect(c.as_raw_fd(), (&raw const sa).cast(), len) };
            if rc == 0 {
                conns.push(c);
            }
        }
        let mut queue = BTreeMap::new();
        let mut pending = 0;
        let full = std::cell::Cell::new(0);
        // A batch at a time.
        for _ in 0..conns.len().div_ceil(ACCEPT_BATCH) + 1 {
            accept_all(&l, &mut queue, &mut pending, &|o| {
                assert_eq!(o, Outcome::QueueFull);
                full.set(full.get() + 1);
            });
        }
        assert_eq!(pending, MAX_PER_UID.min(conns.len()));
        assert_eq!(pending + full.get(), conns.len());
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        assert!(queue[&me].iter().all(|k| k.pid == std::process::id()));
        // A knock without the magic is not one.
        assert!(!is_knock(&queue.get(&me).unwrap()[0]));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_knock_refused_for_a_full_queue_leaves_no_empty_queue() {
        // Other users' knocks fill the whole queue; this uid's knock is
        // refused and must not leave an empty queue for the round-robin
        // (which took a queue it picked to be non-empty).
        let d = dir("full");
        let p = d.join("s");
        let l = Listener::bind(&p).unwrap();
        let (sa, len) = sockaddr(&p).unwrap();
        let c = seqpacket().unwrap();
        // SAFETY: a valid sockaddr_un of length `len`.
        let rc = unsafe { libc::connect(c.as_raw_fd(), (&raw const sa).cast(), len) };
        assert_eq!(rc, 0);
        let mut queue = BTreeMap::new();
        let mut pending = MAX_PENDING;
        let full = std::cell::Cell::new(0);
        accept_all(&l, &mut queue, &mut pending, &|o| {
            assert_eq!(o, Outcome::QueueFull);
            full.set(full.get() + 1);
        });
        assert_eq!(full.get(), 1);
        assert!(queue.is_empty(), "no queue made for a refused knock");
        let _ = std::fs::remove_dir_all(&d);
    }
}
