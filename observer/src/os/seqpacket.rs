//! Unix seqpacket sockets as a root daemon must use them: a listening
//! socket in a directory checked to be no other user's, connections taken
//! without blocking, with the kernel's word on who connected
//! (`SO_PEERCRED`), and messages read without waiting. The exit handover
//! (crate::daemon::exit_handover) listens on one.
//!
//! A seqpacket socket keeps message boundaries, so a message is read whole
//! or not at all, and a peer cannot dribble bytes to keep a read open.

use std::{
    ffi::OsStr,
    io,
    os::{
        fd::{AsFd, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::{
            ffi::OsStrExt as _,
            fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _},
        },
    },
    path::{Path, PathBuf},
};

use thiserror::Error;

/// Why a directory may not hold a socket.
#[derive(Debug, Error)]
pub enum DirError {
    /// It is missing and could not be made (or given its mode).
    #[error("cannot make {}: {source}", path.display())]
    Make {
        /// The directory.
        path: PathBuf,
        /// The OS error of mkdir or chmod.
        #[source]
        source: io::Error,
    },
    /// Its metadata could not be read (it does not exist, or is out of
    /// reach).
    #[error("cannot read {}: {source}", path.display())]
    Stat {
        /// The directory.
        path: PathBuf,
        /// The OS error of lstat.
        #[source]
        source: io::Error,
    },
    /// A file, or a symbolic link (never followed).
    #[error("{} is not a directory (or is a symbolic link)", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// Another user's.
    #[error("{} is owned by uid {owner}, not by {}", path.display(), allowed.as_str())]
    Owner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// Who may own it.
        allowed: Owners,
    },
    /// Others could replace what is in it.
    #[error("{} is writable by group or others (mode {mode:o})", path.display())]
    Writable {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

/// Who may own a directory that holds a socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owners {
    /// Root, or this process's effective uid (a daemon run by a service
    /// user in the directory systemd made for it).
    RootOrMe,
    /// This process's effective uid only.
    Me,
}

impl Owners {
    fn as_str(self) -> &'static str {
        match self {
            Owners::RootOrMe => "root or this process's user",
            Owners::Me => "this process's user",
        }
    }

    fn allow(self, owner: u32) -> bool {
        owner == euid() || (self == Owners::RootOrMe && owner == 0)
    }
}

/// This process's effective uid.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// Checks `dir` may hold a socket: a real directory (`lstat`: a symbolic
/// link is refused, never followed) of `owners`, writable by nobody else.
/// A missing one is made with `make`'s mode when it is given.
pub fn check_dir(dir: &Path, owners: Owners, make: Option<u32>) -> Result<(), DirError> {
    let stat = |source| DirError::Stat {
        path: dir.to_path_buf(),
        source,
    };
    let made = |source| DirError::Make {
        path: dir.to_path_buf(),
        source,
    };
    match (std::fs::symlink_metadata(dir), make) {
        (Err(e), Some(mode)) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir(dir).map_err(made)?;
            // The umask may have taken bits the mode wants (0755: ranks
            // of every user must reach the socket inside).
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(made)?;
        }
        (Err(e), _) => return Err(stat(e)),
        (Ok(_), _) => {}
    }
    let m = std::fs::symlink_metadata(dir).map_err(stat)?;
    if !m.file_type().is_dir() {
        return Err(DirError::NotADirectory {
            path: dir.to_path_buf(),
        });
    }
    if !owners.allow(m.uid()) {
        return Err(DirError::Owner {
            path: dir.to_path_buf(),
            owner: m.uid(),
            allowed: owners,
        });
    }
    if m.mode() & 0o022 != 0 {
        return Err(DirError::Writable {
            path: dir.to_path_buf(),
            mode: m.mode() & 0o7777,
        });
    }
    Ok(())
}

