//! `mpi-observer attach`: checks, attaches, serves, follows ranks as they
//! come and go, and detaches everything on SIGINT or SIGTERM. A `kill -9`
//! needs no code: the kernel closes our perf events and removes the probes.
//!
//! The top of the dependency order: it may use every other folder. The
//! [`attacher`] thread attaches new processes, [`inject`] is the workflow of
//! `attach --inject` over the mechanism in [`crate::attach::inject`],
//! [`exit_handover`] holds a shim rank's segment when it knocks at exit
//! (at the door of [`knocks`], in the [`fair`] queues also used for its
//! attaches), [`handover`] hands the probes to the next daemon at a planned
//! restart, [`not_mpi`] remembers processes judged not MPI, [`peers`]
//! fetches the wait records of jobs spanning nodes from the other nodes'
//! daemons (`--waits.peers`), and [`commands`] dispatches the other
//! subcommands.

pub mod attacher;
pub mod commands;
pub mod exit_handover;
pub mod fair;
pub mod handover;
pub mod inject;
pub mod knocks;
pub mod not_mpi;
pub mod peers;

use std::{
    collections::HashSet,
    io::{IsTerminal as _, Write as _},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use thiserror::Error;
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    EBPF_OBJECT,
    attach::checks::{self, PreflightError},
    attach::functions::{self, SelectError},
    attach::probes::{ProbeError, Probes},
    cli::AttachArgs,
    export::metrics::RenderOptions,
    export::registry::{AttachError, State},
    export::server::{self, ServeError},
    export::summary,
    export::web_config::{self, WebConfigError},
    os::procfs,
};

