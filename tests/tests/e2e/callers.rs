//! Caller fidelity (issue 24): a PMPI tool in the shim's list sees the
//! application as its caller, exactly as when it is preloaded alone, and
//! every level's counts stay exact. The tools and programs are in
//! `tests/programs/callers/`, compiled here with each stack's own wrappers.
//!
//! - `who.c` asks in each wrapper who called it, three ways: the return
//!   address, glibc's `backtrace()` and libunwind. The test turns every
//!   answer into file:line with `addr2line` and requires the application's
//!   call line, with `who` first in the list alone, above `stats`, and above
//!   two more tools. The caller is C on every stack (Send, Recv, the
//!   12-argument Sendrecv, Barrier, Allreduce, and 4 threads under
//!   `MPI_THREAD_MULTIPLE`), and Fortran on Debian's two stacks (the PyPI
//!   wheels ship no Fortran bindings, which is asserted). The lines must be
//!   the ones `who` names when it is preloaded alone, without the shim.
//! - `walk.c`, lower in the list, walks with libunwind to the first frame
//!   of the executable: the application's call line.
//! - Exact counts: `swallow.c` answers `MPI_Comm_rank` itself and `extra.c`
//!   makes MPI calls inside its `MPI_Send`; counting tools above, between
//!   and below them, and `stats` (read by a real daemon), each see exactly
//!   the calls that reach their level.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use e2e::{
    Daemon, Job, Mpi, Need, compile, program, read_counts, require, run_with_timeout, scratch,
    shim, sum,
};

/// Every program here runs on 2 ranks.
const NP: u32 = 2;
/// Generous for a job of a second; a hang fails instead of blocking.
const DEADLINE: Duration = Duration::from_secs(120);
/// app.c's threads, and the Sendrecv rounds each makes.
const THREADS: usize = 4;
const ITERS: usize = 3;
/// counts.c's sends from rank 0 (and receives at rank 1).
const SENDS: u64 = 5;

/// The ways who.c asks for its wrapper's caller: return address,
/// `backtrace()` frame 1, libunwind's first step.
const CALLER: [&str; 3] = ["ra", "bt1", "uw1"];
/// The frame above the caller: `backtrace()` frame 2, libunwind's second
/// step.
const ABOVE: [&str; 2] = ["bt2", "uw2"];

/// Whether libunwind's headers (Debian's `libunwind-dev`) are there, for
/// who.c and walk.c; the harness's [`require`] has no need for a header, so
/// this follows its rule: fail under `CI=true`, skip with a message
/// otherwise.
fn libunwind() -> bool {
    // In /usr/include, or in the multiarch directory under it
    // (`x86_64-linux-gnu/`, `aarch64-linux-gnu/`, ...).
    let multiarch = std::fs::read_dir("/usr/include")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("libunwind.h"));
    let found = std::iter::once(PathBuf::from("/usr/include/libunwind.h"))
        .chain(multiarch)
        .any(|p| p.is_file());
    if !found {
        let what = "libunwind-dev (libunwind.h)";
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
            "CI=true and this test needs {what}: install it (cargo xtask setup) instead of skipping"
        );
        eprintln!("SKIPPED: needs {what}");
    }
    found
}

/// Compiled tools and programs for one stack.
struct Kit {
    mpi: Mpi,
    dir: PathBuf,
}

impl Kit {
    fn new(mpi: Mpi, test: &str) -> Kit {
        Kit {
            mpi,
            dir: scratch(&format!("callers-{test}-{}", mpi.name())),
        }
    }

    /// tests/programs/callers/`name`.c as `libNAME.so`.
    fn tool(&self, name: &str) -> PathBuf {
        self.tool_as(name, name, "-O1")
    }

