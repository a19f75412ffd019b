//! One collection's facts, with named fields: what the registry gathers from
//! the probes' maps, the stats segments and its own records, and all that the
//! renderer ([`crate::metrics`]) and the summary table get to see. Plain
//! values: no map handles, no file handles, and no clock, since every time in
//! it was read by the collector (which is what lets a test render a fixed one).

use std::{
    collections::{BTreeMap, HashSet},
    time::{Duration, SystemTime},
};

use observer_common::maps::CallStats;

use crate::{
    identity::{Identity, LABEL_CAP, cut},
    segment::Figures,
};

/// One process's call statistics from the maps: function ID to its figures,
/// summed over CPUs.
pub type CallsByFunction = BTreeMap<u16, CallStats>;

/// One call site's raw figures, as the probes (`attach --callsites`) or the
/// shim's `stats` layer captured them: the application's return address in
/// the process and the calls made from there to one MPI function (the
/// outermost call on the thread, as everywhere else). Symbolized by
/// [`crate::callsites`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct RawSite {
    /// MPI function ID.
    pub function: u16,
    /// Return address in the process (the instruction after the call).
    pub addr: u64,
    /// Calls completed from there.
    pub calls: u64,
    /// Their total time in nanoseconds.
    pub time_ns: u64,
}

/// In-kernel map updates that failed (the map was full), summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MapFailures {
    /// A statistics entry could not be created.
    pub stats: u64,
    /// An in-flight entry could not be created.
    pub inflight: u64,
    /// A call-site entry could not be created (`attach --callsites`): the
    /// call is counted, its site lands in `callsite="other"`.
    pub callsites: u64,
}

/// The daemon's own figures that come with a collection.
#[derive(Clone, Copy, Debug, Default)]
pub struct Health {
    /// Map update failures so far.
    pub map_failures: MapFailures,
    /// Collections completed by the server so far.
    pub scrapes_total: u64,
}

/// Escapes a label value for the text exposition format.
pub fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// A rank's identifying labels, escaped and rendered once when the rank is
/// registered rather than at every scrape. A job is its id and its owner's
/// uid: two users can never produce the same label set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels {
    /// `jobid="...",uid="...",rank="..."`.
    pub rank: String,
    /// `jobid="...",uid="..."`.
    pub job: String,
}

impl Labels {
    /// The labels of a rank with this identity.
    pub fn new(identity: &Identity) -> Labels {
        Labels::with_rank(identity, &identity.rank)
    }

    fn with_rank(identity: &Identity, rank: &str) -> Labels {
        let job = format!(
            "jobid=\"{}\",uid=\"{}\"",
            escape(&identity.jobid),
            identity.uid
        );
        Labels {
            rank: format!("{job},rank=\"{}\"", escape(rank)),
            job,
        }
    }

    /// The labels of process `pid` with this identity, unlike any rank
    /// label set in `taken`, and whether that took a change: a rank whose
    /// (job, uid, rank) another rank holds already keeps its claim, followed
    /// by `#pidPID` (then `.2`, `.3`, ... should even that be taken), in
    /// [`LABEL_CAP`] bytes. The first holder keeps the plain labels.
    pub fn distinct(identity: &Identity, pid: u32, taken: &HashSet<&str>) -> (Labels, bool) {
        let plain = Labels::new(identity);
        if !taken.contains(plain.rank.as_str()) {
            return (plain, false);
        }
        // Terminates: `taken` is finite and each try is a new value.
        for n in 1u64.. {
            let suffix = match n {
                1 => format!("#pid{pid}"),
                n => format!("#pid{pid}.{n}"),
            };
            let rank = format!("{}{suffix}", cut(&identity.rank, LABEL_CAP - suffix.len()));
            let l = Labels::with_rank(identity, &rank);
            if !taken.contains(l.rank.as_str()) {
                return (l, true);
            }
        }
        unreachable!("a finite set leaves some suffix free")
    }
}

