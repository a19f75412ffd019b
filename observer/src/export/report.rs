//! The report data: what a daemon knows of its ranks, every figure exact
//! and every call site named; served at `/report.json` and written by
//! `attach --report-file` (versioned by [`FORMAT`]). The client
//! (`crate::client::report`) reads it back and analyses it.

use std::{
    fs, io,
    path::Path,
    time::{SystemTime, UNIX_EPOCH},
};

use observer_common::{
    FUNCTIONS,
    segment::{RECV, SEND},
};
use serde::{Deserialize, Serialize};

use crate::{
    attach::identity::scheduler::Facts,
    collect::{
        snapshot::{RankSnapshot, Snapshot},
        waits::{JobWaits, Pattern, Unresolved},
    },
};

/// The `format` of [`Data`]; a reader refuses anything else.
pub const FORMAT: &str = "mpi-observer-report/1";

/// What one daemon knows of its ranks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Data {
    /// [`FORMAT`].
    pub format: String,
    /// The node's host name.
    pub host: String,
    /// Unix time of the collection.
    pub taken: f64,
    /// Every rank the daemon holds, running or exited.
    pub ranks: Vec<RankData>,
    /// The wait states of each job whose ranks keep wait records (the
    /// shim's `stats` layer; docs/waits.md), as this node matched them.
    /// Absent in data from daemons that did not measure them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<WaitData>,
}

/// One job's wait states on one node, since its first wait record: every
/// figure in ns, sampled instances already multiplied by their period.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WaitData {
    /// Job ID.
    pub jobid: String,
    /// The uid of its ranks, as [`RankData::uid`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Per pattern (`pattern` label, docs/waits.md), every pattern.
    pub patterns: Vec<PatternWaitData>,
    /// Instances and messages not evaluated, per reason (`reason` label),
    /// every reason.
    pub unresolved: Vec<CountData>,
    /// Still waiting for a part when the data was taken.
    pub pending: u64,
    /// Records the rings lapped before they were read.
    pub records_lost: u64,
    /// Records no shim writes.
    pub records_invalid: u64,
    /// The collectives' sampling period.
    pub sample_period: u64,
    /// The messages' sampling period, 0 when no rank recorded messages.
    pub p2p_sample_period: u64,
    /// Per rank that waited or made others wait, by rank.
    pub ranks: Vec<RankWaitData>,
    /// What was waited per function of the waiting call and pattern, the
    /// most first (`function` is `?` for a record no shim writes).
    pub functions: Vec<FunctionWaitData>,
    /// For a job with ranks on other nodes too: the largest uncertainty of
    /// their clocks' offsets to this node's, in ns (`u64::MAX` while
    /// unbounded; docs/waits.md, "Across nodes"). Absent for a job on one
    /// node, and from daemons before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_uncertainty_ns: Option<u64>,
}

/// One pattern of one job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PatternWaitData {
    /// Its label.
    pub pattern: String,
    /// Nanoseconds waited.
    pub waited_ns: u64,
    /// Instances evaluated (sampled).
    pub instances: u64,
}

/// A named count.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CountData {
    /// Its label.
    pub reason: String,
    /// The count.
    pub count: u64,
}

/// One rank's waits, per pattern (in the order of
/// [`WaitData::patterns`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankWaitData {
    /// World rank.
    pub rank: u32,
    /// Nanoseconds it waited.
    pub waited_ns: Vec<u64>,
    /// Nanoseconds it made the others wait, as their root cause (its own
    /// lateness, and what ranks that waited for it passed on).
    pub caused_ns: Vec<u64>,
    /// Nanoseconds others waited for it as the rank that came late,
    /// whether or not it was itself waiting (Scalasca's culprit).
    #[serde(default)]
    pub late_ns: Vec<u64>,
}

/// The wait in one function under one pattern.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionWaitData {
    /// MPI name of the waiting call.
    pub function: String,
    /// Pattern label.
    pub pattern: String,
    /// Nanoseconds.
    pub waited_ns: u64,
}

