//! Point-to-point wrappers: sends counted when posted (or started), receives
//! when they complete, from the status (the actual source and size), with a
//! status of the layer's own when the caller passes `MPI_STATUS_IGNORE`.
//!
//! Each wrapper continues down the stack through the next level (`next!`), then updates the segment if the call succeeded. The common
//! path is a state load, a handle compare, a size query and two relaxed
//! atomic adds: no lock, no allocation.

use core::ffi::c_int;

use observer_common::{
    FunctionId as F,
    segment::{RECV, SEND},
};

use super::{
    abi::{Status, count, int},
    comms::{MESSAGE_TAG, MESSAGE_WORLD, MESSAGES, UNKNOWN_PEER, peer},
    requests::{self, Entry, Kind},
    segment::{NULL_PEER, State, state},
    trace,
    waits::{self, Call, Completes, How, Later, Post},
};

/// Calls the next level below `stats` for `row` with these words.
macro_rules! next {
    ($row:expr; $($a:ident),*) => {{
        let f = crate::stats::next($row);
        let f: unsafe extern "C" fn($(next!(@word $a)),*) -> core::ffi::c_int =
            // SAFETY: the next level's function for this row, which takes
            // this many words and returns an int (the layer wraps only
            // procedures that return one, and the stack binds a row it wraps
            // only where a level below defines it).
            unsafe { core::mem::transmute(f) };
        // SAFETY: the words of the call this layer wraps (or a status of the
        // layer's own, alive across the call), one per parameter of `f`.
        unsafe { f($($a),*) }
    }};
    (@word $a:ident) => { usize };
}
pub(crate) use next;

/// Counts a send of `count` elements of `datatype` to `dest` with `tag` in
/// `comm`, and numbers it for the wait records; `completes`: where it
/// completes. Its peer (a world rank), its bytes, and for a sampled send
/// completed later, its message's name.
#[inline(always)]
fn sent(
    s: &State,
    count: i64,
    datatype: usize,
    dest: usize,
    tag: usize,
    comm: usize,
    completes: Completes,
) -> (i32, Option<u64>, Option<Later>) {
    let comm = s.abi.handle(comm);
    let p = peer(s, comm, int(dest));
    let bytes = s.abi.bytes(count, s.abi.handle(datatype));
    let mut later = None;
    if p != NULL_PEER {
        s.message(p, SEND, bytes);
        later = waits::sent(s, comm, p, int(tag), bytes, completes);
    }
    (p, bytes, later)
}

/// The status to hand the library: the caller's, or `own` in place of
/// `MPI_STATUS_IGNORE`.
#[inline(always)]
pub(crate) fn status_or(s: &State, status: usize, own: &mut Status) -> usize {
    if status == s.abi.c.status_ignore {
        own.0.as_mut_ptr() as usize
    } else {
        status
    }
}

/// Where the blocking send of `row` completes, for Late Receiver: `Here`
/// for Scalasca's blocking sends, the standard and synchronous modes
/// (`MPI_Send`, `MPI_Ssend`); a buffered send never waits for its receiver,
/// a ready one must find it posted.
const fn send_completes(row: usize) -> Completes {
    if row == F::Send as usize
        || row == F::SendC as usize
        || row == F::Ssend as usize
        || row == F::SsendC as usize
    {
        Completes::Here
    } else {
        Completes::Else
    }
}

/// Records the send of a blocking call (`MpiSend`) before the call, as
/// Score-P does: its message leaves while the call runs, and a reader
/// orders it before the receive that matches it (Scalasca checks that
/// order, its "clock condition"). A call that then fails has recorded a
/// send it did not make; by default a failed send aborts the job anyway.
#[inline(always)]
fn trace_send(s: &State, count: i64, dt: usize, dest: usize, tag: usize, comm: usize) {
    if trace::traced().is_some() {
        let bytes = s.abi.bytes(count, s.abi.handle(dt)).unwrap_or(0);
        trace::send(s, s.abi.handle(comm), int(dest), int(tag), bytes, 0);
    }
}

