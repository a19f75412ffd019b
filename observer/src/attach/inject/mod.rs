//! `mpi-observer attach --inject`, the mechanism: loading the shim into a
//! running rank and routing its MPI calls through it, so it runs at the
//! shim's cost instead of the probes' ([`load_shim`]). Which ranks, when,
//! and the handover are the daemon's (`crate::daemon::inject`). The design
//! and why is in docs/inject.md; in short:
//!
//! 1. **Where to stop.** One thread, at the entry of an application-level
//!    MPI call: the probes' entry program, armed through the process's
//!    `ProcConfig::inject_signal`, sends that thread a signal whose default
//!    action is to be ignored, and the daemon, tracing the process
//!    (`PTRACE_SEIZE`, which stops nothing), takes the signal-delivery stop.
//!    That thread is calling into MPI from outside the library, so it holds
//!    none of the library's locks and is in neither the dynamic loader nor
//!    malloc; the other threads keep running, so whatever lock they hold,
//!    they release, and the `dlopen` below waits for it as the
//!    application's own would.
//! 2. **What runs.** [`stub`] is written into the unused tail of a code page
//!    (past the end of libc's executable segment), its data block into the
//!    unused tail of a writable page (past the end of libc's `.bss`), and
//!    its strings under the thread's red zone; all of it is read back
//!    before the thread's `rip` is pointed at the stub and the thread resumed:
//!    from then on it is independent of the daemon. It `dlopen`s the shim
//!    and calls its injection entry, which builds the stack and segment,
//!    waits for the daemon's go (after the daemon has told the probes to
//!    ignore calls made from the shim's code), rewrites the GOT slots and
//!    returns; the stub restores every register and jumps back.
//! 3. **Handover** (the daemon's): once no call the probes are timing is
//!    open, the rank's probes are detached; what they counted stays, and
//!    the segment adds to it.
//!
//! Every step has a time limit. The tracing is done on a thread of its own
//! that exits when the stub is done: the kernel then detaches the process,
//! as it does if the daemon is killed, and no thread is left stopped.

mod loader;
mod maps;
mod mem;
mod ptrace;
mod regs;
pub mod stub;