    /// tests/programs/callers/`src`.c as `libNAME.so`, optimised `opt`.
    fn tool_as(&self, src: &str, name: &str, opt: &str) -> PathBuf {
        let out = self.dir.join(format!("lib{name}.so"));
        let mut extra = vec!["-shared", "-fPIC", "-g", opt];
        if matches!(src, "who" | "walk") {
            extra.push("-lunwind");
        }
        compile(
            self.mpi,
            &program(&format!("callers/{src}.c")),
            &out,
            &extra,
        );
        out
    }

    /// `tool` copied as `libNAME.so`: the same code as another object,
    /// hence another level (count.c names itself after its file).
    fn copy(&self, tool: &Path, name: &str) -> PathBuf {
        let out = self.dir.join(format!("lib{name}.so"));
        std::fs::copy(tool, &out).unwrap();
        out
    }

    /// An application, with line tables and mild optimisation, as sites
    /// build them for profiling.
    fn app(&self, src: &str) -> PathBuf {
        let out = self.dir.join(Path::new(src).file_stem().unwrap());
        let mut extra = vec!["-g", "-O1"];
        if src.ends_with(".c") {
            extra.push("-pthread");
        }
        compile(self.mpi, &program(&format!("callers/{src}")), &out, &extra);
        out
    }

    /// A launcher for `app` with `env` in the ranks (not in the launcher).
    fn launcher(&self, env: &[(&str, String)], app: &Path) -> Command {
        let mut c = self.mpi.launcher(NP);
        c.current_dir(&self.dir);
        for (k, v) in env {
            if self.mpi.is_open_mpi() {
                c.args(["-x", &format!("{k}={v}")]);
            } else {
                c.args(["-genv", k, v]);
            }
        }
        c.arg(app);
        c
    }

    /// Runs `app` with the tools in `stack`, labelled `label`, and returns
    /// what who.so and walk.so recorded in its ranks.
    fn run(&self, label: &str, stack: &Stack, app: &Path) -> Run {
        let who = self.dir.join(format!("who-{label}"));
        let walk = self.dir.join(format!("walk-{label}"));
        let mut env = vec![
            ("WHO_OUT", who.display().to_string()),
            ("WALK_OUT", walk.display().to_string()),
        ];
        match stack {
            Stack::Alone(tool) => env.push(("LD_PRELOAD", tool.display().to_string())),
            Stack::Shim(list) => {
                env.push(("LD_PRELOAD", shim().display().to_string()));
                env.push(("MPI_TOOLS_ENTRY", list.clone()));
            }
        }
        let o = run_with_timeout(&mut self.launcher(&env, app), DEADLINE);
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        assert!(
            o.status.success(),
            "{label}: the job failed ({}):\nstdout:\n{out}\nstderr:\n{err}",
            o.status
        );
        let ok = out.lines().filter(|l| l.ends_with(" ok")).count();
        assert_eq!(
            ok, NP as usize,
            "{label}: every rank checks its results:\n{out}"
        );
        Run {
            label: label.to_string(),
            who: read_calls(&who, label),
            walk: read_calls(&walk, label),
        }
    }
}

/// Tool `b`: count.c at -O2, where each wrapper ends in a tail jump to
/// `PMPI_X` (`jmp PMPI_Send@plt`, no frame of its own left), as optimised
/// tools do: the levels below it must still see a stack that walks to the
/// application.
fn tail_caller(kit: &Kit) -> PathBuf {
    kit.tool_as("count", "b", "-O2")
}

/// How the tools get into the ranks.
enum Stack {
    /// `LD_PRELOAD=TOOL`, no shim: the tool as it runs alone.
    Alone(PathBuf),
    /// The shim preloaded with `MPI_TOOLS_ENTRY=LIST`.
    Shim(String),
}

/// A code address as a tool wrote it: the object, and the offset from its
/// load bias.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Frame {
    obj: PathBuf,
    off: u64,
}

/// One call a tool recorded: its rank's file, thread, function, and the
/// frame each way gave.
#[derive(Debug)]
struct Call {
    file: usize,
    tid: u32,
    main: bool,
    function: String,
    ways: BTreeMap<String, Option<Frame>>,
}

