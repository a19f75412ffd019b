//! One observed rank, as the state holds it.

use std::time::{Duration, Instant, SystemTime};

use crate::{
    attach::budget::Cost,
    attach::identity::{Identity, JobidSource},
    attach::probes::Attachment,
    collect::callsites::RankSites,
    collect::segment::Segment,
    collect::snapshot::{Figures, Labels, RawSite, SegmentProblem},
};

/// The first wait before the wait drain looks again for a segment it has
/// not found (`waits.rs`).
pub(super) const FIRST_LOOK: Duration = Duration::from_secs(1);

/// One observed rank.
#[derive(Debug)]
pub struct Rank {
    /// Process ID.
    pub pid: u32,
    /// Start time in ticks since boot; identifies the process with the pid.
    pub ticks: u64,
    /// Its real uid: whose budgets it counts against.
    pub uid: u32,
    /// Map entries reserved for it (see [`crate::attach::budget`]).
    pub reserved: Cost,
    /// Rank, size, job and uid, from /proc (see [`crate::attach::identity`]).
    pub identity: Identity,
    /// The labels made of the identity, unlike every other rank's.
    pub labels: Labels,
    /// "openmpi" or "mpich".
    pub library: &'static str,
    /// Library version, cut to the label cap.
    pub version: String,
    /// Command name.
    pub comm: String,
    /// When the process started.
    pub started_at: SystemTime,
    /// When the probes went in.
    pub attached_at: SystemTime,
    /// When we noticed it exited.
    pub exited_at: Option<Instant>,
    /// The same, as wall-clock time.
    pub exited_wall: Option<SystemTime>,
    pub(super) attachment: Option<Attachment>,
    /// The shim's stats segment, held open once found.
    pub(super) segment: Option<Segment>,
    /// The last problem met with the segment, counted once per change.
    pub(super) segment_problem: Option<SegmentProblem>,
    /// The segment's figures as of the last read.
    pub figures: Option<Figures>,
    /// The next wait record of its segment's ring to read.
    pub(super) wait_cursor: u64,
    /// When the wait drain may next look for a segment it has not found
    /// yet, and the wait after that (doubling, so a rank without the shim
    /// costs a maps read a minute, not one a tick).
    pub(super) segment_look: (Instant, Duration),
    /// Its calls are counted by a shim injected into it (`attach
    /// --inject`), by this daemon or, see `adopted`, an earlier one.
    pub injected: bool,
    /// The injected shim was there, counting, before this daemon attached
    /// (a daemon restarted after `kill -9`): its timing replaces what the
    /// probes counted instead of adding to it.
    pub adopted: bool,
    /// This daemon is injecting the shim into it now: the injector, not
    /// `read_segments`, decides when the probes go.
    pub injecting: bool,
    /// How the probes read its library's handles (`maps::lib_kind`).
    pub lib_kind: u32,
    /// Its MPI library's path, as the process sees it.
    pub lib_path: std::path::PathBuf,
    /// Its call sites' names and which have series of their own.
    pub(super) sites: RankSites,
    /// An Open MPI rank attached before its library initialised its
    /// datatypes (found as it started): what to look at them again with,
    /// until they check out (see [`State::datatypes_pending`](super::State::datatypes_pending)).
    pub(super) pending_datatypes: Option<std::sync::Arc<crate::attach::datatypes::Located>>,
    /// It exited, its final figures are kept in [`State`](super::State)'s
    /// `exited_figures`, and its map entries are freed (and its budget
    /// with them): a user's retained short jobs never crowd out their
    /// next ones.
    pub(super) released: bool,
    /// Once it exited: the call sites its final figures were named from,
    /// kept while some of their names are still to be made (the
    /// symbolizer is busy, or its user spent its budget), so that they are
    /// named after it is released instead of never.
    pub(super) exited_sites: Vec<RawSite>,
}

impl Rank {
    /// Whether its shim segment is held open (crate::daemon::exit_handover).
    pub fn has_segment(&self) -> bool {
        self.segment.is_some()
    }

    /// Whether probes are attached to this rank now.
    pub fn is_probed(&self) -> bool {
        self.attachment.is_some()
    }

    /// Its probes, if attached now (a planned restart pins their links).
    pub fn attachment(&self) -> Option<&Attachment> {
        self.attachment.as_ref()
    }

    /// Uprobes plus uretprobes attached to this rank now.
    pub fn probes(&self) -> usize {
        self.attachment.as_ref().map_or(0, |a| a.probes)
    }

    /// A rank with no process behind it, for benchmarks of the metric model
    /// (scrape time and memory at scale with synthetic map entries) and its
    /// golden test.
    #[doc(hidden)]
    pub fn synthetic(pid: u32, rank: u32, jobid: &str) -> Rank {
        let identity = Identity::new(jobid, &rank.to_string(), "256", 0, JobidSource::Environment);
        Rank {
            pid,
            ticks: 0,
            uid: 0,
            reserved: Cost::default(),
            labels: Labels::new(&identity),
            identity,
            library: "openmpi",
            version: "synthetic".into(),
            comm: "synthetic".into(),
            started_at: SystemTime::now(),
            attached_at: SystemTime::now(),
            exited_at: None,
            exited_wall: None,
            attachment: None,
            segment: None,
            segment_problem: None,
            wait_cursor: 0,
            segment_look: (Instant::now(), FIRST_LOOK),
            figures: None,
            injected: false,
            adopted: false,
            injecting: false,
            lib_kind: observer_common::maps::lib_kind::OPEN_MPI,
            lib_path: "/synthetic/libmpi.so.40".into(),
            sites: RankSites::default(),
            pending_datatypes: None,
            released: false,
            exited_sites: Vec::new(),
        }
    }

    /// Call-site addresses this rank has names for (for a per-user bound
    /// on call-site names; at most `callsites::PER_RANK_NAMES`).
    pub fn callsite_names(&self) -> usize {
        self.sites.len()
    }

    /// Names the call site `addr` of a synthetic rank (no process to read).
    #[doc(hidden)]
    pub fn name_site(&mut self, addr: u64, name: &str) {
        self.sites.preset(addr, name);
    }

    /// When the counting its figures stand for began: the process's start
    /// for a shim there from its start, else the attach.
    pub fn counted_since(&self) -> SystemTime {
        match &self.figures {
            Some(f) if f.ready && !f.injected => self.started_at,
            _ => self.attached_at,
        }
    }
}

/// The line for a rank whose live shim an earlier daemon injected.
pub(super) fn adoption_line(pid: u32) -> String {
    format!(
        "pid {pid} runs a shim injected before this daemon attached; it counts the rank's calls, so the rank carries no probes"
    )
}