/// Why `attach` stopped with an error.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// A preflight check failed.
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    /// A bad --functions list.
    #[error(transparent)]
    Select(#[from] SelectError),
    /// A --pid could not be attached.
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// The listener could not be set up.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The programs could not be loaded.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// A bad --web.config.file.
    #[error(transparent)]
    WebConfig(#[from] WebConfigError),
    /// A bad --inject setting.
    #[error(transparent)]
    Inject(#[from] crate::attach::inject::InjectError),
    /// The shim for --inject is missing.
    #[error(transparent)]
    Shim(#[from] crate::collect::launcher::LaunchError),
    /// --report-file cannot be written.
    #[error(
        "cannot write --report-file {path}: {source}; give a path in an existing, writable directory"
    )]
    ReportFile {
        /// The path.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `--pid` ranks cannot be probed here.
    #[error(
        "cannot probe the --pid ranks: {source}; observe them through the shim instead: start the job under `mpi-observer run`, or with `srun --mpi-observer` on Slurm (attach --all serves the shim's figures on such a node)"
    )]
    NoEbpf {
        /// What is missing.
        source: NoEbpf,
    },
    /// A bad --waits.peers, or its CA or auth file.
    #[error(transparent)]
    Peers(#[from] peers::PeerError),
    /// The async runtime could not start.
    #[error("cannot start the runtime: {source}")]
    Runtime {
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Why eBPF cannot be used on this node.
#[derive(Debug, Error)]
pub enum NoEbpf {
    /// The kernel has no BPF or uprobes, or BPF is forbidden here.
    #[error(transparent)]
    Preflight(#[from] PreflightError),
    /// No attach mechanism works on this kernel.
    #[error(transparent)]
    Kernel(#[from] crate::attach::kernel::NoMechanism),
    /// The programs or their maps could not be loaded.
    #[error(transparent)]
    Load(#[from] ProbeError),
}

/// What [`kernel_choice`] found: the chosen mechanism, or why there is
/// none; the values of `mpi_observer_kernel_info` either way; and the line
/// that says the choice, said once the arguments are known to be good (bad
/// input gets its one line and nothing else).
struct KernelChoice {
    chosen: Result<Option<crate::attach::kernel::Choice>, NoEbpf>,
    info: [&'static str; 7],
    line: Option<String>,
}

/// The probes' kernel side, tried before anything else.
fn kernel_choice(args: &AttachArgs) -> KernelChoice {
    let mut info = [
        "none", "unknown", "unknown", "unknown", "unknown", "unknown", "unknown",
    ];
    let without = |chosen, info| KernelChoice {
        chosen,
        info,
        line: None,
    };
    if args.no_bpf {
        return without(Ok(None), info);
    }
    if let Err(e) = checks::kernel() {
        return without(Err(e.into()), info);
    }
    let (features, choice) = crate::attach::kernel::detect();
    for (v, (_, f)) in info[1..].iter_mut().zip(features.labels()) {
        *v = f;
    }
    let choice = match choice {
        Ok(c) => c,
        Err(e) => return without(Err(e.into()), info),
    };
    let line = format!(
        "attaching with {}; this kernel: {}",
        choice.why,
        features.summary()
    );
    info[0] = choice.mechanism.name();
    KernelChoice {
        chosen: Ok(Some(choice)),
        info,
        line: Some(line),
    }
}

/// The line of an `--all` daemon that cannot use eBPF, which then serves
/// what shim ranks give, as `--no-bpf` does.
fn say_shim_only(e: &NoEbpf) {
    log::warn!(
        "no usable eBPF here ({}): serving the figures of shim ranks only, as --no-bpf does",
        crate::one_line(e)
    );
}

/// How often ranks are checked for exit and `--all` scans for new ones.
const TICK: Duration = Duration::from_millis(250);

/// Runs `attach` to completion.
pub fn run(args: AttachArgs) -> Result<(), DaemonError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| DaemonError::Runtime { source })?
        .block_on(run_async(args))
}

async fn run_async(args: AttachArgs) -> Result<(), DaemonError> {
    if !args.no_bpf {
        checks::capabilities()?;
    }
    // The kernel first: a --pid daemon that cannot probe says so before
    // anything else, and --all then knows it serves the shim only.
    let KernelChoice {
        chosen,
        info: mut kernel_info,
        line: mut kernel_line,
    } = kernel_choice(&args);
    let (chosen, shim_only) = match chosen {
        Ok(c) => (c, None),
        Err(e) if args.all => (None, Some(e)),
        Err(source) => return Err(DaemonError::NoEbpf { source }),
    };
    let functions = functions::select(args.functions.as_deref())?;
    let peers = peers::parse_peers(&args.waits.peers, args.waits.ca_file.is_some())?;
    let peers_client = if peers.is_empty() {
        None
    } else {
        Some(peers::client(
            args.waits.ca_file.as_deref(),
            args.waits.auth_file.as_deref(),
        )?)
    };
    let inject = if args.inject {
        let l = crate::collect::launcher::tools_list::ToolsList::parse(&args.inject_tools);
        if !l.is_ok_and(|l| {
            l.layers
                .contains(&crate::collect::launcher::tools_list::Layer::Stats)
        }) {
            return Err(crate::attach::inject::InjectError::NoStats {
                tools: args.inject_tools.clone(),
            }
            .into());
        }
        Some(inject::Request {
            pid: 0,
            shim: crate::collect::launcher::shim_path()?,
            tools: args.inject_tools.clone(),
            timeout: Duration::from_secs(args.inject_timeout),
            load_timeout: Duration::from_secs(args.inject_load_timeout),
        })
    } else {
        None
    };
    crate::os::sys::raise_fd_limit();
    // Validate every --pid before touching anything, so bad input costs the
    // job nothing.
    for &pid in &args.pid {
        procfs::start_ticks(pid).map_err(AttachError::from)?;
        let Some(map) = procfs::mpi_library(pid).map_err(AttachError::from)? else {
            return Err(AttachError::no_library(pid).into());
        };
        // A library this machine cannot probe (another instruction set's
        // code, run by an emulator) is said now, from its header.
        crate::attach::symbols::check_mapped_isa(pid, &map).map_err(AttachError::from)?;
    }
    if let Some(path) = &args.report_file {
        check_report_file(path)?;
    }
    let web = args
        .web_config_file
        .as_deref()
        .map(web_config::load)
        .transpose()?;
    let listener = server::bind(args.listen).await?;
    // A planned restart's predecessor may have handed its probes over.
    let loaded = chosen.map(|choice| {
        let opts = crate::attach::probes::LoadOptions {
            stats_budget: args.map_memory,
            callsites: args.callsites,
            all: args.all,
            ..Default::default()
        };
        Probes::load_adopting(EBPF_OBJECT, opts, choice)
    });
    let (probes, adoption) = match loaded {
        Some(Ok((p, a))) => {
            if let Some(ns) = p.pid_namespace() {
                log::warn!(
                    "running in pid namespace pid:[{}]: the probes count the ranks of this namespace only (run the daemon on the host, e.g. hostPID, to observe every rank of the node)",
                    ns.ino
                );
            }
            (Some(p), Some(a))
        }
        None => (None, None),
        // --all serves what the shim's ranks give, as --no-bpf does, where
        // the kernel lacks what the probes need; a set-up at fault (a pid
        // namespace without its own /proc) stops it, as with --pid.
        Some(Err(e)) if args.all && e.is_kernel_lacking() => {
            say_shim_only(&NoEbpf::Load(e));
            kernel_info[0] = "none";
            kernel_line = None;
            (None, None)
        }
        Some(Err(e)) if e.is_kernel_lacking() => {
            return Err(DaemonError::NoEbpf {
                source: NoEbpf::Load(e),
            });
        }
        Some(Err(e)) => return Err(e.into()),
    };
    let render = RenderOptions {
        per_rank_histograms: args.per_rank_histograms,
        per_rank_detail: args.per_rank_detail,
        detail_ranks: args.detail_ranks,
        max_series: args.max_series,
        node: None,
    };
    let state = Arc::new(Mutex::new(State::new(
        probes,
        functions,
        !args.no_bytes,
        render,
    )));
    state
        .lock()
        .expect("not poisoned yet")
        .selfm
        .set_kernel(&kernel_info);
    // Records go on this node's CLOCK_MONOTONIC from the first drain, so
    // that no instance mixes them with the counter's ticks.
    state.lock().expect("not poisoned yet").ship_waits = !peers.is_empty();
    // Files of user processes and call-site naming (docs/callsites.md).
    crate::attach::symbols::set_max_file_size(args.max_file_size);
    state.lock().expect("not poisoned yet").names =
        crate::collect::callsites::Names::with_config(crate::collect::callsites::NamesConfig {
            max_names: usize::try_from(args.max_callsite_names).unwrap_or(usize::MAX),
            limits: crate::attach::symbolizer::Limits {
                memory: args.symbolizer_memory,
                deadline: std::time::Duration::from_secs(args.symbolizer_timeout),
                ..Default::default()
            },
            fairness: crate::collect::callsites::Fairness {
                budget: std::time::Duration::from_secs(args.symbolizer_budget),
                ..Default::default()
            },
            ..Default::default()
        });
    {
        let mut st = state.lock().expect("not poisoned yet");
        st.callsite_budget.per_function = args.callsite_series;
        let mut d = st.budgets;
        // A user may take half of each map: it takes two users at their
        // budgets to fill one.
        if let Some(p) = &st.probes {
            d.map_entries = d.map_entries.min(p.stats_capacity() as usize / 2);
            d.site_entries = d.site_entries.min(p.callsites_capacity() as usize / 2);
        }
        st.budgets = crate::attach::budget::Budgets {
            processes: args.user_max_processes.unwrap_or(d.processes),
            probes: args.user_max_probes.unwrap_or(d.probes),
            map_entries: args.user_max_map_entries.unwrap_or(d.map_entries),
            site_entries: d.site_entries,
        };
    }
    if let Some(a) = adoption {
        handover::adopt(&state, a);
    }
    for &pid in &args.pid {
        let t = Instant::now();
        // Read without the lock, registered under it (crate::daemon::attacher).
        let prepared = procfs::start_ticks(pid)
            .map_err(AttachError::from)
            .and_then(|ticks| crate::export::registry::prepare(pid, ticks));
        let mut st = state.lock().expect("not poisoned yet");
        st.commit(prepared, crate::export::registry::Admission::Named)?;
        log::info!(
            "attached to pid {pid} ({} probes, {:.0} ms)",
            st.ranks.get(&pid).map_or(0, |r| r.probes()),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    if let Some(req) = &inject {
        for &pid in &args.pid {
            start_injection(&state, req, pid);
        }
    }
    if let Some(w) = server::exposure_warning(args.listen, web.as_ref()) {
        log::warn!("{w}");
    }
    let scheme = if web.as_ref().is_some_and(|w| w.tls.is_some()) {
        "https"
    } else {
        "http"
    };
    let mut scanner = Scanner::new(args.same_netns);
    let attacher = args.all.then(|| {
        let (state, inject) = (state.clone(), inject.clone());
        crate::daemon::attacher::Attacher::start(
            state.clone(),
            scanner.not_mpi.clone(),
            Box::new(move |pid| {
                if let Some(req) = &inject {
                    start_injection(&state, req, pid);
                }
            }),
        )
    });
    let watch_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let events = if !args.all {
        Err("no --all".to_string())
    } else if std::env::var_os("MPI_OBSERVER_NO_EXEC_EVENTS").is_some() {
        Err("MPI_OBSERVER_NO_EXEC_EVENTS is set".to_string())
    } else {
        exec_source(&state)
    };
    let watcher = match (&attacher, events) {
        (Some(a), Ok(events)) => {
            let queue = a.handle();
            let netns = scanner.netns.clone();
            let stats = state
                .lock()
                .expect("not poisoned yet")
                .selfm
                .exec_watch
                .clone();
            Some(crate::os::procevents::watch(
                events,
                stats,
                watch_stop.clone(),
                move |pid, ticks| {
                    if netns
                        .as_ref()
                        .is_none_or(|n| procfs::net_namespace(pid).as_ref() == Some(n))
                        && let Ok(uid) = procfs::uid(pid)
                    {
                        queue.submit(crate::daemon::attacher::Candidate { pid, ticks, uid });
                    }
                },
            ))
        }
        (Some(_), Err(e)) => {
            log::warn!("no exec events ({e}): new ranks are found by the once-a-second scan only");
            None
        }
        (None, _) => None,
    };
    let knocks = start_exit_handover(&args, &state, &scanner, &watch_stop);
    start_orphan_sweeps(&state);
    // Served once discovery runs: a job started after /metrics answers is
    // seen at its exec, not only by the next scan.
    // The arguments are good and the --pid ranks attached: what the kernel
    // allows is said now (bad input gets its one line and nothing else).
    if let Some(line) = &kernel_line {
        log::info!("{line}");
    }
    if let Some(e) = &shim_only {
        say_shim_only(e);
    }
    log::info!("serving {scheme}://{}/metrics", args.listen);
    let server = tokio::spawn(server::serve(listener, state.clone(), web));
    let puller =
        peers_client.and_then(|c| peers::start(peers, c, state.clone(), watch_stop.clone()));

    let mut sigint = signal(SignalKind::interrupt()).expect("signal handler");
    let mut sigterm = signal(SignalKind::terminate()).expect("signal handler");
    let mut tick = tokio::time::interval(TICK);
    let retain = Duration::from_secs(args.retain_exited);
    let mut last_summary = Instant::now();
    let mut last_scan = Instant::now() - Duration::from_secs(60);
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = tick.tick() => {}
        }
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        // Wait records first: a rank that exited gave its last ones.
        st.drain_waits();
        let exited = st.notice_exits();
        for pid in &exited {
            log::info!(
                "pid {pid} exited; keeping its figures for {}s",
                retain.as_secs()
            );
        }
        if !exited.is_empty() && !st.any_running() {
            // The final figures, before --retain-exited lets them go.
            if args.summary {
                print_summary(&mut st);
            }
            if let Some(path) = &args.report_file {
                write_report(&mut st, path);
            }
        }
        st.expire(retain);
        if let Some(a) = &attacher
            && last_scan.elapsed() >= Duration::from_secs(1)
        {
            last_scan = Instant::now();
            let known: HashSet<(u32, u64)> = st
                .ranks
                .values()
                .map(|r| (r.pid, r.ticks))
                .chain(st.refused.keys().copied())
                .collect();
            // The scan reads /proc without the lock.
            drop(st);
            scanner.scan(&known, a, &state);
            st = state.lock().unwrap_or_else(|p| p.into_inner());
        }
        if args.summary && !st.ranks.is_empty() && last_summary.elapsed() >= Duration::from_secs(1)
        {
            last_summary = Instant::now();
            print_summary(&mut st);
        }
        if !args.all && st.ranks.is_empty() {
            break;
        }
    }
    server.abort();
    // Nothing new is attached (nor injected) from here on.
    watch_stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(a) = attacher {
        a.stop();
    }
    if let Some(w) = watcher {
        let _ = w.join();
    }
    if let Some(h) = knocks {
        let _ = h.join();
    }
    // At most one request's timeout (peers::TIMEOUT) away.
    if let Some(h) = puller {
        let _ = h.join();
    }
    // No armed trigger outlives the daemon's intent to inject.
    inject::disarm_all(&state);
    // A planned restart (handover.rs): the next daemon takes the probes
    // and the injected shims over as they are.
    if handover::requested() && handover::hand_over(&state) {
        let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(path) = &args.report_file
            && !st.ranks.is_empty()
        {
            write_report(&mut st, path);
        }
        return Ok(());
    }
    let injected: Vec<u32> = {
        let st = state.lock().unwrap_or_else(|p| p.into_inner());
        st.ranks
            .values()
            .filter(|r| r.injected && r.exited_at.is_none())
            .map(|r| r.pid)
            .collect()
    };
    for pid in injected {
        // Detach restores every slot the injection rewrote; the shim does
        // it on the rank's next call, so a rank that makes none stays
        // routed, correct, until it does.
        match crate::attach::inject::eject(pid, EJECT_WAIT) {
            Ok(true) => log::info!("pid {pid}: the shim is detached"),
            Ok(false) | Err(_) => {
                log::info!("pid {pid}: the shim detaches at the rank's next MPI call")
            }
        }
    }
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(path) = &args.report_file
        && !st.ranks.is_empty()
    {
        write_report(&mut st, path);
    }
    st.detach_all();
    log::info!("detached, exiting");
    Ok(())
}

/// Where `--all` hears of program starts: the eBPF exec tracepoint when
/// the probes are loaded (any network namespace), else the process
/// connector (`--no-bpf`: no eBPF at all; the initial namespace only).
fn exec_source(state: &Mutex<State>) -> Result<crate::os::procevents::Source, String> {
    use crate::os::procevents::{ExecEvents, Source};
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    let bpf = st.probes.as_mut().map(Probes::exec_events);
    drop(st);
    match bpf {
        Some(Ok((ring, drops))) => {
            return Ok(Source::Bpf {
                ring,
                drops,
                seen: 0,
            });
        }
        Some(Err(e)) => log::warn!(
            "{}; exec events come from the process connector",
            crate::one_line(&e)
        ),
        None => {}
    }
    ExecEvents::open()
        .map(Source::Connector)
        .map_err(|e| format!("process connector: {e}"))
}

/// Listens for the shim's exit knocks ([`exit_handover`]) unless
/// `--handover-socket none`: at the path given, else at the system path
/// or, for a daemon of a user without root, at that user's own socket
/// ([`exit_handover::place`]). A socket that cannot be had costs one line,
/// and ranks' figures then reach the daemon only if it opened their
/// segment before they ended.
fn start_exit_handover(
    args: &AttachArgs,
    state: &Arc<Mutex<State>>,
    scanner: &Scanner,
    stop: &Arc<std::sync::atomic::AtomicBool>,
) -> Option<std::thread::JoinHandle<()>> {
    let given = args.handover_socket.as_deref();
    if given.is_some_and(|p| p.as_os_str() == "none") {
        return None;
    }
    let xdg = std::env::var_os(observer_common::segment::USER_RUNTIME_VAR);
    let started = exit_handover::place(given, xdg.as_deref()).and_then(|place| {
        let listener = exit_handover::bind(&place)?;
        if let exit_handover::Place::Own(p) = &place {
            // SAFETY: geteuid cannot fail.
            let uid = unsafe { libc::geteuid() };
            log::info!(
                "shim ranks of uid {uid} knock at exit at {} (this user's own handover socket: a daemon without root has none in {})",
                p.display(),
                std::path::Path::new(exit_handover::DEFAULT_SOCKET)
                    .parent()
                    .unwrap_or(std::path::Path::new("/"))
                    .display()
            );
        }
        exit_handover::start(
            listener,
            state.clone(),
            exit_handover::Config {
                all: args.all,
                netns: scanner.netns.clone(),
                not_mpi: scanner.not_mpi.clone(),
            },
            stop.clone(),
        )
    });
    match started {
        Ok(t) => Some(t),
        Err(e) => {
            log::warn!(
                "{}; a shim rank that ends before a scrape loses its figures",
                crate::one_line(&e)
            );
            None
        }
    }
}

/// Removes the shim's orphaned files from /dev/shm now and every
/// [`crate::os::shm::SWEEP_EVERY`], on a thread of its own (off the state lock
/// and the runtime); an unprivileged daemon only its own user's.
fn start_orphan_sweeps(state: &Arc<Mutex<State>>) {
    let removed = state
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .selfm
        .shm_orphans_removed
        .clone();
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    let limits = crate::os::shm::SweepLimits {
        only_uid: (euid != 0).then_some(euid),
        ..crate::os::shm::SweepLimits::default()
    };
    let _ = std::thread::Builder::new()
        .name("shm-sweep".into())
        .spawn(move || {
            loop {
                let n = crate::os::shm::sweep(
                    std::path::Path::new(observer_common::segment::DIR),
                    limits,
                );
                if n > 0 {
                    removed.inc_by(n as u64);
                    log::info!(
                        "removed {n} orphaned shim file{} from {}",
                        if n == 1 { "" } else { "s" },
                        observer_common::segment::DIR
                    );
                }
                std::thread::sleep(crate::os::shm::SWEEP_EVERY);
            }
        });
}

/// Refuses a `--report-file` that could not be written, before anything is
/// attached: its directory must exist and take a file.
fn check_report_file(path: &std::path::Path) -> Result<(), DaemonError> {
    let mut probe = path.as_os_str().to_owned();
    probe.push(".tmp");
    let r = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&probe)
        .and_then(|_| std::fs::remove_file(&probe));
    r.map_err(|source| DaemonError::ReportFile {
        path: path.display().to_string(),
        source,
    })
}

/// Writes the report data to `path` (`--report-file`); one line either way.
fn write_report(st: &mut State, path: &std::path::Path) {
    let data = st.report_data();
    match data.write(path) {
        Ok(()) => log::info!(
            "wrote the report data of {} ranks to {} (read it with `mpi-observer report {}`)",
            data.ranks.len(),
            path.display(),
            path.display()
        ),
        Err(e) => log::error!("cannot write the report data to {}: {e}", path.display()),
    }
}

/// How long shutdown waits for an injected rank to put its slots back.
const EJECT_WAIT: Duration = Duration::from_secs(2);

/// Injects the shim into `pid` on a thread of its own; one line on stderr
/// either way (`inject::start`, which keeps the injection of a rank that
/// makes no MPI call in time armed for its next call).
fn start_injection(state: &Arc<Mutex<State>>, req: &inject::Request, pid: u32) {
    inject::start(state, inject::Request { pid, ..req.clone() });
}

/// `--all`'s once-a-second look at every process, the fallback behind the
/// exec events (crate::os::procevents): MPI processes not seen before go to the
/// attacher.
struct Scanner {
    /// Processes found not to be MPI, so their maps are not re-read every
    /// scan ([`not_mpi`]); shared with the exit handover, whose knocks
    /// from them cost no look either.
    not_mpi: Arc<not_mpi::NotMpi>,
    /// With --same-netns, the daemon's network namespace.
    netns: Option<std::path::PathBuf>,
}

impl Scanner {
    fn new(same_netns: bool) -> Scanner {
        Scanner {
            not_mpi: Arc::default(),
            netns: same_netns
                .then(|| procfs::net_namespace(std::process::id()))
                .flatten(),
        }
    }

    fn scan(
        &mut self,
        known: &HashSet<(u32, u64)>,
        attacher: &crate::daemon::attacher::Attacher,
        state: &Mutex<State>,
    ) {
        let me = std::process::id();
        let mut dropped = 0;
        // Every process this scan found, by pid and start: what the set of
        // processes judged not MPI keeps (one read of /proc/PID/stat per
        // process and scan, which also gives its name; measured in
        // BENCHMARKS.md, "The fallback scan").
        let mut seen = HashSet::new();
        for pid in procfs::all_pids() {
            if pid == me {
                continue;
            }
            let Ok((stat, comm)) = procfs::stat_and_comm(pid) else {
                continue;
            };
            let ticks = stat.start_ticks;
            seen.insert((pid, ticks));
            if known.contains(&(pid, ticks)) || attacher.is_pending(pid, ticks) {
                continue;
            }
            if self.not_mpi.holds(pid, ticks, &comm) {
                continue;
            }
            if self.netns.is_some() && procfs::net_namespace(pid) != self.netns {
                continue;
            }
            match procfs::mpi_library(pid) {
                Ok(Some(_)) => {
                    let Ok(uid) = procfs::uid(pid) else { continue };
                    if !attacher.submit(crate::daemon::attacher::Candidate { pid, ticks, uid }) {
                        dropped += 1;
                    }
                }
                Ok(None) => {
                    // Kernel threads and ordinary programs: not looked at
                    // again while they live, which spares a read of
                    // /proc/PID/maps per process and scan. One that dlopens
                    // MPI later is missed.
                    self.not_mpi.insert(pid, ticks, comm);
                }
                Err(_) => {}
            }
        }
        // Forget entries of processes that are gone, so the set stays small:
        // those this scan did not find.
        self.not_mpi.retain(&seen);
        if dropped > 0 {
            state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .selfm
                .attach_queue_dropped
                .inc_by(dropped);
        }
    }
}

fn print_summary(st: &mut State) {
    let table = summary::table(&st.collect());
    let mut out = std::io::stdout().lock();
    if out.is_terminal() {
        let _ = write!(out, "\x1b[H\x1b[2J");
    }
    let _ = writeln!(out, "{table}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::os::procevents::Source;

    // Here, not in os::procevents: the exec tracepoint comes with the
    // probes' object (attach::probes), which os may not use.
    #[test]
    fn a_real_exec_is_seen_by_the_tracepoint_in_another_network_namespace() {
        // Root only (CAP_BPF): the daemon's case.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            assert!(std::env::var_os("CI").is_none(), "needs root under CI");
            return;
        }
        let mut probes =
            crate::attach::probes::Probes::load_within(crate::EBPF_OBJECT, 1 << 20, false)
                .expect("load the eBPF object");
        let (ring, drops) = probes.exec_events().expect("the exec tracepoint");
        let mut src = Source::Bpf {
            ring,
            drops,
            seen: 0,
        };
        // A program started in a network namespace of its own, where the
        // process connector tells nothing.
        let child = std::process::Command::new("unshare")
            .args(["-n", "/bin/true"])
            .spawn()
            .unwrap();
        let unshare = child.id();
        let t = Instant::now();
        let mut pids = Vec::new();
        while t.elapsed() < Duration::from_secs(5) && pids.len() < 2 {
            pids.extend(src.recv(Duration::from_millis(100)).pids);
            pids.retain(|&p| p == unshare);
        }
        let _ = { child }.wait();
        // unshare's own exec, then its exec of /bin/true, same pid.
        assert_eq!(pids, [unshare, unshare], "execs of pid {unshare}");
    }
}
