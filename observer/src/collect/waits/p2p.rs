//! Point-to-point messages: Late Sender and Late Receiver.
//!
//! **Scalasca's definition** (`MPI_LATESENDER` in `MPI.pattern`): a receive
//! completes in a blocking call R (`MPI_Recv`, `MPI_Sendrecv`, `MPI_Mrecv`,
//! or the Wait family); its message was posted by a call entered at `E_S`.
//! The receiver waited `min(E_S, L_R) − E_R`, and the sender is the
//! culprit. A call that completes several receives (`MPI_Waitall`,
//! `MPI_Waitsome`) waited for its *latest* sender only: the maximum over its
//! receives, charged to that sender. Receives completed by the Test family
//! count no wait.
//!
//! **Late Receiver** (`MPI_LATERECEIVER`): a send that completed in a
//! blocking `MPI_Send` or `MPI_Ssend` entered at `E_S` and left at `L_S`
//! waited for its receive to be posted, by a call entered at `P` (the
//! `MPI_Recv`, `MPI_Sendrecv` or `MPI_Mrecv` that received it, or the
//! `MPI_Irecv` or `MPI_Start` that posted it): `P − E_S` if `L_S > P`, else
//! nothing (the send completed before: eagerly). The sender waited, and the
//! receiver is the culprit. A receive posted by an earlier call has that
//! call's enter in a record of its own, written just before its receive's;
//! a receive whose post is not known (that record lost) counts no wait if
//! it completed in a call entered before the send (its post was earlier
//! still), else it is unresolved.
//!
//! **Late Receiver in a later call**, as Scalasca counts it too
//! (`MPI_SEND_COMPLETE` in its `MPI.pattern`): a nonblocking send (any
//! mode, or a persistent one's start) completed in a blocking call W of
//! the Wait family, entered at `E_W` and left at `L_W`, waited
//! `P − E_W` if `L_W > P` (and `P > E_W`). The shim records W in a record
//! of its own ([`kind::SENT`]), announced by the send's
//! ([`flag::LATER`]). `MPI_Wait` and `MPI_Waitany` count it alone; an
//! `MPI_Waitall` or `MPI_Waitsome` waited for its latest receiver only,
//! the maximum over its sends, and for none when it waited for a late
//! sender (Scalasca counts such a call's wait as the Late Sender's). A
//! send completed by the Test family, freed, or not tracked, waited for
//! nothing. One whose completion has not come 5 s after the rest of its
//! message was evaluated counts no wait: its call was entered after the
//! receive had completed, so after its post.
//!
//! **Matching.** The sender's record and the receiver's name one message by
//! (sender, receiver, tag, its number on that envelope), which MPI's
//! non-overtaking order makes the same on both sides (see the shim's
//! `stats/waits.rs`). The two must agree on the size, and the send must
//! have been posted before the receive completed; a pair that does not is
//! a mismatch (a rank that miscounted), never a wait.
//!
//! **Across nodes** (a message whose other half another node's daemon
//! shipped, [`super::clocks`]): the pair bounds the offset between the two
//! nodes' clocks (it was received after it was sent), and each wait is
//! computed on the offset the records bound so far; one whose sign that
//! cannot tell counts `unresolved{reason="clock"}`. A Late Sender is
//! counted on the receiver's node, a Late Receiver on the sender's; a
//! message between two other nodes' ranks is theirs, and not kept.
//!
//! **Groups.** A receiver's records of one `MPI_Waitall` share its thread
//! and its enter time. The group is whole at its end record (the shim
//! writes one after the call's last receive), else once a later record of
//! that thread has come (the ring keeps a thread's records in order), or
//! at the timeout; it is evaluated once each of its messages is matched,
//! and not at all if one of them could not be (its message is counted
//! unresolved).

use std::collections::HashMap;

use observer_common::{
    FunctionId,
    waits::{self, flag, kind},
};

use super::{Charge, Job, MAX_PENDING, Pattern, Scale, TIMEOUT_NS, Unresolved, Wait, clocks};

/// `MPI_Ssend`, `MPI_Issend`: sends that complete only once their receive
/// is posted.
const SYNCHRONOUS: [u16; 4] = [
    FunctionId::Ssend as u16,
    FunctionId::SsendC as u16,
    FunctionId::Issend as u16,
    FunctionId::IssendC as u16,
];

