//! QMPI tools under the shim (issue 25): MPICH's QMPI tool interface on
//! every MPI, its instances ordered in one stack with PMPI tools and
//! `stats`. The tool and the program are in `tests/programs/qmpi/`, built
//! on every stack with the stack's `mpicc` and what `mpi-observer
//! qmpi-flags` prints, with warnings as errors.
//!
//! - `qcount.c` is a QMPI tool written for MPICH (`#include <mpi.h>` only):
//!   per instance it counts, through the storage it registered, the calls
//!   that reach it, and calls down with `QMPI_Get_function`. `qprog.c`
//!   makes a known number of calls; every instance must count exactly
//!   those, on Open MPI 4.1 and 5, Debian's MPICH 4.0.2 (whose own QMPI is
//!   a stub), MPICH 5.0.2 and its standard ABI.
//! - Mixed stacks: [PMPI tool, QMPI tool, `stats`, QMPI tool] with the
//!   QMPI tools in `MPI_TOOLS_ENTRY`, and [PMPI tool, `stats`] with them
//!   only in `MPIR_CVAR_QMPI_TOOL_LIST` (below every listed level): every
//!   level counts exactly the calls that reach it (the program's, and
//!   below the first QMPI tool the calls it makes itself, through
//!   `QMPI_Get_function` and directly), `stats`' figures scraped from a
//!   real daemon are exact, and the `v` layers line shows the order.
//! - Both placements in one stack, a name listed twice for a library in
//!   `MPI_TOOLS_ENTRY`: ids count top first, not in the list's order.
//! - Threads: cached `QMPI_Get_function` pointers called from 4 threads at
//!   once under `MPI_THREAD_MULTIPLE`, counts exact at every level.
//! - A Fortran program under the QMPI tool (Debian's stacks).
//! - A tool compiled into the executable, named only in the QMPI list.
//! - Without a QMPI list a tool is inert: its registration succeeds,
//!   nothing else happens, the job is unharmed.
//! - Refusals, one `mpi-observer-shim: QMPI: ` line per rank each and the
//!   job unharmed: a listed name nobody registered, a registration after the
//!   stack is built, an out-of-range procedure id, a tool built for another
//!   MPI than the running one.
//! - Built in the documented order (`mpicc $(mpi-observer qmpi-flags)
//!   SOURCES`, which `--as-needed` linkers make a test of its own), a tool
//!   and a program with a tool inside link on every MPI and, without the
//!   shim, run with QMPI inert, the tool also in a program that has no QMPI
//!   at all.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, compile, program, qmpi_flags, read_counts, require,
    run_with_timeout, scratch, shim, sum,
};

/// Every job here runs on 2 ranks.
const NP: u32 = 2;
/// Generous for a job of a second or two; a hang fails instead of blocking.
const DEADLINE: Duration = Duration::from_secs(120);
/// The start of every QMPI refusal the shim prints.
const REFUSAL: &str = "mpi-observer-shim: QMPI: ";

/// qprog.c's parameters: sends from rank 0 (receives at rank 1),
/// Allreduces, Comm_ranks after the first one, Barriers.
const SENDS: u64 = 4;
const REDUCES: u64 = 3;
const RANKS: u64 = 2;
const BARRIERS: u64 = 2;
/// With QPROG_THREADS: its threads, and the Allreduces and Barriers each
/// makes.
const THREADS: u64 = 4;
const THREAD_ITERS: u64 = 5;

/// What qcount.c counts, in its report's order.
const QCOUNTED: [&str; 6] = [
    "MPI_Send",
    "MPI_Recv",
    "MPI_Allreduce",
    "MPI_Barrier",
    "MPI_Comm_rank",
    "MPI_Finalize",
];

/// What tests/programs/callers/count.c (the PMPI tool) counts.
const PCOUNTED: [&str; 8] = [
    "MPI_Send",
    "MPI_Recv",
    "MPI_Sendrecv",
    "MPI_Barrier",
    "MPI_Allreduce",
    "MPI_Comm_rank",
    "MPI_Comm_size",
    "MPI_Type_size",
];

/// What the mixed tests read of `stats`' figures.
const STATS_FNS: [&str; 6] = [
    "MPI_Send",
    "MPI_Recv",
    "MPI_Allreduce",
    "MPI_Barrier",
    "MPI_Comm_rank",
    "MPI_Comm_size",
];

/// qprog.c's calls on `rank`, per function.
fn program_calls(rank: u32) -> BTreeMap<String, u64> {
    let (sends, recvs) = if rank == 0 { (SENDS, 0) } else { (0, SENDS) };
    [
        ("MPI_Send", sends),
        ("MPI_Recv", recvs),
        ("MPI_Sendrecv", 0),
        ("MPI_Allreduce", REDUCES),
        ("MPI_Barrier", BARRIERS),
        ("MPI_Comm_rank", 1 + RANKS),
        ("MPI_Comm_size", 1),
        ("MPI_Type_size", 0),
        ("MPI_Finalize", 1),
    ]
    .into_iter()
    .map(|(f, n)| (f.to_string(), n))
    .collect()
}

/// qprog.c's MPI_Send calls on `rank`.
fn sends_of(rank: u32) -> u64 {
    program_calls(rank)["MPI_Send"]
}

/// The part of [`program_calls`] a tool counting `functions` sees.
fn expected(rank: u32, functions: &[&str]) -> BTreeMap<String, u64> {
    let all = program_calls(rank);
    functions.iter().map(|f| (f.to_string(), all[*f])).collect()
}

