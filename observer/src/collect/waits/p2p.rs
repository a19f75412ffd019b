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
//! still), else it is unresolved. Scalasca also counts sends completed in
//! `MPI_Wait` or `MPI_Waitall`; the shim does not record those completions
//! yet (docs/waits.md, "Not yet").
//!
//! **Matching.** The sender's record and the receiver's name one message by
//! (sender, receiver, tag, its number on that envelope), which MPI's
//! non-overtaking order makes the same on both sides (see the shim's
//! `stats/waits.rs`). The two must agree on the size, and the send must
//! have been posted before the receive completed; a pair that does not is
//! a mismatch (a rank that miscounted), never a wait.
//!
//! **Groups.** A receiver's records of one `MPI_Waitall` share its thread
//! and its enter time. The group is whole at its end record (the shim
//! writes one after the call's last receive), else once a later record of
//! that thread has come (the ring keeps a thread's records in order), or
//! at the timeout; it is evaluated once each of its messages is matched,
//! and not at all if one of them could not be (its message is counted
//! unresolved).

use std::collections::HashMap;

use observer_common::waits::{self, flag, kind};

use super::{Charge, Job, MAX_PENDING, Pattern, Scale, TIMEOUT_NS, Unresolved, Wait};

/// A message: (sender, receiver, tag, number on the envelope).
type Key = (u32, u32, i32, u64);
/// A call's group of receives: (receiver, thread, the call's enter).
type GroupKey = (u32, u32, u64);

/// The sender's half of a message.
#[derive(Clone, Copy, Debug)]
struct Sent {
    clock: u64,
    enter: u64,
    bytes: u64,
    /// A blocking send's leave (Late Receiver).
    leave: Option<u64>,
    /// The function of the call that posted it.
    function: u16,
}

