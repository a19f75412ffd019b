//! When the segment and the recording file come and go: made once the
//! library is up (`MPI_Init*`, or an injected shim's prepare), published,
//! removed at `MPI_Finalize` or exit.
//!
//! Kept apart from [`super::segment`] and [`super::trace`] so that both stay
//! below it: the recorder uses the segment's state, the segment knows
//! nothing of the recorder, and this module drives the two together.

use core::ffi::c_int;

use super::{
    segment::{self, SegmentError, State, state},
    trace,
};

/// Creates the segment with header flags `marks` (`ready` set at once or
/// not) and the process's recording file beside it.
fn build(marks: u32, ready: bool) -> Result<State, SegmentError> {
    let s = segment::build(
        marks,
        ready,
        segment::callsites(),
        segment::waits(),
        &segment::EARLY,
    )?;
    // The rings of `mpi-observer record`, in a file of their own.
    let mut rank: c_int = 0;
    // SAFETY: the library's PMPI_Comm_rank with an out-pointer.
    if unsafe { (s.abi.comm_rank)(s.abi.comm_world, &mut rank) } == 0 {
        trace::create(rank.max(0) as u32, s.world_size, s.path());
    }
    Ok(s)
}

/// Creates the segment and publishes the state; on failure prints one line
/// and leaves the layer a pass-through. Called after the library's
/// `MPI_Init` succeeded, once.
pub(crate) fn init() {
    if state().is_some() {
        return;
    }
    match build(0, true) {
        Ok(s) => publish(s),
        Err(e) => {
            let line = format!(
                "mpi-observer-shim: stats: {e}; the stats layer passes calls through (pid {})\n",
                std::process::id()
            );
            // SAFETY: one write(2) of an owned buffer, so ranks do not interleave.
            unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
        }
    }
}

/// Publishes the state: the layer counts from the next call on.
fn publish(s: State) {
    segment::publish(s);
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    // A program that exits without MPI_Finalize still removes its file.
    // SAFETY: registers a plain extern "C" fn.
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(at_exit);
    });
}

/// The segment of a shim injected into a running process (crate::inject):
/// created with the `INJECTED` flag and not ready, and not yet published.
pub(crate) struct Prepared(State);

/// Creates an injected shim's segment, MPI being initialised already.
pub(crate) fn prepare_injected() -> Result<Prepared, SegmentError> {
    build(observer_common::segment::flags::INJECTED, false).map(Prepared)
}

impl Prepared {
    /// Publishes the state (the commit, before the first call is routed
    /// to the shim); the header stays not ready until
    /// [`segment::mark_ready`].
    pub(crate) fn publish(self) {
        publish(self.0);
    }

    /// Removes the file and the mapping (an aborted injection: nothing
    /// ever saw the state).
    pub(crate) fn discard(self) {
        self.0.discard();
        trace::finish();
    }
}

/// Unlinks the segment's file: the daemon keeps its own descriptor once it
/// has found the segment, so the final figures stay readable to it, and
/// nothing is left behind in `/dev/shm`. A daemon that has not found it
/// yet is told first, and opens it before the unlink (the exit knock,
/// [`super::exit_handover`]). The mapping stays: later counters still land in
/// the pages the daemon's descriptor reads.
pub(crate) fn finish() {
    if let Some(s) = state() {
        if s.created_here() {
            super::exit_handover::knock();
        }
        s.unlink();
    }
    trace::finish();
}

/// [`finish`] at exit, in the creating process only: a child forked
/// without exec inherits the handler, and its exit must not remove the
/// parent's live segment.
extern "C" fn at_exit() {
    if state().is_some_and(State::created_here) {
        finish();
    }
}