/// Compiles `src` (under tests/programs/) to `out` with `mpi`'s compiler
/// wrapper and the QMPI `flags`, warnings as errors: the header must
/// compile cleanly everywhere. `-D_GNU_SOURCE` on the command line because
/// the flags' forced include brings `mpi.h`, and with it system headers,
/// before the source's own `#define _GNU_SOURCE` (which qcount.c needs for
/// `dladdr`).
fn build(mpi: Mpi, flags: &[String], src: &str, out: &Path, extra: &[&str]) {
    let mut args: Vec<&str> = vec!["-g", "-Wall", "-Werror", "-D_GNU_SOURCE"];
    args.extend(flags.iter().map(String::as_str));
    args.extend(extra);
    compile(mpi, &program(src), out, &args);
}

/// tests/programs/qmpi/qcount.c as `DIR/libNAME.so`, built with `mpi`'s
/// compiler wrapper and the QMPI `flags`: a QMPI tool registering NAME,
/// whose report [`QReport::read`] reads.
fn qtool(mpi: Mpi, flags: &[String], dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(format!("lib{name}.so"));
    build(mpi, flags, "qmpi/qcount.c", &out, &["-shared", "-fPIC"]);
    out
}

/// Compiled tools and programs for one stack.
struct Kit {
    mpi: Mpi,
    dir: PathBuf,
    flags: Vec<String>,
    /// The shim the tests preload.
    shim: PathBuf,
}

impl Kit {
    fn new(mpi: Mpi, test: &str) -> Kit {
        Kit {
            mpi,
            dir: scratch(&format!("qmpi-{test}-{}", mpi.name())),
            flags: qmpi_flags(),
            shim: shim(),
        }
    }

    /// See [`build`].
    fn build(&self, src: &str, out: &Path, extra: &[&str]) {
        build(self.mpi, &self.flags, src, out, extra);
    }

    /// qcount.c as `libNAME.so`: a QMPI tool registering NAME.
    fn qtool(&self, name: &str) -> PathBuf {
        qtool(self.mpi, &self.flags, &self.dir, name)
    }

    /// tests/programs/callers/count.c as `libNAME.so`: a PMPI tool counting
    /// the calls that reach its level.
    fn ptool(&self, name: &str) -> PathBuf {
        let out = self.dir.join(format!("lib{name}.so"));
        compile(
            self.mpi,
            &program("callers/count.c"),
            &out,
            &["-shared", "-fPIC", "-g"],
        );
        out
    }

    /// qprog.c.
    fn prog(&self) -> PathBuf {
        let out = self.dir.join("qprog");
        self.build("qmpi/qprog.c", &out, &["-pthread"]);
        out
    }

    /// qprog.c with qcount.c compiled in, registering `name`.
    fn prog_with_tool(&self, name: &str) -> PathBuf {
        let out = self.dir.join(format!("qprog-{name}"));
        let define = format!("-DQTOOL_NAME=\"{name}\"");
        self.build(
            "qmpi/qprog.c",
            &out,
            &[
                program("qmpi/qcount.c").to_str().unwrap(),
                define.as_str(),
                "-pthread",
            ],
        );
        out
    }

    /// Where qcount.c and count.c write their reports.
    fn out(&self, label: &str) -> PathBuf {
        self.dir.join(format!("{label}-count"))
    }

    /// A launcher for `app` on NP ranks with `preload` (the shim first,
    /// unless the test runs without it) preloaded into the ranks, `env`
    /// set in them (not in the launcher), and the tools' reports under
    /// `label`.
    fn launcher(
        &self,
        label: &str,
        preload: &[&Path],
        env: &[(&str, &str)],
        app: &Path,
    ) -> Command {
        let objects: Vec<String> = preload.iter().map(|p| p.display().to_string()).collect();
        let out = self.out(label).display().to_string();
        let mut all = vec![
            ("LD_PRELOAD", objects.join(":")),
            ("QCOUNT_OUT", out.clone()),
            ("COUNT_OUT", out),
        ];
        all.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
        let mut c = self.mpi.launcher(NP);
        c.current_dir(&self.dir);
        for (k, v) in &all {
            if self.mpi.is_open_mpi() {
                c.args(["-x", &format!("{k}={v}")]);
            } else {
                c.args(["-genv", k, v]);
            }
        }
        c.arg(app);
        c
    }

    /// Runs `app` to its end (see [`Kit::launcher`]); asserts it succeeded
    /// and every rank checked its results.
    fn run(&self, label: &str, preload: &[&Path], env: &[(&str, &str)], app: &Path) -> Ran {
        let o = run_with_timeout(&mut self.launcher(label, preload, env, app), DEADLINE);
        let ran = Ran {
            label: format!("{:?} {label}", self.mpi),
            out: String::from_utf8_lossy(&o.stdout).into_owned(),
            err: String::from_utf8_lossy(&o.stderr).into_owned(),
            prefix: self.out(label),
        };
        assert!(
            o.status.success(),
            "{}: the job failed ({}):\nstdout:\n{}\nstderr:\n{}",
            ran.label,
            o.status,
            ran.out,
            ran.err
        );
        ran.assert_results();
        ran
    }
}

/// One finished job's output.
struct Ran {
    label: String,
    out: String,
    err: String,
    /// The tools' report prefix.
    prefix: PathBuf,
}

impl Ran {
    /// Every rank checked its own results.
    fn assert_results(&self) {
        let ok = self
            .out
            .lines()
            .filter(|l| l.starts_with("DONE ") && l.ends_with(" ok"))
            .count();
        assert_eq!(
            ok, NP as usize,
            "{}: every rank checks its results:\n{}\nstderr:\n{}",
            self.label, self.out, self.err
        );
    }

