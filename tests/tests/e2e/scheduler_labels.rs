//! End-to-end test of the scheduler's labels (issue 26): real MPI jobs
//! whose ranks carry the variables Slurm, PBS and Flux give a job's tasks,
//! put there by the launcher (`mpirun -x`, `mpiexec -genv`) as a scheduler
//! would, under a real daemon. One `mpi_job_scheduler_info` series per job
//! and node, its values made safe, the other series joined to it by a real
//! Prometheus on `(instance, jobid, uid)`, and the report's header.
//!
//! No Slurm here: the Slurm cluster test of issue 26 runs the real one.

use std::{process::Command, time::Duration};

use e2e::{
    Daemon, Job, Mpi, Need, Prometheus, Sample, assert_no_probes_left, compile, observer_bin,
    program, promtool_check, require, run_with_timeout, scratch, signal, sum, wait_for,
};

/// MPI_Barrier (and MPI_Allreduce) calls of each rank.
const ITERS: u64 = 150;
/// The Slurm job, and the array it is a task of.
const SLURM_JOB: &str = "777";
/// A Flux job's id (F58, as Flux prints it) started inside the Slurm
/// allocation: its tasks inherit `SLURM_JOB_ID`, which is not theirs.
const FLUX_JOB: &str = "ƒ2b7NpJ3";
/// A Torque array task's job id.
const PBS_JOB: &str = "1234[5].pbs01";

/// `launcher` with `vars` set in every rank's environment through the
/// launcher's own option (the launcher itself does not see them, so it
/// takes no allocation for its own).
fn with_vars(mpi: Mpi, np: u32, vars: &[(&str, &str)]) -> Command {
    let mut c = mpi.launcher(np);
    for (k, v) in vars {
        if mpi.is_open_mpi() {
            c.args(["-x", &format!("{k}={v}")]);
        } else {
            c.args(["-genv", k, v]);
        }
    }
    c
}

fn info<'a>(s: &'a [Sample], jobid: &str) -> Vec<&'a Sample> {
    s.iter()
        .filter(|x| x.name == "mpi_job_scheduler_info" && x.label("jobid") == Some(jobid))
        .collect()
}