/// Why a user has no runtime directory for a socket of theirs.
#[derive(Debug, Error)]
#[error(
    "uid {uid} has no runtime directory (XDG_RUNTIME_DIR unset or not a directory of its own, and {source})"
)]
pub struct RuntimeDirError {
    /// The user.
    pub uid: u32,
    /// What was wrong with `/run/user/UID`, the last one tried.
    #[source]
    pub source: DirError,
}

/// This process's user's runtime directory: `xdg` (`$XDG_RUNTIME_DIR`) if
/// it is an absolute path to a real directory of this user's, writable by
/// nobody else, else `/run/user/UID` under the same checks (what
/// `pam_systemd` makes, mode 0700). Never made here: it is the login
/// manager's.
pub fn user_runtime_dir(xdg: Option<&OsStr>) -> Result<PathBuf, RuntimeDirError> {
    if let Some(dir) = xdg.map(Path::new).filter(|p| p.is_absolute())
        && check_dir(dir, Owners::Me, None).is_ok()
    {
        return Ok(dir.to_path_buf());
    }
    let uid = euid();
    let dir = Path::new(observer_common::segment::USER_RUNTIME_ROOT).join(uid.to_string());
    match check_dir(&dir, Owners::Me, None) {
        Ok(()) => Ok(dir),
        Err(source) => Err(RuntimeDirError { uid, source }),
    }
}

/// Why a socket could not be listened on.
#[derive(Debug, Error)]
pub enum SocketError {
    /// The path does not fit a socket address (108 bytes), is empty or
    /// holds a NUL.
    #[error("{} does not fit a Unix socket address", path.display())]
    Path {
        /// The path.
        path: PathBuf,
    },
    /// Something else than a socket is at the path: never removed.
    #[error("{} exists and is not a socket", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Another process answers on it.
    #[error("{} is in use: another process listens on it", path.display())]
    InUse {
        /// The path.
        path: PathBuf,
    },
    /// A system call failed.
    #[error("cannot listen on {}: {call}: {source}", path.display())]
    Call {
        /// The path.
        path: PathBuf,
        /// The failing call.
        call: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// `path` as a socket address, with its length.
fn sockaddr(path: &Path) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: an all-zero sockaddr_un is valid; the path is set below.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= sa.sun_path.len() || bytes.contains(&0) {
        return None;
    }
    for (d, s) in sa.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = (size_of::<libc::sa_family_t>() + bytes.len() + 1) as libc::socklen_t;
    Some((sa, len))
}

/// A new nonblocking, close-on-exec seqpacket socket.
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

/// Who is at the other end of a connection, as the kernel recorded it when
/// it connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its pid, in this process's pid namespace.
    pub pid: u32,
    /// Its effective uid at connect.
    pub uid: u32,
}

