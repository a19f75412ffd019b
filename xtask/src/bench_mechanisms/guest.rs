//! `bench mechanisms-guest`: the probe-cost part of `bench mechanisms`
//! for a `cargo xtask vm` guest, with only the mechanisms its kernel has.

use std::{fmt::Write as _, path::Path, time::Instant};

use anyhow::Result;

use super::{BATCHES, FORCE, Mech, build, machine, probe_cost_of, probe_cost_run};

/// Rounds in a guest ([`run_guest`]).
const GUEST_REPS: usize = 5;
/// Calls per batch in a guest: an emulated trap costs tens of µs.
pub const GUEST_CALLS: u32 = 1000;

/// `bench mechanisms-guest`: the probe cost of each mechanism this kernel
/// has, for a guest of `cargo xtask vm` (issue 35). A mechanism is tried
/// once, forced; one the kernel lacks (the daemon exits with an error) is
/// reported as such, never assumed from the kernel's version.
pub fn run_guest(root: &Path) -> Result<()> {
    let mut p = build(root)?;
    p.calls = GUEST_CALLS;
    let started = Instant::now();
    let mut configs = vec![None];
    let mut lacking = String::new();
    for m in [Mech::UprobeMulti, Mech::PerfLink, Mech::PerfIoctl] {
        match probe_cost_run(&p, Some(m)) {
            Ok(_) => configs.push(Some(m)),
            Err(e) => {
                let why = format!("{e:#}");
                let why = why
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                writeln!(
                    lacking,
                    "- `{}`: not on this kernel: {}",
                    m.name(),
                    why.trim()
                )?;
            }
        }
    }
    let mut cost = String::new();
    probe_cost_of(&p, &configs, GUEST_REPS, &mut cost)?;
    let mut r = String::new();
    writeln!(
        r,
        "### Probe cost in a guest: `cargo xtask vm --kernel K -- target/debug/xtask bench mechanisms-guest`\n\n\
         Kernel {}; machine: {}; {:.1} minutes. `probecost.c` as above, {BATCHES} batches of \
         {GUEST_CALLS}, {GUEST_REPS} rounds, the order rotated; each mechanism forced with `{FORCE}` \
         and checked in the daemon's `attaching with` line.\n",
        crate::bench_common::first_line("uname", &["-r"]),
        machine(),
        started.elapsed().as_secs_f64() / 60.0,
    )?;
    r.push_str(&cost);
    if !lacking.is_empty() {
        r.push('\n');
        r.push_str(&lacking);
    }
    print!("\n{r}");
    Ok(())
}
