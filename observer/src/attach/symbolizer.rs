//! The call-site symbolizer, in a process of its own with hard memory and
//! time bounds.
//!
//! Naming a return address means parsing the user's ELF file and its DWARF
//! (blazesym), and a user's file can be made to ask for anything: a
//! compressed section whose header claims 2^40 bytes aborts any process
//! that trusts it. So blazesym never runs in the daemon. It runs in
//! `mpi-observer __symbolizer`, started from `/proc/self/exe` with
//! `RLIMIT_AS` (a memory cap: an allocation past it fails, and the child
//! aborts), `RLIMIT_CPU`, no new privileges, and death with its parent. The
//! daemon talks to it over a `SOCK_SEQPACKET` socket pair (its fd 3):
//!
//! - request: `[magic u32][count u32][count x u64 file offsets]`, with the
//!   file to read attached as an open descriptor (`SCM_RIGHTS`), one the
//!   daemon opened and verified itself ([`crate::os::userfile`]); the child
//!   reads it through `/proc/self/fd/N` and never resolves a path of the
//!   user's. Looking for separate debug files in system directories is
//!   off. The child reads the file with the file owner's file-system
//!   identity (`setfsuid`), so that a debug link inside the file can only
//!   lead to files its owner could read anyway.
//! - answer: `[count u32][count x (u16 length, name bytes)]`, length 0 for
//!   an offset with no symbol.
//!
//! Each request has a deadline ([`Limits::deadline`]). Past it, or when the
//! child dies, the child is killed and started again at the next request,
//! and the caller is told why ([`SymbolizerError::reason`]), so it can mark
//! the file as not to be symbolized again: a poisoned file costs one
//! deadline and one restart, once.

use std::{
    io,
    os::{
        fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd},
        unix::{fs::MetadataExt as _, process::CommandExt as _, process::ExitStatusExt as _},
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use thiserror::Error;

/// The hidden subcommand that runs the child.
pub const SUBCOMMAND: &str = "__symbolizer";
/// The child's end of the socket pair.
pub const CHILD_FD: RawFd = 3;
/// Offsets per request: the answer stays one small message.
pub const MAX_OFFSETS: usize = 64;
/// A name is cut to this many bytes (at a character boundary).
pub const MAX_NAME: usize = 512;
const MAGIC: u32 = 0x5359_4d42;
const ANSWER_BYTES: usize = 4 + MAX_OFFSETS * (2 + MAX_NAME);

/// The child's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Address space (`RLIMIT_AS`), bytes.
    pub memory: u64,
    /// CPU seconds over the child's life (`RLIMIT_CPU`); the child is
    /// started again when it runs out.
    pub cpu_secs: u64,
    /// The longest one request may take.
    pub deadline: Duration,
}

/// Default address-space cap of the symbolizer process.
pub const DEFAULT_MEMORY: u64 = 1 << 30;
/// Default longest time of one request (`--symbolizer-timeout`).
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(2);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory: DEFAULT_MEMORY,
            cpu_secs: 600,
            deadline: DEFAULT_DEADLINE,
        }
    }
}

/// Why a file's call sites were not named.
#[derive(Debug, Error)]
pub enum SymbolizerError {
    /// The child could not be started.
    #[error("cannot start the call-site symbolizer ({program}): {source}")]
    Spawn {
        /// The program run.
        program: String,
        /// The error.
        source: io::Error,
    },
    /// The request took longer than its deadline.
    #[error(
        "symbolizing {file} took over {deadline:?}: the symbolizer was restarted and the file's call sites keep their object+offset names"
    )]
    Timeout {
        /// The file.
        file: String,
        /// The deadline.
        deadline: Duration,
    },
    /// The child died while symbolizing.
    #[error(
        "the symbolizer died symbolizing {file} ({status}): it was restarted and the file's call sites keep their object+offset names"
    )]
    Died {
        /// The file.
        file: String,
        /// How it ended.
        status: String,
        /// Killed by `SIGABRT`: an allocation failed under the memory cap.
        memory: bool,
        /// Killed by `SIGXCPU`/`SIGKILL` from its CPU limit.
        cpu: bool,
    },
    /// Talking to the child failed, or it answered nonsense.
    #[error("the symbolizer's answer about {file} is unusable: {what}")]
    Protocol {
        /// The file.
        file: String,
        /// What was wrong.
        what: String,
    },
}

