//! Issue 21, attacks 1, 2, 8 and 11, against a real root daemon, by an
//! unprivileged attacker (`mpiobs-attacker`): a binary whose compressed
//! debug section claims 2^40 bytes, a mapped library swapped for a FIFO,
//! `/dev/zero` or a sparse 1 GiB file, twenty processes mapping one
//! library, and a rank with thousands of call sites. Each time the daemon
//! stays up, every scrape answers within 2 s, its memory stays bounded, and
//! what was refused is counted.
//!
//! The attacker helpers here are local (tests/src/attack.rs, the shared
//! harness, is not on main yet).

use std::{
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, compile, program, require, scratch, shim, sum, target_dir,
    wait_for,
};

const ATTACKER: &str = "mpiobs-attacker";
const LIBMPI: &str = "/usr/lib/x86_64-linux-gnu/libmpi.so.40";

/// The attacker: created if missing (idempotent), with a fresh home.
struct Attacker {
    uid: u32,
    gid: u32,
    home: PathBuf,
}

fn id_of(flag: &str) -> Option<u32> {
    let o = Command::new("id").args([flag, ATTACKER]).output().ok()?;
    String::from_utf8_lossy(&o.stdout).trim().parse().ok()
}

impl Attacker {
    fn ensure(tag: &str) -> Attacker {
        if id_of("-u").is_none() {
            let _ = Command::new("useradd")
                .args(["--system", "--no-create-home", ATTACKER])
                .status();
        }
        let uid = id_of("-u").expect("useradd mpiobs-attacker (run as root)");
        let gid = id_of("-g").unwrap();
        let home = target_dir()
            .join("e2e")
            .join(format!("attacker-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        std::fs::create_dir_all(&home).unwrap();
        let a = Attacker { uid, gid, home };
        a.own(&a.home);
        std::fs::set_permissions(&a.home, std::fs::Permissions::from_mode(0o700)).unwrap();
        a
    }

    fn own(&self, p: &Path) {
        std::os::unix::fs::lchown(p, Some(self.uid), Some(self.gid)).unwrap();
    }

    /// `cmd` as the attacker (setpriv-like: uid, gid, no groups).
    fn apply<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.uid(self.uid)
            .gid(self.gid)
            .env("HOME", &self.home)
            .env("TMPDIR", &self.home)
            .env_remove("OMPI_ALLOW_RUN_AS_ROOT")
            .env_remove("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")
            .current_dir(&self.home)
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.home);
    }
}

/// The daemon's peak and current resident memory, in bytes.
fn rss(pid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = |k: &str| -> u64 {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmHWM:"), kb("VmRSS:"))
}

/// The daemon's pid, from its own self-metric-free view: the process
/// listening on its port is its child, found by its command line.
fn daemon_pid(d: &Daemon) -> u32 {
    let port = d.addr.rsplit(':').next().unwrap().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c);
                c.contains("attach") && c.contains(&format!("127.0.0.1:{port}"))
            })
        })
        .expect("the daemon's pid")
}

/// One scrape, timed: it must answer within 2 s.
fn scrape_within_2s(d: &mut Daemon) -> Vec<Sample> {
    let t = Instant::now();
    let (_, s) = d.scrape();
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "a scrape took {:?}",
        t.elapsed()
    );
    s
}

fn value(s: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    sum(s, name, labels)
}

/// The jobid label of a pid, from mpi_rank_info.
fn jobid_of(s: &[Sample], pid: u32) -> Option<String> {
    let p = pid.to_string();
    s.iter()
        .find(|x| x.name == "mpi_rank_info" && x.label("pid") == Some(&p))
        .and_then(|x| x.label("jobid").map(str::to_string))
}

