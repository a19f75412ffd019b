//! A rank's life in the state: committed (its probes attached unless its
//! shim times it), its datatypes looked at again, handed over to a shim
//! injected into it, noticed exited, its map entries released, retained for
//! `--retain-exited`, then forgotten, its final figures folded into its
//! job's departed sums.

use std::time::{Duration, Instant, SystemTime};

use super::{Admission, AttachError, Prepared, Rank, State, prepare, rank::adoption_line};
use crate::{
    attach::budget::Cost,
    attach::datatypes,
    attach::identity::Label,
    collect::segment::Segment,
    collect::snapshot::{RankSnapshot, SegmentProblem},
    os::procfs,
};

/// How often, at most, exited ranks' map entries are released.
const RELEASE_EVERY: Duration = Duration::from_secs(1);

impl State {
    /// Attaches to `pid` now, on this thread: [`prepare()`] then
    /// [`State::commit`]. Holding the state lock across the file reads is
    /// what the daemon avoids (its attacher prepares without the lock); this
    /// is for callers that hold nothing else up. Re-attaching to a pid
    /// already observed is a no-op.
    pub fn attach(&mut self, pid: u32) -> Result<(), AttachError> {
        let ticks = procfs::start_ticks(pid)?;
        if self.ranks.get(&pid).is_some_and(|r| r.ticks == ticks) {
            return Ok(());
        }
        let prepared = prepare(pid, ticks);
        self.commit(prepared, Admission::Named)
    }

    /// Registers a prepared process: for one `--all` found, checks its
    /// user's budgets and the maps' capacity; attaches its probes (unless
    /// its shim times it) and records it. Counts a failure. Re-attaching to
    /// a pid already observed (same start time) is a no-op.
    pub fn commit(
        &mut self,
        prepared: Result<Prepared, AttachError>,
        admission: Admission,
    ) -> Result<(), AttachError> {
        let result = prepared.and_then(|p| {
            if self.ranks.get(&p.pid).is_some_and(|r| r.ticks == p.ticks) {
                return Ok(());
            }
            let (pid, ticks) = (p.pid, p.ticks);
            // A rank exiting as its links are made fails them (its
            // /proc/PID/root/... is gone): looked at right after.
            self.try_commit(p, admission)
                .map_err(|e| e.or_exited(pid, procfs::liveness(pid, ticks)))
        });
        if let Err(e) = &result {
            match e {
                AttachError::Refused { uid, budget, .. } => self.selfm.refused(*uid, *budget),
                AttachError::Exited { .. } => self.selfm.attach_exited.inc(),
                // Offered again; the attacher counts it when it gives up.
                AttachError::Loading { .. } => {}
                AttachError::SegmentGone { .. } => self.selfm.segment_error(SegmentProblem::Gone),
                _ => self.selfm.attach_failures.inc(),
            }
        }
        result
    }

    fn try_commit(&mut self, p: Prepared, admission: Admission) -> Result<(), AttachError> {
        let pid = p.pid;
        let cost = self.cost(&p);
        let over = match admission {
            Admission::Found => self.over_budget(&p, cost),
            Admission::Named => None,
        };
        if let Some(budget) = over {
            if let Some(line) = self.refusals.line(p.uid, pid, budget, &self.budgets) {
                log::warn!("{line}");
            }
            self.refused.insert((pid, p.ticks), p.uid);
            return Err(AttachError::Refused {
                pid,
                uid: p.uid,
                budget,
            });
        }
        // A new process reusing the pid of an exited rank: the maps are
        // keyed by pid, so the old rank's figures, probes and datatype
        // entries must go before the new ones go in; its final figures go
        // to its job's departed sums first, as at its expiry.
        if self.ranks.contains_key(&pid) {
            let last = match self.exited_figures.remove(&pid) {
                Some(r) => Some(r),
                None => self.collect().ranks.into_iter().find(|r| r.pid == pid),
            };
            if let Some(r) = last {
                self.fold_departed(&r);
            }
            self.forget(pid);
        }
        let config = datatypes::proc_config(&p.lib, &p.datatypes, self.bytes);
        let pending_datatypes = (self.bytes
            && !p.timed
            && self.probes.is_some()
            && p.lib.kind == observer_common::maps::lib_kind::OPEN_MPI
            && p.datatypes.derived.is_none())
        .then(|| p.located.clone());
        let attachment = match self.probes.as_mut() {
            Some(probes) if !p.timed => Some(probes.attach(
                pid,
                &p.host_path,
                &p.map,
                &p.lib,
                config,
                &p.datatypes.sizes,
                &self.functions,
            )?),
            _ => None,
        };
        if let Some(a) = &attachment {
            self.selfm.probes.add(a.probes as i64);
        }
        self.selfm.count_identity(&p.identity);
        self.ranks.insert(
            pid,
            Rank {
                pid,
                ticks: p.ticks,
                uid: p.uid,
                reserved: cost,
                labels: self.distinct_labels(&p.identity, pid),
                identity: p.identity,
                library: p.lib.name,
                version: self.selfm.capped(Label::Version, &p.lib.version),
                comm: p.comm,
                started_at: procfs::ticks_to_time(p.ticks),
                // An adopted rank's figures count from its first attach.
                attached_at: attachment
                    .as_ref()
                    .and_then(|a| a.since)
                    .unwrap_or_else(SystemTime::now),
                exited_at: None,
                exited_wall: None,
                attachment,
                segment: p.segment,
                segment_problem: None,
                wait_cursor: 0,
                segment_look: (std::time::Instant::now(), super::rank::FIRST_LOOK),
                figures: None,
                injected: p.adopted,
                adopted: p.adopted,
                injecting: false,
                lib_kind: config.lib,
                lib_path: p.map.path.clone(),
                sites: p.sites,
                pending_datatypes,
                released: false,
                exited_sites: Vec::new(),
            },
        );
        self.selfm.attached.set(self.attached_count() as i64);
        if p.adopted {
            self.selfm.injected.inc();
            log::info!("{}", adoption_line(pid));
        }
        Ok(())
    }

