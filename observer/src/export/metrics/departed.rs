//! What the ranks of a job that this node no longer holds had counted.
//!
//! The job-level counters on `/metrics` are sums over a node's ranks of the
//! job. A rank that exited is kept for `--retain-exited`, then forgotten;
//! were its figures simply left out from then on, the job's sums would
//! fall while its other ranks run, and `rate()` would read the fall as a
//! counter reset: a spike of the whole remaining sum. So a forgotten rank's
//! final figures are folded here, per job, and added to the job's sums for
//! as long as any rank of that job remains on the node. When none does,
//! the job's series end together and its entry is dropped.
//!
//! Bounded: one entry per job held, each the size of one rank's sums
//! (functions, call-site names, peer nodes), whatever the ranks folded.

use std::collections::{BTreeMap, BTreeSet};

use observer_common::maps::CallStats;

use super::{
    peers::{add, peer_node},
    rank::{SEGMENT_COUNTERS, rank_sites},
};
use crate::collect::snapshot::{Directed, RankSnapshot};

/// One job's departed ranks, summed as the job-level families sum ranks.
#[derive(Clone, Debug, Default)]
pub struct Departed {
    /// Per function, as `mpi_job_calls_total` and the histogram sum them.
    pub(super) calls: BTreeMap<u16, CallStats>,
    /// Per (function, call-site series name: a named site or `other`).
    pub(super) sites: BTreeMap<(u16, String), (u64, u64)>,
    /// Whether any of them had a stats segment.
    pub(super) segments: bool,
    /// Per peer node: messages and bytes.
    pub(super) peers: BTreeMap<String, (Directed, Directed)>,
    /// The segment counters, in [`SEGMENT_COUNTERS`]'s order.
    pub(super) counters: [u64; 7],
    /// Nanoseconds in MPI, all functions.
    pub(super) mpi_ns: u64,
    /// Their world ranks: a peer among them was on this node.
    pub(super) world_ranks: BTreeSet<String>,
    /// Ranks folded in.
    pub ranks: u64,
}

/// Every job's [`Departed`], by the job's labels; kept across collections
/// by [`crate::export::registry::State`].
#[derive(Clone, Debug, Default)]
pub struct DepartedJobs(BTreeMap<String, Departed>);

impl DepartedJobs {
    /// Adds the final figures of `r`, a rank about to be forgotten. `local`
    /// says whether a world rank of its job is (or was) on this node, and
    /// `node` is this node's name, as the job's peer series have them.
    pub fn fold(&mut self, r: &RankSnapshot, local: impl Fn(&str) -> bool, node: &str) {
        let d = self.0.entry(r.labels.job.clone()).or_default();
        d.ranks += 1;
        d.world_ranks.insert(r.identity.rank.clone());
        d.mpi_ns = d.mpi_ns.saturating_add(super::detail::mpi_ns(r));
        if let Some(calls) = &r.calls {
            for (id, st) in calls.iter() {
                d.calls.entry(*id).or_insert(CallStats::ZERO).add(st);
            }
            for (id, site, (n, ns)) in rank_sites(r, calls) {
                let s = d.sites.entry((id, site.to_string())).or_default();
                s.0 = s.0.saturating_add(n);
                s.1 = s.1.saturating_add(ns);
            }
        }
        if let Some(s) = &r.segment {
            let f = &s.figures;
            d.segments = true;
            for (c, (_, _, value)) in d.counters.iter_mut().zip(SEGMENT_COUNTERS) {
                *c = c.saturating_add(value(f));
            }
            for (peer, t) in &f.peers {
                // A rank of the job forgotten earlier was on this node too.
                let here = |p: &str| local(p) || d.world_ranks.contains(p);
                let node = peer_node(r, *peer, &here, node);
                let p = d.peers.entry(node).or_default();
                add(&mut p.0, t.messages);
                add(&mut p.1, t.bytes);
            }
        }
    }

    /// Drops the jobs for which `held` is false: none of their ranks
    /// remains, so their series end.
    pub fn retain(&mut self, held: impl Fn(&str) -> bool) {
        self.0.retain(|job, _| held(job));
    }

    /// The departed ranks of the job with these labels.
    pub fn get(&self, job: &str) -> Option<&Departed> {
        self.0.get(job)
    }

    /// Every job with departed ranks.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Departed)> {
        self.0.iter().map(|(j, d)| (j.as_str(), d))
    }
}
