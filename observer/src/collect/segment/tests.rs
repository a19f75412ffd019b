//! The segment reader against images of each layout version it reads: well
//! formed, bad, shrinking under the reader, and its wait ring drained.

use std::os::unix::fs::PermissionsExt as _;

use observer_common::segment::{
    CallTiming, CallsiteSlot, FunctionCounters, Header, PeerCounters, RankCounters, RequestSlot,
};

use super::*;
use crate::os::clock::monotonic_ns;

/// Call-site slots of the test images: a short table, as a header may
/// say (the shim's is [`segment::CALLSITE_SLOTS`]).
const SITES: u32 = 16;
/// Wait-ring slots of the test images.
const RING: u32 = 8;

/// A well-formed segment image of `version` (4, 3 or 2): 4 peers, peer 2
/// has sent 3 messages of 24 bytes; two requests outstanding, one
/// persistent inactive. Version 3 adds the size histogram of those
/// messages, two call sites of function 7 (one in slot 3, one in the
/// last slot), a free slot with counts, a slot of a function out of
/// range and one claimed but not counted yet, and 5 calls the table
/// had no room for.
fn image_of(version: u32, now: u64) -> Vec<u8> {
    let (peers, funcs, reqs) = (4u32, FUNCTION_COUNT as u32, 8u32);
    let l = Layout::new(version, peers, funcs, reqs, SITES, RING);
    let size = l.size as usize;
    let (co, po, fo, ro, to) = (l.counters, l.peers, l.functions, l.requests, l.timing);
    let mut b = vec![0u8; size];
    let put64 =
        |b: &mut Vec<u8>, off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_ne_bytes());
    let put32 =
        |b: &mut Vec<u8>, off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_ne_bytes());
    use std::mem::offset_of;
    b[..8].copy_from_slice(&MAGIC);
    put32(&mut b, offset_of!(Header, version), version);
    put32(
        &mut b,
        offset_of!(Header, header_size),
        l.header_size as u32,
    );
    put64(&mut b, offset_of!(Header, total_size), size as u64);
    put64(
        &mut b,
        offset_of!(Header, spec_fingerprint),
        SPEC_FINGERPRINT,
    );
    put32(&mut b, offset_of!(Header, world_size), 4);
    put32(&mut b, offset_of!(Header, peer_slots), peers);
    put32(&mut b, offset_of!(Header, function_slots), funcs);
    put32(&mut b, offset_of!(Header, request_slots), reqs);
    put64(&mut b, offset_of!(Header, counters_offset), co);
    put64(&mut b, offset_of!(Header, peers_offset), po);
    put64(&mut b, offset_of!(Header, functions_offset), fo);
    put64(&mut b, offset_of!(Header, requests_offset), ro);
    put64(&mut b, offset_of!(Header, timing_offset), to);
    put32(&mut b, offset_of!(Header, ready), 1);
    let t7 = to as usize + 7 * size_of::<CallTiming>();
    put64(&mut b, t7 + offset_of!(CallTiming, calls), 3);
    put64(&mut b, t7 + offset_of!(CallTiming, time_ns), 3000);
    put64(&mut b, t7 + offset_of!(CallTiming, bytes) + 8, 96);
    put64(&mut b, t7 + offset_of!(CallTiming, hist) + 8 * 10, 3);
    put64(
        &mut b,
        co as usize + offset_of!(RankCounters, requests_started),
        7,
    );
    let p2 = po as usize + 2 * size_of::<PeerCounters>();
    put64(&mut b, p2 + offset_of!(PeerCounters, messages), 3);
    put64(&mut b, p2 + offset_of!(PeerCounters, bytes), 72);
    let f5 = fo as usize + 5 * size_of::<FunctionCounters>();
    put64(&mut b, f5, 9);
    for (i, (state, t)) in [
        (request_state::ACTIVE, now - 2_000_000_000),
        (request_state::PERSISTENT_ACTIVE, now - 1_000_000_000),
        (request_state::PERSISTENT_INACTIVE, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let r = ro as usize + i * size_of::<RequestSlot>();
        put64(
            &mut b,
            r + offset_of!(RequestSlot, handle),
            0x1000 + i as u64,
        );
        put32(&mut b, r + offset_of!(RequestSlot, state), state);
        put64(&mut b, r + offset_of!(RequestSlot, started_ns), t);
    }
    if version >= segment::V3 {
        put64(&mut b, offset_of!(Header, callsites_offset), l.callsites);
        put32(&mut b, offset_of!(Header, callsite_slots), SITES);
        let c = co as usize;
        put64(&mut b, c + offset_of!(RankCounters, callsite_table_full), 5);
        // Three sends of 24 bytes: slot 4 (16..31 B) of SEND.
        put64(
            &mut b,
            c + offset_of!(RankCounters, msg_size_hist) + 8 * 4,
            3,
        );
        let slot = |i: usize| l.callsites as usize + i * size_of::<CallsiteSlot>();
        for (i, key, calls, ns) in [
            (3, segment::callsite_key(7, 0x40_1234), 2, 2000),
            (
                SITES as usize - 1,
                segment::callsite_key(7, 0x40_1000),
                1,
                1000,
            ),
            // Free: a count without a key is nobody's.
            (5, 0, 4, 4000),
            // A function beyond the ID space.
            (
                6,
                segment::callsite_key(FUNCTION_COUNT as u16, 0x40_2000),
                4,
                4000,
            ),
            // Claimed, not counted yet.
            (7, segment::callsite_key(3, 0x40_3000), 0, 0),
            // An address no user process has.
            (8, segment::callsite_key(7, 0x40_1000) | 1 << 47, 4, 4000),
        ] {
            put64(&mut b, slot(i) + offset_of!(CallsiteSlot, key), key);
            put64(&mut b, slot(i) + offset_of!(CallsiteSlot, calls), calls);
            put64(&mut b, slot(i) + offset_of!(CallsiteSlot, time_ns), ns);
        }
    }
    if version == VERSION {
        // Two barriers on MPI_COMM_WORLD in the wait ring.
        put64(&mut b, offset_of!(Header, waits_offset), l.waits);
        put32(&mut b, offset_of!(Header, wait_slots), RING);
        put32(&mut b, offset_of!(Header, wait_sample_shift), 1);
        let w = l.waits as usize;
        put64(&mut b, w, 3);
        put64(&mut b, w + 8, waits::clock::NS);
        // Messages sampled one in 8; 5 the shim could not record.
        put64(&mut b, w + 24, 4);
        put64(&mut b, w + 32, 5);
        for (i, r) in wait_records().iter().enumerate() {
            let at = w + 64 + 64 * i;
            put64(&mut b, at, i as u64 + 1);
            put64(&mut b, at + 8, r.enter);
            put64(&mut b, at + 16, r.leave);
            put64(&mut b, at + 24, r.seq);
            put64(&mut b, at + 32, r.comm);
            put64(&mut b, at + 40, r.meta());
            put64(&mut b, at + 48, r.envelope());
            put64(&mut b, at + 56, r.bytes);
        }
    }
    b
}