/// A message: (sender, receiver, tag, number on the envelope).
type Key = (u32, u32, i32, u64, u64);
/// A call's group of receives: (receiver, thread, the call's enter).
type GroupKey = (u32, u32, u64);

/// The sender's half of a message.
#[derive(Clone, Copy, Debug)]
struct Sent {
    clock: u64,
    /// The node whose daemon drained it (0: this one).
    node: u16,
    enter: u64,
    bytes: u64,
    /// A blocking send's leave (Late Receiver).
    leave: Option<u64>,
    /// A nonblocking send whose completing call is recorded
    /// ([`Completed`]).
    later: bool,
    /// The function of the call that posted it.
    function: u16,
}

/// The call that completed a nonblocking send.
#[derive(Clone, Copy, Debug)]
struct Completed {
    clock: u64,
    /// The node whose daemon drained it (0: this one).
    node: u16,
    enter: u64,
    leave: u64,
    /// By the Test family, or not tracked: no wait.
    test: bool,
    group: Option<GroupKey>,
    /// The function of that call.
    function: u16,
}

/// The receiver's half.
#[derive(Clone, Copy, Debug)]
struct Received {
    clock: u64,
    /// The node whose daemon drained it (0: this one).
    node: u16,
    enter: u64,
    leave: u64,
    bytes: u64,
    test: bool,
    group: Option<GroupKey>,
    /// The function of the call it completed in.
    function: u16,
    /// Posted by that call: `enter` is also its post.
    posted_here: bool,
}

/// A message waiting for a half (or, in [`Messages::awaiting`], for its
/// nonblocking send's completing call, since `first_ns`).
#[derive(Clone, Copy, Debug)]
struct Message {
    first_ns: u64,
    sent: Option<Sent>,
    received: Option<Received>,
    /// When a receive posted by an earlier call was posted, and on which
    /// clock.
    posted: Option<(u64, u64)>,
    /// The call that completed a nonblocking send.
    completed: Option<Completed>,
}

/// A call's receives and sends, while some are unmatched or more may come.
#[derive(Debug)]
struct Group {
    first_ns: u64,
    /// Its receives and sends seen so far, and how many of them are
    /// settled.
    members: u32,
    settled: u32,
    /// Of the members, the sends (Late Receiver).
    sends: u32,
    /// A receive could not be matched: the group counts no wait.
    failed: bool,
    /// A send could not be evaluated: the group counts no Late Receiver.
    send_failed: bool,
    /// The latest receiver so far: the send's wait for it and its rank.
    receiver: Option<(Wait, u32)>,
    /// No more receives will come.
    whole: bool,
    /// The latest sender so far: the wait for it (from the call's enter,
    /// in ns) and its rank.
    latest: Option<(Wait, u32)>,
    /// The longest that a message whose wait the clocks could not tell
    /// (across nodes) may have waited: the group's wait is said if its
    /// latest known sender's is at least that.
    unclear: u64,
    /// The function of the call.
    function: u16,
}

/// A job's messages and groups waiting for parts.
#[derive(Debug, Default)]
pub(super) struct Messages {
    pending: HashMap<Key, Message>,
    /// Messages evaluated but for their send's completing call
    /// ([`Completed`]), which the sender's next records bring.
    awaiting: HashMap<Key, Message>,
    groups: HashMap<GroupKey, Group>,
    /// The group each (receiver, thread) has open: the call's enter.
    open: HashMap<(u32, u32), u64>,
}

impl Messages {
    pub(super) fn len(&self) -> usize {
        self.pending.len() + self.awaiting.len()
    }

    /// Closes the group `(rank, thread)` has open, if the record with
    /// `enter` is from a later call.
    fn seal(&mut self, rank: u32, thread: u32, enter: u64) {
        if let Some(&e) = self.open.get(&(rank, thread))
            && e != enter
        {
            self.open.remove(&(rank, thread));
            if let Some(g) = self.groups.get_mut(&(rank, thread, e)) {
                g.whole = true;
            }
        }
    }
}

impl Messages {
    /// Adds a receive (or, with `send`, a send) completed by the call of
    /// `rank` that record `r` names to that call's group: the group's key,
    /// or `None` with no room for a new group.
    fn join(&mut self, rank: u32, r: &waits::Plain, send: bool, now_ns: u64) -> Option<GroupKey> {
        let g = (rank, r.thread, r.enter);
        if !self.groups.contains_key(&g) && self.groups.len() >= MAX_PENDING {
            return None;
        }
        let group = self.groups.entry(g).or_insert(Group {
            first_ns: now_ns,
            members: 0,
            settled: 0,
            sends: 0,
            failed: false,
            send_failed: false,
            receiver: None,
            whole: false,
            latest: None,
            unclear: 0,
            function: r.function,
        });
        group.members += 1;
        group.sends += u32::from(send);
        self.open.insert((rank, r.thread), r.enter);
        Some(g)
    }
}

