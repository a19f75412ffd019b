//! One collection: the stats segments and the probes' maps read into a
//! [`Snapshot`], each rank's calls and call sites put together from both,
//! and what is made of it: `/metrics`, `/metrics/ranks` and the report
//! data.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicU64, Ordering},
    time::{Duration, Instant, SystemTime},
};

use super::{State, rank::adoption_line};
use crate::{
    collect::callsites::Who,
    collect::segment::Segment,
    collect::snapshot::{
        CallsByFunction, Figures, Health, RankSnapshot, RawSite, SegmentSnapshot, Snapshot,
    },
    export::metrics::{self, Carried},
};

/// Completed collections, exported as `mpi_observer_scrapes_total`. Kept
/// here, beside the collections it counts, so the server only reports one
/// ([`count_scrape`]) and the registry needs nothing of the server.
static SCRAPES: AtomicU64 = AtomicU64::new(0);

/// Counts one completed collection (the server, once per scrape or per
/// group of concurrent scrapes that shared one).
pub fn count_scrape() {
    SCRAPES.fetch_add(1, Ordering::Relaxed);
}

/// Collections completed since the daemon started: one per scrape, or per
/// group of concurrent scrapes that shared one.
pub fn scrapes_total() -> u64 {
    SCRAPES.load(Ordering::Relaxed)
}

/// A rank's call statistics: from the probes, or from a ready segment's
/// timing, which replaces them (the shim was there from the process's start,
/// or from before this daemon attached, and counted every call the probes
/// saw) or, for a shim this daemon injected (`add`), adds to them (the
/// probes counted up to the handover, the shim from it on; see
/// docs/inject.md). Without `bytes`, no byte figures.
fn rank_calls(
    probed: Option<CallsByFunction>,
    f: Option<&Figures>,
    add: bool,
    bytes: bool,
) -> Option<CallsByFunction> {
    let Some(f) = f.filter(|f| f.ready) else {
        return probed;
    };
    let mut out = if add {
        probed.unwrap_or_default()
    } else {
        CallsByFunction::default()
    };
    for (&id, t) in &f.timing {
        let mut s = observer_common::maps::CallStats::ZERO;
        s.calls = t.calls;
        s.time_ns = t.time_ns;
        s.hist = t.hist;
        if bytes {
            s.bytes = t.bytes;
            s.bytes_unknown = t.bytes_unknown;
        }
        out.entry(id)
            .or_insert(observer_common::maps::CallStats::ZERO)
            .add(&s);
    }
    Some(out)
}

/// A rank's raw call sites, by the same rule as [`rank_calls`]: the
/// segment's replace the probes', or add to them for a shim this daemon
/// injected.
fn rank_sites(probed: Option<Vec<RawSite>>, f: Option<&Figures>, add: bool) -> Vec<RawSite> {
    let Some(f) = f.filter(|f| f.ready) else {
        return probed.unwrap_or_default();
    };
    let mut out = if add {
        probed.unwrap_or_default()
    } else {
        Vec::new()
    };
    out.extend_from_slice(&f.callsites);
    out
}

/// Opens the segment of a running rank that has none yet, if it has one
/// now; false if that failed (the problem counted once per change).
pub(super) fn open_segment(r: &mut super::Rank, selfm: &metrics::SelfMetrics) -> bool {
    if r.segment.is_none() && r.exited_at.is_none() {
        match Segment::open(r.pid) {
            Ok(seg) => r.segment = seg,
            Err(p) => {
                if r.segment_problem != Some(p) {
                    selfm.segment_error(p);
                    r.segment_problem = Some(p);
                }
                return false;
            }
        }
    }
    true
}

impl State {
    /// Finds segments not found yet and reads every segment's figures.
    /// A segment that fails is skipped (its figures are dropped) and counted
    /// once per change of problem.
    ///
    /// A rank whose segment is ready loses its probes at that moment: the
    /// shim times every call of the process from its first (see
    /// `rank_calls`), so the probes would only count calls twice. A shim
    /// this daemon is injecting is handed over by the injector
    /// (docs/inject.md); one injected before it attached and still live is
    /// adopted: the probes go, and its timing stands for the rank.
    pub fn read_segments(&mut self) {
        let mut handover = Vec::new();
        let mut adopt = Vec::new();
        for r in self.ranks.values_mut() {
            if !open_segment(r, &self.selfm) {
                continue;
            }
            let Some(seg) = &r.segment else { continue };
            match seg.read() {
                Ok(f) => {
                    if f.ready && r.attachment.is_some() && !r.injecting {
                        if !f.injected {
                            handover.push(r.pid);
                        } else if !f.ejected && !r.injected {
                            adopt.push(r.pid);
                        }
                    }
                    r.figures = Some(f);
                    r.segment_problem = None;
                }
                Err(p) => {
                    r.figures = None;
                    if r.segment_problem != Some(p) {
                        self.selfm.segment_error(p);
                        r.segment_problem = Some(p);
                    }
                }
            }
        }
        for pid in handover {
            self.detach(pid);
        }
        for pid in adopt {
            log::info!("{}", adoption_line(pid));
            self.detach(pid);
            if let Some(r) = self.ranks.get_mut(&pid) {
                r.injected = true;
                r.adopted = true;
                self.selfm.injected.inc();
            }
        }
    }

