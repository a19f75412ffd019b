//! The exit knock: just before the segment is unlinked, the rank tells the
//! daemon (`attach`, `observer/src/daemon/exit_handover.rs`) to hold it, so a
//! rank that lives 0.2 s keeps its final figures even if no scrape opened
//! the segment meanwhile.
//!
//! Where: the system socket (`/run/mpi-observer/handover.sock`, a root
//! daemon's, every user's) and the rank's user's own
//! (`$XDG_RUNTIME_DIR/mpi-observer/handover.sock`, else under
//! `/run/user/EUID`), where a daemon that user runs without root listens;
//! both at once, so each daemon that observes the rank holds its segment.
//! `MPI_OBSERVER_HANDOVER_SOCKET` names the one socket instead (empty or
//! `none`: no knock).
//!
//! The job is sacred: nonblocking connects and sends, then at most
//! [`WAIT`] in all for the daemons' one-byte answers; no socket, a refused
//! connection or a full backlog cost one failed system call and nothing
//! else. Only the knock crosses: a daemon learns who knocks from the
//! kernel (`SO_PEERCRED`) and opens the segment itself. The user's own
//! socket is knocked at only if it, its directory and the runtime
//! directory are all the rank's user's (`lstat`, links never followed) and
//! the directories writable by nobody else: a listener of another user's
//! would learn of the rank and could hold its exit for the whole wait.

use core::sync::atomic::{AtomicBool, Ordering};
use std::{
    ffi::OsStr,
    os::unix::{ffi::OsStrExt as _, fs::MetadataExt as _},
    path::{Path, PathBuf},
    time::Instant,
};

use observer_common::segment::{
    HANDOVER_MAGIC, HANDOVER_SOCKET, USER_HANDOVER_SOCKET, USER_RUNTIME_ROOT, USER_RUNTIME_VAR,
};

/// How long the rank waits for the daemons' answers at most, all together.
const WAIT: core::time::Duration = core::time::Duration::from_millis(250);
/// The variable naming another socket; empty (or `none`) for no knock.
const SOCKET_VAR: &str = "MPI_OBSERVER_HANDOVER_SOCKET";

/// Knocks once per process (MPI_Finalize, then exit, call it twice).
pub(crate) fn knock() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::Relaxed) {
        return;
    }
    let targets: [Option<PathBuf>; 2] = match std::env::var_os(SOCKET_VAR) {
        Some(p) if p.is_empty() || p == "none" => return,
        Some(p) => [Some(PathBuf::from(p)), None],
        None => {
            let xdg = std::env::var_os(USER_RUNTIME_VAR);
            let own = own_socket(xdg.as_deref()).filter(|p| p != Path::new(HANDOVER_SOCKET));
            [Some(PathBuf::from(HANDOVER_SOCKET)), own]
        }
    };
    let mut fds = [-1; 2];
    for (fd, path) in fds.iter_mut().zip(&targets) {
        if let Some(p) = path {
            *fd = knock_at(p);
        }
    }
    wait(&fds);
    for fd in fds.into_iter().filter(|&fd| fd >= 0) {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(fd) };
    }
}

/// The rank's user's own socket, if there is one of theirs to knock at:
/// in `xdg` (`$XDG_RUNTIME_DIR`) or else `/run/user/EUID`, the first whose
/// runtime directory and `mpi-observer` directory are real directories of
/// this user's, writable by nobody else, holding a socket of this user's.
fn own_socket(xdg: Option<&OsStr>) -> Option<PathBuf> {
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    let xdg = xdg.map(PathBuf::from).filter(|p| p.is_absolute());
    let run_user = Path::new(USER_RUNTIME_ROOT).join(me.to_string());
    [xdg, Some(run_user)].into_iter().flatten().find_map(|dir| {
        let sock = dir.join(USER_HANDOVER_SOCKET);
        let ours = |p: &Path, dir: bool| {
            std::fs::symlink_metadata(p).is_ok_and(|m| {
                use std::os::unix::fs::FileTypeExt as _;
                m.uid() == me
                    && if dir {
                        m.file_type().is_dir() && m.mode() & 0o022 == 0
                    } else {
                        m.file_type().is_socket()
                    }
            })
        };
        let sock_dir = sock.parent()?;
        (ours(&dir, true) && ours(sock_dir, true) && ours(&sock, false)).then_some(sock)
    })
}