impl Job {
    /// Takes the record of the call that completed `rank`'s nonblocking
    /// send `key` ([`kind::SENT`]): kept with its message, which waits for
    /// it, or evaluated with the rest of it if that has been. A completion
    /// of a message neither kept nor awaited (its other records lost, or
    /// it came after the message stopped waiting for it) is not kept: what
    /// its message counted, it counted without it.
    fn take_sent(
        &mut self,
        rank: u32,
        clock: u64,
        node: u16,
        key: Key,
        r: &waits::Plain,
        now_ns: u64,
    ) {
        let m = &mut self.p2p;
        let held = m.awaiting.get(&key).or(m.pending.get(&key));
        match held.filter(|msg| msg.sent.is_some()) {
            None => return,
            Some(msg) if msg.completed.is_some() => {
                self.figures.records_invalid += 1;
                return;
            }
            Some(_) => {}
        }
        let test = r.flags & flag::TEST != 0;
        let mut group = None;
        if r.flags & flag::MULTI != 0 {
            let Some(g) = m.join(rank, r, true, now_ns) else {
                self.figures.unresolved[Unresolved::Overflow as usize] += 1;
                return;
            };
            group = Some(g);
        }
        let c = Some(Completed {
            clock,
            node,
            enter: r.enter,
            leave: r.leave,
            test,
            group,
            function: r.function,
        });
        if let Some(msg) = m.awaiting.get_mut(&key).or(m.pending.get_mut(&key)) {
            msg.completed = c;
        }
    }

    /// Takes a send, receive or group-end record of `rank`, on a ring
    /// keeping `clock`.
    pub(super) fn take_p2p(
        &mut self,
        rank: u32,
        clock: u64,
        node: u16,
        r: &waits::Plain,
        now_ns: u64,
    ) {
        if r.kind == kind::GROUP_END {
            // The group it ends is whole; one it does not know (its records
            // lost) ends nothing.
            let g = (rank, r.thread, r.enter);
            if self.p2p.open.get(&(rank, r.thread)) == Some(&r.enter) {
                self.p2p.open.remove(&(rank, r.thread));
            }
            if let Some(g) = self.p2p.groups.get_mut(&g) {
                g.whole = true;
            }
            return;
        }
        let send = r.kind == kind::SEND;
        let post = r.kind == kind::POSTED;
        let done = r.kind == kind::SENT;
        let recv_flags = flag::MULTI | flag::TEST | flag::POSTED_HERE;
        let one_way = r.flags & (flag::MULTI | flag::TEST) != flag::MULTI | flag::TEST;
        let valid = (0..i64::from(self.world_size)).contains(&i64::from(r.peer))
            && if send {
                r.flags & !(flag::BLOCKING | flag::LATER) == 0
                    && r.flags != flag::BLOCKING | flag::LATER
            } else if post {
                r.flags == 0
            } else if done {
                r.flags & !(flag::MULTI | flag::TEST) == 0 && one_way
            } else {
                r.flags & !recv_flags == 0 && one_way
            };
        if !valid {
            self.figures.records_invalid += 1;
            return;
        }
        // Another node's message with a third node's rank: neither waits
        // here.
        if node != 0 && !self.is_local(r.peer as u32) {
            return;
        }
        let max = self.max_messages();
        let m = &mut self.p2p;
        // A post's time is another call's: it neither opens nor closes a
        // group.
        if !post {
            m.seal(rank, r.thread, r.enter);
        }
        let peer = r.peer as u32;
        let key = if send || done {
            (rank, peer, r.tag, r.seq, r.comm)
        } else {
            (peer, rank, r.tag, r.seq, r.comm)
        };
        if done {
            return self.take_sent(rank, clock, node, key, r, now_ns);
        }
        if !m.pending.contains_key(&key) && m.pending.len() >= max {
            // Once a message: at its receive, which every message has (a
            // send given up alone leaves its receive incomplete).
            if r.kind == kind::RECV {
                self.figures.unresolved[Unresolved::Overflow as usize] += 1;
            }
            return;
        }
        let msg = m.pending.entry(key).or_insert(Message {
            first_ns: now_ns,
            sent: None,
            received: None,
            posted: None,
            completed: None,
        });
        let twice = if send {
            msg.sent.is_some()
        } else if post {
            msg.posted.is_some() || msg.received.is_some()
        } else {
            msg.received.is_some()
        };
        if twice {
            self.figures.records_invalid += 1;
            return;
        }
        if send {
            msg.sent = Some(Sent {
                clock,
                node,
                enter: r.enter,
                bytes: r.bytes,
                leave: (r.flags & flag::BLOCKING != 0).then_some(r.leave),
                later: r.flags & flag::LATER != 0,
                function: r.function,
            });
            return;
        }
        if post {
            msg.posted = Some((clock, r.enter));
            return;
        }
        let test = r.flags & flag::TEST != 0;
        let mut group = None;
        if r.flags & flag::MULTI != 0 && !test {
            let Some(g) = m.join(rank, r, false, now_ns) else {
                // Without its group the receive cannot be counted right:
                // given up, with its message.
                m.pending.remove(&key);
                self.figures.unresolved[Unresolved::Overflow as usize] += 1;
                return;
            };
            group = Some(g);
        }
        if let Some(msg) = m.pending.get_mut(&key) {
            msg.received = Some(Received {
                clock,
                node,
                enter: r.enter,
                leave: r.leave,
                bytes: r.bytes,
                test,
                group,
                function: r.function,
                posted_here: r.flags & flag::POSTED_HERE != 0,
            });
        }
    }

