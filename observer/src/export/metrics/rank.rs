//! Per-rank families: today's full per-rank series (for the detail ranks,
//! for every rank with `--per-rank-detail`, and on `/metrics/ranks`), and
//! the few every rank has on the bounded `/metrics`. Names, labels and
//! values of the full series are unchanged from before issue 22.

use std::{collections::BTreeMap, time::SystemTime};

use observer_common::{FUNCTIONS, functions::Direction, maps::CallStats};

use super::{
    budget::{Family, Tier},
    detail, directions, has_direction, histogram, unix,
};
use crate::{
    collect::snapshot::Figures,
    collect::snapshot::{CallsByFunction, RankSnapshot, escape},
    export::names,
};

/// A rank with call statistics, and them.
pub type Labelled<'a> = (&'a RankSnapshot, &'a CallsByFunction);

/// `mpi_calls_total`, `mpi_call_seconds_total`, `mpi_bytes_total` and
/// `mpi_bytes_unknown_calls_total` of `ranks`.
pub fn calls(fams: &mut Vec<Family>, ranks: &[Labelled<'_>]) {
    let mut calls = Family::always(
        names::CALLS,
        "counter",
        "MPI calls completed, per rank and function (outermost calls only).",
    );
    let mut seconds = Family::always(
        names::SECONDS,
        "counter",
        "Time spent inside completed MPI calls, per rank and function.",
    );
    let mut bytes = Family::always(
        names::BYTES,
        "counter",
        "Bytes in the data arguments of completed calls (count x datatype size), per rank, function and direction; see the README for the conventions.",
    );
    let mut unknown = Family::always(
        "mpi_bytes_unknown_calls_total",
        "counter",
        "Completed calls whose byte figure could not be known exactly (derived or unreadable datatype, count arrays) and so is not in mpi_bytes_total; absent while zero.",
    );
    let mut fs = [&mut calls, &mut seconds, &mut bytes, &mut unknown];
    for (r, s) in ranks {
        for (id, st) in s.iter() {
            call_lines(&mut fs, "mpi_", &r.labels.rank, Tier::Detail, *id, st);
        }
    }
    fams.extend([calls, seconds, bytes, unknown]);
}

/// The four call families' lines (calls, seconds, bytes, unknown bytes) of
/// function `id` with figures `st` under `labels`, for names starting with
/// `prefix`: `mpi_` for a rank's series, `mpi_job_` for a job's sums.
pub fn call_lines(
    fams: &mut [&mut Family; 4],
    prefix: &str,
    labels: &str,
    tier: Tier,
    id: u16,
    st: &CallStats,
) {
    let name = FUNCTIONS[id as usize].name;
    let [calls, seconds, bytes, unknown] = fams;
    calls.line(
        tier,
        format_args!(
            "{prefix}calls_total{{{labels},function=\"{name}\"}} {}",
            st.calls
        ),
    );
    seconds.line(
        tier,
        format_args!(
            "{prefix}call_seconds_total{{{labels},function=\"{name}\"}} {}",
            st.time_ns as f64 / 1e9
        ),
    );
    for d in [Direction::Send, Direction::Recv] {
        if has_direction(id, d) {
            bytes.line(
                tier,
                format_args!(
                    "{prefix}bytes_total{{{labels},function=\"{name}\",direction=\"{}\"}} {}",
                    d.as_str(),
                    st.bytes[d as usize]
                ),
            );
        }
    }
    for d in [Direction::Send, Direction::Recv] {
        // Only where it happened: most calls never have an unknown figure,
        // and this halves the byte series of a typical rank.
        if st.bytes_unknown[d as usize] > 0 {
            unknown.line(
                tier,
                format_args!(
                    "{prefix}bytes_unknown_calls_total{{{labels},function=\"{name}\",direction=\"{}\"}} {}",
                    d.as_str(),
                    st.bytes_unknown[d as usize]
                ),
            );
        }
    }
}

/// One call site series' figures: calls and nanoseconds.
pub type SiteFigures = (u64, u64);

/// A rank's call-site series: each site with series of its own (see
/// [`crate::collect::callsites`]), and `callsite="other"` for the rest of the
/// function's calls, while there are any; in the rank's order of sites.
pub fn rank_sites<'a>(
    r: &'a RankSnapshot,
    calls: &CallsByFunction,
) -> Vec<(u16, &'a str, SiteFigures)> {
    let mut series = Vec::new();
    if r.callsites.is_empty() {
        return series;
    }
    let mut named: BTreeMap<u16, SiteFigures> = BTreeMap::new();
    // A site still being named is in neither its own series nor `other`
    // until it is named, so `other` never decreases.
    for s in r.callsites.iter().filter(|s| s.exported || s.pending) {
        if s.exported {
            series.push((s.function, &*s.name, (s.calls, s.time_ns)));
        }
        let n = named.entry(s.function).or_default();
        n.0 = n.0.saturating_add(s.calls);
        n.1 = n.1.saturating_add(s.time_ns);
    }
    for (&id, st) in calls.iter() {
        let n = named.get(&id).copied().unwrap_or_default();
        let other = (st.calls.saturating_sub(n.0), st.time_ns.saturating_sub(n.1));
        if other.0 > 0 {
            series.push((id, crate::collect::callsites::OTHER, other));
        }
    }
    series
}

