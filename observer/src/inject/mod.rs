//! `mpi-observer attach --inject`: loading the shim into a running rank and
//! routing its MPI calls through it, so it runs at the shim's cost instead
//! of the probes'. The design and why is in docs/inject.md; in short:
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
//! 3. **Handover.** Once no call the probes are timing is open, the rank's
//!    probes are detached; what they counted stays, and the segment adds to
//!    it (`registry::rank_calls`).
//!
//! Every step has a time limit. The tracing is done on a thread of its own
//! that exits when the stub is done: the kernel then detaches the process,
//! as it does if the daemon is killed, and no thread is left stopped.
//!
//! 4. **No call in time.** A rank that makes no MPI call within
//!    `--inject-timeout` is let go, untraced, with its trigger armed: its
//!    next call clears it (the ignored signal does nothing), one watcher
//!    thread sees that and starts the injection again ([`start`]).

pub mod stub;

use std::{
    fs::File,
    io,
    os::unix::fs::FileExt as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use observer_common::{
    inject::{INJECT_SYMBOL, MAGIC, Mailbox, VERSION, go, state},
    maps::lib_kind,
};
use thiserror::Error;

use crate::{procfs, registry::State};

/// The file name of the shim.
const SHIM_NAME: &str = "libmpi_observer_shim.so";
/// How long the shim waits for the daemon's go before it undoes itself.
const GO_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `dlopen` and the shim's preparation may take.
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the handover waits for the calls the probes are timing.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the daemon looks at the threads and the mailbox.
const POLL: Duration = Duration::from_micros(200);

/// What to inject where.
#[derive(Clone, Debug)]
pub struct Request {
    /// The rank.
    pub pid: u32,
    /// The shim, as the process sees it (an absolute path).
    pub shim: PathBuf,
    /// The tools list for the rank; it includes `stats`.
    pub tools: String,
    /// How long to wait for the rank's next MPI call.
    pub timeout: Duration,
}

/// A finished injection.
#[derive(Clone, Copy, Debug)]
pub struct Injected {
    /// The thread that ran the stub.
    pub tid: u32,
    /// GOT slots routed through the shim.
    pub slots: u32,
    /// How long that thread was stopped.
    pub stopped: Duration,
    /// From the stop to the shim's commit.
    pub loaded: Duration,
    /// From the request to the handover.
    pub total: Duration,
    /// Calls the probes were timing when the handover had to go ahead
    /// without them (0 unless the drain timed out).
    pub lost_in_flight: usize,
}

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
    /// tracing the rank, and the trigger stays armed ([`start`]).
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

/// How often the watcher looks at the armed triggers of ranks that made
/// no MPI call within `--inject-timeout`.
const WATCH_POLL: Duration = Duration::from_millis(10);
/// How often it checks that such a rank still does not catch the signal
/// its trigger raises.
const WATCH_SIGNALS: Duration = Duration::from_secs(1);

/// Ranks whose injection waits, untraced, for their next MPI call: the
/// trigger (`ProcConfig::inject_signal`) stays armed in the probes' map,
/// and one watcher thread, [`watch`], starts the injection again once the
/// entry program has cleared it. Bounded by the ranks attached (one entry
/// per rank).
struct Armed {
    /// The ranks waiting, with the signal their trigger raises.
    ranks: Vec<(Request, i32)>,
    /// Whether the watcher thread runs.
    watching: bool,
    /// Set at shutdown: nothing is armed or started any more.
    closed: bool,
}

static ARMED: Mutex<Armed> = Mutex::new(Armed {
    ranks: Vec::new(),
    watching: false,
    closed: false,
});

fn armed() -> std::sync::MutexGuard<'static, Armed> {
    ARMED.lock().unwrap_or_else(|p| p.into_inner())
}

/// Injects the shim into `req.pid` on a thread of its own, with one line on
/// stderr when it is done or refused. A rank that makes no MPI call within
/// `req.timeout` is let go (no tracer holds it while it computes) with
/// its trigger armed, and one line says so; at its next application-level
/// MPI call, whenever it comes, the entry program clears the trigger (the
/// signal it raises is ignored, nobody tracing), [`watch`] sees that and
/// the injection starts again, stopping the rank at one of the calls that
/// follow. Its probes count until the handover.
pub fn start(state: &Arc<Mutex<State>>, req: Request) {
    if armed().closed {
        return;
    }
    let state = state.clone();
    thread::spawn(move || attempt(&state, req, true));
}