    /// What to inspect rank `pid`'s datatypes again with, if they did not
    /// check out when it was attached (it had not initialised MPI yet) and
    /// it still carries its probes.
    pub fn datatypes_pending(
        &self,
        pid: u32,
        ticks: u64,
    ) -> Option<std::sync::Arc<datatypes::Located>> {
        let r = self.ranks.get(&pid).filter(|r| r.ticks == ticks)?;
        if r.exited_at.is_some() || r.attachment.is_none() {
            return None;
        }
        r.pending_datatypes.clone()
    }

    /// Applies datatypes found once rank `pid` initialised MPI: from then
    /// on, derived types' bytes are read too.
    pub fn apply_datatypes(&mut self, pid: u32, dt: &datatypes::Datatypes) {
        let Some(derived) = dt.derived else { return };
        let (Some(r), Some(probes)) = (self.ranks.get_mut(&pid), self.probes.as_mut()) else {
            return;
        };
        let Some(att) = r.attachment.as_mut() else {
            return;
        };
        if probes
            .update_datatypes(pid, att, &dt.sizes, derived)
            .is_ok()
        {
            r.pending_datatypes = None;
        }
    }

    /// Holds `rank` from now on as an attach does: with labels unlike every
    /// other rank's (see [`State::distinct_labels`]), what was cut of its
    /// identity counted. For synthetic ranks (the golden test).
    #[doc(hidden)]
    pub fn register(&mut self, mut rank: Rank) {
        rank.labels = self.distinct_labels(&rank.identity, rank.pid);
        self.selfm.count_identity(&rank.identity);
        self.ranks.insert(rank.pid, rank);
    }

    fn attached_count(&self) -> usize {
        self.ranks
            .values()
            .filter(|r| r.attachment.is_some())
            .count()
    }

    /// Notices ranks that exited, detaching their probes; their figures stay.
    /// Returns the pids that just exited.
    pub fn notice_exits(&mut self) -> Vec<u32> {
        let mut exited = Vec::new();
        for r in self.ranks.values_mut() {
            if r.exited_at.is_some() {
                continue;
            }
            match procfs::liveness(r.pid, r.ticks) {
                procfs::Liveness::Alive => {}
                procfs::Liveness::Exited => {
                    r.exited_at = Some(Instant::now());
                    r.exited_wall = Some(SystemTime::now());
                    exited.push(r.pid);
                }
                // Out of descriptors or memory: nothing is known, and a
                // live rank must never be detached as exited. Counted, and
                // asked again at the next tick.
                procfs::Liveness::Unknown => self.selfm.proc_read_errors.inc(),
            }
        }
        // Room freed: that user's refused processes get another chance.
        let freed: std::collections::HashSet<u32> = exited
            .iter()
            .filter_map(|pid| self.ranks.get(pid).map(|r| r.uid))
            .collect();
        self.refused.retain(|_, uid| !freed.contains(uid));
        for pid in &exited {
            self.detach(*pid);
            if self.ranks.get(pid).is_some_and(|r| r.injected) {
                self.selfm.injected.dec();
            }
        }
        // Exited ranks' final figures, kept, and their map entries freed
        // now, not after --retain-exited (see `release_exited`); at most
        // once a second, as a collection holds the state a while.
        if self.probes.is_some()
            && self.last_release.elapsed() >= RELEASE_EVERY
            && self
                .ranks
                .values()
                .any(|r| r.exited_at.is_some() && !r.released)
        {
            self.last_release = Instant::now();
            self.collect();
        }
        exited
    }

    /// Folds `r`, the final figures of a rank about to be forgotten, into
    /// its job's [`DepartedJobs`], so the job's counters never fall.
    ///
    /// [`DepartedJobs`]: crate::export::metrics::departed::DepartedJobs
    fn fold_departed(&mut self, r: &RankSnapshot) {
        let node = self.render.node();
        let held = |rank: &str| {
            self.ranks
                .values()
                .any(|h| h.labels.job == r.labels.job && h.identity.rank == rank)
        };
        self.departed.fold(r, held, node);
    }