use std::{
    io,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use observer_common::inject::{INJECT_SYMBOL, MAGIC, Mailbox, VERSION, go, state};
use thiserror::Error;

use self::{
    loader::Loader,
    maps::{Maps, Perm, read_mapped},
    mem::Mem,
    ptrace::Tracer,
};
use crate::os::procfs;

/// The file name of the shim.
const SHIM_NAME: &str = "libmpi_observer_shim.so";
/// How long the shim waits for the daemon's go before it undoes itself.
const GO_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `dlopen` and the shim's preparation may take by default
/// (`attach --inject-load-timeout`).
pub const DEFAULT_LOAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the daemon looks at the threads and the mailbox.
const POLL: Duration = Duration::from_micros(200);

/// Why an injection did not happen; the rank is then as it was, observed
/// by its probes.
#[derive(Debug, Error)]
pub enum InjectError {
    /// No ptrace permission.
    #[error(
        "pid {pid}: cannot trace it ({source}); --inject needs CAP_SYS_PTRACE over the process, and Yama's kernel.yama.ptrace_scope is {scope} (3 forbids tracing)"
    )]
    Permission {
        /// The rank.
        pid: u32,
        /// `/proc/sys/kernel/yama/ptrace_scope`, or "absent".
        scope: String,
        /// The error.
        source: io::Error,
    },
    /// A debugger or tracer holds the process already.
    #[error(
        "pid {pid} is already traced by pid {tracer} ({comm}), and a process has one tracer: detach that one to inject"
    )]
    Traced {
        /// The rank.
        pid: u32,
        /// Its tracer.
        tracer: u32,
        /// The tracer's command name.
        comm: String,
    },
    /// No dynamic loader to load the shim with.
    #[error(
        "pid {pid} ({comm}) has no dlopen in a mapped libc (a static binary, or a libc other than glibc): the shim cannot be loaded into it"
    )]
    Static {
        /// The rank.
        pid: u32,
        /// Its command name.
        comm: String,
    },
    /// The library's conventions are unknown to the stats layer.
    #[error(
        "pid {pid}: its MPI library ({library}) has an ABI the shim's stats layer does not read; nothing injected"
    )]
    UnknownAbi {
        /// The rank.
        pid: u32,
        /// The library's path.
        library: String,
    },
    /// The shim is there already.
    #[error(
        "pid {pid} already has the shim loaded (preloaded, or injected by an earlier daemon); not injected again: a live shim counts its calls, otherwise its probes do"
    )]
    AlreadyLoaded {
        /// The rank.
        pid: u32,
    },
    /// The tools list lacks `stats`.
    #[error(
        "--inject-tools {tools:?} lacks `stats`: an injected rank loses its probes, so its calls are counted by the stats layer"
    )]
    NoStats {
        /// The list.
        tools: String,
    },
    /// The rank has no probes: the stop point is the probes'.
    #[error("pid {pid} carries no probes to stop it with (--no-bpf, or its shim already times it)")]
    NotProbed {
        /// The rank.
        pid: u32,
    },
    /// No MPI call came within `--inject-timeout`: the daemon stopped
    /// tracing the rank, and the trigger stays armed (the daemon's watcher
    /// starts the injection again at the rank's next call).
    #[error("pid {pid} made no MPI call within {secs} s to be stopped at; nothing injected")]
    NoCall {
        /// The rank.
        pid: u32,
        /// The limit.
        secs: u64,
        /// The signal the armed trigger raises.
        signal: i32,
    },
    /// No unused code bytes.
    #[error("pid {pid}: no unused tail of a code page holds the {need}-byte loader stub")]
    NoRoom {
        /// The rank.
        pid: u32,
        /// Bytes needed.
        need: usize,
    },
    /// `dlopen` or `dlsym` failed in the target.
    #[error("pid {pid}: loading the shim failed: {message}")]
    Load {
        /// The rank.
        pid: u32,
        /// `dlerror()`.
        message: String,
    },
    /// The shim undid itself.
    #[error("pid {pid}: the shim undid the injection: {message}")]
    Aborted {
        /// The rank.
        pid: u32,
        /// Its one line.
        message: String,
    },
    /// A step took too long.
    #[error("pid {pid}: {step} took longer than {secs} s")]
    Timeout {
        /// The rank.
        pid: u32,
        /// Which step.
        step: &'static str,
        /// The limit.
        secs: u64,
    },
    /// The process went away.
    #[error("pid {pid} exited during the injection")]
    Gone {
        /// The rank.
        pid: u32,
    },
    /// The only unused code bytes are beyond the reach of the stub's
    /// branch back (aarch64: 128 MiB).
    #[error(
        "pid {pid}: the unused code bytes at {code_at:#x} are too far from its MPI library for the loader stub's branch back; nothing injected (start the job under `mpi-observer run` to have the shim from its start)"
    )]
    TooFar {
        /// The rank.
        pid: u32,
        /// Where the stub would have gone.
        code_at: u64,
    },
    /// This build has no loader stub for its instruction set.
    #[error(
        "pid {pid}: attach --inject is not available on {arch}; start the job under `mpi-observer run`, or with `srun --mpi-observer` on Slurm, to have the shim from its start"
    )]
    Unsupported {
        /// The rank.
        pid: u32,
        /// The instruction set (`std::env::consts::ARCH`).
        arch: &'static str,
    },
    /// A system call failed.
    #[error("pid {pid}: {what}: {source}")]
    Os {
        /// The rank.
        pid: u32,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
}

