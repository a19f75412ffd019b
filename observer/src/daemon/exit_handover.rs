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
//! is the kernel's word (`SO_PEERCRED`, the effective uid at connect), and
//! the daemon only ever looks at that process, whose real, effective,
//! saved and filesystem uids must all still be that uid (a setuid program
//! hands over nobody's figures). A knock is therefore worth no more than
//! the once-a-second scan's look at the same process, only sooner.
//! Hostile input (docs/security.md, "The handover socket"):
//! - a directory of root's, not writable by others, holds the socket;
//! - knocks wait in one bounded queue per uid, served round-robin
//!   ([`MAX_PENDING`], [`MAX_PER_UID`]); past it, and for a process gone,
//!   not observed, of mixed uids, or of another namespace, the connection
//!   is closed unanswered and counted in
//!   `mpi_observer_exit_handovers_total{result}`;
//! - a process the scan (or an earlier knock) judged not MPI, or that a
//!   budget refused, is answered at once, without a look at its maps
//!   ([`super::not_mpi`], `State::refused`);
//! - attaching an unknown knocker (`--all`) is done by a thread of its own,
//!   one at a time, users round-robin ([`MAX_ATTACH_WAITING`]), so a slow
//!   attach never holds up the knocks of ranks already observed;
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

use super::not_mpi::NotMpi;
use crate::{
    collect::segment::Segment,
    export::registry::{self, AttachError, State},
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
/// Knocks waiting for their process to be attached, all users together:
/// more would go stale before their turn ([`STALE`]) anyway.
pub const MAX_ATTACH_WAITING: usize = 64;
/// Knocks of one uid waiting for an attach.
pub const MAX_ATTACH_WAITING_PER_UID: usize = 16;

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
    /// Judged not MPI before (by the scan or an earlier knock): closed
    /// unanswered, its maps not read again.
    NotMpi,
    /// Refused by a budget before (or its attach failed): closed
    /// unanswered until one of its user's ranks exits and frees room.
    Refused,
    /// The process's real, effective, saved and filesystem uids are not
    /// all the uid that knocked (a setuid program): closed unanswered.
    UidMismatch,
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
            Outcome::NotMpi => "not_mpi",
            Outcome::Refused => "refused",
            Outcome::UidMismatch => "uid_mismatch",
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
    /// Processes judged not MPI, shared with the scan.
    pub not_mpi: Arc<NotMpi>,
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

/// What the knock thread makes of a knock on its own.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// Served: answered (or closed) now.
    Done(Outcome),
    /// An unknown process under `--all`, started at these ticks: for the
    /// attach thread ([`attach_knocker`]).
    Attach(u64),
}

/// Whether all four uids of a process (`/proc/PID/status`) are `claimed`.
fn uids_are(uids: [u32; 4], claimed: u32) -> bool {
    uids.iter().all(|&u| u == claimed)
}

/// `Some(held)` if `pid` (started at `ticks`) is an observed rank, `held`
/// whether its segment is held.
fn known(st: &State, pid: u32, ticks: u64) -> Option<bool> {
    st.ranks
        .get(&pid)
        .filter(|r| r.ticks == ticks)
        .map(|r| r.has_segment())
}

/// Opens an observed rank's segment (without the lock) and holds it
/// (under it).
fn hold_now(state: &Mutex<State>, pid: u32, ticks: u64) -> Outcome {
    match Segment::open(pid).ok().flatten() {
        Some(seg) => {
            let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
            st.hold_segment(pid, ticks, seg);
            Outcome::Held
        }
        None => Outcome::NoSegment,
    }
}