    /// Frees the map entries of the exited ranks whose final figures
    /// [`State::collect`] has kept, and the budget they held: from then on
    /// a snapshot shows those kept figures. Without this, a user's many
    /// short jobs filled their map budget with ranks long gone, and their
    /// next ranks were refused for the whole of --retain-exited.
    pub(super) fn release_exited(&mut self) {
        let done: Vec<u32> = self
            .ranks
            .values()
            .filter(|r| {
                r.exited_at.is_some() && !r.released && self.exited_figures.contains_key(&r.pid)
            })
            .map(|r| r.pid)
            .collect();
        for pid in done {
            if let Some(p) = self.probes.as_mut() {
                p.forget(pid);
            }
            if let Some(r) = self.ranks.get_mut(&pid) {
                r.released = true;
                r.reserved = Cost::default();
            }
        }
    }

    /// Forgets ranks that exited longer than `retain` ago, and the
    /// configuration of processes whose probes are all gone.
    ///
    /// A forgotten rank's final figures are folded into its job's
    /// [`DepartedJobs`] while other ranks of the job remain, so the job's
    /// counters never fall.
    ///
    /// [`DepartedJobs`]: crate::export::metrics::departed::DepartedJobs
    pub fn expire(&mut self, retain: Duration) {
        let expired: Vec<u32> = self
            .ranks
            .values()
            .filter(|r| r.exited_at.is_some_and(|t| t.elapsed() >= retain))
            .map(|r| r.pid)
            .collect();
        if expired.is_empty() {
            return self.expire_rest();
        }
        if expired.iter().any(|p| !self.exited_figures.contains_key(p)) {
            // Exited and expired between two collections: read them now.
            self.collect();
        }
        for pid in &expired {
            if let Some(r) = self.exited_figures.remove(pid) {
                self.fold_departed(&r);
            }
        }
        for pid in expired {
            self.forget(pid);
        }
        let ranks = &self.ranks;
        self.departed
            .retain(|job| ranks.values().any(|r| r.labels.job == job));
        self.expire_rest();
    }

    /// The rest of [`State::expire`]: refusals of processes gone, and the
    /// probes' own leftovers.
    fn expire_rest(&mut self) {
        self.refused
            .retain(|(pid, ticks), _| procfs::liveness(*pid, *ticks) != procfs::Liveness::Exited);
        if let Some(p) = self.probes.as_mut() {
            p.reap();
        }
    }

    /// Ends the probes of a rank the shim was injected into, once the
    /// probes have no call of it open (docs/inject.md, "Handover"): what
    /// they counted stays in the map and the segment adds to it.
    pub fn hand_over_injected(&mut self, pid: u32) {
        self.detach(pid);
        if let Some(r) = self.ranks.get_mut(&pid) {
            r.injecting = false;
            // Held from now on, so the shim's figures are read even if the
            // rank exits before the next collection.
            if r.segment.is_none() {
                r.segment = Segment::open(pid).ok().flatten();
            }
            if !r.injected {
                r.injected = true;
                self.selfm.injected.inc();
            }
        }
    }

    /// Holds `seg` as rank `pid`'s segment (started at `ticks`) unless it
    /// has one: the shim's exit handover (crate::daemon::exit_handover).
    pub fn hold_segment(&mut self, pid: u32, ticks: u64, seg: Segment) {
        if let Some(r) = self.ranks.get_mut(&pid)
            && r.ticks == ticks
            && r.segment.is_none()
        {
            r.segment = Some(seg);
        }
    }

    /// The rank of `pid`, if attached.
    pub fn rank(&self, pid: u32) -> Option<&Rank> {
        self.ranks.get(&pid)
    }

    pub(super) fn detach(&mut self, pid: u32) {
        if let Some(att) = self.ranks.get_mut(&pid).and_then(|r| r.attachment.take()) {
            self.selfm.probes.sub(att.probes as i64);
            if let Some(p) = self.probes.as_mut() {
                p.detach(pid, att);
            }
        }
        self.selfm.attached.set(self.attached_count() as i64);
    }

    /// Drops a rank and its statistics.
    pub fn forget(&mut self, pid: u32) {
        self.exited_figures.remove(&pid);
        self.detach(pid);
        if let Some(seg) = self.ranks.remove(&pid).and_then(|r| r.segment) {
            // A rank killed by a signal never unlinked its segment.
            seg.remove_if_orphaned(pid);
        }
        if let Some(p) = self.probes.as_mut() {
            p.forget(pid);
        }
    }

    /// Detaches everything (shutdown).
    pub fn detach_all(&mut self) {
        let pids: Vec<u32> = self.ranks.keys().copied().collect();
        for pid in pids {
            self.detach(pid);
        }
        if let Some(p) = self.probes.as_mut() {
            p.finish_detaching();
        }
    }

    /// Marks `pid` as being injected into by this daemon, or no longer.
    pub fn set_injecting(&mut self, pid: u32, on: bool) {
        if let Some(r) = self.ranks.get_mut(&pid) {
            r.injecting = on;
        }
    }

    /// Whether any rank is still running.
    pub fn any_running(&self) -> bool {
        self.ranks.values().any(|r| r.exited_at.is_none())
    }
}