/// What the injection needs of the rank's probes, which only the caller
/// (the daemon, under its state lock) holds: the stop point is theirs, and
/// the handover ends their counting.
pub trait ProbeControl {
    /// Arms (`on`) or clears the trigger: the probes' entry program raises
    /// `signal` on the thread of the next application-level MPI call into
    /// `lib_text` (the MPI library's code range).
    fn arm(&self, on: bool, signal: i32, lib_text: (u64, u64)) -> Result<(), InjectError>;
    /// Has the probes ignore calls made from `[lo, hi)`, the shim's code
    /// (`0, 0`: none).
    fn set_skip(&self, lo: u64, hi: u64) -> Result<(), InjectError>;
    /// Has the probes record no new call: the shim counts from now on.
    fn hand_over(&self) -> Result<(), InjectError>;
}

/// Where and what to load.
#[derive(Clone, Copy, Debug)]
pub struct Target<'a> {
    /// The rank's MPI library, as it maps it.
    pub lib_path: &'a Path,
    /// The shim, as the process sees it (an absolute path).
    pub shim: &'a Path,
    /// The tools list for the rank.
    pub tools: &'a str,
    /// How long to wait for the rank's next MPI call.
    pub timeout: Duration,
    /// How long `dlopen` and the shim's preparation may take in the rank.
    pub load_timeout: Duration,
}

/// A shim loaded and committed in a rank.
#[derive(Clone, Copy, Debug)]
pub struct Loaded {
    /// The thread that ran the stub.
    pub tid: u32,
    /// How long that thread was stopped.
    pub stopped: Duration,
    /// From the stop to the shim's commit.
    pub loaded: Duration,
    /// GOT slots routed through the shim.
    pub slots: u32,
}

