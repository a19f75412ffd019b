//! Issue 21, attacks 1, 2, 8 and 11, against a real root daemon, by an
//! unprivileged attacker (`mpiobs-attacker`): a binary whose compressed
//! debug section claims 2^40 bytes, a mapped library swapped for a FIFO,
//! `/dev/zero` or a sparse 1 GiB file, twenty processes mapping one
//! library, and a rank with thousands of call sites. Each time the daemon
//! stays up, every scrape answers within 2 s, its memory stays bounded, and
//! what was refused is counted.
//!
//! Harness: `e2e::attack`.

use std::{path::Path, time::Duration};

use e2e::{
    Daemon, Job, Mpi, Need, Sample,
    attack::{
        ATTACKER, FakeMode, Fakes, User, assert_scrape_within, fake_binary, rank_labels,
        swap_for_fifo, swap_for_sparse, swap_for_symlink,
    },
    compile, program, require, scratch, shim, sum, wait_for,
};

/// What the issue asks of a scrape under attack.
const SCRAPE_LIMIT: Duration = Duration::from_secs(2);

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

/// The jobid label of a pid, from mpi_rank_info.
fn jobid_of(s: &[Sample], pid: u32) -> Option<String> {
    rank_labels(s, &[pid]).map(|mut l| l.remove(0).0)
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
    let attacker = User::ensure(ATTACKER);
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
    let mut evil_cmd = attacker.launcher(Mpi::Mpich, 2);
    evil_cmd
        .args(["-genv", "LD_PRELOAD", shim.to_str().unwrap()])
        .args(["-genv", "MPI_TOOLS_ENTRY", "stats"])
        .arg(&evil)
        .args(["1000", "1000", "10"]);
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
    let d = Daemon::start(&args);
    let dpid = d.pid();
    evil_job.go();
    let honest_pids = honest.pids();
    honest.finish("OK");
    // Scrape until the poisoned file was tried and counted.
    let s = wait_for(
        "the symbolizer failure to be counted",
        Duration::from_secs(60),
        || {
            let s = assert_scrape_within(&d.addr, SCRAPE_LIMIT);
            let failed = ["memory", "crash", "timeout", "cpu"]
                .iter()
                .map(|r| {
                    sum(
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
        sum(
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
        last = assert_scrape_within(&d.addr, SCRAPE_LIMIT);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(
        sum(&last, "mpi_observer_symbolizer_failures_total", &[]),
        sum(&s, "mpi_observer_symbolizer_failures_total", &[]),
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
            sum(&last, "mpi_calls_total", &l),
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

/// Attack 2: the mapped library's path swapped, after the mapping, for a
/// FIFO, a symlink to /dev/zero, or a sparse 1 GiB file. The daemon reads
/// the file the process maps (never the path), answers every scrape within
/// 2 s and keeps its memory small.
#[test]
fn a_swapped_library_path_never_blocks_or_bloats_the_daemon() {
    if !require(&[Need::Root, Need::Mpi(Mpi::OpenMpi)]) {
        return;
    }
    let attacker = User::ensure(ATTACKER);
    let bin = fake_binary(&scratch("symbolize-attacks-swap"));
    let mut procs = Vec::new();
    let mut pids = Vec::new();
    for (sub, swap) in [("fifo dir", 0), ("zero", 1), ("sparse", 2)] {
        let lib = attacker.libmpi_copy(sub);
        let fake = Fakes::spawn(&attacker, &bin, FakeMode::Map, &lib, 1);
        match swap {
            0 => swap_for_fifo(&attacker, &lib),
            1 => swap_for_symlink(&attacker, &lib, "/dev/zero"),
            _ => swap_for_sparse(&attacker, &lib, 1 << 30),
        }
        pids.extend(&fake.pids);
        procs.push(fake);
    }
    let args: Vec<String> = ["--all".to_string()].into_iter().collect();
    let d = Daemon::start(&args);
    let dpid = d.pid();
    // Each is attached (its mapped file is the real library) or refused
    // with one line; either way every scrape is quick.
    let s = wait_for(
        "the three processes to be looked at",
        Duration::from_secs(30),
        || {
            let s = assert_scrape_within(&d.addr, SCRAPE_LIMIT);
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
        assert_scrape_within(&d.addr, SCRAPE_LIMIT);
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
    let attacker = User::ensure(ATTACKER);
    let lib = attacker.libmpi_copy("lib");
    let bin = fake_binary(&scratch("symbolize-attacks-twenty"));
    let procs = Fakes::spawn(&attacker, &bin, FakeMode::Map, &lib, 20);
    let args: Vec<String> = procs
        .pids
        .iter()
        .flat_map(|p| ["--pid".to_string(), p.to_string()])
        .collect();
    let d = Daemon::start(&args);
    let s = assert_scrape_within(&d.addr, SCRAPE_LIMIT);
    assert_eq!(sum(&s, "mpi_observer_library_parses_total", &[]), 1.0);
    assert_eq!(sum(&s, "mpi_observer_library_cache_hits_total", &[]), 19.0);
    assert_eq!(sum(&s, "mpi_observer_attached_processes", &[]), 20.0);
    drop(procs);
}

/// Attack 8: a rank with thousands of distinct call sites keeps the name
/// cache at its bound and the daemon's memory flat.
#[test]
fn thousands_of_call_sites_keep_the_name_cache_at_its_bound() {
    if !require(&[Need::Root, Need::Mpi(Mpi::OpenMpi)]) {
        return;
    }
    let attacker = User::ensure(ATTACKER);
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
    let mut cmd = attacker.launcher(Mpi::OpenMpi, 1);
    cmd.args(["-x", &format!("LD_PRELOAD={}", shim.display())])
        .args(["-x", "MPI_TOOLS_ENTRY=stats"])
        .arg(&exe);
    let job = Job::spawn(cmd, 1, attacker.home.join("go"));
    let mut args = job.pid_args();
    args.extend(["--max-callsite-names".to_string(), "1000".to_string()]);
    let d = Daemon::start(&args);
    let dpid = d.pid();
    job.go();
    let mut rss_seen = Vec::new();
    let mut cached = 0.0;
    let mut evicted = 0.0;
    for _ in 0..12 {
        let s = assert_scrape_within(&d.addr, SCRAPE_LIMIT);
        cached = sum(&s, "mpi_observer_callsite_names", &[]);
        evicted = sum(&s, "mpi_observer_callsite_name_evictions_total", &[]);
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