/// One injection attempt and its line; `first` is false for the attempts
/// [`watch`] starts, which say nothing when the rank goes quiet again.
fn attempt(state: &Arc<Mutex<State>>, req: Request, first: bool) {
    let pid = req.pid;
    match inject(state, &req) {
        Ok(i) => {
            eprintln!(
                "mpi-observer: injected the shim into pid {pid}: {} slots, thread {} stopped {:.2} ms, shim live after {:.1} ms, {:.0} ms in all",
                i.slots,
                i.tid,
                i.stopped.as_secs_f64() * 1e3,
                i.loaded.as_secs_f64() * 1e3,
                i.total.as_secs_f64() * 1e3,
            );
            if i.lost_in_flight > 0 {
                eprintln!(
                    "mpi-observer: pid {pid}: {} calls were still open after {}s when its probes went; they are not counted",
                    i.lost_in_flight,
                    DRAIN_TIMEOUT.as_secs()
                );
            }
        }
        Err(InjectError::NoCall { secs, signal, .. }) => {
            let mut a = armed();
            if a.closed {
                drop(a);
                disarm(state, pid);
                return;
            }
            if first {
                eprintln!(
                    "mpi-observer: pid {pid} made no MPI call within {secs} s; the injection stays armed, untraced, and happens at its next MPI calls; its probes count until then"
                );
            }
            if !a.ranks.iter().any(|(r, _)| r.pid == pid) {
                a.ranks.push((req, signal));
            }
            if !a.watching {
                a.watching = true;
                let state = state.clone();
                thread::spawn(move || watch(&state));
            }
        }
        Err(e @ InjectError::AlreadyLoaded { .. }) => eprintln!("mpi-observer: {e}"),
        Err(e) => eprintln!("mpi-observer: {e}; it stays observed by probes"),
    }
}

/// The watcher: every [`WATCH_POLL`], reads the trigger of each armed rank
/// (one map lookup each, under the state lock) and starts the injection of
/// those whose trigger the entry program cleared; forgets ranks that exited
/// or lost their probes; every [`WATCH_SIGNALS`], re-checks that a rank
/// still ignores its trigger's signal, and moves the trigger to the other
/// one (or disarms it, with a line) if it started catching it, so a raise
/// never reaches a handler. Ends when no rank is armed.
fn watch(state: &Arc<Mutex<State>>) {
    let mut checked = Instant::now();
    loop {
        thread::sleep(WATCH_POLL);
        let check_signals = checked.elapsed() >= WATCH_SIGNALS;
        if check_signals {
            checked = Instant::now();
        }
        let mut a = armed();
        if a.closed || a.ranks.is_empty() {
            a.watching = false;
            return;
        }
        // One lock of the state per look, for every armed rank.
        let triggers: Vec<Option<u32>> = {
            let st = state.lock().unwrap_or_else(|p| p.into_inner());
            a.ranks
                .iter()
                .map(|(req, _)| {
                    let live = st
                        .rank(req.pid)
                        .is_some_and(|r| r.is_probed() && r.exited_at.is_none());
                    live.then(|| st.probes.as_ref()?.config(req.pid))
                        .flatten()
                        .map(|c| c.inject_signal)
                })
                .collect()
        };
        let mut fired = Vec::new();
        let mut kept = Vec::with_capacity(a.ranks.len());
        for ((req, signal), trigger) in std::mem::take(&mut a.ranks).into_iter().zip(triggers) {
            let pid = req.pid;
            match trigger {
                // The rank exited or lost its probes: nothing to inject.
                None => {}
                Some(0) => fired.push(req),
                Some(_) if check_signals && catches(pid, signal) => {
                    let other = free_signal(pid).ok();
                    match other.filter(|&s| set_trigger(state, pid, s).is_ok()) {
                        Some(s) => kept.push((req, s)),
                        None => {
                            disarm(state, pid);
                            eprintln!(
                                "mpi-observer: pid {pid} now catches both SIGURG and SIGWINCH, which the injection's trigger raises; not injected, it stays observed by probes"
                            );
                        }
                    }
                }
                Some(_) => kept.push((req, signal)),
            }
        }
        a.ranks = kept;
        drop(a);
        for req in fired {
            // The rank is making MPI calls again: stop it at one of the
            // next (it was not traced when the trigger fired).
            let state = state.clone();
            thread::spawn(move || attempt(&state, req, false));
        }
    }
}

