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
//! Where it listens ([`place`]): the system path
//! ([`DEFAULT_SOCKET`], mode 0666 in a directory of root's) for a daemon
//! run by root or by the user that owns that directory (the package's
//! unit); for a daemon of a user without root, that user's own socket
//! under their runtime directory (`$XDG_RUNTIME_DIR/mpi-observer/`, mode
//! 0700, the socket 0600), which only their ranks reach. The shim knocks
//! at both (shim/src/stats/exit_handover.rs).
//!
//! Only a knock crosses the socket, no data and no descriptor: who knocks
//! is the kernel's word (`SO_PEERCRED`), and the daemon only ever looks at
//! that process, whose real, effective, saved and filesystem uids must all
//! still be that uid (a setuid program hands over nobody's figures). A
//! knock is therefore worth no more than the once-a-second scan's look at
//! the same process, only sooner. Hostile input (docs/security.md, "The
//! handover socket"):
//! - a directory of root's (or the daemon's user's), not writable by
//!   others, holds the socket;
//! - the door ([`super::knocks`]) waits for no connection: one that has
//!   not said the magic when accepted is watched by readiness and closed
//!   at its deadline, so a mute connection costs the others nothing;
//!   connections are bounded per uid and in all, and knocks served
//!   round-robin between uids; past the bounds, and for a process gone,
//!   not observed, of mixed uids, or of another namespace, the connection
//!   is closed unanswered and counted in
//!   `mpi_observer_exit_handovers_total{result}`;
//! - a process the scan (or an earlier knock) judged not MPI, or that a
//!   budget refused, is answered at once, without a look at its maps
//!   ([`super::not_mpi`], `State::refused`);
//! - attaching an unknown knocker (`--all`) is done by a thread of its own,
//!   one at a time, users round-robin ([`MAX_ATTACH_WAITING`]), so a slow
//!   attach never holds up the knocks of ranks already observed.

use std::{
    io,
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::Duration,
};

use thiserror::Error;

use super::{
    fair::Fair,
    knocks::{BOUNDS, Door, Knock, Outcome},
    not_mpi::NotMpi,
};
use crate::{
    collect::segment::Segment,
    export::registry::{self, AttachError, State},
    os::{
        procfs,
        seqpacket::{self, DirError, Listener, Owners, RuntimeDirError, SocketError},
    },
};

/// The system socket's path, every user's ranks knock at it; the shim's
/// default too (`MPI_OBSERVER_HANDOVER_SOCKET`).
pub const DEFAULT_SOCKET: &str = observer_common::segment::HANDOVER_SOCKET;
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
/// The kernel's queue of connections not yet accepted.
const BACKLOG: i32 = 512;
/// How long the knock thread waits at most when nothing happens: how soon
/// it sees the daemon's stop.
const IDLE: Duration = Duration::from_millis(200);

/// Why the handover socket could not be set up.
#[derive(Debug, Error)]
pub enum HandoverError {
    /// The socket's directory is missing and could not be made, or is not
    /// safe.
    #[error("cannot use {} for the handover socket: {source}; {}", path.display(), fix(*own))]
    Directory {
        /// The directory.
        path: PathBuf,
        /// Whether it is the daemon's user's own place (else every user's).
        own: bool,
        /// What is wrong with it.
        #[source]
        source: DirError,
    },
    /// A user without root has no runtime directory to put their socket
    /// in.
    #[error(
        "no place for this daemon's own handover socket: {source}; {}",
        fix(true)
    )]
    RuntimeDir {
        /// Why.
        #[source]
        source: RuntimeDirError,
    },
    /// The socket could not be listened on.
    #[error("{source}; {}", match source {
        SocketError::InUse { .. } => "give this daemon its own --handover-socket, or `none`",
        _ => "give --handover-socket another path, or `none`",
    })]
    Listen {
        /// What failed.
        #[source]
        source: SocketError,
    },
    /// The knock thread's epoll set could not be made.
    #[error("cannot watch the handover socket {}: {source}", path.display())]
    Watch {
        /// The socket.
        path: PathBuf,
        /// The OS error of epoll_create1 or epoll_ctl.
        #[source]
        source: io::Error,
    },
}