/// `mpi_callsite_calls_total` and `mpi_callsite_seconds_total` of the ranks
/// with call sites.
pub fn callsites(fams: &mut Vec<Family>, ranks: &[Labelled<'_>]) {
    let mut series: Vec<(&RankSnapshot, u16, &str, SiteFigures)> = Vec::new();
    for (r, calls) in ranks {
        series.extend(
            rank_sites(r, calls)
                .into_iter()
                .map(|(id, site, f)| (*r, id, site, f)),
        );
    }
    series.sort_by_key(|a| (a.0.pid, a.1));
    let mut calls = Family::new(
        "mpi_callsite_calls_total",
        "counter",
        "MPI calls completed per rank, function and call site: the calling function in the application (docs/callsites.md); callsite=\"other\" counts the calls beyond each (rank, function)'s named sites.",
    );
    let mut seconds = Family::new(
        "mpi_callsite_seconds_total",
        "counter",
        "Time inside completed MPI calls per rank, function and call site, as mpi_callsite_calls_total.",
    );
    for (r, id, site, (n, ns)) in &series {
        let (l, f, s) = (&r.labels.rank, FUNCTIONS[*id as usize].name, escape(site));
        calls.line(
            Tier::Detail,
            format_args!("mpi_callsite_calls_total{{{l},function=\"{f}\",callsite=\"{s}\"}} {n}"),
        );
        seconds.line(
            Tier::Detail,
            format_args!(
                "mpi_callsite_seconds_total{{{l},function=\"{f}\",callsite=\"{s}\"}} {}",
                *ns as f64 / 1e9
            ),
        );
    }
    fams.extend([calls, seconds]);
}

/// Per-rank latency histograms of `ranks` (`--per-rank-histograms`).
pub fn histograms(hist: &mut Family, ranks: &[Labelled<'_>]) {
    for (r, s) in ranks {
        for (id, st) in s.iter() {
            hist.group(Tier::Histograms, |out| {
                histogram(out, &r.labels.rank, *id, st);
            });
        }
    }
}

/// The series every rank of `ranks` has (info, up, its MPI and wall
/// seconds), and the times of the ranks of `full` (its start, attach and
/// exit), which are full per-rank series: the wall seconds give the time
/// observed, and `mpi_rank_up` the exit.
pub fn minimal(
    fams: &mut Vec<Family>,
    ranks: &[&RankSnapshot],
    full: &[&RankSnapshot],
    now: SystemTime,
) {
    let t = Tier::RankMinimal;
    let mut info = Family::always(
        names::RANK_INFO,
        "gauge",
        "One series per observed rank, with its pid, world size, MPI library and where its job id came from (jobid_source: cgroup, verified; environment or launcher, claimed).",
    );
    let mut up = Family::always(
        names::RANK_UP,
        "gauge",
        "1 while the rank runs, 0 once it exited (its figures are kept for --retain-exited).",
    );
    let mut start = Family::always(
        "mpi_rank_start_time_seconds",
        "gauge",
        "Unix time the rank's process started.",
    );
    let mut attach = Family::always(
        "mpi_rank_attach_time_seconds",
        "gauge",
        "Unix time the observer attached to the rank: the wall-clock base of its counters.",
    );
    let mut exit = Family::always(
        "mpi_rank_exit_time_seconds",
        "gauge",
        "Unix time the observer saw the rank exit; absent while it runs.",
    );
    let mut mpi = Family::always(
        names::RANK_MPI_SECONDS,
        "counter",
        "Time spent inside completed MPI calls, all functions: the sum of the rank's mpi_call_seconds_total.",
    );
    let mut wall = Family::always(
        "mpi_rank_wall_seconds_total",
        "counter",
        "Wall-clock time the rank's figures cover, from the start of their counting (the attach, or the process's start under the shim) to now or to its exit: MPI fraction = mpi_rank_mpi_seconds_total / this.",
    );
    for r in ranks {
        let l = &r.labels.rank;
        info.line(
            t,
            format_args!(
                "mpi_rank_info{{{l},pid=\"{}\",size=\"{}\",library=\"{}\",version=\"{}\",jobid_source=\"{}\"}} 1",
                r.pid,
                escape(&r.identity.size),
                r.library,
                escape(&r.version),
                r.identity.jobid_source.as_str()
            ),
        );
        up.line(
            t,
            format_args!("mpi_rank_up{{{l}}} {}", u8::from(r.running())),
        );
        mpi.line(
            t,
            format_args!(
                "mpi_rank_mpi_seconds_total{{{l}}} {}",
                detail::mpi_ns(r) as f64 / 1e9
            ),
        );
        wall.line(
            t,
            format_args!(
                "mpi_rank_wall_seconds_total{{{l}}} {}",
                detail::wall(r, now).as_nanos() as f64 / 1e9
            ),
        );
    }
    for r in full {
        let l = &r.labels.rank;
        start.line(
            Tier::Detail,
            format_args!("mpi_rank_start_time_seconds{{{l}}} {}", unix(r.started)),
        );
        attach.line(
            Tier::Detail,
            format_args!("mpi_rank_attach_time_seconds{{{l}}} {}", unix(r.attached)),
        );
        if let Some(e) = r.exited {
            exit.line(
                Tier::Detail,
                format_args!("mpi_rank_exit_time_seconds{{{l}}} {}", unix(e)),
            );
        }
    }
    fams.extend([info, up, start, attach, exit, mpi, wall]);
}

/// The shim's argument-level figures, from each rank's stats segment: the
/// request gauges for the ranks of `full`, and per peer, the request
/// counters and the layer's own counts for those of `wide` (rank × peer:
/// only on request).
pub fn segments(fams: &mut Vec<Family>, full: &[&RankSnapshot], wide: &[&RankSnapshot]) {
    fn seg<'a>(ranks: &[&'a RankSnapshot]) -> Vec<(&'a RankSnapshot, &'a Figures)> {
        ranks
            .iter()
            .filter_map(|r| r.segment.as_ref().map(|s| (*r, &s.figures)))
            .collect()
    }
    let (req, with) = (seg(full), seg(wide));
    if req.is_empty() && with.is_empty() {
        return;
    }
    let d = Tier::Detail;
    let fam = |name, kind, help| Family::always(name, kind, help);
    let mut messages = fam(
        "mpi_peer_messages_total",
        "counter",
        "Point-to-point messages per peer (its MPI_COMM_WORLD rank) and direction, from the shim's stats layer.",
    );
    let mut bytes = fam(
        names::PEER_BYTES,
        "counter",
        "Point-to-point bytes per peer and direction (actual received sizes), from the shim's stats layer.",
    );
    for (r, f) in &with {
        for (peer, t) in &f.peers {
            for (dir, n) in directions(t.messages) {
                messages.line(
                    d,
                    format_args!(
                        "mpi_peer_messages_total{{{},peer=\"{peer}\",direction=\"{dir}\"}} {n}",
                        r.labels.rank
                    ),
                );
            }
        }
        for (peer, t) in &f.peers {
            for (dir, n) in directions(t.bytes) {
                bytes.line(
                    d,
                    format_args!(
                        "mpi_peer_bytes_total{{{},peer=\"{peer}\",direction=\"{dir}\"}} {n}",
                        r.labels.rank
                    ),
                );
            }
        }
    }
    let mut outstanding = fam(
        names::OUTSTANDING,
        "gauge",
        "Nonblocking and started persistent requests not yet completed.",
    );
    let mut oldest = fam(
        names::OLDEST_AGE,
        "gauge",
        "Age of the oldest outstanding request; 0 when none, and for exited ranks.",
    );
    for r in full {
        if let Some(s) = &r.segment {
            let l = &r.labels.rank;
            outstanding.line(
                d,
                format_args!("mpi_requests_outstanding{{{l}}} {}", s.figures.outstanding),
            );
            oldest.line(
                d,
                format_args!(
                    "mpi_request_oldest_age_seconds{{{l}}} {}",
                    s.oldest_request_age.as_nanos() as f64 / 1e9
                ),
            );
        }
    }
    let mut persistent = fam(
        "mpi_requests_persistent",
        "gauge",
        "Persistent requests by state: active (started, not completed) or inactive.",
    );
    for (r, f) in &req {
        let l = &r.labels.rank;
        persistent.line(
            d,
            format_args!(
                "mpi_requests_persistent{{{l},state=\"active\"}} {}",
                f.persistent_active
            ),
        );
        persistent.line(
            d,
            format_args!(
                "mpi_requests_persistent{{{l},state=\"inactive\"}} {}",
                f.persistent_inactive
            ),
        );
    }
    // Families of none of these ranks are left out whole: on the bounded
    // `/metrics` no rank has its peers, counters and layer counts.
    if !with.is_empty() {
        fams.extend([messages, bytes]);
    }
    if !req.is_empty() {
        fams.extend([outstanding, oldest, persistent]);
    }
    if with.is_empty() {
        return;
    }
    for (name, help, value) in SEGMENT_COUNTERS {
        let mut c = fam(name, "counter", help);
        for (r, f) in &with {
            c.line(d, format_args!("{name}{{{}}} {}", r.labels.rank, value(f)));
        }
        fams.push(c);
    }
    let mut layer_calls = fam(
        "mpi_layer_calls_total",
        "counter",
        "Calls seen by the shim's stats layer, per function (collectives and point-to-point).",
    );
    let mut layer_bytes = fam(
        names::LAYER_BYTES,
        "counter",
        "Bytes per function and direction by the stats layer's definition (root-only arguments at the root only); see the README.",
    );
    for (r, f) in &with {
        for (id, c) in &f.functions {
            layer_calls.line(
                d,
                format_args!(
                    "mpi_layer_calls_total{{{},function=\"{}\"}} {}",
                    r.labels.rank, FUNCTIONS[*id as usize].name, c.calls
                ),
            );
        }
    }
    for (r, f) in &with {
        for (id, c) in &f.functions {
            for (dir, n) in directions(c.bytes) {
                layer_bytes.line(
                    d,
                    format_args!(
                        "mpi_layer_bytes_total{{{},function=\"{}\",direction=\"{dir}\"}} {n}",
                        r.labels.rank, FUNCTIONS[*id as usize].name
                    ),
                );
            }
        }
    }
    fams.extend([layer_calls, layer_bytes]);
}