/// What one job's ranks recorded.
struct Run {
    label: String,
    /// who.so's calls (empty when it was not loaded).
    who: Vec<Call>,
    /// walk.so's calls, one way named "walk" (empty when it was not loaded).
    walk: Vec<Call>,
}

/// Reads every `PREFIX.<pid>` file: who.c's `call` lines or walk.c's `walk`
/// lines. Asserts none lost a call and no Sendrecv status disagreed with
/// its arguments.
fn read_calls(prefix: &Path, label: &str) -> Vec<Call> {
    let dir = prefix.parent().unwrap();
    let stem = format!("{}.", prefix.file_name().unwrap().to_str().unwrap());
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .is_some_and(|n| n.starts_with(&stem))
        })
        .collect();
    files.sort();
    let mut calls: BTreeMap<(usize, u64), Call> = BTreeMap::new();
    for (file, path) in files.iter().enumerate() {
        let text = std::fs::read_to_string(path).unwrap();
        for l in text.lines() {
            let f: Vec<&str> = l.split('\t').collect();
            let frame = |off: &str, obj: &str| {
                (off != "-").then(|| Frame {
                    obj: PathBuf::from(obj),
                    off: u64::from_str_radix(off, 16).unwrap(),
                })
            };
            match f[0] {
                "lost" | "bad" => assert_eq!(f[1], "0", "{label}: {}: {l}", path.display()),
                // call INDEX TID MAIN FUNCTION WAY OFFSET OBJECT
                // walk INDEX TID MAIN FUNCTION STEPS OFFSET OBJECT
                "call" | "walk" => {
                    assert_eq!(f.len(), 8, "{}: {l}", path.display());
                    let c = calls.entry((file, f[1].parse().unwrap())).or_insert(Call {
                        file,
                        tid: f[2].parse().unwrap(),
                        main: f[3] == "1",
                        function: f[4].to_string(),
                        ways: BTreeMap::new(),
                    });
                    let way = if f[0] == "walk" { "walk" } else { f[5] };
                    c.ways.insert(way.to_string(), frame(f[6], f[7]));
                }
                _ => panic!("{}: unexpected line {l:?}", path.display()),
            }
        }
    }
    if !calls.is_empty() {
        assert_eq!(files.len(), NP as usize, "{label}: one file per rank");
    }
    calls.into_values().collect()
}

/// Source lines, by addr2line, of the frames seen so far.
#[derive(Default)]
struct Lines(BTreeMap<Frame, String>);

impl Lines {
    /// Symbolizes every frame of `calls` not seen yet: one addr2line per
    /// object.
    fn learn<'a>(&mut self, calls: impl IntoIterator<Item = &'a Call>) {
        let mut todo: BTreeMap<PathBuf, BTreeSet<u64>> = BTreeMap::new();
        for f in calls.into_iter().flat_map(|c| c.ways.values().flatten()) {
            if !self.0.contains_key(f) {
                todo.entry(f.obj.clone()).or_default().insert(f.off);
            }
        }
        for (obj, offs) in todo {
            let offs: Vec<u64> = offs.into_iter().collect();
            // A return address is the instruction after the call: the
            // call's line is the one of the byte before it.
            let o = Command::new("addr2line")
                .arg("-e")
                .arg(&obj)
                .args(offs.iter().map(|o| format!("{:#x}", o.saturating_sub(1))))
                .output()
                .expect("addr2line");
            assert!(
                o.status.success(),
                "addr2line -e {}: {}",
                obj.display(),
                String::from_utf8_lossy(&o.stderr)
            );
            let text = String::from_utf8_lossy(&o.stdout);
            let got: Vec<&str> = text.lines().collect();
            assert_eq!(got.len(), offs.len(), "addr2line -e {}", obj.display());
            for (off, l) in offs.into_iter().zip(got) {
                // "/path/app.c:76 (discriminator 6)" -> "app.c:76"
                let l = l.split(" (").next().unwrap();
                let (file, line) = l.rsplit_once(':').unwrap_or((l, "?"));
                let file = Path::new(file)
                    .file_name()
                    .map_or(file.into(), |f| f.to_string_lossy().into_owned());
                self.0.insert(
                    Frame {
                        obj: obj.clone(),
                        off,
                    },
                    format!("{file}:{line}"),
                );
            }
        }
    }

    /// `FILE:LINE in OBJECT`, or `nothing` for a way that found no frame.
    fn at(&self, f: &Option<Frame>) -> String {
        match f {
            None => "nothing".into(),
            Some(f) => format!(
                "{} in {}",
                self.0.get(f).map_or("?", |s| s.as_str()),
                f.obj.file_name().unwrap().to_string_lossy()
            ),
        }
    }
}

