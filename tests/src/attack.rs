//! The attacker harness of the security tests (issue 21): unprivileged users
//! created by the test, an honest job of one of them that must stay exact,
//! and fake MPI processes of another that attack the root daemon.
//!
//! ```text
//! let attacker = User::ensure(ATTACKER);
//! let victim = User::ensure(VICTIM);
//! let mut daemon = Daemon::start(&["--all".into()]);
//! let job = victim_job(Mpi::OpenMpi, &dir, &victim, 200);
//! let labels = wait_attached(&mut daemon, &job.pids());
//! let lib = attacker.libmpi_copy("lib dir");       // a path with a space
//! let fakes = Fakes::spawn(&attacker, &fake_binary(&dir), FakeMode::Map, &lib, 5);
//! let stub = attacker.stub_libmpi("stub", false);    // safe to call
//! let callers = Fakes::spawn(&attacker, &fake_binary(&dir), FakeMode::Call(64), &stub, 2);
//! assert_scrape_within(&daemon.addr, Duration::from_secs(2));
//! job.go();
//! victim_finish_and_check(&mut daemon, job, &labels, 200, Duration::from_secs(2));
//! ```
//!
//! # Swapping a mapped library (the attacks of issue 21, item 2)
//!
//! A [`FakeMode::Map`] fake maps its library once and never touches it
//! again, so the attacker may replace the file under it. The daemon takes
//! the path from `/proc/PID/maps`; once the mapped file is unlinked the
//! kernel shows that path with ` (deleted)` appended, and a reader that
//! reopens the path by name opens whatever the attacker put there:
//! - a FIFO: `std::fs::remove_file(&lib)`, then `mkfifo(lib)` (see
//!   [`swap_for_fifo`]): an `open()` without `O_NONBLOCK` blocks forever;
//! - `/dev/zero`: `remove_file(&lib)`, then
//!   `std::os::unix::fs::symlink("/dev/zero", &lib)` ([`swap_for_symlink`]):
//!   a read to the end never ends;
//! - a sparse 1 GiB file: `remove_file(&lib)`, then create it and
//!   `set_len(1 << 30)` ([`swap_for_sparse`]): 1 GiB of zeroes to read.
//!
//! Each swap must be made as the attacker (the files must be hers), which
//! these helpers do by `chown`ing what they create. `truncate(lib, 0)`
//! without unlinking shrinks the mapped inode itself: a daemon that maps it
//! gets SIGBUS, the fake does not (it never reads its mapping).
//!
//! A fake's library under a directory whose name holds a space
//! ([`User::libmpi_copy`] with `"lib dir"`) tests that maps paths are not
//! split on whitespace (item 13).

use std::{
    ffi::CString,
    io::BufRead as _,
    os::unix::{
        fs::{PermissionsExt as _, chown},
        process::CommandExt as _,
    },
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    Daemon, Job, Mpi, Sample, compile, http_get_within, parse_metrics, program, sum, target_dir,
    wait_for,
};

/// The attacker: an unprivileged user whose processes attack the daemon.
pub const ATTACKER: &str = "mpiobs-attacker";
/// The honest user whose concurrent job must stay exact.
pub const VICTIM: &str = "mpiobs-victim";

/// Debian Open MPI's library, which fakes map a copy of.
pub const REAL_LIBMPI: &str = "/usr/lib/x86_64-linux-gnu/libmpi.so.40";

/// Creates the system user `name` if it does not exist (idempotent, and
/// safe against a concurrent creation) and returns its (uid, gid). Panics
/// with what to do when it cannot, so a CI run without the capability fails.
pub fn ensure_user(name: &str) -> (u32, u32) {
    if let Some(ids) = user_ids(name) {
        return ids;
    }
    let out = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ])
        .output()
        .unwrap_or_else(|e| panic!("running useradd to create the test user {name}: {e}"));
    // Another test may have created it meanwhile (useradd exits 9).
    user_ids(name).unwrap_or_else(|| {
        panic!(
            "cannot create the test user {name}: useradd {}: {}; run the security tests as root \
             on a machine where useradd works",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })
}

/// The (uid, gid) of `name`, if the user exists.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let id = |flag: &str| {
        let o = Command::new("id").args([flag, name]).output().ok()?;
        if !o.status.success() {
            return None;
        }
        String::from_utf8_lossy(&o.stdout).trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

/// The uid (real) of a running process, from `/proc/PID/status`.
pub fn uid_of(pid: u32) -> Option<u32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// An unprivileged test user with a private, writable home directory
/// (`target/e2e/home-NAME`, mode 0700) that serves as HOME and TMPDIR.
#[derive(Clone, Debug)]
pub struct User {
    /// Login name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its HOME and TMPDIR, owned by it.
    pub home: PathBuf,
}