/// What to do about a place that cannot be had.
fn fix(own: bool) -> &'static str {
    if own {
        "give --handover-socket a path in a directory of yours and your jobs MPI_OBSERVER_HANDOVER_SOCKET=that path, or `none`"
    } else {
        "give --handover-socket a path in a directory of root's (or of this daemon's user), or `none`"
    }
}

/// Where the daemon listens for knocks, and so who can knock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// A socket every user's ranks reach (mode 0666), in a directory of
    /// root's or of the daemon's user, writable by nobody else (made 0755
    /// if missing): the system path, or one given.
    Shared(PathBuf),
    /// The daemon's user's own socket (mode 0600) under their runtime
    /// directory, in a directory of theirs made 0700: the default of a
    /// daemon without root, which observes only that user's ranks.
    Own(PathBuf),
}

impl Place {
    /// The socket's path.
    pub fn path(&self) -> &Path {
        match self {
            Place::Shared(p) | Place::Own(p) => p,
        }
    }
}

/// Where `--handover-socket` (`given`; `none` is the caller's) puts the
/// socket: the path given, else the system path for a daemon run by root
/// or by the owner of the system path's directory (the package's unit,
/// whose `RuntimeDirectory=` is its user's), else this user's own under
/// their runtime directory (`xdg`: `$XDG_RUNTIME_DIR`, else
/// `/run/user/UID`).
pub fn place(given: Option<&Path>, xdg: Option<&std::ffi::OsStr>) -> Result<Place, HandoverError> {
    if let Some(p) = given {
        return Ok(Place::Shared(p.to_path_buf()));
    }
    let system = Path::new(DEFAULT_SOCKET);
    let system_dir = system.parent().unwrap_or(Path::new("/"));
    if seqpacket::euid() == 0 || seqpacket::check_dir(system_dir, Owners::Me, None).is_ok() {
        return Ok(Place::Shared(system.to_path_buf()));
    }
    let dir =
        seqpacket::user_runtime_dir(xdg).map_err(|source| HandoverError::RuntimeDir { source })?;
    Ok(Place::Own(
        dir.join(observer_common::segment::USER_HANDOVER_SOCKET),
    ))
}