/// The `CALL:name` markers of a source: name -> line number.
fn markers(src: &Path) -> BTreeMap<String, u32> {
    let text = std::fs::read_to_string(src).unwrap();
    let mut m = BTreeMap::new();
    for (i, l) in text.lines().enumerate() {
        let Some((code, rest)) = l.split_once("CALL:") else {
            continue;
        };
        // The header comment that explains the markers is not one.
        if !code.contains("MPI_") {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let line = u32::try_from(i + 1).unwrap();
        assert!(
            m.insert(name.clone(), line).is_none(),
            "{}: marker {name} twice",
            src.display()
        );
    }
    m
}

/// The marker of a main-thread call to `function` in app.c and fort.f90.
fn marker_of(function: &str) -> &'static str {
    match function {
        "MPI_Send" => "send",
        "MPI_Recv" => "recv",
        "MPI_Sendrecv" => "sendrecv",
        "MPI_Barrier" => "barrier",
        "MPI_Allreduce" => "allreduce",
        _ => panic!("no marker for {function}"),
    }
}

/// Calls per function.
fn per_function(calls: &[Call]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for c in calls {
        *m.entry(c.function.clone()).or_insert(0) += 1;
    }
    m
}

/// Panics listing the first mismatches, if any.
fn assert_none(label: &str, what: &str, bad: &[String]) {
    assert!(
        bad.is_empty(),
        "{label}: {what}: {} mismatches, the first ones:\n{}",
        bad.len(),
        bad.iter()
            .take(24)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// app.c's calls, as `ways` of `calls` name them: a main-thread call its
/// own marked line; a worker thread's Sendrecv one of the four thread
/// lines, the same for every call of that thread, and each of the four
/// threads of a rank its own line. Returns the answers as comparable
/// lines, "FUNCTION THREAD WAY FILE:LINE in OBJECT".
fn check_c(
    run: &Run,
    tool: &str,
    calls: &[Call],
    ways: &[&str],
    lines: &Lines,
    app: &Path,
    marks: &BTreeMap<String, u32>,
) -> BTreeSet<String> {
    let label = format!("{} ({tool})", run.label);
    let exe = app.file_name().unwrap().to_string_lossy();
    let want = |m: &str| format!("app.c:{} in {exe}", marks[m]);
    let thread_lines: BTreeSet<String> =
        (0..THREADS).map(|t| want(&format!("thread{t}"))).collect();
    let mut bad = Vec::new();
    let mut seen = BTreeSet::new();
    // (file, tid) -> the lines its ways named.
    let mut threads: BTreeMap<(usize, u32), BTreeSet<String>> = BTreeMap::new();
    for c in calls {
        for way in ways {
            let got = lines.at(c.ways.get(*way).unwrap_or(&None));
            let who = if c.main { "main" } else { "thread" };
            seen.insert(format!("{} {who} {way} {got}", c.function));
            if c.main {
                let want = want(marker_of(&c.function));
                if got != want {
                    bad.push(format!(
                        "{} on the main thread, {way}: {got}, want {want}",
                        c.function
                    ));
                }
            } else if c.function != "MPI_Sendrecv" || !thread_lines.contains(&got) {
                bad.push(format!(
                    "{} on thread {}, {way}: {got}, want one of {thread_lines:?}",
                    c.function, c.tid
                ));
            } else {
                threads.entry((c.file, c.tid)).or_default().insert(got);
            }
        }
    }
    assert_none(&label, "callers", &bad);
    for ((file, tid), got) in &threads {
        assert_eq!(
            got.len(),
            1,
            "{label}: thread {tid} of rank file {file}: {got:?}"
        );
    }
    for file in 0..NP as usize {
        let got: BTreeSet<&String> = threads
            .iter()
            .filter(|((f, _), _)| *f == file)
            .flat_map(|(_, l)| l)
            .collect();
        assert_eq!(
            got,
            thread_lines.iter().collect(),
            "{label}: rank file {file}: each thread its own line"
        );
    }
    // Exactly the program's calls: a tool's view is the application's.
    let n = NP as usize;
    let want: BTreeMap<String, usize> = [
        ("MPI_Send", 1),
        ("MPI_Recv", 1),
        ("MPI_Sendrecv", n + n * THREADS * ITERS),
        ("MPI_Barrier", n),
        ("MPI_Allreduce", n),
    ]
    .into_iter()
    .map(|(f, k)| (f.to_string(), k))
    .collect();
    assert_eq!(per_function(calls), want, "{label}: calls per function");
    seen
}

/// A C caller on `mpi`: who.so first in the list, alone, above `stats`
/// and above two more tools, names app.c's lines in all three ways, the
/// same as preloaded alone without the shim; walk.so at the bottom reaches
/// the same lines.
fn c_caller(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi), Need::Command("addr2line")]) || !libunwind() {
        return;
    }
    let kit = Kit::new(mpi, "c");
    let who = kit.tool("who");
    let walk = kit.tool("walk");
    let count = kit.tool("count");
    let (a, b) = (kit.copy(&count, "a"), tail_caller(&kit));
    let app = kit.app("app.c");
    let marks = markers(&program("callers/app.c"));
    let (who, walk, a, b) = (
        who.display().to_string(),
        walk.display().to_string(),
        a.display().to_string(),
        b.display().to_string(),
    );
    let alone = kit.run("alone", &Stack::Alone(who.clone().into()), &app);
    let runs = [
        kit.run("who", &Stack::Shim(who.clone()), &app),
        kit.run(
            "who-stats-walk",
            &Stack::Shim(format!("{who},stats,{walk}")),
            &app,
        ),
        kit.run(
            "who-a-b-walk",
            &Stack::Shim(format!("{who},{a},{b},{walk}")),
            &app,
        ),
    ];
    let mut lines = Lines::default();
    lines.learn(
        std::iter::once(&alone)
            .chain(&runs)
            .flat_map(|r| r.who.iter().chain(&r.walk)),
    );
    let baseline = check_c(&alone, "who", &alone.who, &CALLER, &lines, &app, &marks);
    for run in &runs {
        let seen = check_c(run, "who", &run.who, &CALLER, &lines, &app, &marks);
        assert_eq!(
            seen, baseline,
            "{}: who.so under the shim must name what it names alone",
            run.label
        );
        if run.label.ends_with("walk") {
            check_c(run, "walk", &run.walk, &["walk"], &lines, &app, &marks);
        } else {
            assert!(run.walk.is_empty(), "{}: walk.so was not listed", run.label);
        }
    }
}