impl WaitData {
    /// The data of job `jobid` of `uid` from the matcher's figures, with
    /// `pending` instances and messages still waiting for parts.
    pub fn of(jobid: &str, uid: Option<u32>, w: &JobWaits, pending: usize) -> WaitData {
        let mut functions: Vec<FunctionWaitData> = w
            .functions
            .iter()
            .map(|(&(f, p), &ns)| FunctionWaitData {
                function: FUNCTIONS.get(usize::from(f)).map_or("?", |f| f.name).into(),
                pattern: p.label().into(),
                waited_ns: ns,
            })
            .collect();
        functions.sort_by(|a, b| {
            b.waited_ns
                .cmp(&a.waited_ns)
                .then_with(|| (&a.function, &a.pattern).cmp(&(&b.function, &b.pattern)))
        });
        WaitData {
            jobid: jobid.into(),
            uid,
            patterns: Pattern::ALL
                .iter()
                .enumerate()
                .map(|(i, p)| PatternWaitData {
                    pattern: p.label().into(),
                    waited_ns: w.waited_ns[i],
                    instances: w.instances[i],
                })
                .collect(),
            unresolved: Unresolved::ALL
                .iter()
                .enumerate()
                .map(|(i, u)| CountData {
                    reason: u.label().into(),
                    count: w.unresolved[i],
                })
                .collect(),
            pending: pending as u64,
            records_lost: w.records_lost,
            records_invalid: w.records_invalid,
            sample_period: w.sample_period,
            p2p_sample_period: w.p2p_sample_period,
            clock_uncertainty_ns: w.clock_uncertainty_ns.map(|u| {
                if u.is_finite() {
                    u.max(0.0) as u64
                } else {
                    u64::MAX
                }
            }),
            ranks: w
                .ranks
                .iter()
                .map(|(&rank, r)| RankWaitData {
                    rank,
                    waited_ns: r.waited_ns.to_vec(),
                    caused_ns: r.caused_ns.to_vec(),
                    late_ns: r.late_ns.to_vec(),
                })
                .collect(),
            functions,
        }
    }
}

/// One rank.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankData {
    /// Job ID.
    pub jobid: String,
    /// The real uid of the rank's process: a job is (job ID, uid), so no
    /// user's ranks join another's report. Absent in data from daemons that
    /// did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Rank in `MPI_COMM_WORLD`, as the launcher gave it.
    pub rank: String,
    /// World size, as the launcher gave it.
    pub size: String,
    /// Process ID.
    pub pid: u32,
    /// The node it ran on.
    pub host: String,
    /// MPI library and version.
    pub library: String,
    /// MPI library version.
    pub version: String,
    /// Unix time the counting began (process start, or attach).
    pub since: f64,
    /// Unix time it exited; absent while it runs.
    pub exited: Option<f64>,
    /// Where its call figures come from: "probes", "shim" or "probes+shim".
    pub source: String,
    /// Per function, only those called.
    pub functions: Vec<FunctionData>,
    /// Every named call site.
    pub callsites: Vec<SiteData>,
    /// The shim's `stats` layer's figures; absent without it.
    pub stats: Option<StatsData>,
    /// What the batch scheduler said of the rank's job; absent for a
    /// launcher's job and in data from daemons that did not record it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<SchedulerData>,
}

/// The batch scheduler's facts of a job, as one rank's environment gave
/// them (`mpi_job_scheduler_info`'s labels): claimed, not verified. An
/// absent fact is left out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchedulerData {
    /// "slurm", "pbs" or "flux".
    pub scheduler: String,
    /// The job step (Slurm).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub step: String,
    /// The job's user, as the scheduler named it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    /// The account charged.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub account: String,
    /// The partition (Slurm) or queue (PBS).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub partition: String,
    /// The array job's id.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub array_job: String,
    /// The array task's index.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub array_task: String,
}

impl From<&Facts> for SchedulerData {
    fn from(f: &Facts) -> Self {
        SchedulerData {
            scheduler: f.scheduler.as_str().into(),
            step: f.step.clone(),
            user: f.user.clone(),
            account: f.account.clone(),
            partition: f.partition.clone(),
            array_job: f.array_job.clone(),
            array_task: f.array_task.clone(),
        }
    }
}

