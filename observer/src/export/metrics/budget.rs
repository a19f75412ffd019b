//! The series budget (`attach --max-series`): an exposition is first built
//! as families of groups, each group the series that stand or fall
//! together (one sample, or a whole histogram of one label set) with the
//! priority of what it is for; then the groups are admitted in priority
//! order until the budget is spent, and written in the families' order.
//! What is past the budget is dropped, the same groups at every scrape of
//! the same ranks, and counted by family, never silently.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// What a series is for, most needed first: the order in which the
/// budget admits them. Self-metrics are outside the budget: always there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// The few series every rank has: info, up, times, MPI and wall seconds.
    RankMinimal,
    /// Per job and node, summed over this node's ranks.
    Job,
    /// `mpi_rank_detail`, the mark of a detail rank.
    DetailMark,
    /// Full per-rank series of the detail ranks (every rank with
    /// `--per-rank-detail` and on `/metrics/ranks`).
    Detail,
    /// Per-rank latency histograms (`--per-rank-histograms`).
    Histograms,
}

const TIERS: [Tier; 5] = [
    Tier::RankMinimal,
    Tier::Job,
    Tier::DetailMark,
    Tier::Detail,
    Tier::Histograms,
];

/// Series that stand or fall together, ending at `end` in the family's text.
struct Group {
    end: usize,
    tier: Tier,
    series: usize,
}

/// One metric family's samples, grouped for the budget.
pub struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    /// Its header is written even without samples (as it always was).
    always: bool,
    text: String,
    groups: Vec<Group>,
}

impl Family {
    /// A family whose header is written only when it has samples.
    pub fn new(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family {
            name,
            kind,
            help,
            always: false,
            text: String::new(),
            groups: Vec::new(),
        }
    }

    /// A family whose header is written even without samples.
    pub fn always(name: &'static str, kind: &'static str, help: &'static str) -> Family {
        Family {
            always: true,
            ..Family::new(name, kind, help)
        }
    }

    /// The family's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// One group of `tier`: every line `f` writes (each ending in `\n`).
    pub fn group(&mut self, tier: Tier, f: impl FnOnce(&mut String)) {
        let start = self.text.len();
        f(&mut self.text);
        let series = self.text[start..].bytes().filter(|&b| b == b'\n').count();
        if series > 0 {
            self.groups.push(Group {
                end: self.text.len(),
                tier,
                series,
            });
        }
    }

    /// One sample of `tier`: `line` without its newline.
    pub fn line(&mut self, tier: Tier, line: std::fmt::Arguments<'_>) {
        self.group(tier, |out| {
            let _ = out.write_fmt(line);
            out.push('\n');
        });
    }

    /// Series in the family.
    #[cfg(test)]
    pub fn series(&self) -> usize {
        self.groups.iter().map(|g| g.series).sum()
    }
}

/// What one exposition kept and dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Series written (self-metrics not counted).
    pub series: u64,
    /// Series dropped, by family.
    pub dropped: BTreeMap<&'static str, u64>,
}

impl Outcome {
    /// Series dropped in all.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }
}

/// Writes `families` to `out` in their order, keeping at most `max` series:
/// groups are admitted by tier, then in the families' order, until one
/// does not fit; it and every group after it are dropped. The kept set is
/// so a prefix of one fixed order: the same groups every scrape.
pub fn write(families: &[Family], max: usize, out: &mut String) -> Outcome {
    let mut keep: Vec<Vec<bool>> = families
        .iter()
        .map(|f| vec![false; f.groups.len()])
        .collect();
    let mut outcome = Outcome::default();
    let mut used = 0usize;
    let mut full = false;
    for tier in TIERS {
        for (f, family) in families.iter().enumerate() {
            for (g, group) in family.groups.iter().enumerate() {
                if group.tier != tier {
                    continue;
                }
                if !full && used + group.series <= max {
                    used += group.series;
                    keep[f][g] = true;
                } else {
                    full = true;
                    *outcome.dropped.entry(family.name).or_default() += group.series as u64;
                }
            }
        }
    }
    outcome.series = used as u64;
    for (family, keep) in families.iter().zip(&keep) {
        if !family.always && !keep.iter().any(|&k| k) {
            continue;
        }
        let _ = writeln!(
            out,
            "# HELP {} {}\n# TYPE {} {}",
            family.name, family.help, family.name, family.kind
        );
        let mut start = 0;
        for (group, &k) in family.groups.iter().zip(keep) {
            if k {
                out.push_str(&family.text[start..group.end]);
            }
            start = group.end;
        }
    }
    outcome
}

/// The two expositions the budget applies to, as the `path` label says.
pub const PATHS: [&str; 2] = ["/metrics", "/metrics/ranks"];

/// How often at most the daemon says that series were dropped.
const LOG_EVERY: Duration = Duration::from_secs(60);

#[derive(Default)]
struct PathStats {
    last: Outcome,
    dropped_total: u64,
}

/// The budget's self-metrics, by path, and the rate limit of its log line.
#[derive(Default)]
pub struct BudgetStats {
    inner: Mutex<(BTreeMap<&'static str, PathStats>, Option<Instant>)>,
}

impl BudgetStats {
    /// Records the outcome of an exposition of `path` under `max`, and says
    /// so on stderr (once a minute at most) if it dropped series.
    pub fn record(&self, path: &'static str, max: usize, outcome: Outcome) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let (paths, logged) = &mut *inner;
        let dropped = outcome.dropped_total();
        if dropped > 0 && logged.is_none_or(|t| t.elapsed() >= LOG_EVERY) {
            *logged = Some(Instant::now());
            let families: Vec<&str> = outcome.dropped.keys().copied().collect();
            log::warn!(
                "{path} is over --max-series {max}: {dropped} series dropped ({}), counted in mpi_observer_series_dropped; raise --max-series, or lower --detail-ranks",
                families.join(", ")
            );
        }
        let p = paths.entry(path).or_default();
        p.dropped_total = p.dropped_total.saturating_add(dropped);
        p.last = outcome;
    }