e2e::per_mpi!(callers_c => c_caller: openmpi, mpich, openmpi5, mpich5, mpich5_abi);

/// The file names of `mpi`'s Fortran bindings library (mpif.h and `use
/// mpi` procedures).
fn fortran_library(mpi: Mpi) -> &'static str {
    match mpi {
        Mpi::OpenMpi => "libmpi_mpifh.so",
        Mpi::Mpich => "libmpichfort.so",
        _ => unreachable!("the wheels ship no Fortran bindings"),
    }
}

/// Asserts that a PyPI wheel stack ships no Fortran: no compiler wrapper,
/// no bindings library. The Fortran caller is then tested on Debian's two
/// stacks only, and this says so instead of skipping in silence.
fn assert_no_fortran(mpi: Mpi) {
    let venv = PathBuf::from(mpi.mpicc())
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .to_path_buf();
    let mut found = Vec::new();
    let mut dirs = vec![venv.join("bin"), venv.join("lib")];
    while let Some(d) = dirs.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.map(Result::unwrap) {
            let name = e.file_name().to_string_lossy().into_owned();
            let ty = e.file_type().unwrap();
            if ty.is_dir() && !name.starts_with("python") {
                dirs.push(e.path());
            } else if ["mpif", "fort", "mpifh", "usempi"]
                .iter()
                .any(|w| name.contains(w))
            {
                found.push(e.path());
            }
        }
    }
    assert!(
        found.is_empty(),
        "{mpi:?} now ships Fortran ({found:?}): test its Fortran caller too"
    );
}

