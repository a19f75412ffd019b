//! End-to-end tests of the layering shim (issue 3): real MPI jobs with the
//! shim in `LD_PRELOAD` and PMPI tools compiled here with the implementation's
//! `mpicc`. The programs are in `tests/programs/shim/`; the tool logs its
//! Init/Finalize order and prints exact call counts from a destructor.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output},
    time::{Duration, Instant},
};

use e2e::{Mpi, Need, compile, observer_bin, program, require, run_with_timeout, scratch, shim};

/// Generous for a job of a second or two; a hang fails instead of blocking.
const DEADLINE: Duration = Duration::from_secs(120);
/// "Within seconds": what a bad list may take to fail every rank.
const FAIL_DEADLINE: Duration = Duration::from_secs(30);

/// Compiled tools and programs for one implementation.
struct Kit {
    mpi: Mpi,
    dir: PathBuf,
}

impl Kit {
    fn new(mpi: Mpi, test: &str) -> Kit {
        Kit {
            mpi,
            dir: scratch(&format!("shim-{test}-{}", mpi.name())),
        }
    }

    /// `libshimtoolNAME.so`; `barrier_in_allreduce` makes its MPI_Allreduce
    /// call MPI_Barrier first, the seed's example of a tool calling MPI_.
    fn tool(&self, name: &str, barrier_in_allreduce: bool) -> PathBuf {
        let out = self.dir.join(format!("libshimtool{name}.so"));
        let define = format!("-DTOOL=\"{name}\"");
        let mut extra = vec!["-shared", "-fPIC", define.as_str()];
        if barrier_in_allreduce {
            extra.push("-DBARRIER_IN_ALLREDUCE");
        }
        compile(self.mpi, &program("shim/tool.c"), &out, &extra);
        out
    }

    fn program(&self, src: &str, extra: &[&str]) -> PathBuf {
        let stem = Path::new(src).file_stem().unwrap().to_str().unwrap();
        let out = self.dir.join(stem);
        compile(self.mpi, &program(&format!("shim/{src}")), &out, extra);
        out
    }

