//! Command-line interface.

use std::{ffi::OsString, net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand};

/// The default listen address. Port 9479 is documented in the README.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9479";

/// Observe running MPI jobs: per-rank call counts, time, bytes and latency
/// from eBPF probes on the PMPI entry points, served to Prometheus.
#[derive(Debug, Parser)]
#[command(name = "mpi-observer", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
    /// What is said on stderr: error, warn (what is lost or degraded),
    /// info (also every attach, exit and restart: the default) or debug
    /// (also the messages of the libraries underneath).
    #[arg(
        long = "log.level",
        global = true,
        default_value = "info",
        value_name = "LEVEL",
        value_parser = crate::os::logger::parse_level
    )]
    pub log_level: log::LevelFilter,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach to running MPI ranks and serve their statistics at /metrics.
    Attach(AttachArgs),
    /// Print the absolute path of the layering shim, libmpi_observer_shim.so.
    ShimPath,
    /// Print, on one line, the flags that build a QMPI tool on any supported
    /// MPI: `mpicc $(mpi-observer qmpi-flags) tool.c -shared -fPIC -o libtool.so`.
    QmpiFlags {
        /// Only the compiler's flags (the header).
        #[arg(long)]
        cflags: bool,
        /// Only the linker's flags (the stub library).
        #[arg(long)]
        libs: bool,
    },
    /// Run CMD with the layering shim preloaded and the tools list set, as in
    /// `mpirun -np 4 mpi-observer run --tools a.so,b.so -- ./app`.
    Run {
        /// The tools_entry list (sets MPI_TOOLS_ENTRY); without it the
        /// environment's list is used.
        #[arg(long, value_name = "LIST")]
        tools: Option<String>,
        /// The command and its arguments.
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        cmd: Vec<OsString>,
    },
    /// List the probe sites of an MPI library (x86-64 or arm64, whatever
    /// this machine is): one per unique PMPI function address, with its
    /// first instruction bytes and what the kernel's uprobes do with that
    /// instruction: emulate it (cheap), single-step it (dear), or refuse it
    /// (then the function is not probed, and the daemon says so).
    Sites {
        /// Path of libmpi.so* or libmpich.so*.
        library: std::path::PathBuf,
        /// Measure on the running kernel, instead of taking from the rules,
        /// what it does with each class of first instruction (needs root,
        /// as attach does): a column `measured:<class>` after the rule's
        /// class, and one line per class on stderr.
        #[arg(long)]
        measure: bool,
    },
    /// Print an mpiP-style report of each job: MPI time per rank, top
    /// functions and call sites, imbalance, message sizes, busiest peers;
    /// from snapshot files (`attach --report-file`) or live daemons (--url).
    Report(ReportArgs),
    /// A live terminal view of the jobs one observer sees, or, through
    /// Prometheus, of the whole cluster: jobs, a job's ranks, a rank's
    /// functions, and the rank × rank matrix.
    Top(TopArgs),
    /// Record an OTF2 trace of running ranks, for Vampir and other OTF2
    /// readers: full MPI events from ranks running the shim's `stats`
    /// layer, Enter/Leave of every MPI call from the others (probes).
    Record(RecordArgs),
    /// Simulated nodes serving synthetic jobs on loopback addresses, for
    /// the scale test and `cargo xtask bench scale` (internal).
    #[command(name = "__simulate", hide = true)]
    Simulate(crate::export::simulate::SimulateArgs),
    /// The call-site symbolizer process the daemon starts (internal).
    #[command(name = "__symbolizer", hide = true)]
    Symbolizer,
    /// The child of `sites --measure` (internal): calls class N's function.
    #[command(name = "__step", hide = true)]
    Step {
        /// The class, by index.
        class: usize,
    },
    /// List MPI functions with their family and whether they are probed by
    /// default (or match --functions).
    Functions {
        /// Comma-separated globs or @family keywords, as for attach.
        #[arg(long)]
        functions: Option<String>,
    },
}