/// The records of the test images' wait ring: two barriers and a
/// receive.
fn wait_records() -> [waits::Plain; 3] {
    let barrier = observer_common::function_by_name("MPI_Barrier").unwrap();
    let [a, b] = [0, 2].map(|seq| waits::Plain {
        enter: 1000 + seq,
        leave: 2000 + seq,
        seq,
        comm: waits::WORLD,
        function: barrier,
        kind: waits::kind::COLL,
        peer: waits::NO_ROOT,
        ..Default::default()
    });
    let recv = waits::Plain {
        function: observer_common::function_by_name("MPI_Waitall").unwrap(),
        kind: waits::kind::RECV,
        flags: waits::flag::MULTI,
        peer: 3,
        tag: -7,
        thread: 0xdead,
        bytes: 1 << 40,
        ..a
    };
    [a, b, recv]
}

fn drain(
    name: &str,
    bytes: &[u8],
) -> Result<Option<(WaitDrain, Vec<waits::Plain>)>, SegmentProblem> {
    let _g = crate::os::shm::guard_test_lock();
    let p = write(name, bytes, 0o600);
    let seg = Segment::open_at(&p, std::process::id()).map(|s| s.expect("present"));
    let _ = std::fs::remove_file(&p);
    let seg = seg?;
    let (mut cursor, mut out) = (0, Vec::new());
    let d = seg.drain_waits(&mut cursor, &mut out)?;
    Ok(d.map(|d| {
        // Read again: nothing new.
        let mut again = Vec::new();
        assert_eq!(
            seg.drain_waits(&mut cursor, &mut again),
            Ok(Some(WaitDrain {
                drained: waits::Drained {
                    read: 0,
                    lost: 0,
                    ..d.drained
                },
                ..d
            }))
        );
        assert!(again.is_empty());
        (d, out)
    }))
}

