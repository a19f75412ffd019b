//! Security tests (issue 21): the root daemon under attack by an
//! unprivileged user while another user's job runs, which must stay exact.
//! Harness: `e2e::attack`.

use std::time::Duration;

use e2e::{
    Daemon, Mpi, Need, assert_no_probes_left,
    attack::{
        ATTACKER, FakeMode, Fakes, User, VICTIM, assert_scrape_within, fake_binary,
        victim_finish_and_check, victim_job, wait_attached,
    },
    require, scratch, signal, wait_for,
};

/// What the issue asks of a scrape under attack.
const SCRAPE_LIMIT: Duration = Duration::from_secs(2);

/// The harness end to end against `attach --all`: while five fake MPI
/// processes of the attacker sit there (three mapping a copy of libmpi from
/// a path with a space, which the daemon attaches, two calling a stub libmpi
/// from 64 call sites, whose calls it counts), the victim's
/// 2-rank job is counted exactly, every scrape answers within 2 s, the
/// fakes and the victim run as their own users, and no probe is left.
#[test]
fn victim_stays_exact_beside_five_fakes() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    const ITERS: u64 = 200;
    let dir = scratch("security-demo");
    let attacker = User::ensure(ATTACKER);
    let victim = User::ensure(VICTIM);
    assert_ne!(attacker.uid, victim.uid);
    let bin = fake_binary(&dir);
    let spaced = attacker.libmpi_copy("lib dir");
    let stub = attacker.stub_libmpi("stub", false);

    let mut daemon = Daemon::start(&["--all".into()]);
    let sleepers = Fakes::spawn(&attacker, &bin, FakeMode::Map, &spaced, 3);
    let callers = Fakes::spawn(&attacker, &bin, FakeMode::Call(64), &stub, 2);
    let job = victim_job(mpi, &dir, &victim, ITERS);
    let labels = wait_attached(&mut daemon, &job.pids());
    // A library path with a space is read whole (issue 21, item 13).
    wait_attached(&mut daemon, &sleepers.pids);
    // The daemon takes the callers for ranks, and counts their calls.
    let fake_labels = wait_attached(&mut daemon, &callers.pids);
    let counted = |s: &[e2e::Sample]| {
        fake_labels
            .iter()
            .map(|(jobid, rank)| {
                e2e::sum(s, "mpi_calls_total", &[("jobid", jobid), ("rank", rank)])
            })
            .sum::<f64>()
    };
    wait_for(
        "the callers' calls to be counted",
        Duration::from_secs(10),
        || (counted(&assert_scrape_within(&daemon.addr, SCRAPE_LIMIT)) > 0.0).then_some(()),
    );
    job.go();
    victim_finish_and_check(&mut daemon, job, &labels, ITERS, SCRAPE_LIMIT);
    assert!(
        sleepers.all_alive() && callers.all_alive(),
        "the fakes must be untouched"
    );
    drop((sleepers, callers));
    assert!(daemon.stop(signal::TERM).success());
    assert_no_probes_left();
}

/// The samples of `name` whose `pid` label is one of `pids`.
fn with_pids<'a>(s: &'a [e2e::Sample], name: &str, pids: &[u32]) -> Vec<&'a e2e::Sample> {
    s.iter()
        .filter(|x| {
            x.name == name
                && x.label("pid")
                    .and_then(|p| p.parse::<u32>().ok())
                    .is_some_and(|p| pids.contains(&p))
        })
        .collect()
}

/// `mpi_observer_refused_processes_total` of `uid` for `budget`.
fn refused(s: &[e2e::Sample], uid: u32, budget: &str) -> f64 {
    e2e::sum(
        s,
        "mpi_observer_refused_processes_total",
        &[("uid", &uid.to_string()), ("budget", budget)],
    )
}