/// A rank's stats segment as of this collection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SegmentSnapshot {
    /// What the segment said.
    pub figures: Figures,
    /// Age of the oldest outstanding request: zero when there is none, and
    /// for a rank that has exited.
    pub oldest_request_age: Duration,
}

/// One rank as of this collection.
#[derive(Clone, Debug)]
pub struct RankSnapshot {
    /// Process ID.
    pub pid: u32,
    /// Rank, world size, job and uid, as read from /proc.
    pub identity: Identity,
    /// The labels made of the identity.
    pub labels: Labels,
    /// "openmpi" or "mpich".
    pub library: &'static str,
    /// Library version.
    pub version: String,
    /// When the process started.
    pub started: SystemTime,
    /// When the probes went in.
    pub attached: SystemTime,
    /// When the counting its figures stand for began: the process's start
    /// under a shim there from its start, else the attach.
    pub counted_since: SystemTime,
    /// When the observer saw it exit; `None` while it runs.
    pub exited: Option<SystemTime>,
    /// Call statistics from the maps; `None` when the maps hold none for it.
    pub calls: Option<CallsByFunction>,
    /// Stats-segment figures; `None` without a readable segment.
    pub segment: Option<SegmentSnapshot>,
    /// Named call sites, by function then time, heaviest first; empty when
    /// none are captured.
    pub callsites: Vec<crate::callsites::Site>,
}

impl RankSnapshot {
    /// Whether the rank still runs.
    pub fn running(&self) -> bool {
        self.exited.is_none()
    }
}

/// Everything one scrape renders.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The observed ranks, by pid.
    pub ranks: Vec<RankSnapshot>,
    /// The daemon's own figures.
    pub health: Health,
    /// When it was taken: the end of running ranks' wall time.
    pub taken: SystemTime,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            ranks: Vec::new(),
            health: Health::default(),
            taken: std::time::UNIX_EPOCH,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::JobidSource;

    #[test]
    fn escaping() {
        assert_eq!(escape(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape("x\ny"), "x\\ny");
        let id = Identity::new("j\"1", "3", "4", 1000, JobidSource::Environment);
        assert_eq!(
            Labels::new(&id),
            Labels {
                rank: r#"jobid="j\"1",uid="1000",rank="3""#.into(),
                job: r#"jobid="j\"1",uid="1000""#.into(),
            }
        );
    }

    #[test]
    fn a_second_claim_of_a_rank_gets_labels_of_its_own() {
        let id = Identity::new("42", "0", "2", 0, JobidSource::Environment);
        let first = Labels::new(&id);
        let mut taken = HashSet::new();
        taken.insert(first.rank.as_str());
        let (second, changed) = Labels::distinct(&id, 77, &taken);
        assert!(changed);
        assert_eq!(second.rank, r#"jobid="42",uid="0",rank="0#pid77""#);
        assert_eq!(second.job, first.job);
        // Even a rank that claims the suffixed value beforehand.
        taken.insert(second.rank.as_str());
        let (third, changed) = Labels::distinct(&id, 77, &taken);
        assert!(changed);
        assert_eq!(third.rank, r#"jobid="42",uid="0",rank="0#pid77.2""#);
        // Another uid never conflicts.
        let other = Identity::new("42", "0", "2", 1001, JobidSource::Environment);
        assert_eq!(
            Labels::distinct(&other, 78, &taken),
            (Labels::new(&other), false)
        );
        // A long claimed rank stays within the cap with its suffix.
        let long = Identity::new("42", &"7".repeat(500), "2", 0, JobidSource::Environment);
        let l = Labels::new(&long);
        let taken: HashSet<&str> = [l.rank.as_str()].into();
        let (d, _) = Labels::distinct(&long, u32::MAX, &taken);
        let value = d
            .rank
            .rsplit_once("rank=\"")
            .unwrap()
            .1
            .trim_end_matches('"');
        assert!(value.len() <= LABEL_CAP, "{}", value.len());
        assert!(value.ends_with("#pid4294967295"));
    }
}