impl SymbolizerError {
    /// The `reason` label of the failure counter.
    pub fn reason(&self) -> &'static str {
        match self {
            SymbolizerError::Spawn { .. } => "spawn",
            SymbolizerError::Timeout { .. } => "timeout",
            SymbolizerError::Died { memory: true, .. } => "memory",
            SymbolizerError::Died { cpu: true, .. } => "cpu",
            SymbolizerError::Died { .. } => "crash",
            SymbolizerError::Protocol { .. } => "protocol",
        }
    }
}

/// The daemon's side: starts the child when needed and asks it.
pub struct Client {
    program: PathBuf,
    args: Vec<String>,
    limits: Limits,
    running: Option<Running>,
}

struct Running {
    child: Child,
    sock: OwnedFd,
}

impl Client {
    /// A client running `mpi-observer __symbolizer` from `/proc/self/exe`.
    pub fn new(limits: Limits) -> Client {
        Client::with_program("/proc/self/exe".into(), vec![SUBCOMMAND.into()], limits)
    }

    /// A client running `program args...` as the child (tests).
    pub fn with_program(program: PathBuf, args: Vec<String>, limits: Limits) -> Client {
        Client {
            program,
            args,
            limits,
            running: None,
        }
    }

    /// The child's pid, while one runs.
    pub fn child_pid(&self) -> Option<u32> {
        self.running.as_ref().map(|r| r.child.id())
    }

    fn start(&mut self) -> Result<&mut Running, SymbolizerError> {
        if self.running.is_none() {
            let spawn_err = |source| SymbolizerError::Spawn {
                program: self.program.display().to_string(),
                source,
            };
            let (ours, theirs) = seqpacket_pair().map_err(spawn_err)?;
            let theirs_fd = theirs.as_raw_fd();
            let limits = self.limits;
            let mut cmd = Command::new(&self.program);
            cmd.args(&self.args)
                .stdin(Stdio::null())
                .stdout(Stdio::null());
            // SAFETY: only async-signal-safe calls (dup2, setrlimit, prctl)
            // between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::dup2(theirs_fd, CHILD_FD) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let set = |res, v: u64| {
                        let l = libc::rlimit {
                            rlim_cur: v,
                            rlim_max: v,
                        };
                        libc::setrlimit(res, &l)
                    };
                    if set(libc::RLIMIT_AS, limits.memory) != 0
                        || set(libc::RLIMIT_CPU, limits.cpu_secs) != 0
                        || set(libc::RLIMIT_CORE, 0) != 0
                        || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                        || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0
                    {
                        return Err(io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let child = cmd.spawn().map_err(spawn_err)?;
            drop(theirs);
            self.running = Some(Running { child, sock: ours });
        }
        Ok(self.running.as_mut().expect("just started"))
    }

    /// Kills the child (if any) and says how it ended.
    fn stop(&mut self, kill: bool) -> String {
        let Some(mut r) = self.running.take() else {
            return "not running".into();
        };
        drop(r.sock);
        if kill {
            let _ = r.child.kill();
        }
        match r.child.wait() {
            Ok(s) => s.to_string(),
            Err(e) => e.to_string(),
        }
    }

    /// Names the call instructions at `offsets` (at most [`MAX_OFFSETS`])
    /// of `file`; `shown` names the file in errors. `None` where the file
    /// has no symbol there.
    pub fn symbolize(
        &mut self,
        file: &std::fs::File,
        shown: &str,
        offsets: &[u64],
    ) -> Result<Vec<Option<String>>, SymbolizerError> {
        assert!(offsets.len() <= MAX_OFFSETS, "split requests");
        let deadline = Instant::now() + self.limits.deadline;
        let protocol = |what: String| SymbolizerError::Protocol {
            file: shown.to_string(),
            what,
        };
        let r = self.start()?;
        let mut req = Vec::with_capacity(8 + 8 * offsets.len());
        req.extend_from_slice(&MAGIC.to_le_bytes());
        req.extend_from_slice(&(offsets.len() as u32).to_le_bytes());
        for o in offsets {
            req.extend_from_slice(&o.to_le_bytes());
        }
        let sock = r.sock.as_raw_fd();
        let sent = send_with_fd(sock, &req, file.as_raw_fd());
        let answer = sent.and_then(|()| recv_until(sock, deadline));
        match answer {
            Ok(Some(buf)) => match decode_answer(&buf, offsets.len()) {
                Some(names) => Ok(names),
                None => {
                    self.stop(true);
                    Err(protocol("malformed answer".into()))
                }
            },
            Ok(None) => {
                self.stop(true);
                Err(SymbolizerError::Timeout {
                    file: shown.to_string(),
                    deadline: self.limits.deadline,
                })
            }
            // The child is gone (EOF, EPIPE, ECONNRESET): how it ended.
            Err(_) => {
                let status = self.running.as_mut().map(|r| {
                    // It may still be exiting: give it the rest of the deadline.
                    loop {
                        if let Ok(Some(s)) = r.child.try_wait() {
                            break Some(s);
                        }
                        if Instant::now() >= deadline {
                            break None;
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                });
                let sig = status.flatten().and_then(|s| s.signal());
                let shown_status = self.stop(true);
                Err(SymbolizerError::Died {
                    file: shown.to_string(),
                    status: shown_status,
                    memory: sig == Some(libc::SIGABRT),
                    cpu: sig == Some(libc::SIGXCPU),
                })
            }
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.stop(true);
    }
}

fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends one message with `fd` attached.
fn send_with_fd(sock: RawFd, data: &[u8], fd: RawFd) -> io::Result<()> {
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: the control buffer has room for one header and one fd.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
    }
    // SAFETY: msg is fully initialised.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != data.len() {
        return Err(io::Error::other("short send"));
    }
    Ok(())
}

/// One message, waiting until `deadline`: `Ok(None)` past it, an error
/// when the peer is gone.
fn recv_until(sock: RawFd, deadline: Instant) -> io::Result<Option<Vec<u8>>> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let mut pfd = libc::pollfd {
            fd: sock,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            continue;
        }
        let mut buf = vec![0u8; ANSWER_BYTES + 1];
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::recv(sock, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.truncate(n as usize);
        return Ok(Some(buf));
    }
}

fn decode_answer(buf: &[u8], want: usize) -> Option<Vec<Option<String>>> {
    let count = u32::from_le_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    if count != want {
        return None;
    }
    let mut at = 4;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let len = u16::from_le_bytes(buf.get(at..at + 2)?.try_into().ok()?) as usize;
        at += 2;
        if len > MAX_NAME {
            return None;
        }
        let s = buf.get(at..at + len)?;
        at += len;
        out.push((len > 0).then(|| String::from_utf8_lossy(s).into_owned()));
    }
    (at == buf.len()).then_some(out)
}