/// Loads the shim into `pid` and has it commit (steps 1 and 2 of the
/// module docs): traces the process, stops one thread at an MPI call
/// through `probes`' trigger, writes and runs the stub, and follows the
/// shim's mailbox until it is done. Every step has a time limit; whatever
/// happens, the process ends untraced.
pub fn load_shim(
    pid: u32,
    target: &Target<'_>,
    probes: &(dyn ProbeControl + Sync),
) -> Result<Loaded, InjectError> {
    if !regs::supported() {
        return Err(InjectError::Unsupported {
            pid,
            arch: std::env::consts::ARCH,
        });
    }
    let maps = Maps::read(pid)?;
    if maps.has_file_named(SHIM_NAME) {
        return Err(InjectError::AlreadyLoaded { pid });
    }
    let libc = Loader::find(pid, &maps)?;
    let lib_text = maps
        .code_of(target.lib_path)
        .ok_or(InjectError::Gone { pid })?;
    let path = target.shim.to_str().expect("UTF-8 shim path");
    let strings = [path.as_bytes(), b"\0", target.tools.as_bytes(), b"\0"].concat();
    if strings.len() as u64 > stub::STACK_RESERVED - 128 {
        return Err(InjectError::NoRoom {
            pid,
            need: strings.len(),
        });
    }
    let mem = Mem::open(pid)?;
    let code_at = maps
        .slack(&mem, stub::code_size(), Perm::Exec)?
        .ok_or(InjectError::NoRoom {
            pid,
            need: stub::code_size(),
        })?;
    let data_at = maps
        .slack(&mem, size_of::<stub::Data>(), Perm::Write)?
        .ok_or(InjectError::NoRoom {
            pid,
            need: size_of::<stub::Data>(),
        })?;
    let signal = free_signal(pid)?;
    let mut data = stub::Data {
        mailbox: Mailbox {
            magic: MAGIC,
            version: VERSION,
            timeout_ms: GO_TIMEOUT.as_millis() as u32,
            dlopen_flags: libc::RTLD_NOW as u32,
            ..Mailbox::default()
        },
        dlopen: libc.dlopen,
        dlsym: libc.dlsym,
        dlerror: libc.dlerror,
        ..stub::Data::default()
    };
    data.entry[..INJECT_SYMBOL.len()].copy_from_slice(INJECT_SYMBOL);
    let arm = |on: bool| probes.arm(on, signal, lib_text);
    let set_skip = |lo: u64, hi: u64| probes.set_skip(lo, hi);
    let hand_over = || probes.hand_over();
    // The tracing phase, on a thread of its own: when it ends, for
    // whatever reason, the kernel detaches every thread it traced.
    let traced = thread::scope(|s| {
        s.spawn(|| {
            let mut tracer = Tracer::seize(pid, signal)?;
            arm(true)?;
            let stop = tracer.wait_for_stop(signal, lib_text, target.timeout, &arm);
            // No call in time: the trigger stays armed, and this thread's
            // end detaches the process ([`start`] watches the trigger).
            if !matches!(stop, Err(InjectError::NoCall { .. })) {
                arm(false)?;
            }
            let (tid, stopped, stopped_at) = stop?;
            // Everything is written and read back while the thread is
            // stopped and untouched; only then is it pointed at the stub.
            // Any failure before that resumes it as it was.
            let mut hijack = || -> Result<(), InjectError> {
                // The strings under the red zone, where the stub's own
                // frame (below STACK_RESERVED) does not reach.
                let strings_at = (regs::sp(&stopped) - 128 - strings.len() as u64) & !15;
                data.mailbox.path = strings_at;
                data.mailbox.tools = strings_at + path.len() as u64 + 1;
                let code = stub::code_bytes(
                    &stub::Tail {
                        data: data_at,
                        resume: regs::pc(&stopped),
                        ip0: regs::ip0(&stopped),
                    },
                    code_at,
                )
                .ok_or(InjectError::TooFar { pid, code_at })?;
                let block = stub::data_bytes(&data);
                mem.write(strings_at, &strings)?;
                mem.write(data_at, &block)?;
                mem.write(code_at, &code)?;
                for (at, want) in [(strings_at, &strings), (data_at, &block), (code_at, &code)] {
                    let mut back = vec![0; want.len()];
                    mem.read(at, &mut back)?;
                    if back != *want {
                        return Err(InjectError::Os {
                            pid,
                            what: "writing the loader stub",
                            source: io::Error::other("the bytes read back differ"),
                        });
                    }
                }
                let mut hijacked = stopped;
                regs::set_pc(&mut hijacked, code_at);
                tracer.set_regs(tid, &hijacked)
            };
            if let Err(e) = hijack() {
                let _ = tracer.resume(tid, 0);
                return Err(e);
            }
            tracer.resume(tid, 0)?;
            let stopped = stopped_at.elapsed();
            let outcome = converse(
                pid,
                &mem,
                data_at,
                &mut tracer,
                target.load_timeout,
                &set_skip,
                &hand_over,
            );
            Ok::<_, InjectError>((tid, stopped, stopped_at.elapsed(), outcome?))
        })
        .join()
        .unwrap_or_else(|_| {
            Err(InjectError::Os {
                pid,
                what: "the tracing thread",
                source: io::Error::other("panicked"),
            })
        })
    });
    match traced {
        Ok((tid, stopped, loaded, slots)) => Ok(Loaded {
            tid,
            stopped,
            loaded,
            slots,
        }),
        Err(e) => {
            let _ = set_skip(0, 0);
            Err(e)
        }
    }
}

/// Asks the shim of an injected rank to put every slot back at its next
/// call (docs/inject.md, "Detach"); waits up to `wait` for it.
pub fn eject(pid: u32, wait: Duration) -> Result<bool, InjectError> {
    let maps = Maps::read(pid)?;
    let mem = Mem::open(pid)?;
    let Some(mb) = maps.mailbox(&mem)? else {
        return Ok(false);
    };
    mem.write(
        mb + core::mem::offset_of!(Mailbox, go) as u64,
        &go::EJECT.to_ne_bytes(),
    )?;
    let t = Instant::now();
    while t.elapsed() < wait {
        if mem.u32(mb + core::mem::offset_of!(Mailbox, state) as u64)? == state::EJECTED {
            return Ok(true);
        }
        thread::sleep(Duration::from_millis(1));
    }
    Ok(false)
}