/// `MPI_Send`, `MPI_Bsend`, `MPI_Ssend`, `MPI_Rsend` and their `_c` forms.
pub(crate) unsafe extern "C" fn send<const ROW: usize, const L: bool>(
    buf: usize,
    n: usize,
    dt: usize,
    dest: usize,
    tag: usize,
    comm: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; buf, n, dt, dest, tag, comm);
    };
    trace_send(s, count::<L>(n), dt, dest, tag, comm);
    let rc = next!(ROW; buf, n, dt, dest, tag, comm);
    if rc == 0 {
        sent(s, count::<L>(n), dt, dest, tag, comm, send_completes(ROW));
    }
    rc
}

/// `MPI_Isend`, `MPI_Ibsend`, `MPI_Issend`, `MPI_Irsend` and `_c` forms.
pub(crate) unsafe extern "C" fn isend<const ROW: usize, const L: bool>(
    buf: usize,
    n: usize,
    dt: usize,
    dest: usize,
    tag: usize,
    comm: usize,
    req: usize,
) -> c_int {
    let rc = next!(ROW; buf, n, dt, dest, tag, comm, req);
    if rc == 0
        && let Some(s) = state()
    {
        // Any mode: Scalasca counts a wait for the receiver in the call
        // that completes a nonblocking send.
        let (p, bytes, later) = sent(s, count::<L>(n), dt, dest, tag, comm, Completes::Later);
        // SAFETY: the library just stored the new request there.
        let handle = unsafe { s.abi.handle_at(req, 0) };
        let c = s.abi.handle(comm);
        trace::send(s, c, int(dest), int(tag), bytes.unwrap_or(0), handle as u64);
        requests::track(
            s,
            Entry {
                handle,
                kind: Kind::Send,
                persistent: false,
                comm: 0,
                peer: p,
                bytes: bytes.unwrap_or(0),
                recv_bytes: 0,
                dest_tag: (-1, 0),
                later,
            },
        );
    }
    rc
}

/// `MPI_Send_init`, `MPI_Bsend_init`, `MPI_Ssend_init`, `MPI_Rsend_init`
/// and `_c` forms: nothing is sent until `MPI_Start`.
pub(crate) unsafe extern "C" fn send_init<const ROW: usize, const L: bool>(
    buf: usize,
    n: usize,
    dt: usize,
    dest: usize,
    tag: usize,
    comm: usize,
    req: usize,
) -> c_int {
    let rc = next!(ROW; buf, n, dt, dest, tag, comm, req);
    if rc == 0
        && let Some(s) = state()
    {
        let p = peer(s, s.abi.handle(comm), int(dest));
        let bytes = s.abi.bytes(count::<L>(n), s.abi.handle(dt));
        // SAFETY: the library just stored the new request there.
        let handle = unsafe { s.abi.handle_at(req, 0) };
        requests::track(
            s,
            Entry {
                handle,
                kind: Kind::Send,
                persistent: true,
                // The communicator and the destination's rank in it, for
                // the recorded starts (`super::trace`).
                comm: s.abi.handle(comm),
                // An unknown size makes every start unattributed.
                peer: if bytes.is_none() && p != NULL_PEER {
                    UNKNOWN_PEER
                } else {
                    p
                },
                bytes: bytes.unwrap_or(0),
                recv_bytes: 0,
                dest_tag: (int(dest), int(tag)),
                later: None,
            },
        );
    }
    rc
}

/// `MPI_Recv` and `MPI_Recv_c`.
pub(crate) unsafe extern "C" fn recv<const ROW: usize, const L: bool>(
    buf: usize,
    n: usize,
    dt: usize,
    src: usize,
    tag: usize,
    comm: usize,
    status: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; buf, n, dt, src, tag, comm, status);
    };
    let mut own = Status::new();
    let st = status_or(s, status, &mut own);
    let rc = next!(ROW; buf, n, dt, src, tag, comm, st);
    if rc == 0 {
        // SAFETY: the library filled `st`.
        unsafe {
            waits::status_received(
                s,
                s.abi.handle(comm),
                st as *const u8,
                &Call::new(How::One),
                Post::Here,
            );
            trace::received(s, s.abi.handle(comm), st as *const u8, 0);
        }
    }
    rc
}