    /// A job with the shim preloaded into the ranks (not into the launcher)
    /// and `env` set in them.
    fn job(&self, np: u32, env: &[(&str, &str)], mca_list: Option<&str>, prog: &Path) -> Command {
        let mut c = self.mpi.launcher(np);
        c.current_dir(&self.dir);
        let shim = shim();
        let shim = shim.to_str().unwrap();
        if self.mpi.is_open_mpi() {
            c.args(["-x", &format!("LD_PRELOAD={shim}")]);
            for (k, v) in env {
                c.args(["-x", &format!("{k}={v}")]);
            }
            if let Some(list) = mca_list {
                c.args(["--mca", "ompi_tools_entry", list]);
            }
        } else {
            assert!(mca_list.is_none(), "--mca is Open MPI's");
            c.args(["-genv", "LD_PRELOAD", shim]);
            for (k, v) in env {
                c.args(["-genv", k, v]);
            }
        }
        c.arg(prog);
        c
    }
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn assert_ok(o: &Output) -> (String, String) {
    let (out, err) = text(o);
    assert!(
        o.status.success(),
        "job failed ({}):\nstdout:\n{out}\nstderr:\n{err}",
        o.status
    );
    (out, err)
}

/// Tool lines per rank process: pid -> [(tool, event)] in output order.
fn tool_events(stdout: &str) -> BTreeMap<u32, Vec<(String, String)>> {
    let mut m: BTreeMap<u32, Vec<(String, String)>> = BTreeMap::new();
    for l in stdout.lines() {
        let Some(rest) = l.strip_prefix("shimtest pid=") else {
            continue;
        };
        let (pid, rest) = rest.split_once(' ').unwrap();
        let (tool, event) = rest.strip_prefix("tool=").unwrap().split_once(' ').unwrap();
        m.entry(pid.parse().unwrap())
            .or_default()
            .push((tool.to_string(), event.to_string()));
    }
    m
}

/// A tool's counters in one process.
fn counts(events: &[(String, String)], tool: &str) -> BTreeMap<String, u64> {
    let line = events
        .iter()
        .find(|(t, e)| t == tool && e.starts_with("counts "))
        .unwrap_or_else(|| panic!("no counts from tool {tool} in {events:?}"));
    line.1["counts ".len()..]
        .split_whitespace()
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// How the tools list reaches the ranks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Via {
    /// `MPI_TOOLS_ENTRY` in the ranks' environment.
    Env,
    /// `mpirun --mca ompi_tools_entry LIST`.
    Mca,
    /// `mpirun -np 4 mpi-observer run --tools LIST -- ./app`, with `preload`.
    Run,
}

/// Two tools, A above B, with the built-in `stats` layer between them; B's
/// MPI_Allreduce calls MPI_Barrier. Checks list
/// order at Init and Finalize, that B's MPI_Barrier reaches B's own wrapper
/// and not A's, Pcontrol reaching both, and the app's results.
fn order_and_resolution(mpi: Mpi, via: Via) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let name = match via {
        Via::Env => "order",
        Via::Mca => "order-mca",
        Via::Run => "order-run",
    };
    let kit = Kit::new(mpi, name);
    let a = kit.tool("A", false);
    let b = kit.tool("B", true);
    let app = kit.program("app.c", &[]);
    // The built-in `stats` layer sits between them: it must change neither
    // order nor counts, and take Pcontrol without repeating it.
    let list = format!("v,{},stats,{}", a.display(), b.display());
    let np = if via == Via::Run { 4 } else { 3 };
    let mut job = match via {
        Via::Env => kit.job(np, &[("MPI_TOOLS_ENTRY", &list)], None, &app),
        // Here the loader finds the tools: A by short name, B by file name.
        Via::Mca => kit.job(
            np,
            &[("LD_LIBRARY_PATH", kit.dir.to_str().unwrap())],
            Some("v,shimtoolA,stats,libshimtoolB.so"),
            &app,
        ),
        Via::Run => {
            let mut c = mpi.launcher(np);
            c.current_dir(&kit.dir)
                .arg(observer_bin())
                .args(["run", "--tools", &format!("preload,{list}"), "--"])
                .arg(&app);
            c
        }
    };
    let o = run_with_timeout(&mut job, DEADLINE);
    let (out, err) = assert_ok(&o);
    let n = np as usize;
    let sum = format!("sum={0} expected={0}", n * (n - 1) / 2);

    // `v`: one line per rank, both tools in list order below the Fortran layer.
    let v: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("mpi-observer-shim: pid "))
        .collect();
    assert_eq!(v.len(), n, "one `v` line per rank:\n{err}");
    for l in &v {
        let (ia, is, ib) = (
            l.find("[1] ").unwrap(),
            l.find("[2] stats (built-in)").unwrap(),
            l.find("[3] ").unwrap(),
        );
        assert!(
            l[ia..is].contains("libshimtoolA.so") && l[ib..].contains("libshimtoolB.so"),
            "{l}"
        );
        assert!(
            l.contains("[0] fortran") && ia < is && is < ib && l.contains("[4] mpi"),
            "{l}"
        );
    }

    let apps: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("shimtest app "))
        .collect();
    assert_eq!(apps.len(), n, "{out}");
    for l in &apps {
        assert!(l.contains(&sum) && l.contains("wtick_ok=1"), "{l}");
    }
    // The ring adds every rank's number on its way back to rank 0.
    let token = format!("token={}", n * (n - 1) / 2);
    assert!(
        apps.iter()
            .any(|l| l.contains("rank=0 ") && l.contains(&token)),
        "{out}"
    );

    let events = tool_events(&out);
    assert_eq!(events.len(), n, "tool output from every rank:\n{out}");
    for (pid, ev) in &events {
        let order: Vec<String> = ev
            .iter()
            .filter(|(_, e)| e.contains("MPI_Init") || e.contains("MPI_Finalize"))
            .map(|(t, e)| format!("{t} {e}"))
            .collect();
        assert_eq!(
            order,
            [
                "A before MPI_Init",
                "B before MPI_Init",
                "B after MPI_Init",
                "A after MPI_Init",
                "A before MPI_Finalize",
                "B before MPI_Finalize",
                "B after MPI_Finalize",
                "A after MPI_Finalize"
            ],
            "pid {pid}"
        );
        let (ca, cb) = (counts(ev, "A"), counts(ev, "B"));
        // The app's barrier passes both; B's own barrier starts at B's level.
        assert_eq!(
            (ca["barrier"], ca["allreduce"]),
            (1, 1),
            "A in pid {pid}: {ca:?}"
        );
        assert_eq!(
            (
                cb["barrier"],
                cb["barrier_in_own_allreduce"],
                cb["allreduce"]
            ),
            (2, 1, 1),
            "B in pid {pid}: {cb:?}"
        );
        assert_eq!(
            (ca["send"], cb["send"], ca["recv"], cb["recv"]),
            (1, 1, 1, 1),
            "pid {pid}"
        );
        // MPI_Pcontrol(2, ...) reaches every layer once, with its level.
        assert_eq!((ca["pcontrol"], cb["pcontrol"]), (1, 1), "pid {pid}");
        assert!(
            ev.iter()
                .any(|(t, e)| t == "B" && e == "MPI_Pcontrol level=2"),
            "pid {pid}: {ev:?}"
        );
    }
}

