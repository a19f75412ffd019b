//! The tracer: `PTRACE_SEIZE`, the signal-delivery stop at an MPI call,
//! registers, and relaying the threads' own signals.

use std::{
    io, thread,
    time::{Duration, Instant},
};

use super::*;

/// The threads of one process, traced with `PTRACE_SEIZE` by the calling
/// thread (tracing belongs to a thread, not to the daemon).
pub(super) struct Tracer {
    pub(super) pid: u32,
    /// The trigger's signal: the only one a relay drops.
    pub(super) signal: i32,
    pub(super) tids: Vec<u32>,
}

impl Tracer {
    /// Seizes every thread; seizing stops nothing.
    pub(super) fn seize(pid: u32, signal: i32) -> Result<Tracer, InjectError> {
        let mut t = Tracer {
            pid,
            signal,
            tids: Vec::new(),
        };
        // Threads may be created meanwhile: until a pass finds none new.
        loop {
            let mut new = 0;
            for tid in procfs::threads(pid).map_err(|_| InjectError::Gone { pid })? {
                if t.tids.contains(&tid) {
                    continue;
                }
                // SAFETY: plain ptrace request on a thread id.
                let r = unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) };
                if r == 0 {
                    t.tids.push(tid);
                    new += 1;
                } else {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() != Some(libc::ESRCH) {
                        return Err(os_or_permission(pid, "PTRACE_SEIZE", e));
                    }
                }
            }
            if new == 0 {
                break;
            }
        }
        if t.tids.is_empty() {
            return Err(InjectError::Gone { pid });
        }
        Ok(t)
    }

    /// Waits for the signal-delivery stop of `signal` on a thread at an
    /// MPI entry (in `lib`, not in a system call), relaying every other
    /// stop. A stop that does not qualify is resumed and the trigger
    /// re-armed through `arm`.
    pub(super) fn wait_for_stop(
        &mut self,
        signal: i32,
        lib: (u64, u64),
        timeout: Duration,
        arm: &dyn Fn(bool) -> Result<(), InjectError>,
    ) -> Result<(u32, regs::Regs, Instant), InjectError> {
        let t = Instant::now();
        loop {
            for (tid, status) in self.stops()? {
                let sig = libc::WSTOPSIG(status);
                if sig == signal && status >> 16 == 0 {
                    let at = Instant::now();
                    let r = self.regs(tid)?;
                    let pc = regs::pc(&r);
                    let in_lib = pc >= lib.0 && pc < lib.1;
                    if in_lib && regs::outside_syscall(&r) {
                        return Ok((tid, r, at));
                    }
                    self.resume(tid, 0)?;
                    arm(true)?;
                } else {
                    self.relay(tid, status)?;
                }
            }
            if t.elapsed() > timeout {
                return Err(InjectError::NoCall {
                    pid: self.pid,
                    secs: timeout.as_secs(),
                    signal,
                });
            }
            thread::sleep(POLL);
        }
    }

    /// Stops that happened since the last look: (tid, wait status).
    pub(super) fn stops(&mut self) -> Result<Vec<(u32, i32)>, InjectError> {
        let mut out = Vec::new();
        let mut gone = Vec::new();
        for &tid in &self.tids {
            let mut status = 0;
            // SAFETY: waitpid on a traced thread, no hang.
            let r = unsafe { libc::waitpid(tid as i32, &mut status, libc::WNOHANG | libc::__WALL) };
            if r == tid as i32 {
                if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                    gone.push(tid);
                } else if libc::WIFSTOPPED(status) {
                    out.push((tid, status));
                }
            } else if r < 0 {
                gone.push(tid);
            }
        }
        self.tids.retain(|t| !gone.contains(t));
        if self.tids.is_empty() {
            return Err(InjectError::Gone { pid: self.pid });
        }
        Ok(out)
    }

    /// Lets a stop that is not ours go on as it would have: a signal is
    /// delivered, a group stop stays a stop.
    pub(super) fn relay(&self, tid: u32, status: i32) -> Result<(), InjectError> {
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        if event == libc::PTRACE_EVENT_STOP {
            if matches!(
                sig,
                libc::SIGSTOP | libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU
            ) {
                // SAFETY: plain ptrace request.
                unsafe { libc::ptrace(libc::PTRACE_LISTEN, tid, 0, 0) };
                return Ok(());
            }
            return self.resume(tid, 0);
        }
        // Our own signal, raced here by a second thread: dropped. The
        // other one of STOP_SIGNALS is the process's own (it may catch
        // it): delivered like any other.
        let ours = sig == self.signal;
        self.resume(tid, if ours && event == 0 { 0 } else { sig })
    }

    /// Relays every pending stop (while the stub runs).
    pub(super) fn relay_signals(&mut self) -> Result<(), InjectError> {
        for (tid, status) in self.stops()? {
            self.relay(tid, status)?;
        }
        Ok(())
    }

    pub(super) fn regs(&self, tid: u32) -> Result<regs::Regs, InjectError> {
        regs::get(self.pid, tid)
    }

    pub(super) fn set_regs(&self, tid: u32, r: &regs::Regs) -> Result<(), InjectError> {
        regs::set(self.pid, tid, r)
    }

    pub(super) fn resume(&self, tid: u32, sig: i32) -> Result<(), InjectError> {
        // SAFETY: plain ptrace request on a stopped tracee.
        let r = unsafe { libc::ptrace(libc::PTRACE_CONT, tid, 0, sig as libc::c_long) };
        if r != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) {
            return Err(InjectError::Os {
                pid: self.pid,
                what: "PTRACE_CONT",
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }
}
