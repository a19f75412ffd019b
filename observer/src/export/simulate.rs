//! `mpi-observer __simulate` (hidden): many simulated nodes in one process,
//! for the scale test and `cargo xtask bench scale` (issue 22).
//!
//! Node `i` is the daemon's real HTTP server ([`server::serve`]) on its own
//! loopback address (`--base-addr` + `i`; all of 127/8 is loopback on
//! Linux), with a [`State`] of its own and no probes: its ranks are
//! synthetic ([`Rank::synthetic`]) and their figures are a stats segment's
//! ([`Figures`]), the way a rank timed by the shim is counted, so every
//! scrape goes through the real collection and render path.
//!
//! One job spans all nodes: node `i` holds world ranks `i*R .. i*R+R-1`.
//! Each rank calls 40 functions, talks to 26 peers (half of them on other
//! nodes) and has call sites; a thread advances every rank's figures once a
//! second. Two things are planted for the dashboards and alerts to find: a
//! straggler (one rank whose MPI fraction is far below the others': the
//! others wait for it) and a stuck request (one rank's oldest outstanding
//! request, whose age grows past `MPIRequestStuck`'s threshold). And on
//! every node one late message a second, through the daemon's real
//! wait-state matcher ([`plant_waits`]), so the wait series exist as for a
//! job under the `stats` layer.

use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant, SystemTime},
};

use clap::Args;
use observer_common::{
    FunctionId,
    maps::{HIST_SLOTS, hist_slot},
    waits::{self, Plain},
};
use thiserror::Error;

use crate::{
    attach::functions,
    attach::identity::layout::Layout,
    attach::identity::{Identity, JobidSource},
    collect::callsites::{Names, NamesConfig},
    collect::snapshot::Labels,
    collect::snapshot::{Directed, Figures, LayerCalls, PeerTraffic, Requests, Timing},
    collect::waits::Drain,
    export::metrics::RenderOptions,
    export::registry::{Rank, State},
    export::server,
};

/// Synthetic pids start here, above any pid the kernel hands out
/// (`pid_max` is at most 2^22), so no rank is ever taken for a process.
const PID_BASE: u32 = 1 << 23;
/// Functions each rank calls.
const FUNCTIONS: usize = 40;
/// Peers each rank talks to; half on its node, half on others.
const PEERS: u32 = 26;
/// Functions with call sites, and sites for each.
const SITE_FUNCTIONS: usize = 10;
const SITES_PER_FUNCTION: u64 = 2;

/// Options of `__simulate`.
#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// Simulated nodes, each a server on its own loopback address.
    #[arg(long, default_value_t = 1000)]
    pub nodes: u32,
    /// Ranks of the job on each node.
    #[arg(long, default_value_t = 64)]
    pub ranks_per_node: u32,
    /// Node 0's address; node `i` listens on this address + `i`.
    #[arg(long, default_value = "127.1.0.0")]
    pub base_addr: Ipv4Addr,
    /// The port every node listens on.
    #[arg(long, default_value_t = 9479)]
    pub port: u16,
    /// The job's id.
    #[arg(long, default_value = "scale-job")]
    pub jobid: String,
    /// The planted straggler's world rank (taken modulo the job's size).
    #[arg(long, default_value_t = 12_345)]
    pub straggler: u32,
    /// The world rank with the stuck request (taken modulo the job's size).
    #[arg(long, default_value_t = 777)]
    pub stuck_rank: u32,
    /// Age in seconds of the stuck request when the simulation starts; it
    /// grows from there (`MPIRequestStuck` fires over 120 s).
    #[arg(long, default_value_t = 100)]
    pub stuck_age: u64,
    /// Today's exposition: every rank's full per-rank series (`attach
    /// --per-rank-detail`), for the before/after ratio.
    #[arg(long)]
    pub per_rank_detail: bool,
    /// Measure instead of serving: one node of `--ranks-per-node` ranks,
    /// collected and rendered this many times in-process; prints the
    /// exposition's bytes and series and the median collection CPU time.
    #[arg(long, value_name = "N")]
    pub measure: Option<u32>,
    /// Per-rank latency histograms for the ranks with full series (`attach
    /// --per-rank-histograms`).
    #[arg(long)]
    pub per_rank_histograms: bool,
    /// Threads collecting and rendering, for every node together.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
}