e2e::per_mpi!(shim_order_and_resolution_env => order_and_resolution(Via::Env): openmpi, mpich);
e2e::per_mpi!(shim_order_and_resolution_mca => order_and_resolution(Via::Mca): openmpi);
e2e::per_mpi!(shim_launcher_run => order_and_resolution(Via::Run): openmpi, mpich);

/// `use mpi` and `use mpi_f08`: a C tool wrapping MPI_Send/MPI_Recv sees the
/// Fortran calls with `fort` on top (the default, or listed first) and not
/// with `fort` listed last.
fn fortran(mpi: Mpi) {
    let kit = Kit::new(mpi, "fortran");
    let a = kit.tool("A", false);
    let a = a.to_str().unwrap();
    for src in ["fort_mpi.f90", "fort_f08.f90"] {
        let prog = kit.program(src, &[]);
        for (list, seen) in [
            (a.to_string(), 3),
            (format!("fort,{a}"), 3),
            (format!("{a},fortran"), 0),
        ] {
            let o = run_with_timeout(
                &mut kit.job(2, &[("MPI_TOOLS_ENTRY", &list)], None, &prog),
                DEADLINE,
            );
            let (out, _) = assert_ok(&o);
            assert_eq!(
                out.lines()
                    .filter(|l| l.starts_with("shimtest fortran rank=1 buf=0 tick_ok=T"))
                    .count(),
                1,
                "{src}: {out}"
            );
            let events = tool_events(&out);
            assert_eq!(events.len(), 2, "{src} {list}: {out}");
            let (mut sends, mut recvs) = (0, 0);
            for ev in events.values() {
                let c = counts(ev, "A");
                sends += c["send"];
                recvs += c["recv"];
            }
            assert_eq!((sends, recvs), (seen, seen), "{src} with {list}:\n{out}");
        }
    }
}

#[test]
fn shim_fortran_openmpi() {
    if !require(&[
        Need::Mpi(Mpi::OpenMpi),
        Need::Command(Mpi::OpenMpi.mpifort().leak()),
    ]) {
        return;
    }
    fortran(Mpi::OpenMpi);
}

#[test]
fn shim_fortran_mpich() {
    if !require(&[
        Need::Mpi(Mpi::Mpich),
        Need::Command(Mpi::Mpich.mpifort().leak()),
    ]) {
        return;
    }
    fortran(Mpi::Mpich);
}

/// Four threads under MPI_THREAD_MULTIPLE, two stacked tools: every count
/// exact in both, which a shared (not per-thread) depth would break.
fn threads(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "threads");
    let (a, b) = (kit.tool("A", false), kit.tool("B", false));
    let prog = kit.program("threads.c", &["-pthread"]);
    let list = format!("{},{}", a.display(), b.display());
    let o = run_with_timeout(
        &mut kit.job(2, &[("MPI_TOOLS_ENTRY", &list)], None, &prog),
        DEADLINE,
    );
    let (out, _) = assert_ok(&o);
    let events = tool_events(&out);
    assert_eq!(events.len(), 2, "{out}");
    // 4 threads x 500 iterations; one more MPI_Comm_rank from main.
    for ev in events.values() {
        for t in ["A", "B"] {
            let c = counts(ev, t);
            assert_eq!(
                (c["send"], c["recv"], c["comm_rank"]),
                (2000, 2000, 2001),
                "tool {t}: {c:?}"
            );
        }
    }
}