/// One connection, nonblocking.
#[derive(Debug)]
pub struct Conn {
    fd: OwnedFd,
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Conn {
    /// Connects to `path` without blocking: a Unix socket's connect
    /// succeeds or fails at once (nobody listens: `ECONNREFUSED`; a full
    /// backlog: `EAGAIN`).
    pub fn connect(path: &Path) -> io::Result<Conn> {
        let (sa, len) = sockaddr(path).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
        let fd = seqpacket()?;
        // SAFETY: `sa` is a valid sockaddr_un of length `len`.
        if unsafe { libc::connect(fd.as_raw_fd(), (&raw const sa).cast(), len) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Conn { fd })
    }

    /// Two connected ends (tests and the like).
    pub fn pair() -> io::Result<(Conn, Conn)> {
        let mut fds = [0; 2];
        // SAFETY: socketpair into an array of two; the result is checked.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: two descriptors socketpair just made, each owned once.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok((Conn { fd: a }, Conn { fd: b }))
    }

    /// Who connected (`SO_PEERCRED`). A pid of 0 (a peer in a pid
    /// namespace this process cannot see) is `None`.
    pub fn peer(&self) -> io::Result<Option<Peer>> {
        // SAFETY: an all-zero ucred is valid; getsockopt fills it.
        let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::ucred>() as libc::socklen_t;
        // SAFETY: SO_PEERCRED into a ucred of its size.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&raw mut cred).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok((cred.pid > 0).then_some(Peer {
            pid: cred.pid as u32,
            uid: cred.uid,
        }))
    }

    /// Reads the next message into `buf` without waiting: its length
    /// (cut to `buf`'s), `Ok(0)` once the peer has closed, `WouldBlock`
    /// if nothing has come.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: receives into our buffer, without blocking.
        let got = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        usize::try_from(got).map_err(|_| io::Error::last_os_error())
    }

    /// Sends `msg` without waiting and without `SIGPIPE`.
    pub fn send(&self, msg: &[u8]) -> io::Result<usize> {
        // SAFETY: sends our buffer, without blocking or SIGPIPE.
        let sent = unsafe {
            libc::send(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        usize::try_from(sent).map_err(|_| io::Error::last_os_error())
    }
}

/// A listening socket; its file is removed when it drops.
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

impl AsFd for Listener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Listener {
    /// Listens on `path` with permission bits `mode`, replacing a stale
    /// socket (its daemon killed with -9), never one a process answers on
    /// nor anything that is not a socket. The caller has checked the
    /// directory ([`check_dir`]): nobody else can put a file there.
    pub fn bind(path: &Path, mode: u32, backlog: i32) -> Result<Listener, SocketError> {
        let call = |call, source| SocketError::Call {
            path: path.to_path_buf(),
            call,
            source,
        };
        let (sa, len) = sockaddr(path).ok_or_else(|| SocketError::Path {
            path: path.to_path_buf(),
        })?;
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => match Conn::connect(path) {
                // Accepted, or a backlog full of others' connections:
                // someone listens.
                Ok(_) => {
                    return Err(SocketError::InUse {
                        path: path.to_path_buf(),
                    });
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
                    return Err(SocketError::InUse {
                        path: path.to_path_buf(),
                    });
                }
                Err(_) => {
                    let _ = std::fs::remove_file(path);
                }
            },
            Ok(_) => {
                return Err(SocketError::NotASocket {
                    path: path.to_path_buf(),
                });
            }
            Err(_) => {}
        }
        let fd = seqpacket().map_err(|e| call("socket", e))?;
        // SAFETY: `sa` is a valid sockaddr_un of length `len`.
        if unsafe { libc::bind(fd.as_raw_fd(), (&raw const sa).cast(), len) } != 0 {
            return Err(call("bind", io::Error::last_os_error()));
        }
        let listener = Listener {
            fd,
            path: path.to_path_buf(),
        };
        // bind made it with the umask's bits; who may connect is `mode`'s.
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| call("chmod", e))?;
        // SAFETY: listen(2) on our socket.
        if unsafe { libc::listen(listener.fd.as_raw_fd(), backlog) } != 0 {
            return Err(call("listen", io::Error::last_os_error()));
        }
        Ok(listener)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the next waiting connection without blocking: `Ok(None)` if
    /// there is none. Out of descriptors is `EMFILE` or `ENFILE` (the
    /// connection stays waiting).
    pub fn accept(&self) -> io::Result<Option<Conn>> {
        // SAFETY: accept4 on our listening socket, no address wanted.
        let raw = unsafe {
            libc::accept4(
                self.fd.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            )
        };
        if raw < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock => Ok(None),
                _ => Err(e),
            };
        }
        Ok(Some(Conn {
            // SAFETY: a descriptor accept4 just gave us.
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        }))
    }
}