impl User {
    /// Ensures the user exists ([`ensure_user`]) and gives it a fresh home.
    pub fn ensure(name: &str) -> User {
        let (uid, gid) = ensure_user(name);
        let home = target_dir().join("e2e").join(format!("home-{name}"));
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home).unwrap();
        chown(&home, Some(uid), Some(gid)).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        // The user must be able to reach it: every ancestor traversable.
        let mut p = home.parent();
        while let Some(dir) = p {
            let mode = std::fs::metadata(dir).unwrap().permissions().mode();
            assert!(
                mode & 0o001 != 0,
                "{} (mode {mode:o}) is not traversable by others: user {name} cannot reach {}; \
                 chmod o+x it or set CARGO_TARGET_DIR elsewhere",
                dir.display(),
                home.display()
            );
            p = dir.parent();
        }
        User {
            name: name.to_string(),
            uid,
            gid,
            home,
        }
    }

    /// Makes `cmd` run as this user: real and effective uid and gid (and no
    /// supplementary groups: std drops them when root sets a uid), HOME and
    /// TMPDIR its home, run from there, without Open MPI's run-as-root
    /// permission (a non-root user needs none).
    pub fn apply<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.uid(self.uid)
            .gid(self.gid)
            .env("HOME", &self.home)
            .env("TMPDIR", &self.home)
            .env("USER", &self.name)
            .env("LOGNAME", &self.name)
            .env_remove("OMPI_ALLOW_RUN_AS_ROOT")
            .env_remove("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
            .current_dir(&self.home)
    }

    /// `program` as a command run by this user.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        self.apply(&mut c);
        c
    }

    /// `mpi`'s launcher for `np` ranks ([`Mpi::launcher`]) run by this user.
    pub fn launcher(&self, mpi: Mpi, np: u32) -> Command {
        let mut c = mpi.launcher(np);
        self.apply(&mut c);
        c
    }

    /// Chowns `path` to this user.
    pub fn own(&self, path: &Path) {
        chown(path, Some(self.uid), Some(self.gid))
            .unwrap_or_else(|e| panic!("chown {} to {}: {e}", path.display(), self.name));
    }

    /// A copy of [`REAL_LIBMPI`] at `HOME/SUBDIR/libmpi.so.40`, the
    /// directory and the file owned by this user, so she can swap or
    /// truncate it later. `subdir` may contain a space.
    pub fn libmpi_copy(&self, subdir: &str) -> PathBuf {
        let dir = self.home.join(subdir);
        std::fs::create_dir_all(&dir).unwrap();
        self.own(&dir);
        let lib = dir.join("libmpi.so.40");
        std::fs::copy(REAL_LIBMPI, &lib)
            .unwrap_or_else(|e| panic!("copying {REAL_LIBMPI}: {e}; install libopenmpi3"));
        self.own(&lib);
        lib
    }

    /// `tests/programs/attack/stubmpi.c` built as `HOME/SUBDIR/libmpi.so.40`,
    /// owned by this user: a library [`FakeMode::Call`] fakes can call
    /// before any MPI_Init. The daemon reads it as MPICH, or as Open MPI
    /// when `open_mpi` (it then exports `ompi_mpi_comm_world`).
    pub fn stub_libmpi(&self, subdir: &str, open_mpi: bool) -> PathBuf {
        let dir = self.home.join(subdir);
        std::fs::create_dir_all(&dir).unwrap();
        self.own(&dir);
        let lib = dir.join("libmpi.so.40");
        let mut cc = Command::new("cc");
        cc.args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&lib)
            .arg(program("attack/stubmpi.c"));
        if open_mpi {
            cc.arg("-DAS_OPEN_MPI");
        }
        let o = cc.output().expect("running cc");
        assert!(
            o.status.success(),
            "cc attack/stubmpi.c failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        self.own(&lib);
        lib
    }

    /// Asserts that every pid runs under this user's uid.
    pub fn assert_runs(&self, pids: &[u32]) {
        for &pid in pids {
            assert_eq!(
                uid_of(pid),
                Some(self.uid),
                "process {pid} must run as {} (uid {})",
                self.name,
                self.uid
            );
        }
    }
}