/// Options of `attach`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("targets").required(true).multiple(true).args(["pid", "all"]))]
pub struct AttachArgs {
    /// A rank's pid; repeat for several ranks.
    #[arg(long = "pid", value_name = "PID")]
    pub pid: Vec<u32>,
    /// Attach to every process on this machine that maps an MPI library,
    /// now and as they appear.
    #[arg(long)]
    pub all: bool,
    /// With --all, only attach to processes in this daemon's network
    /// namespace: for several observers on one machine (containers, or the
    /// multi-node test's namespaces), each owning its "node"'s ranks.
    #[arg(long, requires = "all")]
    pub same_netns: bool,
    /// Where to serve /metrics.
    #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// TLS and basic authentication for /metrics: a YAML file in the
    /// format of Prometheus exporters' web config (tls_server_config,
    /// basic_auth_users, http_server_config.headers); relative paths in it
    /// are relative to its directory.
    #[arg(long = "web.config.file", value_name = "FILE")]
    pub web_config_file: Option<PathBuf>,
    /// Functions to probe: comma-separated globs over standard names
    /// (MPI_Send, 'MPI_*reduce*') or keywords @default, @all, @p2p,
    /// @collective, @sync, @completion, @rma, @io, @local.
    #[arg(long, value_name = "GLOB,...")]
    pub functions: Option<String>,
    /// Seconds an exited rank's final figures stay exported.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub retain_exited: u64,
    /// Also export the latency histogram per rank, for the ranks whose full
    /// series are exported (more series).
    #[arg(long)]
    pub per_rank_histograms: bool,
    /// Export the full per-rank series of every rank on /metrics, as before
    /// the bounded exposition (docs/cardinality.md): for small clusters.
    #[arg(long)]
    pub per_rank_detail: bool,
    /// Ranks per job and node whose full per-rank series /metrics carries:
    /// half the most loaded (by MPI fraction), half the least; sticky.
    #[arg(long, value_name = "K", default_value_t = crate::export::metrics::DEFAULT_DETAIL_RANKS, value_parser = parse_detail_ranks)]
    pub detail_ranks: usize,
    /// Series per exposition (/metrics, /metrics/ranks) at most, self-metrics
    /// aside; those past it are dropped by priority and counted in
    /// mpi_observer_series_dropped.
    #[arg(long, value_name = "N", default_value_t = crate::export::metrics::DEFAULT_MAX_SERIES, value_parser = parse_max_series)]
    pub max_series: usize,
    /// Do not decode data arguments (no mpi_bytes_total): cheaper probes.
    #[arg(long)]
    pub no_bytes: bool,
    /// Kernel memory for the statistics map, shared by the CPUs: each
    /// (process, function) entry takes 376 bytes whatever the CPU count, at
    /// most 262,144 entries (the default holds them all); this bounds how
    /// many fit (README: "Kernel memory"); calls of a pair that finds the
    /// map full go to mpi_observer_map_update_failures_total. A size in
    /// bytes, or with KiB, MiB or GiB.
    #[arg(long, value_name = "SIZE", default_value = "256MiB", value_parser = parse_size)]
    pub map_memory: u64,
    /// No eBPF: serve only the shim's stats-layer figures (per-peer traffic,
    /// request health) of your own processes, without privileges.
    #[arg(long)]
    pub no_bpf: bool,
    /// Load the shim into each rank while it runs and route its MPI calls
    /// through it (docs/inject.md): the rank then runs at the shim's cost,
    /// nanoseconds a call, and loses its probes. The rank is stopped for
    /// about a millisecond, at the entry of its next MPI call.
    #[arg(long, conflicts_with = "no_bpf")]
    pub inject: bool,
    /// The tools list of an injected rank; it must include `stats`.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "stats",
        requires = "inject"
    )]
    pub inject_tools: String,
    /// Seconds to hold a rank traced while waiting for its next MPI call to
    /// inject at; a rank that makes none is let go, untraced, with the
    /// injection armed for its next call (its probes count until then).
    #[arg(long, value_name = "SECS", default_value_t = 30, requires = "inject")]
    pub inject_timeout: u64,
    /// Seconds an injected rank may take to load the shim (`dlopen` and its
    /// preparation) before the injection is undone and the rank stays
    /// observed by its probes: raise it on slow or overloaded nodes.
    #[arg(
        long,
        value_name = "SECS",
        default_value_t = crate::attach::inject::DEFAULT_LOAD_TIMEOUT.as_secs(),
        value_parser = clap::value_parser!(u64).range(1..=3600),
        requires = "inject"
    )]
    pub inject_load_timeout: u64,
    /// The socket where shim ranks knock at exit so their segment is held
    /// before they unlink it (docs/shim.md, "Exit handover"). Default: for
    /// root (or the owner of /run/mpi-observer, the package's unit)
    /// /run/mpi-observer/handover.sock, every user's; for a user without
    /// root, their own $XDG_RUNTIME_DIR/mpi-observer/handover.sock (else
    /// /run/user/UID/...). A path given must be in a directory of root's
    /// (or of this user's), made if missing. `none`: no handover. A shim
    /// knocks at both defaults unless the job sets
    /// MPI_OBSERVER_HANDOVER_SOCKET.
    #[arg(long, value_name = "PATH")]
    pub handover_socket: Option<PathBuf>,
    /// Print a live per-rank summary table every second.
    #[arg(long)]
    pub summary: bool,
    /// Write the report data (for `mpi-observer report FILE`) to FILE when
    /// the last observed rank exits, and again at shutdown; replaced
    /// atomically.
    #[arg(long, value_name = "FILE")]
    pub report_file: Option<PathBuf>,
    /// Also record per-call-site figures (the application's return address
    /// at each MPI call, symbolized): mpi_callsite_* series; costs one
    /// user-memory read per call.
    #[arg(long)]
    pub callsites: bool,
    /// Call sites with series of their own per (rank, function); the rest
    /// are summed in callsite="other" (docs/callsites.md).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub callsite_series: usize,
    /// Per user: live MPI processes observed at most; that user's further
    /// processes are refused and counted (docs/security.md). Default: twice
    /// the CPUs, at least 64.
    #[arg(long, value_name = "N")]
    pub user_max_processes: Option<usize>,
    /// Per user: uprobes plus uretprobes at most. Default: 1,000 per
    /// process of --user-max-processes.
    #[arg(long, value_name = "N")]
    pub user_max_probes: Option<usize>,
    /// Per user: entries of the kernel's statistics map at most (a process
    /// reserves one per function it is attached with). Default: half the
    /// map. The call-site map's per-user share is half of it.
    #[arg(long, value_name = "N")]
    pub user_max_map_entries: Option<usize>,
    /// The largest file (MPI library, executable, libc) read from a user's
    /// process; larger ones are refused with one line. A size in bytes, or
    /// with KiB, MiB or GiB.
    #[arg(long, value_name = "SIZE", default_value = "512MiB", value_parser = parse_size)]
    pub max_file_size: u64,
    /// Call-site names kept in the daemon's cache (least recently used
    /// evicted first; a rank keeps the names of its own sites for its life).
    #[arg(long, value_name = "N", default_value_t = crate::collect::callsites::DEFAULT_MAX_NAMES, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_callsite_names: u64,
    /// Address-space cap of the call-site symbolizer process
    /// (docs/callsites.md); a file that needs more is not symbolized.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    pub symbolizer_memory: u64,
    /// Seconds of the call-site symbolizer each user may spend in a burst,
    /// refilled at that many a minute (docs/callsites.md); past it that
    /// user's new call sites wait, as object+offset, and other users' are
    /// not delayed. 0: no budget (users are still served in turn).
    #[arg(long, value_name = "SECONDS", default_value_t = crate::collect::callsites::DEFAULT_BUDGET.as_secs(), value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub symbolizer_budget: u64,
    /// The longest the call-site symbolizer may take over one request (64
    /// offsets of one file), seconds (docs/callsites.md); past it the file
    /// keeps object+offset names for that user. Raise it where files are
    /// slow to read (network file systems) or the CPU is emulated.
    #[arg(long, value_name = "SECONDS", default_value_t = crate::attach::symbolizer::DEFAULT_DEADLINE.as_secs(), value_parser = clap::value_parser!(u64).range(1..=600))]
    pub symbolizer_timeout: u64,
    // --waits.peers and its files, boxed so that `Command` stays small.
    #[command(flatten)]
    pub waits: Box<WaitsPeersArgs>,
}