/// Judges one knock on the knock thread, reading no more than the
/// process's stat and status (and, for a rank observed, its segment): the
/// process must run with the uid that knocked, all four of its uids; an
/// observed rank has its segment opened now if it was not; one judged not
/// MPI or refused before is closed at once; an unknown one under `--all`
/// goes to the attach thread.
fn judge(state: &Mutex<State>, config: &Config, k: &Knock) -> Verdict {
    if k.at.elapsed() > STALE {
        return Verdict::Done(Outcome::Stale);
    }
    if !is_knock(k) {
        return Verdict::Done(Outcome::Malformed);
    }
    // One read gives the start time and the name the not-MPI set is keyed by.
    let Ok((stat, comm)) = procfs::stat_and_comm(k.pid) else {
        return Verdict::Done(Outcome::NotObserved);
    };
    let ticks = stat.start_ticks;
    match procfs::uids(k.pid) {
        Ok(uids) if uids_are(uids, k.uid) => {}
        Ok(_) => return Verdict::Done(Outcome::UidMismatch),
        Err(_) => return Verdict::Done(Outcome::NotObserved),
    }
    if config
        .netns
        .as_ref()
        .is_some_and(|n| procfs::net_namespace(k.pid).as_ref() != Some(n))
    {
        return Verdict::Done(Outcome::NotObserved);
    }
    let (held, refused) = {
        let st = state.lock().unwrap_or_else(PoisonError::into_inner);
        (
            known(&st, k.pid, ticks),
            st.refused.contains_key(&(k.pid, ticks)),
        )
    };
    Verdict::Done(match held {
        Some(true) => Outcome::Held,
        Some(false) => hold_now(state, k.pid, ticks),
        None if refused => Outcome::Refused,
        None if !config.all => Outcome::NotObserved,
        None if config.not_mpi.settled(k.pid, ticks, &comm) => Outcome::NotMpi,
        None => return Verdict::Attach(ticks),
    })
}

/// Attaches an unknown knocker (found by neither the exec events nor the
/// scan in time), which opens its segment; on the attach thread. What it
/// finds not MPI, or fails to attach, is remembered so its next knock
/// costs no look.
fn attach_knocker(state: &Mutex<State>, config: &Config, k: &Knock, ticks: u64) -> Outcome {
    if k.at.elapsed() > STALE {
        return Outcome::Stale;
    }
    // The attacher may have been quicker.
    let held = known(
        &state.lock().unwrap_or_else(PoisonError::into_inner),
        k.pid,
        ticks,
    );
    match held {
        Some(true) => return Outcome::Held,
        Some(false) => return hold_now(state, k.pid, ticks),
        None => {}
    }
    let prepared = match registry::prepare(k.pid, ticks) {
        // Not a failure to count: the scan judges such processes too.
        Err(AttachError::NoMpiLibrary { comm, .. } | AttachError::Static { comm, .. }) => {
            config.not_mpi.insert(k.pid, ticks, comm);
            return Outcome::NotObserved;
        }
        p => p,
    };
    let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
    match known(&st, k.pid, ticks) {
        Some(true) => return Outcome::Held,
        Some(false) => return Outcome::NoSegment,
        None => {}
    }
    match st.commit(prepared, registry::Admission::Found) {
        Ok(()) => {
            let held = known(&st, k.pid, ticks) == Some(true);
            drop(st);
            eprintln!(
                "mpi-observer: attached to pid {} ({}, uid {}) at its exit handover",
                k.pid,
                procfs::comm(k.pid),
                k.uid
            );
            if held {
                Outcome::Held
            } else {
                Outcome::NoSegment
            }
        }
        // Counted by the budget, which said its line.
        Err(AttachError::Refused { .. }) => Outcome::Refused,
        Err(e @ AttachError::Exited { .. }) => {
            drop(st);
            eprintln!("mpi-observer: {e}");
            Outcome::NotObserved
        }
        Err(e) => {
            // As the attacher does: not tried again (one line, one count)
            // until one of its user's ranks exits and frees room.
            st.refused.insert((k.pid, ticks), k.uid);
            drop(st);
            eprintln!("mpi-observer: pid {}: {}", k.pid, crate::one_line(&e));
            Outcome::NotObserved
        }
    }
}

/// Sends the answer byte once the segment is held (or found missing);
/// any other outcome closes the connection unanswered (when `k` drops),
/// which ends the shim's wait as surely.
fn answer(k: &Knock, outcome: Outcome) {
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
}

