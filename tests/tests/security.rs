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
