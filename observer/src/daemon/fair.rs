//! A fair queue: items wait in one queue per uid and are served
//! round-robin between uids, bounded in all and per uid, so one user's
//! flood delays another's items by one item per round at most. The exit
//! handover's knocks ([`super::knocks`]) and the attaches they ask for
//! ([`super::exit_handover`]) wait in one each.

use std::collections::{BTreeMap, VecDeque};

/// Items waiting per uid, served round-robin, bounded in all and per uid.
#[derive(Debug)]
pub struct Fair<T> {
    by_uid: BTreeMap<u32, VecDeque<T>>,
    len: usize,
    last_uid: Option<u32>,
    cap: usize,
    per_uid: usize,
}

impl<T> Fair<T> {
    /// An empty queue holding at most `cap` items, `per_uid` of one uid.
    pub fn new(cap: usize, per_uid: usize) -> Fair<T> {
        Fair {
            by_uid: BTreeMap::new(),
            len: 0,
            last_uid: None,
            cap,
            per_uid,
        }
    }

    /// Queues `t` for `uid`; gives it back if a bound is reached (no empty
    /// queue is left behind).
    pub fn push(&mut self, uid: u32, t: T) -> Result<(), T> {
        if self.len >= self.cap || self.len_of(uid) >= self.per_uid {
            return Err(t);
        }
        self.by_uid.entry(uid).or_default().push_back(t);
        self.len += 1;
        Ok(())
    }

    /// The next item of the uid after the one served last, and its uid.
    pub fn pop(&mut self) -> Option<(u32, T)> {
        let uid = self
            .last_uid
            .and_then(|l| {
                self.by_uid
                    .range(l.checked_add(1)?..)
                    .next()
                    .map(|(u, _)| *u)
            })
            .or_else(|| self.by_uid.keys().next().copied())?;
        self.last_uid = Some(uid);
        let q = self.by_uid.get_mut(&uid)?;
        let t = q.pop_front();
        if q.is_empty() {
            self.by_uid.remove(&uid);
        }
        self.len -= usize::from(t.is_some());
        t.map(|t| (uid, t))
    }

    /// Items waiting, all uids together.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Items of `uid` waiting.
    pub fn len_of(&self, uid: u32) -> usize {
        self.by_uid.get(&uid).map_or(0, VecDeque::len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_are_served_round_robin_and_bounded() {
        let mut f = Fair::new(5, 3);
        for (uid, t) in [(5, 1), (5, 2), (5, 3), (7, 4)] {
            f.push(uid, t).unwrap();
        }
        assert_eq!(f.push(5, 6), Err(6), "uid 5 has its 3");
        f.push(9, 5).unwrap();
        assert_eq!(f.push(11, 7), Err(7), "5 in all");
        assert_eq!((f.len(), f.len_of(5), f.len_of(11)), (5, 3, 0));
        let order: Vec<(u32, u32)> = std::iter::from_fn(|| f.pop()).collect();
        assert_eq!(order, [(5, 1), (7, 4), (9, 5), (5, 2), (5, 3)]);
        assert!(f.is_empty());
        assert!(f.by_uid.is_empty(), "no empty queue left");
    }

    #[test]
    fn the_highest_uid_is_followed_by_the_lowest() {
        let mut f = Fair::new(8, 8);
        for (uid, t) in [(u32::MAX, 1), (u32::MAX, 2), (0, 3)] {
            f.push(uid, t).unwrap();
        }
        let order: Vec<u32> = std::iter::from_fn(|| f.pop().map(|(_, t)| t)).collect();
        assert_eq!(order, [3, 1, 2]);
    }
}
