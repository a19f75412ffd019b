//! The exit knock: just before the segment is unlinked, the rank tells the
//! daemon (`attach`, `observer/src/daemon/exit_handover.rs`) to hold it, so a
//! rank that lives 0.2 s keeps its final figures even if no scrape opened
//! the segment meanwhile.
//!
//! The job is sacred: a nonblocking connect and send, then at most
//! [`WAIT`] for the daemon's one-byte answer; no socket, a refused
//! connection or a full backlog cost one failed system call and nothing
//! else. Only the knock crosses: the daemon learns who knocks from the
//! kernel (`SO_PEERCRED`) and opens the segment itself.

use core::sync::atomic::{AtomicBool, Ordering};
use std::{ffi::OsStr, os::unix::ffi::OsStrExt as _, time::Instant};

use observer_common::segment::{HANDOVER_MAGIC, HANDOVER_SOCKET};

/// How long the rank waits for the daemon's answer at most.
const WAIT: core::time::Duration = core::time::Duration::from_millis(250);
/// The variable naming another socket; empty (or `none`) for no knock.
const SOCKET_VAR: &str = "MPI_OBSERVER_HANDOVER_SOCKET";

/// Knocks once per process (MPI_Finalize, then exit, call it twice).
pub(crate) fn knock() {
    static DONE: AtomicBool = AtomicBool::new(false);
    if DONE.swap(true, Ordering::Relaxed) {
        return;
    }
    let path = std::env::var_os(SOCKET_VAR);
    let path = path.as_deref().unwrap_or(OsStr::new(HANDOVER_SOCKET));
    if path.is_empty() || path == "none" {
        return;
    }
    // SAFETY: an all-zero sockaddr_un is valid; the path is set below.
    let mut sa: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_bytes();
    if bytes.len() >= sa.sun_path.len() || bytes.contains(&0) {
        return;
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
        return;
    }
    talk(fd, &sa, len);
    // SAFETY: our own descriptor, closed once.
    unsafe { libc::close(fd) };
}

fn talk(fd: libc::c_int, sa: &libc::sockaddr_un, len: libc::socklen_t) {
    // A Unix socket's connect never blocks with O_NONBLOCK: it succeeds, or
    // fails at once (no daemon, a full backlog: EAGAIN).
    // SAFETY: `sa` is a valid sockaddr_un of length `len`.
    if unsafe { libc::connect(fd, (sa as *const libc::sockaddr_un).cast(), len) } != 0 {
        return;
    }
    // SAFETY: sends our constant, without blocking or SIGPIPE.
    let sent = unsafe {
        libc::send(
            fd,
            HANDOVER_MAGIC.as_ptr().cast(),
            HANDOVER_MAGIC.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if sent != HANDOVER_MAGIC.len() as isize {
        return;
    }
    let start = Instant::now();
    loop {
        let left = WAIT.saturating_sub(start.elapsed());
        if left.is_zero() {
            return;
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, left.as_millis().max(1) as libc::c_int) };
        if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        // The answer, a hang-up or the time out: either way, done.
        return;
    }
}