/// Connects to `path` and says the magic, without blocking: the connected
/// descriptor, or -1 (nobody listens, a full backlog, a bad path).
fn knock_at(path: &Path) -> libc::c_int {
    // SAFETY: an all-zero sockaddr_un is valid; the path is set below.
    let mut sa: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = OsStr::as_bytes(path.as_os_str());
    if bytes.len() >= sa.sun_path.len() || bytes.contains(&0) {
        return -1;
    }
    for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    // SAFETY: plain socket(2); the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return -1;
    }
    // A Unix socket's connect never blocks with O_NONBLOCK: it succeeds, or
    // fails at once (no daemon, a full backlog: EAGAIN).
    // SAFETY: `sa` is a valid sockaddr_un of length `len`.
    let connected = unsafe { libc::connect(fd, (&raw const sa).cast(), len) } == 0;
    // SAFETY: sends our constant, without blocking or SIGPIPE.
    let said = connected
        && unsafe {
            libc::send(
                fd,
                HANDOVER_MAGIC.as_ptr().cast(),
                HANDOVER_MAGIC.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        } == HANDOVER_MAGIC.len() as isize;
    if !said {
        // SAFETY: our own descriptor, closed once.
        unsafe { libc::close(fd) };
        return -1;
    }
    fd
}

/// Waits until every knock in `fds` (-1: none) has its answer or its
/// hang-up, [`WAIT`] at most in all.
fn wait(fds: &[libc::c_int; 2]) {
    let mut pfds = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let start = Instant::now();
    // poll ignores a negative descriptor: one done is set to -1.
    while pfds.iter().any(|p| p.fd >= 0) {
        let left = WAIT.saturating_sub(start.elapsed());
        if left.is_zero() {
            return;
        }
        // SAFETY: an array of two valid pollfds.
        let n = unsafe {
            libc::poll(
                pfds.as_mut_ptr(),
                pfds.len() as libc::nfds_t,
                left.as_millis().max(1) as libc::c_int,
            )
        };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        // The answer, a hang-up or an error: that one is done.
        for p in &mut pfds {
            if p.revents != 0 {
                p.fd = -1;
                p.revents = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::{fs::PermissionsExt as _, net::UnixListener};

    use super::*;

    #[test]
    fn a_socket_of_another_user_or_in_a_directory_others_write_is_not_knocked_at() {
        let base = std::env::temp_dir().join(format!("shim-knock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("mpi-observer");
        std::fs::create_dir_all(&dir).unwrap();
        for d in [&base, &dir] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let sock = base.join(USER_HANDOVER_SOCKET);
        // A stream socket stands in: only the checks are tested here.
        let _l = UnixListener::bind(&sock).unwrap();
        let found = |xdg: &Path| own_socket(Some(xdg.as_os_str()));
        assert_eq!(found(&base), Some(sock.clone()));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_ne!(found(&base), Some(sock.clone()), "others could swap it");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Through a link: never followed.
        let link = base.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&base, &link).unwrap();
        assert_ne!(found(&link), Some(link.join(USER_HANDOVER_SOCKET)));
        // Another user's (root's /proc for a user; a user's for root is
        // the same check the other way round).
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            assert_ne!(
                found(Path::new("/proc")),
                Some(PathBuf::from("/proc").join(USER_HANDOVER_SOCKET))
            );
        }
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_dir_all(&base);
    }

    #[test]
    fn knocks_wait_for_every_answer_and_no_longer_than_the_bound() {
        let mut pairs = [[0; 2]; 2];
        for p in &mut pairs {
            // SAFETY: socketpair into an array of two.
            let rc = unsafe {
                libc::socketpair(
                    libc::AF_UNIX,
                    libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                    0,
                    p.as_mut_ptr(),
                )
            };
            assert_eq!(rc, 0);
        }
        // Nobody answers: the whole bound, once for both.
        let t = Instant::now();
        wait(&[pairs[0][0], pairs[1][0]]);
        let took = t.elapsed();
        assert!(took >= WAIT && took < WAIT * 2, "{took:?}");
        // One answers, the other hangs up: no wait.
        // SAFETY: sends a byte on our descriptor, closes one once.
        unsafe {
            libc::send(pairs[0][1], b"k".as_ptr().cast(), 1, 0);
            libc::close(pairs[1][1]);
        }
        let t = Instant::now();
        wait(&[pairs[0][0], pairs[1][0]]);
        assert!(t.elapsed() < WAIT / 5, "{:?}", t.elapsed());
        // None at all: no wait either.
        let t = Instant::now();
        wait(&[-1, -1]);
        assert!(t.elapsed() < WAIT / 5);
        for fd in [pairs[0][0], pairs[0][1], pairs[1][0]] {
            // SAFETY: our own descriptors, each closed once.
            unsafe { libc::close(fd) };
        }
    }
}