/// Sets the trigger of `pid` to raise `signal` at its next call.
fn set_trigger(state: &Mutex<State>, pid: u32, signal: i32) -> Result<(), InjectError> {
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    let probes = st.probes.as_mut().ok_or(InjectError::NotProbed { pid })?;
    probes
        .update_config(pid, |c| c.inject_signal = signal as u32)
        .map_err(|e| InjectError::Os {
            pid,
            what: "updating the probes' configuration",
            source: io::Error::other(e.to_string()),
        })
}

/// Clears the trigger of `pid`, if it is still there.
fn disarm(state: &Mutex<State>, pid: u32) {
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = st.probes.as_mut()
        && p.config(pid).is_some_and(|c| c.inject_signal != 0)
    {
        let _ = p.update_config(pid, |c| c.inject_signal = 0);
    }
}

/// At shutdown: clears every armed trigger and starts nothing more, so no
/// signal is raised for an injection nobody will take. (The probes go
/// with the daemon anyway, and the signals are ignored by default: this
/// makes the end clean rather than merely harmless.)
pub fn disarm_all(state: &Mutex<State>) {
    let pending = {
        let mut a = armed();
        a.closed = true;
        std::mem::take(&mut a.ranks)
    };
    for (req, _) in pending {
        disarm(state, req.pid);
    }
}

/// Injects the shim into `req.pid`, then hands the rank over from its
/// probes to the shim. `state` is the daemon's; it is locked only briefly.
pub fn inject(state: &Mutex<State>, req: &Request) -> Result<Injected, InjectError> {
    let r = inject_and_hand_over(state, req).map_err(|e| exiting_or(req.pid, e));
    if r.is_err() {
        state
            .lock()
            .expect("state lock")
            .set_injecting(req.pid, false);
    }
    r
}

