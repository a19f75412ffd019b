//! The exit handover's door: takes connections on the handover socket and
//! hands on, round-robin between uids, the knocks that said the magic.
//!
//! The knock thread must never wait on one connection: a local user who
//! keeps connections open and mute would otherwise push other users'
//! knocks past the shim's patience ([`super::exit_handover::SHIM_WAIT`]).
//! So a connection that has not spoken by the time it is accepted waits in
//! an epoll set ([`crate::os::epoll`]), with a deadline ([`SAY_WAIT`]
//! after its accept; past it, it is closed as `malformed`), while the
//! thread serves the knocks that did speak. What a mute connection costs
//! the others is a slot of its own user's ([`Bounds::per_uid`]) and of
//! the whole ([`Bounds::all`]), which a connection holds from its accept
//! until its knock is served or refused; past them the connection is
//! closed unanswered (`queue_full`).

use std::{
    collections::{HashMap, VecDeque},
    io,
    os::fd::AsFd as _,
    time::{Duration, Instant},
};

use super::fair::Fair;
use crate::os::{
    epoll::{Epoll, Watch},
    seqpacket::{self, Conn, Listener},
};

/// What a knock says: a version, so a future shim is refused, not misread.
pub const MAGIC: &[u8; 8] = observer_common::segment::HANDOVER_MAGIC;
/// How long a connection may take to say its magic after its accept: the
/// shim sends it right after it connects, so it has usually come by then.
pub const SAY_WAIT: Duration = Duration::from_millis(50);
/// Connections accepted per turn at most: a flood of connects cannot keep
/// the thread accepting (and the daemon's stop waiting) for ever.
const ACCEPT_BATCH: usize = 64;
/// How long the door rests from accepting when out of descriptors (the
/// listener stays readable, and would be reported at once again).
const OUT_OF_DESCRIPTORS_REST: Duration = Duration::from_millis(50);
/// The listener's token in the epoll set; connections count from 1.
const LISTENER: u64 = 0;

/// What became of a knock, as `mpi_observer_exit_handovers_total`'s `result`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The rank's segment is held (found now or before).
    Held,
    /// The rank had no segment to hold (none, or not trusted).
    NoSegment,
    /// The process is not one this daemon observes (not attached and not
    /// attachable, another namespace, gone, another uid).
    NotObserved,
    /// A bound was reached: closed unanswered.
    QueueFull,
    /// Not a knock (a wrong message, or none within [`SAY_WAIT`]).
    Malformed,
    /// Waited past the shim's patience.
    Stale,
    /// Judged not MPI before (by the scan or an earlier knock): closed
    /// unanswered, its maps not read again.
    NotMpi,
    /// Refused by a budget before (or its attach failed): closed
    /// unanswered until one of its user's ranks exits and frees room.
    Refused,
    /// The process's real, effective, saved and filesystem uids are not
    /// all the uid that knocked (a setuid program): closed unanswered.
    UidMismatch,
}

impl Outcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Held => "held",
            Outcome::NoSegment => "no_segment",
            Outcome::NotObserved => "not_observed",
            Outcome::QueueFull => "queue_full",
            Outcome::Malformed => "malformed",
            Outcome::Stale => "stale",
            Outcome::NotMpi => "not_mpi",
            Outcome::Refused => "refused",
            Outcome::UidMismatch => "uid_mismatch",
        }
    }
}

/// One knock: a connection that said the magic, and who made it.
#[derive(Debug)]
pub struct Knock {
    /// The connection, answered or closed once the knock is served.
    pub conn: Conn,
    /// The knocking process, in the daemon's pid namespace.
    pub pid: u32,
    /// Its effective uid at connect (`SO_PEERCRED`).
    pub uid: u32,
    /// When it was accepted: its staleness counts from here.
    pub at: Instant,
}

impl Knock {
    /// Sends the answer byte: the rank's wait ends and it unlinks.
    pub fn answer(&self) {
        // Nonblocking: a peer gone or a full buffer is not our wait.
        let _ = self.conn.send(b"k");
    }
}

