//! Per-user budgets: what one user's processes may take of the daemon and
//! of the kernel. The daemon runs as root for everyone on a shared node, so
//! whatever a user's processes cost it (processes attached, uprobes, BPF
//! map entries) is bounded per user: past a budget that user's new
//! processes are refused, with one log line and a counter labelled by uid,
//! and nobody else's are affected. The defaults fit a full cluster node: a
//! user owning every core with one rank each, with room to spare.
//!
//! Usage is derived from the registry at each decision, never kept in a
//! second set of books that could drift from it.

use std::{
    collections::{BTreeMap, HashMap},
    time::{Duration, Instant},
};

/// The budgets of every user (each user gets all of them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budgets {
    /// Live processes attached (probed, or read through their shim).
    pub processes: usize,
    /// Uprobes plus uretprobes on live processes.
    pub probes: usize,
    /// Entries in the kernel's statistics map, held from the attach until
    /// the rank is forgotten (`--retain-exited` after it exits).
    pub map_entries: usize,
    /// Entries in the kernel's call-site map (`--callsites`), held the same
    /// way. Each map has its own budget, so neither can be filled by
    /// spending the other's share.
    pub site_entries: usize,
}

impl Budgets {
    /// Defaults for a machine with `cpus` online CPUs: twice as many
    /// processes as CPUs (at least 64), each with every default function
    /// probed (about 2 × 400 probes) and its call sites (1,024) recorded.
    pub fn for_cpus(cpus: usize) -> Budgets {
        let processes = (2 * cpus).max(64);
        Budgets {
            processes,
            probes: processes * 1_000,
            map_entries: processes * 400,
            site_entries: processes * 1_024,
        }
    }
}

/// Which budget refused a process; the `budget` label of
/// `mpi_observer_refused_processes_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Budget {
    /// [`Budgets::processes`].
    Processes,
    /// [`Budgets::probes`].
    Probes,
    /// [`Budgets::map_entries`].
    MapEntries,
    /// Not a user's budget: the kernel maps are full for everyone (the
    /// node's capacity, `--map-memory`).
    Capacity,
    /// Not a user's budget: the daemon's open descriptors are near its
    /// limit, and what is left is kept for scrapes and for reading /proc.
    Descriptors,
}

impl Budget {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Budget::Processes => "processes",
            Budget::Probes => "probes",
            Budget::MapEntries => "map_entries",
            Budget::Capacity => "capacity",
            Budget::Descriptors => "descriptors",
        }
    }

    /// The flag that sets it.
    pub fn flag(self) -> &'static str {
        match self {
            Budget::Processes => "--user-max-processes",
            Budget::Probes => "--user-max-probes",
            Budget::MapEntries => "--user-max-map-entries",
            Budget::Capacity => "--map-memory",
            Budget::Descriptors => "LimitNOFILE",
        }
    }
}

/// What one user holds now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Live processes.
    pub processes: usize,
    /// Probes on live processes.
    pub probes: usize,
    /// Statistics entries reserved (live and retained ranks).
    pub map_entries: usize,
    /// Call-site entries reserved (live and retained ranks).
    pub site_entries: usize,
}

/// What a process about to be attached would add.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    /// Probes it would get.
    pub probes: usize,
    /// Statistics entries it could create: one per function attached.
    pub map_entries: usize,
    /// Call-site entries it could create: its cap.
    pub site_entries: usize,
}

impl Budgets {
    /// The budget `add` would exceed for a user holding `used`, if any.
    pub fn check(&self, used: Usage, add: Cost) -> Option<Budget> {
        if used.processes + 1 > self.processes {
            Some(Budget::Processes)
        } else if used.probes + add.probes > self.probes {
            Some(Budget::Probes)
        } else if used.map_entries + add.map_entries > self.map_entries
            || used.site_entries + add.site_entries > self.site_entries
        {
            Some(Budget::MapEntries)
        } else {
            None
        }
    }
}

/// How often a refusal of one (user, budget) is logged at most; the lines
/// in between are counted and said in the next.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Rate-limits the refusal lines: one per (uid, budget) and minute, with
/// the number refused since the last.
#[derive(Debug, Default)]
pub struct RefusalLog {
    last: HashMap<(u32, Budget), (Instant, u64)>,
}

