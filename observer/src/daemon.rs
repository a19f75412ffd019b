//! `mpi-observer attach`: checks, attaches, serves, follows ranks as they
//! come and go, and detaches everything on SIGINT or SIGTERM. A `kill -9`
//! needs no code: the kernel closes our perf events and removes the probes.

use std::{
    io::{IsTerminal as _, Write as _},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use thiserror::Error;
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    EBPF_OBJECT,
    checks::{self, PreflightError},
    cli::AttachArgs,
    functions::{self, SelectError},
    metrics::RenderOptions,
    probes::{ProbeError, Probes},
    procfs,
    registry::{AttachError, State},
    server::{self, ServeError},
    summary,
    web_config::{self, WebConfigError},
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
    /// The async runtime could not start.
    #[error("cannot start the runtime: {source}")]
    Runtime {
        /// The I/O error.
        source: std::io::Error,
    },
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
        checks::kernel()?;
    }
    let functions = functions::select(args.functions.as_deref())?;
    // Validate every --pid before touching anything, so bad input costs the
    // job nothing.
    for &pid in &args.pid {
        procfs::start_ticks(pid).map_err(AttachError::from)?;
        if procfs::mpi_library(pid)
            .map_err(AttachError::from)?
            .is_none()
        {
            return Err(AttachError::NoMpiLibrary {
                pid,
                comm: procfs::comm(pid),
            }
            .into());
        }
    }
    let web = args
        .web_config_file
        .as_deref()
        .map(web_config::load)
        .transpose()?;
    let listener = server::bind(args.listen).await?;
    let probes = if args.no_bpf {
        None
    } else {
        Some(Probes::load_within(EBPF_OBJECT, args.map_memory)?)
    };
    let render = RenderOptions {
        per_rank_histograms: args.per_rank_histograms,
    };
    let state = Arc::new(Mutex::new(State::new(
        probes,
        functions,
        !args.no_bytes,
        render,
    )));
    {
        let mut st = state.lock().expect("not poisoned yet");
        for &pid in &args.pid {
            let t = Instant::now();
            st.attach(pid)?;
            eprintln!(
                "mpi-observer: attached to pid {pid} ({} probes, {:.0} ms)",
                st.ranks.get(&pid).map_or(0, |r| r.probes()),
                t.elapsed().as_secs_f64() * 1e3
            );
        }
    }
    if let Some(w) = server::exposure_warning(args.listen, web.as_ref()) {
        eprintln!("mpi-observer: {w}");
    }
    let scheme = if web.as_ref().is_some_and(|w| w.tls.is_some()) {
        "https"
    } else {
        "http"
    };
    eprintln!("mpi-observer: serving {scheme}://{}/metrics", args.listen);
    let server = tokio::spawn(server::serve(listener, state.clone(), web));

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
        let exited = st.notice_exits();
        for pid in &exited {
            eprintln!(
                "mpi-observer: pid {pid} exited; keeping its figures for {}s",
                retain.as_secs()
            );
        }
        if args.summary && !exited.is_empty() && !st.any_running() {
            // The final figures, before --retain-exited lets them go.
            print_summary(&mut st);
        }
        st.expire(retain);
        if args.all && last_scan.elapsed() >= Duration::from_secs(1) {
            last_scan = Instant::now();
            scan(&mut st, args.same_netns);
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
    let mut st = state.lock().unwrap_or_else(|p| p.into_inner());
    st.detach_all();
    eprintln!("mpi-observer: detached, exiting");
    Ok(())
}

/// `--all`: attach to MPI processes not seen before.
fn scan(st: &mut State, same_netns: bool) {
    let me = std::process::id();
    let my_netns = procfs::net_namespace(me);
    for pid in procfs::all_pids() {
        if pid == me || st.ranks.contains_key(&pid) {
            continue;
        }
        if same_netns && procfs::net_namespace(pid) != my_netns {
            continue;
        }
        let Ok(ticks) = procfs::start_ticks(pid) else {
            continue;
        };
        if st.not_mpi.contains(&(pid, ticks)) {
            continue;
        }
        match procfs::mpi_library(pid) {
            Ok(Some(_)) => match st.attach(pid) {
                Ok(()) => eprintln!(
                    "mpi-observer: attached to pid {pid} ({})",
                    procfs::comm(pid)
                ),
                Err(e) => {
                    eprintln!("mpi-observer: pid {pid}: {e}");
                    st.not_mpi.insert((pid, ticks));
                }
            },
            Ok(None) => {
                // Kernel threads and ordinary programs: not looked at again
                // while they live, which spares a read of /proc/PID/maps per
                // process and scan. One that dlopens MPI later is missed.
                st.not_mpi.insert((pid, ticks));
            }
            Err(_) => {}
        }
    }
    // Forget entries of processes that are gone, so the set stays small.
    st.not_mpi
        .retain(|(pid, ticks)| procfs::alive(*pid, *ticks));
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