    /// The ranks as they stand, with `calls` and `sites`, the call
    /// statistics and call sites read from the maps (those of processes not
    /// registered here are dropped: identity only ever comes from the
    /// registry), the daemon's `health`, and `now_ns`, `CLOCK_MONOTONIC`
    /// now, to age outstanding requests by. New call sites are named here.
    pub fn snapshot(
        &mut self,
        mut calls: BTreeMap<u32, CallsByFunction>,
        mut sites: BTreeMap<u32, Vec<RawSite>>,
        health: Health,
        now_ns: u64,
    ) -> Snapshot {
        let mut names = self.names.session();
        let budget = self.callsite_budget;
        let bytes = self.bytes;
        let kept = &mut self.exited_figures;
        let ranks = self
            .ranks
            .values_mut()
            .map(|r| {
                let who = Who {
                    pid: r.pid,
                    uid: r.uid,
                    alive: r.exited_at.is_none(),
                };
                // Gone from the maps: its final figures as kept, with the
                // names of its sites made since.
                if r.released
                    && let Some(k) = kept.get_mut(&r.pid)
                {
                    if k.callsites.iter().any(|s| s.pending) {
                        k.callsites = r.sites.resolve(&mut names, who, &r.exited_sites, budget);
                    }
                    if !k.callsites.iter().any(|s| s.pending) {
                        r.exited_sites = Vec::new();
                    }
                    return k.clone();
                }
                let add = r.figures.as_ref().is_some_and(|f| f.injected) && !r.adopted;
                let raw = rank_sites(sites.remove(&r.pid), r.figures.as_ref(), add);
                let callsites = r.sites.resolve(&mut names, who, &raw, budget);
                if r.exited_at.is_some() {
                    r.exited_sites = raw;
                }
                RankSnapshot {
                    pid: r.pid,
                    identity: r.identity.clone(),
                    labels: r.labels.clone(),
                    library: r.library,
                    version: r.version.clone(),
                    started: r.started_at,
                    attached: r.attached_at,
                    counted_since: r.counted_since(),
                    exited: r.exited_wall,
                    calls: rank_calls(calls.remove(&r.pid), r.figures.as_ref(), add, bytes),
                    callsites,
                    segment: r.figures.as_ref().map(|f| SegmentSnapshot {
                        figures: f.clone(),
                        // Zero for a rank that exited.
                        oldest_request_age: match (f.oldest_started_ns, r.exited_at) {
                            (Some(t), None) => Duration::from_nanos(now_ns.saturating_sub(t)),
                            _ => Duration::ZERO,
                        },
                    }),
                }
            })
            .collect();
        Snapshot {
            ranks,
            health,
            taken: SystemTime::now(),
        }
    }

    /// Reads the stats segments and the maps, now.
    pub fn collect(&mut self) -> Snapshot {
        self.read_segments();
        let pending = self
            .ranks
            .values()
            .filter(|r| {
                r.pending_datatypes.is_some() && r.exited_at.is_none() && r.attachment.is_some()
            })
            .count();
        self.selfm.datatypes_pending.set(pending as i64);
        // Call sites before the statistics: a call adds to its function's
        // figures first, so the sites never exceed the function's calls.
        let (sites, calls, map_failures) = self
            .probes
            .as_ref()
            .map(|p| {
                let sites = p.read_callsites();
                let mut failures = p.read_map_failures();
                failures.callsites = p.read_callsite_failures();
                (sites, p.read_stats(), failures)
            })
            .unwrap_or_default();
        let health = Health {
            map_failures,
            scrapes_total: scrapes_total(),
        };
        let snap = self.snapshot(calls, sites, health, crate::os::clock::monotonic_ns());
        // What this collection's figures still lack: sites not named yet.
        let waiting = snap
            .ranks
            .iter()
            .flat_map(|r| &r.callsites)
            .filter(|s| s.pending)
            .count();
        crate::collect::callsites::NamingCounters::global()
            .pending
            .store(waiting as u64, std::sync::atomic::Ordering::Relaxed);
        for r in snap.ranks.iter().filter(|r| r.exited.is_some()) {
            self.exited_figures
                .entry(r.pid)
                .or_insert_with(|| r.clone());
        }
        self.release_exited();
        snap
    }