/// Follows the mailbox from the stub's start to its end: sets the skip
/// range and says go when the shim is prepared, and once it has committed
/// stops the probes recording new calls and says so; relays the threads'
/// own signals meanwhile. Returns the slots rewritten.
fn converse(
    pid: u32,
    mem: &Mem,
    mb: u64,
    tracer: &mut Tracer,
    load_timeout: Duration,
    set_skip: &dyn Fn(u64, u64) -> Result<(), InjectError>,
    hand_over: &dyn Fn() -> Result<(), InjectError>,
) -> Result<u32, InjectError> {
    let field = |f: usize| mb + f as u64;
    let t = Instant::now();
    let mut said_go = false;
    let mut handed = false;
    loop {
        tracer.relay_signals()?;
        let s = mem.u32(field(core::mem::offset_of!(Mailbox, state)))?;
        match s {
            state::PREPARED if !said_go => {
                let lo = mem.u64(field(core::mem::offset_of!(Mailbox, shim_lo)))?;
                let hi = mem.u64(field(core::mem::offset_of!(Mailbox, shim_hi)))?;
                let go_word = match set_skip(lo, hi) {
                    Ok(()) => go::GO,
                    Err(_) => go::ABORT,
                };
                mem.write(
                    field(core::mem::offset_of!(Mailbox, go)),
                    &go_word.to_ne_bytes(),
                )?;
                said_go = true;
            }
            state::COMMITTED if !handed => {
                // Committed: the slots are the shim's. If the map update
                // failed the probes keep recording until they are detached
                // below; the shim's wait ends at its timeout.
                if hand_over().is_ok() {
                    mem.write(
                        field(core::mem::offset_of!(Mailbox, go)),
                        &go::HANDED.to_ne_bytes(),
                    )?;
                }
                handed = true;
            }
            state::DONE => {
                let outcome = mem.u32(field(core::mem::offset_of!(Mailbox, outcome)))?;
                if outcome == state::COMMITTED && !handed {
                    let _ = hand_over();
                }
                let message = || {
                    mem.u64(field(core::mem::offset_of!(Mailbox, error)))
                        .and_then(|p| mem.c_string(p))
                        .unwrap_or_else(|_| "no message".into())
                };
                return match outcome {
                    state::COMMITTED => Ok(mem.u32(field(core::mem::offset_of!(Mailbox, slots)))?),
                    state::LOAD_FAILED => Err(InjectError::Load {
                        pid,
                        message: message(),
                    }),
                    _ => Err(InjectError::Aborted {
                        pid,
                        message: message(),
                    }),
                };
            }
            _ => {}
        }
        if t.elapsed() > load_timeout + GO_TIMEOUT {
            // The shim undoes itself when no go comes; say so at once.
            let _ = mem.write(
                field(core::mem::offset_of!(Mailbox, go)),
                &go::ABORT.to_ne_bytes(),
            );
            return Err(InjectError::Timeout {
                pid,
                step: stuck_in(s),
                secs: (load_timeout + GO_TIMEOUT).as_secs(),
            });
        }
        thread::sleep(POLL);
    }
}

/// What a load that did not end was doing, from the mailbox's last state:
/// where to look.
fn stuck_in(s: u32) -> &'static str {
    match s {
        state::WRITTEN => "loading the shim (the stub never ran)",
        state::LOADING => {
            "loading the shim (in dlopen, or the shim's entry before its stack was built)"
        }
        state::PREPARED => "loading the shim (prepared, waiting for the go)",
        state::COMMITTED => "loading the shim (committed, waiting for the handover)",
        _ => "loading the shim",
    }
}

/// The signals the trigger may raise: both are ignored by default (the
/// test `stop_signals_are_ignored_by_default` holds the kernel to it), so
/// a raise that no tracer takes, the daemon gone or the injection waiting
/// untraced for the rank's next call, does nothing to a process that does
/// not catch it.
pub const STOP_SIGNALS: [i32; 2] = [libc::SIGURG, libc::SIGWINCH];

