//! End-to-end tests of the wait states (issue 37, docs/waits.md): a real
//! 4-rank job under the shim's `stats` layer plants one late rank in every
//! collective of a kind (tests/programs/waits/late.c), and the daemon's
//! `/metrics` must say how long the others waited, under which of
//! Scalasca's patterns, and name the late rank as the culprit; on Debian's
//! Open MPI and MPICH. Two more modes plant Late Senders: a blocking
//! receive each, and an `MPI_Waitall` whose latest sender is late.
//!
//! Messages are sampled as shipped, one in 8 per envelope: 16 rounds keep
//! 2 of each, which stand for all 16. The planted wait is DELAY × ROUNDS =
//! 1.6 s per waiting rank. The band
//! [0.9, 1.3] allows for the sleep's overshoot and for the skew with which
//! 4 ranks sharing 2 cores leave the collective before: a rank that leaves
//! a Bcast 3 ms after its root (which returns once its eager sends are
//! out) truly waits 3 ms less in the next (measured here: MPICH's Bcast
//! 2.952 s of 3 planted, its Barrier 3.211). Every other pattern must stay
//! under 0.05 s (the one synchronising barrier after the start), and every
//! count is exact.

use std::path::{Path, PathBuf};

use e2e::{Daemon, Job, Mpi, Need, Sample, compile, program, require, scratch, shim_launcher, sum};

const NP: u32 = 4;
const ROUNDS: u64 = 16;
/// The messages' sampling period the shim uses unless told.
const P2P_PERIOD: u64 = 8;
const DELAY_MS: u64 = 100;
const PATTERNS: [&str; 5] = [
    "wait_barrier",
    "wait_nxn",
    "late_broadcast",
    "early_reduce",
    "late_sender",
];

/// One mode of late.c: the pattern it plants, the ranks that wait, the
/// culprit, and the sampled instances of the pattern a round makes.
struct Plant {
    mode: &'static str,
    pattern: &'static str,
    waiters: u32,
    culprit: u32,
}

impl Plant {
    /// Instances of its pattern the daemon evaluates over the run.
    fn instances(&self) -> u64 {
        match self.mode {
            // The synchronising barrier after the start, too.
            "barrier" => ROUNDS + 1,
            // One receiving call per waiter per sampled round.
            "sender" => ROUNDS / P2P_PERIOD * u64::from(self.waiters),
            // Rank 0's sampled Waitalls: a round's messages share their
            // numbers, so all of its receives are sampled together.
            "waitall" => ROUNDS / P2P_PERIOD,
            _ => ROUNDS,
        }
    }
}

const PLANTS: [Plant; 6] = [
    Plant {
        mode: "barrier",
        pattern: "wait_barrier",
        waiters: 3,
        culprit: 3,
    },
    Plant {
        mode: "nxn",
        pattern: "wait_nxn",
        waiters: 3,
        culprit: 2,
    },
    Plant {
        mode: "bcast",
        pattern: "late_broadcast",
        waiters: 3,
        culprit: 0,
    },
    Plant {
        mode: "reduce",
        pattern: "early_reduce",
        // Only the root waits in a reduce.
        waiters: 1,
        culprit: 3,
    },
    Plant {
        mode: "sender",
        pattern: "late_sender",
        waiters: 3,
        culprit: 3,
    },
    Plant {
        mode: "waitall",
        pattern: "late_sender",
        // Rank 0, for its latest sender only.
        waiters: 1,
        culprit: 3,
    },
];

fn by(samples: &[Sample], name: &str, label: &str, value: &str) -> f64 {
    sum(samples, name, &[(label, value)])
}