/// The receiver's half.
#[derive(Clone, Copy, Debug)]
struct Received {
    clock: u64,
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

/// A message waiting for a half.
#[derive(Debug)]
struct Message {
    first_ns: u64,
    sent: Option<Sent>,
    received: Option<Received>,
    /// When a receive posted by an earlier call was posted, and on which
    /// clock.
    posted: Option<(u64, u64)>,
}

/// A call's receives, while some are unmatched or more may come.
#[derive(Debug)]
struct Group {
    first_ns: u64,
    /// Its receives seen so far, and how many of them are settled.
    members: u32,
    settled: u32,
    /// One could not be matched: the group counts no wait.
    failed: bool,
    /// No more receives will come.
    whole: bool,
    /// The latest sender so far: the wait for it (from the call's enter,
    /// in ns) and its rank.
    latest: Option<(Wait, u32)>,
    /// The function of the call.
    function: u16,
}

/// A job's messages and groups waiting for parts.
#[derive(Debug, Default)]
pub(super) struct Messages {
    pending: HashMap<Key, Message>,
    groups: HashMap<GroupKey, Group>,
    /// The group each (receiver, thread) has open: the call's enter.
    open: HashMap<(u32, u32), u64>,
}

impl Messages {
    pub(super) fn len(&self) -> usize {
        self.pending.len()
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

impl Job {
    /// Takes a send, receive or group-end record of `rank`, on a ring
    /// keeping `clock`.
    pub(super) fn take_p2p(&mut self, rank: u32, clock: u64, r: &waits::Plain, now_ns: u64) {
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
        let recv_flags = flag::MULTI | flag::TEST | flag::POSTED_HERE;
        let valid = (0..i64::from(self.world_size)).contains(&i64::from(r.peer))
            && if send {
                r.flags & !flag::BLOCKING == 0
            } else if post {
                r.flags == 0
            } else {
                r.flags & !recv_flags == 0
                    && r.flags & (flag::MULTI | flag::TEST) != flag::MULTI | flag::TEST
            };
        if !valid {
            self.figures.records_invalid += 1;
            return;
        }
        let m = &mut self.p2p;
        // A post's time is another call's: it neither opens nor closes a
        // group.
        if !post {
            m.seal(rank, r.thread, r.enter);
        }
        let peer = r.peer as u32;
        let key = if send {
            (rank, peer, r.tag, r.seq)
        } else {
            (peer, rank, r.tag, r.seq)
        };
        if !m.pending.contains_key(&key) && m.pending.len() >= MAX_PENDING {
            self.figures.unresolved[Unresolved::Overflow as usize] += 1;
            return;
        }
        let msg = m.pending.entry(key).or_insert(Message {
            first_ns: now_ns,
            sent: None,
            received: None,
            posted: None,
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
                enter: r.enter,
                bytes: r.bytes,
                leave: (r.flags & flag::BLOCKING != 0).then_some(r.leave),
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
            let g = (rank, r.thread, r.enter);
            if !m.groups.contains_key(&g) && m.groups.len() >= MAX_PENDING {
                // Without its group the receive cannot be counted right:
                // given up, with its message.
                m.pending.remove(&key);
                self.figures.unresolved[Unresolved::Overflow as usize] += 1;
                return;
            }
            m.groups
                .entry(g)
                .or_insert(Group {
                    first_ns: now_ns,
                    members: 0,
                    settled: 0,
                    failed: false,
                    whole: false,
                    latest: None,
                    function: r.function,
                })
                .members += 1;
            m.open.insert((rank, r.thread), r.enter);
            group = Some(g);
        }
        if let Some(msg) = m.pending.get_mut(&key) {
            msg.received = Some(Received {
                clock,
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
                (Some(s), Some(r)) => self.late_sender(k.1, &s, &r),
                _ => Err(Unresolved::Incomplete),
            };
            if let (Ok(_), Some(s), Some(r)) = (&outcome, m.sent, m.received)
                && s.leave.is_some()
            {
                match self.late_receiver(k.0, &s, &r, m.posted) {
                    Ok(w) => {
                        let charge = Charge {
                            culprit: k.1,
                            period,
                            now_ns,
                        };
                        self.count(Pattern::LateReceiver, s.function, &[w], charge);
                    }
                    Err(why) => self.figures.unresolved[why as usize] += 1,
                }
            }
            let group = m.received.and_then(|r| r.group);
            let g = group.and_then(|g| self.p2p.groups.get_mut(&g));
            match (outcome, g) {
                (Err(why), g) => {
                    self.figures.unresolved[why as usize] += 1;
                    if let Some(g) = g {
                        g.failed = true;
                        g.settled += 1;
                    }
                }
                (Ok(w), Some(g)) => {
                    g.settled += 1;
                    // The latest sender; the lowest rank of equals.
                    let later = g.latest.is_none_or(|(lw, lr)| (w.ns, lr) > (lw.ns, k.0));
                    if later {
                        g.latest = Some((w, k.0));
                    }
                }
                (Ok(_), None) if m.received.is_some_and(|r| r.test) => {}
                (Ok(w), None) => {
                    let function = m.received.map_or(0, |r| r.function);
                    let charge = Charge {
                        culprit: k.0,
                        period,
                        now_ns,
                    };
                    self.count(Pattern::LateSender, function, &[w], charge);
                }
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
            if let (false, true, Some((w, sender))) = (g.failed, g.settled >= g.members, g.latest) {
                let charge = Charge {
                    culprit: sender,
                    period,
                    now_ns,
                };
                self.count(Pattern::LateSender, g.function, &[w], charge);
            }
        }
    }

    /// Scalasca's Late Sender for one matched message of `receiver`: its
    /// wait (in ns, from the receiving call's enter), or why it cannot be
    /// said.
    fn late_sender(&self, receiver: u32, s: &Sent, r: &Received) -> Result<Wait, Unresolved> {
        let scale: Scale = self
            .scale([s.clock, r.clock].into_iter())
            .ok_or(Unresolved::Clock)?;
        let unknown = u64::MAX;
        if s.bytes != unknown && r.bytes != unknown && s.bytes != r.bytes {
            return Err(Unresolved::Mismatch);
        }
        // Sent after it was received: the two counted differently.
        if s.enter > r.leave {
            return Err(Unresolved::Mismatch);
        }
        Ok(Wait {
            rank: receiver,
            ns: scale.ns(s.enter.min(r.leave).saturating_sub(r.enter)),
            start: scale.ns(r.enter),
        })
    }
}

impl Job {
    /// Scalasca's Late Receiver for one matched message whose send,
    /// entered and left by `sender` at `s.enter` and `s.leave`, was
    /// blocking: its wait (in ns, from the send's enter; 0 when the send
    /// completed before the receive was posted), or why it cannot be
    /// said. `posted`: the post's clock and time, for a receive posted by
    /// an earlier call.
    fn late_receiver(
        &self,
        sender: u32,
        s: &Sent,
        r: &Received,
        posted: Option<(u64, u64)>,
    ) -> Result<Wait, Unresolved> {
        let leave = s.leave.ok_or(Unresolved::Incomplete)?;
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
}

#[cfg(test)]
mod tests {
    use observer_common::waits::{self, Plain, flag, kind};

    use super::super::{Drain, JobWaits, Pattern, TIMEOUT_NS, Unresolved, Waits};

    const MS: u64 = 1_000_000;
    const LS: usize = Pattern::LateSender as usize;
    const LR: usize = Pattern::LateReceiver as usize;
    const SSEND: u16 = observer_common::FunctionId::Ssend as u16;

    fn send(dest: i32, tag: i32, seq: u64, enter: u64) -> Plain {
        Plain {
            enter,
            leave: enter,
            seq,
            kind: kind::SEND,
            peer: dest,
            tag,
            thread: 1,
            bytes: 8,
            ..Plain::default()
        }
    }

    /// A blocking MPI_Ssend.
    fn ssend(dest: i32, tag: i32, seq: u64, enter: u64, leave: u64) -> Plain {
        Plain {
            leave,
            flags: flag::BLOCKING,
            function: SSEND,
            ..send(dest, tag, seq, enter)
        }
    }

    /// The post, at `enter`, of a receive completed later.
    fn posted(src: i32, tag: i32, seq: u64, enter: u64) -> Plain {
        Plain {
            kind: kind::POSTED,
            bytes: 0,
            ..send(src, tag, seq, enter)
        }
    }

    fn recv(src: i32, tag: i32, seq: u64, enter: u64, leave: u64, flags: u8) -> Plain {
        Plain {
            kind: kind::RECV,
            leave,
            flags,
            ..send(src, tag, seq, enter)
        }
    }

    /// Feeds each rank's records of a `size`-rank job (one message in
    /// `1 << shift` sampled), then settles at `now`.
    fn feed(w: &mut Waits, size: u32, shift: u64, per_rank: &[Vec<Plain>], now: u64) {
        for (rank, recs) in per_rank.iter().enumerate() {
            w.add(
                "j",
                &Drain {
                    p2p_shift: shift + 1,
                    ..Drain::ns(rank as u32, size, recs)
                },
                now,
            );
        }
        w.settle(now);
    }

    fn run(size: u32, shift: u64, per_rank: &[Vec<Plain>], now: u64) -> (Waits, JobWaits) {
        let mut w = Waits::default();
        feed(&mut w, size, shift, per_rank, now);
        let j = w.figures("j").unwrap().clone();
        (w, j)
    }

    #[test]
    fn a_receive_posted_early_waits_for_its_late_sender() {
        // Rank 1 enters MPI_Recv at 0 ms each 100 ms; rank 0 sends 20 ms
        // later; the receive ends 1 ms after that.
        let per_rank: Vec<Vec<Plain>> = vec![
            (0..10)
                .map(|i| send(1, 5, i, i * 100 * MS + 20 * MS))
                .collect(),
            (0..10)
                .map(|i| recv(0, 5, i, i * 100 * MS, i * 100 * MS + 21 * MS, 0))
                .collect(),
        ];
        let (w, j) = run(2, 0, &per_rank, 2_000 * MS);
        assert_eq!(j.waited_ns[LS], 10 * 20 * MS);
        assert_eq!(j.instances[LS], 10);
        assert_eq!(j.unresolved, [0; 5]);
        assert_eq!(j.culprit().map(|c| c.0), Some(0));
        assert_eq!(w.pending(), 0);
        assert_eq!(j.ranks[&1].waited_ns[LS], 200 * MS);
        assert_eq!(j.ranks[&0].caused_ns[LS], 200 * MS);
        let by_fn: Vec<_> = j.functions.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(by_fn, [((0, Pattern::LateSender), 200 * MS)]);
        // A function no shim writes is filed under one key.
        let mut odd = per_rank.clone();
        for r in &mut odd[1] {
            r.function = 60_000;
        }
        let (_, j) = run(2, 0, &odd, 2_000 * MS);
        let by_fn: Vec<_> = j.functions.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(
            by_fn,
            [(
                (super::super::UNKNOWN_FUNCTION, Pattern::LateSender),
                200 * MS
            )]
        );
        // A sender in time makes nobody wait; sampled ones count N times.
        let per_rank = vec![
            vec![send(1, 0, 0, 0), send(1, 0, 8, 0)],
            vec![recv(0, 0, 0, 10, 11, 0), recv(0, 0, 8, 0, 7, 0)],
        ];
        let (_, j) = run(2, 3, &per_rank, 0);
        assert_eq!((j.waited_ns[LS], j.instances[LS]), (0, 2));
        assert_eq!(j.p2p_sample_period, 8);
        let per_rank = vec![vec![send(1, 0, 0, 5)], vec![recv(0, 0, 0, 0, 7, 0)]];
        let (_, j) = run(2, 3, &per_rank, 0);
        assert_eq!(j.waited_ns[LS], 5 * 8);
    }

    #[test]
    fn a_wait_passed_on_is_charged_to_its_root_cause() {
        // The demo's step: rank 3 computes 20 ms longer. Rank 0 waits for
        // its message (10-30 ms), sends to rank 1 at 31; rank 1 waits for
        // that (10-31); in the Allreduce, rank 1 is last (32), so rank 2
        // waits 10-32 for it and ranks 0 and 3 a little.
        let allreduce = |enter: u64| Plain {
            enter: enter * MS,
            leave: 33 * MS,
            seq: 0,
            comm: waits::WORLD,
            kind: kind::COLL,
            peer: waits::NO_ROOT,
            function: observer_common::function_by_name("MPI_Allreduce").unwrap(),
            ..Plain::default()
        };
        let per_rank = vec![
            vec![
                recv(3, 0, 0, 10 * MS, 30 * MS, 0),
                send(1, 1, 0, 31 * MS),
                allreduce(31),
            ],
            vec![recv(0, 1, 0, 10 * MS, 31 * MS, 0), allreduce(32)],
            vec![allreduce(10)],
            vec![send(0, 0, 0, 30 * MS), allreduce(30)],
        ];
        let (_, j) = run(4, 0, &per_rank, 0);
        let nxn = Pattern::WaitNxn as usize;
        // Waited: rank 0 20 + 1, rank 1 21, rank 2 22, rank 3 2.
        assert_eq!(j.waited_ns[LS], 41 * MS);
        assert_eq!(j.waited_ns[nxn], 25 * MS);
        // Who came late: rank 3 for rank 0, rank 0 for rank 1, rank 1 in
        // the Allreduce.
        let late = |r: u32| j.ranks[&r].late_ns;
        assert_eq!(
            (late(3)[LS], late(0)[LS], late(1)[nxn]),
            (20 * MS, 21 * MS, 25 * MS)
        );
        // Root causes: rank 0 was waiting for rank 3 during 20 of rank 1's
        // 21 ms (the last one is rank 0's own); of rank 2's 22 ms, rank 1
        // was waiting 20 for rank 3 (passed on through rank 0) and 1 for
        // rank 0, and 1 is rank 1's own; rank 3's 2 ms are rank 0's and
        // rank 1's, rank 0's 1 ms rank 1's.
        let caused = |r: u32| j.ranks[&r].caused_ns;
        assert_eq!(caused(3)[LS], 40 * MS);
        assert_eq!(caused(3)[nxn], 20 * MS);
        assert_eq!(caused(0)[LS], MS);
        assert_eq!(caused(0)[nxn], 2 * MS);
        assert_eq!(caused(1)[nxn], 3 * MS);
        assert_eq!(j.culprit().map(|c| c.0), Some(3));
        // Nothing is charged twice: the root causes add up to the waits.
        let all = |f: fn(&super::super::RankWaits) -> [u64; super::super::PATTERNS]| {
            j.ranks
                .values()
                .map(|r| f(r).iter().sum::<u64>())
                .sum::<u64>()
        };
        assert_eq!(all(|r| r.caused_ns), 66 * MS);
        assert_eq!(all(|r| r.late_ns), 66 * MS);
        assert_eq!(all(|r| r.waited_ns), 66 * MS);
    }

    #[test]
    fn a_waitall_waits_for_its_latest_sender_only() {
        // Rank 2's Waitall (enter 0, leave 31 ms) completes messages from
        // rank 0 (sent at 30 ms) and rank 1 (at 10 ms); its next call seals
        // the group.
        let per_rank = vec![
            vec![send(2, 0, 0, 30 * MS)],
            vec![send(2, 0, 0, 10 * MS)],
            vec![
                recv(1, 0, 0, 0, 31 * MS, flag::MULTI),
                recv(0, 0, 0, 0, 31 * MS, flag::MULTI),
                send(0, 9, 0, 40 * MS),
            ],
        ];
        let (w, j) = run(3, 0, &per_rank, 0);
        assert_eq!((j.waited_ns[LS], j.instances[LS]), (30 * MS, 1));
        assert_eq!(j.culprit().map(|c| c.0), Some(0));
        // Rank 2's send to rank 0 waits for its receive.
        assert_eq!(w.pending(), 1);
        // A group not sealed is evaluated at the timeout.
        let per_rank = vec![
            vec![send(1, 0, 0, 30 * MS)],
            vec![recv(0, 0, 0, 0, 31 * MS, flag::MULTI)],
        ];
        let mut w = Waits::default();
        feed(&mut w, 2, 0, &per_rank, 0);
        assert_eq!(w.figures("j").unwrap().instances[LS], 0);
        w.settle(TIMEOUT_NS);
        let j = w.figures("j").unwrap();
        assert_eq!((j.waited_ns[LS], j.instances[LS]), (30 * MS, 1));
        // The shim's end record makes it whole at once; one for a group
        // nobody knows ends nothing.
        let end = |enter| Plain {
            kind: kind::GROUP_END,
            peer: waits::NO_ROOT,
            seq: 1,
            ..send(0, 0, 0, enter)
        };
        let per_rank = vec![
            vec![send(1, 0, 0, 30 * MS)],
            vec![recv(0, 0, 0, 0, 31 * MS, flag::MULTI), end(0), end(7)],
        ];
        let (w, j) = run(2, 0, &per_rank, 0);
        assert_eq!((j.waited_ns[LS], j.instances[LS]), (30 * MS, 1));
        assert_eq!((w.pending(), j.records_invalid), (0, 0));
    }

    #[test]
    fn a_group_with_an_unmatched_message_counts_no_wait() {
        // Rank 2 waits for ranks 0 and 1; rank 1's send never comes (a rank
        // on another node).
        let per_rank = vec![
            vec![send(2, 0, 0, 30 * MS)],
            vec![],
            vec![
                recv(0, 0, 0, 0, 31 * MS, flag::MULTI),
                recv(1, 0, 0, 0, 31 * MS, flag::MULTI),
                send(0, 9, 0, 40 * MS),
            ],
        ];
        let mut w = Waits::default();
        feed(&mut w, 3, 0, &per_rank, 0);
        w.settle(TIMEOUT_NS);
        let j = w.figures("j").unwrap();
        assert_eq!((j.waited_ns[LS], j.instances[LS]), (0, 0));
        // The unmatched receive and the send nobody received.
        assert_eq!(j.unresolved[Unresolved::Incomplete as usize], 2);
        assert_eq!(j.culprit(), None);
        assert_eq!(w.pending(), 0);
    }

    #[test]
    fn tests_match_without_a_wait_and_misnumbered_pairs_are_mismatches() {
        let per_rank = vec![
            vec![
                send(1, 0, 0, 50),
                // Sent after it was received; another size.
                send(1, 0, 1, 500),
                Plain {
                    bytes: 16,
                    ..send(1, 0, 2, 600)
                },
                // Of unknown size: believed.
                Plain {
                    bytes: u64::MAX,
                    ..send(1, 0, 3, 700)
                },
            ],
            vec![
                recv(0, 0, 0, 0, 60, flag::TEST),
                recv(0, 0, 1, 0, 100, 0),
                recv(0, 0, 2, 0, 700, 0),
                recv(0, 0, 3, 650, 800, 0),
            ],
        ];
        let (w, j) = run(2, 0, &per_rank, 0);
        assert_eq!(j.unresolved[Unresolved::Mismatch as usize], 2);
        assert_eq!((j.waited_ns[LS], j.instances[LS]), (50, 1));
        assert_eq!(w.pending(), 0);
    }

    #[test]
    fn records_no_shim_writes_are_counted_not_kept() {
        let per_rank = vec![vec![
            // A peer beyond the job, unknown flags, a send with flags,
            // both flags, time backwards, and a second send of one message.
            send(2, 0, 0, 0),
            recv(1, 0, 0, 0, 1, 0x80),
            Plain {
                flags: flag::MULTI,
                ..send(1, 0, 1, 0)
            },
            recv(1, 0, 1, 0, 1, flag::MULTI | flag::TEST),
            recv(1, 0, 2, 5, 1, 0),
            send(1, 0, 3, 0),
            send(1, 0, 3, 0),
            // A receive's flag on a send, a send's on a receive, a post
            // with flags, a post after its receive, two posts.
            Plain {
                flags: flag::POSTED_HERE,
                ..send(1, 0, 4, 0)
            },
            recv(1, 0, 5, 0, 1, flag::BLOCKING),
            Plain {
                flags: flag::TEST,
                ..posted(1, 0, 6, 0)
            },
            recv(1, 0, 7, 0, 1, 0),
            posted(1, 0, 7, 0),
            posted(1, 0, 8, 0),
            posted(1, 0, 8, 0),
        ]];
        let (w, j) = run(2, 0, &per_rank, 0);
        assert_eq!(j.records_invalid, 11);
        assert_eq!(w.pending(), 3);
    }

    #[test]
    fn a_blocking_send_waits_for_its_late_receiver() {
        // Rank 0 enters MPI_Ssend at 0 and leaves at 61 ms; rank 1 enters
        // MPI_Recv at 60 ms (its post) and leaves at 61 ms.
        let per_rank = vec![
            vec![ssend(1, 0, 0, 0, 61 * MS)],
            vec![recv(0, 0, 0, 60 * MS, 61 * MS, flag::POSTED_HERE)],
        ];
        let (w, j) = run(2, 0, &per_rank, 0);
        assert_eq!((j.waited_ns[LR], j.instances[LR]), (60 * MS, 1));
        // The receive waited for nothing, and counts as Late Sender's.
        assert_eq!((j.waited_ns[LS], j.instances[LS]), (0, 1));
        assert_eq!(j.ranks[&0].waited_ns[LR], 60 * MS);
        assert_eq!(j.ranks[&1].late_ns[LR], 60 * MS);
        assert_eq!(j.culprit().map(|c| c.0), Some(1));
        let by_fn: Vec<_> = j.functions.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(by_fn, [((SSEND, Pattern::LateReceiver), 60 * MS)]);
        assert_eq!((w.pending(), j.unresolved), (0, [0; 5]));
        // Posted by an MPI_Irecv at 40 ms, completed in an MPI_Wait entered
        // at 70: the sender waited until the post. Sampled: 8 times.
        let per_rank = vec![
            vec![ssend(1, 0, 0, 0, 71 * MS)],
            vec![posted(0, 0, 0, 40 * MS), recv(0, 0, 0, 70 * MS, 71 * MS, 0)],
        ];
        let (_, j) = run(2, 3, &per_rank, 0);
        assert_eq!((j.waited_ns[LR], j.instances[LR]), (8 * 40 * MS, 1));
        assert_eq!(j.waited_ns[LS], 0);
        // An eager send left before the receive was posted: no wait, but
        // evaluated; a send that is not blocking is not.
        let per_rank = vec![
            vec![ssend(1, 0, 0, 0, MS), send(1, 0, 1, 0)],
            vec![
                recv(0, 0, 0, 60 * MS, 61 * MS, flag::POSTED_HERE),
                recv(0, 0, 1, 60 * MS, 61 * MS, flag::POSTED_HERE),
            ],
        ];
        let (_, j) = run(2, 0, &per_rank, 0);
        assert_eq!((j.waited_ns[LR], j.instances[LR]), (0, 1));
        assert_eq!(j.instances[LS], 2);
    }

    #[test]
    fn a_post_not_known_is_bounded_or_unresolved() {
        // The post's record lost: a receive completed in a call entered
        // before the send was posted earlier still, so no wait; one
        // entered after it cannot be said.
        let per_rank = vec![
            vec![
                ssend(1, 0, 0, 10 * MS, 71 * MS),
                ssend(1, 0, 1, 80 * MS, 90 * MS),
            ],
            vec![
                recv(0, 0, 0, 5 * MS, 71 * MS, 0),
                recv(0, 0, 1, 85 * MS, 90 * MS, 0),
            ],
        ];
        let (_, j) = run(2, 0, &per_rank, 0);
        assert_eq!((j.waited_ns[LR], j.instances[LR]), (0, 1));
        assert_eq!(j.unresolved[Unresolved::Incomplete as usize], 1);
        // A post after its receive completed: a mismatch, never a wait.
        let per_rank = vec![
            vec![ssend(1, 0, 0, 0, 71 * MS)],
            vec![posted(0, 0, 0, 80 * MS), recv(0, 0, 0, 70 * MS, 71 * MS, 0)],
        ];
        let (_, j) = run(2, 0, &per_rank, 0);
        assert_eq!((j.waited_ns[LR], j.instances[LR]), (0, 0));
        assert_eq!(j.unresolved[Unresolved::Mismatch as usize], 1);
    }

    #[test]
    fn a_post_does_not_close_its_threads_group() {
        // Rank 2's Waitall completes two receives; the second's post
        // record, written between them, is another call's time.
        let per_rank = vec![
            vec![send(2, 0, 0, 30 * MS)],
            vec![send(2, 0, 0, 10 * MS)],
            vec![
                posted(1, 0, 0, 0),
                recv(1, 0, 0, MS, 31 * MS, flag::MULTI),
                posted(0, 0, 0, 0),
                recv(0, 0, 0, MS, 31 * MS, flag::MULTI),
            ],
        ];
        let mut w = Waits::default();
        feed(&mut w, 3, 0, &per_rank, 0);
        // Not sealed by the post: evaluated whole at the timeout, once.
        assert_eq!(w.figures("j").unwrap().instances[LS], 0);
        w.settle(TIMEOUT_NS);
        let j = w.figures("j").unwrap();
        assert_eq!((j.waited_ns[LS], j.instances[LS]), (29 * MS, 1));
    }

    #[test]
    fn pending_messages_are_bounded_and_skips_counted_once() {
        let recs: Vec<Plain> = (0..super::MAX_PENDING as u64 + 7)
            .map(|s| send(1, 0, s, 0))
            .collect();
        let (w, j) = run(2, 0, &[recs], 0);
        assert_eq!(w.pending(), super::MAX_PENDING);
        assert_eq!(j.unresolved[Unresolved::Overflow as usize], 7);
        // A ring's skipped count is a running total.
        let mut w = Waits::default();
        for (skipped, want) in [(5, 5), (7, 7), (2, 7), (4, 9)] {
            w.add(
                "j",
                &Drain {
                    skipped,
                    ..Drain::ns(0, 2, &[])
                },
                0,
            );
            let j = w.figures("j").unwrap();
            assert_eq!(j.unresolved[Unresolved::Skipped as usize], want);
        }
    }

    #[test]
    fn counter_ticks_wait_for_their_rate() {
        let mut w = Waits::default();
        let drain = |w: &mut Waits, rank, rate, records: &[Plain]| {
            w.add(
                "j",
                &Drain {
                    clock: waits::clock::TICKS,
                    ns_per_tick: rate,
                    ..Drain::ns(rank, 2, records)
                },
                0,
            );
        };
        drain(&mut w, 0, 0, &[send(1, 0, 0, 1_000)]);
        drain(&mut w, 1, 0, &[recv(0, 0, 0, 0, 1_100, 0)]);
        w.settle(0);
        assert_eq!(w.pending(), 1);
        drain(&mut w, 1, 2 << 32, &[]);
        w.settle(1);
        assert_eq!(w.figures("j").unwrap().waited_ns[LS], 2_000);
    }
}