/// How many connections the door holds at most, from their accept until
/// their knock is served: those waiting to speak and those that spoke.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// All users together.
    pub all: usize,
    /// One uid's.
    pub per_uid: usize,
}

/// The daemon's bounds: one user may hold a quarter of the whole.
pub const BOUNDS: Bounds = Bounds {
    all: 1024,
    per_uid: 256,
};

/// The door: the listener, the connections waiting to speak, the knocks
/// waiting for their turn.
pub struct Door {
    listener: Listener,
    epoll: Epoll,
    bounds: Bounds,
    /// Accepted, not yet spoken, by token.
    mute: HashMap<u64, Knock>,
    /// Their deadlines, in accept order (so in deadline order); a token
    /// no longer in `mute` has spoken or gone.
    deadlines: VecDeque<(Instant, u64)>,
    /// Knocks that spoke, waiting for their turn.
    spoken: Fair<Knock>,
    /// Connections held per uid: mute and spoken.
    held: HashMap<u32, usize>,
    next_token: u64,
    /// Out of descriptors: the listener is out of the set until then.
    resting_until: Option<Instant>,
}

impl Door {
    /// A door on `listener`.
    pub fn new(listener: Listener, bounds: Bounds) -> io::Result<Door> {
        let epoll = Epoll::new()?;
        epoll.add(listener.as_fd(), LISTENER, Watch::Level)?;
        Ok(Door {
            listener,
            epoll,
            bounds,
            mute: HashMap::new(),
            deadlines: VecDeque::new(),
            spoken: Fair::new(bounds.all, bounds.per_uid),
            held: HashMap::new(),
            next_token: LISTENER + 1,
            resting_until: None,
        })
    }

    /// Connections held now, all users together.
    pub fn held(&self) -> usize {
        self.mute.len() + self.spoken.len()
    }

    /// Waits up to `idle` (not at all if a knock is ready) for anything to
    /// happen, takes what did, and returns the next knock, round-robin
    /// between uids, if one is ready. `count` hears of every connection
    /// closed here.
    pub fn next(&mut self, idle: Duration, count: &dyn Fn(Outcome)) -> Option<Knock> {
        let now = Instant::now();
        if self.resting_until.is_some_and(|t| now >= t) {
            self.resting_until = None;
            if self
                .epoll
                .add(self.listener.as_fd(), LISTENER, Watch::Level)
                .is_err()
            {
                // Still short of memory: rest again.
                self.resting_until = Some(now + OUT_OF_DESCRIPTORS_REST);
            }
        }
        let timeout = if self.spoken.is_empty() {
            [self.deadlines.front().map(|(t, _)| *t), self.resting_until]
                .into_iter()
                .flatten()
                .map(|t| t.saturating_duration_since(now))
                .fold(idle, Duration::min)
        } else {
            Duration::ZERO
        };
        // The listener and as many connections as the door holds.
        let ready = self
            .epoll
            .wait(ACCEPT_BATCH + self.mute.len(), timeout)
            .unwrap_or_default();
        for r in ready {
            if r.token == LISTENER {
                self.accept(count);
            } else if r.input {
                self.hear(r.token, count);
            }
        }
        self.expire(count);
        let (uid, k) = self.spoken.pop()?;
        self.release(uid);
        Some(k)
    }

