//! One collection's facts, with named fields: what the registry gathers from
//! the probes' maps, the stats segments and its own records, and all that the
//! renderer ([`crate::export::metrics`]) and the summary table get to see. Plain
//! values: no map handles, no file handles, and no clock, since every time in
//! it was read by the collector (which is what lets a test render a fixed one).

use std::{
    collections::{BTreeMap, HashSet},
    sync::Arc,
    time::{Duration, SystemTime},
};

use observer_common::maps::HIST_SLOTS;

use crate::attach::identity::{Identity, LABEL_CAP, cut};

pub use crate::attach::probes::{CallsByFunction, MapFailures, RawSite};

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

    /// The labels of a rank of another step of a job whose rank label a
    /// rank of an earlier (or concurrent) step holds on this node: the rank
    /// followed by `#stepSTEP`, the same on every node and in every run, so
    /// a job's second `srun` reads as what it is. `None` when the identity
    /// names no step, the step is not a short plain value (at most
    /// [`STEP_SUFFIX_CAP`] bytes of `[0-9A-Za-z_+.-]`), or that label is
    /// taken too: [`Labels::distinct`] decides then.
    pub fn of_step(identity: &Identity, taken: &HashSet<&str>) -> Option<Labels> {
        let step = identity.scheduler.as_deref().map(|f| f.step.as_str())?;
        let plain = !step.is_empty()
            && step.len() <= STEP_SUFFIX_CAP
            && step
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_+.-".contains(&b));
        if !plain {
            return None;
        }
        let suffix = format!("#step{step}");
        let rank = format!("{}{suffix}", cut(&identity.rank, LABEL_CAP - suffix.len()));
        let l = Labels::with_rank(identity, &rank);
        (!taken.contains(l.rank.as_str())).then_some(l)
    }
}

/// The longest step value [`Labels::of_step`] puts in a rank label.
pub const STEP_SUFFIX_CAP: usize = 16;

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
    pub callsites: Vec<Site>,
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

/// One call site's figures, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    /// MPI function ID.
    pub function: u16,
    /// The call site's name (module docs); for a site still being named,
    /// its `object+0xoffset` form.
    pub name: Arc<str>,
    /// Calls made from it.
    pub calls: u64,
    /// Their total time in nanoseconds.
    pub time_ns: u64,
    /// Whether it has series of its own (else it is counted in `other`).
    pub exported: bool,
    /// Not named yet: exported neither as its own series nor in `other`
    /// until it is (so that `other` never decreases).
    pub pending: bool,
}

// The figures of a stats segment (read by crate::collect::segment).

/// Why a segment was skipped; the label of `mpi_observer_segment_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SegmentProblem {
    /// Not a regular file, wrong owner, or writable by others.
    Untrusted,
    /// Header or sizes do not match the layout.
    Corrupt,
    /// A different layout version or function ID space.
    Version,
    /// The file shrank while being read.
    Truncated,
    /// Every SIGBUS guard slot was taken by concurrent reads: this read
    /// was refused rather than made unguarded.
    Busy,
    /// The process maps its segment, but the file was unlinked (at its
    /// `MPI_Finalize`) and this daemon cannot open a deleted mapping (no
    /// `CAP_CHECKPOINT_RESTORE` or `CAP_SYS_ADMIN` for
    /// `/proc/PID/map_files`), or the process ended as it was opened: its
    /// figures are lost to this daemon.
    Gone,
}

impl SegmentProblem {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentProblem::Untrusted => "untrusted",
            SegmentProblem::Corrupt => "corrupt",
            SegmentProblem::Version => "version",
            SegmentProblem::Truncated => "truncated",
            SegmentProblem::Busy => "busy",
            SegmentProblem::Gone => "gone",
        }
    }
}

/// A pair of figures by direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Directed {
    /// Sent.
    pub send: u64,
    /// Received.
    pub recv: u64,
}

/// Point-to-point traffic with one peer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerTraffic {
    /// Messages.
    pub messages: Directed,
    /// Bytes (actual received sizes).
    pub bytes: Directed,
}

/// One function as the stats layer counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerCalls {
    /// Calls.
    pub calls: u64,
    /// Bytes by the layer's definition (root-only arguments at the root only).
    pub bytes: Directed,
}

/// One function as the shim times it at the application's level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing {
    /// Calls.
    pub calls: u64,
    /// Total nanoseconds.
    pub time_ns: u64,
    /// Bytes per direction, by the probes' definition.
    pub bytes: [u64; 2],
    /// Calls whose byte figure for that direction is unknown.
    pub bytes_unknown: [u64; 2],
    /// log2 latency histogram (the probes' slots).
    pub hist: [u64; HIST_SLOTS],
}

/// Request counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Requests {
    /// Nonblocking and persistent requests started.
    pub started: u64,
    /// Seen completing through the Wait and Test families.
    pub completed: u64,
    /// Cancelled.
    pub cancelled: u64,
    /// Not tracked because the request table was full.
    pub table_full: u64,
}

/// One read of a segment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    /// `MPI_COMM_WORLD` size the process reported.
    pub world_size: u32,
    /// Peer world rank to its traffic; only peers with some.
    pub peers: BTreeMap<u32, PeerTraffic>,
    /// Function ID to its calls and bytes; only functions called.
    pub functions: BTreeMap<u16, LayerCalls>,
    /// Whether the segment was initialised (ready) when read; only then
    /// do its figures, timing included, stand for the rank.
    pub ready: bool,
    /// The shim was injected: its timing counts from the injection on, and
    /// adds to what the probes counted before.
    pub injected: bool,
    /// The injected shim was detached: it counts nothing more.
    pub ejected: bool,
    /// Function ID to its application-level timing; only functions called.
    pub timing: BTreeMap<u16, Timing>,
    /// Request counters.
    pub requests: Requests,
    /// Messages with world ranks beyond the peer array.
    pub peer_overflow_messages: u64,
    /// Messages whose peer or size could not be determined.
    pub unattributed_messages: u64,
    /// Outstanding requests now (active nonblocking or started persistent).
    pub outstanding: u64,
    /// `CLOCK_MONOTONIC` start of the oldest outstanding request.
    pub oldest_started_ns: Option<u64>,
    /// Persistent requests started and not completed.
    pub persistent_active: u64,
    /// Persistent requests not started.
    pub persistent_inactive: u64,
    /// The call-site table (version 3): every (function, return address)
    /// with calls, sorted; empty for a version 2 segment or a process that
    /// records no call sites.
    pub callsites: Vec<RawSite>,
    /// Timed calls the call-site table had no slot for (version 3).
    pub callsite_table_full: u64,
    /// Point-to-point message sizes per direction ([`observer_common::segment::SEND`],
    /// [`observer_common::segment::RECV`]): the log2 slots of [`observer_common::maps::hist_slot`]
    /// over bytes (version 3; zeros for version 2).
    pub msg_sizes: [[u64; HIST_SLOTS]; 2],
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attach::identity::JobidSource;

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
