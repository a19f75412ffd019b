//! `mpi-observer attach --inject`, the workflow: which ranks, when, and the
//! handover from a rank's probes to the shim, over the mechanism in
//! [`crate::attach::inject`] (ptrace, `/proc/PID/mem`, the loader stub).
//! The design and why is in docs/inject.md.
//!
//! - **Handover.** Once no call the probes are timing is open, the rank's
//!   probes are detached; what they counted stays, and the segment adds to
//!   it (`registry::scrape::rank_calls`).
//! - **No call in time.** A rank that makes no MPI call within
//!   `--inject-timeout` is let go, untraced, with its trigger armed: its
//!   next call clears it (the ignored signal does nothing), one watcher
//!   thread sees that and starts the injection again ([`start`]).

use std::{
    io,
    path::PathBuf,
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use observer_common::maps::lib_kind;

use crate::{
    attach::inject::{self, InjectError, ProbeControl, catches, exists, free_signal},
    export::registry::State,
};

/// How long the handover waits for the calls the probes are timing.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);
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
    /// How long loading the shim may take in the rank.
    pub load_timeout: Duration,
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

/// The probes of one rank, as the injection drives them: each change one
/// update of its `ProcConfig` under the state lock.
struct RankProbes<'a> {
    state: &'a Mutex<State>,
    pid: u32,
}

impl RankProbes<'_> {
    fn update(
        &self,
        change: impl FnOnce(&mut observer_common::maps::ProcConfig),
    ) -> Result<(), InjectError> {
        let pid = self.pid;
        let mut st = self.state.lock().expect("state lock");
        let probes = st.probes.as_mut().ok_or(InjectError::NotProbed { pid })?;
        probes
            .update_config(pid, change)
            .map_err(|e| InjectError::Os {
                pid,
                what: "updating the probes' configuration",
                source: io::Error::other(e.to_string()),
            })
    }
}

impl ProbeControl for RankProbes<'_> {
    fn arm(&self, on: bool, signal: i32, lib_text: (u64, u64)) -> Result<(), InjectError> {
        self.update(|c| {
            c.inject_signal = if on { signal as u32 } else { 0 };
            c.lib_lo = lib_text.0;
            c.lib_hi = lib_text.1;
        })
    }

    fn set_skip(&self, lo: u64, hi: u64) -> Result<(), InjectError> {
        self.update(|c| {
            c.skip_lo = lo;
            c.skip_hi = hi;
        })
    }

    fn hand_over(&self) -> Result<(), InjectError> {
        self.update(|c| c.handed_over = 1)
    }
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
            log::info!(
                "injected the shim into pid {pid}: {} slots, thread {} stopped {:.2} ms, shim live after {:.1} ms, {:.0} ms in all",
                i.slots,
                i.tid,
                i.stopped.as_secs_f64() * 1e3,
                i.loaded.as_secs_f64() * 1e3,
                i.total.as_secs_f64() * 1e3,
            );
            if i.lost_in_flight > 0 {
                log::warn!(
                    "pid {pid}: {} calls were still open after {}s when its probes went; they are not counted",
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
                log::info!(
                    "pid {pid} made no MPI call within {secs} s; the injection stays armed, untraced, and happens at its next MPI calls; its probes count until then"
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
        Err(e @ InjectError::AlreadyLoaded { .. }) => log::info!("{e}"),
        Err(e) => log::warn!("{e}; it stays observed by probes"),
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
                            log::warn!(
                                "pid {pid} now catches both SIGURG and SIGWINCH, which the injection's trigger raises; not injected, it stays observed by probes"
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
    if !crate::collect::launcher::tools_list::ToolsList::parse(&req.tools).is_ok_and(|l| {
        l.layers
            .contains(&crate::collect::launcher::tools_list::Layer::Stats)
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
    let probes = RankProbes { state, pid };
    let loaded = inject::load_shim(
        pid,
        &inject::Target {
            lib_path: &lib_path,
            shim: &req.shim,
            tools: &req.tools,
            timeout: req.timeout,
            load_timeout: req.load_timeout,
        },
        &probes,
    )?;
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
        tid: loaded.tid,
        slots: loaded.slots,
        stopped: loaded.stopped,
        loaded: loaded.loaded,
        total: started.elapsed(),
        lost_in_flight,
    })
}