/// Cuts `s` to at most `max` bytes, at a character boundary.
fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// The child: answers requests on `fd` until the daemon closes it.
pub fn serve(fd: RawFd) -> io::Result<()> {
    // Root's supplementary groups are not needed to read a file the
    // daemon opened; drop them (fails harmlessly when not root).
    // SAFETY: an empty group list.
    unsafe { libc::setgroups(0, std::ptr::null()) };
    let mut buf = vec![0u8; 8 + 8 * MAX_OFFSETS + 1];
    // The file of the last request, kept open with its parsed symbolizer:
    // the daemon sends a file's offsets in consecutive requests of 64, and
    // parsing a large library's DWARF once instead of per request is what
    // keeps them within the deadline.
    let mut current: Option<(Stamp, OwnedFd, blazesym::symbolize::Symbolizer)> = None;
    loop {
        let (n, file) = recv_with_fd(fd, &mut buf)?;
        if n == 0 {
            return Ok(());
        }
        let Some(file) = file else {
            return Err(io::Error::other("a request came without its file"));
        };
        let req = &buf[..n];
        let bad = || io::Error::other("malformed request");
        if n < 8 || u32::from_le_bytes(req[..4].try_into().expect("4")) != MAGIC {
            return Err(bad());
        }
        let count = u32::from_le_bytes(req[4..8].try_into().expect("4")) as usize;
        if count > MAX_OFFSETS || n != 8 + 8 * count {
            return Err(bad());
        }
        let offsets: Vec<u64> = req[8..]
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
            .collect();
        #[cfg(test)]
        test_hooks(&offsets);
        let stamp = stamp_of(&file);
        let reuse = stamp.is_some() && current.as_ref().is_some_and(|c| Some(c.0) == stamp);
        if !reuse {
            // Drop the old parse first: one file's at a time in memory.
            drop(current.take());
            current = Some((stamp.unwrap_or_default(), file, new_symbolizer()));
        }
        let (_, file, symbolizer) = current.as_ref().expect("just set");
        let names = name_file(file, symbolizer, &offsets);
        let mut out = Vec::with_capacity(4 + names.len() * 32);
        out.extend_from_slice(&(names.len() as u32).to_le_bytes());
        for n in names {
            let n = cut(n.unwrap_or_default(), MAX_NAME);
            out.extend_from_slice(&(n.len() as u16).to_le_bytes());
            out.extend_from_slice(n.as_bytes());
        }
        // SAFETY: `out` is readable for its length.
        let w = unsafe { libc::send(fd, out.as_ptr().cast(), out.len(), libc::MSG_NOSIGNAL) };
        if w < 0 {
            return Err(io::Error::last_os_error());
        }
    }
}