    /// rank -> pid, from the READY lines.
    fn pids(&self) -> BTreeMap<u32, u32> {
        ready_pids(&self.out)
    }

    /// The shim's QMPI refusals.
    fn refusals(&self) -> Vec<&str> {
        self.err
            .lines()
            .filter(|l| l.starts_with(REFUSAL))
            .collect()
    }

    /// Asserts the shim refused nothing.
    fn assert_no_refusal(&self) {
        let r = self.refusals();
        assert!(
            r.is_empty(),
            "{}: unexpected refusals:\n{}",
            self.label,
            r.join("\n")
        );
    }

    /// Asserts one refusal per rank, each naming every word of `words`.
    fn assert_refusals(&self, words: &[&str]) {
        self.assert_refusal_kinds(&[words]);
    }

    /// Asserts one refusal per rank of each kind, a kind being the words
    /// its line names, and no other refusal.
    fn assert_refusal_kinds(&self, kinds: &[&[&str]]) {
        let r = self.refusals();
        assert_eq!(
            r.len(),
            NP as usize * kinds.len(),
            "{}: one refusal per rank naming each of {kinds:?}; stderr:\n{}",
            self.label,
            self.err
        );
        for words in kinds {
            let of_kind: Vec<&&str> = r
                .iter()
                .filter(|l| words.iter().all(|w| l.contains(w)))
                .collect();
            assert_eq!(
                of_kind.len(),
                NP as usize,
                "{}: one refusal per rank naming {words:?}; the refusals:\n{}",
                self.label,
                r.join("\n")
            );
            eprintln!("{}: refused: {}", self.label, of_kind[0]);
        }
    }

    /// The `v` layers line of every rank, as level shapes (see [`shape`]).
    fn layers(&self) -> Vec<Vec<Level>> {
        layers_lines(&self.err, &self.label)
    }

    /// qcount.c's report for tool `name` in rank `rank`.
    fn qreport(&self, name: &str, rank: u32) -> QReport {
        let pid = self.pids()[&rank];
        QReport::read(&self.prefix.with_extension(format!("{name}.{pid}")))
    }
}

/// rank -> pid, from a job's `READY RANK PID` lines.
fn ready_pids(out: &str) -> BTreeMap<u32, u32> {
    let m: BTreeMap<u32, u32> = out
        .lines()
        .filter_map(|l| l.strip_prefix("READY "))
        .map(|r| {
            let mut w = r.split_whitespace().map(|x| x.parse::<u32>().unwrap());
            (w.next().unwrap(), w.next().unwrap())
        })
        .collect();
    assert_eq!(m.len(), NP as usize, "a READY line per rank:\n{out}");
    m
}

/// One level of a `v` layers line.
#[derive(Debug)]
struct Level {
    /// `qmpi NAME id ID`, `stats`, `mpi`, `fortran`, or a PMPI tool's
    /// file name.
    what: String,
    /// What the line names in parentheses (a path, a library), if anything.
    path: String,
    entry_points: usize,
}

/// The `v` line of every rank in `err`: `mpi-observer-shim: pid P layers
/// (...): [0] WHAT: D entry points, [1] ...`, as levels.
fn layers_lines(err: &str, label: &str) -> Vec<Vec<Level>> {
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("mpi-observer-shim: pid ") && l.contains(" layers "))
        .collect();
    assert_eq!(
        lines.len(),
        NP as usize,
        "{label}: one `v` layers line per rank:\n{err}"
    );
    lines
        .iter()
        .map(|l| {
            let mut levels = Vec::new();
            let mut rest = &l[l.find("[0] ").unwrap_or_else(|| panic!("{label}: {l}"))..];
            for k in 0.. {
                let Some(body) = rest.strip_prefix(&format!("[{k}] ")) else {
                    break;
                };
                let end = body.find(&format!(", [{}] ", k + 1)).unwrap_or(body.len());
                let (text, count) = body[..end]
                    .rsplit_once(": ")
                    .unwrap_or_else(|| panic!("{label}: level {k} of {l}"));
                let entry_points = count
                    .strip_suffix(" entry points")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or_else(|| panic!("{label}: level {k} of {l}"));
                levels.push(shape(text, entry_points));
                rest = body[end..].strip_prefix(", ").unwrap_or("");
            }
            levels
        })
        .collect()
}

/// A level's description on the `v` line, shortened to what the tests
/// compare.
fn shape(text: &str, entry_points: usize) -> Level {
    let (head, path) = match text.split_once(" (") {
        Some((h, p)) => (h, p.strip_suffix(')').unwrap_or(p)),
        None => (text, ""),
    };
    let what = if head.starts_with("qmpi ") || ["stats", "mpi", "fortran"].contains(&head) {
        head.to_string()
    } else {
        // A PMPI tool: its list entry, a path.
        Path::new(head)
            .file_name()
            .map_or(head.into(), |f| f.to_string_lossy().into_owned())
    };
    Level {
        what,
        path: path.to_string(),
        entry_points,
    }
}

/// Asserts every rank's `v` line names `want` top first (the Fortran layer
/// above them aside), and that each QMPI instance came from `from` (a file
/// name) with qcount.c's six entry points.
fn assert_layers(ran: &Ran, want: &[&str], from: &BTreeMap<&str, &str>) {
    for levels in ran.layers() {
        let got: Vec<&str> = levels
            .iter()
            .map(|l| l.what.as_str())
            .filter(|w| *w != "fortran")
            .collect();
        assert_eq!(got, want, "{}: the stack, top first: {levels:?}", ran.label);
        for l in levels.iter().filter(|l| l.what.starts_with("qmpi ")) {
            let name = l.what.split(' ').nth(1).unwrap();
            assert!(
                Path::new(&l.path)
                    .file_name()
                    .is_some_and(|f| f.to_str() == from.get(name).copied()),
                "{}: instance {} must come from {:?}: {l:?}",
                ran.label,
                l.what,
                from.get(name)
            );
            assert_eq!(
                l.entry_points,
                QCOUNTED.len(),
                "{}: {} defines qcount.c's functions",
                ran.label,
                l.what
            );
        }
    }
}