impl RefusalLog {
    /// The line to print for this refusal, if one is due.
    pub fn line(
        &mut self,
        uid: u32,
        pid: u32,
        budget: Budget,
        budgets: &Budgets,
    ) -> Option<String> {
        let now = Instant::now();
        let e = self
            .last
            .entry((uid, budget))
            .or_insert((now - LOG_EVERY, 0));
        e.1 += 1;
        if now.duration_since(e.0) < LOG_EVERY {
            return None;
        }
        let n = std::mem::take(&mut e.1);
        e.0 = now;
        let limit = match budget {
            Budget::Processes => format!("{} processes", budgets.processes),
            Budget::Probes => format!("{} probes", budgets.probes),
            Budget::MapEntries => format!(
                "{} statistics and {} call-site map entries",
                budgets.map_entries, budgets.site_entries
            ),
            Budget::Capacity => "the node's map capacity".to_string(),
            Budget::Descriptors => "the daemon's open-file limit".to_string(),
        };
        let more = if n > 1 {
            format!(" ({n} refused since the last such line)")
        } else {
            String::new()
        };
        Some(if budget == Budget::Capacity {
            format!(
                "pid {pid} (uid {uid}) not observed: the kernel maps are full{more}; raise {} or lower the per-user budgets",
                budget.flag()
            )
        } else if budget == Budget::Descriptors {
            format!(
                "pid {pid} (uid {uid}) not observed: the daemon's open files are near its limit{more}, and the rest is kept for scrapes and /proc; raise the limit (ulimit -n, the unit's LimitNOFILE)"
            )
        } else {
            format!(
                "pid {pid} (uid {uid}) not observed: uid {uid} is at its budget of {limit}{more}; other users are not affected; raise it with {} if this user's jobs need more",
                budget.flag()
            )
        })
    }
}

/// Descriptors an attach may take (links, segment, transient reads).
pub const DESCRIPTORS_PER_PROCESS: usize = 16;
/// Descriptors always kept free for scrapes, /proc reads and the runtime.
pub const DESCRIPTORS_RESERVED: usize = 128;

/// Whether the daemon can afford another process's descriptors: its open
/// descriptors plus [`DESCRIPTORS_PER_PROCESS`] must stay
/// [`DESCRIPTORS_RESERVED`] below its soft limit.
pub fn descriptors_left() -> bool {
    // SAFETY: getrlimit on a local struct.
    let limit = unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return true;
        }
        lim.rlim_cur
    };
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        // Not even one descriptor to look with.
        return false;
    };
    let open = dir.count();
    (open + DESCRIPTORS_PER_PROCESS + DESCRIPTORS_RESERVED) as u64 <= limit
}

/// Sums usage per uid of (uid, live, probes, what it reserved).
pub fn usage_by_uid<'a>(
    items: impl Iterator<Item = (u32, bool, usize, Cost)> + 'a,
) -> BTreeMap<u32, Usage> {
    let mut out: BTreeMap<u32, Usage> = BTreeMap::new();
    for (uid, live, probes, reserved) in items {
        let u = out.entry(uid).or_default();
        if live {
            u.processes += 1;
            u.probes += probes;
        }
        u.map_entries += reserved.map_entries;
        u.site_entries += reserved.site_entries;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_budget_refuses_past_its_limit() {
        let b = Budgets {
            processes: 2,
            probes: 100,
            map_entries: 50,
            site_entries: 10,
        };
        let cost = Cost {
            probes: 40,
            map_entries: 20,
            site_entries: 5,
        };
        assert_eq!(b.check(Usage::default(), cost), None);
        let used = Usage {
            processes: 1,
            probes: 40,
            map_entries: 20,
            site_entries: 5,
        };
        assert_eq!(b.check(used, cost), None);
        let two = Usage {
            processes: 2,
            ..used
        };
        assert_eq!(b.check(two, cost), Some(Budget::Processes));
        let probes = Usage { probes: 61, ..used };
        assert_eq!(b.check(probes, cost), Some(Budget::Probes));
        let entries = Usage {
            map_entries: 31,
            ..used
        };
        assert_eq!(b.check(entries, cost), Some(Budget::MapEntries));
        let sites = Usage {
            site_entries: 6,
            ..used
        };
        assert_eq!(b.check(sites, cost), Some(Budget::MapEntries));
    }

    #[test]
    fn usage_counts_live_processes_and_every_reservation() {
        let c = |map_entries, site_entries| Cost {
            probes: 0,
            map_entries,
            site_entries,
        };
        let u = usage_by_uid(
            [
                (7, true, 10, c(5, 2)),
                (7, false, 0, c(5, 2)),
                (8, true, 1, c(1, 0)),
            ]
            .into_iter(),
        );
        assert_eq!(
            u[&7],
            Usage {
                processes: 1,
                probes: 10,
                map_entries: 10,
                site_entries: 4,
            }
        );
        assert_eq!(u[&8].processes, 1);
    }

    #[test]
    fn refusals_are_logged_once_a_minute_with_the_count() {
        let b = Budgets::for_cpus(2);
        let mut log = RefusalLog::default();
        let first = log.line(1001, 10, Budget::Processes, &b).unwrap();
        assert!(
            first.contains("uid 1001") && first.contains("--user-max-processes"),
            "{first}"
        );
        assert!(log.line(1001, 11, Budget::Processes, &b).is_none());
        // Another user, another budget: lines of their own.
        assert!(log.line(1002, 12, Budget::Processes, &b).is_some());
        assert!(log.line(1001, 13, Budget::Probes, &b).is_some());
        assert_eq!(b.processes, 64);
    }
}
