//! New programs as they start: `attach --all` looks at a process a few
//! milliseconds after its `exec`, when the dynamic loader has mapped its
//! MPI library, instead of at the next once-a-second scan, which a rank of
//! a short job can live and die between. The events come from the eBPF
//! program on `sched/sched_process_exec` (observer-ebpf's `exec.rs`)
//! whenever the probes are loaded, in any network namespace; else (with
//! `--no-bpf`, which promises no eBPF at all) from the kernel's process
//! connector (netlink, `CONFIG_PROC_EVENTS`), which serves only the
//! initial network namespace. The scan stays, as the fallback for what
//! these miss (a lost event, a library `dlopen`ed seconds later, a kernel
//! without either).
//!
//! An exec is only a hint: the process is looked at again after
//! [`CHECKS`] delays until it maps an MPI library, its code included
//! ([`MappedLib::loaded`](crate::os::procfs::MappedLib::loaded)), or the
//! delays run out.
//! At most [`MAX_WATCHED`] processes are watched at once; past that, and
//! when the kernel drops events because we read too slowly, it is counted
//! and the scan catches up.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// When a process is looked at after its exec.
pub const CHECKS: [Duration; 6] = [
    Duration::from_millis(2),
    Duration::from_millis(10),
    Duration::from_millis(40),
    Duration::from_millis(150),
    Duration::from_millis(500),
    Duration::from_millis(1500),
];
/// Processes watched at once.
pub const MAX_WATCHED: usize = 65_536;
/// Exec events taken per wake-up at most: a user's fork/exec storm cannot
/// keep the watcher draining for ever (its due checks, and its stop, wait
/// meanwhile). What is left stays in the ring or the socket for the next
/// wake-up; what overflows them the kernel counts as dropped.
pub const MAX_DRAIN: usize = 4_096;

const NETLINK_CONNECTOR: libc::c_int = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_EXEC: u32 = 2;
const NLMSG_HDRLEN: usize = 16;
const CN_MSG_LEN: usize = 20;

/// A subscription to exec events.
#[derive(Debug)]
pub struct ExecEvents {
    fd: OwnedFd,
}

impl ExecEvents {
    /// Subscribes (needs `CAP_NET_ADMIN`).
    pub fn open() -> io::Result<ExecEvents> {
        // SAFETY: plain socket(2); the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_CONNECTOR,
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor we just created and own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: an all-zero sockaddr_nl is valid; the fields are set below.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        sa.nl_groups = CN_IDX_PROC;
        // SAFETY: `sa` is a valid sockaddr_nl of the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&raw const sa).cast(),
                size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // A larger receive buffer: bursts of execs (a job's start) are
        // read in batches, not dropped.
        let size: libc::c_int = 4 << 20;
        // SAFETY: setsockopt with a c_int option value of its size.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&raw const size).cast(),
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        let mut msg = [0u8; NLMSG_HDRLEN + CN_MSG_LEN + 4];
        let len = msg.len() as u32;
        msg[0..4].copy_from_slice(&len.to_ne_bytes());
        msg[4..6].copy_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
        let cn = NLMSG_HDRLEN;
        msg[cn..cn + 4].copy_from_slice(&CN_IDX_PROC.to_ne_bytes());
        msg[cn + 4..cn + 8].copy_from_slice(&CN_VAL_PROC.to_ne_bytes());
        msg[cn + 16..cn + 18].copy_from_slice(&4u16.to_ne_bytes());
        msg[cn + CN_MSG_LEN..].copy_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
        // SAFETY: sends our initialised buffer.
        let sent = unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len(), 0) };
        if sent < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(ExecEvents { fd })
    }

    /// Waits up to `timeout` for events; returns the pids that exec'd (up
    /// to [`MAX_DRAIN`] events and one datagram's worth more).
    /// `Err` with `ENOBUFS` means the kernel dropped events.
    pub fn recv(&self, timeout: Duration) -> io::Result<Vec<u32>> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n <= 0 {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        while out.len() < MAX_DRAIN {
            // SAFETY: receives into our buffer, without blocking.
            let got = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if got < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::WouldBlock {
                    return Ok(out);
                }
                return Err(e);
            }
            parse_exec_pids(&buf[..got as usize], &mut out);
        }
        Ok(out)
    }
}

/// Where exec events come from.
#[expect(
    clippy::large_enum_variant,
    reason = "one value per daemon, moved once into the watcher thread"
)]
pub enum Source {
    /// The process connector (the initial network namespace only).
    Connector(ExecEvents),
    /// The eBPF exec program's ring of pids and its per-CPU drop count.
    Bpf {
        /// The ring (`maps::EXECS`).
        ring: aya::maps::RingBuf<aya::maps::MapData>,
        /// Events the ring had no room for (`maps::EXEC_DROPS`).
        drops: aya::maps::PerCpuArray<aya::maps::MapData, u64>,
        /// Drops counted so far.
        seen: u64,
    },
}