/// Runs `plant` once and checks what the daemon says of it.
fn run(mpi: Mpi, dir: &Path, exe: &PathBuf, plant: &Plant) {
    let go = dir.join(format!("go-{}", plant.mode));
    let mut launcher = shim_launcher(mpi, NP, "stats");
    launcher.arg(exe).args([
        plant.mode.to_string(),
        ROUNDS.to_string(),
        DELAY_MS.to_string(),
        go.display().to_string(),
    ]);
    let job = Job::spawn(launcher, NP, go);
    let mut daemon = Daemon::start(&[vec!["--no-bpf".to_string()], job.pid_args()].concat());
    job.finish("OK ");
    let s = daemon.final_scrape();
    let what = format!("{mpi:?} {}", plant.mode);
    // Every instance evaluated, none unresolved, nothing lost.
    for p in PATTERNS {
        let want = match (p == plant.pattern, p == "wait_barrier") {
            (true, _) => plant.instances(),
            // The synchronising barrier after the start.
            (false, true) => 1,
            (false, false) => 0,
        };
        assert_eq!(
            by(&s, "mpi_job_wait_instances_total", "pattern", p) as u64,
            want,
            "{what}: instances of {p}"
        );
    }
    assert_eq!(sum(&s, "mpi_job_wait_unresolved_total", &[]), 0.0, "{what}");
    assert_eq!(
        sum(&s, "mpi_job_wait_records_lost_total", &[]),
        0.0,
        "{what}"
    );
    assert_eq!(
        sum(&s, "mpi_job_wait_records_invalid_total", &[]),
        0.0,
        "{what}"
    );
    assert_eq!(sum(&s, "mpi_job_wait_sample_period", &[]), 1.0, "{what}");
    assert_eq!(
        sum(&s, "mpi_job_wait_p2p_sample_period", &[]),
        P2P_PERIOD as f64,
        "{what}"
    );
    // The planted wait, and nothing else.
    let planted = (DELAY_MS * ROUNDS) as f64 / 1000.0 * f64::from(plant.waiters);
    let got = by(&s, "mpi_job_wait_seconds_total", "pattern", plant.pattern);
    assert!(
        got >= 0.9 * planted && got <= 1.3 * planted,
        "{what}: {} waited {got:.3} s, planted {planted:.3} s",
        plant.pattern
    );
    eprintln!(
        "{what}: {} {got:.3} s, planted {planted:.3} s",
        plant.pattern
    );
    for p in PATTERNS.iter().filter(|&&p| p != plant.pattern) {
        let other = by(&s, "mpi_job_wait_seconds_total", "pattern", p);
        assert!(
            other < 0.05,
            "{what}: {p} waited {other:.3} s, none planted"
        );
    }
    // The late rank is the culprit, as a value.
    assert_eq!(
        sum(&s, "mpi_job_wait_culprit_rank", &[("k", "1")]),
        f64::from(plant.culprit),
        "{what}: the culprit"
    );
    assert!(sum(&s, "mpi_job_wait_culprit_fraction_1m", &[("k", "1")]) > 0.0);
    // The rank that waited most is one the plant made wait: rank 0 where
    // it is the only one (the root of a reduce, the Waitall's receiver),
    // and never the culprit.
    let waiter = sum(&s, "mpi_job_wait_waiting_rank", &[("k", "1")]);
    if plant.waiters == 1 {
        assert_eq!(waiter, 0.0, "{what}: the waiting rank");
    } else {
        assert_ne!(waiter, f64::from(plant.culprit), "{what}: the waiting rank");
    }
    assert!(sum(&s, "mpi_job_wait_waiting_fraction_1m", &[("k", "1")]) > 0.0);
    let _ = daemon.stop(e2e::signal::TERM);
}

fn every_plant_is_found_and_its_culprit_named(mpi: Mpi) {
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch(&format!("waits-{}", mpi.name()));
    let exe = dir.join(format!("late-{}", mpi.name()));
    compile(mpi, &program("waits/late.c"), &exe, &[]);
    for plant in &PLANTS {
        run(mpi, &dir, &exe, plant);
    }
}

e2e::per_mpi!(
    every_plant_is_found_and_its_culprit_named => every_plant_is_found_and_its_culprit_named:
        openmpi, mpich
);