/// Attack 3: 30 fake MPI processes of one user against a per-user budget of
/// 6. The daemon attaches 6, refuses 24 (each counted once, by uid), stays
/// responsive, the victim's job (another user) is attached and exact, and
/// SIGTERM takes every probe out promptly.
#[test]
fn attack3_a_user_past_its_budget_is_refused_and_counted() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    const ITERS: u64 = 100;
    let dir = scratch("security-budget");
    let attacker = User::ensure(ATTACKER);
    let victim = User::ensure(VICTIM);
    let bin = fake_binary(&dir);
    let lib = attacker.libmpi_copy("lib");
    let mut daemon = Daemon::start(&["--all".into(), "--user-max-processes".into(), "6".into()]);
    let fakes = Fakes::spawn(&attacker, &bin, FakeMode::Map, &lib, 30);
    let job = victim_job(mpi, &dir, &victim, ITERS);
    let labels = wait_attached(&mut daemon, &job.pids());
    let s = wait_for(
        "24 of the attacker's processes to be refused",
        Duration::from_secs(60),
        || {
            let s = assert_scrape_within(&daemon.addr, SCRAPE_LIMIT);
            (refused(&s, attacker.uid, "processes") >= 24.0).then_some(s)
        },
    );
    // Each refused once, not at every scan.
    std::thread::sleep(Duration::from_secs(3));
    let s2 = assert_scrape_within(&daemon.addr, SCRAPE_LIMIT);
    assert_eq!(refused(&s2, attacker.uid, "processes"), 24.0);
    assert_eq!(refused(&s2, victim.uid, "processes"), 0.0);
    assert_eq!(
        with_pids(&s, "mpi_rank_info", &fakes.pids).len(),
        6,
        "the attacker's budget is 6 processes"
    );
    let log = daemon.log();
    let lines: Vec<&String> = log
        .iter()
        .filter(|l| l.contains(&format!("uid {} is at its budget", attacker.uid)))
        .collect();
    assert_eq!(lines.len(), 1, "one line for the refusals: {lines:?}");
    assert!(lines[0].contains("--user-max-processes"), "{}", lines[0]);
    job.go();
    victim_finish_and_check(&mut daemon, job, &labels, ITERS, SCRAPE_LIMIT);
    assert!(fakes.all_alive());
    let t = std::time::Instant::now();
    assert!(daemon.stop(signal::TERM).success());
    assert!(
        t.elapsed() < Duration::from_secs(20),
        "SIGTERM with 8 probed processes took {:?}",
        t.elapsed()
    );
    drop(fakes);
    assert_no_probes_left();
}