/// qcount.c's report in one process (format in qcount.c).
#[derive(Debug, Default)]
struct QReport {
    path: PathBuf,
    /// What `QMPI_Register_tool_name` returned.
    register: Option<i64>,
    /// How many init callbacks ran.
    inits: Option<i64>,
    /// 0 if every `QMPI_Register_function` succeeded.
    functions: Option<i64>,
    badid: Option<i64>,
    /// With QCOUNT_BAD_ID: `refused`, `answered` or `not-asked`.
    badget: Option<String>,
    /// Instance id -> its figures (the counts by function name,
    /// `storage_bad`, `app`, `elsewhere`, `noaddr`).
    instances: BTreeMap<u32, BTreeMap<String, u64>>,
}

impl QReport {
    /// Reads `$QCOUNT_OUT.NAME.PID`; panics if it is missing or malformed.
    fn read(path: &Path) -> QReport {
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{}: {e} (the tool wrote no report)", path.display()));
        let mut r = QReport {
            path: path.to_path_buf(),
            ..QReport::default()
        };
        for l in text.lines() {
            let mut w = l.split_whitespace();
            let (Some(key), Some(value)) = (w.next(), w.next()) else {
                panic!("{}: {l:?}", path.display());
            };
            let n = || value.parse::<i64>().unwrap();
            match key {
                "register" => r.register = Some(n()),
                "inits" => r.inits = Some(n()),
                "functions" => r.functions = Some(n()),
                "badid" => r.badid = Some(n()),
                "badget" => r.badget = Some(value.to_string()),
                "instance" => {
                    let figures = w
                        .map(|kv| {
                            let (k, v) = kv.split_once('=').unwrap();
                            (k.to_string(), v.parse().unwrap())
                        })
                        .collect();
                    r.instances.insert(value.parse().unwrap(), figures);
                }
                _ => panic!("{}: unexpected line {l:?}", path.display()),
            }
        }
        r
    }

    /// Asserts the tool registered, its instances `ids` were initialised
    /// and registered their functions, and each counted exactly `rank`'s
    /// program calls, through its own storage, all called from the
    /// application (the executable).
    fn assert_exact(&self, label: &str, rank: u32, ids: &[u32]) {
        self.assert_counts(label, rank, ids, &expected(rank, &QCOUNTED));
    }

    /// [`QReport::assert_exact`] for a level that also sees calls a tool
    /// above it made: each instance counted exactly `want`; every call of
    /// the program among them was found called from the executable, and
    /// every call had a calling address.
    fn assert_counts(&self, label: &str, rank: u32, ids: &[u32], want: &BTreeMap<String, u64>) {
        let at = format!("{label}: rank {rank} ({})", self.path.display());
        assert_eq!(self.register, Some(0), "{at}: QMPI_Register_tool_name");
        assert_eq!(self.inits, Some(ids.len() as i64), "{at}: init callbacks");
        assert_eq!(self.functions, Some(0), "{at}: QMPI_Register_function");
        assert_eq!(
            self.instances.keys().copied().collect::<Vec<_>>(),
            ids,
            "{at}: instance ids"
        );
        let calls: u64 = want.values().sum();
        let program: u64 = expected(rank, &QCOUNTED).values().sum();
        for (id, figures) in &self.instances {
            let counts: BTreeMap<String, u64> = QCOUNTED
                .iter()
                .map(|f| (f.to_string(), figures[*f]))
                .collect();
            assert_eq!(&counts, want, "{at}: instance {id}'s counts");
            let f = |k: &str| figures[k];
            assert!(
                f("storage_bad") == 0
                    && f("noaddr") == 0
                    && f("app") >= program
                    && f("app") + f("elsewhere") == calls,
                "{at}: instance {id}: its own storage every time, and \
                 QMPI_Get_calling_address answering every call, naming the \
                 executable for the program's {program} calls: {figures:?}"
            );
        }
    }

    /// Asserts the tool registered and was never initialised: inert.
    fn assert_inert(&self, label: &str, rank: u32) {
        let at = format!("{label}: rank {rank} ({})", self.path.display());
        assert_eq!(self.register, Some(0), "{at}: QMPI_Register_tool_name");
        assert_eq!(self.inits, Some(0), "{at}: no init callback");
        assert!(self.instances.is_empty(), "{at}: no instance: {self:?}");
    }
}

/// A tool of our own with two instances (its name twice in
/// `MPIR_CVAR_QMPI_TOOL_LIST`), preloaded after the shim: both instances
/// count exactly the program's calls in every rank, each in its own
/// storage, and the `v` line shows them just above the library.
fn two_instances(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "two");
    let qa = kit.qtool("qa");
    let app = kit.prog();
    let ran = kit.run(
        "two",
        &[&kit.shim, &qa],
        &[
            ("MPI_TOOLS_ENTRY", "v"),
            ("MPIR_CVAR_QMPI_TOOL_LIST", "qa:qa"),
        ],
        &app,
    );
    ran.assert_no_refusal();
    assert_layers(
        &ran,
        &["qmpi qa id 1", "qmpi qa id 2", "mpi"],
        &[("qa", "libqa.so")].into(),
    );
    for rank in 0..NP {
        ran.qreport("qa", rank)
            .assert_exact(&ran.label, rank, &[1, 2]);
    }
}

