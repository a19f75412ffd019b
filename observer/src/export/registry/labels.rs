//! The labels a rank is held under: unlike those of every other rank held,
//! a job's next step told apart by its step, and conflicts counted and said
//! once.

use std::collections::HashSet;

use super::State;
use crate::{attach::identity::Identity, collect::snapshot::Labels};

impl State {
    /// The labels of `pid`, a rank about to be registered, unlike those of
    /// every rank held (running or retained). A rank of another step of the
    /// job than the holder of its plain labels (a batch job's next `srun`,
    /// while the last one's ranks are retained) is no conflict: it gets
    /// [`Labels::of_step`]. Any other conflict is counted and said once.
    pub(super) fn distinct_labels(&self, identity: &Identity, pid: u32) -> Labels {
        self.check_scheduler(identity);
        let taken: HashSet<&str> = self
            .ranks
            .values()
            .map(|r| r.labels.rank.as_str())
            .collect();
        let plain = Labels::new(identity);
        let step = |i: &Identity| i.scheduler.as_deref().map(|f| f.step.clone());
        if let Some(holder) = self.ranks.values().find(|r| r.labels.rank == plain.rank)
            && step(&holder.identity) != step(identity)
            && let Some(labels) = Labels::of_step(identity, &taken)
        {
            return labels;
        }
        let (labels, conflict) = Labels::distinct(identity, pid, &taken);
        if conflict {
            self.selfm.identity_conflicts.inc();
            log::warn!(
                "pid {pid} claims rank {:?} of job {:?} (uid {}), which another process holds; its series carry {}",
                identity.rank,
                identity.jobid,
                identity.uid,
                labels.rank
            );
        }
        labels
    }

    /// Counts, and says once per rank, a rank whose scheduler facts differ
    /// from those of a running rank of its job (job id and uid) already
    /// held: one series per job and node shows one rank's. Exited ranks do
    /// not count: a job's next step on this node follows its last.
    fn check_scheduler(&self, identity: &Identity) {
        let job = Labels::new(identity).job;
        let Some(other) = self.ranks.values().find(|r| {
            r.exited_at.is_none()
                && r.labels.job == job
                && r.identity.scheduler != identity.scheduler
        }) else {
            return;
        };
        self.selfm.scheduler_conflict();
        log::warn!(
            "rank {:?} of job {:?} (uid {}) has other scheduler facts ({:?}) than pid {} ({:?}); the job's lowest rank's are exported",
            identity.rank,
            identity.jobid,
            identity.uid,
            identity.scheduler.as_deref().map(|f| f.labels()),
            other.pid,
            other.identity.scheduler.as_deref().map(|f| f.labels()),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::collect::snapshot::STEP_SUFFIX_CAP;
    use crate::{
        attach::identity::scheduler::{Facts, Scheduler},
        export::metrics::RenderOptions,
        export::registry::Rank,
    };

    fn of_step(pid: u32, rank: u32, step: Option<&str>) -> Rank {
        let mut r = Rank::synthetic(pid, rank, "27");
        r.identity.scheduler = step.map(|s| {
            let mut f = Facts::bare(Scheduler::Slurm);
            f.step = s.into();
            Arc::new(f)
        });
        r
    }

    fn rank_label(st: &State, pid: u32) -> String {
        let l = &st.ranks[&pid].labels.rank;
        l.rsplit_once("rank=\"")
            .unwrap()
            .1
            .trim_end_matches('"')
            .into()
    }
    #[test]
    fn a_jobs_next_step_is_labelled_by_its_step_not_as_a_conflict() {
        let mut st = State::new(None, Vec::new(), true, RenderOptions::default());
        st.register(of_step(10, 0, Some("0")));
        st.register(of_step(11, 1, Some("0")));
        // Step 1's ranks while step 0's are held (running or retained).
        st.register(of_step(20, 0, Some("1")));
        st.register(of_step(21, 1, Some("1")));
        st.register(of_step(30, 0, Some("2")));
        assert_eq!(rank_label(&st, 10), "0");
        assert_eq!(rank_label(&st, 11), "1");
        assert_eq!(rank_label(&st, 20), "0#step1");
        assert_eq!(rank_label(&st, 21), "1#step1");
        assert_eq!(rank_label(&st, 30), "0#step2");
        assert_eq!(st.selfm.identity_conflicts.get(), 0);
        // Two processes claiming one rank of one step are a conflict.
        st.register(of_step(40, 0, Some("1")));
        assert_eq!(rank_label(&st, 40), "0#pid40");
        // As is a rank with no step (a batch script's) after one with.
        st.register(of_step(50, 1, None));
        assert_eq!(rank_label(&st, 50), "1#pid50");
        assert_eq!(st.selfm.identity_conflicts.get(), 2);
    }

    #[test]
    fn a_step_label_is_only_made_of_a_short_plain_step() {
        let mut st = State::new(None, Vec::new(), true, RenderOptions::default());
        st.register(of_step(10, 0, Some("0")));
        st.register(of_step(20, 0, Some("x\"y")));
        st.register(of_step(30, 0, Some(&"9".repeat(STEP_SUFFIX_CAP + 1))));
        assert_eq!(rank_label(&st, 20), "0#pid20");
        assert_eq!(rank_label(&st, 30), "0#pid30");
    }
}
