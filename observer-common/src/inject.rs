//! The mailbox between `mpi-observer attach --inject` and the shim it loads
//! into a running rank.
//!
//! The daemon writes a small loader stub and this mailbox into the target
//! (docs/inject.md). The stub runs on one thread of the rank, stopped at the
//! entry of an application-level MPI call: it `dlopen`s the shim, looks up
//! [`INJECT_SYMBOL`] and calls it with the mailbox's
//! address. Everything after that is a conversation through this struct:
//!
//! ```text
//! stub     : state = LOADING
//! shim     : builds its stack and segment   -> shim_lo/shim_hi, state = PREPARED
//! daemon   : tells its probes to ignore calls made from [shim_lo, shim_hi), go = GO
//! shim     : rewrites the GOT slots         -> slots, state = COMMITTED
//! daemon   : tells its probes to record no new call, go = HANDED
//! stub     : state = DONE (the last store before it returns to the rank's code)
//! ```
//!
//! Detaching later is [`go::EJECT`]: no stop is needed for it.
//!
//! A daemon that goes away (or says [`go::ABORT`]) before `go` is set makes
//! the shim undo what it did after [`Mailbox::timeout_ms`]: state =
//! ABORTED, the rank as it was. `error` then points at one line in the
//! target's memory that says why. Every field is naturally aligned, so the
//! daemon's and the shim's stores to the `u32` words are single stores.

/// `dlsym` name of the shim's injection entry: `int f(Mailbox *)`.
pub const INJECT_SYMBOL: &[u8] = b"mpi_observer_shim_inject\0";
/// [`Mailbox::magic`].
pub const MAGIC: u64 = u64::from_le_bytes(*b"MPIOINJ\0");
/// [`Mailbox::version`]; bump on any change.
pub const VERSION: u32 = 1;

/// Values of [`Mailbox::state`], in the order they are reached.
pub mod state {
    /// Written by the daemon before the stub runs.
    pub const WRITTEN: u32 = 0;
    /// The stub is running (`dlopen`).
    pub const LOADING: u32 = 1;
    /// `dlopen` or `dlsym` failed; `error` is `dlerror()`'s message.
    pub const LOAD_FAILED: u32 = 2;
    /// The shim built its stack (and segment): `shim_lo`/`shim_hi` are set
    /// and it waits for [`super::Mailbox::go`].
    pub const PREPARED: u32 = 3;
    /// The shim rewrote the slots (`slots` of them) and is live.
    pub const COMMITTED: u32 = 4;
    /// The shim undid everything (abort, timeout or a failure; `error`).
    pub const ABORTED: u32 = 5;
    /// Ejection put every slot back.
    pub const EJECTED: u32 = 6;
    /// The stub's last store: it restores the thread's registers and jumps
    /// back; the entry's own outcome is the state it overwrote, kept in
    /// `outcome`.
    pub const DONE: u32 = 7;
}

/// Values of [`Mailbox::go`], written by the daemon.
pub mod go {
    /// Not yet decided.
    pub const WAIT: u32 = 0;
    /// Commit: rewrite the slots.
    pub const GO: u32 = 1;
    /// Undo and leave the rank as it was.
    pub const ABORT: u32 = 2;
    /// After a commit: put the slots back. The shim does it itself, on the
    /// application's thread, at the end of its next timed call (no stop,
    /// no tracing), and then stores state EJECTED.
    pub const EJECT: u32 = 3;
    /// After state COMMITTED: the probes record no new call of the
    /// process (`ProcConfig::handed_over`); the shim may return to the
    /// application, whose calls it alone counts from then on.
    pub const HANDED: u32 = 4;
}

/// The mailbox. The daemon writes it in the target next to the stub; the
/// strings it points to are written on the stopped thread's stack, below
/// its red zone, and are only read during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mailbox {
    /// [`MAGIC`].
    pub magic: u64,
    /// [`VERSION`].
    pub version: u32,
    /// [`state`]: written by the stub and the shim.
    pub state: u32,
    /// [`go`]: written by the daemon.
    pub go: u32,
    /// How long the shim waits for `go` before it aborts by itself.
    pub timeout_ms: u32,
    /// Address of the tools list (NUL-terminated), e.g. `stats`.
    pub tools: u64,
    /// Address of the shim's path (NUL-terminated), for `dlopen`.
    pub path: u64,
    /// Lowest address of the shim's executable code (set at PREPARED).
    pub shim_lo: u64,
    /// One past its highest address.
    pub shim_hi: u64,
    /// Address of a one-line NUL-terminated message when something failed.
    pub error: u64,
    /// GOT slots rewritten (COMMITTED) or restored (EJECTED).
    pub slots: u32,
    /// The entry's outcome (`state` before the stub set DONE).
    pub outcome: u32,
    /// `dlopen` flags the stub uses (`RTLD_NOW`, plus `RTLD_NOLOAD` to eject).
    pub dlopen_flags: u32,
    /// Zero.
    pub reserved: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_stable() {
        // The stub addresses these fields by offset (observer/src/inject).
        assert_eq!(core::mem::size_of::<Mailbox>(), 80);
        assert_eq!(core::mem::offset_of!(Mailbox, state), 12);
        assert_eq!(core::mem::offset_of!(Mailbox, path), 32);
        assert_eq!(core::mem::offset_of!(Mailbox, error), 56);
        assert_eq!(core::mem::offset_of!(Mailbox, outcome), 68);
        assert_eq!(core::mem::offset_of!(Mailbox, dlopen_flags), 72);
    }
}
