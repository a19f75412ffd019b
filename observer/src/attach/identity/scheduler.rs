//! What the batch scheduler says of a rank's job: step, user, account,
//! partition, array job and task, read from the environment the scheduler
//! gave the rank. Exported once per job and node as `mpi_job_scheduler_info`
//! (joined in PromQL on `jobid`), never as labels on every series.
//!
//! The facts are claims: the process wrote its own environment. They are
//! taken only from the scheduler whose variable named the job (or Slurm's,
//! when the job came from its cgroup and the environment names the same
//! job), so a rank cannot pair one scheduler's job id with another's
//! account. Every value is made safe for a label here, once, at attach:
//! control characters become U+FFFD, and the value is cut to [`LABEL_CAP`]
//! bytes (the cut counted as `label="scheduler"`).

use super::{LABEL_CAP, cut};

/// A batch scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scheduler {
    /// Slurm (`SLURM_*`).
    Slurm,
    /// PBS Pro, OpenPBS or Torque (`PBS_*`).
    Pbs,
    /// Flux (`FLUX_JOB_ID`).
    Flux,
}

impl Scheduler {
    /// The `scheduler` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheduler::Slurm => "slurm",
            Scheduler::Pbs => "pbs",
            Scheduler::Flux => "flux",
        }
    }

    /// The scheduler whose job variable (one of [`super::JOB_VARS`]) `var`
    /// is; `None` for a launcher's (`PMIX_NAMESPACE`).
    pub fn of_job_var(var: &str) -> Option<Scheduler> {
        match var {
            "SLURM_JOB_ID" => Some(Scheduler::Slurm),
            "PBS_JOBID" => Some(Scheduler::Pbs),
            "FLUX_JOB_ID" => Some(Scheduler::Flux),
            _ => None,
        }
    }

    /// The variables of each fact, in order of precedence: the first
    /// non-empty one gives the value.
    fn vars(self) -> Vars {
        match self {
            Scheduler::Slurm => Vars {
                step: &["SLURM_STEP_ID", "SLURM_STEPID"],
                user: &["SLURM_JOB_USER"],
                account: &["SLURM_JOB_ACCOUNT"],
                partition: &["SLURM_JOB_PARTITION"],
                array_job: &["SLURM_ARRAY_JOB_ID"],
                array_task: &["SLURM_ARRAY_TASK_ID"],
            },
            // PBS has no steps. The queue is its partition. Torque names
            // the array index PBS_ARRAYID, PBS Pro PBS_ARRAY_INDEX (and the
            // array job PBS_ARRAY_ID); PBS_O_LOGNAME is the submitter.
            Scheduler::Pbs => Vars {
                step: &[],
                user: &["PBS_O_LOGNAME", "USER"],
                account: &["PBS_ACCOUNT"],
                partition: &["PBS_QUEUE"],
                array_job: &["PBS_ARRAY_ID"],
                array_task: &["PBS_ARRAYID", "PBS_ARRAY_INDEX"],
            },
            // A Flux job's tasks carry its id and nothing of the above.
            Scheduler::Flux => Vars {
                step: &[],
                user: &[],
                account: &[],
                partition: &[],
                array_job: &[],
                array_task: &[],
            },
        }
    }
}

/// Where each fact is read from.
struct Vars {
    step: &'static [&'static str],
    user: &'static [&'static str],
    account: &'static [&'static str],
    partition: &'static [&'static str],
    array_job: &'static [&'static str],
    array_task: &'static [&'static str],
}

/// A job's scheduler facts as one rank's environment gives them. An absent
/// fact is `""`, as Prometheus stores an empty label value: absent.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Facts {
    /// The scheduler.
    pub scheduler: Scheduler,
    /// The job step (Slurm; absent in a batch script and for the ranks
    /// `mpirun` starts itself there).
    pub step: String,
    /// The job's user, as the scheduler named it (claimed; the `uid` label
    /// is the kernel's).
    pub user: String,
    /// The account charged (Slurm without accounting: only with `-A`).
    pub account: String,
    /// The partition (Slurm) or queue (PBS).
    pub partition: String,
    /// The array job's id, for a task of a job array.
    pub array_job: String,
    /// The array task's index.
    pub array_task: String,
}

