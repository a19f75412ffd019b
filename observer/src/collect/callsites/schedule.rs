//! Sharing the one symbolizer process between users.
//!
//! How long a file takes to name is its owner's choice: a file crafted to be
//! slow costs up to a request's deadline before it is poisoned. Served in
//! one queue, N such files put N deadlines ahead of everyone else's names.
//! So the offsets waiting to be named are queued per uid (the real uid of
//! the process whose call sites they are), and:
//!
//! - **Round-robin.** Each uid with offsets waiting gets one request (at
//!   most [`symbolizer::MAX_OFFSETS`] offsets of one file) in turn. A uid's
//!   new request therefore waits for the request in flight (one deadline
//!   at most) and one request of each other uid with work, never for
//!   another user's whole queue. Within a uid, a file's offsets go out in
//!   consecutive requests, so the child keeps its parse of the file.
//! - **A budget of symbolizer time** per uid: a token bucket of
//!   [`Fairness::budget`] seconds, refilled at that many seconds a minute.
//!   Each request is charged the time it took (a timeout its whole
//!   deadline). A uid whose bucket is empty is skipped until it refills;
//!   meanwhile its sites wait, shown as `object+0xoffset`, and it is
//!   counted (`mpi_observer_symbolizer_throttled_total{uid}`) and said in
//!   one line a minute at most. So a user's slow files cost the node at
//!   most her budget's share of a core, however many she has.
//! - **Bounds per uid, and in all.** A uid holds at most
//!   [`Fairness::per_uid_pending`] offsets waiting and
//!   [`Fairness::per_uid_poisoned`] poisoned files; past the latter its own
//!   least recently seen is forgotten (and paid for again, from its own
//!   budget). When the totals are reached, room is taken from the uid
//!   holding the most, so one user can never push out the entries of a user
//!   holding fewer.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque},
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use super::{FileId, Key, Mapping, NamingCounters};
use crate::attach::symbolizer;

/// Default symbolizer seconds per uid and minute (`--symbolizer-budget`).
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(10);
/// How often a uid's spent budget is said at most.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// How the symbolizer is shared between uids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fairness {
    /// Symbolizer seconds a uid may spend in a burst, refilled at as many
    /// seconds a minute; zero: no budget (round-robin only).
    pub budget: Duration,
    /// Offsets a uid may have waiting (queued or being named).
    pub per_uid_pending: usize,
    /// Offsets waiting, all uids together.
    pub max_pending: usize,
    /// Poisoned files remembered per uid.
    pub per_uid_poisoned: usize,
    /// Poisoned files remembered, all uids together.
    pub max_poisoned: usize,
}

impl Default for Fairness {
    fn default() -> Self {
        Fairness {
            budget: DEFAULT_BUDGET,
            per_uid_pending: 16_384,
            max_pending: 65_536,
            per_uid_poisoned: 4_096,
            max_poisoned: 32_768,
        }
    }
}

/// One request for the symbolizer: offsets of one file, for one uid.
#[derive(Clone, Debug)]
pub(super) struct Request {
    /// Whose.
    pub uid: u32,
    /// A process of that uid that maps the file (to open it as mapped).
    pub pid: u32,
    /// The mapping.
    pub mapping: Mapping,
    /// Return-address offsets, at most [`symbolizer::MAX_OFFSETS`].
    pub offsets: Vec<u64>,
}

/// What the naming thread should do next.
#[derive(Debug)]
pub(super) enum Next {
    /// Name this.
    Serve(Request),
    /// Every uid with work has spent its budget: look again then.
    Wait(Instant),
    /// Nothing is waiting.
    Idle,
}

/// What queuing an offset did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pushed {
    /// Queued now.
    Queued,
    /// Already waiting.
    Already,
    /// Refused: a bound is reached (asked again at the next collection).
    Full,
}

/// A uid's token bucket of symbolizer seconds; may go below zero (a
/// request is charged what it took, even past what was left).
#[derive(Clone, Copy, Debug)]
struct Bucket {
    seconds: f64,
    at: Instant,
}