/// Test-only ways to make the child misbehave, keyed by impossible offsets.
#[cfg(test)]
fn test_hooks(offsets: &[u64]) {
    match offsets.first() {
        Some(&HANG) => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
        Some(&ABORT) => std::process::abort(),
        _ => {}
    }
}
#[cfg(test)]
pub(crate) const HANG: u64 = 0x7fff_0000_0000;
#[cfg(test)]
const ABORT: u64 = 0x7fff_0000_1000;

/// What identifies a file's contents: device, inode, size, mtime.
type Stamp = (u64, u64, u64, i64, i64);

fn stamp_of(file: &OwnedFd) -> Option<Stamp> {
    let m = std::fs::File::from(file.try_clone().ok()?)
        .metadata()
        .ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// A symbolizer that looks for separate debug files nowhere but beside the
/// file (in `/proc/self/fd`, where no debug file is).
fn new_symbolizer() -> blazesym::symbolize::Symbolizer {
    blazesym::symbolize::Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(false)
        .enable_demangling(true)
        .set_debug_dirs(Some(Vec::<PathBuf>::new()))
        .build()
}

/// Names `offsets` of `file` with blazesym.
fn name_file(
    file: &OwnedFd,
    symbolizer: &blazesym::symbolize::Symbolizer,
    offsets: &[u64],
) -> Vec<Option<String>> {
    use blazesym::symbolize::{
        Input, Symbolized,
        source::{Elf, Source},
    };
    // Read the file as its owner: a debug link can reach only what the
    // owner could read. Restored after.
    let owner = std::fs::File::from(file.try_clone().expect("dup"))
        .metadata()
        .map(|m| (m.uid(), m.gid()))
        .ok();
    // SAFETY: setfsuid/setfsgid only change this thread's file-system ids.
    let restore = owner.map(|(u, g)| unsafe { (libc::setfsgid(g), libc::setfsuid(u)) });
    let path = Path::new("/proc/self/fd").join(file.as_raw_fd().to_string());
    let src = Source::Elf(Elf::new(&path));
    let out = match symbolizer.symbolize(&src, Input::FileOffset(offsets)) {
        Ok(syms) => syms
            .into_iter()
            .map(|s| match s {
                Symbolized::Sym(sym) if !sym.name.is_empty() => {
                    Some(match sym.code_info.as_deref() {
                        Some(ci) if ci.line.is_some() => {
                            let f = Path::new(&ci.file)
                                .file_name()
                                .unwrap_or(&ci.file)
                                .to_string_lossy();
                            format!("{} at {f}:{}", sym.name, ci.line.unwrap_or(0))
                        }
                        // The offset of the return address in the function.
                        _ => format!("{}+{:#x}", sym.name, sym.offset + 1),
                    })
                }
                _ => None,
            })
            .collect(),
        Err(_) => vec![None; offsets.len()],
    };
    if let Some((g, u)) = restore {
        // SAFETY: back to the ids saved above.
        unsafe {
            libc::setfsuid(u as libc::uid_t);
            libc::setfsgid(g as libc::gid_t);
        }
    }
    out
}

/// One message and the descriptor attached to it, if any.
fn recv_with_fd(sock: RawFd, buf: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(size_of::<RawFd>() as u32) } as usize;
    let mut cbuf = vec![0u8; space];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr is valid; pointers set below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space;
    let n = loop {
        // SAFETY: msg is fully initialised.
        let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fd = None;
    // SAFETY: walking the control messages the kernel wrote into `cbuf`.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let raw = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>());
                fd = Some(OwnedFd::from_raw_fd(raw));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::other("request too long"));
    }
    Ok((n, fd))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// This test binary, running [`child`] as the symbolizer.
    pub(crate) fn child_program() -> (PathBuf, Vec<String>) {
        (
            std::fs::read_link("/proc/self/exe").unwrap(),
            [
                "attach::symbolizer::tests::child",
                "--exact",
                "--ignored",
                "--test-threads=1",
                "-q",
            ]
            .map(String::from)
            .to_vec(),
        )
    }

    /// The child, when the tests below start it.
    #[test]
    #[ignore = "the symbolizer child the other tests start"]
    fn child() {
        serve(CHILD_FD).unwrap();
    }

    fn client(deadline: Duration) -> Client {
        let (p, a) = child_program();
        Client::with_program(
            p,
            a,
            Limits {
                deadline,
                ..Limits::default()
            },
        )
    }

    /// A function of this binary and its file offset.
    fn own_function() -> (std::fs::File, u64) {
        let addr = own_function as *const () as u64;
        let m = crate::os::procfs::maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.start <= addr && addr < m.end)
            .unwrap();
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        (f, addr - m.start + m.offset)
    }

    #[test]
    fn names_come_back_in_order_with_none_where_no_symbol() {
        let (f, off) = own_function();
        let mut c = client(Duration::from_secs(30));
        let names = c.symbolize(&f, "self", &[off, 1 << 40]).unwrap();
        assert!(
            names[0]
                .as_deref()
                .is_some_and(|n| n.contains("own_function")),
            "{names:?}"
        );
        assert_eq!(names[1], None);
    }

    #[test]
    fn a_hang_is_killed_at_the_deadline_and_the_next_request_works() {
        let (f, off) = own_function();
        let mut c = client(Duration::from_millis(700));
        let t = Instant::now();
        let e = c.symbolize(&f, "hang", &[HANG]).unwrap_err();
        assert_eq!(e.reason(), "timeout", "{e}");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert!(c.child_pid().is_none(), "killed");
        // Started again at the next request.
        assert!(c.symbolize(&f, "self", &[off]).unwrap()[0].is_some());
    }

    #[test]
    fn an_abort_is_a_memory_failure_and_the_child_restarts() {
        let (f, off) = own_function();
        let mut c = client(Duration::from_secs(30));
        let e = c.symbolize(&f, "abort", &[ABORT]).unwrap_err();
        assert_eq!(e.reason(), "memory", "{e}");
        assert!(c.child_pid().is_none());
        let names = c.symbolize(&f, "self", &[off]).unwrap();
        assert!(names[0].is_some(), "restarted: {names:?}");
    }

    #[test]
    fn the_memory_cap_holds_in_the_child() {
        // An allocation past RLIMIT_AS fails in the child only.
        let (p, a) = child_program();
        let mut c = Client::with_program(
            p,
            a,
            Limits {
                memory: 64 << 20,
                ..Limits::default()
            },
        );
        let (f, off) = own_function();
        // The test binary itself needs more than 64 MiB of address space
        // to start (its debug info is mapped), or it starts and answers:
        // either way the daemon side reports, never dies.
        match c.symbolize(&f, "small", &[off]) {
            Ok(n) => assert_eq!(n.len(), 1),
            Err(e) => assert!(matches!(e.reason(), "memory" | "crash" | "protocol"), "{e}"),
        }
    }

    #[test]
    fn answers_are_checked() {
        assert_eq!(decode_answer(&[1, 0, 0, 0, 0, 0], 1), Some(vec![None]));
        assert_eq!(decode_answer(&[1, 0, 0, 0, 2, 0, b'a'], 1), None, "short");
        assert_eq!(decode_answer(&[2, 0, 0, 0, 0, 0], 1), None, "count");
        let mut long = vec![1, 0, 0, 0];
        long.extend_from_slice(&((MAX_NAME + 1) as u16).to_le_bytes());
        long.resize(long.len() + MAX_NAME + 1, b'x');
        assert_eq!(decode_answer(&long, 1), None, "too long");
        assert_eq!(cut("aé".into(), 2), "a");
    }
}
