//! The attach mechanisms (issue 35): what the daemon found the kernel to
//! do and chose, classic uprobes probing a library file once for every
//! rank under `--all`, what such probes mean for a process that maps the
//! library but is not observed, a node with no usable eBPF, and no probe
//! left in a job's memory after `kill -9` of the daemon.
//!
//! These run in the suite on the host as they are (the kernel's own
//! choice), again on the host with the classic fallback forced
//! (`MPI_OBSERVER_ATTACH_MECHANISM` in the environment, which every daemon
//! the tests start inherits), and in the VMs of other kernels (`cargo
//! xtask test`, docs/vm.md). `E2E_EXPECT_MECHANISM` then names the
//! mechanism the run must have used, so a forced or VM run that silently
//! fell back to another one fails.

use std::{collections::HashSet, path::Path, process::Command, time::Duration};

use e2e::{
    Daemon, Job, Mpi, Need, Sample, assert_no_probes_left, attack::User, breakpoints_left, compile,
    observer_bin, program, require, run_with_timeout, scratch, signal, sum, wait_for,
};

const NP: u32 = 2;
/// Ranks of tests/programs/mix.c, which needs three (rank 2 is a peer).
const MIX_NP: u32 = 3;
const ITERS: u64 = 40;

/// The mechanisms the daemon may report.
const MECHANISMS: [&str; 4] = ["uprobe_multi", "perf_link", "perf_ioctl", "none"];

fn start_mix(mpi: Mpi, dir: &Path, iters: u64) -> Job {
    let exe = dir.join(format!("mix-{}", mpi.name()));
    if !exe.exists() {
        compile(mpi, &program("mix.c"), &exe, &[]);
    }
    let mut launcher = mpi.launcher(MIX_NP);
    launcher.arg(&exe).arg(iters.to_string());
    let go = dir.join(format!("go-{}-{}", std::process::id(), iters));
    Job::spawn(launcher, MIX_NP, go)
}

/// The labels of `mpi_observer_kernel_info`.
fn kernel_info(s: &[Sample]) -> &Sample {
    let info: Vec<&Sample> = s
        .iter()
        .filter(|x| x.name == "mpi_observer_kernel_info")
        .collect();
    assert_eq!(info.len(), 1, "one mpi_observer_kernel_info series");
    assert_eq!(info[0].value, 1.0);
    info[0]
}

/// The mechanism this run must use, if the run says (xtask sets it for
/// the forced and the VM runs).
fn expected_mechanism() -> Option<String> {
    std::env::var("E2E_EXPECT_MECHANISM").ok()
}

fn jobid_of(s: &[Sample], pid: u32) -> Option<String> {
    s.iter()
        .find(|x| x.name == "mpi_rank_info" && x.label("pid") == Some(&pid.to_string()))
        .and_then(|x| x.label("jobid").map(str::to_string))
}

/// The daemon's open perf events and BPF links, from its fd table.
fn perf_and_link_fds(pid: u32) -> (usize, usize) {
    let (mut perf, mut links) = (0, 0);
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let Ok(t) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = t.to_string_lossy();
        perf += usize::from(t == "anon_inode:[perf_event]");
        links += usize::from(t == "anon_inode:bpf_link");
    }
    (perf, links)
}

/// The daemon says in one line which mechanism it chose and why, exports
/// it with every feature it probed, and it is the one this run expects.
#[test]
fn the_mechanism_is_said_exported_and_the_expected_one() {
    if !require(&[Need::Root]) {
        return;
    }
    let mut daemon = Daemon::start(&["--all".into()]);
    let (_, s) = daemon.scrape();
    let info = kernel_info(&s);
    let mechanism = info.label("mechanism").unwrap().to_string();
    assert!(MECHANISMS.contains(&mechanism.as_str()), "{mechanism}");
    assert_ne!(mechanism, "none", "CI's kernels all have a mechanism");
    for feature in [
        "uprobe_multi",
        "perf_link",
        "attach_cookie",
        "ringbuf",
        "ns_pid",
        "btf",
    ] {
        let v = info.label(feature).unwrap();
        assert!(
            ["yes", "no", "main_thread_only"].contains(&v),
            "{feature}={v}: every feature is probed"
        );
    }
    if let Some(want) = expected_mechanism() {
        assert_eq!(mechanism, want, "the mechanism this run must use");
    }
    let log = daemon.log();
    let lines: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("attaching with"))
        .collect();
    assert_eq!(lines.len(), 1, "one line on the mechanism: {log:?}");
    assert!(
        lines[0].contains("this kernel: uprobe_multi="),
        "{}",
        lines[0]
    );
    assert!(daemon.stop(signal::TERM).success());
}