/// `MPI_Irecv`, `MPI_Recv_init` and their `_c` forms (`PERSISTENT`).
pub(crate) unsafe extern "C" fn irecv<const ROW: usize, const L: bool, const PERSISTENT: bool>(
    buf: usize,
    n: usize,
    dt: usize,
    src: usize,
    tag: usize,
    comm: usize,
    req: usize,
) -> c_int {
    let rc = next!(ROW; buf, n, dt, src, tag, comm, req);
    if rc == 0
        && let Some(s) = state()
    {
        let comm = s.abi.handle(comm);
        // SAFETY: the library just stored the new request there.
        let handle = unsafe { s.abi.handle_at(req, 0) };
        // A receive from MPI_PROC_NULL completes without a message.
        if !PERSISTENT && int(src) != s.abi.c.proc_null {
            trace::request(trace::Kind::MpiIrecvRequest, handle as u64);
        }
        requests::track(
            s,
            Entry {
                handle,
                kind: Kind::Recv,
                persistent: PERSISTENT,
                comm,
                peer: peer(s, comm, int(src)),
                bytes: s.abi.bytes(count::<L>(n), s.abi.handle(dt)).unwrap_or(0),
                recv_bytes: 0,
                dest_tag: (-1, 0),
                later: None,
            },
        );
    }
    rc
}

/// `MPI_Sendrecv` and `MPI_Sendrecv_c`.
pub(crate) unsafe extern "C" fn sendrecv<const ROW: usize, const L: bool>(
    sbuf: usize,
    scount: usize,
    stype: usize,
    dest: usize,
    stag: usize,
    rbuf: usize,
    rcount: usize,
    rtype: usize,
    src: usize,
    rtag: usize,
    comm: usize,
    status: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag, comm, status);
    };
    let mut own = Status::new();
    let st = status_or(s, status, &mut own);
    trace_send(s, count::<L>(scount), stype, dest, stag, comm);
    let rc = next!(ROW; sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag, comm, st);
    if rc == 0 {
        sent(
            s,
            count::<L>(scount),
            stype,
            dest,
            stag,
            comm,
            Completes::Else,
        );
        let c = s.abi.handle(comm);
        // SAFETY: the library filled `st`.
        unsafe {
            waits::status_received(s, c, st as *const u8, &Call::new(How::One), Post::Here);
            trace::received(s, c, st as *const u8, 0);
        }
    }
    rc
}

/// `MPI_Sendrecv_replace` and `MPI_Sendrecv_replace_c`.
pub(crate) unsafe extern "C" fn sendrecv_replace<const ROW: usize, const L: bool>(
    buf: usize,
    n: usize,
    dt: usize,
    dest: usize,
    stag: usize,
    src: usize,
    rtag: usize,
    comm: usize,
    status: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; buf, n, dt, dest, stag, src, rtag, comm, status);
    };
    let mut own = Status::new();
    let st = status_or(s, status, &mut own);
    trace_send(s, count::<L>(n), dt, dest, stag, comm);
    let rc = next!(ROW; buf, n, dt, dest, stag, src, rtag, comm, st);
    if rc == 0 {
        sent(s, count::<L>(n), dt, dest, stag, comm, Completes::Else);
        let c = s.abi.handle(comm);
        // SAFETY: the library filled `st`.
        unsafe {
            waits::status_received(s, c, st as *const u8, &Call::new(How::One), Post::Here);
            trace::received(s, c, st as *const u8, 0);
        }
    }
    rc
}

