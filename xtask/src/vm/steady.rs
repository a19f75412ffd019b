//! `xtask guest-hold-perf-key`, run by the guest script before the command:
//! it keeps the kernel's `perf_sched_events` static key enabled for the
//! guest's whole life.
//!
//! Why: every task-bound perf event (each classic uprobe, the daemon's own
//! feature probes) enables that key when it is the first, and its release
//! disables it a second later. Each flip patches a jump in `__schedule`
//! through an int3 (text_poke_bp). Under QEMU's multi-threaded TCG a vCPU
//! can still run a stale translation holding that int3 once the patch is
//! done, and the guest dies with "Oops: int3" in `__schedule` (seen once in
//! CI, in the 6.12 guest, inside the daemon's perf_event_open). The bug is
//! the emulator's, not the kernel's or ours; holding one task-bound event
//! open from the start makes the key flip once, before the tests, instead
//! of at every attach and detach. That one flip can race too (it killed a
//! 6.12 guest once), so the guest script starts the holder with every other
//! CPU offline (`guest.rs`, `HOLD`).

use anyhow::{Result, bail};
use std::io::Write as _;

/// Opens a task-bound dummy software event on itself, says `held` on
/// standard output, closes it, and sleeps until the guest powers off.
pub fn hold() -> Result<()> {
    // struct perf_event_attr, its first version (64 bytes, which every
    // kernel accepts): type, size, config; the rest zero.
    let mut attr = [0u64; 8];
    const PERF_TYPE_SOFTWARE: u64 = 1;
    const PERF_COUNT_SW_DUMMY: u64 = 9;
    const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
    attr[0] = PERF_TYPE_SOFTWARE | (64 << 32);
    attr[1] = PERF_COUNT_SW_DUMMY;
    // SAFETY: `attr` is a valid perf_event_attr of the size it states; the
    // other arguments are plain integers.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr.as_ptr(),
            0 as libc::pid_t,
            -1 as libc::c_int,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        bail!(
            "perf_event_open of a dummy event on itself: {}",
            std::io::Error::last_os_error()
        );
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "held")?;
    out.flush()?;
    drop(out);
    // The script reads one line; closing our end lets it go on.
    // SAFETY: closes this process's standard output, which nothing here
    // writes to again.
    unsafe { libc::close(1) };
    loop {
        std::thread::park();
    }
}