/// Replaces the mapped `lib` by a FIFO of `user`'s (see the module doc).
pub fn swap_for_fifo(user: &User, lib: &Path) {
    std::fs::remove_file(lib).unwrap();
    let c = CString::new(lib.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) with a NUL-terminated path we own.
    let rc = unsafe { libc_mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(rc, 0, "mkfifo {}", lib.display());
    user.own(lib);
}

/// Replaces the mapped `lib` by a symbolic link of `user`'s to `target`
/// (e.g. `/dev/zero`).
pub fn swap_for_symlink(user: &User, lib: &Path, target: &str) {
    std::fs::remove_file(lib).unwrap();
    std::os::unix::fs::symlink(target, lib).unwrap();
    std::os::unix::fs::lchown(lib, Some(user.uid), Some(user.gid)).unwrap();
}

/// Replaces the mapped `lib` by a sparse file of `user`'s, `len` bytes of
/// zeroes (1 GiB in the issue) that take no disk space.
pub fn swap_for_sparse(user: &User, lib: &Path, len: u64) {
    std::fs::remove_file(lib).unwrap();
    std::fs::File::create(lib).unwrap().set_len(len).unwrap();
    user.own(lib);
}

unsafe extern "C" {
    #[link_name = "mkfifo"]
    fn libc_mkfifo(path: *const std::ffi::c_char, mode: u32) -> i32;
    fn kill(pid: i32, sig: i32) -> i32;
}

/// Builds `tests/programs/attack/fake.c` into `dir/fake` (plain `cc`, no
/// MPI: it maps or dlopens the library itself), readable by every user.
pub fn fake_binary(dir: &Path) -> PathBuf {
    let out = dir.join("fake");
    let o = Command::new("cc")
        .args(["-O0", "-o"])
        .arg(&out)
        .arg(program("attack/fake.c"))
        .arg("-ldl")
        .output()
        .expect("running cc");
    assert!(
        o.status.success(),
        "cc attack/fake.c failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// What fake MPI processes do once their library is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FakeMode {
    /// Map the library (read+exec, offset 0) and sleep; never touch it.
    Map,
    /// dlopen the library (a [`User::stub_libmpi`]: a real libmpi aborts
    /// when called before MPI_Init) and call `MPI_Barrier` and `MPI_Send`
    /// from this many distinct call sites (1..=1024), a round every ms.
    Call(u32),
}

/// A group of fake MPI processes of one user, all killed (SIGKILL to their
/// process group) when dropped.
pub struct Fakes {
    child: Option<Child>,
    /// Their pids.
    pub pids: Vec<u32>,
}

impl Fakes {
    /// Starts `n` fakes as `user` mapping `lib` (one process that forks, so
    /// hundreds are cheap), with `env` added to their environment (e.g. a
    /// spoofed `SLURM_JOB_ID`), and waits until each printed READY.
    pub fn spawn_with_env(
        user: &User,
        bin: &Path,
        mode: FakeMode,
        lib: &Path,
        n: u32,
        env: &[(&str, &str)],
    ) -> Fakes {
        let mut c = user.command(bin);
        match mode {
            FakeMode::Map => c.arg("map").arg(lib).arg(n.to_string()),
            FakeMode::Call(sites) => c
                .arg("call")
                .arg(lib)
                .arg(n.to_string())
                .arg(sites.to_string()),
        };
        c.envs(env.iter().copied())
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = c.spawn().unwrap_or_else(|e| panic!("spawning {c:?}: {e}"));
        let out = child.stdout.take().expect("piped");
        let mut fakes = Fakes {
            child: Some(child),
            pids: Vec::new(),
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        while fakes.pids.len() < n as usize {
            let l = rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|e| {
                    panic!(
                        "{} of {n} fakes printed READY ({e}): see their stderr above",
                        fakes.pids.len()
                    )
                });
            if let Some(pid) = l.strip_prefix("READY ") {
                fakes.pids.push(pid.trim().parse().unwrap());
            }
        }
        user.assert_runs(&fakes.pids);
        fakes
    }

    /// [`Fakes::spawn_with_env`] with no extra environment.
    pub fn spawn(user: &User, bin: &Path, mode: FakeMode, lib: &Path, n: u32) -> Fakes {
        Fakes::spawn_with_env(user, bin, mode, lib, n, &[])
    }

    /// Whether every fake still runs.
    pub fn all_alive(&self) -> bool {
        self.pids
            .iter()
            .all(|p| Path::new(&format!("/proc/{p}")).exists())
    }
}

impl Drop for Fakes {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on the process group our child leads.
            unsafe { kill(-(c.id() as i32), crate::signal::KILL) };
            let _ = c.wait();
        }
    }
}

/// Starts the honest job: `tests/programs/attack/victim.c`, 2 ranks of
/// `mpi` run by `user`, each making exactly `iters` `MPI_Allreduce` and
/// `iters` `MPI_Barrier` calls once let go ([`Job::go`]). Checks that its
/// ranks run as `user`.
pub fn victim_job(mpi: Mpi, dir: &Path, user: &User, iters: u64) -> Job {
    victim_job_with(mpi, dir, user, iters, &[])
}