    /// Accepts up to [`ACCEPT_BATCH`] waiting connections.
    fn accept(&mut self, count: &dyn Fn(Outcome)) {
        for _ in 0..ACCEPT_BATCH {
            let conn = match self.listener.accept() {
                Ok(Some(c)) => c,
                Ok(None) => return,
                Err(e) => {
                    if seqpacket::out_of_descriptors(&e)
                        && self.epoll.remove(self.listener.as_fd()).is_ok()
                    {
                        self.resting_until = Some(Instant::now() + OUT_OF_DESCRIPTORS_REST);
                    }
                    return;
                }
            };
            // A pid of 0: the knocker is in a pid namespace we cannot see.
            let Ok(Some(peer)) = conn.peer() else {
                count(Outcome::NotObserved);
                continue;
            };
            // The bounds before the connection is held.
            let held = self.held.get(&peer.uid).copied().unwrap_or(0);
            if self.held() >= self.bounds.all || held >= self.bounds.per_uid {
                count(Outcome::QueueFull);
                continue;
            }
            *self.held.entry(peer.uid).or_default() += 1;
            let k = Knock {
                conn,
                pid: peer.pid,
                uid: peer.uid,
                at: Instant::now(),
            };
            // The shim sends right after its connect: its magic is
            // usually here already, and the connection needs no watching.
            match said(&k.conn) {
                Said::Nothing => {}
                s => {
                    self.heard(k, s, count);
                    continue;
                }
            }
            let token = self.next_token;
            self.next_token += 1;
            if self.epoll.add(k.conn.as_fd(), token, Watch::Once).is_err() {
                // No room to watch it (memory): as if it never spoke.
                self.release(k.uid);
                count(Outcome::Malformed);
                continue;
            }
            self.deadlines.push_back((k.at + SAY_WAIT, token));
            self.mute.insert(token, k);
        }
    }

    /// A mute connection became readable (or was closed).
    fn hear(&mut self, token: u64, count: &dyn Fn(Outcome)) {
        let Some(k) = self.mute.remove(&token) else {
            return;
        };
        match said(&k.conn) {
            // Reported, yet nothing to read: watched again.
            Said::Nothing if self.epoll.rearm(k.conn.as_fd(), token).is_ok() => {
                self.mute.insert(token, k);
            }
            s => self.heard(k, s, count),
        }
    }

    /// Queues a knock that said the magic; closes one that said anything
    /// else.
    fn heard(&mut self, k: Knock, said: Said, count: &dyn Fn(Outcome)) {
        let uid = k.uid;
        if said != Said::Magic {
            self.release(uid);
            count(Outcome::Malformed);
            return;
        }
        // Within the bounds held since its accept.
        if self.spoken.push(uid, k).is_err() {
            self.release(uid);
            count(Outcome::QueueFull);
        }
    }

    /// Closes the connections past their deadline without a word.
    fn expire(&mut self, count: &dyn Fn(Outcome)) {
        let now = Instant::now();
        while let Some(&(t, token)) = self.deadlines.front() {
            if t > now {
                break;
            }
            self.deadlines.pop_front();
            if let Some(k) = self.mute.remove(&token) {
                self.release(k.uid);
                count(Outcome::Malformed);
            }
        }
    }

    fn release(&mut self, uid: u32) {
        if let Some(n) = self.held.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&uid);
            }
        }
    }
}

/// What a connection has said so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Said {
    /// Nothing yet.
    Nothing,
    /// The magic.
    Magic,
    /// Something else, or it closed.
    Other,
}

/// Reads what `conn` said, without waiting.
fn said(conn: &Conn) -> Said {
    let mut buf = [0u8; 16];
    match conn.recv(&mut buf) {
        Ok(n) if buf[..n] == MAGIC[..] => Said::Magic,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Said::Nothing,
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Said::Nothing,
        _ => Said::Other,
    }
}

#[cfg(test)]
mod tests {
    use std::{cell::RefCell, os::unix::fs::PermissionsExt as _, path::PathBuf};

    use super::*;