/// Whether process `pid` catches signal `sig` now (`SigCgt`); an
/// unreadable status counts as caught.
pub fn catches(pid: u32, sig: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("SigCgt:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_none_or(|caught| caught & (1 << (sig - 1)) != 0)
}

/// A signal whose default action is to be ignored and that the process
/// does not catch: if the daemon dies before it takes the stop, the
/// delivery does nothing.
pub fn free_signal(pid: u32) -> Result<i32, InjectError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|source| {
        InjectError::Os {
            pid,
            what: "reading /proc/PID/status",
            source,
        }
    })?;
    let caught = status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(u64::MAX);
    STOP_SIGNALS
        .into_iter()
        .find(|&s| caught & (1 << (s - 1)) == 0)
        .ok_or_else(|| InjectError::Os {
            pid,
            what: "choosing a stop signal",
            source: io::Error::other("the process catches both SIGURG and SIGWINCH"),
        })
}

fn os_or_permission(pid: u32, what: &'static str, source: io::Error) -> InjectError {
    if matches!(
        source.raw_os_error(),
        Some(libc::EPERM) | Some(libc::EACCES)
    ) {
        if let Some(tracer) = tracer_of(pid) {
            return InjectError::Traced {
                pid,
                tracer,
                comm: procfs::comm(tracer),
            };
        }
        InjectError::Permission {
            pid,
            scope: std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "absent".into()),
            source,
        }
    } else if source.raw_os_error() == Some(libc::ESRCH) {
        InjectError::Gone { pid }
    } else {
        InjectError::Os { pid, what, source }
    }
}

/// The tracer (a thread id) of any thread of `pid`, unless it is one of
/// this process's threads.
fn tracer_of(pid: u32) -> Option<u32> {
    procfs::threads(pid).ok()?.into_iter().find_map(|tid| {
        std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|&t| t != 0 && !Path::new(&format!("/proc/self/task/{t}")).exists())
    })
}

/// Whether any thread of `pid` is stopped (state `T` or `t`), for tests
/// and the injector's own checks.
pub fn stopped_threads(pid: u32) -> Vec<u32> {
    procfs::threads(pid)
        .unwrap_or_default()
        .into_iter()
        .filter(|tid| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .and_then(|(_, r)| r.split_whitespace().next().map(str::to_string))
                })
                .is_some_and(|st| st == "T" || st == "t")
        })
        .collect()
}

/// Whether process `pid` is still there (and not a zombie).
pub fn exists(pid: u32) -> bool {
    procfs::stat(pid).is_ok_and(|s| !s.is_dead())
}

#[cfg(test)]
mod tests {
    use std::{os::unix::process::CommandExt as _, process::Command};

    use super::*;

    /// A child with every signal at its default action and unblocked.
    fn child() -> std::process::Child {
        let mut c = Command::new("sleep");
        c.arg("5");
        // SAFETY: async-signal-safe calls only, between fork and exec.
        unsafe {
            c.pre_exec(|| {
                let mut set: libc::sigset_t = core::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigprocmask(libc::SIG_SETMASK, &set, core::ptr::null_mut());
                for s in STOP_SIGNALS.into_iter().chain([libc::SIGUSR1]) {
                    libc::signal(s, libc::SIG_DFL);
                }
                Ok(())
            })
        };
        c.spawn().expect("spawn sleep")
    }

    /// Whether `sig`, sent to a process that does not catch it, leaves it
    /// running.
    fn survives(sig: i32) -> bool {
        let mut c = child();
        thread::sleep(Duration::from_millis(50));
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(c.id() as i32, sig) };
        thread::sleep(Duration::from_millis(200));
        let alive = c.try_wait().expect("try_wait").is_none();
        let _ = c.kill();
        let _ = c.wait();
        alive
    }

    /// The trigger's signals must be ignored by default: a raise nobody
    /// takes (the daemon gone, or the injection waiting untraced for the
    /// rank's next call) must never end the job.
    #[test]
    fn stop_signals_are_ignored_by_default() {
        for sig in STOP_SIGNALS {
            assert!(survives(sig), "signal {sig} ends a process by default");
        }
        // The check can fail: a signal whose default action is to end the
        // process does.
        assert!(!survives(libc::SIGUSR1));
    }
}
