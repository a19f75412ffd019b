//! End-to-end tests of the kernel maps shared by the CPUs (issue 21, build
//! item 7, and the kernel half of attack 5):
//! - threads of a rank calling at once on different CPUs add to the same
//!   statistics entry with atomic adds: every call counted, exactly;
//! - a process calling MPI from more distinct sites than its call-site cap
//!   gets exactly the cap in `MPI_CALLSITES`, the calls from the other sites
//!   are counted as refused, and its `mpi_calls_total` stays exact.
//!
//! The map contents are read with `bpftool`, as an administrator would.

use std::{fmt::Write as _, process::Command, time::Duration};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, assert_no_probes_left, compile, program, require, scratch,
    signal, sum, wait_for,
};

/// Threads per rank, calls per thread, ranks. With plain (not atomic) adds
/// the probes lost 10 of 200,000 calls per rank at 50,000 calls per thread
/// on this 2-CPU VM (MPICH); more calls make a lost update likelier.
const THREADS: u64 = 4;
const CALLS: u64 = 200_000;
const NP: u32 = 2;

/// `observer_common::maps::DEFAULT_MAX_SITES`, the daemon's default cap.
const MAX_SITES: u64 = 1024;
/// Distinct call sites of the many-sites program, and rounds over them.
const SITES: u64 = MAX_SITES + 76;
const ROUNDS: u64 = 3;

/// Scrapes until every rank has exited; returns that scrape.
fn final_scrape(d: &mut Daemon, np: u32) -> Vec<Sample> {
    wait_for("every rank's exit", Duration::from_secs(60), || {
        let (_, s) = d.scrape();
        let ranks = s.iter().filter(|x| x.name == "mpi_rank_up").count();
        (ranks == np as usize && sum(&s, "mpi_rank_up", &[]) == 0.0).then_some(s)
    })
}