/// An `MPI_Isendrecv(_replace)` was posted: its send is counted and
/// numbered now, as an `MPI_Isend`'s, and its request is tracked as its
/// receive, which completes with it (`MPI_Wait` and the others), counted
/// then from the status. The request's send half completes with it too,
/// so nothing else waits on it. A recording sees its send as a send event
/// (the request is its receive's) and its receive as an `MPI_Irecv`'s.
///
/// Its receive is numbered for the wait records under the envelope it was
/// posted with, not the status's: MPICH 4.0.2 completes an `MPI_Isendrecv`
/// with a status of source 0, tag 0 and count 0, whatever arrived. So a
/// specific source and tag are kept beside the request, and the record's
/// size is left unknown; one posted with a wildcard cannot be numbered,
/// and the process stops recording messages (`waits::lose`).
fn isendrecv_posted<const L: bool>(
    s: &State,
    (scount, stype, dest, stag): (usize, usize, usize, usize),
    (rcount, rtype, src, rtag): (usize, usize, usize, usize),
    comm: usize,
    req: usize,
) {
    let (_, bytes, _) = sent(
        s,
        count::<L>(scount),
        stype,
        dest,
        stag,
        comm,
        Completes::Else,
    );
    let comm = s.abi.handle(comm);
    trace::send(s, comm, int(dest), int(stag), bytes.unwrap_or(0), 0);
    // SAFETY: the library just stored the new request there.
    let handle = unsafe { s.abi.handle_at(req, 0) };
    if int(src) != s.abi.c.proc_null {
        trace::request(trace::Kind::MpiIrecvRequest, handle as u64);
    }
    let from = peer(s, comm, int(src));
    let specific = from >= 0 && int(rtag) >= 0;
    if !specific && int(src) != s.abi.c.proc_null {
        waits::lose(s, Some(comm));
    }
    requests::track(
        s,
        Entry {
            handle,
            kind: Kind::Recv,
            persistent: false,
            comm,
            peer: from,
            bytes: s
                .abi
                .bytes(count::<L>(rcount), s.abi.handle(rtype))
                .unwrap_or(0),
            recv_bytes: 0,
            // Its envelope as posted, for the wait records.
            dest_tag: if specific { (from, int(rtag)) } else { (-1, 0) },
            later: None,
        },
    );
}

/// `MPI_Isendrecv` and `MPI_Isendrecv_c` ([`isendrecv_posted`]).
pub(crate) unsafe extern "C" fn isendrecv<const ROW: usize, const L: bool>(
    sbuf: usize,
    scount: usize,
    stype: usize,
    dest: usize,
    stag: usize,
    rbuf: usize,
    rcount: usize,
    rtype: usize,
    src: usize,
    rtag: usize,
    comm: usize,
    req: usize,
) -> c_int {
    let rc = next!(ROW; sbuf, scount, stype, dest, stag, rbuf, rcount, rtype, src, rtag, comm, req);
    if rc == 0
        && let Some(s) = state()
    {
        isendrecv_posted::<L>(
            s,
            (scount, stype, dest, stag),
            (rcount, rtype, src, rtag),
            comm,
            req,
        );
    }
    rc
}

/// `MPI_Isendrecv_replace` and `MPI_Isendrecv_replace_c`: as
/// [`isendrecv`], one buffer for both.
pub(crate) unsafe extern "C" fn isendrecv_replace<const ROW: usize, const L: bool>(
    buf: usize,
    n: usize,
    dt: usize,
    dest: usize,
    stag: usize,
    src: usize,
    rtag: usize,
    comm: usize,
    req: usize,
) -> c_int {
    let rc = next!(ROW; buf, n, dt, dest, stag, src, rtag, comm, req);
    if rc == 0
        && let Some(s) = state()
    {
        isendrecv_posted::<L>(s, (n, dt, dest, stag), (n, dt, src, rtag), comm, req);
    }
    rc
}

/// Remembers the sender of a matched message for its `MPI_Mrecv`.
fn matched(s: &State, comm: usize, message: usize, status: usize) {
    // SAFETY: the library stored the message handle and filled the status.
    let (m, src) = unsafe {
        (
            s.abi.handle_at(message, 0),
            s.abi.source(status as *const u8),
        )
    };
    if m == s.abi.message_no_proc {
        return;
    }
    let comm = s.abi.handle(comm);
    let p = peer(s, comm, src);
    let world = if comm == s.abi.comm_world {
        MESSAGE_WORLD
    } else {
        // Its `MPI_Mrecv` would not know the communicator's id to number
        // it under: the process loses count, if messages there are
        // numbered.
        waits::lose(s, Some(comm));
        0
    };
    // With no room the receive is counted as unattributed, and its
    // message cannot be numbered.
    if !MESSAGES.insert(m, MESSAGE_TAG | world | p as u32 as u64) {
        waits::lose(s, Some(comm));
    }
}