/// Whether `e` says the process (or the system) is out of descriptors.
pub fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("seqpacket-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        d
    }

    #[test]
    fn a_directory_others_can_write_or_a_link_is_refused() {
        let d = dir("unsafe");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(
            check_dir(&d, Owners::RootOrMe, None),
            Err(DirError::Writable { mode: 0o777, .. })
        ));
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let link = d.with_extension("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(matches!(
            check_dir(&link, Owners::RootOrMe, Some(0o755)),
            Err(DirError::NotADirectory { .. })
        ));
        let _ = std::fs::remove_file(&link);
        // Missing: made with the mode asked, whatever the umask; not made
        // when no mode is given.
        let sub = d.join("sub");
        assert!(matches!(
            check_dir(&sub, Owners::Me, None),
            Err(DirError::Stat { ref source, .. }) if source.kind() == io::ErrorKind::NotFound
        ));
        check_dir(&sub, Owners::Me, Some(0o700)).unwrap();
        let m = std::fs::symlink_metadata(&sub).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o700);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        // /proc is root's: refused to a user, not to root asking root's.
        let r = check_dir(Path::new("/proc"), Owners::Me, None);
        if euid() == 0 {
            r.unwrap();
        } else {
            assert!(matches!(r, Err(DirError::Owner { owner: 0, .. })), "{r:?}");
            check_dir(Path::new("/proc"), Owners::RootOrMe, None).unwrap();
        }
    }

    #[test]
    fn a_runtime_directory_is_taken_only_if_it_is_the_users() {
        let d = dir("runtime");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(user_runtime_dir(Some(d.as_os_str())).unwrap(), d);
        // Writable by others: not ours to trust; /run/user/UID then.
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
        let fallback = Path::new("/run/user").join(euid().to_string());
        match user_runtime_dir(Some(d.as_os_str())) {
            Ok(p) => assert_eq!(p, fallback),
            Err(RuntimeDirError { uid, .. }) => assert_eq!(uid, euid()),
        }
        // A relative path is never taken.
        assert_ne!(
            user_runtime_dir(Some(OsStr::new("relative"))).ok(),
            Some(PathBuf::from("relative"))
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_live_socket_is_not_taken_over_a_stale_one_is_and_a_file_never() {
        let d = dir("live");
        let p = d.join("s");
        let first = Listener::bind(&p, 0o600, 8).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(m.mode() & 0o7777, 0o600);
        assert!(matches!(
            Listener::bind(&p, 0o600, 8),
            Err(SocketError::InUse { .. })
        ));
        // A daemon killed with -9 leaves its socket file behind, with
        // nobody listening.
        let Listener { fd, path } = &first;
        let (raw, path) = (fd.as_raw_fd(), path.clone());
        std::mem::forget(first);
        // SAFETY: the descriptor `first` owned, closed once, never used again.
        unsafe { libc::close(raw) };
        assert!(path.exists());
        let again = Listener::bind(&p, 0o666, 8).expect("a stale socket is replaced");
        drop(again);
        assert!(!p.exists(), "the socket file goes with the listener");
        std::fs::write(&p, b"x").unwrap();
        assert!(matches!(
            Listener::bind(&p, 0o666, 8),
            Err(SocketError::NotASocket { .. })
        ));
        assert!(p.exists(), "a file that is not a socket is never removed");
        let long = d.join("x".repeat(120));
        assert!(matches!(
            Listener::bind(&long, 0o666, 8),
            Err(SocketError::Path { .. })
        ));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_connection_says_who_it_is_and_its_message_is_read_whole() {
        let d = dir("conn");
        let p = d.join("s");
        let l = Listener::bind(&p, 0o600, 8).unwrap();
        assert!(l.accept().unwrap().is_none(), "nobody waits");
        let c = Conn::connect(&p).unwrap();
        let a = l.accept().unwrap().expect("the connection");
        assert_eq!(
            a.peer().unwrap(),
            Some(Peer {
                pid: std::process::id(),
                uid: euid()
            })
        );
        let mut buf = [0u8; 4];
        assert_eq!(
            a.recv(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        c.send(b"abcdef").unwrap();
        // One message, cut to the buffer; the rest is not the next read.
        assert_eq!(a.recv(&mut buf).unwrap(), 4);
        assert_eq!(&buf, b"abcd");
        drop(c);
        assert_eq!(a.recv(&mut buf).unwrap(), 0, "the peer closed");
        drop(l);
        assert!(
            Conn::connect(&p).is_err(),
            "nobody listens once the listener is gone"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