impl Facts {
    /// Only the scheduler, no claimed fact.
    pub fn bare(scheduler: Scheduler) -> Facts {
        Facts {
            scheduler,
            step: String::new(),
            user: String::new(),
            account: String::new(),
            partition: String::new(),
            array_job: String::new(),
            array_task: String::new(),
        }
    }

    /// The facts `scheduler` gave an environment, `get` looking a variable
    /// up (its first non-empty value), and whether a value was cut to
    /// [`LABEL_CAP`].
    pub fn read<'e>(scheduler: Scheduler, get: impl Fn(&str) -> Option<&'e [u8]>) -> (Facts, bool) {
        let vars = scheduler.vars();
        let mut cut_any = false;
        let mut fact = |names: &[&str]| {
            let Some(raw) = names.iter().find_map(|n| get(n)) else {
                return String::new();
            };
            let (v, was_cut) = label_value(raw);
            cut_any |= was_cut;
            v
        };
        let facts = Facts {
            scheduler,
            step: fact(vars.step),
            user: fact(vars.user),
            account: fact(vars.account),
            partition: fact(vars.partition),
            array_job: fact(vars.array_job),
            array_task: fact(vars.array_task),
        };
        (facts, cut_any)
    }

    /// The facts as `(label, value)`, in exposition order, values raw
    /// (not escaped).
    pub fn labels(&self) -> [(&'static str, &str); 7] {
        [
            ("scheduler", self.scheduler.as_str()),
            ("step", &self.step),
            ("user", &self.user),
            ("account", &self.account),
            ("partition", &self.partition),
            ("array_job", &self.array_job),
            ("array_task", &self.array_task),
        ]
    }
}