/// Patches the `Elf64_Chdr.ch_size` of every compressed section of `exe`
/// (`.debug_*` of `-gz=zlib`) to 2^40; returns how many were patched.
fn claim_2_40(exe: &Path) -> usize {
    use object::read::elf::{FileHeader as _, SectionHeader as _};
    let mut data = std::fs::read(exe).unwrap();
    let offsets: Vec<usize> = {
        let h = object::elf::FileHeader64::<object::Endianness>::parse(&*data).unwrap();
        let e = h.endian().unwrap();
        h.sections(e, &*data)
            .unwrap()
            .iter()
            .filter(|s| s.sh_flags(e) & u64::from(object::elf::SHF_COMPRESSED) != 0)
            .map(|s| s.sh_offset(e) as usize)
            .collect()
    };
    for off in &offsets {
        // Elf64_Chdr: ch_type (4), ch_reserved (4), ch_size (8).
        data[off + 8..off + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    }
    std::fs::write(exe, &data).unwrap();
    offsets.len()
}

/// Attack 1: a binary whose compressed debug section claims 2^40 bytes,
/// making MPI calls under the shim's `stats` layer (which records call
/// sites), while another user's probed job runs. The daemon stays up,
/// counts the failure, and the honest job's figures and names are exact.
#[test]
fn a_compressed_section_claiming_a_terabyte_costs_one_counted_failure() {
    if !require(&[Need::Root, Need::Mpi(Mpi::OpenMpi), Need::Mpi(Mpi::Mpich)]) {
        return;
    }
    let attacker = Attacker::ensure("chsize");
    let dir = scratch("symbolize-attacks");
    // The honest job: root, Open MPI, probed with --callsites.
    let honest_exe = dir.join("two_sites-openmpi");
    compile(
        Mpi::OpenMpi,
        &program("callsites/two_sites.c"),
        &honest_exe,
        &["-g"],
    );
    // The attacker's: MPICH, -gz=zlib, patched, in her own directory.
    let evil = attacker.home.join("evil");
    compile(
        Mpi::Mpich,
        &program("callsites/two_sites.c"),
        &evil,
        &["-g", "-gz=zlib"],
    );
    assert!(
        claim_2_40(&evil) > 0,
        "mpicc -gz=zlib made compressed sections"
    );
    attacker.own(&evil);
    let shim = shim();
    let mut evil_cmd = Mpi::Mpich.launcher(2);
    evil_cmd
        .args(["-genv", "LD_PRELOAD", shim.to_str().unwrap()])
        .args(["-genv", "MPI_TOOLS_ENTRY", "stats"])
        .arg(&evil)
        .args(["1000", "1000", "10"]);
    attacker.apply(&mut evil_cmd);
    let evil_job = Job::spawn(evil_cmd, 2, attacker.home.join("go"));
    let mut honest_cmd = Mpi::OpenMpi.launcher(2);
    honest_cmd.arg(&honest_exe).args(["300", "700", "50"]);
    let honest = Job::spawn(
        honest_cmd,
        2,
        dir.join(format!("go-honest-{}", std::process::id())),
    );
    let mut args = honest.pid_args();
    args.extend(evil_job.pid_args());
    args.push("--callsites".into());
    let mut d = Daemon::start(&args);
    let dpid = daemon_pid(&d);
    evil_job.go();
    let honest_pids = honest.pids();
    honest.finish("OK");
    // Scrape until the poisoned file was tried and counted.
    let s = wait_for(
        "the symbolizer failure to be counted",
        Duration::from_secs(60),
        || {
            let s = scrape_within_2s(&mut d);
            let failed = ["memory", "crash", "timeout", "cpu"]
                .iter()
                .map(|r| {
                    value(
                        &s,
                        "mpi_observer_symbolizer_failures_total",
                        &[("reason", r)],
                    )
                })
                .sum::<f64>();
            (failed >= 1.0).then_some(s)
        },
    );
    assert_eq!(
        value(
            &s,
            "mpi_observer_symbolizer_failures_total",
            &[("reason", "memory")]
        ),
        1.0,
        "one failure, an allocation refused under the symbolizer's memory cap; then the file is poisoned"
    );
    evil_job.finish("OK");
    // More scrapes: the file is not tried again, the daemon stays up.
    let mut last = Vec::new();
    for _ in 0..3 {
        last = scrape_within_2s(&mut d);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        value(&last, "mpi_observer_symbolizer_failures_total", &[]),
        value(&s, "mpi_observer_symbolizer_failures_total", &[]),
        "a poisoned file is tried once"
    );
    // The honest job: exact counts, exact names.
    let job = jobid_of(&last, honest_pids[0]).expect("the honest job's ranks");
    for rank in ["0", "1"] {
        let l = [
            ("jobid", job.as_str()),
            ("rank", rank),
            ("function", "MPI_Allreduce"),
        ];
        assert_eq!(
            value(&last, "mpi_calls_total", &l),
            1000.0,
            "honest rank {rank}"
        );
        let named: f64 = last
            .iter()
            .filter(|x| {
                x.name == "mpi_callsite_calls_total"
                    && l.iter().all(|(k, v)| x.label(k) == Some(v))
                    && x.label("callsite")
                        .is_some_and(|c| c.contains("two_sites.c:"))
            })
            .map(|x| x.value)
            .sum();
        assert_eq!(
            named, 1000.0,
            "honest rank {rank}: every call at a named site"
        );
    }
    // The attacker's sites: object+offset names, all calls counted.
    let ejob = jobid_of(&last, evil_job_pid(&last, &job)).unwrap();
    let evil_sites: Vec<&Sample> = last
        .iter()
        .filter(|x| {
            x.name == "mpi_callsite_calls_total"
                && x.label("jobid") == Some(&ejob)
                && x.label("function") == Some("MPI_Allreduce")
        })
        .collect();
    assert!(
        evil_sites.iter().any(|x| x
            .label("callsite")
            .is_some_and(|c| c.starts_with("evil+0x"))),
        "the poisoned file's sites keep object+offset names: {evil_sites:?}"
    );
    let (hwm, _) = rss(dpid);
    assert!(hwm < 300 << 20, "daemon peak RSS {hwm}");
    let log = d.log().join("\n");
    assert!(
        log.contains("the symbolizer died symbolizing"),
        "one line says what happened:\n{log}"
    );
}

/// A pid of a job other than `honest` in the exposition.
fn evil_job_pid(s: &[Sample], honest: &str) -> u32 {
    s.iter()
        .find(|x| x.name == "mpi_rank_info" && x.label("jobid") != Some(honest))
        .and_then(|x| x.label("pid")?.parse().ok())
        .expect("the attacker's ranks")
}

/// A process of the attacker's that maps `lib` (read, exec, offset 0) and
/// sleeps; READY once mapped.
fn mapper(attacker: &Attacker, lib: &Path, n: u32) -> Vec<Child> {
    let src = attacker.home.join("mapper.c");
    std::fs::write(
        &src,
        r#"#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) return 1;
    if (mmap(0, st.st_size, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) return 2;
    close(fd);
    printf("READY\n");
    fflush(stdout);
    for (;;) pause();
}
"#,
    )
    .unwrap();
    let bin = attacker.home.join("mapper");
    let o = Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    attacker.own(&bin);
    (0..n)
        .map(|_| {
            let mut c = Command::new(&bin);
            attacker.apply(&mut c).arg(lib).stdout(Stdio::piped());
            let mut child = c.spawn().unwrap();
            let mut out = child.stdout.take().unwrap();
            let mut buf = [0u8; 6];
            std::io::Read::read_exact(&mut out, &mut buf).unwrap();
            assert_eq!(&buf, b"READY\n");
            child
        })
        .collect()
}

fn kill_all(children: &mut [Child]) {
    for c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Kills the attacker's processes however the test ends.
struct Reap(Vec<Child>);

impl Drop for Reap {
    fn drop(&mut self) {
        kill_all(&mut self.0);
    }
}

/// A copy of Debian's libmpi.so.40 in a directory of the attacker's.
fn libmpi_copy(attacker: &Attacker, sub: &str) -> PathBuf {
    let dir = attacker.home.join(sub);
    std::fs::create_dir_all(&dir).unwrap();
    attacker.own(&dir);
    let lib = dir.join("libmpi.so.40");
    std::fs::copy(LIBMPI, &lib).unwrap();
    attacker.own(&lib);
    lib
}

/// Attack 2: the mapped library's path swapped, after the mapping, for a
/// FIFO, a symlink to /dev/zero, or a sparse 1 GiB file. The daemon reads
/// the file the process maps (never the path), answers every scrape within
/// 2 s and keeps its memory small.
#[test]
fn a_swapped_library_path_never_blocks_or_bloats_the_daemon() {
    if !require(&[Need::Root, Need::Mpi(Mpi::OpenMpi)]) {
        return;
    }
    let attacker = Attacker::ensure("swap");
    let mut procs = Reap(Vec::new());
    let mut pids = Vec::new();
    for (sub, swap) in [("fifo dir", 0), ("zero", 1), ("sparse", 2)] {
        let lib = libmpi_copy(&attacker, sub);
        let mut p = mapper(&attacker, &lib, 1);
        std::fs::remove_file(&lib).unwrap();
        match swap {
            0 => {
                let c = std::ffi::CString::new(lib.as_os_str().as_encoded_bytes()).unwrap();
                // SAFETY: a NUL-terminated path.
                assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
            }
            1 => std::os::unix::fs::symlink("/dev/zero", &lib).unwrap(),
            _ => std::fs::File::create(&lib)
                .unwrap()
                .set_len(1 << 30)
                .unwrap(),
        }
        attacker.own(&lib);
        pids.push(p[0].id());
        procs.0.append(&mut p);
    }
    let args: Vec<String> = ["--all".to_string()].into_iter().collect();
    let mut d = Daemon::start(&args);
    let dpid = daemon_pid(&d);
    // Each is attached (its mapped file is the real library) or refused
    // with one line; either way every scrape is quick.
    let s = wait_for(
        "the three processes to be looked at",
        Duration::from_secs(30),
        || {
            let s = scrape_within_2s(&mut d);
            let attached = pids.iter().filter(|p| jobid_of(&s, **p).is_some()).count();
            let log = d.log();
            let refused = pids
                .iter()
                .filter(|p| {
                    log.iter().any(|l| {
                        l.contains(&format!("pid {p}")) || l.contains(&format!("process {p}"))
                    })
                })
                .count();
            (attached + refused >= pids.len()).then_some(s)
        },
    );
    for _ in 0..5 {
        scrape_within_2s(&mut d);
    }
    let (hwm, now) = rss(dpid);
    assert!(hwm < 300 << 20, "daemon peak RSS {hwm} (now {now})");
    // The library is read as mapped (the real one), so what remains is the
    // uprobe link, which the kernel makes by path: a FIFO or a device is
    // refused there, in one line; the sparse file gets probes on a file no
    // process runs (harmless, and the process's own figures are empty).
    let log = d.log();
    for p in &pids {
        let lines = log
            .iter()
            .filter(|l| l.contains(&format!("pid {p}:")))
            .count();
        assert!(
            jobid_of(&s, *p).is_some() || lines == 1,
            "pid {p}: attached, or refused in one line:\n{}",
            log.join("\n")
        );
    }
    assert!(
        !log.iter().any(|l| l.contains("memory allocation")),
        "{log:?}"
    );
    drop(procs);
}

/// Attack 11: twenty processes mapping one library cost one parse.
#[test]
fn twenty_processes_of_one_library_parse_it_once() {
    if !require(&[Need::Root, Need::Mpi(Mpi::OpenMpi)]) {
        return;
    }
    let attacker = Attacker::ensure("twenty");
    let lib = libmpi_copy(&attacker, "lib");
    let procs = Reap(mapper(&attacker, &lib, 20));
    let args: Vec<String> = procs
        .0
        .iter()
        .flat_map(|c| ["--pid".to_string(), c.id().to_string()])
        .collect();
    let mut d = Daemon::start(&args);
    let s = scrape_within_2s(&mut d);
    assert_eq!(value(&s, "mpi_observer_library_parses_total", &[]), 1.0);
    assert_eq!(
        value(&s, "mpi_observer_library_cache_hits_total", &[]),
        19.0
    );
    assert_eq!(value(&s, "mpi_observer_attached_processes", &[]), 20.0);
    drop(procs);
}

/// Attack 8: a rank with thousands of distinct call sites keeps the name
/// cache at its bound and the daemon's memory flat.
#[test]
fn thousands_of_call_sites_keep_the_name_cache_at_its_bound() {
    if !require(&[Need::Root, Need::Mpi(Mpi::OpenMpi)]) {
        return;
    }
    let attacker = Attacker::ensure("sites");
    // 4096 call sites of MPI_Comm_rank, called round after round.
    let mut src = String::from(
        "#include <mpi.h>\n#include <stdio.h>\n#include <unistd.h>\n\
         #define S(n) __attribute__((noipa)) static void s##n(void) { int r; MPI_Comm_rank(MPI_COMM_WORLD, &r); }\n",
    );
    for i in 0..4096 {
        src.push_str(&format!("S({i})\n"));
    }
    src.push_str("static void (*const all[])(void) = {");
    for i in 0..4096 {
        src.push_str(&format!("s{i},"));
    }
    src.push_str(
        "};\nint main(int argc, char **argv) {\n MPI_Init(&argc, &argv);\n int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);\n\
         printf(\"READY %d %d\\n\", rank, (int)getpid()); fflush(stdout);\n\
         while (access(argv[1], F_OK) != 0) usleep(20000);\n\
         for (int round = 0; round < 20; round++) { for (unsigned i = 0; i < sizeof all / sizeof *all; i++) all[i](); usleep(100000); }\n\
         printf(\"OK %d\\n\", rank); fflush(stdout); MPI_Finalize(); return 0; }\n",
    );
    let c = attacker.home.join("many_sites.c");
    std::fs::write(&c, src).unwrap();
    let exe = attacker.home.join("many_sites");
    compile(Mpi::OpenMpi, &c, &exe, &["-g", "-O1"]);
    attacker.own(&exe);
    let shim = shim();
    let mut cmd = Mpi::OpenMpi.launcher(1);
    cmd.args(["-x", &format!("LD_PRELOAD={}", shim.display())])
        .args(["-x", "MPI_TOOLS_ENTRY=stats"])
        .arg(&exe);
    attacker.apply(&mut cmd);
    let job = Job::spawn(cmd, 1, attacker.home.join("go"));
    let mut args = job.pid_args();
    args.extend(["--max-callsite-names".to_string(), "1000".to_string()]);
    let mut d = Daemon::start(&args);
    let dpid = daemon_pid(&d);
    job.go();
    let mut rss_seen = Vec::new();
    let mut cached = 0.0;
    let mut evicted = 0.0;
    for _ in 0..12 {
        let s = scrape_within_2s(&mut d);
        cached = value(&s, "mpi_observer_callsite_names", &[]);
        evicted = value(&s, "mpi_observer_callsite_name_evictions_total", &[]);
        assert!(cached <= 1000.0, "the cache holds {cached} names");
        rss_seen.push(rss(dpid).1);
        std::thread::sleep(Duration::from_millis(250));
    }
    job.finish("OK");
    assert!(evicted > 0.0, "names were evicted ({cached} cached)");
    let (first, last) = (rss_seen[4], *rss_seen.last().unwrap());
    assert!(
        last < first + (8 << 20),
        "RSS grew from {first} to {last} across scrapes: {rss_seen:?}"
    );
}