/// The options of `attach` that fetch other nodes' wait records.
#[derive(Debug, Args)]
pub struct WaitsPeersArgs {
    /// The daemons of the other nodes a job may span, by base URL
    /// (http://HOST:PORT or https://HOST:PORT, their --listen),
    /// comma-separated or repeated: their jobs' wait records are fetched
    /// every 500 ms from their /waits/records, so that instances with
    /// ranks on several nodes complete (docs/waits.md, "Across nodes").
    #[arg(
        long = "waits.peers",
        value_name = "URL[,URL...]",
        value_delimiter = ','
    )]
    pub peers: Vec<String>,
    /// For https:// --waits.peers: the CA certificate (PEM) that signed
    /// their certificates; they are verified against it only.
    #[arg(long = "waits.peers-ca-file", value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
    /// A file holding one line `user:password` for the basic
    /// authentication of --waits.peers, readable by its owner only (mode
    /// 0600); default: the file MPI_OBSERVER_AUTH_FILE names.
    #[arg(long = "waits.peers-auth-file", value_name = "PATH")]
    pub auth_file: Option<PathBuf>,
}

/// How `report` renders.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportFormat {
    /// mpiP-style text.
    Text,
    /// The analysis as JSON.
    Json,
    /// One self-contained HTML file with plots.
    Html,
}