/// Attack 4: the daemon held to 256 open files (it cannot raise the limit:
/// no CAP_SYS_RESOURCE) and no per-user budget in the way, 70 fake
/// processes and 20 idle connections. The victim's ranks, attached first,
/// are never taken for exited, scrapes keep answering (descriptors are kept
/// for them), the attacker's excess is refused and counted, and the
/// victim's job ends exact.
#[test]
fn attack4_descriptor_exhaustion_never_declares_a_live_rank_exited() {
    let mpi = Mpi::OpenMpi;
    if !require(&[
        Need::Root,
        Need::Mpi(mpi),
        Need::Command("setpriv"),
        Need::Command("prlimit"),
    ]) {
        return;
    }
    const ITERS: u64 = 100;
    let dir = scratch("security-fds");
    let attacker = User::ensure(ATTACKER);
    let victim = User::ensure(VICTIM);
    let bin = fake_binary(&dir);
    let lib = attacker.libmpi_copy("lib");
    let mut daemon = Daemon::start_wrapped(
        &[
            "setpriv",
            "--inh-caps=-sys_resource",
            "--bounding-set=-sys_resource",
            "prlimit",
            "--nofile=256:256",
        ],
        // No per-user budget in the way: descriptors are what runs out.
        &[
            "--all".into(),
            "--user-max-processes".into(),
            "1000".into(),
            "--user-max-probes".into(),
            "10000000".into(),
            "--user-max-map-entries".into(),
            "10000000".into(),
        ],
    );
    let job = victim_job(mpi, &dir, &victim, ITERS);
    let labels = wait_attached(&mut daemon, &job.pids());
    let fakes = Fakes::spawn(&attacker, &bin, FakeMode::Map, &lib, 70);
    let idle: Vec<std::net::TcpStream> = (0..20)
        .map(|_| std::net::TcpStream::connect(&daemon.addr).expect("connect"))
        .collect();
    let s = wait_for(
        "the attacker's excess to be refused",
        Duration::from_secs(90),
        || {
            let s = assert_scrape_within(&daemon.addr, SCRAPE_LIMIT);
            let n =
                refused(&s, attacker.uid, "descriptors") + refused(&s, attacker.uid, "processes");
            let seen = with_pids(&s, "mpi_rank_info", &fakes.pids).len() as f64;
            (n > 0.0 && n + seen >= 70.0).then_some(s)
        },
    );
    assert!(
        refused(&s, attacker.uid, "descriptors") > 0.0,
        "256 descriptors cannot hold 70 probed processes"
    );
    // The victim's ranks run, and the daemon says so.
    for _ in 0..5 {
        let s = assert_scrape_within(&daemon.addr, SCRAPE_LIMIT);
        let up = with_pids(&s, "mpi_rank_info", &job.pids()).len();
        assert_eq!(up, 2, "the victim's ranks stay registered");
        for (jobid, rank) in &labels {
            assert_eq!(
                e2e::sum(&s, "mpi_rank_up", &[("jobid", jobid), ("rank", rank)]),
                1.0,
                "a live rank of the victim must stay up"
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        !daemon.log().iter().any(|l| job
            .pids()
            .iter()
            .any(|p| l.contains(&format!("pid {p} exited")))),
        "no live rank was taken for exited"
    );
    job.go();
    victim_finish_and_check(&mut daemon, job, &labels, ITERS, SCRAPE_LIMIT);
    drop(idle);
    drop(fakes);
    assert!(daemon.stop(signal::TERM).success());
}

/// Attack 12: ten 2-rank jobs of about half a second each, back to back,
/// under `--all`: every rank is found (as it starts, not at a scan a
/// second later), and every job's calls are exported, exact.
#[test]
fn attack12_short_jobs_are_each_found_and_exact() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi)]) {
        return;
    }
    const ITERS: u64 = 30;
    let dir = scratch("security-short");
    let victim = User::ensure(VICTIM);
    let bin = dir.join("short");
    e2e::compile(mpi, &e2e::program("attack/short.c"), &bin, &[]);
    let daemon = Daemon::start(&["--all".into()]);
    let mut pids = Vec::new();
    let t = std::time::Instant::now();
    for _ in 0..10 {
        let mut c = victim.launcher(mpi, 2);
        c.arg(&bin).arg(ITERS.to_string());
        let o = e2e::run_with_timeout(&mut c, Duration::from_secs(60));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "short job failed:\n{out}");
        let mine: Vec<u32> = out
            .lines()
            .filter_map(|l| {
                l.strip_prefix("PID ")?
                    .split_whitespace()
                    .nth(1)?
                    .parse()
                    .ok()
            })
            .collect();
        assert_eq!(mine.len(), 2, "{out}");
        pids.extend(mine);
    }
    let per_job = t.elapsed() / 10;
    let s = wait_for(
        "every short rank in the exposition",
        Duration::from_secs(20),
        || {
            let s = assert_scrape_within(&daemon.addr, SCRAPE_LIMIT);
            (with_pids(&s, "mpi_rank_info", &pids).len() == pids.len()).then_some(s)
        },
    );
    for info in with_pids(&s, "mpi_rank_info", &pids) {
        let (jobid, rank) = (info.label("jobid").unwrap(), info.label("rank").unwrap());
        assert_eq!(
            e2e::sum(
                &s,
                "mpi_calls_total",
                &[
                    ("jobid", jobid),
                    ("rank", rank),
                    ("function", "MPI_Barrier")
                ]
            ),
            ITERS as f64,
            "job {jobid} rank {rank} (jobs took {per_job:?} each)"
        );
    }
    assert!(
        e2e::sum(&s, "mpi_observer_exec_found_total", &[]) >= pids.len() as f64,
        "found through exec events"
    );
    assert!(daemon.stop(signal::TERM).success());
}

/// Bytes of one statistics-map entry (README, "Kernel memory"), which
/// `--map-memory` is divided by.
const STATS_ENTRY_BYTES: u64 = 376;