/// One function of one rank.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FunctionData {
    /// MPI name.
    pub name: String,
    /// Calls completed.
    pub calls: u64,
    /// Total nanoseconds inside them.
    pub time_ns: u64,
    /// Bytes sent, by the README's conventions.
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_recv: u64,
    /// log2 latency histogram: slot i counts calls of [2^i, 2^(i+1)) ns.
    pub hist: Vec<u64>,
}

/// One call site of one rank.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SiteData {
    /// MPI name.
    pub function: String,
    /// The site's name (docs/callsites.md).
    pub site: String,
    /// Calls made from there.
    pub calls: u64,
    /// Their nanoseconds.
    pub time_ns: u64,
}

/// The `stats` layer's traffic figures of one rank.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsData {
    /// Point-to-point traffic per peer world rank.
    pub peers: Vec<PeerData>,
    /// log2 histogram of point-to-point message sizes sent: slot i counts
    /// messages of [2^i, 2^(i+1)) bytes (slot 0 also empty ones).
    pub sizes_sent: Vec<u64>,
    /// The same for messages received (actual sizes).
    pub sizes_recv: Vec<u64>,
}

/// Traffic with one peer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerData {
    /// The peer's world rank.
    pub peer: u32,
    /// Messages sent to it.
    pub messages_sent: u64,
    /// Bytes sent to it.
    pub bytes_sent: u64,
    /// Messages received from it.
    pub messages_recv: u64,
    /// Bytes received from it.
    pub bytes_recv: u64,
}

fn unix(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl Data {
    /// The data of a collection, taken at `now`.
    pub fn from_snapshot(snap: &Snapshot, host: &str, now: SystemTime) -> Data {
        Data {
            format: FORMAT.into(),
            host: host.into(),
            taken: unix(now),
            ranks: snap.ranks.iter().map(|r| rank_data(r, host)).collect(),
            waits: Vec::new(),
        }
    }

    /// Writes a snapshot file atomically (a temporary file, then a rename),
    /// so a reader never sees half of one.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        let json = serde_json::to_vec(self).map_err(io::Error::other)?;
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        fs::write(&tmp, json)?;
        fs::rename(&tmp, path)
    }
}

fn rank_data(r: &RankSnapshot, host: &str) -> RankData {
    let source = match (&r.segment, r.calls.is_some()) {
        (Some(s), _) if s.figures.ready && s.figures.injected => "probes+shim",
        (Some(s), _) if s.figures.ready => "shim",
        _ => "probes",
    };
    let functions = r
        .calls
        .iter()
        .flatten()
        .filter(|(_, st)| st.calls > 0)
        .map(|(&id, st)| FunctionData {
            name: FUNCTIONS[id as usize].name.into(),
            calls: st.calls,
            time_ns: st.time_ns,
            bytes_sent: st.bytes[SEND],
            bytes_recv: st.bytes[RECV],
            hist: st.hist.to_vec(),
        })
        .collect();
    let callsites = r
        .callsites
        .iter()
        .map(|s| SiteData {
            function: FUNCTIONS[s.function as usize].name.into(),
            site: s.name.to_string(),
            calls: s.calls,
            time_ns: s.time_ns,
        })
        .collect();
    let stats = r
        .segment
        .as_ref()
        .filter(|s| s.figures.ready)
        .map(|s| StatsData {
            peers: s
                .figures
                .peers
                .iter()
                .map(|(&peer, t)| PeerData {
                    peer,
                    messages_sent: t.messages.send,
                    bytes_sent: t.bytes.send,
                    messages_recv: t.messages.recv,
                    bytes_recv: t.bytes.recv,
                })
                .collect(),
            sizes_sent: s.figures.msg_sizes[SEND].to_vec(),
            sizes_recv: s.figures.msg_sizes[RECV].to_vec(),
        });
    RankData {
        jobid: r.identity.jobid.clone(),
        uid: Some(r.identity.uid),
        rank: r.identity.rank.clone(),
        size: r.identity.size.clone(),
        pid: r.pid,
        host: host.into(),
        library: r.library.into(),
        version: r.version.clone(),
        since: unix(r.counted_since),
        exited: r.exited.map(unix),
        source: source.into(),
        functions,
        callsites,
        stats,
        scheduler: r.identity.scheduler.as_deref().map(SchedulerData::from),
    }
}