/// Options of `report`.
#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Snapshot files written by `attach --report-file` (one per node).
    #[arg(value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// A live daemon's address, http://HOST:PORT or https://HOST:PORT (its
    /// --listen); repeat for several nodes.
    #[arg(long, value_name = "URL")]
    pub url: Vec<String>,
    /// For https:// URLs: the CA certificate (PEM) that signed the
    /// daemons' certificates; the servers are verified against it only.
    #[arg(long, value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
    /// A file holding one line `user:password` for the daemons' basic
    /// authentication, readable by its owner only (mode 0600); default:
    /// the file MPI_OBSERVER_AUTH_FILE names. Not the URL: a password on
    /// the command line is readable by every local user.
    #[arg(long, value_name = "PATH")]
    pub auth_file: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = ReportFormat::Text)]
    pub format: ReportFormat,
    /// Write the report to FILE instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Only this job.
    #[arg(long, value_name = "JOBID")]
    pub job: Option<String>,
    /// Only the ranks running as this uid: with --job, that user's job
    /// alone, whatever another user's processes claim (the Slurm Epilog
    /// gives the job's user).
    #[arg(long, value_name = "UID")]
    pub uid: Option<u32>,
    /// Lines per list (functions, call sites, imbalance, peer pairs).
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub top: usize,
    /// Seconds to wait for a daemon's answer.
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub timeout: u64,
}

/// Options of `record`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("targets").required(true).multiple(true).args(["pid", "all"]))]
pub struct RecordArgs {
    /// A rank to record; repeat for several.
    #[arg(long, value_name = "PID", conflicts_with = "all")]
    pub pid: Vec<u32>,
    /// Every rank of the one MPI job running on this node (see --job).
    #[arg(long)]
    pub all: bool,
    /// With --all: the job to record when several run.
    #[arg(long, value_name = "JOBID", requires = "all")]
    pub job: Option<String>,
    /// Stop after this many seconds (default: when every recorded rank has
    /// exited, or on Ctrl-C).
    #[arg(long, value_name = "SECS", value_parser = positive_seconds)]
    pub duration: Option<f64>,
    /// The directory the archive goes in (created if missing): DIR/traces.otf2.
    #[arg(short, long, value_name = "DIR")]
    pub output: PathBuf,
    /// MiB of the probes' trace ring, shared by the ranks recorded through
    /// probes (a power of two).
    #[arg(long, value_name = "MIB", default_value_t = 16, value_parser = ring_mib)]
    pub probe_ring_mib: u32,
    /// Keep each rank's events from its own start to its own stop, instead
    /// of cutting the archive where every rank ended one blocking
    /// collective on MPI_COMM_WORLD (what Scalasca and other readers that
    /// match events across ranks need).
    #[arg(long)]
    pub whole: bool,
}

fn positive_seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("`{s}` is not a positive number of seconds")),
    }
}

fn ring_mib(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(v) if v.is_power_of_two() && v <= 1024 => Ok(v),
        _ => Err(format!("`{s}` is not a power of two from 1 to 1024")),
    }
}

