//! Processes judged not to be MPI, shared by `--all`'s scan and the exit
//! handover's knocks, so neither reads their maps again and again. The
//! attacher puts here too an MPI rank it found after its stats segment was
//! gone (past its `MPI_Finalize`, its figures lost): not to be looked at
//! again in the moment it has left, so it is said once.
//!
//! A process is known by its pid and start ticks, with its command name at
//! the judgement: `exec` keeps the pid and start time but changes the name,
//! so a process seen between fork and exec (slurmstepd's task before it
//! execs the rank, a wrapper script that execs MPI later) is looked at
//! again once its name changes, instead of being missed for its whole
//! life. The name is the process's own word (`prctl(PR_SET_NAME)`), so a
//! knock is worth a new look only [`MAX_LOOKS`] times per process: one
//! that renames itself before every knock costs the daemon no more than
//! that. The scan, once a second, re-reads a renamed process as before.

use std::{
    collections::{HashMap, HashSet},
    sync::{Mutex, PoisonError},
};

/// Judgements per process after which a knock no longer earns a new look,
/// whatever its name now: a fork, a wrapper's exec and the rank's exec
/// take three.
pub const MAX_LOOKS: u32 = 4;

#[derive(Debug)]
struct Judged {
    comm: String,
    looks: u32,
}

/// The set, behind its own lock (never held while /proc is read).
#[derive(Debug, Default)]
pub struct NotMpi {
    judged: Mutex<HashMap<(u32, u64), Judged>>,
}

impl NotMpi {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(u32, u64), Judged>> {
        self.judged.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the process was judged not MPI under the name `comm` (the
    /// scan's test: a new name is a new look).
    pub fn holds(&self, pid: u32, ticks: u64, comm: &str) -> bool {
        self.lock()
            .get(&(pid, ticks))
            .is_some_and(|j| j.comm == comm)
    }

    /// Whether a knock from the process is answered without a look: judged
    /// not MPI under the name `comm`, or looked at [`MAX_LOOKS`] times
    /// already.
    pub fn settled(&self, pid: u32, ticks: u64, comm: &str) -> bool {
        self.lock()
            .get(&(pid, ticks))
            .is_some_and(|j| j.comm == comm || j.looks >= MAX_LOOKS)
    }

    /// Records a judgement: the process, named `comm`, maps no MPI library.
    pub fn insert(&self, pid: u32, ticks: u64, comm: String) {
        let mut m = self.lock();
        let j = m.entry((pid, ticks)).or_insert(Judged {
            comm: String::new(),
            looks: 0,
        });
        j.comm = comm;
        j.looks = j.looks.saturating_add(1);
    }

    /// Keeps only the processes in `alive` (a scan's view of /proc), so the
    /// set stays small. A process judged after the scan listed /proc and
    /// dropped here costs at most one more look.
    pub fn retain(&self, alive: &HashSet<(u32, u64)>) {
        self.lock().retain(|k, _| alive.contains(k));
    }

    /// Processes held.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::procfs;

    #[test]
    fn a_renamed_process_is_looked_at_again_but_not_for_ever() {
        let n = NotMpi::default();
        assert!(!n.holds(5, 9, "bash") && !n.settled(5, 9, "bash"));
        n.insert(5, 9, "bash".into());
        assert!(n.holds(5, 9, "bash") && n.settled(5, 9, "bash"));
        // Another process (the pid reused) is not judged.
        assert!(!n.settled(5, 10, "bash"));
        // Renamed (an exec, or prctl): a new look, for the scan and a knock.
        assert!(!n.holds(5, 9, "halo") && !n.settled(5, 9, "halo"));
        for i in 1..MAX_LOOKS {
            assert!(!n.settled(5, 9, "another"), "after look {i}");
            n.insert(5, 9, format!("name{i}"));
        }
        // Judged MAX_LOOKS times: a knock under any name is answered
        // without a look; the scan still looks at a new name.
        assert!(n.settled(5, 9, "another"));
        assert!(!n.holds(5, 9, "another"));
    }

    #[test]
    fn processes_gone_are_forgotten() {
        let n = NotMpi::default();
        let me = std::process::id();
        let ticks = procfs::start_ticks(me).unwrap();
        n.insert(me, ticks, "me".into());
        n.insert(me, ticks + 1, "an earlier holder of my pid".into());
        n.insert(u32::MAX - 1, 1, "none".into());
        n.retain(&[(me, ticks)].into_iter().collect());
        assert_eq!(n.len(), 1);
        assert!(n.holds(me, ticks, "me"));
    }
}