/// A Fortran caller (`use mpi`): who.so's immediate caller is the MPI's
/// Fortran bindings library, and the frame above it (backtrace, libunwind)
/// is fort.f90's call line; walk.so reaches the same line.
fn fortran_caller(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi), Need::Command("addr2line")]) {
        return;
    }
    if !matches!(mpi, Mpi::OpenMpi | Mpi::Mpich) {
        assert_no_fortran(mpi);
        return;
    }
    if !require(&[Need::Command(mpi.mpifort().leak())]) || !libunwind() {
        return;
    }
    let kit = Kit::new(mpi, "fortran");
    let who = kit.tool("who").display().to_string();
    let walk = kit.tool("walk").display().to_string();
    let count = kit.tool("count");
    let a = kit.copy(&count, "a").display().to_string();
    let b = tail_caller(&kit).display().to_string();
    let app = kit.app("fort.f90");
    let marks = markers(&program("callers/fort.f90"));
    let exe = app.file_name().unwrap().to_string_lossy().into_owned();
    let runs = [
        kit.run("who", &Stack::Shim(who.clone()), &app),
        kit.run(
            "who-stats-walk",
            &Stack::Shim(format!("{who},stats,{walk}")),
            &app,
        ),
        kit.run(
            "who-a-b-walk",
            &Stack::Shim(format!("{who},{a},{b},{walk}")),
            &app,
        ),
    ];
    let mut lines = Lines::default();
    lines.learn(runs.iter().flat_map(|r| r.who.iter().chain(&r.walk)));
    let bindings = fortran_library(mpi);
    for run in &runs {
        let mut bad = Vec::new();
        for c in &run.who {
            let want = format!("fort.f90:{} in {exe}", marks[marker_of(&c.function)]);
            // The three ways agree on one frame of the bindings library.
            let callers: BTreeSet<&Option<Frame>> = CALLER.iter().map(|w| &c.ways[*w]).collect();
            let caller = lines.at(&c.ways["ra"]);
            let in_bindings = c.ways["ra"].as_ref().is_some_and(|f| {
                f.obj
                    .file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(bindings)
            });
            if callers.len() != 1 || !in_bindings {
                bad.push(format!(
                    "{}: the caller must be {bindings} in every way: {:?}",
                    c.function,
                    CALLER
                        .iter()
                        .map(|w| format!("{w} {}", lines.at(&c.ways[*w])))
                        .collect::<Vec<_>>()
                ));
            }
            for way in ABOVE {
                let got = lines.at(&c.ways[way]);
                if got != want {
                    bad.push(format!(
                        "{} above {caller}, {way}: {got}, want {want}",
                        c.function
                    ));
                }
            }
        }
        assert_none(&run.label, "Fortran callers (who)", &bad);
        let want: BTreeMap<String, usize> = [("MPI_Send", 1), ("MPI_Recv", 1), ("MPI_Barrier", 2)]
            .into_iter()
            .map(|(f, k)| (f.to_string(), k))
            .collect();
        assert_eq!(per_function(&run.who), want, "{}: who's calls", run.label);
        if run.label.ends_with("walk") {
            let bad: Vec<String> = run
                .walk
                .iter()
                .filter_map(|c| {
                    let want = format!("fort.f90:{} in {exe}", marks[marker_of(&c.function)]);
                    let got = lines.at(&c.ways["walk"]);
                    (got != want).then(|| format!("{}: {got}, want {want}", c.function))
                })
                .collect();
            assert_none(&run.label, "Fortran callers (walk)", &bad);
            assert_eq!(per_function(&run.walk), want, "{}: walk's calls", run.label);
        }
    }
}