impl Bucket {
    fn full(budget: Duration, now: Instant) -> Bucket {
        Bucket {
            seconds: budget.as_secs_f64(),
            at: now,
        }
    }

    /// Refilled to `now`, at `budget` seconds a minute, up to `budget`.
    fn refill(&mut self, budget: Duration, now: Instant) {
        let rate = budget.as_secs_f64() / 60.0;
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.seconds = (self.seconds + rate * dt).min(budget.as_secs_f64());
        self.at = self.at.max(now);
    }

    /// When it holds time again, if it holds none now.
    fn empty_until(&self, budget: Duration) -> Option<Instant> {
        if budget.is_zero() || self.seconds > 0.0 {
            return None;
        }
        let rate = budget.as_secs_f64() / 60.0;
        // A hair past zero, so that the wake-up finds it positive.
        Some(self.at + Duration::from_secs_f64(-self.seconds / rate + 0.001))
    }

    fn is_full(&self, budget: Duration) -> bool {
        self.seconds >= budget.as_secs_f64()
    }
}

/// One file's offsets waiting, of one uid.
#[derive(Debug)]
struct Queued {
    pid: u32,
    mapping: Mapping,
    offsets: BTreeSet<u64>,
}

/// One uid's share.
#[derive(Debug)]
struct User {
    /// Files in the order they were first asked for.
    order: VecDeque<FileId>,
    files: HashMap<FileId, Queued>,
    /// Offsets waiting: queued plus being named.
    pending: usize,
    bucket: Bucket,
    /// Spent and skipped since it last was served (counted once).
    out: bool,
    poisoned: lru::LruCache<FileId, ()>,
}

impl User {
    fn new(budget: Duration, now: Instant) -> User {
        User {
            order: VecDeque::new(),
            files: HashMap::new(),
            pending: 0,
            bucket: Bucket::full(budget, now),
            out: false,
            // Grown as needed: most users never have one.
            poisoned: lru::LruCache::unbounded(),
        }
    }

    /// Nothing to remember: dropping it changes nothing.
    fn is_idle(&self, budget: Duration) -> bool {
        self.pending == 0 && self.poisoned.is_empty() && self.bucket.is_full(budget)
    }
}

/// The per-uid queues, budgets and poisoned lists; see the module doc. Kept
/// under the naming's lock; time is passed in, so it can be tested.
#[derive(Debug)]
pub(super) struct Scheduler {
    config: Fairness,
    users: BTreeMap<u32, User>,
    /// (uid, key) of every offset waiting.
    pending: HashSet<(u32, Key)>,
    poisoned: usize,
    /// The uid served last: the turn passes to the next one after it.
    last: Option<u32>,
    /// Per uid: when its spent budget was last said, and how often it was
    /// spent since.
    said: HashMap<u32, (Instant, u64)>,
    lines: Vec<String>,
}

impl Scheduler {
    pub(super) fn new(config: Fairness) -> Scheduler {
        Scheduler {
            config,
            users: BTreeMap::new(),
            pending: HashSet::new(),
            poisoned: 0,
            last: None,
            said: HashMap::new(),
            lines: Vec::new(),
        }
    }

    /// Offsets waiting, all uids together.
    pub(super) fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether `uid` waits for `key`'s name.
    pub(super) fn is_pending(&self, uid: u32, key: &Key) -> bool {
        self.pending.contains(&(uid, *key))
    }

    /// Whether `file` failed for `uid` (and is not to be tried again).
    pub(super) fn is_poisoned(&mut self, uid: u32, file: FileId) -> bool {
        self.users
            .get_mut(&uid)
            .is_some_and(|u| u.poisoned.get(&file).is_some())
    }

    /// Poisoned files remembered for `uid`, and in all.
    #[cfg(test)]
    fn poisoned(&self, uid: u32) -> (usize, usize) {
        (
            self.users.get(&uid).map_or(0, |u| u.poisoned.len()),
            self.poisoned,
        )
    }