    /// Appends the budget's self-metrics.
    pub fn render(&self, out: &mut String) {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let paths = &inner.0;
        let _ = writeln!(
            out,
            "# HELP mpi_observer_exposition_series MPI series in the last exposition of the path (self-metrics not counted), at most --max-series.\n# TYPE mpi_observer_exposition_series gauge"
        );
        for path in PATHS {
            let n = paths.get(path).map_or(0, |p| p.last.series);
            let _ = writeln!(out, "mpi_observer_exposition_series{{path=\"{path}\"}} {n}");
        }
        let _ = writeln!(
            out,
            "# HELP mpi_observer_series_dropped Series of a metric family dropped from the last exposition of the path because it was over --max-series; absent while none.\n# TYPE mpi_observer_series_dropped gauge"
        );
        for path in PATHS {
            if let Some(p) = paths.get(path) {
                for (metric, n) in &p.last.dropped {
                    let _ = writeln!(
                        out,
                        "mpi_observer_series_dropped{{path=\"{path}\",metric=\"{metric}\"}} {n}"
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP mpi_observer_series_dropped_total Series dropped from expositions of the path because they were over --max-series, summed over expositions.\n# TYPE mpi_observer_series_dropped_total counter"
        );
        for path in PATHS {
            let n = paths.get(path).map_or(0, |p| p.dropped_total);
            let _ = writeln!(
                out,
                "mpi_observer_series_dropped_total{{path=\"{path}\"}} {n}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn families() -> Vec<Family> {
        let mut a = Family::always("a", "gauge", "A.");
        let mut b = Family::new("b", "histogram", "B.");
        let mut c = Family::new("c", "gauge", "C.");
        for i in 0..3 {
            a.line(Tier::Detail, format_args!("a{{i=\"{i}\"}} 1"));
            c.line(Tier::RankMinimal, format_args!("c{{i=\"{i}\"}} 1"));
        }
        b.group(Tier::Job, |out| {
            out.push_str("b_bucket 1\nb_sum 1\nb_count 1\n")
        });
        b.group(Tier::Histograms, |out| {
            out.push_str("b_bucket{r=\"0\"} 1\nb_sum{r=\"0\"} 1\nb_count{r=\"0\"} 1\n")
        });
        vec![a, b, c]
    }

    #[test]
    fn everything_fits_in_order() {
        let mut out = String::new();
        let o = write(&families(), 100, &mut out);
        assert_eq!(o.series, 12);
        assert!(o.dropped.is_empty());
        let samples: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(samples.len(), 12);
        assert!(
            out.starts_with("# HELP a A.\n# TYPE a gauge\na{i=\"0\"}"),
            "{out}"
        );
    }

    #[test]
    fn drops_by_priority_whole_histograms_and_counts() {
        // 3 minimal, then the job histogram (3), then 2 of 3 detail lines.
        let mut out = String::new();
        let o = write(&families(), 8, &mut out);
        assert_eq!(o.series, 8);
        assert_eq!(o.dropped, BTreeMap::from([("a", 1), ("b", 3)]));
        assert!(
            out.contains("b_count 1\n") && !out.contains("r=\"0\""),
            "{out}"
        );
        assert!(
            out.contains("a{i=\"1\"}") && !out.contains("a{i=\"2\"}"),
            "{out}"
        );
        // A histogram that does not fit whole is dropped whole, and so is
        // everything after it, though a later single line would fit.
        let mut out = String::new();
        let o = write(&families(), 5, &mut out);
        assert_eq!(o.series, 3);
        assert_eq!(o.dropped, BTreeMap::from([("a", 3), ("b", 6)]));
        assert!(!out.contains("b_"), "{out}");
        // A family with nothing kept has no header unless it always had one.
        assert!(
            out.contains("# TYPE a gauge") && !out.contains("# TYPE b"),
            "{out}"
        );
        // The same input, the same drops.
        let mut again = String::new();
        assert_eq!(write(&families(), 5, &mut again), o);
        assert_eq!(again, out);
        let mut none = String::new();
        assert_eq!(write(&families(), 0, &mut none).series, 0);
    }

    #[test]
    fn stats_count_per_path_and_sum() {
        let s = BudgetStats::default();
        let o = Outcome {
            series: 30,
            dropped: BTreeMap::from([("mpi_job_calls_total", 4)]),
        };
        s.record("/metrics", 30, o.clone());
        s.record("/metrics", 30, o);
        s.record("/metrics/ranks", 30, Outcome::default());
        let mut out = String::new();
        s.render(&mut out);
        for want in [
            "mpi_observer_exposition_series{path=\"/metrics\"} 30\n",
            "mpi_observer_exposition_series{path=\"/metrics/ranks\"} 0\n",
            "mpi_observer_series_dropped{path=\"/metrics\",metric=\"mpi_job_calls_total\"} 4\n",
            "mpi_observer_series_dropped_total{path=\"/metrics\"} 8\n",
            "mpi_observer_series_dropped_total{path=\"/metrics/ranks\"} 0\n",
        ] {
            assert!(out.contains(want), "{want} in {out}");
        }
        s.record("/metrics", 30, Outcome::default());
        let mut out = String::new();
        s.render(&mut out);
        assert!(!out.contains("mpi_observer_series_dropped{"), "{out}");
    }
}