/// A user's bytes as a label value: invalid UTF-8 and control characters
/// (which would garble a terminal, a log or a dashboard) as U+FFFD, cut to
/// [`LABEL_CAP`] bytes on a character boundary; and whether it was cut.
pub fn label_value(raw: &[u8]) -> (String, bool) {
    let clean: String = String::from_utf8_lossy(raw)
        .chars()
        .map(|c| if c.is_control() { '\u{FFFD}' } else { c })
        .collect();
    let c = cut(&clean, LABEL_CAP);
    (c.to_string(), c.len() < clean.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a [u8])]) -> impl Fn(&str) -> Option<&'a [u8]> {
        move |n| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| *v)
    }

    #[test]
    fn slurm_task_of_a_step() {
        // What a task of `sbatch -A physics` step 0 has (docs/dev/slurm-spike.md).
        let e: &[(&str, &[u8])] = &[
            ("SLURM_JOB_ID", b"3"),
            ("SLURM_STEP_ID", b"0"),
            ("SLURM_STEPID", b"9"),
            ("SLURM_JOB_USER", b"mpiobs"),
            ("SLURM_JOB_ACCOUNT", b"physics"),
            ("SLURM_JOB_PARTITION", b"debug"),
        ];
        let (f, cut) = Facts::read(Scheduler::Slurm, env(e));
        assert!(!cut);
        assert_eq!(
            f.labels(),
            [
                ("scheduler", "slurm"),
                ("step", "0"),
                ("user", "mpiobs"),
                ("account", "physics"),
                ("partition", "debug"),
                ("array_job", ""),
                ("array_task", ""),
            ]
        );
    }

    #[test]
    fn slurm_batch_step_and_array_task() {
        // No SLURM_STEP_ID in the batch step: absent, not 0. No account
        // without -A. The older SLURM_STEPID alias stands in.
        let e: &[(&str, &[u8])] = &[
            ("SLURM_JOB_ID", b"6"),
            ("SLURM_ARRAY_JOB_ID", b"4"),
            ("SLURM_ARRAY_TASK_ID", b"2"),
        ];
        let (f, _) = Facts::read(Scheduler::Slurm, env(e));
        assert_eq!((f.step.as_str(), f.account.as_str()), ("", ""));
        assert_eq!((f.array_job.as_str(), f.array_task.as_str()), ("4", "2"));
        let (f, _) = Facts::read(Scheduler::Slurm, env(&[("SLURM_STEPID", b"1")]));
        assert_eq!(f.step, "1");
    }

    #[test]
    fn pbs_pro_and_torque() {
        let pro: &[(&str, &[u8])] = &[
            ("PBS_JOBID", b"1234[7].pbs01"),
            ("PBS_QUEUE", b"workq"),
            ("PBS_O_LOGNAME", b"alice"),
            ("USER", b"bob"),
            ("PBS_ACCOUNT", b"proj9"),
            ("PBS_ARRAY_ID", b"1234[].pbs01"),
            ("PBS_ARRAY_INDEX", b"7"),
        ];
        let (f, _) = Facts::read(Scheduler::Pbs, env(pro));
        assert_eq!(
            f.labels(),
            [
                ("scheduler", "pbs"),
                ("step", ""),
                ("user", "alice"),
                ("account", "proj9"),
                ("partition", "workq"),
                ("array_job", "1234[].pbs01"),
                ("array_task", "7"),
            ]
        );
        let torque: &[(&str, &[u8])] = &[("PBS_ARRAYID", b"3"), ("USER", b"bob")];
        let (f, _) = Facts::read(Scheduler::Pbs, env(torque));
        assert_eq!((f.user.as_str(), f.array_task.as_str()), ("bob", "3"));
    }

    #[test]
    fn flux_has_only_its_scheduler() {
        // A Flux job inside a Slurm allocation inherits SLURM_*: they are
        // the allocation's, not this job's, and are not taken.
        let e: &[(&str, &[u8])] = &[("FLUX_JOB_ID", b"f2"), ("SLURM_JOB_ACCOUNT", b"x")];
        let (f, cut) = Facts::read(Scheduler::Flux, env(e));
        assert_eq!(f, Facts::bare(Scheduler::Flux));
        assert!(!cut);
    }

    #[test]
    fn job_variables_name_their_scheduler() {
        for var in super::super::JOB_VARS {
            let s = Scheduler::of_job_var(var);
            assert_eq!(s.is_none(), *var == "PMIX_NAMESPACE", "{var}");
        }
    }

    #[test]
    fn hostile_values_are_neutralised_and_cut() {
        let long = "a".repeat(100_000);
        let e: &[(&str, &[u8])] = &[
            // A line break and quotes would forge series if not escaped;
            // escaping is the exposition's, control characters are ours.
            ("SLURM_JOB_USER", b"x\"} 1\nmpi_forged{a=\"b"),
            ("SLURM_JOB_ACCOUNT", b"a\x1b[31mred\rb\tc\x7f"),
            ("SLURM_JOB_PARTITION", b"\xff\xfebad utf8"),
            ("SLURM_STEP_ID", long.as_bytes()),
        ];
        let (f, cut) = Facts::read(Scheduler::Slurm, env(e));
        assert!(cut);
        assert_eq!(f.step.len(), LABEL_CAP);
        assert_eq!(f.user, "x\"} 1\u{FFFD}mpi_forged{a=\"b");
        assert_eq!(f.account, "a\u{FFFD}[31mred\u{FFFD}b\u{FFFD}c\u{FFFD}");
        assert_eq!(f.partition, "\u{FFFD}\u{FFFD}bad utf8");
        for (_, v) in f.labels() {
            assert!(!v.chars().any(char::is_control), "{v:?}");
            assert!(v.len() <= LABEL_CAP);
        }
        // A cut never splits a character.
        let wide = "é".repeat(LABEL_CAP);
        let (v, cut) = label_value(format!("x{wide}").as_bytes());
        assert!(cut);
        assert_eq!(v.len(), LABEL_CAP - 1);
        assert_eq!(label_value(b"ok"), ("ok".to_string(), false));
    }
}