impl Source {
    /// What the daemon's line calls it.
    pub fn name(&self) -> &'static str {
        match self {
            Source::Connector(_) => "the process connector",
            Source::Bpf { .. } => "the eBPF exec tracepoint",
        }
    }

    /// Waits up to `timeout` for events; returns the pids that exec'd
    /// (each once), the events taken (at most about [`MAX_DRAIN`]) and the
    /// events lost since the last call.
    pub(crate) fn recv(&mut self, timeout: Duration) -> Drained {
        match self {
            Source::Connector(ev) => match ev.recv(timeout) {
                Ok(p) => {
                    let events = p.len();
                    let mut p = p.into_iter().map(Some);
                    let (pids, _) = drain(|| p.next(), usize::MAX);
                    Drained {
                        pids,
                        events,
                        lost: 0,
                    }
                }
                Err(_) => Drained {
                    pids: Vec::new(),
                    events: 0,
                    lost: 1,
                },
            },
            Source::Bpf { ring, drops, seen } => {
                let mut pfd = libc::pollfd {
                    fd: ring.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, ms) };
                let (pids, events) = drain(
                    || {
                        let item = ring.next()?;
                        let tgid = item
                            .get(..8)
                            .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")));
                        Some(tgid.and_then(|t| u32::try_from(t).ok()))
                    },
                    MAX_DRAIN,
                );
                let total: u64 = drops.get(&0, 0).map(|v| v.iter().sum()).unwrap_or(*seen);
                let lost = total.saturating_sub(*seen);
                *seen = total.max(*seen);
                Drained { pids, events, lost }
            }
        }
    }
}

/// What one wake-up of [`Source::recv`] took.
pub(crate) struct Drained {
    /// The pids that exec'd, each once, in the order first seen.
    pub pids: Vec<u32>,
    /// The events taken (a process that execs twice counts twice).
    pub events: usize,
    /// Events the kernel dropped since the last wake-up.
    pub lost: u64,
}

impl Drained {
    /// Whether the drain stopped at its cap, events perhaps left behind.
    pub fn full(&self) -> bool {
        self.events >= MAX_DRAIN
    }
}

/// Takes events from `next` (`None`: no more; `Some(None)`: one that names
/// no pid) until it is empty or `cap` were taken; returns the pids, each
/// once (an exec chain, or a storm re-exec'ing one process, is looked at
/// once per drain), and the events taken.
fn drain(mut next: impl FnMut() -> Option<Option<u32>>, cap: usize) -> (Vec<u32>, usize) {
    let mut seen = std::collections::HashSet::new();
    let mut pids = Vec::new();
    let mut taken = 0;
    while taken < cap {
        let Some(event) = next() else { break };
        taken += 1;
        if let Some(pid) = event
            && seen.insert(pid)
        {
            pids.push(pid);
        }
    }
    (pids, taken)
}

/// Appends the thread-group ids of the exec events in one datagram.
pub fn parse_exec_pids(mut data: &[u8], out: &mut Vec<u32>) {
    let u32_at = |b: &[u8], at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    while data.len() >= NLMSG_HDRLEN {
        let Some(len) = u32_at(data, 0).map(|l| l as usize) else {
            return;
        };
        if len < NLMSG_HDRLEN || len > data.len() {
            return;
        }
        let msg = &data[..len];
        // proc_event after the cn_msg: what, cpu, timestamp, then the
        // exec's process_pid and process_tgid.
        let ev = NLMSG_HDRLEN + CN_MSG_LEN;
        if u32_at(msg, NLMSG_HDRLEN) == Some(CN_IDX_PROC)
            && u32_at(msg, ev) == Some(PROC_EVENT_EXEC)
            && let Some(tgid) = u32_at(msg, ev + 20)
        {
            out.push(tgid);
        }
        data = &data[len.next_multiple_of(4).min(data.len())..];
    }
}

/// Counters of the watcher, read by the daemon's self-metrics.
#[derive(Debug, Default)]
pub struct WatchStats {
    /// Exec events received.
    pub execs: AtomicU64,
    /// Events the kernel dropped or the watch list had no room for.
    pub dropped: AtomicU64,
    /// Processes found mapping an MPI library through an event.
    pub found: AtomicU64,
}