/// Attack 5: the kernel maps are shared by every user, so one user's
/// processes must not fill them. The daemon runs `--all --callsites` with a
/// statistics map of 1,536 entries. A process reserves one entry per
/// function it is attached with (about 340 for a real libmpi, 2 for the
/// stub), and a user may reserve half of each map. The attacker starts 6
/// fakes mapping a copy of the real libmpi (reserving what a rank does) and
/// 8 calling `MPI_Barrier` and `MPI_Send` of a stub libmpi from 64 sites
/// each, so that entries are really made: past half the map, its
/// processes are refused and counted under `map_entries`, and the victim's
/// 2-rank job, started while the attacker is at its budget, is attached
/// and exact, with no update of the statistics map failing.
#[test]
fn attack5_shared_maps_cannot_be_filled_by_one_user() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    const ITERS: u64 = 100;
    const MAPPERS: u32 = 6;
    const CALLERS: u32 = 8;
    const FAKES: u32 = MAPPERS + CALLERS;
    const STATS_ENTRIES: u64 = 1_536;
    let dir = scratch("security-maps");
    let attacker = User::ensure(ATTACKER);
    let victim = User::ensure(VICTIM);
    let bin = fake_binary(&dir);
    // Read as Open MPI: every function it has is probed.
    let stub = attacker.stub_libmpi("stub", true);
    let lib = attacker.libmpi_copy("lib");
    let mut daemon = Daemon::start(&[
        "--all".into(),
        "--callsites".into(),
        "--map-memory".into(),
        (STATS_ENTRIES * STATS_ENTRY_BYTES).to_string(),
    ]);
    let callers = Fakes::spawn(&attacker, &bin, FakeMode::Call(64), &stub, CALLERS);
    let mappers = Fakes::spawn(&attacker, &bin, FakeMode::Map, &lib, MAPPERS);
    let mut all = callers.pids.clone();
    all.extend(&mappers.pids);
    // Each attached caller makes 64 probed calls a millisecond. The CPU a
    // user burns is not the daemon's to bound; at the lowest priority the
    // fakes leave the 2 cores here to the daemon and the victim.
    for &pid in &callers.pids {
        // SAFETY: setpriority(2) on a pid, no memory passed.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS as _, pid, 19) };
        assert_eq!(rc, 0, "renice fake {pid}");
    }
    let all_refused = |s: &[e2e::Sample]| {
        e2e::sum(
            s,
            "mpi_observer_refused_processes_total",
            &[("uid", &attacker.uid.to_string())],
        )
    };
    let s = wait_for(
        "every fake of the attacker to be attached or refused",
        Duration::from_secs(60),
        || {
            let s = assert_scrape_within(&daemon.addr, SCRAPE_LIMIT);
            let attached = with_pids(&s, "mpi_rank_info", &all).len() as f64;
            (attached + all_refused(&s) >= f64::from(FAKES)).then_some(s)
        },
    );
    let attached: Vec<u32> = with_pids(&s, "mpi_rank_info", &all)
        .iter()
        .filter_map(|x| x.label("pid")?.parse().ok())
        .collect();
    eprintln!(
        "the attacker got {} of {FAKES} fakes attached",
        attached.len()
    );
    assert!(
        !attached.is_empty(),
        "the attacker's first fakes are probed"
    );
    let excess = f64::from(FAKES) - attached.len() as f64;
    assert!(excess > 0.0, "{FAKES} fakes are past half the maps");
    assert_eq!(
        refused(&s, attacker.uid, "map_entries"),
        excess,
        "the attacker's excess is refused for its map entries"
    );
    assert_eq!(all_refused(&s), excess, "each refused once, for one budget");
    // The attacker's pairs are in the statistics map before the victim
    // starts: each attached caller's calls are counted.
    let attached_callers: Vec<u32> = attached
        .iter()
        .copied()
        .filter(|p| callers.pids.contains(p))
        .collect();
    assert!(!attached_callers.is_empty(), "callers are attached first");
    let fake_labels = wait_attached(&mut daemon, &attached_callers);
    wait_for(
        "every attached fake's calls to be counted",
        Duration::from_secs(20),
        || {
            let s = assert_scrape_within(&daemon.addr, SCRAPE_LIMIT);
            fake_labels
                .iter()
                .all(|(jobid, rank)| {
                    e2e::sum(&s, "mpi_calls_total", &[("jobid", jobid), ("rank", rank)]) > 0.0
                })
                .then_some(())
        },
    );
    let log = daemon.log();
    let lines: Vec<&String> = log
        .iter()
        .filter(|l| l.contains(&format!("uid {} is at its budget", attacker.uid)))
        .collect();
    assert!(!lines.is_empty(), "a line says the attacker was refused");
    assert!(lines[0].contains("--user-max-map-entries"), "{}", lines[0]);

    let job = victim_job(mpi, &dir, &victim, ITERS);
    let labels = wait_attached(&mut daemon, &job.pids());
    job.go();
    victim_finish_and_check(&mut daemon, job, &labels, ITERS, SCRAPE_LIMIT);
    let s = assert_scrape_within(&daemon.addr, SCRAPE_LIMIT);
    assert_eq!(
        e2e::sum(
            &s,
            "mpi_observer_map_update_failures_total",
            &[("map", "stats")]
        ),
        0.0,
        "no call of anyone's was lost to a full statistics map"
    );
    assert_eq!(all_refused(&s), excess, "refusals counted once");
    assert_eq!(
        e2e::sum(
            &s,
            "mpi_observer_refused_processes_total",
            &[("uid", &victim.uid.to_string())]
        ),
        0.0,
        "the victim is never refused"
    );
    assert!(
        callers.all_alive() && mappers.all_alive(),
        "the fakes must be untouched"
    );
    drop((callers, mappers));
    assert!(daemon.stop(signal::TERM).success());
    assert_no_probes_left();
}