    /// Evaluates the messages both halves of which have come, and the
    /// groups whose messages are all settled; gives up what waited
    /// [`TIMEOUT_NS`].
    pub(super) fn settle_p2p(&mut self, now_ns: u64) {
        let period = self.figures.p2p_sample_period.max(1);
        let timed_out = |first: u64| now_ns.saturating_sub(first) >= TIMEOUT_NS;
        // A half taken before its peer rank was known to be another
        // node's: the message is theirs.
        let nodes = &self.nodes;
        self.p2p
            .pending
            .retain(|k, _| nodes.of(k.0) == 0 || nodes.of(k.1) == 0);
        let keys: Vec<Key> = self
            .p2p
            .pending
            .iter()
            .filter(|(_, m)| {
                timed_out(m.first_ns)
                    || match (m.sent, m.received) {
                        // Ticks whose rate has not come yet wait for it.
                        (Some(s), Some(r)) => self.scale([s.clock, r.clock].into_iter()).is_some(),
                        _ => false,
                    }
            })
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            let Some(m) = self.p2p.pending.remove(&k) else {
                continue;
            };
            let outcome = match (m.sent, m.received) {
                (Some(s), Some(r)) => self.late_sender(k.1, &s, &r, now_ns),
                _ => Err(Unresolved::Incomplete),
            };
            let charge = Charge {
                culprit: k.1,
                period,
                now_ns,
                owner: k.0,
            };
            match (&outcome, m.sent, m.received) {
                (Ok(_), Some(s), Some(r)) if s.leave.is_some() && self.is_local(k.0) => {
                    match self.late_receiver(k.0, &s, &r, m.posted, now_ns) {
                        Ok(w) => self.count(Pattern::LateReceiver, s.function, &[w], charge),
                        Err(why) => self.unresolved(why, k.0),
                    }
                }
                (Ok(_), Some(s), Some(received)) if s.later && self.is_local(k.0) => {
                    match m.completed {
                        Some(c) => self.late_receiver_later(k, &s, &received, m.posted, c, now_ns),
                        None if self.p2p.awaiting.len() >= self.max_messages() => {
                            self.unresolved(Unresolved::Overflow, k.0);
                        }
                        None => {
                            let a = Message {
                                first_ns: now_ns,
                                ..m
                            };
                            self.p2p.awaiting.insert(k, a);
                        }
                    }
                }
                // No Late Receiver: a completing call in a group settles
                // there as one that could not be evaluated.
                _ => self.send_settled(m.completed, None),
            }
            let group = m.received.and_then(|r| r.group);
            let test = m.received.is_some_and(|r| r.test);
            if let Err(why) = outcome {
                self.unresolved(why, k.1);
            }
            let g = group.and_then(|g| self.p2p.groups.get_mut(&g));
            match (outcome, g) {
                (Err(_), g) => {
                    if let Some(g) = g {
                        g.failed = true;
                        g.settled += 1;
                    }
                }
                // A wait the clocks cannot tell is not said; in a group it
                // matters only if it may have been the longest.
                (Ok(Err(upper)), Some(g)) => {
                    g.settled += 1;
                    g.unclear = g.unclear.max(upper);
                }
                (Ok(Err(_)), None) if test => {}
                (Ok(Err(_)), None) => self.unresolved(Unresolved::Clock, k.1),
                (Ok(Ok(w)), Some(g)) => {
                    g.settled += 1;
                    // The latest sender; the lowest rank of equals.
                    let later = g.latest.is_none_or(|(lw, lr)| (w.ns, lr) > (lw.ns, k.0));
                    if later {
                        g.latest = Some((w, k.0));
                    }
                }
                (Ok(Ok(_)), None) if test => {}
                (Ok(Ok(w)), None) => {
                    let function = m.received.map_or(0, |r| r.function);
                    let charge = Charge {
                        culprit: k.0,
                        period,
                        now_ns,
                        owner: k.1,
                    };
                    self.count(Pattern::LateSender, function, &[w], charge);
                }
            }
        }
        // Messages whose send's completing call has come, or will not.
        let done: Vec<Key> = self
            .p2p
            .awaiting
            .iter()
            .filter(|(_, a)| a.completed.is_some() || timed_out(a.first_ns))
            .map(|(k, _)| *k)
            .collect();
        for k in done {
            let Some(a) = self.p2p.awaiting.remove(&k) else {
                continue;
            };
            // None in 5 s: its call was entered after the receive had
            // completed, so after it was posted, and waited for nothing.
            if let (Some(s), Some(r), Some(c)) = (a.sent, a.received, a.completed) {
                self.late_receiver_later(k, &s, &r, a.posted, c, now_ns);
            }
        }
        let ready: Vec<GroupKey> = self
            .p2p
            .groups
            .iter()
            .filter(|(_, g)| {
                (g.settled >= g.members && (g.whole || timed_out(g.first_ns)))
                    // A group that never settles (records no shim writes):
                    // its messages were counted when they timed out.
                    || now_ns.saturating_sub(g.first_ns) >= 3 * TIMEOUT_NS
            })
            .map(|(k, _)| *k)
            .collect();
        for k in ready {
            let Some(g) = self.p2p.groups.remove(&k) else {
                continue;
            };
            if self.p2p.open.get(&(k.0, k.1)) == Some(&k.2) {
                self.p2p.open.remove(&(k.0, k.1));
            }
            if g.failed || g.settled < g.members {
                continue;
            }
            let receives = g.members - g.sends;
            if receives > 0 && g.latest.is_none_or(|(w, _)| w.ns < g.unclear) {
                // A sender whose wait the clocks cannot tell may have been
                // the latest.
                if g.unclear > 0 {
                    self.unresolved(Unresolved::Clock, k.0);
                }
                continue;
            }
            let mut waited_for_sender = false;
            if let Some((w, sender)) = g.latest {
                let charge = Charge {
                    culprit: sender,
                    period,
                    now_ns,
                    owner: k.0,
                };
                waited_for_sender = w.ns > 0;
                self.count(Pattern::LateSender, g.function, &[w], charge);
            }
            // Its latest receiver's wait, unless it waited for a sender
            // (Scalasca's rule: the call's wait is then the Late Sender's).
            if let (Some((w, receiver)), false) = (g.receiver, g.send_failed) {
                let charge = Charge {
                    culprit: receiver,
                    period,
                    now_ns,
                    owner: k.0,
                };
                let w = if waited_for_sender {
                    Wait { ns: 0, ..w }
                } else {
                    w
                };
                self.count(Pattern::LateReceiver, g.function, &[w], charge);
            }
        }
    }

    /// Scalasca's Late Receiver of message `k`, a nonblocking send `s`
    /// completed in call `c` ([`Completed`]), its receive `r`, posted as
    /// `posted` says: counted for a call that completes one, kept in its
    /// group for one that may complete several.
    fn late_receiver_later(
        &mut self,
        k: Key,
        s: &Sent,
        r: &Received,
        posted: Option<(u64, u64)>,
        c: Completed,
        now_ns: u64,
    ) {
        if c.test {
            return;
        }
        // The wait is in the completing call; whether the send was
        // synchronous is the posting call's.
        let at = Sent {
            clock: c.clock,
            node: c.node,
            enter: c.enter,
            leave: Some(c.leave),
            ..*s
        };
        let lr = self.late_receiver(k.0, &at, r, posted, now_ns);
        if c.group.is_some() {
            return self.send_settled(Some(c), Some((lr, k.1)));
        }
        match lr {
            Ok(w) => {
                let charge = Charge {
                    culprit: k.1,
                    period: self.figures.p2p_sample_period.max(1),
                    now_ns,
                    owner: k.0,
                };
                self.count(Pattern::LateReceiver, c.function, &[w], charge);
            }
            Err(why) => self.unresolved(why, k.0),
        }
    }

    /// A send completed in call `c` of a group, if it was one, is settled:
    /// with its Late Receiver and its receiver's rank, or `None` when it
    /// could not be evaluated (the group then counts none).
    fn send_settled(&mut self, c: Option<Completed>, lr: Option<(Result<Wait, Unresolved>, u32)>) {
        let Some(key) = c.and_then(|c| c.group) else {
            return;
        };
        if let Some((Err(why), _)) = lr {
            self.unresolved(why, key.0);
        }
        let Some(g) = self.p2p.groups.get_mut(&key) else {
            return;
        };
        g.settled += 1;
        match lr {
            Some((Ok(w), receiver)) => {
                // The latest receiver; the lowest rank of equals.
                let later = g
                    .receiver
                    .is_none_or(|(lw, lr)| (w.ns, lr) > (lw.ns, receiver));
                if later {
                    g.receiver = Some((w, receiver));
                }
            }
            _ => g.send_failed = true,
        }
    }

    /// Scalasca's Late Sender for one matched message of `receiver`: its
    /// wait (in ns, from the receiving call's enter; `Err` with the longest
    /// it may have been when the two nodes' clocks cannot tell whether it
    /// waited), or why the pair cannot be evaluated. A pair across nodes
    /// first bounds their offset.
    fn late_sender(
        &mut self,
        receiver: u32,
        s: &Sent,
        r: &Received,
        now_ns: u64,
    ) -> Result<Result<Wait, u64>, Unresolved> {
        let scale: Scale = self
            .scale([s.clock, r.clock].into_iter())
            .ok_or(Unresolved::Clock)?;
        let unknown = u64::MAX;
        if s.bytes != unknown && r.bytes != unknown && s.bytes != r.bytes {
            return Err(Unresolved::Mismatch);
        }
        if s.node != r.node {
            // Other nodes' times are never ticks (see coll.rs).
            if scale.0 != 0 {
                return Err(Unresolved::Clock);
            }
            return Ok(self.late_sender_across(receiver, s, r, now_ns));
        }
        // Sent after it was received: the two counted differently.
        if s.enter > r.leave {
            return Err(Unresolved::Mismatch);
        }
        Ok(Ok(Wait {
            rank: receiver,
            ns: scale.ns(s.enter.min(r.leave).saturating_sub(r.enter)),
            start: scale.ns(r.enter),
        }))
    }

    /// [`Job::late_sender`] of a message between two nodes, one of them
    /// this one: the message bounds their offset (received after it was
    /// sent), then the receiver's wait is said if the bound tells it; if
    /// not, `Err` with the longest it may have been.
    fn late_sender_across(
        &mut self,
        receiver: u32,
        s: &Sent,
        r: &Received,
        now_ns: u64,
    ) -> Result<Wait, u64> {
        let (sent, received) = (i128::from(s.enter), i128::from(r.leave));
        let longest = r.leave.saturating_sub(r.enter);
        match (s.node, r.node) {
            (0, n) => {
                if let Some(o) = self.nodes.offset_mut(n) {
                    o.at_least(sent - received, now_ns);
                }
            }
            (n, 0) => {
                if let Some(o) = self.nodes.offset_mut(n) {
                    o.at_most(received - sent, now_ns);
                }
            }
            // Two other nodes' ranks: theirs (not kept, see take_p2p).
            _ => {}
        }
        // The receive is this node's when the receiver waits here; else the
        // pair was only checked, for the sender's Late Receiver.
        if r.node != 0 {
            return Ok(Wait {
                rank: receiver,
                ns: 0,
                start: r.enter,
            });
        }
        let at = self.nodes.local(s.node, s.enter, now_ns).ok_or(longest)?;
        let ns = clocks::wait_for(r.enter, r.leave, at).map_err(|()| {
            let late = at.1.min(i128::from(r.leave)) - i128::from(r.enter);
            u64::try_from(late.max(0)).unwrap_or(longest)
        })?;
        Ok(Wait {
            rank: receiver,
            ns,
            start: r.enter,
        })
    }
}