e2e::per_mpi!(shim_threads => threads: openmpi, mpich);

/// A list that cannot be honoured: every rank exits non-zero within seconds
/// with one line naming the entry and the loader's reason, and no tool ran
/// (tool A is listed before the bad entry).
fn bad_list(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "bad");
    let a = kit.tool("A", false);
    let app = kit.program("app.c", &[]);
    let missing = kit.dir.join("libnothere.so");
    let cases = [
        (
            format!("{},{}", a.display(), missing.display()),
            missing.display().to_string(),
            "cannot open shared object file",
        ),
        (
            format!("{},nosuchkeyword", a.display()),
            "`nosuchkeyword`".to_string(),
            "unknown keyword",
        ),
    ];
    for (list, names, reason) in cases {
        let start = Instant::now();
        let o = run_with_timeout(
            &mut kit.job(2, &[("MPI_TOOLS_ENTRY", &list)], None, &app),
            FAIL_DEADLINE,
        );
        let (out, err) = text(&o);
        assert!(!o.status.success(), "{list}: job succeeded:\n{out}\n{err}");
        assert!(start.elapsed() < FAIL_DEADLINE);
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("mpi-observer-shim:"))
            .collect();
        assert!(
            !lines.is_empty() && lines.len() <= 2,
            "one line per rank at most:\n{err}"
        );
        for l in &lines {
            assert!(l.contains(names.as_str()) && l.contains(reason), "{l}");
        }
        assert!(
            !out.contains("before MPI_Init"),
            "a tool ran despite the bad list:\n{out}"
        );
        assert!(
            !out.contains("shimtest app"),
            "the app ran past MPI_Init:\n{out}"
        );
    }
}

e2e::per_mpi!(shim_bad_list => bad_list: openmpi, mpich);

/// The same bad lists with `MPI_OBSERVER_TOOLS_ON_ERROR=skip` (what the
/// Slurm plugin sets): every rank leaves the bad entry out with one line,
/// the tools that load run in order, and the job completes with its own
/// results. A second `stats` is left out the same way.
fn bad_list_skipped(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "skip");
    let a = kit.tool("A", false);
    let b = kit.tool("B", false);
    let app = kit.program("app.c", &[]);
    let missing = kit.dir.join("libnothere.so");
    let cases = [
        (
            format!("{},{},{}", a.display(), missing.display(), b.display()),
            format!(
                "mpi-observer-shim: tools entry `{0}`: cannot load {0}: {0}: cannot open shared object file: No such file or directory; left out (MPI_OBSERVER_TOOLS_ON_ERROR=skip)",
                missing.display()
            ),
        ),
        (
            format!("{},nosuchkeyword,stats,{},stats", a.display(), b.display()),
            "mpi-observer-shim: tools entry `nosuchkeyword`: unknown keyword (known: v, fort, fortran, preload, stats) and libnosuchkeyword.so cannot be loaded: libnosuchkeyword.so: cannot open shared object file: No such file or directory; left out (MPI_OBSERVER_TOOLS_ON_ERROR=skip)".to_string(),
        ),
    ];
    let (np, n) = (2, 2usize);
    for (i, (list, want)) in cases.into_iter().enumerate() {
        let o = run_with_timeout(
            &mut kit.job(
                np,
                &[
                    ("MPI_TOOLS_ENTRY", &list),
                    ("MPI_OBSERVER_TOOLS_ON_ERROR", "skip"),
                ],
                None,
                &app,
            ),
            DEADLINE,
        );
        let (out, err) = assert_ok(&o);
        let mut lines: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with("mpi-observer-shim:"))
            .collect();
        let mut wanted = vec![want.as_str(); n];
        // The second case's second `stats`, also once per rank.
        let twice = "mpi-observer-shim: tools entry `stats`: the stats layer is listed twice; left out (MPI_OBSERVER_TOOLS_ON_ERROR=skip)";
        if i == 1 {
            wanted.extend([twice; 2]);
        }
        lines.sort_unstable();
        wanted.sort_unstable();
        assert_eq!(
            lines, wanted,
            "{list}: one line per rank and bad entry:\n{err}"
        );
        let apps: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("shimtest app "))
            .collect();
        assert_eq!(apps.len(), n, "{list}: the app ran in every rank:\n{out}");
        assert!(apps.iter().all(|l| l.contains("sum=1 expected=1")), "{out}");
        // A and B run, in list order, in every rank.
        let events = tool_events(&out);
        assert_eq!(events.len(), n, "{out}");
        for ev in events.values() {
            let init: Vec<String> = ev
                .iter()
                .filter(|(_, e)| e.contains("before MPI_Init"))
                .map(|(t, _)| t.clone())
                .collect();
            assert_eq!(init, ["A", "B"], "{list}: {ev:?}");
        }
    }
}

