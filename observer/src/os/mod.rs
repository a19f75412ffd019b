//! The operating system, as a root daemon must read it: everything here
//! treats what a user controls (`/proc/PID/*`, `/dev/shm` files, files a
//! process maps) as hostile, and depends on nothing else in the crate.
//!
//! [`procfs`] reads `/proc/PID/*` (the one `/proc/PID/maps` parser),
//! [`procevents`] hears of new processes, [`userfile`] opens a file a
//! process maps, [`shm`] is the one trusted mapping of a user's `/dev/shm`
//! file under the SIGBUS guard, [`sys`] the system calls std lacks,
//! [`clock`] the monotonic clock every figure is stamped with, [`host`]
//! this node's name, [`seqpacket`] the Unix sockets a user's process may
//! knock on (their directories checked, the peer named by the kernel),
//! [`epoll`] the readiness of many descriptors at once, and [`logger`] the
//! one writer of the daemon's lines on stderr, at a level.

pub mod clock;
pub mod epoll;
pub mod host;
pub mod logger;
pub mod procevents;
pub mod procfs;
pub mod seqpacket;
pub mod shm;
pub mod sys;
pub mod userfile;