/// Options of `top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    /// An observer's address (its --listen); its /metrics/ranks (every rank in
    /// full) is read.
    #[arg(long, value_name = "URL", default_value = DEFAULT_LISTEN)]
    pub endpoint: String,
    /// A Prometheus server's base URL (as http://HOST:9090), to see every
    /// node it scrapes.
    #[arg(long, value_name = "URL", conflicts_with = "endpoint")]
    pub prometheus: Option<String>,
    /// For https:// URLs: the CA certificate (PEM) that signed the
    /// daemons' certificates; the server is verified against it only.
    #[arg(long, value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
    /// A file holding one line `user:password` for the server's basic
    /// authentication, readable by its owner only (mode 0600); default:
    /// the file MPI_OBSERVER_AUTH_FILE names. Not the URL: a password on
    /// the command line is readable by every local user.
    #[arg(long, value_name = "PATH")]
    pub auth_file: Option<PathBuf>,
    /// Seconds between readings.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub interval: f64,
    /// Open this job's ranks first.
    #[arg(long, value_name = "JOBID")]
    pub job: Option<String>,
    /// Quit by itself once every rank seen has exited, or the source stops
    /// answering after ranks were seen (for demos and scripts).
    #[arg(long)]
    pub exit_when_done: bool,
}

/// A size: a number of bytes, or a number followed by KiB, MiB or GiB.
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = [("KiB", 10), ("MiB", 20), ("GiB", 30), ("B", 0)]
        .iter()
        .find_map(|(u, sh)| t.strip_suffix(u).map(|n| (n.trim(), *sh)))
        .unwrap_or((t, 0));
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1 << shift))
        .filter(|&n| n > 0)
        .ok_or_else(|| {
            format!(
                "`{s}` is not a size: write bytes, or a number with KiB, MiB or GiB (e.g. 256MiB)"
            )
        })
}

/// The most `--detail-ranks` accepts: beyond it, `--per-rank-detail`.
const MAX_DETAIL_RANKS: usize = 1_000;
/// The most `--max-series` accepts.
const MAX_MAX_SERIES: usize = 100_000_000;

fn parse_detail_ranks(s: &str) -> Result<usize, String> {
    s.trim()
        .parse::<usize>()
        .ok()
        .filter(|&n| n <= MAX_DETAIL_RANKS)
        .ok_or_else(|| {
            format!(
                "`{s}` is not a number of detail ranks: give 0 to {MAX_DETAIL_RANKS} (0: none); for every rank use --per-rank-detail"
            )
        })
}

fn parse_max_series(s: &str) -> Result<usize, String> {
    s.trim()
        .replace('_', "")
        .parse::<usize>()
        .ok()
        .filter(|&n| (1..=MAX_MAX_SERIES).contains(&n))
        .ok_or_else(|| {
            format!("`{s}` is not a series budget: give a number from 1 to {MAX_MAX_SERIES} (default 50000)")
        })
}

/// Parses the command line.
pub fn parse() -> Cli {
    Cli::parse()
}

/// Parses from an explicit argument list (tests).
pub fn parse_from(args: impl IntoIterator<Item = OsString>) -> Cli {
    Cli::parse_from(args)
}

#[cfg(test)]
mod tests {
    use super::{Command, parse_detail_ranks, parse_from, parse_max_series, parse_size};

    #[test]
    fn sizes() {
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("3KiB"), Ok(3072));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("2 GiB"), Ok(2 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999GiB").is_err());
    }

    #[test]
    fn exposition_flags() {
        assert_eq!(parse_detail_ranks("0"), Ok(0));
        assert_eq!(parse_detail_ranks("4"), Ok(4));
        for bad in ["-1", "x", "1001", ""] {
            let e = parse_detail_ranks(bad).unwrap_err();
            assert!(e.contains("--per-rank-detail") && !e.contains('\n'), "{e}");
        }
        assert_eq!(parse_max_series("50_000"), Ok(50_000));
        for bad in ["0", "-5", "1e6", "100000001"] {
            assert!(parse_max_series(bad).is_err(), "{bad}");
        }
        let Command::Attach(a) =
            parse_from(["mpi-observer", "attach", "--all"].map(Into::into)).command
        else {
            panic!("attach");
        };
        assert_eq!(
            (a.per_rank_detail, a.detail_ranks, a.max_series),
            (false, 2, 50_000)
        );
        assert!(a.waits.peers.is_empty());
    }

    #[test]
    fn waits_peers_are_a_list() {
        let Command::Attach(a) = parse_from(
            [
                "mpi-observer",
                "attach",
                "--all",
                "--waits.peers",
                "http://n2:9479,http://n3:9479",
                "--waits.peers=https://n4:9479",
            ]
            .map(Into::into),
        )
        .command
        else {
            panic!("attach");
        };
        assert_eq!(
            a.waits.peers,
            ["http://n2:9479", "http://n3:9479", "https://n4:9479"]
        );
    }
}