/// The sender remembered for message `m`, and whether it came on
/// `MPI_COMM_WORLD`; forgets it.
fn take_message(s: &State, m: usize) -> (i32, bool) {
    if m == s.abi.message_no_proc {
        return (NULL_PEER, false);
    }
    let mut p = (UNKNOWN_PEER, false);
    MESSAGES.remove(m, |v| {
        if v & MESSAGE_TAG != 0 {
            p = (v as u32 as i32, v & MESSAGE_WORLD != 0);
        }
    });
    p
}

/// `MPI_Mprobe`.
pub(crate) unsafe extern "C" fn mprobe<const ROW: usize>(
    src: usize,
    tag: usize,
    comm: usize,
    message: usize,
    status: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; src, tag, comm, message, status);
    };
    let mut own = Status::new();
    let st = status_or(s, status, &mut own);
    let rc = next!(ROW; src, tag, comm, message, st);
    if rc == 0 {
        matched(s, comm, message, st);
    }
    rc
}

/// `MPI_Improbe`.
pub(crate) unsafe extern "C" fn improbe<const ROW: usize>(
    src: usize,
    tag: usize,
    comm: usize,
    flag: usize,
    message: usize,
    status: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; src, tag, comm, flag, message, status);
    };
    let mut own = Status::new();
    let st = status_or(s, status, &mut own);
    let rc = next!(ROW; src, tag, comm, flag, message, st);
    // SAFETY: the library set the flag.
    if rc == 0 && unsafe { *(flag as *const c_int) } != 0 {
        matched(s, comm, message, st);
    }
    rc
}

/// `MPI_Mrecv` and `MPI_Mrecv_c`.
pub(crate) unsafe extern "C" fn mrecv<const ROW: usize, const L: bool>(
    buf: usize,
    n: usize,
    dt: usize,
    message: usize,
    status: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; buf, n, dt, message, status);
    };
    // Read before the call, which sets it to MPI_MESSAGE_NULL.
    // SAFETY: the caller's message handle.
    let m = unsafe { s.abi.handle_at(message, 0) };
    let mut own = Status::new();
    let st = status_or(s, status, &mut own);
    let rc = next!(ROW; buf, n, dt, message, st);
    if rc == 0 {
        let (p, world) = take_message(s, m);
        if p != NULL_PEER {
            // SAFETY: the library filled `st`.
            let bytes = unsafe { s.abi.received(st as *const u8) };
            s.message(p, RECV, bytes);
            if world && waits::numbered(s, s.abi.comm_world).is_some() {
                // SAFETY: as above.
                let tag = unsafe { s.abi.tag(st as *const u8) };
                waits::received(
                    s,
                    s.abi.comm_world,
                    p,
                    tag,
                    bytes,
                    &Call::new(How::One),
                    Post::Here,
                );
            }
            // SAFETY: as above.
            unsafe { trace::received_matched(s, p, st as *const u8, 0) };
        }
    }
    rc
}

/// `MPI_Imrecv` and `MPI_Imrecv_c`.
pub(crate) unsafe extern "C" fn imrecv<const ROW: usize, const L: bool>(
    buf: usize,
    n: usize,
    dt: usize,
    message: usize,
    req: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; buf, n, dt, message, req);
    };
    // SAFETY: the caller's message handle.
    let m = unsafe { s.abi.handle_at(message, 0) };
    let rc = next!(ROW; buf, n, dt, message, req);
    if rc == 0 {
        // SAFETY: the library just stored the new request there.
        let handle = unsafe { s.abi.handle_at(req, 0) };
        let (p, world) = take_message(s, m);
        // Only a receive whose completion can name its sender (see
        // `trace::received_matched`) is announced.
        if p >= 0 {
            trace::request(trace::Kind::MpiIrecvRequest, handle as u64);
        }
        requests::track(
            s,
            Entry {
                handle,
                kind: Kind::Mrecv,
                persistent: false,
                // `MPI_COMM_WORLD` if the message came on it, for the
                // wait records' numbering; else none.
                comm: if world { s.abi.comm_world } else { 0 },
                peer: p,
                bytes: s.abi.bytes(count::<L>(n), s.abi.handle(dt)).unwrap_or(0),
                recv_bytes: 0,
                dest_tag: (-1, 0),
                later: None,
            },
        );
    }
    rc
}