e2e::per_mpi!(qmpi_two_instances => two_instances: openmpi, mpich, openmpi5, mpich5, mpich5_abi);

/// Both placements in one stack: `qa` in `MPI_TOOLS_ENTRY` above `stats`
/// and named twice in the QMPI list, `qb` preloaded and named first in
/// the list. `qa`'s two instances sit at its place, `qb`'s below `stats`;
/// ids count top first, whatever the list's order: qa 1 and 2, qb 3.
fn entry_and_list(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "entry-and-list");
    let (qa, qb) = (kit.qtool("qa"), kit.qtool("qb"));
    let app = kit.prog();
    let entry = format!("v,{},stats", qa.display());
    let ran = kit.run(
        "both",
        &[&kit.shim, &qb],
        &[
            ("MPI_TOOLS_ENTRY", &entry),
            ("MPIR_CVAR_QMPI_TOOL_LIST", "qb:qa:qa"),
        ],
        &app,
    );
    ran.assert_no_refusal();
    assert_layers(
        &ran,
        &[
            "qmpi qa id 1",
            "qmpi qa id 2",
            "stats",
            "qmpi qb id 3",
            "mpi",
        ],
        &[("qa", "libqa.so"), ("qb", "libqb.so")].into(),
    );
    for rank in 0..NP {
        ran.qreport("qa", rank)
            .assert_exact(&ran.label, rank, &[1, 2]);
        ran.qreport("qb", rank).assert_exact(&ran.label, rank, &[3]);
    }
}

e2e::per_mpi!(qmpi_entry_and_list => entry_and_list: openmpi, mpich);

/// Threads: qprog.c under `MPI_THREAD_MULTIPLE` with QPROG_THREADS (4
/// threads making Allreduces and Barriers at once, each on its own
/// communicator), a PMPI tool and `stats` above two instances of a tool
/// that asks `QMPI_Get_function` once per instance and function
/// (QCOUNT_CACHE) and calls the kept pointers from every thread: every
/// level counts exactly the program's calls.
fn threads(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "threads");
    let top = kit.ptool("top");
    let qa = kit.qtool("qa");
    let app = kit.prog();
    let entry = format!("v,{},stats", top.display());
    let ran = kit.run(
        "threads",
        &[&kit.shim, &qa],
        &[
            ("MPI_TOOLS_ENTRY", &entry),
            ("MPIR_CVAR_QMPI_TOOL_LIST", "qa:qa"),
            ("QCOUNT_CACHE", "qa"),
            ("QPROG_THREADS", "1"),
        ],
        &app,
    );
    ran.assert_no_refusal();
    assert_layers(
        &ran,
        &["libtop.so", "stats", "qmpi qa id 1", "qmpi qa id 2", "mpi"],
        &[("qa", "libqa.so")].into(),
    );
    let with_threads = |mut m: BTreeMap<String, u64>| {
        for f in ["MPI_Allreduce", "MPI_Barrier"] {
            *m.get_mut(f).unwrap() += THREADS * THREAD_ITERS;
        }
        m
    };
    for (rank, pid) in ran.pids() {
        let top = read_counts(&ran.prefix.with_extension(format!("top.{pid}")));
        assert_eq!(
            top,
            with_threads(expected(rank, &PCOUNTED)),
            "{} rank {rank}: the PMPI tool",
            ran.label
        );
        ran.qreport("qa", rank).assert_counts(
            &ran.label,
            rank,
            &[1, 2],
            &with_threads(expected(rank, &QCOUNTED)),
        );
    }
}

e2e::per_mpi!(qmpi_threads => threads: openmpi, mpich, openmpi5, mpich5);

/// A Fortran program (`use mpi`), qfort.f90 with qprog.c's calls: through
/// the shim's Fortran layer, `stats` and two instances of the C QMPI tool
/// count exactly its calls, found called from the executable. Debian's
/// stacks only: the PyPI wheels ship no Fortran (callers.rs asserts it).
fn fortran(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi), Need::Command(mpi.mpifort().leak())]) {
        return;
    }
    let kit = Kit::new(mpi, "fortran");
    let qa = kit.qtool("qa");
    let app = kit.dir.join("qfort");
    compile(mpi, &program("qmpi/qfort.f90"), &app, &["-g"]);
    let ran = kit.run(
        "fortran",
        &[&kit.shim, &qa],
        &[
            ("MPI_TOOLS_ENTRY", "v,stats"),
            ("MPIR_CVAR_QMPI_TOOL_LIST", "qa:qa"),
        ],
        &app,
    );
    ran.assert_no_refusal();
    assert_layers(
        &ran,
        &["stats", "qmpi qa id 1", "qmpi qa id 2", "mpi"],
        &[("qa", "libqa.so")].into(),
    );
    for rank in 0..NP {
        ran.qreport("qa", rank)
            .assert_exact(&ran.label, rank, &[1, 2]);
    }
}

e2e::per_mpi!(qmpi_fortran => fortran: openmpi, mpich);

/// Where a mixed stack's QMPI tools are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Placement {
    /// In `MPI_TOOLS_ENTRY`, at their places: [top, qa, stats, qb].
    Entry,
    /// Only in `MPIR_CVAR_QMPI_TOOL_LIST` (preloaded after the shim):
    /// below every listed level, [top, stats, qa, qb].
    List,
}