    fn user(&mut self, uid: u32, now: Instant) -> &mut User {
        let budget = self.config.budget;
        self.users
            .entry(uid)
            .or_insert_with(|| User::new(budget, now))
    }

    /// Queues `offset` of `mapping`'s file for `uid`, whose process `pid`
    /// maps it.
    pub(super) fn push(
        &mut self,
        uid: u32,
        pid: u32,
        mapping: &Mapping,
        offset: u64,
        now: Instant,
    ) -> Pushed {
        let file = mapping.file();
        if self.pending.contains(&(uid, (file, offset))) {
            return Pushed::Already;
        }
        let held = self.users.get(&uid).map_or(0, |u| u.pending);
        if held >= self.config.per_uid_pending {
            return Pushed::Full;
        }
        if self.pending.len() >= self.config.max_pending && !self.drop_newest_of_largest(uid, held)
        {
            return Pushed::Full;
        }
        let u = self.user(uid, now);
        let q = u.files.entry(file).or_insert_with(|| Queued {
            pid,
            mapping: mapping.clone(),
            offsets: BTreeSet::new(),
        });
        if q.offsets.is_empty() {
            u.order.push_back(file);
        }
        q.offsets.insert(offset);
        u.pending += 1;
        self.pending.insert((uid, (file, offset)));
        Pushed::Queued
    }