/// [`victim_job`] with `env` set in its ranks (`VICTIM_POLL`: see the
/// program).
pub fn victim_job_with(mpi: Mpi, dir: &Path, user: &User, iters: u64, env: &[(&str, &str)]) -> Job {
    let bin = dir.join(format!("victim-{}", mpi.name()));
    compile(mpi, &program("attack/victim.c"), &bin, &[]);
    let mut launcher = user.launcher(mpi, 2);
    for (k, v) in env {
        if mpi.is_open_mpi() {
            launcher.args(["-x", &format!("{k}={v}")]);
        } else {
            launcher.args(["-genv", k, v]);
        }
    }
    launcher.arg(&bin).arg(iters.to_string());
    let job = Job::spawn(launcher, 2, dir.join(format!("victim-{}.go", mpi.name())));
    user.assert_runs(&job.pids());
    job
}

/// The (jobid, rank) labels the daemon gives each of `pids`, from
/// `mpi_rank_info{pid=...}`; `None` until it attached them all.
pub fn rank_labels(samples: &[Sample], pids: &[u32]) -> Option<Vec<(String, String)>> {
    pids.iter()
        .map(|pid| {
            let info = samples
                .iter()
                .find(|s| s.name == "mpi_rank_info" && s.label("pid") == Some(&pid.to_string()))?;
            Some((
                info.label("jobid")?.to_string(),
                info.label("rank")?.to_string(),
            ))
        })
        .collect()
}

/// Waits (30 s at most) until the daemon attached every one of `pids`,
/// then returns their (jobid, rank) labels.
pub fn wait_attached(daemon: &mut Daemon, pids: &[u32]) -> Vec<(String, String)> {
    wait_for(
        &format!("the daemon to attach {pids:?}"),
        Duration::from_secs(30),
        || rank_labels(&daemon.scrape().1, pids),
    )
}

/// Asserts that the scrape `samples` shows exactly `iters` `MPI_Allreduce`
/// and `MPI_Barrier` calls for each of the victim's ranks `labels`, summed
/// over every series with those labels (so a forged duplicate series counts
/// against it).
pub fn check_victim(samples: &[Sample], labels: &[(String, String)], iters: u64) {
    for (jobid, rank) in labels {
        for f in ["MPI_Allreduce", "MPI_Barrier"] {
            let got = sum(
                samples,
                "mpi_calls_total",
                &[("jobid", jobid), ("rank", rank), ("function", f)],
            );
            assert_eq!(
                got, iters as f64,
                "the victim's rank {rank} (job {jobid}) made {iters} {f} calls; the daemon shows {got}"
            );
        }
    }
}

/// Lets the victim `job` run, waits for it to succeed, then waits (10 s at
/// most) until the daemon shows its exact counts, with scrapes of at most
/// `limit` each.
pub fn victim_finish_and_check(
    daemon: &mut Daemon,
    job: Job,
    labels: &[(String, String)],
    iters: u64,
    limit: Duration,
) {
    job.finish("OK ");
    let start = Instant::now();
    loop {
        let s = assert_scrape_within(&daemon.addr, limit);
        let exact = labels.iter().all(|(jobid, rank)| {
            ["MPI_Allreduce", "MPI_Barrier"].iter().all(|f| {
                sum(
                    &s,
                    "mpi_calls_total",
                    &[("jobid", jobid), ("rank", rank), ("function", f)],
                ) == iters as f64
            })
        });
        if exact || start.elapsed() > Duration::from_secs(10) {
            check_victim(&s, labels, iters);
            return;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Times one HTTP GET of `/metrics` on `addr`: (time to the whole answer,
/// status code, body). Gives up after 30 s (an error, not a panic), so a
/// frozen daemon shows as a slow scrape.
pub fn time_scrape(addr: &str) -> (Duration, std::io::Result<(u16, String)>) {
    let start = Instant::now();
    let r = http_get_within(addr, "/metrics", Duration::from_secs(30));
    (start.elapsed(), r)
}

/// Asserts that a scrape of `addr` answers 200 within `limit` (the issue
/// asks 2 s under attack) and returns its samples.
pub fn assert_scrape_within(addr: &str, limit: Duration) -> Vec<Sample> {
    let (took, r) = time_scrape(addr);
    let (code, body) = r.unwrap_or_else(|e| panic!("scrape of {addr} failed after {took:?}: {e}"));
    assert_eq!(code, 200, "scrape of {addr}: {body}");
    assert!(
        took <= limit,
        "a scrape must answer within {limit:?}; it took {took:?}"
    );
    parse_metrics(&body)
}
