//! The wait records of jobs that span nodes, kept for the other nodes'
//! daemons to fetch (`GET /waits/records?after=N`, docs/waits.md, "Across
//! nodes: shipping records"): a FIFO of drains, each a rank's records of
//! one drain of its ring, their times in this node's `CLOCK_MONOTONIC`
//! nanoseconds.
//!
//! Every record has a cursor, counting from 0 since the daemon started; a
//! peer asks for those after the cursor it holds. The outbox holds at most
//! [`MAX_RECORDS`] records and none older than [`MAX_AGE_NS`] (the matcher
//! gives an instance up after 5 s). When full, the oldest drains of the
//! user holding the most records go first: one queue a user, so that one
//! user's job cannot push out another's. Once a peer has asked at all, the
//! records dropped that no peer had fetched are counted (before, no daemon
//! was fetching: a node no peer asks counts nothing). A peer that asks for
//! records no longer held learns it from `first` and counts them itself.
//! `epoch`, drawn at random when the daemon starts, tells a peer that the
//! cursors started over.
//!
//! A peer may name the jobs it wants ([`job_key`], at most [`MAX_FILTER`]):
//! the answer then carries only their drains, and its `next` still passes
//! the others', which that peer will never ask for.

use std::collections::{BTreeMap, VecDeque};

use observer_common::waits;
use serde::{Deserialize, Serialize};

/// Records held at most (64 bytes each in memory: 4 MiB).
pub const MAX_RECORDS: usize = 65_536;
/// The oldest a drain is kept, in ns.
pub const MAX_AGE_NS: u64 = 10_000_000_000;
/// Records of one answer at most (the client asks again from its `next`).
pub const MAX_ANSWER: usize = 8_192;
/// Records of one drain at most: a larger one is split, so that an answer
/// stops within [`CHUNK`] of [`MAX_ANSWER`] and a peer knows an answer of
/// more than `MAX_ANSWER - CHUNK` records was cut ([`full`]).
pub const CHUNK: usize = 1_024;

/// Jobs a filter names at most: a peer holding more asks for every job.
pub const MAX_FILTER: usize = 64;

/// A job's key in a filter (`jobs=` of `/waits/records`): the 64-bit
/// FNV-1a hash of its label set (`jobid="..",uid=".."`), a function fixed
/// forever, so that daemons of different versions agree. Two jobs of one
/// key only cost the traffic the filter saves: the puller matches the
/// label sets it receives.
pub fn job_key(job: &str) -> u64 {
    job.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Whether an answer of `records` records was cut short of what the
/// outbox held: ask again at once.
pub fn full(records: usize) -> bool {
    records > MAX_ANSWER - CHUNK
}

/// One rank's records of one drain, as shipped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shipped {
    /// The job's label set, `jobid="..",uid=".."`.
    pub job: String,
    /// The rank's world rank, as the daemon knows it (from `/proc`).
    pub rank: u32,
    /// `MPI_COMM_WORLD`'s size as the rank saw it.
    pub world_size: u32,
    /// log2 of its collectives' sampling period.
    pub shift: u32,
    /// Its ring's `p2p_shift`.
    pub p2p_shift: u64,
    /// Its ring's count of messages it skipped: a running total.
    pub skipped: u64,
    /// The records, in `CLOCK_MONOTONIC` ns of this node.
    #[serde(with = "words")]
    pub records: Vec<waits::Plain>,
}

/// A record on the wire: `[enter, leave, seq, comm, function, kind, flags,
/// peer, tag, thread, bytes]`, each field at its own type, so that a value
/// out of range is refused by the parser.
type Words = (u64, u64, u64, u64, u16, u8, u8, i32, i32, u32, u64);

mod words {
    use observer_common::waits::Plain;
    use serde::{Deserialize as _, Deserializer, Serializer, ser::SerializeSeq as _};

    use super::Words;