#[test]
fn drains_the_wait_ring_of_version_4_only() {
    let now = monotonic_ns();
    let (d, recs) = drain("w4", &image(now)).unwrap().expect("a ring");
    assert_eq!(
        d,
        WaitDrain {
            drained: waits::Drained {
                read: 3,
                lost: 0,
                clock: waits::clock::NS,
                ns_per_tick: 0,
                p2p_shift: 4,
                skipped: 5,
            },
            sample_shift: 1,
            world_size: 4,
        }
    );
    assert_eq!(recs, wait_records());
    // Version 3 has no ring; its figures are version 4's.
    assert_eq!(drain("w3", &image_of(segment::V3, now)), Ok(None));
    assert_eq!(
        read("r3", &image_of(segment::V3, now), 0o600),
        read("r4", &image(now), 0o600)
    );
    // An injected shim's records are not read: its sequence numbers
    // start where it was injected, not with its job's.
    let mut injected = image(now);
    let off = std::mem::offset_of!(Header, flags);
    injected[off..off + 4].copy_from_slice(&segment::flags::INJECTED.to_ne_bytes());
    assert_eq!(drain("winj", &injected), Ok(None));
    // A ring of a length no shim makes, or a sampling shift of 32 or
    // more, makes the segment corrupt.
    for (field, v) in [
        (std::mem::offset_of!(Header, wait_slots), 6u32),
        (std::mem::offset_of!(Header, wait_sample_shift), 32),
    ] {
        let mut bad = image(now);
        bad[field..field + 4].copy_from_slice(&v.to_ne_bytes());
        assert_eq!(drain("wbad", &bad), Err(SegmentProblem::Corrupt));
        assert_eq!(read("wbad", &bad, 0o600), Err(SegmentProblem::Corrupt));
    }
}

/// The current version's image.
fn image(now: u64) -> Vec<u8> {
    image_of(VERSION, now)
}