/// Items waiting per uid, served round-robin, bounded in all and per uid.
struct Fair<T> {
    by_uid: BTreeMap<u32, VecDeque<T>>,
    len: usize,
    last_uid: Option<u32>,
    cap: usize,
    per_uid: usize,
}

impl<T> Fair<T> {
    fn new(cap: usize, per_uid: usize) -> Fair<T> {
        Fair {
            by_uid: BTreeMap::new(),
            len: 0,
            last_uid: None,
            cap,
            per_uid,
        }
    }

    /// Queues `t` for `uid`; gives it back if a bound is reached (no empty
    /// queue is left behind).
    fn push(&mut self, uid: u32, t: T) -> Result<(), T> {
        if self.len >= self.cap || self.by_uid.get(&uid).map_or(0, VecDeque::len) >= self.per_uid {
            return Err(t);
        }
        self.by_uid.entry(uid).or_default().push_back(t);
        self.len += 1;
        Ok(())
    }

    /// The next item of the uid after the one served last.
    fn pop(&mut self) -> Option<T> {
        let uid = self
            .last_uid
            .and_then(|l| self.by_uid.range(l + 1..).next().map(|(u, _)| *u))
            .or_else(|| self.by_uid.keys().next().copied())?;
        self.last_uid = Some(uid);
        let q = self.by_uid.get_mut(&uid)?;
        let t = q.pop_front();
        if q.is_empty() {
            self.by_uid.remove(&uid);
        }
        self.len -= usize::from(t.is_some());
        t
    }
}

/// The attach thread's inbox.
struct Attaches {
    waiting: Mutex<(Fair<(Knock, u64)>, bool)>,
    wake: std::sync::Condvar,
}

