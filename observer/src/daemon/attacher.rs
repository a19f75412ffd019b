//! The attacher: one thread that attaches new processes one at a time, off
//! the state lock and off the runtime thread, fairly between users, and
//! paced.
//!
//! - **Off the lock.** A process is read ([`registry::prepare`]: its maps,
//!   environment, library file, datatypes, segment) without the state lock;
//!   only [`State::commit`] (budgets, probes, registration) takes it, one
//!   process at a time, so a scrape waits for one attach at most, never for
//!   a burst of them.
//! - **Fair.** Candidates wait in one queue per uid, served round-robin: a
//!   user who starts 4,000 processes delays another user's job by one
//!   attach per round, not by 4,000. The queues together hold at most
//!   [`QUEUE_CAP`] candidates; past it a candidate is dropped and counted,
//!   and the next scan finds it again.
//! - **Paced.** Registering uprobes takes the kernel's global
//!   `dup_mmap_sem`, which every `fork()` on the node also needs. After each
//!   attach the thread rests as long as registering its probes took (at
//!   least [`MIN_REST`]), so the lock is held at most half the time and
//!   forks in between go through.

use std::{
    cmp::Reverse,
    collections::{BTreeMap, BinaryHeap, HashMap, HashSet, VecDeque},
    sync::{Arc, Condvar, Mutex, PoisonError},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::not_mpi::NotMpi;
use crate::export::registry::{self, AttachError, State};

/// Candidates waiting, all users together.
pub const QUEUE_CAP: usize = 16_384;
/// The shortest rest between two attaches.
pub const MIN_REST: Duration = Duration::from_millis(2);
/// How many times a process found with its MPI library mapped but not the
/// library's code ([`AttachError::Loading`]) is tried, one scan (a second)
/// apart, before it is refused with its line: the dynamic loader maps the
/// code microseconds after the file, so only a process that never does
/// (a user's file named so) gets that far, and it costs this many looks.
pub const LOADING_TRIES: u32 = 10;
/// Processes remembered as loading at most; past it, the gone are
/// forgotten, then all.
const LOADING_CAP: usize = 4_096;
/// When an Open MPI rank attached before it initialised its datatypes
/// (found as it started) has them looked at again, after its attach; then
/// every [`DATATYPE_REVISIT_EVERY`] while it runs. A look reads a few
/// dozen words of its memory (`datatypes::check`), so it need not stop:
/// a fixed last look (60 s) lost every derived type's bytes of ranks whose
/// MPI_Init took longer, as it can on a slow file system, at 64 k ranks,
/// or in the test VMs.
pub const DATATYPE_REVISITS: [Duration; 4] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(500),
    Duration::from_secs(1),
];
/// See [`DATATYPE_REVISITS`].
pub const DATATYPE_REVISIT_EVERY: Duration = Duration::from_secs(1);

enum Work {
    Attach(Candidate),
    Revisit(u32, u64, usize),
}

/// A process to look at: its pid, start time and real uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The pid.
    pub pid: u32,
    /// Its start time in ticks (the pid's identity).
    pub ticks: u64,
    /// Its real uid.
    pub uid: u32,
}

#[derive(Default)]
struct Queue {
    by_uid: BTreeMap<u32, VecDeque<Candidate>>,
    /// Ranks whose datatypes are looked at again: (when, pid, ticks, tries).
    revisits: BinaryHeap<Reverse<(Instant, u32, u64, usize)>>,
    /// (pid, ticks) queued or being attached, so nothing is queued twice.
    pending: HashSet<(u32, u64)>,
    /// Processes found mapping their MPI library but not its code yet
    /// ([`AttachError::Loading`]), and how many times.
    loading: HashMap<(u32, u64), u32>,
    /// The uid served last: the next is the one after it.
    last_uid: Option<u32>,
    len: usize,
    closed: bool,
}

impl Queue {
    fn pop(&mut self) -> Option<Candidate> {
        let uid = match self.last_uid {
            Some(last) => self
                .by_uid
                .range(last + 1..)
                .next()
                .or_else(|| self.by_uid.iter().next())
                .map(|(u, _)| *u)?,
            None => *self.by_uid.keys().next()?,
        };
        let q = self.by_uid.get_mut(&uid)?;
        let c = q.pop_front();
        if q.is_empty() {
            self.by_uid.remove(&uid);
        }
        self.last_uid = Some(uid);
        self.len -= usize::from(c.is_some());
        c
    }
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// What the attacher calls after each attach that worked (the daemon
/// starts an injection there, with `--inject`).
pub type OnAttached = Box<dyn Fn(u32) + Send>;

/// Handle on the attacher thread.
pub struct Attacher {
    queue: AttachQueue,
    thread: Option<JoinHandle<()>>,
}

/// Where candidates are submitted; cheap to clone, for other threads (the
/// exec watcher).
#[derive(Clone)]
pub struct AttachQueue {
    shared: Arc<Shared>,
}

impl Attacher {
    /// Starts the thread, which attaches into `state` and calls
    /// `on_attached` after each success. A rank found after its segment
    /// was gone goes into `not_mpi` (shared with the scan), which then
    /// passes it by as it does a process that is not MPI: said once.
    pub fn start(
        state: Arc<Mutex<State>>,
        not_mpi: Arc<NotMpi>,
        on_attached: OnAttached,
    ) -> Attacher {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("attacher".into())
            .spawn(move || run(&s, &state, &not_mpi, &on_attached))
            .expect("spawn the attacher thread");
        Attacher {
            queue: AttachQueue { shared },
            thread: Some(thread),
        }
    }