    /// The ranks' report data now (`/report.json`, `attach --report-file`).
    pub fn report_data(&mut self) -> crate::export::report::Data {
        let snap = self.collect();
        // The records written since the last tick: the report at a job's
        // end has its last instances.
        self.drain_waits();
        let mut data =
            crate::export::report::Data::from_snapshot(&snap, &self.host, SystemTime::now());
        // The matcher knows a job by its label set; the report by its ID and
        // uid, which every rank of one label set shares.
        let mut named: Vec<(&str, &str, u32)> = self
            .ranks
            .values()
            .map(|r| {
                (
                    r.labels.job.as_str(),
                    r.identity.jobid.as_str(),
                    r.identity.uid,
                )
            })
            .collect();
        named.sort_unstable();
        named.dedup_by_key(|n| n.0);
        for (job, jobid, uid) in named {
            if let Some(w) = self.waits.figures(job) {
                data.waits.push(crate::export::report::WaitData::of(
                    jobid,
                    Some(uid),
                    w,
                    self.waits.pending_of(job),
                ));
            }
        }
        data
    }

    /// [`State::report_data`] as JSON.
    pub fn report_json(&mut self) -> Vec<u8> {
        serde_json::to_vec(&self.report_data()).unwrap_or_default()
    }

    /// One scrape's exposition text (`/metrics`); the detail ranks and
    /// the window's samples are updated with it.
    pub fn scrape(&mut self) -> String {
        let started = Instant::now();
        let snap = self.collect();
        // The wait records written since the last tick count in this
        // scrape: drained once the collection has opened new segments.
        self.drain_waits();
        let detail = self.picker.update(&snap, self.render.detail_ranks);
        let recent = self.window.update(&snap);
        let carried = Carried {
            detail: &detail,
            recent: &recent,
            departed: &self.departed,
            waits: &self.waits,
        };
        metrics::render_metrics(&snap, &self.selfm, self.render, carried, || {
            started.elapsed()
        })
    }

    /// The full per-rank series of the jobs named (`/metrics/ranks`; every
    /// job with `None`).
    pub fn scrape_ranks(&mut self, jobids: Option<&[String]>) -> String {
        let snap = self.collect();
        self.drain_waits();
        metrics::render_ranks(&snap, &self.selfm, self.render, jobids, &self.waits)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant, SystemTime};

    use crate::{
        collect::callsites::{Names, NamesConfig},
        collect::snapshot::{Figures, RawSite},
        export::metrics::RenderOptions,
        export::registry::{Rank, State},
    };

    #[test]
    fn a_rank_released_before_its_call_sites_are_named_gets_them_named() {
        let mut st = State::new(None, Vec::new(), true, RenderOptions::default());
        // No wait: the first collection cannot have the name yet.
        st.names = Names::with_config(NamesConfig {
            wait: Duration::ZERO,
            limits: crate::attach::symbolizer::Limits {
                deadline: Duration::from_secs(30),
                ..Default::default()
            },
            program: Some(crate::attach::symbolizer::tests::child_program()),
            ..NamesConfig::default()
        });
        let pid = std::process::id();
        let mut r = Rank::synthetic(pid, 0, "34");
        r.sites.prime(pid);
        let addr =
            a_rank_released_before_its_call_sites_are_named_gets_them_named as *const () as u64;
        r.figures = Some(Figures {
            ready: true,
            callsites: vec![RawSite {
                function: 1,
                addr: addr + 1,
                calls: 3,
                time_ns: 5,
            }],
            ..Figures::default()
        });
        r.exited_at = Some(Instant::now());
        r.exited_wall = Some(SystemTime::now());
        st.register(r);
        let first = st.collect();
        assert!(first.ranks[0].callsites[0].pending, "{first:?}");
        assert!(st.ranks[&pid].released, "its final figures are kept");
        let start = Instant::now();
        let site = loop {
            let s = st.collect();
            let site = s.ranks[0].callsites[0].clone();
            if !site.pending {
                break site;
            }
            assert!(start.elapsed() < Duration::from_secs(60), "never named");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert!(
            site.name
                .contains("a_rank_released_before_its_call_sites_are_named"),
            "{site:?}"
        );
        assert!(site.exported && site.calls == 3, "{site:?}");
        assert!(st.ranks[&pid].exited_sites.is_empty(), "kept no longer");
    }
}