/// Under `--all`, two jobs of one library at once: on classic uprobes the
/// library file is probed once for all six ranks (the daemon holds one
/// perf event per site, not one per site and rank), on uprobe_multi each
/// rank has its own links; either way both jobs are exact, and every
/// probe is gone after SIGTERM, from the kernel and from the ranks'
/// memory.
#[test]
fn all_probes_a_library_file_once_and_both_jobs_are_exact() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    let dir = scratch("kernels-per-file");
    let mut daemon = Daemon::start(&["--all".into(), "--retain-exited".into(), "300".into()]);
    // What the daemon holds before any rank: the exec tracepoint's link.
    let (perf0, links0) = perf_and_link_fds(daemon.pid());
    let a = start_mix(mpi, &dir, ITERS);
    let b = start_mix(mpi, &dir, ITERS);
    let pids: Vec<u32> = a.pids().into_iter().chain(b.pids()).collect();
    let s = wait_for(
        "--all to attach the six ranks",
        Duration::from_secs(30),
        || {
            let (_, s) = daemon.scrape();
            pids.iter().all(|p| jobid_of(&s, *p).is_some()).then_some(s)
        },
    );
    let mechanism = kernel_info(&s).label("mechanism").unwrap().to_string();
    let (perf, links) = perf_and_link_fds(daemon.pid());
    let (perf, links) = (perf - perf0, links - links0);
    // Sites of one rank: what `mpi_observer_probes` says of each rank.
    let per_rank = sum(&s, "mpi_observer_probes", &[]) as usize / pids.len();
    assert!(per_rank > 100, "about 350 sites per rank: {per_rank}");
    match mechanism.as_str() {
        "perf_link" => {
            assert_eq!(
                links, per_rank,
                "one link per site of the file, not per rank"
            );
        }
        "perf_ioctl" => {
            assert_eq!(
                perf, per_rank,
                "one perf event per site of the file, not per rank"
            );
        }
        "uprobe_multi" => {
            // Return probes and three entry programs per rank, at most.
            assert!(
                links >= pids.len() && links <= 4 * pids.len(),
                "uprobe_multi links per rank: {links} for {} ranks",
                pids.len()
            );
            assert_eq!(perf, 0);
        }
        other => panic!("mechanism {other}"),
    }
    let (ja, jb) = (
        jobid_of(&s, a.pids()[0]).unwrap(),
        jobid_of(&s, b.pids()[0]).unwrap(),
    );
    assert_ne!(ja, jb);
    e2e::wait_datatypes(&mut daemon);
    a.finish("OK ");
    b.finish("OK ");
    let s = wait_for("the exits", Duration::from_secs(20), || {
        let (_, s) = daemon.scrape();
        (sum(&s, "mpi_rank_up", &[]) == 0.0).then_some(s)
    });
    e2e::check_mix_exact_found_at_exec(&s, mpi, &ja, MIX_NP, ITERS);
    e2e::check_mix_exact_found_at_exec(&s, mpi, &jb, MIX_NP, ITERS);
    assert!(daemon.stop(signal::TERM).success());
    assert_no_probes_left();
}