/// Errors of the simulation.
#[derive(Debug, Error)]
pub enum SimulateError {
    /// The node addresses run past 127.255.255.255.
    #[error(
        "{nodes} nodes from {base} run past the loopback network 127.0.0.0/8: use fewer --nodes or a lower --base-addr"
    )]
    Addresses {
        /// Nodes asked for.
        nodes: u32,
        /// The first address.
        base: Ipv4Addr,
    },
    /// No nodes, or no ranks.
    #[error("--nodes and --ranks-per-node must be at least 1")]
    Empty,
    /// The runtime could not start.
    #[error("cannot start the runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// A node could not listen.
    #[error("node {node}: {source}")]
    Bind {
        /// The node.
        node: u32,
        /// Why.
        source: server::ServeError,
    },
}

/// One simulated rank's parameters.
struct Sim {
    /// MPI seconds per wall second.
    fraction: f64,
    /// World ranks of its peers.
    peers: Vec<u32>,
    /// Its stuck request started here (`CLOCK_MONOTONIC`), if it has one.
    stuck_since_ns: Option<u64>,
}

/// Node `node`'s state: its ranks of the job of `size` ranks, with their
/// figures as of a minute of counting, and how each advances.
fn node_state(
    args: &SimulateArgs,
    ids: &[u16],
    node: u32,
    size: u32,
    start_ns: u64,
) -> (State, Vec<Sim>) {
    let straggler = args.straggler % size;
    let stuck = args.stuck_rank % size;
    // Counting began a minute before the simulation: rates and fractions
    // are there from the first scrape.
    let started = SystemTime::now() - Duration::from_secs(60);
    let nodes = args.nodes.max(1);
    // The job as Slurm would describe it to every rank: the daemons name
    // each peer's node from it (node × node peer series).
    let width = (nodes - 1).to_string().len();
    let host = format!("sim{node:0width$}");
    let env = [
        (
            "SLURM_STEP_NODELIST",
            format!("sim[{:0width$}-{:0width$}]", 0, nodes - 1),
        ),
        (
            "SLURM_STEP_TASKS_PER_NODE",
            format!("{}(x{nodes})", args.ranks_per_node),
        ),
    ];
    let get = |name: &str| {
        env.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    };
    let mut render = render_options(args.per_rank_detail);
    render.per_rank_histograms = args.per_rank_histograms;
    render.node = Some(Box::leak(host.clone().into_boxed_str()));
    let mut state = State::new(None, ids.to_vec(), true, render);
    // No symbolizer: every site is named up front. A small cache, as
    // a thousand default-sized ones would reserve gigabytes.
    state.names = Names::with_config(NamesConfig {
        max_names: 16,
        ..NamesConfig::default()
    });
    let layout = Layout::from_env(get, node * args.ranks_per_node, size, &host).map(Arc::new);
    let mut node_sims = Vec::with_capacity(args.ranks_per_node as usize);
    for local in 0..args.ranks_per_node {
        let world = node * args.ranks_per_node + local;
        let pid = PID_BASE + world;
        let mut rank = Rank::synthetic(pid, world, &args.jobid);
        rank.identity = Identity::new(
            &args.jobid,
            &world.to_string(),
            &size.to_string(),
            0,
            JobidSource::Environment,
        );
        rank.identity.layout = layout.clone();
        rank.labels = Labels::new(&rank.identity);
        rank.started_at = started;
        rank.attached_at = started;
        for j in 0..SITE_FUNCTIONS.min(ids.len()) {
            for s in 0..SITES_PER_FUNCTION {
                rank.name_site(
                    site_addr(j, s),
                    &format!("solver_{j} at solver.c:{}", 100 + 10 * j as u64 + s),
                );
            }
        }
        let jitter = (mix(u64::from(world)) % 1000) as f64 / 1000.0;
        let fraction = if world == straggler {
            0.02
        } else {
            0.25 + 0.1 * jitter
        };
        let peers = (1..=PEERS / 2)
            .map(|k| node * args.ranks_per_node + (local + k) % args.ranks_per_node)
            .chain((1..=PEERS / 2).map(|k| ((node + k) % nodes) * args.ranks_per_node + local))
            .filter(|&p| p != world)
            .collect();
        let sim = Sim {
            fraction,
            peers,
            stuck_since_ns: (world == stuck)
                .then(|| start_ns.saturating_sub(args.stuck_age * 1_000_000_000)),
        };
        rank.figures = Some(figures(&sim, ids, Duration::from_secs(60), start_ns, size));
        state.ranks.insert(pid, rank);
        node_sims.push(sim);
    }
    (state, node_sims)
}