fn write(name: &str, bytes: &[u8], mode: u32) -> String {
    let p = format!("/dev/shm/mpi-observer-test.{}.{name}", std::process::id());
    std::fs::write(&p, bytes).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

fn read(name: &str, bytes: &[u8], mode: u32) -> Result<Figures, SegmentProblem> {
    let _g = crate::os::shm::guard_test_lock();
    let p = write(name, bytes, mode);
    let r = Segment::open_at(&p, std::process::id()).map(|s| s.expect("present").read());
    let _ = std::fs::remove_file(&p);
    r?
}

#[test]
fn reads_a_well_formed_segment() {
    let now = monotonic_ns();
    let f = read("ok", &image(now), 0o600).unwrap();
    assert_eq!(f.world_size, 4);
    assert!(f.ready);
    assert_eq!(
        f.peers.get(&2),
        Some(&PeerTraffic {
            messages: Directed { send: 3, recv: 0 },
            bytes: Directed { send: 72, recv: 0 },
        })
    );
    assert_eq!(f.peers.len(), 1);
    assert_eq!(
        f.functions.get(&5),
        Some(&LayerCalls {
            calls: 9,
            bytes: Directed::default(),
        })
    );
    let mut hist = [0; HIST_SLOTS];
    hist[10] = 3;
    assert_eq!(
        f.timing.get(&7),
        Some(&Timing {
            calls: 3,
            time_ns: 3000,
            bytes: [0, 96],
            bytes_unknown: [0, 0],
            hist,
        })
    );
    assert_eq!(f.timing.len(), 1);
    assert_eq!(f.requests.started, 7);
    assert_eq!(f.outstanding, 2);
    assert_eq!((f.persistent_active, f.persistent_inactive), (1, 1));
    assert_eq!(f.oldest_started_ns, Some(now - 2_000_000_000));
    assert_eq!(
        f.callsites,
        [
            RawSite {
                function: 7,
                addr: 0x40_1000,
                calls: 1,
                time_ns: 1000,
            },
            RawSite {
                function: 7,
                addr: 0x40_1234,
                calls: 2,
                time_ns: 2000,
            },
        ]
    );
    assert_eq!(f.callsite_table_full, 5);
    let mut sent = [0; HIST_SLOTS];
    sent[4] = 3;
    assert_eq!(f.msg_sizes, [sent, [0; HIST_SLOTS]]);
}

#[test]
fn reads_a_version_2_segment() {
    let now = monotonic_ns();
    let v2 = read("v2", &image_of(segment::V2, now), 0o600).unwrap();
    let v3 = read("v3", &image(now), 0o600).unwrap();
    // Every figure version 2 has, the same; none of version 3's.
    assert_eq!(
        v2,
        Figures {
            callsites: Vec::new(),
            callsite_table_full: 0,
            msg_sizes: [[0; HIST_SLOTS]; 2],
            ..v3
        }
    );
    assert_eq!(v2.timing.get(&7).map(|t| t.calls), Some(3));
    assert_eq!(v2.peers.len(), 1);
    // A version 2 header that claims version 3's length, or a
    // version 3 one that claims version 2's, is corrupt.
    let mut long = image_of(segment::V2, now);
    let off = std::mem::offset_of!(Header, header_size);
    long[off..off + 4].copy_from_slice(&(size_of::<Header>() as u32).to_ne_bytes());
    assert_eq!(read("v2long", &long, 0o600), Err(SegmentProblem::Corrupt));
    let mut short = image(now);
    short[off..off + 4].copy_from_slice(&(segment::V2_HEADER_SIZE as u32).to_ne_bytes());
    assert_eq!(read("v3short", &short, 0o600), Err(SegmentProblem::Corrupt));
    let mut v1 = image(now);
    let off = std::mem::offset_of!(Header, version);
    v1[off..off + 4].copy_from_slice(&1u32.to_ne_bytes());
    assert_eq!(read("v1", &v1, 0o600), Err(SegmentProblem::Version));
}

#[test]
fn a_segment_without_callsites_reads_none() {
    // MPI_OBSERVER_CALLSITES=0: no table, a header that says so.
    let mut b = image(monotonic_ns());
    let l = Layout::new(VERSION, 4, FUNCTION_COUNT as u32, 8, 0, 0);
    b.truncate(l.size as usize);
    let put = |b: &mut Vec<u8>, off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
    use std::mem::offset_of;
    put(
        &mut b,
        offset_of!(Header, callsite_slots),
        &0u32.to_ne_bytes(),
    );
    // Nor a wait ring (MPI_OBSERVER_WAITS=0).
    put(&mut b, offset_of!(Header, wait_slots), &0u32.to_ne_bytes());
    put(
        &mut b,
        offset_of!(Header, waits_offset),
        &l.waits.to_ne_bytes(),
    );
    put(
        &mut b,
        offset_of!(Header, total_size),
        &l.size.to_ne_bytes(),
    );
    let f = read("nosites", &b, 0o600).unwrap();
    assert!(f.callsites.is_empty());
    assert_eq!(f.timing.get(&7).map(|t| t.calls), Some(3));
}

#[test]
fn rejects_bad_segments() {
    let good = image(monotonic_ns());
    let mut bad_magic = good.clone();
    bad_magic[0] = b'X';
    assert_eq!(
        read("magic", &bad_magic, 0o600),
        Err(SegmentProblem::Corrupt)
    );
    assert_eq!(
        read("short", &good[..good.len() - 8], 0o600),
        Err(SegmentProblem::Corrupt)
    );
    assert_eq!(
        read("tiny", &good[..10], 0o600),
        Err(SegmentProblem::Corrupt)
    );
    let mut bad_peers = good.clone();
    let off = std::mem::offset_of!(Header, peer_slots);
    bad_peers[off..off + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
    assert_eq!(
        read("peers", &bad_peers, 0o600),
        Err(SegmentProblem::Corrupt)
    );
    let mut other_ids = good.clone();
    let off = std::mem::offset_of!(Header, spec_fingerprint);
    other_ids[off] ^= 1;
    assert_eq!(read("ids", &other_ids, 0o600), Err(SegmentProblem::Version));
    let mut bad_timing = good.clone();
    let off = std::mem::offset_of!(Header, timing_offset);
    bad_timing[off] ^= 8;
    assert_eq!(
        read("timing", &bad_timing, 0o600),
        Err(SegmentProblem::Corrupt)
    );
    // The call-site table's offset and length, each against the layout.
    let mut bad_sites = good.clone();
    let off = std::mem::offset_of!(Header, callsites_offset);
    bad_sites[off] ^= 8;
    assert_eq!(
        read("sites", &bad_sites, 0o600),
        Err(SegmentProblem::Corrupt)
    );
    for n in [SITES + 1, SITES - 1, segment::CALLSITE_SLOTS + 1, u32::MAX] {
        let mut bad_slots = good.clone();
        let off = std::mem::offset_of!(Header, callsite_slots);
        bad_slots[off..off + 4].copy_from_slice(&n.to_ne_bytes());
        assert_eq!(
            read("slots", &bad_slots, 0o600),
            Err(SegmentProblem::Corrupt),
            "{n} slots"
        );
    }
    // A table longer than the shim makes, with the sizes to match.
    let mut huge = image(monotonic_ns());
    let l = Layout::new(
        VERSION,
        4,
        FUNCTION_COUNT as u32,
        8,
        segment::CALLSITE_SLOTS + 1,
        RING,
    );
    huge.resize(l.size as usize, 0);
    let put = |b: &mut Vec<u8>, off: usize, v: &[u8]| b[off..off + v.len()].copy_from_slice(v);
    use std::mem::offset_of;
    put(
        &mut huge,
        offset_of!(Header, callsite_slots),
        &(segment::CALLSITE_SLOTS + 1).to_ne_bytes(),
    );
    put(
        &mut huge,
        offset_of!(Header, total_size),
        &l.size.to_ne_bytes(),
    );
    assert_eq!(read("huge", &huge, 0o600), Err(SegmentProblem::Corrupt));
    assert_eq!(read("perm", &good, 0o666), Err(SegmentProblem::Untrusted));
    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    assert!(read("garbage", &garbage, 0o600).is_err());
}

#[test]
fn a_segment_that_shrinks_under_the_reader_is_caught() {
    // Map two pages of a one-page file: touching the second raises
    // SIGBUS, which the guard turns into a zero page and a flag.
    let _g = crate::os::shm::guard_test_lock();
    let p = write("shrink", &[7u8; 4096], 0o600);
    let f = File::open(&p).unwrap();
    let m = Mapping::new(&f, 8192).unwrap();
    assert_eq!(m.u64_at(0), u64::from_ne_bytes([7; 8]));
    assert!(!m.faulted());
    assert_eq!(m.u64_at(4096), 0);
    assert!(m.faulted());
    drop(m);
    let _ = std::fs::remove_file(&p);
}