/// A segment counter: its name, help, and how to read it from the figures.
pub type SegmentCounter = (&'static str, &'static str, fn(&Figures) -> u64);

/// The stats layer's per-rank counters, one series per rank.
pub const SEGMENT_COUNTERS: [SegmentCounter; 7] = [
    (
        "mpi_requests_started_total",
        "Nonblocking and persistent requests started.",
        |f| f.requests.started,
    ),
    (
        "mpi_requests_completed_total",
        "Requests seen completing through the Wait and Test families.",
        |f| f.requests.completed,
    ),
    ("mpi_requests_cancelled_total", "Requests cancelled.", |f| {
        f.requests.cancelled
    }),
    (
        "mpi_request_table_full_total",
        "Requests not tracked because the per-process table (4096 slots) was full.",
        |f| f.requests.table_full,
    ),
    (
        "mpi_callsite_table_full_total",
        "Timed calls whose call site found the per-process call-site table (1024 slots) full: counted, their site in callsite=\"other\".",
        |f| f.callsite_table_full,
    ),
    (
        "mpi_peer_overflow_messages_total",
        "Messages with world ranks beyond the segment's 65536 peer slots.",
        |f| f.peer_overflow_messages,
    ),
    (
        "mpi_unattributed_messages_total",
        "Messages whose peer or size the stats layer could not determine.",
        |f| f.unattributed_messages,
    ),
];

/// `mpi_rank_detail`: the mark of each detail rank, with why it is one.
pub fn marks(fams: &mut Vec<Family>, ranks: &[&RankSnapshot], chosen: &detail::Detail) {
    let mut f = Family::always(
        "mpi_rank_detail",
        "gauge",
        "1 for each detail rank: per job and node, the --detail-ranks most and least loaded ranks by MPI fraction (sticky), which carry the full per-rank series on /metrics.",
    );
    for r in ranks {
        if let Some(reason) = chosen.get(&r.pid) {
            f.line(
                Tier::DetailMark,
                format_args!(
                    "mpi_rank_detail{{{},reason=\"{}\"}} 1",
                    r.labels.rank,
                    reason.as_str()
                ),
            );
        }
    }
    fams.push(f);
}