    pub fn serialize<S: Serializer>(records: &[Plain], s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(records.len()))?;
        for r in records {
            let w: Words = (
                r.enter, r.leave, r.seq, r.comm, r.function, r.kind, r.flags, r.peer, r.tag,
                r.thread, r.bytes,
            );
            seq.serialize_element(&w)?;
        }
        seq.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Plain>, D::Error> {
        let words = Vec::<Words>::deserialize(d)?;
        Ok(words
            .into_iter()
            .map(
                |(enter, leave, seq, comm, function, kind, flags, peer, tag, thread, bytes)| {
                    Plain {
                        enter,
                        leave,
                        seq,
                        comm,
                        function,
                        kind,
                        flags,
                        peer,
                        tag,
                        thread,
                        bytes,
                    }
                },
            )
            .collect())
    }
}

/// An answer to `GET /waits/records`.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The outbox's epoch: drawn when the daemon started.
    pub epoch: u64,
    /// The cursor of the oldest record held.
    pub first: u64,
    /// The cursor after the last record of this answer: the next `after`.
    pub next: u64,
    /// The drains with records after `after`, oldest first.
    pub drains: Vec<Shipped>,
}

/// One drain held, with the cursor of its first record and when it came.
#[derive(Debug)]
struct Entry {
    cursor: u64,
    at_ns: u64,
    /// [`job_key`] of the drain's job.
    key: u64,
    drain: Shipped,
}

/// One user's drains, oldest first, and their records.
#[derive(Debug, Default)]
struct Queue {
    entries: VecDeque<Entry>,
    held: usize,
}

/// The FIFO of drains, one queue a user: when the outbox is full, the user
/// who holds the most records loses their oldest drain, so that one user's
/// job (a ring that claims a world larger than its ranks, or of a million
/// slots) can only push out its own records.
#[derive(Debug)]
pub struct Outbox {
    epoch: u64,
    /// By uid.
    users: BTreeMap<u32, Queue>,
    /// Records held.
    held: usize,
    /// The cursor after the newest record.
    end: u64,
    /// The highest `next` answered: records before it were fetched by a
    /// peer at least once.
    served: u64,
    /// Whether a peer has asked since the daemon started.
    asked: bool,
}

impl Outbox {
    /// An empty outbox of epoch `epoch`.
    pub fn new(epoch: u64) -> Outbox {
        Outbox {
            epoch,
            users: BTreeMap::new(),
            held: 0,
            end: 0,
            served: 0,
            asked: false,
        }
    }

    /// An empty outbox of a random epoch (from the system's generator; the
    /// clock if it fails, which still differs from the last daemon's).
    pub fn random() -> Outbox {
        use ring::rand::SecureRandom as _;
        let mut b = [0u8; 8];
        let epoch = match ring::rand::SystemRandom::new().fill(&mut b) {
            Ok(()) => u64::from_le_bytes(b),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64),
        };
        Outbox::new(epoch)
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The cursor of the oldest record held (the end when empty).
    pub fn first(&self) -> u64 {
        self.users
            .values()
            .filter_map(|q| q.entries.front())
            .map(|e| e.cursor)
            .min()
            .unwrap_or(self.end)
    }

    /// Whether a peer has asked since the daemon started: until then, what
    /// is dropped is not counted.
    pub fn asked(&self) -> bool {
        self.asked
    }

