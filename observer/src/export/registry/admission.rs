//! Admission: whether a process may be attached, and what it costs. One
//! named with `--pid` always is; one found by `--all` must fit its user's
//! budgets and the maps' capacity.

use super::{Prepared, State};
use crate::attach::{
    budget::{self, Budget, Cost},
    probes::Probes,
};

/// How a process came to be attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Named with `--pid` by whoever started the daemon: attached whatever
    /// the budgets say (a full map still counts its lost calls).
    Named,
    /// Found by `--all`: its user's budgets and the maps' capacity apply.
    Found,
}

/// Call-site map entries reserved per probed process when call sites are
/// recorded: what the probes may create for it.
pub const SITES_PER_PROCESS: usize = 1_024;

impl State {
    /// What attaching `pid` would cost: its probes and map entries, and
    /// whether its shim times it (then it gets no probes).
    pub(super) fn cost(&self, p: &Prepared) -> Cost {
        if p.timed || self.probes.is_none() {
            return Cost::default();
        }
        let functions = self
            .functions
            .iter()
            .filter(|id| p.lib.entries.contains_key(id))
            .count();
        let sites = if self.probes.as_ref().is_some_and(Probes::callsites) {
            SITES_PER_PROCESS
        } else {
            0
        };
        Cost {
            probes: 2 * functions,
            map_entries: functions,
            site_entries: sites,
        }
    }

    /// The budget attaching `p` would exceed, if any: its user's, then the
    /// node's map capacity.
    pub(super) fn over_budget(&self, p: &Prepared, cost: Cost) -> Option<Budget> {
        let usage = budget::usage_by_uid(
            self.ranks
                .values()
                .map(|r| (r.uid, r.exited_at.is_none(), r.probes(), r.reserved)),
        );
        if let Some(b) = self
            .budgets
            .check(usage.get(&p.uid).copied().unwrap_or_default(), cost)
        {
            return Some(b);
        }
        // Each map on its own: neither may be overcommitted.
        if let Some(probes) = &self.probes {
            let stats: usize = usage.values().map(|u| u.map_entries).sum();
            let sites: usize = usage.values().map(|u| u.site_entries).sum();
            if stats + cost.map_entries > probes.stats_capacity() as usize
                || sites + cost.site_entries > probes.callsites_capacity() as usize
            {
                return Some(Budget::Capacity);
            }
        }
        (!budget::descriptors_left()).then_some(Budget::Descriptors)
    }
}