/// Compiles attack/knock.c, a program that is not MPI and knocks at the
/// exit handover as a shim rank does at exit.
fn knocker(dir: &std::path::Path) -> std::path::PathBuf {
    let out = dir.join("knock");
    let o = std::process::Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&out)
        .arg(e2e::program("attack/knock.c"))
        .output()
        .expect("running cc");
    assert!(
        o.status.success(),
        "cc attack/knock.c failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// Runs `cmd` (the knocker) to its end; its line: answered, closed,
/// timeout.
fn knocks_ended(cmd: &mut std::process::Command) -> [u32; 3] {
    let o = e2e::run_with_timeout(cmd, Duration::from_secs(120));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "knocker failed: {out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let n: Vec<u32> = out
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    n.try_into()
        .unwrap_or_else(|_| panic!("knocker's line: {out:?}"))
}

/// The exit handover under attack: a user's process that is not MPI
/// knocks again and again; the daemon looks at it once at most (the scan
/// or the first knock) and closes every other knock at once as not_mpi,
/// counting no attach failure. A setuid-like process (real uid the
/// attacker's, effective, saved and fs uid root's: SO_PEERCRED says root)
/// is refused every time as uid_mismatch, never held nor attached.
#[test]
fn knocks_of_a_process_not_mpi_cost_one_look_and_mixed_uids_are_refused() {
    if !require(&[Need::Root, Need::Command("cc"), Need::Command("setpriv")]) {
        return;
    }
    const KNOCKS: u32 = 40;
    let dir = scratch("security-knocks");
    let attacker = User::ensure(ATTACKER);
    let bin = knocker(&dir);
    let socket = dir.join("handover.sock");
    let mut daemon = Daemon::start(&[
        "--all".into(),
        "--no-bpf".into(),
        "--handover-socket".into(),
        socket.to_str().unwrap().into(),
    ]);
    wait_for("the handover socket", Duration::from_secs(10), || {
        socket.exists().then_some(())
    });

    let ended = knocks_ended(attacker.command(&bin).arg(&socket).arg(KNOCKS.to_string()));
    assert_eq!(
        ended,
        [0, KNOCKS, 0],
        "every knock closed unanswered, none left waiting"
    );
    let mut mixed = std::process::Command::new("setpriv");
    mixed
        .args(["--ruid", &attacker.uid.to_string()])
        .arg(&bin)
        .arg(&socket)
        .arg(KNOCKS.to_string());
    assert_eq!(knocks_ended(&mut mixed), [0, KNOCKS, 0]);

    let (_, s) = daemon.scrape();
    let knocks = |r: &str| e2e::sum(&s, "mpi_observer_exit_handovers_total", &[("result", r)]);
    let looked = knocks("not_observed");
    assert!(
        looked <= 1.0,
        "a process that is not MPI is looked at once at most, not {looked} times"
    );
    assert_eq!(knocks("not_mpi") + looked, f64::from(KNOCKS));
    assert_eq!(knocks("uid_mismatch"), f64::from(KNOCKS));
    assert_eq!(
        knocks("held") + knocks("no_segment") + knocks("refused"),
        0.0
    );
    assert_eq!(
        e2e::sum(&s, "mpi_observer_attach_failures_total", &[]),
        0.0,
        "a knocker that is not MPI is no attach failure"
    );
    assert_eq!(e2e::sum(&s, "mpi_observer_attached_processes", &[]), 0.0);
    assert!(daemon.stop(signal::TERM).success());
}

/// The exit handover under a flood of mute connections: the attacker
/// keeps 200 connections to the handover socket open without a word,
/// connecting again as soon as the daemon closes one, while the victim's
/// short shim jobs finalize (three 2-rank MPICH jobs at once, three times).
/// The knock thread waits on no connection (docs/security.md, "The
/// handover socket"): every one of the victim's knocks is held, none
/// stale, and every rank is exact.
#[test]
fn mute_connections_delay_no_other_users_knock() {
    let mpi = Mpi::Mpich;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("cc")]) {
        return;
    }
    const ROUNDS: usize = 3;
    const AT_ONCE: usize = 3;
    const NP: usize = 2;
    let dir = scratch("security-mute");
    let attacker = User::ensure(ATTACKER);
    let victim = User::ensure(VICTIM);
    let mute = dir.join("mute");
    let o = std::process::Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&mute)
        .arg(e2e::program("attack/mute.c"))
        .output()
        .expect("running cc");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let exe = dir.join("allreduce");
    e2e::compile(mpi, &e2e::program("handover/allreduce.c"), &exe, &[]);
    let socket = dir.join("handover.sock");
    let mut daemon = Daemon::start(&[
        "--all".into(),
        "--no-bpf".into(),
        "--retain-exited".into(),
        "3600".into(),
        "--handover-socket".into(),
        socket.to_str().unwrap().into(),
    ]);
    wait_for("the handover socket", Duration::from_secs(10), || {
        socket.exists().then_some(())
    });
    let knocks = |s: &[e2e::Sample], r: &str| {
        e2e::sum(s, "mpi_observer_exit_handovers_total", &[("result", r)])
    };
    /// Killed when the test ends, however it ends.
    struct Flood(std::process::Child);
    impl Drop for Flood {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut flood = Flood(
        attacker
            .command(&mute)
            .arg(&socket)
            .args(["200", "600000"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start the mute connections"),
    );
    // The flood is on: mute connections are being closed at their deadline.
    wait_for("the mute connections", Duration::from_secs(10), || {
        (knocks(&daemon.scrape().1, "malformed") >= 400.0).then_some(())
    });

    let mut jobids = Vec::new();
    for round in 0..ROUNDS {
        let jobs: Vec<(String, std::process::Child)> = (0..AT_ONCE)
            .map(|j| {
                let id = format!("mute-{round}-{j}");
                let mut c = e2e::shim_launcher(mpi, NP as u32, "stats");
                victim.apply(&mut c);
                c.args(["-genv", "SLURM_JOB_ID", &id])
                    .args(["-genv", "MPI_OBSERVER_HANDOVER_SOCKET"])
                    .arg(&socket)
                    .arg(&exe)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped());
                jobids.push(id.clone());
                (id, c.spawn().expect("start a job"))
            })
            .collect();
        for (id, c) in jobs {
            let o = e2e::wait_with_timeout(c, Duration::from_secs(60));
            assert!(
                o.status.success(),
                "job {id} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
    }
    assert!(
        flood.0.try_wait().unwrap().is_none(),
        "the flood lasted the whole test"
    );
    let s = daemon.final_scrape();
    drop(flood);
    let ranks = (ROUNDS * AT_ONCE * NP) as f64;
    let (held, stale, malformed) = (
        knocks(&s, "held"),
        knocks(&s, "stale"),
        knocks(&s, "malformed"),
    );
    eprintln!("mute: held {held} stale {stale} malformed {malformed}");
    assert_eq!(stale, 0.0, "no knock of the victim's went stale");
    assert_eq!(held, ranks, "every knock of the victim's held");
    for id in &jobids {
        for r in 0..NP {
            assert_eq!(
                e2e::sum(
                    &s,
                    "mpi_calls_total",
                    &[
                        ("jobid", id),
                        ("rank", &r.to_string()),
                        ("function", "MPI_Allreduce")
                    ]
                ),
                25.0,
                "job {id} rank {r}"
            );
        }
    }
    assert!(daemon.stop(signal::TERM).success());
}