    /// Makes room for a uid holding `held` offsets: drops the newest queued
    /// offset of the uid holding the most, if it holds more. Its lookup is
    /// refused as a full queue's would be, and asked again next time.
    fn drop_newest_of_largest(&mut self, asker: u32, held: usize) -> bool {
        let Some((&uid, _)) = self
            .users
            .iter()
            .filter(|(u, x)| **u != asker && !x.order.is_empty())
            .max_by_key(|(_, x)| x.pending)
            .filter(|(_, x)| x.pending > held + 1)
        else {
            return false;
        };
        let u = self.users.get_mut(&uid).expect("found");
        let Some(&file) = u.order.back() else {
            return false;
        };
        let q = u.files.get_mut(&file).expect("queued files are in the map");
        let offset = q.offsets.pop_last().expect("queued files hold offsets");
        if q.offsets.is_empty() {
            u.files.remove(&file);
            u.order.pop_back();
        }
        u.pending -= 1;
        self.pending.remove(&(uid, (file, offset)));
        NamingCounters::global()
            .refusals_queue_full
            .fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The next request: the first uid after the one served last that has
    /// offsets waiting and budget left. Offsets that `named` says are named
    /// by now (another uid's request named them) are dropped on the way.
    pub(super) fn next(&mut self, now: Instant, named: impl Fn(&Key) -> bool) -> Next {
        let budget = self.config.budget;
        self.users.retain(|_, u| {
            u.bucket.refill(budget, now);
            !u.is_idle(budget)
        });
        let uids: Vec<u32> = match self.last {
            Some(l) => self
                .users
                .range(l + 1..)
                .chain(self.users.range(..=l))
                .map(|(u, _)| *u)
                .collect(),
            None => self.users.keys().copied().collect(),
        };
        let mut wake: Option<Instant> = None;
        for uid in uids {
            let u = self.users.get_mut(&uid).expect("listed");
            if u.order.is_empty() {
                continue;
            }
            if let Some(at) = u.bucket.empty_until(budget) {
                wake = Some(wake.map_or(at, |w| w.min(at)));
                if !u.out {
                    u.out = true;
                    self.spent(uid, at.saturating_duration_since(now), now);
                }
                continue;
            }
            u.out = false;
            if let Some(r) = self.take(uid, &named) {
                self.last = Some(uid);
                return Next::Serve(r);
            }
        }
        wake.map_or(Next::Idle, Next::Wait)
    }

    /// Up to [`symbolizer::MAX_OFFSETS`] offsets of `uid`'s oldest file.
    fn take(&mut self, uid: u32, named: &impl Fn(&Key) -> bool) -> Option<Request> {
        let u = self.users.get_mut(&uid)?;
        while let Some(&file) = u.order.front() {
            let q = u.files.get_mut(&file).expect("queued files are in the map");
            let mut offsets = Vec::new();
            while offsets.len() < symbolizer::MAX_OFFSETS {
                let Some(o) = q.offsets.pop_first() else {
                    break;
                };
                if named(&(file, o)) {
                    u.pending -= 1;
                    self.pending.remove(&(uid, (file, o)));
                } else {
                    offsets.push(o);
                }
            }
            let request = (!offsets.is_empty()).then(|| Request {
                uid,
                pid: q.pid,
                mapping: q.mapping.clone(),
                offsets,
            });
            if q.offsets.is_empty() {
                u.files.remove(&file);
                u.order.pop_front();
            }
            if request.is_some() {
                return request;
            }
        }
        None
    }

    /// `r` took `spent`; `failed`: its file is poisoned for its uid, whose
    /// other offsets of that file leave the queue (they keep their
    /// `object+0xoffset` names).
    pub(super) fn done(&mut self, r: &Request, spent: Duration, failed: bool, now: Instant) {
        let file = r.mapping.file();
        let budget = self.config.budget;
        let Some(u) = self.users.get_mut(&r.uid) else {
            return;
        };
        u.bucket.refill(budget, now);
        if !budget.is_zero() {
            u.bucket.seconds -= spent.as_secs_f64();
        }
        let mut gone: Vec<u64> = r.offsets.clone();
        if failed && let Some(q) = u.files.remove(&file) {
            u.order.retain(|f| *f != file);
            gone.extend(q.offsets);
        }
        for o in gone {
            if self.pending.remove(&(r.uid, (file, o))) {
                u.pending -= 1;
            }
        }
        if failed {
            self.poison(r.uid, file);
        }
    }

    /// Remembers that `file` failed for `uid`, within the bounds.
    fn poison(&mut self, uid: u32, file: FileId) {
        let (per_uid, max) = (self.config.per_uid_poisoned, self.config.max_poisoned);
        let Some(u) = self.users.get_mut(&uid) else {
            return;
        };
        if u.poisoned.put(file, ()).is_some() {
            return;
        }
        self.poisoned += 1;
        if u.poisoned.len() > per_uid.max(1) {
            u.poisoned.pop_lru();
            self.poisoned -= 1;
        }
        if self.poisoned > max.max(1) {
            // The uid holding the most gives one up (this one, if none
            // holds more).
            let largest = self
                .users
                .iter_mut()
                .max_by_key(|(u, x)| (x.poisoned.len(), **u == uid))
                .map(|(_, x)| x);
            if let Some(x) = largest
                && x.poisoned.pop_lru().is_some()
            {
                self.poisoned -= 1;
            }
        }
    }

    /// `uid` has spent its budget with offsets waiting, for `wait` more:
    /// counted, and said once a minute at most.
    fn spent(&mut self, uid: u32, wait: Duration, now: Instant) {
        NamingCounters::global().throttled(uid);
        let e = self.said.entry(uid).or_insert((now - LOG_EVERY, 0));
        e.1 += 1;
        if now.saturating_duration_since(e.0) < LOG_EVERY {
            return;
        }
        let n = std::mem::take(&mut e.1);
        e.0 = now;
        let more = if n > 1 {
            format!(" ({n} times since the last such line)")
        } else {
            String::new()
        };
        self.lines.push(format!(
            "uid {uid} spent its symbolizer budget of {} s a minute{more}: its new call sites keep object+offset names until it refills, in {} s; other users are not affected; raise --symbolizer-budget if this user's jobs need more",
            self.config.budget.as_secs(),
            wait.as_secs().max(1),
        ));
    }

    /// The lines to log since the last call.
    pub(super) fn take_lines(&mut self) -> Vec<String> {
        std::mem::take(&mut self.lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::procfs;

    /// A mapping of a file with inode `ino`.
    fn mapping(ino: u64) -> Mapping {
        let line = format!("1000-2000 r-xp 00000000 fe:01 {ino} /home/u/f{ino}\n");
        let entry = procfs::parse_maps(line.as_bytes()).remove(0);
        Mapping {
            path: entry.path.as_ref().unwrap().display().to_string(),
            entry,
        }
    }

    fn unnamed(_: &Key) -> bool {
        false
    }

    fn served(s: &mut Scheduler, now: Instant) -> Option<Request> {
        match s.next(now, unnamed) {
            Next::Serve(r) => Some(r),
            _ => None,
        }
    }

    /// Serves everything, each request taking `each`; the uids in the
    /// order served.
    fn drain(s: &mut Scheduler, now: &mut Instant, each: Duration) -> Vec<u32> {
        let mut out = Vec::new();
        while let Some(r) = served(s, *now) {
            *now += each;
            s.done(&r, each, false, *now);
            out.push(r.uid);
        }
        out
    }

    fn no_budget() -> Fairness {
        Fairness {
            budget: Duration::ZERO,
            ..Fairness::default()
        }
    }

    #[test]
    fn users_take_turns_whatever_each_has_queued() {
        let mut s = Scheduler::new(no_budget());
        let mut now = Instant::now();
        // uid 1 (the hostile one) asks for 10 files first, then uid 2 and 3
        // for one each.
        for f in 0..10 {
            assert_eq!(s.push(1, 10, &mapping(f), 0x40, now), Pushed::Queued);
        }
        assert_eq!(s.push(2, 20, &mapping(100), 0x40, now), Pushed::Queued);
        assert_eq!(s.push(3, 30, &mapping(200), 0x40, now), Pushed::Queued);
        let order = drain(&mut s, &mut now, Duration::from_secs(2));
        assert_eq!(order, [1, 2, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
        assert_eq!(s.pending(), 0);
    }

    #[test]
    fn a_late_user_waits_for_one_request_not_for_the_queue() {
        let mut s = Scheduler::new(no_budget());
        let now = Instant::now();
        for f in 0..100 {
            s.push(1, 10, &mapping(f), 0x40, now);
        }
        let first = served(&mut s, now).unwrap();
        assert_eq!(first.uid, 1);
        // uid 2 asks while uid 1's first request is in flight.
        s.push(2, 20, &mapping(1000), 0x40, now);
        s.done(&first, Duration::from_secs(2), true, now);
        let second = served(&mut s, now).unwrap();
        assert_eq!(second.uid, 2, "served right after the request in flight");
    }

    #[test]
    fn a_request_holds_one_file_and_at_most_64_offsets() {
        let mut s = Scheduler::new(no_budget());
        let now = Instant::now();
        for o in 0..100 {
            s.push(1, 10, &mapping(1), o, now);
        }
        s.push(1, 10, &mapping(2), 7, now);
        let a = served(&mut s, now).unwrap();
        assert_eq!(a.offsets, (0..64).collect::<Vec<_>>());
        s.done(&a, Duration::ZERO, false, now);
        // The same file goes on (the child keeps its parse), then the next.
        let b = served(&mut s, now).unwrap();
        assert_eq!((b.mapping.file(), b.offsets.len()), (mapping(1).file(), 36));
        s.done(&b, Duration::ZERO, false, now);
        let c = served(&mut s, now).unwrap();
        assert_eq!((c.mapping.file(), c.offsets), (mapping(2).file(), vec![7]));
    }

    #[test]
    fn offsets_named_meanwhile_are_not_asked_again() {
        let mut s = Scheduler::new(no_budget());
        let now = Instant::now();
        let m = mapping(1);
        s.push(1, 10, &m, 1, now);
        s.push(1, 10, &m, 2, now);
        assert_eq!(s.push(1, 10, &m, 2, now), Pushed::Already);
        // Another uid waits for the same key on its own.
        assert_eq!(s.push(2, 20, &m, 2, now), Pushed::Queued);
        let r = match s.next(now, |k| k.1 == 1) {
            Next::Serve(r) => r,
            n => panic!("{n:?}"),
        };
        assert_eq!((r.uid, r.offsets.clone()), (1, vec![2]));
        assert!(!s.is_pending(1, &(m.file(), 1)), "dropped as named");
        assert!(s.is_pending(1, &(m.file(), 2)), "in flight");
        s.done(&r, Duration::ZERO, false, now);
        assert!(!s.is_pending(1, &(m.file(), 2)));
        assert!(s.is_pending(2, &(m.file(), 2)), "uid 2 still waits");
        assert!(matches!(s.next(now, |_| true), Next::Idle));
        assert_eq!(s.pending(), 0);
    }

    #[test]
    fn a_spent_budget_waits_for_its_refill_and_others_go_on() {
        let uid = 4_000_001;
        let mut s = Scheduler::new(Fairness {
            budget: Duration::from_secs(6),
            ..Fairness::default()
        });
        let mut now = Instant::now();
        for f in 0..10 {
            s.push(uid, 10, &mapping(f), 0x40, now);
        }
        let before = NamingCounters::global().throttled_of(uid);
        // Timeouts of 2 s: 6 s, refilled at 0.1 s a second, pay for four
        // (6 - 4 x 2 + 0.6 = -1.4 s).
        let mut served_n = 0;
        let wake = loop {
            match s.next(now, unnamed) {
                Next::Serve(r) => {
                    now += Duration::from_secs(2);
                    s.done(&r, Duration::from_secs(2), true, now);
                    served_n += 1;
                }
                Next::Wait(t) => break t,
                Next::Idle => panic!("work left"),
            }
        };
        assert_eq!(served_n, 4);
        // 1.4 s missing at 0.1 s a second.
        let wait = wake - now;
        assert!(
            (Duration::from_millis(13_900)..Duration::from_millis(14_100)).contains(&wait),
            "{wait:?}"
        );
        // Asked again while spent: counted once, said once.
        assert!(matches!(s.next(now, unnamed), Next::Wait(_)));
        assert_eq!(NamingCounters::global().throttled_of(uid) - before, 1);
        let lines = s.take_lines();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(&format!(
                "uid {uid} spent its symbolizer budget of 6 s a minute"
            )),
            "{lines:?}"
        );
        // Another uid is served at once meanwhile.
        s.push(2, 20, &mapping(500), 0x40, now);
        let other = served(&mut s, now).unwrap();
        assert_eq!(other.uid, 2);
        s.done(&other, Duration::from_millis(5), false, now);
        // Refilled: served again; spent again within the minute: counted,
        // not said.
        let r = served(&mut s, wake).unwrap();
        assert_eq!(r.uid, uid);
        s.done(
            &r,
            Duration::from_secs(2),
            true,
            wake + Duration::from_secs(2),
        );
        assert!(matches!(
            s.next(wake + Duration::from_secs(2), unnamed),
            Next::Wait(_)
        ));
        assert_eq!(NamingCounters::global().throttled_of(uid) - before, 2);
        assert!(s.take_lines().is_empty());
    }

    #[test]
    fn the_budget_bounds_a_users_share_of_the_symbolizer() {
        // One uid with endless slow files, 10 s a minute: over 10 minutes
        // it gets the burst plus 10 s a minute, about 110 s, not 600.
        let mut s = Scheduler::new(Fairness::default());
        let t0 = Instant::now();
        let mut now = t0;
        for f in 0..1000 {
            s.push(4_000_002, 10, &mapping(f), 0x40, now);
        }
        let mut spent = Duration::ZERO;
        while now < t0 + Duration::from_secs(600) {
            match s.next(now, unnamed) {
                Next::Serve(r) => {
                    now += Duration::from_secs(2);
                    spent += Duration::from_secs(2);
                    s.done(&r, Duration::from_secs(2), true, now);
                }
                Next::Wait(t) => now = t,
                Next::Idle => panic!("work left"),
            }
        }
        assert!(
            (Duration::from_secs(100)..=Duration::from_secs(114)).contains(&spent),
            "{spent:?}"
        );
    }

    #[test]
    fn a_failure_poisons_the_file_for_its_uid_only_and_drops_its_offsets() {
        let mut s = Scheduler::new(no_budget());
        let now = Instant::now();
        let m = mapping(1);
        for o in 0..70 {
            s.push(1, 10, &m, o, now);
        }
        s.push(2, 20, &m, 5, now);
        let r = served(&mut s, now).unwrap();
        assert_eq!(r.offsets.len(), 64);
        s.done(&r, Duration::from_secs(2), true, now);
        assert!(s.is_poisoned(1, m.file()));
        assert!(!s.is_poisoned(2, m.file()), "uid 2 pays for its own");
        assert!(!s.is_pending(1, &(m.file(), 66)), "the rest left the queue");
        let r = served(&mut s, now).unwrap();
        assert_eq!((r.uid, r.offsets.clone()), (2, vec![5]));
    }

    #[test]
    fn poisoned_lists_are_bounded_per_uid_and_no_uid_evicts_a_smaller_one() {
        let mut s = Scheduler::new(Fairness {
            per_uid_poisoned: 4,
            max_poisoned: 6,
            ..no_budget()
        });
        let now = Instant::now();
        let fail = |s: &mut Scheduler, uid: u32, ino: u64| {
            s.push(uid, 10, &mapping(ino), 0x40, now);
            let r = served(s, now).unwrap();
            assert_eq!(r.uid, uid);
            s.done(&r, Duration::from_secs(2), true, now);
        };
        // uid 2 poisons two files.
        fail(&mut s, 2, 900);
        fail(&mut s, 2, 901);
        // uid 1 poisons 100: its list stays at 4, its own oldest forgotten.
        for f in 0..100 {
            fail(&mut s, 1, f);
        }
        assert_eq!(s.poisoned(1), (4, 6));
        assert!(s.is_poisoned(1, mapping(99).file()));
        assert!(!s.is_poisoned(1, mapping(0).file()), "its own evicted");
        assert_eq!(s.poisoned(2), (2, 6), "uid 2's are all kept");
        assert!(s.is_poisoned(2, mapping(900).file()) && s.is_poisoned(2, mapping(901).file()));
        // A third uid at the total: room comes from the largest (uid 1).
        fail(&mut s, 3, 950);
        assert_eq!(s.poisoned(3), (1, 6));
        assert_eq!(s.poisoned(1).0, 3);
        assert_eq!(s.poisoned(2).0, 2);
    }

    #[test]
    fn pending_is_bounded_per_uid_and_the_largest_makes_room() {
        let mut s = Scheduler::new(Fairness {
            per_uid_pending: 5,
            max_pending: 8,
            ..no_budget()
        });
        let now = Instant::now();
        let m = mapping(1);
        for o in 0..5 {
            assert_eq!(s.push(1, 10, &m, o, now), Pushed::Queued);
        }
        assert_eq!(s.push(1, 10, &m, 99, now), Pushed::Full, "per uid");
        for o in 0..3 {
            assert_eq!(s.push(2, 20, &m, o, now), Pushed::Queued);
        }
        assert_eq!(s.pending(), 8);
        // uid 2 (3) asks again at the total: uid 1 (5) gives its newest.
        assert_eq!(s.push(2, 20, &m, 3, now), Pushed::Queued);
        assert!(!s.is_pending(1, &(m.file(), 4)) && s.is_pending(1, &(m.file(), 3)));
        // uid 1 (4) cannot take uid 2's (4) room back.
        assert_eq!(s.push(1, 10, &m, 4, now), Pushed::Full);
        assert_eq!(s.pending(), 8);
    }

    #[test]
    fn idle_users_are_forgotten() {
        let mut s = Scheduler::new(Fairness::default());
        let now = Instant::now();
        s.push(1, 10, &mapping(1), 1, now);
        let r = served(&mut s, now).unwrap();
        s.done(&r, Duration::from_millis(10), false, now);
        let _ = s.next(now, unnamed);
        assert_eq!(s.users.len(), 1, "its bucket is not full yet");
        let _ = s.next(now + Duration::from_secs(1), unnamed);
        assert!(s.users.is_empty());
    }
}