/// `e`, unless the process is exiting: a process on its way out refuses
/// ptrace with EPERM and has its mappings torn down, so the step that
/// failed would be named wrongly. Looks for 100 ms.
fn exiting_or(pid: u32, e: InjectError) -> InjectError {
    if matches!(e, InjectError::Gone { .. }) {
        return e;
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(100) {
        if !exists(pid) {
            return InjectError::Gone { pid };
        }
        thread::sleep(Duration::from_millis(5));
    }
    e
}

fn inject_and_hand_over(state: &Mutex<State>, req: &Request) -> Result<Injected, InjectError> {
    let started = Instant::now();
    let pid = req.pid;
    if !crate::launcher::tools_list::ToolsList::parse(&req.tools).is_ok_and(|l| {
        l.layers
            .contains(&crate::launcher::tools_list::Layer::Stats)
    }) {
        return Err(InjectError::NoStats {
            tools: req.tools.clone(),
        });
    }
    let (kind, lib_path) = {
        let mut st = state.lock().expect("state lock");
        let r = st.rank(pid).ok_or(InjectError::Gone { pid })?;
        if !r.is_probed() {
            return Err(InjectError::NotProbed { pid });
        }
        let found = (r.lib_kind, r.lib_path.clone());
        st.set_injecting(pid, true);
        found
    };
    if kind == lib_kind::UNKNOWN {
        return Err(InjectError::UnknownAbi {
            pid,
            library: lib_path.display().to_string(),
        });
    }
    let maps = Maps::read(pid)?;
    if maps.has_file_named(SHIM_NAME) {
        return Err(InjectError::AlreadyLoaded { pid });
    }
    let libc = Loader::find(pid, &maps)?;
    let lib_text = maps.code_of(&lib_path).ok_or(InjectError::Gone { pid })?;
    let path = req.shim.to_str().expect("UTF-8 shim path");
    let strings = [path.as_bytes(), b"\0", req.tools.as_bytes(), b"\0"].concat();
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
    let arm = |on: bool| -> Result<(), InjectError> {
        let mut st = state.lock().expect("state lock");
        let probes = st.probes.as_mut().ok_or(InjectError::NotProbed { pid })?;
        probes
            .update_config(pid, |c| {
                c.inject_signal = if on { signal as u32 } else { 0 };
                c.lib_lo = lib_text.0;
                c.lib_hi = lib_text.1;
            })
            .map_err(|e| InjectError::Os {
                pid,
                what: "updating the probes' configuration",
                source: io::Error::other(e.to_string()),
            })
    };
    let set_skip = |lo: u64, hi: u64| -> Result<(), InjectError> {
        let mut st = state.lock().expect("state lock");
        let probes = st.probes.as_mut().ok_or(InjectError::NotProbed { pid })?;
        probes
            .update_config(pid, |c| {
                c.skip_lo = lo;
                c.skip_hi = hi;
            })
            .map_err(|e| InjectError::Os {
                pid,
                what: "updating the probes' configuration",
                source: io::Error::other(e.to_string()),
            })
    };
    let hand_over = || -> Result<(), InjectError> {
        let mut st = state.lock().expect("state lock");
        let probes = st.probes.as_mut().ok_or(InjectError::NotProbed { pid })?;
        probes
            .update_config(pid, |c| c.handed_over = 1)
            .map_err(|e| InjectError::Os {
                pid,
                what: "updating the probes' configuration",
                source: io::Error::other(e.to_string()),
            })
    };
    // The tracing phase, on a thread of its own: when it ends, for
    // whatever reason, the kernel detaches every thread it traced.
    let traced = thread::scope(|s| {
        s.spawn(|| {
            let mut tracer = Tracer::seize(pid, signal)?;
            arm(true)?;
            let stop = tracer.wait_for_stop(signal, lib_text, req.timeout, &arm);
            // No call in time: the trigger stays armed, and this thread's
            // end detaches the process ([`start`] watches the trigger).
            if !matches!(stop, Err(InjectError::NoCall { .. })) {
                arm(false)?;
            }
            let (tid, regs, stopped_at) = stop?;
            // Everything is written and read back while the thread is
            // stopped and untouched; only then is it pointed at the stub.
            // Any failure before that resumes it as it was.
            let mut hijack = || -> Result<(), InjectError> {
                // The strings under the red zone, where the stub's own
                // frame (below STACK_RESERVED) does not reach.
                let strings_at = (regs.rsp - 128 - strings.len() as u64) & !15;
                data.mailbox.path = strings_at;
                data.mailbox.tools = strings_at + path.len() as u64 + 1;
                let code = stub::code_bytes(&stub::Tail {
                    data: data_at,
                    resume: regs.rip,
                });
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
                let mut hijacked = regs;
                hijacked.rip = code_at;
                tracer.set_regs(tid, &hijacked)
            };
            if let Err(e) = hijack() {
                let _ = tracer.resume(tid, 0);
                return Err(e);
            }
            tracer.resume(tid, 0)?;
            let stopped = stopped_at.elapsed();
            let outcome = converse(pid, &mem, data_at, &mut tracer, &set_skip, &hand_over);
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
    let (tid, stopped, loaded, slots) = match traced {
        Ok(t) => t,
        Err(e) => {
            let _ = set_skip(0, 0);
            return Err(e);
        }
    };
    // Handover: the probes keep what they counted; calls they are timing
    // finish being counted first.
    let drain = Instant::now();
    let lost_in_flight = loop {
        let open = {
            let st = state.lock().expect("state lock");
            st.probes.as_ref().map_or(0, |p| p.open_calls(pid))
        };
        if open == 0 || !exists(pid) {
            break 0;
        }
        if drain.elapsed() > DRAIN_TIMEOUT {
            break open;
        }
        thread::sleep(Duration::from_millis(1));
    };
    state.lock().expect("state lock").hand_over_injected(pid);
    Ok(Injected {
        tid,
        slots,
        stopped,
        loaded,
        total: started.elapsed(),
        lost_in_flight,
    })
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
        if t.elapsed() > LOAD_TIMEOUT + GO_TIMEOUT {
            // The shim undoes itself when no go comes; say so at once.
            let _ = mem.write(
                field(core::mem::offset_of!(Mailbox, go)),
                &go::ABORT.to_ne_bytes(),
            );
            return Err(InjectError::Timeout {
                pid,
                step: "loading the shim",
                secs: (LOAD_TIMEOUT + GO_TIMEOUT).as_secs(),
            });
        }
        thread::sleep(POLL);
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
fn catches(pid: u32, sig: i32) -> bool {
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
fn free_signal(pid: u32) -> Result<i32, InjectError> {
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

/// The process's memory, through `/proc/PID/mem` (which writes past page
/// protections, as a debugger's pokes do).
struct Mem {
    pid: u32,
    file: File,
}

impl Mem {
    fn open(pid: u32) -> Result<Mem, InjectError> {
        let file = File::options()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|source| os_or_permission(pid, "opening /proc/PID/mem", source))?;
        Ok(Mem { pid, file })
    }

    fn write(&self, at: u64, bytes: &[u8]) -> Result<(), InjectError> {
        self.file
            .write_all_at(bytes, at)
            .map_err(|source| InjectError::Os {
                pid: self.pid,
                what: "writing the process's memory",
                source,
            })
    }

    fn read(&self, at: u64, buf: &mut [u8]) -> Result<(), InjectError> {
        self.file
            .read_exact_at(buf, at)
            .map_err(|source| match source.raw_os_error() {
                Some(libc::ESRCH) | Some(libc::EIO) if !exists(self.pid) => {
                    InjectError::Gone { pid: self.pid }
                }
                _ => InjectError::Os {
                    pid: self.pid,
                    what: "reading the process's memory",
                    source,
                },
            })
    }

    fn u32(&self, at: u64) -> Result<u32, InjectError> {
        let mut b = [0; 4];
        self.read(at, &mut b)?;
        Ok(u32::from_ne_bytes(b))
    }

    fn u64(&self, at: u64) -> Result<u64, InjectError> {
        let mut b = [0; 8];
        self.read(at, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// A NUL-terminated string of at most 512 bytes.
    fn c_string(&self, at: u64) -> Result<String, InjectError> {
        if at == 0 {
            return Ok("no message".into());
        }
        let mut out = Vec::new();
        for i in 0..512u64 {
            let mut b = [0; 1];
            self.read(at + i, &mut b)?;
            if b[0] == 0 {
                break;
            }
            out.push(b[0]);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
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

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    write: bool,
    exec: bool,
    offset: u64,
    /// The maps line, to open the file as the process maps it.
    entry: procfs::MapEntry,
    path: Option<PathBuf>,
}

/// Which slack [`Maps::slack`] looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Perm {
    /// In an executable segment's last page.
    Exec,
    /// In a writable segment's last page.
    Write,
}

/// The process's mappings.
struct Maps {
    pid: u32,
    lines: Vec<Mapping>,
}

impl Maps {
    fn read(pid: u32) -> Result<Maps, InjectError> {
        let entries = procfs::maps(pid).map_err(|e| match e {
            procfs::ProcError::NoSuchProcess { .. } => InjectError::Gone { pid },
            procfs::ProcError::Unreadable { source, .. } => {
                os_or_permission(pid, "reading /proc/PID/maps", source)
            }
        })?;
        let lines = entries
            .into_iter()
            .map(|m| Mapping {
                start: m.start,
                end: m.end,
                write: m.write,
                exec: m.exec,
                offset: m.offset,
                entry: m.clone(),
                path: m.path,
            })
            .collect();
        Ok(Maps { pid, lines })
    }

    fn has_file_named(&self, name: &str) -> bool {
        self.lines.iter().any(|m| {
            m.path
                .as_deref()
                .and_then(Path::file_name)
                .is_some_and(|n| n == name)
        })
    }

    /// The executable range of the file at `path`.
    fn code_of(&self, path: &Path) -> Option<(u64, u64)> {
        let code: Vec<&Mapping> = self
            .lines
            .iter()
            .filter(|m| m.exec && m.path.as_deref() == Some(path))
            .collect();
        Some((
            code.iter().map(|m| m.start).min()?,
            code.iter().map(|m| m.end).max()?,
        ))
    }

    /// The mapping holding `[at, at + len)` whole, if any.
    fn holding(&self, at: u64, len: u64) -> Option<&Mapping> {
        self.lines
            .iter()
            .find(|m| m.start <= at && at + len <= m.end)
    }

    /// The mapped files, each once, with where its first mapping (the file
    /// from offset 0) starts: libc's and the dynamic loader's first, never
    /// the MPI library's (whose pages the probes' breakpoints share) nor
    /// the shim's.
    fn objects(&self) -> Vec<(&Path, u64)> {
        let mut out: Vec<(&Path, u64)> = Vec::new();
        for m in &self.lines {
            let Some(p) = m.path.as_deref() else { continue };
            let Some(name) = p.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if m.offset != 0
                || procfs::is_mpi_library(name)
                || name == SHIM_NAME
                || out.iter().any(|(q, _)| *q == p)
            {
                continue;
            }
            out.push((p, m.start));
        }
        let rank = |p: &Path| {
            let n = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if n.starts_with("libc.so") {
                0
            } else if n.starts_with("ld-linux") {
                1
            } else {
                2
            }
        };
        out.sort_by_key(|(p, _)| rank(p));
        out
    }

    /// Unused bytes in the process, 16-aligned: the tail of the last page
    /// of an object's loadable segment, past the segment's end, that is
    /// mapped with `perm` and still all zero. Each (object, perm) has one
    /// candidate, the same on every call, so [`Maps::mailbox`] finds an
    /// earlier injection's block again.
    fn candidates(&self, perm: Perm) -> impl Iterator<Item = (u64, u64)> + '_ {
        // Lazily, object by object: each costs a read of its file, and
        // libc, first, nearly always has room.
        self.objects().into_iter().flat_map(move |(_, first)| {
            let entry = self.lines.iter().find(|m| m.start == first);
            entry
                .map_or_else(Vec::new, |m| segment_ends(self.pid, &m.entry, first))
                .into_iter()
                .filter(move |&(_, p)| p == perm)
                .filter_map(move |(end, _)| {
                    let at = end.next_multiple_of(16);
                    let limit = end.next_multiple_of(4096);
                    let m = self.holding(at, limit.saturating_sub(at).max(1))?;
                    let ok = match perm {
                        Perm::Exec => m.exec && !m.write,
                        Perm::Write => m.write && !m.exec,
                    };
                    (ok && at < limit).then_some((at, limit))
                })
        })
    }

    /// An address with `need` unused bytes mapped with `perm` (see
    /// [`Maps::candidates`]).
    fn slack(&self, mem: &Mem, need: usize, perm: Perm) -> Result<Option<u64>, InjectError> {
        for (at, limit) in self.candidates(perm) {
            if at + need as u64 > limit {
                continue;
            }
            let mut bytes = vec![0; need];
            if mem.read(at, &mut bytes).is_ok() && bytes.iter().all(|&b| b == 0) {
                return Ok(Some(at));
            }
        }
        Ok(None)
    }

    /// Where an earlier injection's mailbox is, found by its magic.
    fn mailbox(&self, mem: &Mem) -> Result<Option<u64>, InjectError> {
        Ok(self
            .candidates(Perm::Write)
            .map(|(at, _)| at)
            .find(|&at| mem.u64(at).is_ok_and(|v| v == MAGIC)))
    }
}

/// The file of mapping `m` of `pid`, opened as the process maps it (never
/// a path the user swapped since, never a FIFO or a device) and read
/// within the size cap (see [`crate::userfile`]).
fn read_mapped(pid: u32, m: &procfs::MapEntry) -> Result<Vec<u8>, crate::userfile::UserFileError> {
    crate::userfile::open_mapped(pid, m, crate::symbols::max_file_size())?.read_all()
}

/// The end, in the process, of every loadable segment of the file of `m`, whose
/// first mapping starts at `first`, with whether it is executable or
/// writable (a segment that is neither is left out).
fn segment_ends(pid: u32, m: &procfs::MapEntry, first: u64) -> Vec<(u64, Perm)> {
    use object::read::elf::ProgramHeader as _;
    let Ok(data) = read_mapped(pid, m) else {
        return Vec::new();
    };
    let Ok(elf) = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data) else {
        return Vec::new();
    };
    let endian = elf.endian();
    let loads: Vec<_> = elf
        .elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == object::elf::PT_LOAD)
        .collect();
    // The first loadable segment maps the file from offset 0 at `first`.
    let Some(bias) = loads
        .iter()
        .map(|ph| ph.p_vaddr(endian) & !0xfff)
        .min()
        .and_then(|v| first.checked_sub(v))
    else {
        return Vec::new();
    };
    loads
        .iter()
        .filter_map(|ph| {
            let flags = ph.p_flags(endian);
            let perm = if flags & object::elf::PF_X != 0 {
                Perm::Exec
            } else if flags & object::elf::PF_W != 0 {
                Perm::Write
            } else {
                return None;
            };
            Some((bias + ph.p_vaddr(endian) + ph.p_memsz(endian), perm))
        })
        .collect()
}

/// `dlopen`, `dlsym` and `dlerror` in the process's libc.
struct Loader {
    dlopen: u64,
    dlsym: u64,
    dlerror: u64,
}

impl Loader {
    fn find(pid: u32, maps: &Maps) -> Result<Loader, InjectError> {
        use object::{Object as _, ObjectSymbol as _, read::elf::ProgramHeader as _};
        let static_err = || InjectError::Static {
            pid,
            comm: procfs::comm(pid),
        };
        let libc = maps
            .lines
            .iter()
            .filter(|m| {
                m.path
                    .as_deref()
                    .and_then(Path::file_name)
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libc.so"))
            })
            .min_by_key(|m| m.start)
            .ok_or_else(static_err)?;
        let data = read_mapped(pid, &libc.entry).map_err(|_| static_err())?;
        let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data)
            .map_err(|_| static_err())?;
        let endian = elf.endian();
        // The load bias: the lowest mapping holds the segment at its offset.
        let bias = elf
            .elf_program_headers()
            .iter()
            .find(|ph| {
                ph.p_type(endian) == object::elf::PT_LOAD
                    && ph.p_offset(endian) & !0xfff == libc.offset
            })
            .and_then(|ph| libc.start.checked_sub(ph.p_vaddr(endian) & !0xfff))
            .ok_or_else(static_err)?;
        let find = |name: &str| {
            elf.dynamic_symbols()
                .find(|s| s.name() == Ok(name) && s.is_definition())
                .map(|s| bias + s.address())
                .ok_or_else(static_err)
        };
        Ok(Loader {
            dlopen: find("dlopen")?,
            dlsym: find("dlsym")?,
            dlerror: find("dlerror")?,
        })
    }
}

/// The threads of one process, traced with `PTRACE_SEIZE` by the calling
/// thread (tracing belongs to a thread, not to the daemon).
struct Tracer {
    pid: u32,
    /// The trigger's signal: the only one a relay drops.
    signal: i32,
    tids: Vec<u32>,
}

impl Tracer {
    /// Seizes every thread; seizing stops nothing.
    fn seize(pid: u32, signal: i32) -> Result<Tracer, InjectError> {
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
    fn wait_for_stop(
        &mut self,
        signal: i32,
        lib: (u64, u64),
        timeout: Duration,
        arm: &dyn Fn(bool) -> Result<(), InjectError>,
    ) -> Result<(u32, libc::user_regs_struct, Instant), InjectError> {
        let t = Instant::now();
        loop {
            for (tid, status) in self.stops()? {
                let sig = libc::WSTOPSIG(status);
                if sig == signal && status >> 16 == 0 {
                    let at = Instant::now();
                    let regs = self.regs(tid)?;
                    let in_lib = regs.rip >= lib.0 && regs.rip < lib.1;
                    if in_lib && regs.orig_rax as i64 == -1 {
                        return Ok((tid, regs, at));
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
    fn stops(&mut self) -> Result<Vec<(u32, i32)>, InjectError> {
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
    fn relay(&self, tid: u32, status: i32) -> Result<(), InjectError> {
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
    fn relay_signals(&mut self) -> Result<(), InjectError> {
        for (tid, status) in self.stops()? {
            self.relay(tid, status)?;
        }
        Ok(())
    }

    fn regs(&self, tid: u32) -> Result<libc::user_regs_struct, InjectError> {
        // SAFETY: zeroed plain struct, filled by the kernel.
        let mut regs: libc::user_regs_struct = unsafe { core::mem::zeroed() };
        // SAFETY: PTRACE_GETREGS into a user_regs_struct of a stopped tracee.
        let r = unsafe { libc::ptrace(libc::PTRACE_GETREGS, tid, 0, &mut regs) };
        if r != 0 {
            return Err(InjectError::Os {
                pid: self.pid,
                what: "PTRACE_GETREGS",
                source: io::Error::last_os_error(),
            });
        }
        Ok(regs)
    }

    fn set_regs(&self, tid: u32, regs: &libc::user_regs_struct) -> Result<(), InjectError> {
        // SAFETY: PTRACE_SETREGS from a user_regs_struct, tracee stopped.
        let r = unsafe { libc::ptrace(libc::PTRACE_SETREGS, tid, 0, regs) };
        if r != 0 {
            return Err(InjectError::Os {
                pid: self.pid,
                what: "PTRACE_SETREGS",
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    fn resume(&self, tid: u32, sig: i32) -> Result<(), InjectError> {
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
fn exists(pid: u32) -> bool {
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