/// The facts of `sample` in exposition order, without jobid and uid.
fn facts(sample: &Sample) -> Vec<(&str, &str)> {
    sample
        .labels
        .iter()
        .filter(|(k, _)| k != "jobid" && k != "uid")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

#[test]
fn scheduler_facts_are_one_info_series_per_job_joined_on_jobid() {
    if !require(&[
        Need::Root,
        Need::Mpi(Mpi::OpenMpi),
        Need::Mpi(Mpi::Mpich),
        Need::Command("bpftool"),
        Need::Command("promtool"),
        Need::Command("prometheus"),
    ]) {
        return;
    }
    let dir = scratch("scheduler-labels");
    let exe = |mpi: Mpi| {
        let exe = dir.join(format!("claim-{}", mpi.name()));
        compile(mpi, &program("identity/claim.c"), &exe, &[]);
        exe
    };
    let (ompi, mpich) = (exe(Mpi::OpenMpi), exe(Mpi::Mpich));
    let go = |n: &str| dir.join(format!("go-{n}"));
    let iters = ITERS.to_string();

    // Slurm, step 1 of a task of array 776, through Open MPI. The account
    // holds a tab (a control character), the partition 200 bytes: both
    // made safe. Rank 1 lacks the step, as ranks mpirun starts itself in a
    // batch script do: the ranks disagree, counted; rank 0's facts stand.
    let long_partition = "p".repeat(200);
    let mut c = with_vars(
        Mpi::OpenMpi,
        2,
        &[
            ("SLURM_JOB_ID", SLURM_JOB),
            ("SLURM_STEP_ID", "1"),
            ("SLURM_JOB_USER", "alice"),
            ("SLURM_JOB_ACCOUNT", "phys\tics"),
            ("SLURM_JOB_PARTITION", &long_partition),
            ("SLURM_ARRAY_JOB_ID", "776"),
            ("SLURM_ARRAY_TASK_ID", "3"),
        ],
    );
    c.args([
        "sh",
        "-c",
        "[ \"$OMPI_COMM_WORLD_RANK\" = 1 ] && unset SLURM_STEP_ID; exec \"$0\" \"$@\"",
    ])
    .arg(&ompi)
    .arg(&iters);
    let slurm = Job::spawn(c, 2, go("slurm"));

    // Flux inside that Slurm allocation: the Flux job names the job.
    let mut c = with_vars(
        Mpi::OpenMpi,
        1,
        &[
            ("FLUX_JOB_ID", FLUX_JOB),
            ("SLURM_JOB_ID", SLURM_JOB),
            ("SLURM_JOB_PARTITION", "debug"),
        ],
    );
    c.arg(&ompi).arg(&iters);
    let flux = Job::spawn(c, 1, go("flux"));

    // A Torque array task through MPICH: its queue is the partition; no
    // account, no step.
    let mut c = with_vars(
        Mpi::Mpich,
        2,
        &[
            ("PBS_JOBID", PBS_JOB),
            ("PBS_QUEUE", "workq"),
            ("PBS_O_LOGNAME", "bob"),
            ("PBS_ARRAYID", "5"),
        ],
    );
    c.arg(&mpich).arg(&iters);
    let pbs = Job::spawn(c, 2, go("pbs"));

    let jobs = [&slurm, &flux, &pbs];
    let pids: Vec<String> = jobs.iter().flat_map(|j| j.pid_args()).collect();
    // As a site runs it: the bounded /metrics.
    let mut daemon = Daemon::start_bounded(&pids);
    let (_, s) = daemon.scrape();
    assert_eq!(sum(&s, "mpi_observer_attached_processes", &[]), 5.0);
    for j in jobs {
        j.go();
    }
    for j in [slurm, flux, pbs] {
        j.finish("OK ");
    }
    daemon.final_scrape();
    let (body, s) = daemon.scrape();
    assert_eq!(sum(&s, "mpi_rank_up", &[]), 0.0);
    promtool_check(&body);

    // One series per job and node, and nothing else carries the facts.
    let cut_partition = &long_partition[..128];
    let want: [(&str, [(&str, &str); 7]); 3] = [
        (
            SLURM_JOB,
            [
                ("scheduler", "slurm"),
                ("step", "1"),
                ("user", "alice"),
                ("account", "phys\u{FFFD}ics"),
                ("partition", cut_partition),
                ("array_job", "776"),
                ("array_task", "3"),
            ],
        ),
        (
            FLUX_JOB,
            [
                ("scheduler", "flux"),
                ("step", ""),
                ("user", ""),
                ("account", ""),
                ("partition", ""),
                ("array_job", ""),
                ("array_task", ""),
            ],
        ),
        (
            PBS_JOB,
            [
                ("scheduler", "pbs"),
                ("step", ""),
                ("user", "bob"),
                ("account", ""),
                ("partition", "workq"),
                ("array_job", ""),
                ("array_task", "5"),
            ],
        ),
    ];
    assert_eq!(
        s.iter()
            .filter(|x| x.name == "mpi_job_scheduler_info")
            .count(),
        3,
        "{body}"
    );
    for (jobid, facts_want) in &want {
        let i = info(&s, jobid);
        assert_eq!(i.len(), 1, "one info series of job {jobid}:\n{body}");
        assert_eq!(i[0].label("uid"), Some("0"));
        assert_eq!(i[0].value, 1.0);
        assert_eq!(facts(i[0]), facts_want, "job {jobid}");
        // The join key is the other series': every rank of the job and its
        // sums carry the same (jobid, uid), and the figures are exact.
        let ranks = if *jobid == FLUX_JOB { 1 } else { 2 };
        let key = [("jobid", *jobid), ("uid", "0")];
        assert_eq!(sum(&s, "mpi_rank_info", &key), ranks as f64, "{jobid}");
        assert_eq!(
            sum(
                &s,
                "mpi_job_calls_total",
                &[key[0], key[1], ("function", "MPI_Barrier")]
            ) as u64,
            ranks * ITERS,
            "{jobid}"
        );
    }
    for x in s.iter().filter(|x| x.name != "mpi_job_scheduler_info") {
        for l in ["partition", "account", "step", "array_task"] {
            assert!(x.label(l).is_none(), "{} carries {l}", x.name);
        }
    }
    let count = |name: &str, want: &[(&str, &str)]| sum(&s, name, want);
    assert_eq!(
        count(
            "mpi_observer_scheduler_conflicts_total",
            &[("reason", "ranks")]
        ),
        1.0
    );
    assert_eq!(
        count(
            "mpi_observer_scheduler_conflicts_total",
            &[("reason", "cgroup")]
        ),
        0.0
    );
    // Both Slurm ranks had their partition cut.
    assert_eq!(
        count(
            "mpi_observer_label_truncations_total",
            &[("label", "scheduler")]
        ),
        2.0
    );

    // The report's header names the job's scheduler facts.
    let out = run_with_timeout(
        Command::new(observer_bin()).args([
            "report",
            "--url",
            &format!("http://{}", daemon.addr),
            "--job",
            PBS_JOB,
        ]),
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "report: {text}");
    assert!(
        text.contains("\nScheduler: pbs job 1234[5].pbs01, user bob, partition workq, task 5\n"),
        "{text}"
    );

    // A real Prometheus joins the job's series to its facts: per node on
    // (instance, jobid, uid), with no many-to-many error, exact sums.
    let prom_dir = dir.join("prometheus");
    std::fs::create_dir_all(&prom_dir).unwrap();
    let prom = Prometheus::start(&prom_dir, &[&daemon.addr]);
    let join = |partition_match: &str, want: u64| {
        prom.wait_query(
            &format!(
                "sum by (scheduler, partition) (mpi_job_calls_total{{function=\"MPI_Barrier\"}} \
                 * on(instance, jobid, uid) group_left(scheduler, partition) \
                 mpi_job_scheduler_info{{{partition_match}}}) == {want}"
            ),
            Duration::from_secs(60),
        );
    };
    join(&format!("partition=\"{cut_partition}\""), 2 * ITERS);
    join("partition=\"workq\"", 2 * ITERS);
    join("scheduler=\"flux\"", ITERS);
    drop(prom);

    let status = daemon.stop(signal::TERM);
    assert!(status.success(), "daemon exit on TERM: {status}");
    assert_no_probes_left();
}

/// A batch job's two `srun` steps on one node: step 1's ranks arrive while
/// step 0's are retained, get `rank="R#step1"` (not `#pidPID`), no
/// identity conflict is counted, both steps' figures are exact, and the
/// report lists each rank with its step.
#[test]
fn a_jobs_second_step_is_labelled_by_its_step() {
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Root, Need::Mpi(mpi), Need::Command("bpftool")]) {
        return;
    }
    let dir = scratch("scheduler-steps");
    let exe = dir.join("claim");
    compile(mpi, &program("identity/claim.c"), &exe, &[]);
    const JOB: &str = "779";
    let mut daemon = Daemon::start(&["--all".into(), "--retain-exited".into(), "300".into()]);
    let ranks = |s: &[Sample]| -> Vec<(String, f64)> {
        let mut v: Vec<(String, f64)> = s
            .iter()
            .filter(|x| {
                x.name == "mpi_calls_total"
                    && x.label("jobid") == Some(JOB)
                    && x.label("function") == Some("MPI_Barrier")
            })
            .map(|x| (x.label("rank").unwrap_or_default().to_string(), x.value))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    for (step, iters) in [("0", ITERS), ("1", 2 * ITERS)] {
        let mut c = with_vars(mpi, 2, &[("SLURM_JOB_ID", JOB), ("SLURM_STEP_ID", step)]);
        c.arg(&exe).arg(iters.to_string());
        let job = Job::spawn(c, 2, dir.join(format!("go-{step}")));
        let pids = job.pids();
        wait_for(
            "--all to attach to the step",
            Duration::from_secs(20),
            || {
                let (_, s) = daemon.scrape();
                pids.iter()
                    .all(|p| {
                        s.iter().any(|x| {
                            x.name == "mpi_rank_info" && x.label("pid") == Some(&p.to_string())
                        })
                    })
                    .then_some(())
            },
        );
        job.go();
        job.finish("OK ");
    }
    let s = wait_for("both steps' exits", Duration::from_secs(10), || {
        let (_, s) = daemon.scrape();
        (sum(&s, "mpi_rank_up", &[("jobid", JOB)]) == 0.0).then_some(s)
    });
    assert_eq!(
        ranks(&s),
        [
            ("0".to_string(), ITERS as f64),
            ("0#step1".to_string(), 2.0 * ITERS as f64),
            ("1".to_string(), ITERS as f64),
            ("1#step1".to_string(), 2.0 * ITERS as f64),
        ]
    );
    assert_eq!(sum(&s, "mpi_observer_identity_conflicts_total", &[]), 0.0);
    let report = run_with_timeout(
        Command::new(observer_bin()).args([
            "report",
            "--url",
            &format!("http://{}", daemon.addr),
            "--job",
            JOB,
        ]),
        Duration::from_secs(60),
    );
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(report.status.success(), "{text}");
    assert_eq!(text.matches(", step 0").count(), 2, "{text}");
    assert_eq!(text.matches(", step 1").count(), 2, "{text}");
    let status = daemon.stop(signal::INT);
    assert!(status.success(), "{status}");
    assert_no_probes_left();
}