/// Runs the attach thread: takes knocks needing an attach, round-robin
/// between users, until closed. One at a time, as the attacher does:
/// registering uprobes takes the kernel's `dup_mmap_sem`, which every
/// fork on the node needs.
fn start_attaches(
    state: Arc<Mutex<State>>,
    config: Config,
    inbox: Arc<Attaches>,
    counter: prometheus::IntCounterVec,
) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("exit-handover-attach".into())
        .spawn(move || {
            loop {
                let next = {
                    let mut w = inbox.waiting.lock().unwrap_or_else(PoisonError::into_inner);
                    loop {
                        if w.1 {
                            return;
                        }
                        if let Some(n) = w.0.pop() {
                            break n;
                        }
                        w = inbox.wake.wait(w).unwrap_or_else(PoisonError::into_inner);
                    }
                };
                let (k, ticks) = next;
                let o = attach_knocker(&state, &config, &k, ticks);
                answer(&k, o);
                counter.with_label_values(&[o.as_str()]).inc();
            }
        })
        .expect("spawn the exit handover's attach thread")
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
            let inbox = Arc::new(Attaches {
                waiting: Mutex::new((
                    Fair::new(MAX_ATTACH_WAITING, MAX_ATTACH_WAITING_PER_UID),
                    false,
                )),
                wake: std::sync::Condvar::new(),
            });
            let attaches = config.all.then(|| {
                start_attaches(
                    state.clone(),
                    config.clone(),
                    inbox.clone(),
                    counter.clone(),
                )
            });
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
                match judge(&state, &config, &k) {
                    Verdict::Done(o) => {
                        answer(&k, o);
                        count(o);
                    }
                    Verdict::Attach(ticks) => {
                        let uid = k.uid;
                        let pushed = inbox
                            .waiting
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .0
                            .push(uid, (k, ticks));
                        match pushed {
                            Ok(()) => inbox.wake.notify_one(),
                            Err(_) => count(Outcome::QueueFull),
                        }
                    }
                }
            }
            // The attach under way ends; the knocks still waiting are
            // closed unanswered: nothing new is attached from here on.
            inbox
                .waiting
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .1 = true;
            inbox.wake.notify_all();
            if let Some(t) = attaches {
                let _ = t.join();
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

    /// A knock from this process, claiming `uid`, its magic said.
    fn knock_from_me(uid: u32) -> (Knock, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: socketpair into an array of two.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        assert_eq!(rc, 0);
        // SAFETY: two descriptors socketpair just made, each owned once.
        let (ours, theirs) =
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: sends our constant.
        let sent = unsafe { libc::send(theirs.as_raw_fd(), MAGIC.as_ptr().cast(), MAGIC.len(), 0) };
        assert_eq!(sent, MAGIC.len() as isize);
        let k = Knock {
            conn: ours,
            pid: std::process::id(),
            uid,
            at: Instant::now(),
        };
        (k, theirs)
    }

    fn config(all: bool) -> Config {
        Config {
            all,
            netns: None,
            not_mpi: Arc::default(),
        }
    }

    fn state() -> Mutex<State> {
        Mutex::new(State::new(
            None,
            Vec::new(),
            true,
            crate::export::metrics::RenderOptions::default(),
        ))
    }

    #[test]
    fn a_knocker_judged_before_costs_no_look_and_an_unknown_one_goes_to_the_attach_thread() {
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        let pid = std::process::id();
        let ticks = procfs::start_ticks(pid).unwrap();
        let st = state();
        // Unknown, under --all: to be attached (the look at its maps), not
        // on this thread.
        let c = config(true);
        assert_eq!(judge(&st, &c, &knock_from_me(me).0), Verdict::Attach(ticks));
        // Without --all: not observed, no look either.
        assert_eq!(
            judge(&st, &config(false), &knock_from_me(me).0),
            Verdict::Done(Outcome::NotObserved)
        );
        // Judged not MPI (by the scan): answered at once.
        c.not_mpi.insert(pid, ticks, procfs::comm(pid));
        assert_eq!(
            judge(&st, &c, &knock_from_me(me).0),
            Verdict::Done(Outcome::NotMpi)
        );
        // The attach thread's look at a process that is not MPI is
        // remembered, so the next knock costs none.
        let c = config(true);
        let (k, _peer) = knock_from_me(me);
        assert_eq!(attach_knocker(&st, &c, &k, ticks), Outcome::NotObserved);
        assert!(c.not_mpi.settled(pid, ticks, &procfs::comm(pid)));
        // Refused by a budget: answered at once, --all or not.
        st.lock().unwrap().refused.insert((pid, ticks), me);
        for all in [true, false] {
            assert_eq!(
                judge(&st, &config(all), &knock_from_me(me).0),
                Verdict::Done(Outcome::Refused)
            );
        }
        assert_eq!(
            st.lock().unwrap().selfm.attach_failures.get(),
            0,
            "a process that is not MPI is no attach failure"
        );
    }

    #[test]
    fn a_knock_claiming_another_uid_than_all_four_is_refused() {
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        let st = state();
        // The kernel's SO_PEERCRED said another uid than the process's
        // four (a setuid program that knocked as its owner).
        assert_eq!(
            judge(&st, &config(true), &knock_from_me(me.wrapping_add(1)).0),
            Verdict::Done(Outcome::UidMismatch)
        );
        assert!(uids_are([7, 7, 7, 7], 7));
        for mixed in [[8, 7, 7, 7], [7, 8, 7, 7], [7, 7, 8, 7], [7, 7, 7, 8]] {
            assert!(!uids_are(mixed, 7), "{mixed:?}");
        }
    }

    #[test]
    fn knocks_waiting_for_an_attach_are_served_round_robin_and_bounded() {
        let mut f = Fair::new(5, 3);
        for (uid, t) in [(5, 1), (5, 2), (5, 3), (7, 4)] {
            f.push(uid, t).unwrap();
        }
        assert_eq!(f.push(5, 6), Err(6), "uid 5 has its 3");
        f.push(9, 5).unwrap();
        assert_eq!(f.push(11, 7), Err(7), "5 in all");
        let order: Vec<u32> = std::iter::from_fn(|| f.pop()).collect();
        assert_eq!(order, [1, 4, 5, 2, 3]);
        assert_eq!(f.len, 0);
        assert!(f.by_uid.is_empty(), "no empty queue left");
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