/// Listens at `place`, its directory checked (and made if missing).
pub fn bind(place: &Place) -> Result<Listener, HandoverError> {
    let path = place.path();
    let dir = path.parent().unwrap_or(Path::new("/"));
    let (owners, dir_mode, mode, own) = match place {
        Place::Shared(_) => (Owners::RootOrMe, 0o755, 0o666, false),
        Place::Own(_) => (Owners::Me, 0o700, 0o600, true),
    };
    seqpacket::check_dir(dir, owners, Some(dir_mode)).map_err(|source| {
        HandoverError::Directory {
            path: dir.to_path_buf(),
            own,
            source,
        }
    })?;
    Listener::bind(path, mode, BACKLOG).map_err(|source| HandoverError::Listen { source })
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

/// Judges one knock (its magic said) on the knock thread, reading no more than the
/// process's stat and status (and, for a rank observed, its segment): the
/// process must run with the uid that knocked, all four of its uids; an
/// observed rank has its segment opened now if it was not; one judged not
/// MPI or refused before is closed at once; an unknown one under `--all`
/// goes to the attach thread.
fn judge(state: &Mutex<State>, config: &Config, k: &Knock) -> Verdict {
    if k.at.elapsed() > STALE {
        return Verdict::Done(Outcome::Stale);
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
            log::info!(
                "attached to pid {} ({}, uid {}) at its exit handover",
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
            log::info!("{e}");
            Outcome::NotObserved
        }
        Err(e) => {
            // As the attacher does: not tried again (one line, one count)
            // until one of its user's ranks exits and frees room.
            st.refused.insert((k.pid, ticks), k.uid);
            drop(st);
            log::warn!("pid {}: {}", k.pid, crate::one_line(&e));
            Outcome::NotObserved
        }
    }
}

/// Sends the answer byte once the segment is held (or found missing);
/// any other outcome closes the connection unanswered (when `k` drops),
/// which ends the shim's wait as surely.
fn answer(k: &Knock, outcome: Outcome) {
    if outcome == Outcome::Held || outcome == Outcome::NoSegment {
        k.answer();
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
                        if let Some((_, n)) = w.0.pop() {
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

/// Runs the handover on a thread of its own until `stop` is set: takes
/// knocks at the door and serves them round-robin between users.
pub fn start(
    listener: Listener,
    state: Arc<Mutex<State>>,
    config: Config,
    stop: Arc<AtomicBool>,
) -> Result<JoinHandle<()>, HandoverError> {
    let path = listener.path().to_path_buf();
    let mut door = Door::new(listener, BOUNDS).map_err(|source| HandoverError::Watch {
        path: path.clone(),
        source,
    })?;
    let thread = std::thread::Builder::new()
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
            while !stop.load(Ordering::Relaxed) {
                let Some(k) = door.next(IDLE, &count) else {
                    continue;
                };
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
            drop(door);
        })
        .expect("spawn the exit handover thread");
    Ok(thread)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::{
        os::unix::fs::{MetadataExt as _, PermissionsExt as _},
        time::Instant,
    };

    use crate::os::seqpacket::Conn;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("handover-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn an_unsafe_directory_is_refused_in_one_line_that_says_what_to_do() {
        let d = dir("unsafe");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = bind(&Place::Shared(d.join("s"))).unwrap_err();
        assert!(
            matches!(
                e,
                HandoverError::Directory {
                    own: false,
                    source: DirError::Writable { mode: 0o777, .. },
                    ..
                }
            ),
            "{e:?}"
        );
        // The cause once, then what to do.
        let line = crate::one_line(&e);
        assert_eq!(
            line.matches("writable by group or others").count(),
            1,
            "{line}"
        );
        assert!(line.ends_with("or `none`"), "{line}");
        let link = d.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(matches!(
            bind(&Place::Own(link.join("s"))),
            Err(HandoverError::Directory {
                own: true,
                source: DirError::NotADirectory { .. },
                ..
            })
        ));
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_users_own_socket_is_theirs_alone_and_a_live_one_is_not_taken_over() {
        let d = dir("own");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let p = d.join(observer_common::segment::USER_HANDOVER_SOCKET);
        let l = bind(&Place::Own(p.clone())).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(p.parent().unwrap()), 0o700, "its directory, made");
        assert_eq!(mode(&p), 0o600, "the socket");
        assert!(matches!(
            bind(&Place::Own(p.clone())),
            Err(HandoverError::Listen {
                source: SocketError::InUse { .. }
            })
        ));
        drop(l);
        // A shared one is every user's to knock at.
        let shared = d.join("shared.sock");
        let l = bind(&Place::Shared(shared.clone())).unwrap();
        assert_eq!(mode(&shared), 0o666);
        drop(l);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_default_place_is_the_systems_for_root_and_the_users_own_otherwise() {
        let given = Path::new("/somewhere/h.sock");
        assert_eq!(
            place(Some(given), None).unwrap(),
            Place::Shared(given.to_path_buf())
        );
        let d = dir("xdg");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let p = place(None, Some(d.as_os_str())).unwrap();
        let system_dir = Path::new(DEFAULT_SOCKET).parent().unwrap();
        if seqpacket::euid() == 0 || seqpacket::check_dir(system_dir, Owners::Me, None).is_ok() {
            assert_eq!(p, Place::Shared(DEFAULT_SOCKET.into()));
        } else {
            assert_eq!(
                p,
                Place::Own(d.join(observer_common::segment::USER_HANDOVER_SOCKET))
            );
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A knock from this process, claiming `uid`, its magic said.
    fn knock_from_me(uid: u32) -> (Knock, Conn) {
        let (ours, theirs) = Conn::pair().unwrap();
        assert_eq!(
            theirs.send(crate::daemon::knocks::MAGIC).unwrap(),
            crate::daemon::knocks::MAGIC.len()
        );
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
}