    /// Records held.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Appends `d`, of a rank of user `uid`, at `now_ns`
    /// (`CLOCK_MONOTONIC`), split into drains of at most [`CHUNK`] records;
    /// a drain without records is not kept. Drops what is older than
    /// [`MAX_AGE_NS`], then the oldest drains of the user holding the most
    /// until the records fit. Returns the records dropped that no peer had
    /// fetched, once one has asked.
    pub fn push(&mut self, d: Shipped, uid: u32, now_ns: u64) -> u64 {
        let mut dropped = self.expire(now_ns);
        let Shipped { records, .. } = &d;
        if records.is_empty() {
            return dropped;
        }
        // A drain larger than the outbox (a hostile ring of 2^20 slots)
        // keeps its newest records.
        let skip = records.len().saturating_sub(MAX_RECORDS);
        if self.asked {
            dropped += skip as u64;
        }
        self.end += skip as u64;
        let key = job_key(&d.job);
        for part in records[skip..].chunks(CHUNK) {
            while self.held + part.len() > MAX_RECORDS {
                let Some(largest) = self
                    .users
                    .iter()
                    .max_by_key(|(_, q)| q.held)
                    .map(|(u, _)| *u)
                else {
                    break;
                };
                dropped += self.pop(largest);
            }
            let q = self.users.entry(uid).or_default();
            q.entries.push_back(Entry {
                cursor: self.end,
                at_ns: now_ns,
                key,
                drain: Shipped {
                    records: part.to_vec(),
                    job: d.job.clone(),
                    ..d
                },
            });
            q.held += part.len();
            self.held += part.len();
            self.end += part.len() as u64;
        }
        dropped
    }

    /// Drops the drains older than [`MAX_AGE_NS`] at `now_ns`; returns the
    /// records dropped that no peer had fetched, once one has asked.
    pub fn expire(&mut self, now_ns: u64) -> u64 {
        let mut dropped = 0;
        let users: Vec<u32> = self.users.keys().copied().collect();
        for u in users {
            while self.users.get(&u).is_some_and(|q| {
                q.entries
                    .front()
                    .is_some_and(|e| now_ns.saturating_sub(e.at_ns) > MAX_AGE_NS)
            }) {
                dropped += self.pop(u);
            }
        }
        dropped
    }

    /// Drops the oldest drain of user `uid`; returns its records no peer
    /// had fetched, once one has asked.
    fn pop(&mut self, uid: u32) -> u64 {
        let Some(q) = self.users.get_mut(&uid) else {
            return 0;
        };
        let Some(e) = q.entries.pop_front() else {
            self.users.remove(&uid);
            return 0;
        };
        let n = e.drain.records.len();
        q.held -= n;
        if q.entries.is_empty() {
            self.users.remove(&uid);
        }
        self.held -= n;
        let end = e.cursor + n as u64;
        if !self.asked {
            return 0;
        }
        end - e.cursor.max(self.served).min(end)
    }

    /// The records after cursor `after`, at most [`MAX_ANSWER`] (at least
    /// one drain's whatever its size), in the order they came, and where to
    /// ask next.
    pub fn answer(&mut self, after: u64) -> Answer {
        self.answer_jobs(after, None)
    }

    /// [`Outbox::answer`] of the jobs whose [`job_key`] is in `jobs` only
    /// (every job's if `None`): the others' drains are passed over, `next`
    /// after them, and count as served.
    pub fn answer_jobs(&mut self, after: u64, jobs: Option<&[u64]>) -> Answer {
        let mut drains = Vec::new();
        let mut n = 0;
        let mut next = after.max(self.first()).min(self.end);
        // Each user's first drain that holds a record at or after `next`;
        // then the users' drains merged by cursor.
        let mut at: Vec<(&VecDeque<Entry>, usize)> = self
            .users
            .values()
            .map(|q| {
                let i = q
                    .entries
                    .partition_point(|e| e.cursor + e.drain.records.len() as u64 <= next);
                (&q.entries, i)
            })
            .collect();
        while let Some((q, i)) = at
            .iter_mut()
            .filter(|(q, i)| *i < q.len())
            .min_by_key(|(q, i)| q[*i].cursor)
        {
            let e = &q[*i];
            *i += 1;
            // A cursor is never trusted to be inside a drain, nor drains to
            // follow each other without gaps (a user's dropped ones).
            let start = next.max(e.cursor);
            let from = usize::try_from(start - e.cursor).unwrap_or(usize::MAX);
            let records = e.drain.records.get(from..).unwrap_or_default();
            if jobs.is_some_and(|k| !k.contains(&e.key)) {
                next = start + records.len() as u64;
                continue;
            }
            if n > 0 && n + records.len() > MAX_ANSWER {
                break;
            }
            n += records.len();
            next = start + records.len() as u64;
            drains.push(Shipped {
                records: records.to_vec(),
                job: e.drain.job.clone(),
                ..e.drain
            });
        }
        self.served = self.served.max(next);
        self.asked = true;
        Answer {
            epoch: self.epoch,
            first: self.first(),
            next,
            drains,
        }
    }