/// Runs the watcher on a thread of its own until `stop` is set: each exec'd
/// process is looked at after each of [`CHECKS`], and `found(pid, ticks)`
/// is called once for one that maps an MPI library and its code.
pub fn watch(
    mut events: Source,
    stats: Arc<WatchStats>,
    stop: Arc<AtomicBool>,
    found: impl Fn(u32, u64) + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name("exec-watch".into())
        .spawn(move || {
            // (due, pid, start ticks, checks done)
            let mut due: BinaryHeap<Reverse<(Instant, u32, u64, usize)>> = BinaryHeap::new();
            while !stop.load(Ordering::Relaxed) {
                let now = Instant::now();
                let wait = due
                    .peek()
                    .map_or(Duration::from_millis(200), |Reverse((t, ..))| {
                        t.saturating_duration_since(now)
                    })
                    .min(Duration::from_millis(200));
                let drained = events.recv(wait);
                stats.dropped.fetch_add(drained.lost, Ordering::Relaxed);
                stats
                    .execs
                    .fetch_add(drained.events as u64, Ordering::Relaxed);
                let full = drained.full();
                for pid in drained.pids {
                    let Ok(ticks) = crate::os::procfs::start_ticks(pid) else {
                        continue;
                    };
                    if due.len() >= MAX_WATCHED {
                        stats.dropped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    due.push(Reverse((Instant::now() + CHECKS[0], pid, ticks, 0)));
                }
                let now = Instant::now();
                while let Some(&Reverse((t, pid, ticks, n))) = due.peek() {
                    if t > now {
                        break;
                    }
                    due.pop();
                    if crate::os::procfs::liveness(pid, ticks) != crate::os::procfs::Liveness::Alive
                    {
                        continue;
                    }
                    if matches!(crate::os::procfs::mpi_library(pid), Ok(Some(l)) if l.loaded()) {
                        stats.found.fetch_add(1, Ordering::Relaxed);
                        found(pid, ticks);
                    } else if let Some(d) = CHECKS.get(n + 1) {
                        due.push(Reverse((now + (*d - CHECKS[n]), pid, ticks, n + 1)));
                    }
                }
                if full {
                    // More waits in the ring: the next poll returns at
                    // once, and the other threads get the CPU in between.
                    std::thread::yield_now();
                }
            }
        })
        .expect("spawn the exec watcher")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(what: u32, tgid: u32) -> Vec<u8> {
        let mut m = vec![0u8; NLMSG_HDRLEN + CN_MSG_LEN + 16 + 8];
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m[NLMSG_HDRLEN..NLMSG_HDRLEN + 4].copy_from_slice(&CN_IDX_PROC.to_ne_bytes());
        let ev = NLMSG_HDRLEN + CN_MSG_LEN;
        m[ev..ev + 4].copy_from_slice(&what.to_ne_bytes());
        m[ev + 16..ev + 20].copy_from_slice(&(tgid + 1).to_ne_bytes());
        m[ev + 20..ev + 24].copy_from_slice(&tgid.to_ne_bytes());
        m
    }

    #[test]
    fn exec_events_give_their_tgid_and_garbage_gives_nothing() {
        let mut data = event(PROC_EVENT_EXEC, 42);
        data.extend(event(1, 7)); // a fork: ignored
        data.extend(event(PROC_EVENT_EXEC, 43));
        let mut out = Vec::new();
        parse_exec_pids(&data, &mut out);
        assert_eq!(out, [42, 43]);
        out.clear();
        parse_exec_pids(&data[..30], &mut out);
        parse_exec_pids(&[0xff; 64], &mut out);
        parse_exec_pids(&[], &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn a_drain_stops_at_its_cap_and_names_each_pid_once() {
        // A storm: 10,000 events, re-execs of 3 processes among them, and
        // events naming no pid.
        let mut storm = (0..10_000u32).map(|i| match i % 5 {
            0 => Some(Some(7)),
            1 => Some(Some(8)),
            2 => Some(None),
            3 => Some(Some(7)),
            _ => Some(Some(1000 + i)),
        });
        let (pids, taken) = drain(|| storm.next().flatten(), MAX_DRAIN);
        assert_eq!(taken, MAX_DRAIN, "stopped at the cap");
        assert_eq!(&pids[..3], [7, 8, 1004], "in the order first seen");
        let distinct: std::collections::HashSet<_> = pids.iter().collect();
        assert_eq!(distinct.len(), pids.len(), "each pid once");
        assert_eq!(pids.len(), 2 + MAX_DRAIN / 5);
        // The rest stayed where it was, for the next wake-up.
        assert_eq!(storm.count(), 10_000 - MAX_DRAIN);
        // An empty source: nothing, at once.
        assert_eq!(drain(|| None, MAX_DRAIN), (Vec::new(), 0));
    }

    #[test]
    fn a_real_exec_is_seen() {
        // Root only (CAP_NET_ADMIN): the daemon's case.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(std::env::var_os("CI").is_none(), "needs root under CI");
            return;
        }
        let ev = ExecEvents::open().expect("process connector");
        let child = std::process::Command::new("/bin/true").spawn().unwrap();
        let pid = child.id();
        let t = Instant::now();
        let mut seen = false;
        while t.elapsed() < Duration::from_secs(5) && !seen {
            seen = ev.recv(Duration::from_millis(100)).unwrap().contains(&pid);
        }
        let _ = { child }.wait();
        assert!(seen, "exec of pid {pid} not seen");
    }
}