/// A rank found while the dynamic loader maps its MPI library (the file
/// mapped read-only, its code not yet: the loader's first step) is looked
/// at again and attached once its code is mapped, not refused for ever.
/// With functions told by address (classic uprobes attached by ioctl,
/// forced here; perf links on a kernel without attach cookies are the
/// same), such a rank was refused as "not mapped as one executable
/// segment": a CI run caught one of six ranks so. `loading/loader.c` holds
/// the window open for 3 s, past the exec watcher's last look (1.5 s) and
/// two scans, then loads MPI; every barrier after the attach is counted.
#[test]
fn a_rank_caught_while_its_library_loads_is_attached_once_loaded() {
    use std::io::BufRead as _;
    let mpi = Mpi::Mpich;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("cc")]) {
        return;
    }
    let dir = scratch("kernels-loading");
    let plugin = dir.join("libloading-plugin.so");
    compile(
        mpi,
        &program("loading/plugin.c"),
        &plugin,
        &["-shared", "-fPIC"],
    );
    let loader = dir.join("loader");
    let o = Command::new("cc")
        .arg("-o")
        .arg(&loader)
        .arg(program("loading/loader.c"))
        .arg("-ldl")
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    // The MPI library the plugin links, as the loader will find it.
    let ldd = Command::new("ldd").arg(&plugin).output().unwrap();
    let ldd = String::from_utf8_lossy(&ldd.stdout).into_owned();
    let lib = ldd
        .lines()
        .filter(|l| l.contains("libmpi"))
        .find_map(|l| l.split("=> ").nth(1)?.split(" (").next())
        .unwrap_or_else(|| panic!("no MPI library in ldd {plugin:?}: {ldd}"))
        .to_string();
    let mut daemon = Daemon::start_wrapped(
        &["env", "MPI_OBSERVER_ATTACH_MECHANISM=perf_ioctl"],
        &[
            "--all".into(),
            "--functions".into(),
            "MPI_Barrier".into(),
            "--retain-exited".into(),
            "300".into(),
        ],
    );
    let mut child = Command::new(&loader)
        .arg(&plugin)
        .arg(&lib)
        .arg(&dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut expect_line = |want: &str| {
        let l = out.next().unwrap().unwrap();
        assert_eq!(l, want, "the loader's output");
    };
    expect_line("MAPPED");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mine: Vec<&str> = maps.lines().filter(|l| l.contains("libmpi")).collect();
    assert!(
        !mine.is_empty() && mine.iter().all(|l| !l.contains("xp ")),
        "the library mapped, its code not: {mine:?}"
    );
    std::thread::sleep(Duration::from_secs(3));
    let said = |daemon: &Daemon, what: &str| {
        daemon
            .log()
            .iter()
            .any(|l| l.contains(&format!("pid {pid}")) && l.contains(what))
    };
    assert!(
        !said(&daemon, "cannot attach"),
        "refused while its library loads: {:?}",
        daemon.log()
    );
    std::fs::write(dir.join("mapped-go"), "").unwrap();
    expect_line("INIT");
    wait_for(
        "the daemon to attach the loaded rank",
        Duration::from_secs(30),
        || said(&daemon, "attached to pid").then_some(()),
    );
    std::fs::write(dir.join("init-go"), "").unwrap();
    expect_line("OK");
    assert!(child.wait().unwrap().success());
    let s = wait_for("its exit", Duration::from_secs(20), || {
        let (_, s) = daemon.scrape();
        (sum(&s, "mpi_rank_up", &[]) == 0.0).then_some(s)
    });
    let jobid = jobid_of(&s, pid).expect("the rank was observed");
    let (_, s) = daemon.scrape();
    assert_eq!(
        sum(
            &s,
            "mpi_calls_total",
            &[("jobid", &jobid), ("function", "MPI_Barrier")]
        ),
        7.0,
        "every barrier after the attach"
    );
    assert_eq!(
        sum(&s, "mpi_observer_attach_failures_total", &[]),
        0.0,
        "no failure"
    );
    assert!(daemon.stop(signal::TERM).success());
    assert_no_probes_left();
}

/// A process that maps a probed library but is not observed (over its
/// user's budget here; another namespace's would be the same): under
/// per-file classic probes its calls trap into the programs, which leave
/// it at their first lookup. It is not counted anywhere, not even in the
/// kernel's map, and its job ends with correct results.
#[test]
fn a_process_refused_by_a_budget_is_unharmed_and_not_counted() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    let dir = scratch("kernels-refused");
    let user = User::ensure("mpiobs-kern");
    let mut daemon = Daemon::start(&["--all".into(), "--user-max-processes".into(), "1".into()]);
    // Polling while it waits: the observed rank has figures while both
    // ranks still run. Read after the job, they were a race: the daemon
    // frees an exited rank's entries once it has kept its final figures,
    // and in the test VMs it did so before bpftool ran.
    let job = e2e::attack::victim_job_with(mpi, &dir, &user, 200, &[("VICTIM_POLL", "1")]);
    let pids = job.pids();
    let (observed, refused) = wait_for(
        "one rank attached and one refused",
        Duration::from_secs(30),
        || {
            let (_, s) = daemon.scrape();
            let r = sum(
                &s,
                "mpi_observer_refused_processes_total",
                &[("uid", &user.uid.to_string())],
            );
            let seen: Vec<u32> = pids
                .iter()
                .copied()
                .filter(|p| jobid_of(&s, *p).is_some())
                .collect();
            (r == 1.0 && seen.len() == 1).then(|| {
                let other = *pids.iter().find(|p| **p != seen[0]).unwrap();
                (seen[0], other)
            })
        },
    );
    // Nothing in the kernel's statistics under the refused process, while
    // the observed one's polls are there.
    let tgids = wait_for(
        "the observed rank's entries in MPI_STATS",
        Duration::from_secs(30),
        || {
            let t = stats_tgids();
            t.contains(&u64::from(observed)).then_some(t)
        },
    );
    assert!(
        !tgids.contains(&u64::from(refused)),
        "the refused rank {refused} has none: {tgids:?}"
    );
    job.go();
    job.finish("OK ");
    assert!(daemon.stop(signal::TERM).success());
    assert_no_probes_left();
}