/// One rank's non-zero `name` series as (peer, direction) -> value.
fn peer_series(s: &[Sample], name: &str, rank: u32) -> BTreeMap<(String, String), u64> {
    s.iter()
        .filter(|x| x.name == name && x.label("rank") == Some(&rank.to_string()) && x.value != 0.0)
        .map(|x| {
            (
                (
                    x.label("peer").unwrap_or("?").to_string(),
                    x.label("direction").unwrap_or("?").to_string(),
                ),
                x.value as u64,
            )
        })
        .collect()
}

/// [PMPI tool, QMPI tool, `stats`, QMPI tool] in `placement`: the PMPI
/// tool, both QMPI instances and `stats` (its counts, timings, histogram
/// and messages through a real daemon's scrape) each see exactly the
/// calls that reach them, and the `v` line shows the order. The calls: the program's, and on rank 0 (the
/// sender) the two MPI_Comm_rank `qa` makes in each send (qcount.c's
/// QCOUNT_CHATTY), which the levels below `qa` see and the ones above it
/// do not; rank 1 makes none, so every level sees only the program's.
fn mixed(mpi: Mpi, placement: Placement) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let test = match placement {
        Placement::Entry => "entry",
        Placement::List => "list",
    };
    let kit = Kit::new(mpi, &format!("mixed-{test}"));
    let top = kit.ptool("top");
    let (qa, qb) = (kit.qtool("qa"), kit.qtool("qb"));
    let app = kit.prog();
    let (entry, preload, list, want) = match placement {
        Placement::Entry => (
            format!(
                "v,{},{},stats,{}",
                top.display(),
                qa.display(),
                qb.display()
            ),
            vec![kit.shim.as_path()],
            None,
            ["libtop.so", "qmpi qa id 1", "stats", "qmpi qb id 2", "mpi"],
        ),
        Placement::List => (
            format!("v,{},stats", top.display()),
            vec![kit.shim.as_path(), qa.as_path(), qb.as_path()],
            Some("qa:qb"),
            ["libtop.so", "stats", "qmpi qa id 1", "qmpi qb id 2", "mpi"],
        ),
    };
    let mut env = vec![("MPI_TOOLS_ENTRY", entry.as_str()), ("QCOUNT_CHATTY", "qa")];
    if let Some(l) = list {
        env.push(("MPIR_CVAR_QMPI_TOOL_LIST", l));
    }
    // The `v` line goes to the ranks' stderr, which Job leaves to the
    // terminal: the launcher runs under sh, its stderr into a file.
    let err_file = kit.dir.join("stderr");
    let inner = kit.launcher(test, &preload, &env, &app);
    let mut outer = Command::new("sh");
    outer
        .current_dir(&kit.dir)
        .arg("-c")
        .arg(format!("exec \"$0\" \"$@\" 2>'{}'", err_file.display()))
        .arg(inner.get_program())
        .args(inner.get_args());
    for (k, v) in inner.get_envs() {
        if let Some(v) = v {
            outer.env(k, v);
        }
    }
    let job = Job::spawn(outer, NP, kit.dir.join("go"));
    let ranks = job.ranks.clone();
    let mut d = Daemon::start(&[vec!["--no-bpf".to_string()], job.pid_args()].concat());
    d.wait_stats_figures(NP);
    job.finish("DONE ");
    let s = d.final_scrape();
    let err = std::fs::read_to_string(&err_file).unwrap();
    // Job::finish saw every rank's DONE line (qprog.c prints it after its
    // checks) and keeps the output: what Ran needs of it, rebuilt.
    let out: String = ranks
        .iter()
        .map(|(r, p)| format!("READY {r} {p}\nDONE {r} ok\n"))
        .collect();
    let ran = Ran {
        label: format!("{mpi:?} mixed {test}"),
        out,
        err,
        prefix: kit.out(test),
    };
    ran.assert_no_refusal();
    assert_layers(
        &ran,
        &want,
        &[("qa", "libqa.so"), ("qb", "libqb.so")].into(),
    );
    // Calls per function that stats timed, over the ranks.
    let mut timed: BTreeMap<String, u64> = BTreeMap::new();
    for (rank, pid) in ranks {
        let label = &ran.label;
        // What a level below `qa` sees: qa's own calls as well.
        let below_qa = |mut m: BTreeMap<String, u64>| {
            *m.get_mut("MPI_Comm_rank").unwrap() += 2 * sends_of(rank);
            m
        };
        let top = read_counts(&ran.prefix.with_extension(format!("top.{pid}")));
        assert_eq!(
            top,
            expected(rank, &PCOUNTED),
            "{label} rank {rank}: the PMPI tool"
        );
        ran.qreport("qa", rank).assert_exact(label, rank, &[1]);
        ran.qreport("qb", rank).assert_counts(
            label,
            rank,
            &[2],
            &below_qa(expected(rank, &QCOUNTED)),
        );
        let r = rank.to_string();
        let stats: BTreeMap<String, u64> = STATS_FNS
            .iter()
            .map(|f| {
                let n = sum(&s, "mpi_calls_total", &[("rank", &r), ("function", f)]);
                (f.to_string(), n as u64)
            })
            .collect();
        let want = match placement {
            Placement::Entry => below_qa(expected(rank, &STATS_FNS)),
            Placement::List => expected(rank, &STATS_FNS),
        };
        assert_eq!(stats, want, "{label} rank {rank}: stats' mpi_calls_total");
        // Timed, each call that reached stats.
        for (f, n) in &want {
            let secs = sum(
                &s,
                "mpi_call_seconds_total",
                &[("rank", &r), ("function", f)],
            );
            assert!(
                (*n > 0) == (secs > 0.0) && secs.is_finite(),
                "{label} rank {rank}: {f}: {n} calls, {secs} s"
            );
            *timed.entry(f.clone()).or_insert(0) += n;
        }
        // qprog.c's messages: SENDS ints from rank 0 to rank 1.
        let dir = if rank == 0 { "send" } else { "recv" };
        let peer = (1 - rank).to_string();
        for (name, n) in [
            ("mpi_peer_messages_total", SENDS),
            ("mpi_peer_bytes_total", 4 * SENDS),
        ] {
            assert_eq!(
                peer_series(&s, name, rank),
                [((peer.clone(), dir.to_string()), n)].into(),
                "{label} rank {rank}: stats' {name}"
            );
        }
    }
    // The job's histogram has every timed call.
    for (f, n) in timed {
        let count = sum(&s, "mpi_call_duration_seconds_count", &[("function", &f)]);
        assert_eq!(
            count as u64, n,
            "{}: {f}: stats' mpi_call_duration_seconds_count",
            ran.label
        );
    }
}

