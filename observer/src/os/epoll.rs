//! Readiness of many descriptors at once (`epoll(7)`), so that one thread
//! can wait on every connection it holds without waiting on any one of
//! them: a peer that never speaks costs a slot in the set, not time.

use std::{
    io,
    os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
    time::Duration,
};

/// An epoll instance. A descriptor closed leaves the set by itself (none
/// added here is ever duplicated), so nothing needs removing but what
/// stays open.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
}

/// What a descriptor is ready for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ready {
    /// The token it was added with.
    pub token: u64,
    /// Readable, or closed by the peer (a read says which).
    pub input: bool,
}

/// How a descriptor is watched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Watch {
    /// Reported as long as it is readable (a listening socket).
    Level,
    /// Reported once, then left out until [`Epoll::rearm`]: a connection
    /// that has spoken stays open, and a hang-up reported for ever would
    /// keep every wait from waiting.
    Once,
}

impl Epoll {
    /// A new, empty set (close-on-exec).
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 with a valid flag; the result is checked.
        let raw = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Epoll {
            // SAFETY: a descriptor we just created and own.
            fd: unsafe { OwnedFd::from_raw_fd(raw) },
        })
    }

    fn ctl(&self, op: libc::c_int, fd: BorrowedFd<'_>, token: u64, how: Watch) -> io::Result<()> {
        let mut events = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        if how == Watch::Once {
            events |= libc::EPOLLONESHOT as u32;
        }
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: epoll_ctl on our set with a live descriptor and an event
        // of ours; the result is checked.
        if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd.as_raw_fd(), &mut ev) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Watches `fd` for input, reported with `token`.
    pub fn add(&self, fd: BorrowedFd<'_>, token: u64, how: Watch) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, how)
    }

    /// Watches a [`Watch::Once`] descriptor again after its report.
    pub fn rearm(&self, fd: BorrowedFd<'_>, token: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, Watch::Once)
    }

    /// Stops watching `fd`, which stays open.
    pub fn remove(&self, fd: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: epoll_ctl on our set; the event is ignored for a delete.
        let rc = unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd.as_raw_fd(),
                std::ptr::null_mut(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout` (rounded up to the millisecond) for at most
    /// `max` descriptors to be ready, and returns them; a signal ends the
    /// wait with none.
    pub fn wait(&self, max: usize, timeout: Duration) -> io::Result<Vec<Ready>> {
        let max = max.clamp(1, 1024);
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; max];
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: epoll_wait into a buffer of `max` events.
        let n = unsafe {
            libc::epoll_wait(
                self.fd.as_raw_fd(),
                events.as_mut_ptr(),
                max as libc::c_int,
                ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(Vec::new())
            } else {
                Err(e)
            };
        }
        Ok(events[..n as usize]
            .iter()
            .map(|e| Ready {
                token: e.u64,
                input: e.events
                    & (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLHUP | libc::EPOLLERR) as u32
                    != 0,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::os::seqpacket::Conn;

    #[test]
    fn a_once_watched_descriptor_is_reported_once_until_rearmed() {
        let e = Epoll::new().unwrap();
        let (a, b) = Conn::pair().unwrap();
        use std::os::fd::AsFd as _;
        e.add(a.as_fd(), 7, Watch::Once).unwrap();
        let t = Instant::now();
        assert!(e.wait(8, Duration::from_millis(30)).unwrap().is_empty());
        assert!(t.elapsed() >= Duration::from_millis(25), "it waited");
        b.send(b"x").unwrap();
        assert_eq!(
            e.wait(8, Duration::from_secs(1)).unwrap(),
            [Ready {
                token: 7,
                input: true
            }]
        );
        // Still readable, but reported once.
        assert!(e.wait(8, Duration::ZERO).unwrap().is_empty());
        e.rearm(a.as_fd(), 8).unwrap();
        assert_eq!(e.wait(8, Duration::ZERO).unwrap()[0].token, 8);
        // A level-watched one is reported as long as it is readable.
        let (c, d) = Conn::pair().unwrap();
        e.add(c.as_fd(), 9, Watch::Level).unwrap();
        drop(d);
        for _ in 0..2 {
            assert_eq!(e.wait(8, Duration::ZERO).unwrap()[0].token, 9);
        }
        e.remove(c.as_fd()).unwrap();
        assert!(e.wait(8, Duration::ZERO).unwrap().is_empty());
        // A closed descriptor leaves the set.
        drop(c);
        assert!(e.wait(8, Duration::ZERO).unwrap().is_empty());
    }
}