e2e::per_mpi!(shim_bad_list_skipped => bad_list_skipped: openmpi, mpich);

/// A procedure that no level defines (an MPI 5.0 one, absent from both
/// libraries), reached through a tool's reference (the application cannot
/// see it at all), ends every rank with one line naming it, not a crash.
fn missing_function(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "missing");
    let tool = kit.dir.join("libmissing.so");
    compile(
        mpi,
        &program("shim/missing.c"),
        &tool,
        &["-shared", "-fPIC", "-Wl,--unresolved-symbols=ignore-all"],
    );
    let app = kit.program("app.c", &[]);
    let list = tool.display().to_string();
    let o = run_with_timeout(
        &mut kit.job(2, &[("MPI_TOOLS_ENTRY", &list)], None, &app),
        FAIL_DEADLINE,
    );
    let (out, err) = text(&o);
    assert!(!o.status.success(), "{out}\n{err}");
    assert!(
        !out.contains("shimtest missing"),
        "the call returned or the shim's symbol is absent:\n{out}"
    );
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("mpi-observer-shim:"))
        .collect();
    assert!(!lines.is_empty() && lines.len() <= 2, "{err}");
    for l in lines {
        assert_eq!(
            l,
            "mpi-observer-shim: MPI_Abi_get_version is not defined by any layer, nor by the MPI library"
        );
    }
}

e2e::per_mpi!(shim_missing_function => missing_function: openmpi, mpich);

/// An empty list is a pure pass-through: correct results, nothing printed.
#[test]
fn shim_empty_list_is_pass_through() {
    if !require(&[Need::Mpi(Mpi::OpenMpi), Need::Mpi(Mpi::Mpich)]) {
        return;
    }
    for mpi in Mpi::ALL {
        let kit = Kit::new(mpi, "empty");
        let app = kit.program("app.c", &[]);
        let o = run_with_timeout(
            &mut kit.job(3, &[("MPI_TOOLS_ENTRY", " , ")], None, &app),
            DEADLINE,
        );
        let (out, err) = assert_ok(&o);
        let apps: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("shimtest app "))
            .collect();
        assert_eq!(apps.len(), 3, "{out}");
        assert!(
            apps.iter()
                .all(|l| l.contains("sum=3 expected=3") && l.contains("wtick_ok=1")),
            "{out}"
        );
        assert!(
            apps.iter()
                .any(|l| l.contains("rank=0 ") && l.contains("token=3")),
            "{out}"
        );
        assert!(!err.contains("mpi-observer-shim"), "{err}");
    }
}

/// A process that never calls MPI is untouched even by a bad list: the
/// shim builds nothing until the first MPI call.
#[test]
fn shim_is_inert_without_mpi_calls() {
    if !require(&[Need::Command("sh")]) {
        return;
    }
    let o = run_with_timeout(
        Command::new("sh")
            .args(["-c", "echo inert"])
            .env("LD_PRELOAD", shim())
            .env("MPI_TOOLS_ENTRY", "nosuchkeyword,/nonexistent/lib.so"),
        FAIL_DEADLINE,
    );
    let (out, err) = assert_ok(&o);
    assert_eq!(out, "inert\n");
    assert!(err.is_empty(), "{err}");
}