/// The processes (tgids) with entries in the probes' statistics map, as
/// `bpftool` dumps it.
fn stats_tgids() -> HashSet<u64> {
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "name", "MPI_STATS"])
        .output()
        .unwrap();
    assert!(out.status.success(), "bpftool map dump MPI_STATS");
    let dump: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    dump.as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            e["formatted"]["key"]["tgid"].as_u64().or_else(|| {
                // Without BTF, keys come as bytes: the tgid is the first four.
                let k = e["key"].as_array()?;
                let b: Vec<u8> = k
                    .iter()
                    .take(4)
                    .filter_map(|x| {
                        u8::from_str_radix(x.as_str()?.trim_start_matches("0x"), 16).ok()
                    })
                    .collect();
                (b.len() == 4).then(|| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            })
        })
        .collect()
}

/// No usable eBPF (forced here; a kernel without BPF or uprobes behaves
/// the same): `--pid` exits with one line naming the alternatives; `--all`
/// says so in one line and serves a shim job's exact figures, as `--no-bpf`
/// does.
#[test]
fn without_usable_ebpf_pid_names_the_alternatives_and_all_serves_the_shim() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch("kernels-none");
    let exe = dir.join("victim");
    compile(mpi, &program("attack/victim.c"), &exe, &[]);
    let mut launcher = e2e::shim_launcher(mpi, NP, "stats");
    launcher.arg(&exe).arg("30");
    let job = Job::spawn(launcher, NP, dir.join("go"));
    let mut pid = Command::new(observer_bin());
    pid.env("MPI_OBSERVER_ATTACH_MECHANISM", "none").args([
        "attach",
        "--pid",
        &job.pid(0).to_string(),
    ]);
    let o = run_with_timeout(&mut pid, Duration::from_secs(30));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    for needle in [
        "mpi-observer run",
        "srun --mpi-observer",
        "MPI_OBSERVER_ATTACH_MECHANISM=none",
    ] {
        assert!(lines[0].contains(needle), "{needle} in: {}", lines[0]);
    }
    let mut daemon = Daemon::start_wrapped(
        &["env", "MPI_OBSERVER_ATTACH_MECHANISM=none"],
        &["--all".into()],
    );
    let log = daemon.log();
    assert_eq!(
        log.iter().filter(|l| l.contains("no usable eBPF")).count(),
        1,
        "{log:?}"
    );
    let (_, s) = daemon.scrape();
    assert_eq!(kernel_info(&s).label("mechanism"), Some("none"));
    job.go();
    job.finish("OK ");
    let s = wait_for("the shim's final figures", Duration::from_secs(20), || {
        let (_, s) = daemon.scrape();
        let calls = sum(&s, "mpi_calls_total", &[("function", "MPI_Allreduce")]);
        (calls == 60.0).then_some(s)
    });
    assert_eq!(
        sum(&s, "mpi_calls_total", &[("function", "MPI_Barrier")]),
        60.0
    );
    assert_eq!(sum(&s, "mpi_observer_probes", &[]), 0.0);
    assert!(daemon.stop(signal::TERM).success());
}

/// `kill -9` of the daemon mid-job: the job finishes correctly, and no
/// breakpoint is left in either rank's copy of the library, whatever the
/// mechanism (the kernel removes a perf event's probe when the daemon's
/// fds close, a link's likewise).
#[test]
fn kill_9_leaves_no_breakpoint_in_the_ranks() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    let dir = scratch("kernels-kill9");
    // steady.c holds after its calls until `stop`: its ranks live on after
    // the daemon's kill, for their memory to be read.
    let exe = dir.join("steady");
    if !exe.exists() {
        compile(mpi, &program("cluster/steady.c"), &exe, &[]);
    }
    let mut launcher = mpi.launcher(NP);
    launcher.arg(&exe).arg("200");
    let job = Job::spawn_held(launcher, NP, dir.join("go"), dir.join("stop"));
    let mut daemon = Daemon::start(&job.pid_args());
    let pids = job.pids();
    let probed: Vec<String> = breakpoints_left(pids[0]);
    assert!(
        probed.len() > 100,
        "the probes are breakpoints in the rank's memory: {}",
        probed.len()
    );
    job.go();
    wait_for("calls to be counted", Duration::from_secs(30), || {
        let (_, s) = daemon.scrape();
        (sum(&s, "mpi_calls_total", &[("function", "MPI_Allreduce")]) > 10.0).then_some(())
    });
    assert!(!daemon.stop(signal::KILL).success());
    assert_no_probes_left();
    for pid in &pids {
        let left = wait_for("the breakpoints to go", Duration::from_secs(120), || {
            let l = breakpoints_left(*pid);
            l.is_empty().then_some(l)
        });
        assert!(left.is_empty());
    }
    job.finish("OK ");
}