e2e::per_mpi!(qmpi_mixed_entry => mixed(Placement::Entry): openmpi, mpich, openmpi5, mpich5, mpich5_abi);
e2e::per_mpi!(qmpi_mixed_list => mixed(Placement::List): openmpi, mpich, openmpi5, mpich5, mpich5_abi);

/// A tool compiled into the executable and named only in the QMPI list
/// (as `MPICH_QMPI_TOOL_LIST`, the other name MPICH reads): its instance
/// sits below `stats` and counts exactly the program's calls.
fn compiled_in(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "compiled-in");
    let app = kit.prog_with_tool("qin");
    let ran = kit.run(
        "in",
        &[&kit.shim],
        &[
            ("MPI_TOOLS_ENTRY", "v,stats"),
            ("MPICH_QMPI_TOOL_LIST", "qin"),
        ],
        &app,
    );
    ran.assert_no_refusal();
    assert_layers(
        &ran,
        &["stats", "qmpi qin id 1", "mpi"],
        // The shim names no path for the executable.
        &[("qin", "the program")].into(),
    );
    for rank in 0..NP {
        ran.qreport("qin", rank)
            .assert_exact(&ran.label, rank, &[1]);
    }
}

e2e::per_mpi!(qmpi_compiled_in => compiled_in: openmpi, mpich, mpich5);

/// No QMPI list: a preloaded tool and one compiled into the executable
/// both register successfully and stay inert (no instance, no init, no
/// level, no line), and the job is unharmed.
fn inert(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "inert");
    let qa = kit.qtool("qa");
    let app = kit.prog_with_tool("qin");
    let ran = kit.run(
        "inert",
        &[&kit.shim, &qa],
        &[("MPI_TOOLS_ENTRY", "v")],
        &app,
    );
    ran.assert_no_refusal();
    assert_layers(&ran, &["mpi"], &BTreeMap::new());
    for rank in 0..NP {
        ran.qreport("qa", rank).assert_inert(&ran.label, rank);
        ran.qreport("qin", rank).assert_inert(&ran.label, rank);
    }
}

e2e::per_mpi!(qmpi_inert => inert: openmpi, mpich);

/// Bad input, one `mpi-observer-shim: QMPI:` line per rank each and the
/// job unharmed (exit 0, right results, the listed tool's counts exact):
/// a listed name nobody registered; a registration from `main` after
/// `MPI_Init` (refused with a non-zero return, its init never run); a
/// function registered for an out-of-range procedure id, and a lookup of
/// that id from a tool's function (each refused with a non-zero return,
/// its own line).
fn refusals(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "refusals");
    let qa = kit.qtool("qa");
    let app = kit.prog();
    let from: BTreeMap<&str, &str> = [("qa", "libqa.so")].into();

    let ran = kit.run(
        "unknown",
        &[&kit.shim, &qa],
        &[
            ("MPI_TOOLS_ENTRY", "v"),
            ("MPIR_CVAR_QMPI_TOOL_LIST", "qa:nosuchtool"),
        ],
        &app,
    );
    ran.assert_refusals(&["nosuchtool"]);
    assert_layers(&ran, &["qmpi qa id 1", "mpi"], &from);
    for rank in 0..NP {
        ran.qreport("qa", rank).assert_exact(&ran.label, rank, &[1]);
    }

    let ran = kit.run(
        "late",
        &[&kit.shim, &qa],
        &[("MPIR_CVAR_QMPI_TOOL_LIST", "qa"), ("QPROG_LATE", "1")],
        &app,
    );
    ran.assert_refusals(&["late"]);
    let late: Vec<&str> = ran.out.lines().filter(|l| l.starts_with("LATE ")).collect();
    assert_eq!(late.len(), NP as usize, "{}: {}", ran.label, ran.out);
    for l in late {
        assert!(
            !l.contains(" rc=0 ") && l.ends_with(" init=0"),
            "{}: a late registration returns non-zero and its init never runs: {l}",
            ran.label
        );
    }
    for rank in 0..NP {
        ran.qreport("qa", rank).assert_exact(&ran.label, rank, &[1]);
    }

    let ran = kit.run(
        "badid",
        &[&kit.shim, &qa],
        &[("MPIR_CVAR_QMPI_TOOL_LIST", "qa"), ("QCOUNT_BAD_ID", "1")],
        &app,
    );
    ran.assert_refusal_kinds(&[&["QMPI_Register_function"], &["QMPI_Get_function"]]);
    for rank in 0..NP {
        let r = ran.qreport("qa", rank);
        assert!(
            r.badid.is_some_and(|rc| rc != 0) && r.badget.as_deref() == Some("refused"),
            "{}: rank {rank}: QMPI_Register_function and QMPI_Get_function for \
             MPI_LAST_FUNC_T must fail: {r:?}",
            ran.label
        );
        r.assert_exact(&ran.label, rank, &[1]);
    }
}