/// A small deterministic hash, for per-rank jitter that is the same every run.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The render options of the simulated daemons.
fn render_options(per_rank_detail: bool) -> RenderOptions {
    RenderOptions {
        per_rank_detail,
        // Today's exposition had no series budget: nothing dropped, so
        // its cost is measured whole.
        max_series: if per_rank_detail {
            usize::MAX
        } else {
            RenderOptions::default().max_series
        },
        ..RenderOptions::default()
    }
}

/// Runs the simulation until killed.
pub fn run(args: &SimulateArgs) -> Result<(), SimulateError> {
    if args.nodes == 0 || args.ranks_per_node == 0 {
        return Err(SimulateError::Empty);
    }
    let base = u32::from(args.base_addr);
    let last = base.checked_add(args.nodes - 1);
    if base >> 24 != 127 || last.is_none_or(|l| l >> 24 != 127) {
        return Err(SimulateError::Addresses {
            nodes: args.nodes,
            base: args.base_addr,
        });
    }
    // A listener and a few connections per node.
    crate::os::sys::raise_fd_limit();
    let size = args.nodes * args.ranks_per_node;
    let straggler = args.straggler % size;
    let stuck = args.stuck_rank % size;
    let ids = rank_functions();
    if let Some(n) = args.measure {
        measure(args, &ids, n);
        return Ok(());
    }
    let start_ns = crate::os::clock::monotonic_ns();
    let t0 = Instant::now() - Duration::from_secs(60);
    let mut nodes = Vec::with_capacity(args.nodes as usize);
    let mut sims = Vec::with_capacity(args.nodes as usize);
    for node in 0..args.nodes {
        let (state, node_sims) = node_state(args, &ids, node, size, start_ns);
        nodes.push(Arc::new(Mutex::new(state)));
        sims.push(node_sims);
    }

    let rt = tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(args.threads.max(1))
        .enable_all()
        .build()
        .map_err(SimulateError::Runtime)?;
    rt.block_on(async {
        for (i, state) in nodes.iter().enumerate() {
            let addr = SocketAddr::from((Ipv4Addr::from(base + i as u32), args.port));
            let l = server::bind(addr)
                .await
                .map_err(|source| SimulateError::Bind {
                    node: i as u32,
                    source,
                })?;
            tokio::spawn(server::serve(l, state.clone(), None));
        }
        Ok::<(), SimulateError>(())
    })?;
    println!(
        "simulate: {} nodes x {} ranks of job {} listening on {}..{} port {}; straggler rank {straggler}, stuck request on rank {stuck}",
        args.nodes,
        args.ranks_per_node,
        args.jobid,
        Ipv4Addr::from(base),
        Ipv4Addr::from(base + args.nodes - 1),
        args.port
    );
    // The figures advance once a second, node by node, each lock held only
    // for its own node. A current-thread runtime runs its tasks only
    // inside `block_on`: the servers run there, the updates beside it.
    let ranks_per_node = args.ranks_per_node;
    std::thread::spawn(move || {
        for tick in 0.. {
            std::thread::sleep(Duration::from_secs(1));
            let wall = t0.elapsed();
            let now_ns = crate::os::clock::monotonic_ns();
            for (node, (state, node_sims)) in nodes.iter().zip(&sims).enumerate() {
                let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
                debug_assert_eq!(state.ranks.len(), ranks_per_node as usize);
                for (rank, sim) in state.ranks.values_mut().zip(node_sims) {
                    rank.figures = Some(figures(sim, &ids, wall, now_ns, size));
                }
                let at = (node as u32, ranks_per_node, size);
                plant_waits(&mut state, at, straggler, tick, now_ns);
            }
        }
    });
    rt.block_on(std::future::pending::<()>());
    Ok(())
}