e2e::per_mpi!(callers_fortran => fortran_caller: openmpi, mpich, openmpi5, mpich5, mpich5_abi);

/// The functions count.c counts, in its file's order.
const COUNTED: [&str; 8] = [
    "MPI_Send",
    "MPI_Recv",
    "MPI_Sendrecv",
    "MPI_Barrier",
    "MPI_Allreduce",
    "MPI_Comm_rank",
    "MPI_Comm_size",
    "MPI_Type_size",
];

/// `top,swallow,extra,mid,stats,bottom` over counts.c: `top` sees exactly
/// the program's calls; below `swallow` no program `MPI_Comm_rank` arrives
/// (only swallow's own, after `MPI_Init`); below `extra` every send brings
/// extra's `MPI_Comm_size` and `PMPI_Type_size`. `mid`, `stats` (the
/// daemon's `mpi_calls_total`: the calls that reach its level) and
/// `bottom` all see the same.
fn exact_counts(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let kit = Kit::new(mpi, "counts");
    let count = kit.tool("count");
    let names = ["top", "mid", "bottom"];
    let [top, mid, bottom] = names.map(|n| kit.copy(&count, n).display().to_string());
    let swallow = kit.tool("swallow").display().to_string();
    let extra = kit.tool("extra").display().to_string();
    let app = kit.app("counts.c");
    let out = kit.dir.join("count");
    let env = [
        ("LD_PRELOAD", shim().display().to_string()),
        (
            "MPI_TOOLS_ENTRY",
            format!("{top},{swallow},{extra},{mid},stats,{bottom}"),
        ),
        ("COUNT_OUT", out.display().to_string()),
    ];
    let job = Job::spawn(kit.launcher(&env, &app), NP, kit.dir.join("go"));
    let ranks = job.ranks.clone();
    let mut d = Daemon::start(&[vec!["--no-bpf".to_string()], job.pid_args()].concat());
    d.wait_stats_figures(NP);
    job.finish("DONE ");
    let s = d.final_scrape();
    for (rank, pid) in ranks {
        let (sends, recvs) = if rank == 0 { (SENDS, 0) } else { (0, SENDS) };
        let program: BTreeMap<String, u64> = COUNTED
            .iter()
            .zip([sends, recvs, 0, 1, 0, 3, 2, 1])
            .map(|(f, n)| (f.to_string(), n))
            .collect();
        let below: BTreeMap<String, u64> = COUNTED
            .iter()
            .zip([sends, recvs, 0, 1, 0, 1, 2 + sends, 1 + sends])
            .map(|(f, n)| (f.to_string(), n))
            .collect();
        for (name, want) in [("top", &program), ("mid", &below), ("bottom", &below)] {
            let got = read_counts(&out.with_extension(format!("{name}.{pid}")));
            assert_eq!(&got, want, "{mpi:?} rank {rank}: tool {name}");
        }
        let r = rank.to_string();
        let stats: BTreeMap<String, u64> = COUNTED
            .iter()
            .map(|f| {
                let n = sum(&s, "mpi_calls_total", &[("rank", &r), ("function", f)]);
                (f.to_string(), n as u64)
            })
            .collect();
        assert_eq!(
            stats, below,
            "{mpi:?} rank {rank}: stats' mpi_calls_total, the calls that reach its level"
        );
    }
}

e2e::per_mpi!(callers_exact_counts => exact_counts: openmpi, mpich, openmpi5, mpich5, mpich5_abi);