    /// A handle to submit candidates from another thread.
    pub fn handle(&self) -> AttachQueue {
        self.queue.clone()
    }

    /// See [`AttachQueue::submit`].
    pub fn submit(&self, c: Candidate) -> bool {
        self.queue.submit(c)
    }

    /// See [`AttachQueue::is_pending`].
    pub fn is_pending(&self, pid: u32, ticks: u64) -> bool {
        self.queue.is_pending(pid, ticks)
    }

    /// Stops the thread after the attach under way, dropping what waits.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let shared = &self.queue.shared;
        {
            let mut q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
            q.closed = true;
            q.by_uid.clear();
            q.len = 0;
        }
        shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl AttachQueue {
    /// Queues `c` unless it is queued already; `false` if the queue is
    /// full (the caller counts it).
    pub fn submit(&self, c: Candidate) -> bool {
        let mut q = self
            .shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if q.closed || !q.pending.insert((c.pid, c.ticks)) {
            return true;
        }
        if q.len >= QUEUE_CAP {
            q.pending.remove(&(c.pid, c.ticks));
            return false;
        }
        q.by_uid.entry(c.uid).or_default().push_back(c);
        q.len += 1;
        drop(q);
        self.shared.wake.notify_one();
        true
    }

    /// Whether `pid` (started at `ticks`) is queued or being attached.
    pub fn is_pending(&self, pid: u32, ticks: u64) -> bool {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pending
            .contains(&(pid, ticks))
    }

    /// Candidates waiting now.
    pub fn queued(&self) -> usize {
        self.shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len
    }
}

impl Drop for Attacher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run(shared: &Shared, state: &Mutex<State>, not_mpi: &NotMpi, on_attached: &OnAttached) {
    loop {
        let work = {
            let mut q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if q.closed {
                    return;
                }
                let now = Instant::now();
                if let Some(&Reverse((t, pid, ticks, n))) = q.revisits.peek()
                    && t <= now
                {
                    q.revisits.pop();
                    break Work::Revisit(pid, ticks, n);
                }
                if let Some(c) = q.pop() {
                    break Work::Attach(c);
                }
                q = match q.revisits.peek() {
                    Some(Reverse((t, ..))) => {
                        let wait = t.saturating_duration_since(now);
                        shared
                            .wake
                            .wait_timeout(q, wait)
                            .unwrap_or_else(PoisonError::into_inner)
                            .0
                    }
                    None => shared.wake.wait(q).unwrap_or_else(PoisonError::into_inner),
                };
            }
        };
        match work {
            Work::Attach(c) => attach_and_rest(shared, state, not_mpi, on_attached, c),
            Work::Revisit(pid, ticks, n) => revisit(shared, state, pid, ticks, n),
        }
    }
}

fn attach_and_rest(
    shared: &Shared,
    state: &Mutex<State>,
    not_mpi: &NotMpi,
    on_attached: &OnAttached,
    c: Candidate,
) {
    let started = Instant::now();
    let (result, registering) = attach_one(state, c);
    let took = started.elapsed();
    // The state lock is never held while the queue's is taken, nor the
    // other way round.
    let revisit = matches!(result, Ok(true))
        && state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .datatypes_pending(c.pid, c.ticks)
            .is_some();
    let mut loading_tries = 0;
    {
        let mut q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.pending.remove(&(c.pid, c.ticks));
        if matches!(result, Err(AttachError::Loading { .. })) {
            let n = q.loading.entry((c.pid, c.ticks)).or_default();
            *n += 1;
            loading_tries = *n;
            if loading_tries >= LOADING_TRIES {
                q.loading.remove(&(c.pid, c.ticks));
            }
            if q.loading.len() > LOADING_CAP {
                use crate::os::procfs::{Liveness, liveness};
                q.loading
                    .retain(|&(pid, ticks), _| liveness(pid, ticks) == Liveness::Alive);
                if q.loading.len() > LOADING_CAP {
                    q.loading.clear();
                }
            }
        } else {
            q.loading.remove(&(c.pid, c.ticks));
        }
        if revisit {
            q.revisits.push(Reverse((
                Instant::now() + DATATYPE_REVISITS[0],
                c.pid,
                c.ticks,
                0,
            )));
        }
    }
    match result {
        Ok(true) => {
            log::info!(
                "attached to pid {} ({}, uid {}, {:.0} ms)",
                c.pid,
                crate::os::procfs::comm(c.pid),
                c.uid,
                took.as_secs_f64() * 1e3
            );
            on_attached(c.pid);
        }
        Ok(false) => {}
        // Refusals say their own rate-limited line (crate::attach::budget).
        Err(AttachError::Refused { .. }) => {}
        // Caught while its library loads: the next scan offers it again,
        // up to LOADING_TRIES times; then refused as a failure, like any.
        Err(AttachError::Loading { .. }) if loading_tries < LOADING_TRIES => {}
        Err(e @ AttachError::Loading { .. }) => {
            log::warn!(
                "pid {}: {} (found so {LOADING_TRIES} times): not observed",
                c.pid,
                crate::one_line(&e)
            );
            let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
            st.selfm.attach_failures.inc();
            st.refused.insert((c.pid, c.ticks), c.uid);
        }
        // Gone before it could be attached: nothing to say.
        Err(AttachError::Proc(crate::os::procfs::ProcError::NoSuchProcess { .. })) => {}
        // A rank of a short job, ended as it was attached: said, counted
        // apart from failures, and not remembered (its pid is free).
        Err(e @ AttachError::Exited { .. }) => log::info!("{e}"),
        // Its figures were gone when it was found (counted by the
        // registry): said once, and never looked at again while it lives,
        // which is not long (it is past its MPI_Finalize). Not `refused`:
        // that is forgotten when one of its user's ranks exits.
        Err(e @ AttachError::SegmentGone { .. }) => {
            log::warn!("{e}");
            if let AttachError::SegmentGone { comm, .. } = e {
                not_mpi.insert(c.pid, c.ticks, comm);
            }
        }
        Err(e) => {
            log::warn!("pid {}: {}", c.pid, crate::one_line(&e));
            // Not offered again by every scan (one line, one count), until
            // one of its user's ranks exits and frees room.
            state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .refused
                .insert((c.pid, c.ticks), c.uid);
        }
    }
    // Only registering the probes holds the kernel's lock; reading the
    // process and parsing its library (a cold cache's 100 ms) do not, and
    // resting for them would only delay the next rank's probes past its
    // first calls.
    std::thread::sleep(registering.max(MIN_REST));
}

/// Looks at rank `pid`'s Open MPI datatypes again (without the lock) and
/// applies them once they check out; else tries later, as long as it runs
/// with its probes (until then, derived types' bytes are counted as
/// unknown).
fn revisit(shared: &Shared, state: &Mutex<State>, pid: u32, ticks: u64, n: usize) {
    let pending = state
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .datatypes_pending(pid, ticks);
    let Some(at) = pending else { return };
    let dt = crate::attach::datatypes::check(pid, &at);
    if dt.derived.is_some() {
        state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .apply_datatypes(pid, &dt);
    } else {
        let wait = match (DATATYPE_REVISITS.get(n), DATATYPE_REVISITS.get(n + 1)) {
            (Some(now), Some(next)) => *next - *now,
            _ => DATATYPE_REVISIT_EVERY,
        };
        shared
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .revisits
            .push(Reverse((
                Instant::now() + wait,
                pid,
                ticks,
                n.saturating_add(1),
            )));
    }
}

/// Prepares `c` without the lock, then commits it under it. `Ok(false)`:
/// already observed. The duration is the commit's (the probes'
/// registration).
fn attach_one(state: &Mutex<State>, c: Candidate) -> (Result<bool, AttachError>, Duration) {
    let known = |st: &State| st.ranks.get(&c.pid).is_some_and(|r| r.ticks == c.ticks);
    if known(&state.lock().unwrap_or_else(PoisonError::into_inner)) {
        return (Ok(false), Duration::ZERO);
    }
    let prepared = registry::prepare(c.pid, c.ticks);
    let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
    if known(&st) {
        return (Ok(false), Duration::ZERO);
    }
    let started = Instant::now();
    let r = st
        .commit(prepared, registry::Admission::Found)
        .map(|()| true);
    (r, started.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(pid: u32, uid: u32) -> Candidate {
        Candidate { pid, ticks: 1, uid }
    }

    #[test]
    fn users_are_served_round_robin() {
        let mut q = Queue::default();
        for (pid, uid) in [(1, 5), (2, 5), (3, 5), (4, 7), (5, 9)] {
            q.by_uid.entry(uid).or_default().push_back(c(pid, uid));
            q.len += 1;
        }
        let order: Vec<u32> = std::iter::from_fn(|| q.pop()).map(|c| c.pid).collect();
        assert_eq!(order, [1, 4, 5, 2, 3]);
        assert_eq!(q.len, 0);
    }
}