e2e::per_mpi!(qmpi_refusals => refusals: openmpi, mpich);

/// A tool built with Debian's MPICH 4.0.2 `mpi.h` (its procedure ids, its
/// build marker) in a job of MPICH 5.0.2 (the same `libmpi.so.12` ABI, other
/// ids): refused with one line per rank naming both MPIs and the way to
/// rebuild, its instances left out, the job unharmed.
#[test]
fn qmpi_refuses_a_tool_built_for_another_mpi() {
    if !require(&[Need::Mpi(Mpi::Mpich), Need::Mpi(Mpi::Mpich5)]) {
        return;
    }
    let old = Kit::new(Mpi::Mpich, "other-mpi");
    let qa = old.qtool("qa");
    let kit = Kit::new(Mpi::Mpich5, "other-mpi");
    let app = kit.prog();
    let ran = kit.run(
        "other",
        &[&kit.shim, &qa],
        &[("MPI_TOOLS_ENTRY", "v"), ("MPIR_CVAR_QMPI_TOOL_LIST", "qa")],
        &app,
    );
    ran.assert_refusals(&["4.0.2", "5.0.2", "qmpi-flags"]);
    assert_layers(&ran, &["mpi"], &BTreeMap::new());
    for rank in 0..NP {
        let r = ran.qreport("qa", rank);
        assert_eq!(
            r.inits,
            Some(0),
            "{}: rank {rank}: left out: {r:?}",
            ran.label
        );
        assert!(r.instances.is_empty(), "{}: rank {rank}: {r:?}", ran.label);
    }
}

/// `MPICC -g -Wall -Werror -D_GNU_SOURCE $(mpi-observer qmpi-flags)
/// SOURCES EXTRA -o OUT`: the flags before the sources, in the order
/// docs/shim.md gives (`mpicc $(mpi-observer qmpi-flags) tool.c ...`), so
/// that whatever they need to link comes out right in that order too.
fn build_as_documented(mpi: Mpi, flags: &[String], srcs: &[&str], out: &Path, extra: &[&str]) {
    let cc = mpi.mpicc();
    let o = Command::new(&cc)
        .args(["-g", "-Wall", "-Werror", "-D_GNU_SOURCE"])
        .args(flags)
        .args(srcs.iter().map(|s| program(s)))
        .args(extra)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        o.status.success(),
        "{cc} {} {srcs:?} {extra:?} -o {} failed:\n{}",
        flags.join(" "),
        out.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Built as the documentation says, a QMPI tool and a program with one
/// compiled in run WITHOUT the shim, on every MPI: QMPI is then inert as on
/// a stubbed MPICH (registration fails, no init callback runs; on Open MPI
/// and the standard ABI the stub library answers), the job is unharmed,
/// and the program's own late registration fails too. The tool also goes
/// into an ordinary MPI program (plain `mpicc`, nothing of QMPI in it):
/// the tool itself must bring what answers its `QMPI_*` calls there.
fn as_documented(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "documented");
    let qa = kit.dir.join("libqa.so");
    build_as_documented(
        mpi,
        &kit.flags,
        &["qmpi/qcount.c"],
        &qa,
        &["-shared", "-fPIC"],
    );
    let app = kit.dir.join("qprog-qin");
    build_as_documented(
        mpi,
        &kit.flags,
        &["qmpi/qprog.c", "qmpi/qcount.c"],
        &app,
        &["-DQTOOL_NAME=\"qin\"", "-pthread"],
    );
    let ran = kit.run(
        "noshim",
        &[&qa],
        &[("MPIR_CVAR_QMPI_TOOL_LIST", "qa:qin"), ("QPROG_LATE", "1")],
        &app,
    );
    assert!(
        !ran.err.contains("mpi-observer-shim"),
        "{}: no shim here:\n{}",
        ran.label,
        ran.err
    );
    let late: Vec<&str> = ran.out.lines().filter(|l| l.starts_with("LATE ")).collect();
    assert_eq!(late.len(), NP as usize, "{}: {}", ran.label, ran.out);
    for rank in 0..NP {
        for tool in ["qa", "qin"] {
            let r = ran.qreport(tool, rank);
            assert!(
                r.register.is_some_and(|rc| rc != 0)
                    && r.inits == Some(0)
                    && r.instances.is_empty(),
                "{}: rank {rank}: without the shim {tool} must be refused and inert: {r:?}",
                ran.label
            );
        }
    }
    for l in late {
        assert!(
            !l.contains(" rc=0 ") && l.ends_with(" init=0"),
            "{}: {l}",
            ran.label
        );
    }

    let plain = kit.dir.join("qprog-plain");
    compile(
        mpi,
        &program("qmpi/qprog.c"),
        &plain,
        &["-DNO_QMPI", "-pthread"],
    );
    let ran = kit.run(
        "plain",
        &[&qa],
        &[("MPIR_CVAR_QMPI_TOOL_LIST", "qa")],
        &plain,
    );
    for rank in 0..NP {
        let r = ran.qreport("qa", rank);
        assert!(
            r.register.is_some_and(|rc| rc != 0) && r.inits == Some(0) && r.instances.is_empty(),
            "{}: rank {rank}: without the shim qa must be refused and inert: {r:?}",
            ran.label
        );
    }
}

e2e::per_mpi!(qmpi_as_documented => as_documented: openmpi, mpich, openmpi5, mpich5, mpich5_abi);