/// One late message on node `node` (of `ranks_per_node` ranks, in a job of
/// `size`), the `tick`-th: its second rank waits 10 ms in `MPI_Recv` for
/// its first, or on the straggler's node for the straggler. Its two
/// records go through the daemon's matcher as a drained ring's would, and
/// the wait series follow (docs/waits.md).
fn plant_waits(
    state: &mut State,
    (node, ranks_per_node, size): (u32, u32, u32),
    straggler: u32,
    tick: u64,
    now_ns: u64,
) {
    const MS: u64 = 1_000_000;
    if ranks_per_node < 2 || now_ns < 20 * MS {
        return;
    }
    let first = node * ranks_per_node;
    let sender = if straggler / ranks_per_node == node {
        straggler
    } else {
        first
    };
    let receiver = if sender == first { first + 1 } else { first };
    let Some(job) = state.ranks.values().next().map(|r| r.labels.job.clone()) else {
        return;
    };
    let send = Plain {
        enter: now_ns - 10 * MS,
        leave: now_ns - 10 * MS,
        seq: tick,
        comm: waits::WORLD,
        function: FunctionId::Send as u16,
        kind: waits::kind::SEND,
        flags: 0,
        peer: receiver as i32,
        tag: 0,
        thread: 1,
        bytes: 8,
    };
    let recv = Plain {
        enter: now_ns - 20 * MS,
        leave: now_ns - 9 * MS,
        function: FunctionId::Recv as u16,
        kind: waits::kind::RECV,
        flags: waits::flag::POSTED_HERE,
        peer: sender as i32,
        ..send
    };
    for (rank, r) in [(sender, send), (receiver, recv)] {
        state.waits.add(
            &job,
            &Drain {
                rank,
                world_size: size,
                shift: 0,
                p2p_shift: 1,
                clock: waits::clock::NS,
                ns_per_tick: 0,
                records: &[r],
                lost: 0,
                skipped: 0,
            },
            now_ns,
        );
    }
    state.waits.settle(now_ns);
}