    fn door(name: &str, bounds: Bounds) -> (Door, PathBuf) {
        let d = std::env::temp_dir().join(format!("knocks-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        let p = d.join("s");
        let l = Listener::bind(&p, 0o600, 512).unwrap();
        (Door::new(l, bounds).unwrap(), p)
    }

    /// Outcomes counted, in order.
    #[derive(Default)]
    struct Counts(RefCell<Vec<Outcome>>);

    impl Counts {
        fn of(&self, o: Outcome) -> usize {
            self.0.borrow().iter().filter(|&&x| x == o).count()
        }
    }

    /// Turns the door until it hands on a knock or `limit` passes.
    fn next_within(door: &mut Door, limit: Duration, counts: &Counts) -> Option<Knock> {
        let t = Instant::now();
        while t.elapsed() < limit {
            if let Some(k) = door.next(Duration::from_millis(5), &|o| counts.0.borrow_mut().push(o))
            {
                return Some(k);
            }
        }
        None
    }

    #[test]
    fn mute_connections_cost_a_knock_nothing_and_are_closed_at_their_deadline() {
        let (mut door, p) = door("mute", BOUNDS);
        let counts = Counts::default();
        // 200 mute connections, accepted, then a knock: it is handed on at
        // once, not after any mute one's wait.
        let mute: Vec<Conn> = (0..200).map(|_| Conn::connect(&p).unwrap()).collect();
        while door.held() < mute.len() {
            assert!(door.next(Duration::from_millis(5), &|_| {}).is_none());
        }
        let t = Instant::now();
        let c = Conn::connect(&p).unwrap();
        c.send(MAGIC).unwrap();
        let k = next_within(&mut door, Duration::from_secs(1), &counts).expect("the knock");
        assert!(
            t.elapsed() < SAY_WAIT / 2,
            "a knock behind 200 mute connections waited {:?}",
            t.elapsed()
        );
        assert_eq!((k.pid, k.uid), (std::process::id(), seqpacket::euid()));
        k.answer();
        let mut b = [0u8; 1];
        assert_eq!(c.recv(&mut b).unwrap(), 1, "answered");
        // Past their deadline every mute one is closed, counted malformed,
        // and frees its slot.
        std::thread::sleep(SAY_WAIT);
        assert!(next_within(&mut door, Duration::from_millis(20), &counts).is_none());
        assert_eq!(counts.of(Outcome::Malformed), 200);
        assert_eq!(door.held(), 0);
        assert!(door.held.is_empty(), "no uid's count left behind");
        for m in &mute {
            assert_eq!(m.recv(&mut b).unwrap(), 0, "closed unanswered");
        }
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }

    #[test]
    fn a_knock_that_speaks_late_is_heard_and_a_wrong_word_refused() {
        let (mut door, p) = door("late", BOUNDS);
        let counts = Counts::default();
        let late = Conn::connect(&p).unwrap();
        let wrong = Conn::connect(&p).unwrap();
        let closed = Conn::connect(&p).unwrap();
        while door.held() < 3 {
            door.next(Duration::from_millis(5), &|_| {});
        }
        wrong.send(b"MPIOHO99").unwrap();
        drop(closed);
        late.send(MAGIC).unwrap();
        let k = next_within(&mut door, Duration::from_secs(1), &counts).expect("the late knock");
        assert_eq!(k.pid, std::process::id());
        assert_eq!(counts.of(Outcome::Malformed), 2);
        assert_eq!(door.held(), 0);
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }

    #[test]
    fn a_user_holds_at_most_its_bound_of_connections() {
        let bounds = Bounds {
            all: 16,
            per_uid: 4,
        };
        let (mut door, p) = door("bounds", bounds);
        let counts = Counts::default();
        let mute: Vec<Conn> = (0..6).map(|_| Conn::connect(&p).unwrap()).collect();
        let t = Instant::now();
        while counts.of(Outcome::QueueFull) < 2 && t.elapsed() < Duration::from_secs(1) {
            door.next(Duration::from_millis(5), &|o| counts.0.borrow_mut().push(o));
        }
        assert_eq!(door.held(), 4, "this uid's bound");
        assert_eq!(counts.of(Outcome::QueueFull), 2);
        // Its own knock waits for a slot: one comes at the mute ones'
        // deadline, and then it is heard.
        std::thread::sleep(SAY_WAIT);
        assert!(next_within(&mut door, Duration::from_millis(20), &counts).is_none());
        let c = Conn::connect(&p).unwrap();
        c.send(MAGIC).unwrap();
        assert!(next_within(&mut door, Duration::from_secs(1), &counts).is_some());
        drop(mute);
        let _ = std::fs::remove_dir_all(p.parent().unwrap());
    }
}