impl Job {
    /// Scalasca's Late Receiver for one matched message whose send,
    /// entered and left by `sender` at `s.enter` and `s.leave`, was
    /// blocking: its wait (in ns, from the send's enter; 0 when the send
    /// completed before the receive was posted), or why it cannot be
    /// said. `posted`: the post's clock and time, for a receive posted by
    /// an earlier call. Across nodes (the sender is this node's), on the
    /// offset the records bound: `Clock` when it cannot tell whether the
    /// post came during the send.
    fn late_receiver(
        &mut self,
        sender: u32,
        s: &Sent,
        r: &Received,
        posted: Option<(u64, u64)>,
        now_ns: u64,
    ) -> Result<Wait, Unresolved> {
        let leave = s.leave.ok_or(Unresolved::Incomplete)?;
        if s.node != r.node {
            return self.late_receiver_across(sender, s, leave, r, posted, now_ns);
        }
        let post = match (r.posted_here, posted) {
            (true, _) => Some((r.clock, r.enter)),
            (false, p) => p,
        };
        let (clocks, at) = match post {
            Some((clock, at)) => ([s.clock, r.clock, clock], at),
            // Not known, but no later than the completing call's enter:
            // if that was before the send, so was the post, and the send
            // did not wait for it.
            None if r.enter <= s.enter => ([s.clock, r.clock, r.clock], s.enter),
            None => return Err(Unresolved::Incomplete),
        };
        let scale: Scale = self.scale(clocks.into_iter()).ok_or(Unresolved::Clock)?;
        // Posted after it was received: the records disagree.
        if at > r.leave {
            return Err(Unresolved::Mismatch);
        }
        let ns = if leave > at {
            scale.ns(at.saturating_sub(s.enter))
        } else {
            0
        };
        Ok(Wait {
            rank: sender,
            ns,
            start: scale.ns(s.enter),
        })
    }