/// The functions a simulated rank calls: the ones applications call most,
/// then other default ones, [`FUNCTIONS`] in all.
fn rank_functions() -> Vec<u16> {
    const COMMON: [&str; 16] = [
        "MPI_Allreduce",
        "MPI_Send",
        "MPI_Recv",
        "MPI_Isend",
        "MPI_Irecv",
        "MPI_Wait",
        "MPI_Waitall",
        "MPI_Bcast",
        "MPI_Barrier",
        "MPI_Reduce",
        "MPI_Alltoall",
        "MPI_Allgather",
        "MPI_Sendrecv",
        "MPI_Gather",
        "MPI_Scatter",
        "MPI_Test",
    ];
    let table = observer_common::FUNCTIONS;
    let mut ids: Vec<u16> = COMMON
        .iter()
        .filter_map(|n| table.iter().position(|f| f.name == *n))
        .map(|i| i as u16)
        .collect();
    for id in functions::select(None).unwrap_or_default() {
        if ids.len() >= FUNCTIONS {
            break;
        }
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `--measure N`: one node of `--ranks-per-node` ranks, collected and
/// rendered `N` times in this thread; prints the exposition's size and
/// series and the median CPU time of one collection, as `key=value` lines.
fn measure(args: &SimulateArgs, ids: &[u16], n: u32) {
    let size = args.ranks_per_node;
    let start_ns = crate::os::clock::monotonic_ns();
    let mut state = node_state(args, ids, 0, size, start_ns).0;
    let mut cpu = Vec::new();
    let mut text = String::new();
    for _ in 0..n.max(1) {
        let c = thread_cpu();
        text = state.scrape();
        cpu.push(thread_cpu() - c);
    }
    cpu.sort();
    let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    let with_rank = series.iter().filter(|l| l.contains(",rank=\"")).count();
    let job = series
        .iter()
        .filter(|l| l.contains("jobid=\"") && !l.contains(",rank=\""))
        .count();
    println!("ranks={size}");
    println!("functions={}", ids.len());
    println!("exposition_bytes={}", text.len());
    println!("series={}", series.len());
    println!("series_with_rank={with_rank}");
    println!("series_job_level={job}");
    println!(
        "collect_cpu_ms={:.3}",
        cpu[cpu.len() / 2].as_secs_f64() * 1e3
    );
}

fn site_addr(function: usize, site: u64) -> u64 {
    0x40_0000 + function as u64 * 0x100 + site * 0x10
}

/// A rank's figures after `wall` of counting: every counter a linear
/// function of time, so rates are steady and the MPI fraction is the rank's.
fn figures(sim: &Sim, ids: &[u16], wall: Duration, now_ns: u64, size: u32) -> Figures {
    let secs = wall.as_secs_f64();
    let mpi_ns = sim.fraction * secs * 1e9;
    let mut f = Figures {
        world_size: size,
        ready: true,
        ..Figures::default()
    };
    // Function j takes a share of the MPI time proportional to 1/(j+1), and
    // is called 100/(j+1) times a second.
    let weights: f64 = (0..ids.len()).map(|j| 1.0 / (j as f64 + 1.0)).sum();
    for (j, &id) in ids.iter().enumerate() {
        let w = 1.0 / (j as f64 + 1.0);
        let calls = (secs * 100.0 * w) as u64;
        let time_ns = (mpi_ns * w / weights) as u64;
        let bytes = calls * 4096;
        let mut hist = [0u64; HIST_SLOTS];
        if let Some(mean) = time_ns.checked_div(calls) {
            let slot = hist_slot(mean);
            hist[slot] = calls - calls / 4;
            hist[(slot + 1).min(HIST_SLOTS - 1)] += calls / 4;
        }
        f.timing.insert(
            id,
            Timing {
                calls,
                time_ns,
                bytes: [bytes, bytes / 2],
                bytes_unknown: [0, 0],
                hist,
            },
        );
        f.functions.insert(
            id,
            LayerCalls {
                calls,
                bytes: Directed {
                    send: bytes,
                    recv: bytes / 2,
                },
            },
        );
        if j < SITE_FUNCTIONS {
            for s in 0..SITES_PER_FUNCTION {
                f.callsites.push(crate::collect::snapshot::RawSite {
                    function: id,
                    addr: site_addr(j, s),
                    calls: calls / SITES_PER_FUNCTION,
                    time_ns: time_ns / SITES_PER_FUNCTION,
                });
            }
        }
    }
    f.callsites.sort_by_key(|s| (s.function, s.addr));
    let messages = (secs * 50.0) as u64;
    for &p in &sim.peers {
        f.peers.insert(
            p,
            PeerTraffic {
                messages: Directed {
                    send: messages,
                    recv: messages,
                },
                bytes: Directed {
                    send: messages * 8192,
                    recv: messages * 8192,
                },
            },
        );
    }
    let started = (secs * 200.0) as u64;
    f.requests = Requests {
        started,
        completed: started.saturating_sub(2),
        cancelled: 0,
        table_full: 0,
    };
    f.outstanding = 2;
    // An ordinary rank's oldest request is a few milliseconds old.
    f.oldest_started_ns = Some(
        sim.stuck_since_ns
            .unwrap_or(now_ns.saturating_sub(3_000_000)),
    );
    f.persistent_active = 1;
    f.persistent_inactive = 1;
    f
}