    /// [`Outbox::answer`] as JSON.
    pub fn answer_json(&mut self, after: u64) -> String {
        json(&self.answer(after))
    }

    /// [`Outbox::answer_jobs`] as JSON.
    pub fn answer_jobs_json(&mut self, after: u64, jobs: Option<&[u64]>) -> String {
        json(&self.answer_jobs(after, jobs))
    }
}

/// An answer as JSON, as `/waits/records` serves it: made off the state's
/// lock.
pub fn json(a: &Answer) -> String {
    // Numbers and strings only: it cannot fail, but is never a panic.
    serde_json::to_string(a).unwrap_or_else(|_| "{\"error\":\"not serializable\"}".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64) -> waits::Plain {
        waits::Plain {
            enter: 10 * seq,
            leave: 10 * seq + 5,
            seq,
            kind: waits::kind::COLL,
            peer: waits::NO_ROOT,
            ..Default::default()
        }
    }

    fn drain(rank: u32, seqs: std::ops::Range<u64>) -> Shipped {
        Shipped {
            job: "jobid=\"7\",uid=\"1000\"".into(),
            rank,
            world_size: 8,
            shift: 0,
            p2p_shift: 4,
            skipped: 2,
            records: seqs.map(rec).collect(),
        }
    }

    fn seqs(a: &Answer) -> Vec<u64> {
        a.drains
            .iter()
            .flat_map(|d| d.records.iter().map(|r| r.seq))
            .collect()
    }

    #[test]
    fn a_filter_carries_the_jobs_named_and_passes_the_others() {
        // FNV-1a 64's published values: the key may never change.
        assert_eq!(job_key(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(job_key("a"), 0xaf63_dc4c_8601_ec8c);
        let other = |mut d: Shipped| {
            d.job = "jobid=\"8\",uid=\"1001\"".into();
            d
        };
        let mut o = Outbox::new(1);
        o.push(drain(0, 0..3), 1000, 0);
        o.push(other(drain(0, 100..104)), 1001, 0);
        o.push(drain(1, 3..5), 1000, 0);
        o.push(other(drain(1, 104..105)), 1001, 0);
        let seven = [job_key("jobid=\"7\",uid=\"1000\"")];
        let a = o.answer_jobs(0, Some(&seven));
        // The other job's records are passed: `next` is the end.
        assert_eq!((seqs(&a), a.first, a.next), (vec![0, 1, 2, 3, 4], 0, 10));
        assert!(a.drains.iter().all(|d| d.job == drain(0, 0..0).job));
        // From the middle: what follows, of that job only.
        let a = o.answer_jobs(4, Some(&seven));
        assert_eq!((seqs(&a), a.next), (vec![3, 4], 10));
        // No job named: nothing, and the cursor at the end.
        let a = o.answer_jobs(0, Some(&[]));
        assert!(a.drains.is_empty() && a.next == 10);
        // Both, or no filter: all of it, in order.
        let both = [seven[0], job_key("jobid=\"8\",uid=\"1001\"")];
        let all = vec![0, 1, 2, 100, 101, 102, 103, 3, 4, 104];
        assert_eq!(seqs(&o.answer_jobs(0, Some(&both))), all);
        assert_eq!(seqs(&o.answer(0)), all);
        // A cut answer stops at the job's drain that does not fit, after
        // the other job's records before it, never past one it skipped
        // for want of room.
        let mut o = Outbox::new(1);
        let big = (MAX_ANSWER - CHUNK) as u64;
        for i in 0..(big / CHUNK as u64) {
            o.push(drain(0, i * 1024..(i + 1) * 1024), 1000, 0);
        }
        o.push(other(drain(0, 0..5)), 1001, 0);
        o.push(drain(0, big..big + 2 * CHUNK as u64), 1000, 0);
        let a = o.answer_jobs(0, Some(&seven));
        let n = a.drains.iter().map(|d| d.records.len()).sum::<usize>();
        assert_eq!(
            (n as u64, a.next),
            (big + CHUNK as u64, big + 5 + CHUNK as u64)
        );
        assert!(full(n));
        let a = o.answer_jobs(a.next, Some(&seven));
        assert_eq!(
            (seqs(&a), a.next),
            ((big + 1024..big + 2048).collect(), big + 5 + 2048)
        );
    }

    #[test]
    fn cursors_count_records_and_answers_resume_from_next() {
        let mut o = Outbox::new(42);
        assert_eq!(o.push(drain(0, 0..3), 1000, 0), 0);
        assert_eq!(o.push(drain(1, 3..3), 1000, 0), 0);
        assert_eq!(o.push(drain(1, 3..5), 1000, 0), 0);
        let a = o.answer(0);
        assert_eq!((a.epoch, a.first, a.next), (42, 0, 5));
        assert_eq!(seqs(&a), [0, 1, 2, 3, 4]);
        assert_eq!(a.drains[1].rank, 1);
        assert_eq!(a.drains[1].p2p_shift, 4);
        // From the middle of a drain.
        let a = o.answer(2);
        assert_eq!((seqs(&a), a.next), (vec![2, 3, 4], 5));
        // Nothing new; a cursor past the end (another daemon's) is told
        // where the end is.
        let a = o.answer(5);
        assert!(a.drains.is_empty() && a.next == 5);
        let a = o.answer(u64::MAX);
        assert!(a.drains.is_empty() && a.next == 5);
    }

    #[test]
    fn answers_are_bounded_and_large_drains_split() {
        let mut o = Outbox::new(1);
        o.push(drain(0, 0..5_000), 1000, 0);
        o.push(drain(1, 5_000..12_000), 1000, 0);
        assert_eq!(o.held(), 12_000);
        assert!(
            o.users
                .values()
                .flat_map(|q| &q.entries)
                .all(|e| e.drain.records.len() <= CHUNK)
        );
        let mut after = 0;
        let mut got = Vec::new();
        loop {
            let a = o.answer(after);
            let n = seqs(&a).len();
            assert!(n <= MAX_ANSWER);
            got.extend(seqs(&a));
            after = a.next;
            if !full(n) {
                break;
            }
        }
        assert_eq!(got, (0..12_000).collect::<Vec<_>>());
    }

    #[test]
    fn the_oldest_go_when_full_and_unfetched_ones_are_counted() {
        let mut o = Outbox::new(1);
        o.push(drain(0, 0..1_000), 1000, 0);
        // A peer fetched the first 600.
        let a = o.answer(0);
        assert_eq!(a.next, 1_000);
        o.served = 600;
        let mut dropped = 0;
        for k in 1..=65 {
            dropped += o.push(drain(0, k * 1_000..(k + 1) * 1_000), 1000, 0);
        }
        // 66,000 records came; 65,536 fit: the first drain went, 400 of it
        // never fetched.
        assert_eq!(o.held(), 65_000);
        assert_eq!(dropped, 400);
        assert_eq!(o.first(), 1_000);
        // Asking from before `first`: the answer starts at `first`, and the
        // peer counts the gap.
        let a = o.answer(10);
        assert_eq!((a.first, seqs(&a)[0]), (1_000, 1_000));
        // A hostile drain larger than the outbox keeps its newest records.
        let mut o = Outbox::new(1);
        o.answer(0);
        let dropped = o.push(drain(0, 0..70_000), 1000, 0);
        assert_eq!(
            (dropped, o.held(), o.first()),
            (70_000 - 65_536, 65_536, 4_464)
        );
        assert_eq!(seqs(&o.answer(0))[0], 4_464);
    }

    #[test]
    fn a_user_who_fills_the_outbox_loses_their_own_records() {
        let mut o = Outbox::new(1);
        o.answer(0);
        o.push(drain(0, 0..100), 1001, 0);
        o.push(drain(1, 100..200), 1002, 0);
        // User 1000 pushes a million records in a drain, then more.
        let mut dropped = o.push(drain(2, 200..1_000_200), 1000, 0);
        dropped += o.push(drain(2, 1_000_200..1_070_200), 1000, 0);
        assert!(o.held() <= MAX_RECORDS && o.held() > MAX_RECORDS - CHUNK);
        // Every record is held or counted.
        assert_eq!(dropped + o.held() as u64, 1_070_200);
        assert_eq!(o.users[&1001].held + o.users[&1002].held, 200);
        // The others' records are all there, in order, between the gaps.
        let a = o.answer(0);
        assert_eq!(a.first, 0);
        let got = seqs(&a);
        assert_eq!(got[..200], (0..200).collect::<Vec<_>>());
        assert!(got[200] > 200, "{}", got[200]);
        assert!(got.windows(2).all(|w| w[0] < w[1]));
        // A user that fills it alone pushes out another user's, if that
        // one holds more.
        let mut o = Outbox::new(1);
        o.push(drain(0, 0..40_000), 1001, 0);
        o.push(drain(1, 40_000..70_000), 1002, 0);
        assert_eq!(o.users[&1002].held, 30_000);
        assert!(o.users[&1001].held < 40_000 && o.held() <= MAX_RECORDS);
    }

    #[test]
    fn drains_older_than_ten_seconds_go() {
        // Before a peer asks, nothing is counted.
        let mut o = Outbox::new(1);
        o.push(drain(0, 0..10), 1000, 0);
        assert_eq!(o.expire(MAX_AGE_NS + 1), 0);
        assert_eq!(o.push(drain(0, 10..70_000), 1000, MAX_AGE_NS + 1), 0);
        assert_eq!(o.held(), MAX_RECORDS);
        let mut o = Outbox::new(1);
        o.answer(0);
        o.push(drain(0, 0..10), 1000, 0);
        o.push(drain(0, 10..20), 1000, 5_000_000_000);
        assert_eq!(o.expire(MAX_AGE_NS), 0);
        assert_eq!(o.held(), 20);
        assert_eq!(o.expire(MAX_AGE_NS + 1), 10);
        assert_eq!((o.held(), o.first()), (10, 10));
        // Fetched, then expired: not counted.
        o.answer(0);
        assert_eq!(o.push(drain(0, 20..21), 1000, 20_000_000_000), 0);
        assert_eq!((o.held(), o.first()), (1, 20));
        assert_eq!(o.expire(u64::MAX), 1);
        assert_eq!((o.held(), o.first(), o.answer(0).next), (0, 21, 21));
    }

    #[test]
    fn the_json_is_what_a_peer_reads() {
        let mut o = Outbox::new(u64::MAX);
        let mut d = drain(3, 0..1);
        d.records[0] = waits::Plain {
            enter: u64::MAX,
            leave: 1,
            seq: 2,
            comm: 3,
            function: 4,
            kind: 5,
            flags: 6,
            peer: -7,
            tag: i32::MIN,
            thread: 9,
            bytes: 10,
        };
        o.push(d.clone(), 1000, 0);
        let j = o.answer_json(0);
        assert_eq!(
            j,
            format!(
                "{{\"epoch\":{},\"first\":0,\"next\":1,\"drains\":[{{\"job\":\"jobid=\\\"7\\\",uid=\\\"1000\\\"\",\"rank\":3,\"world_size\":8,\"shift\":0,\"p2p_shift\":4,\"skipped\":2,\"records\":[[{},1,2,3,4,5,6,-7,{},9,10]]}}]}}",
                u64::MAX,
                u64::MAX,
                i32::MIN
            )
        );
        let back: Answer = serde_json::from_str(&j).unwrap();
        assert_eq!(back.drains, [d]);
    }
}