    /// [`Job::late_receiver`] of a send on this node (`s.node` is 0) whose
    /// receive was on another.
    fn late_receiver_across(
        &mut self,
        sender: u32,
        s: &Sent,
        leave: u64,
        r: &Received,
        posted: Option<(u64, u64)>,
        now_ns: u64,
    ) -> Result<Wait, Unresolved> {
        if s.node != 0 {
            return Err(Unresolved::Incomplete);
        }
        let post = match (r.posted_here, posted) {
            (true, _) => Some((r.clock, r.enter)),
            (false, p) => p,
        };
        let clocks = [s.clock, r.clock, post.map_or(r.clock, |p| p.0)];
        match self.scale(clocks.into_iter()) {
            Some(Scale(0)) => {}
            _ => return Err(Unresolved::Clock),
        }
        let none = Wait {
            rank: sender,
            ns: 0,
            start: s.enter,
        };
        let (enter, leave) = (i128::from(s.enter), i128::from(leave));
        let local = |j: &Self, t| j.nodes.local(r.node, t, now_ns).ok_or(Unresolved::Clock);
        let Some((_, at)) = post else {
            // Not known, but no later than the completing call's enter.
            let (_, latest) = local(self, r.enter)?;
            return if latest <= enter {
                Ok(none)
            } else {
                Err(Unresolved::Incomplete)
            };
        };
        if at > r.leave {
            return Err(Unresolved::Mismatch);
        }
        // An MPI_Ssend completes only once its receive is posted: the post
        // bounds the offset, and the send surely waited for it.
        let synchronous = SYNCHRONOUS.contains(&s.function);
        if synchronous && let Some(o) = self.nodes.offset_mut(r.node) {
            o.at_most(leave - i128::from(at), now_ns);
        }
        let (early, late) = local(self, at)?;
        if late <= enter || (!synchronous && early >= leave) {
            // Posted before the send, or after it completed (eagerly).
            Ok(none)
        } else if early > enter && (synchronous || late < leave) {
            let mid = (early + (late - early) / 2).min(leave);
            Ok(Wait {
                ns: u64::try_from(mid - enter).unwrap_or(0),
                ..none
            })
        } else {
            Err(Unresolved::Clock)
        }
    }
}

#[cfg(test)]
mod tests;