fn threads_are_exact(mpi: Mpi) {
    if !require(&[Need::Root, Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("kmaps-threads-{}", mpi.name()));
    let exe = dir.join("threads");
    compile(mpi, &program("kmaps/threads.c"), &exe, &["-pthread"]);
    let mut c = mpi.launcher(NP);
    c.arg(&exe).args([THREADS.to_string(), CALLS.to_string()]);
    let job = Job::spawn(c, NP, dir.join(format!("go-{}", std::process::id())));
    let mut args = job.pid_args();
    args.extend(["--functions".to_string(), "MPI_Comm_rank".to_string()]);
    let mut d = Daemon::start(&args);
    job.finish("OK ");
    let s = final_scrape(&mut d, NP);
    for rank in 0..NP {
        let calls = sum(
            &s,
            "mpi_calls_total",
            &[("rank", &rank.to_string()), ("function", "MPI_Comm_rank")],
        ) as u64;
        assert_eq!(
            calls,
            THREADS * CALLS,
            "{mpi:?} rank {rank}: MPI_Comm_rank from {THREADS} threads"
        );
    }
    // The histogram's adds are atomic too: its buckets hold every call.
    let inf = sum(
        &s,
        "mpi_call_duration_seconds_bucket",
        &[("function", "MPI_Comm_rank"), ("le", "+Inf")],
    ) as u64;
    assert_eq!(inf, u64::from(NP) * THREADS * CALLS, "{mpi:?} histogram");
    assert_eq!(
        sum(&s, "mpi_observer_map_update_failures_total", &[]),
        0.0,
        "no map update failed"
    );
    assert!(d.stop(signal::TERM).success());
    assert_no_probes_left();
}

e2e::per_mpi!(threads_calling_at_once_are_counted_exactly => threads_are_exact: openmpi, mpich);

/// A program with `SITES` distinct MPI_Barrier call sites (one `case` each,
/// built at -O0 so none is merged with another), visited in order
/// `ROUNDS` times: the first `MAX_SITES` sites visited are the ones the
/// cap admits.
fn many_sites_source() -> String {
    let mut s = String::from(
        "#include <mpi.h>\n#include <stdio.h>\n#include <unistd.h>\n\
         static void site(long i) {\n  switch (i) {\n",
    );
    for i in 0..SITES {
        let _ = writeln!(s, "  case {i}: MPI_Barrier(MPI_COMM_WORLD); break;");
    }
    let _ = write!(
        s,
        "  }}\n}}\n\
         int main(int argc, char **argv) {{\n\
         MPI_Init(&argc, &argv);\n\
         int rank; MPI_Comm_rank(MPI_COMM_WORLD, &rank);\n\
         if (argc < 3) MPI_Abort(MPI_COMM_WORLD, 2);\n\
         printf(\"READY %d %d\\n\", rank, (int)getpid()); fflush(stdout);\n\
         while (access(argv[1], F_OK) != 0) usleep(20000);\n\
         for (long r = 0; r < {ROUNDS}; r++)\n\
           for (long i = 0; i < {SITES}; i++) site(i);\n\
         while (access(argv[2], F_OK) != 0) usleep(20000);\n\
         printf(\"OK %d\\n\", rank); fflush(stdout);\n\
         MPI_Finalize();\n  return 0;\n}}\n"
    );
    s
}

/// The entries of the BPF maps named `name` whose key starts with `pid`
/// (little-endian u32), as (key, value) bytes, from `bpftool map dump`.
fn map_entries(name: &str, pid: u32) -> Vec<(Vec<u8>, Vec<u8>)> {
    let o = Command::new("bpftool")
        .args(["-j", "map", "dump", "name", name])
        .output()
        .expect("run bpftool");
    assert!(
        o.status.success(),
        "bpftool map dump name {name}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("bpftool's JSON");
    let mut out = Vec::new();
    collect_entries(&v, &mut out);
    out.retain(|(k, _)| k.len() >= 4 && k[..4] == pid.to_le_bytes());
    out
}

/// Every object with a `key` and a `value` array of hex bytes in `v`
/// (bpftool nests one array per map when several share the name).
fn collect_entries(v: &serde_json::Value, out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
    let bytes = |x: &serde_json::Value| -> Option<Vec<u8>> {
        x.as_array()?
            .iter()
            .map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok())
            .collect()
    };
    match v {
        serde_json::Value::Array(a) => a.iter().for_each(|x| collect_entries(x, out)),
        serde_json::Value::Object(o) => {
            if let (Some(k), Some(val)) =
                (o.get("key").and_then(bytes), o.get("value").and_then(bytes))
            {
                out.push((k, val));
            }
        }
        _ => {}
    }
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

#[test]
fn call_sites_beyond_the_cap_are_refused_and_counted() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    let dir = scratch("kmaps-many-sites");
    let src = dir.join("many_sites.c");
    std::fs::write(&src, many_sites_source()).unwrap();
    let exe = dir.join("many_sites");
    compile(mpi, &src, &exe, &["-O0"]);
    let mut c = mpi.launcher(1);
    c.arg(&exe);
    let job = Job::spawn_held(
        c,
        1,
        dir.join(format!("go-{}", std::process::id())),
        dir.join(format!("stop-{}", std::process::id())),
    );
    let pid = job.pid(0);
    let mut args = job.pid_args();
    args.extend(
        ["--callsites", "--functions", "MPI_Barrier"]
            .iter()
            .map(|s| s.to_string()),
    );
    let mut d = Daemon::start(&args);
    job.go();
    // Every call made, the rank held alive: its entries are in the maps.
    let s = wait_for("every call counted", Duration::from_secs(60), || {
        let (_, s) = d.scrape();
        (sum(&s, "mpi_calls_total", &[("function", "MPI_Barrier")]) as u64 == SITES * ROUNDS)
            .then_some(s)
    });
    let sites = map_entries("MPI_CALLSITES", pid);
    assert_eq!(
        sites.len() as u64,
        MAX_SITES,
        "call-site entries of a process with {SITES} sites"
    );
    let site_calls: u64 = sites.iter().map(|(_, v)| u64_at(v, 0)).sum();
    assert_eq!(
        site_calls,
        MAX_SITES * ROUNDS,
        "calls at the admitted sites"
    );
    let counts = map_entries("MPI_SITE_COUNTS", pid);
    assert_eq!(counts.len(), 1, "one count for the process");
    let (created, refused) = (u64_at(&counts[0].1, 0), u64_at(&counts[0].1, 8));
    assert_eq!(created, MAX_SITES, "entries created");
    assert_eq!(
        refused,
        (SITES - MAX_SITES) * ROUNDS,
        "calls from the sites beyond the cap, refused"
    );
    assert_eq!(
        sum(
            &s,
            "mpi_observer_map_update_failures_total",
            &[("map", "callsites")]
        ),
        0.0,
        "a refusal is not a full map"
    );
    job.finish("OK ");
    let s = final_scrape(&mut d, 1);
    assert_eq!(
        sum(&s, "mpi_calls_total", &[("function", "MPI_Barrier")]) as u64,
        SITES * ROUNDS,
        "every call counted, refused sites or not, kept after the exit"
    );
    // Retained with its figures kept, its map entries freed.
    wait_for(
        "the exited rank's entries to be freed",
        Duration::from_secs(10),
        || {
            ["MPI_CALLSITES", "MPI_SITE_COUNTS"]
                .iter()
                .all(|m| map_entries(m, pid).is_empty())
                .then_some(())
        },
    );
    let (_, s) = d.scrape();
    assert_eq!(
        sum(&s, "mpi_calls_total", &[("function", "MPI_Barrier")]) as u64,
        SITES * ROUNDS,
        "the kept figures, after the entries went"
    );
    assert!(d.stop(signal::TERM).success());
    assert_no_probes_left();
}
