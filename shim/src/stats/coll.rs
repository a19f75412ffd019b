//! Collectives: calls and bytes per function (the segment's function
//! counters), by one definition applied to every collective (docs/stats.md):
//!
//! - **send**: the size of this rank's contribution as its arguments describe
//!   it; with `MPI_IN_PLACE`, the block(s) the standard takes from the
//!   receive buffer instead;
//! - **recv**: the size of the receive buffer the arguments describe (every
//!   block, the rank's own included);
//! - arguments the standard calls significant only at the root count only at
//!   the root (`MPI_ROOT` on an inter-communicator; the root group's other
//!   members, `MPI_PROC_NULL`, count nothing); an argument the standard
//!   ignores counts 0.
//!
//! Nonblocking collectives count the same at their post and are tracked in
//! the request table (peer -1) until they complete. The large-count `_c`
//! forms share the wrappers (`L`: counts and count arrays are `MPI_Count`).

use core::ffi::c_int;

use super::{
    abi::{count, int},
    comms::{CommInfo, info},
    p2p::next,
    requests::{self, Entry, Kind},
    segment::{State, state},
};

/// Bytes of `count` elements of `dt` (0 if unknown).
fn b(s: &State, count: i64, dt: usize) -> u64 {
    s.abi.bytes(count, s.abi.handle(dt)).unwrap_or(0)
}

/// Sum of `n` counts at `counts` (`int`s, or `MPI_Count`s in the `_c`
/// forms; 0 for a null array).
fn sum<const L: bool>(counts: usize, n: i32) -> i64 {
    (0..n.max(0)).map(|i| at::<L>(counts, i)).sum()
}

/// Element `i` of a count array (`int`, or `MPI_Count` if `L`).
fn at<const L: bool>(counts: usize, i: i32) -> i64 {
    if counts == 0 || i < 0 {
        return 0;
    }
    // SAFETY: the caller's array, indexed by a rank of the communicator.
    unsafe {
        if L {
            *(counts as *const i64).add(i as usize)
        } else {
            *(counts as *const c_int).add(i as usize) as i64
        }
    }
}

/// How this rank takes part in a rooted collective.
#[derive(PartialEq)]
enum Role {
    Root,
    Other,
    /// The root group's non-root members on an inter-communicator.
    Idle,
}

fn role(s: &State, c: &CommInfo, root: usize) -> Role {
    let root = int(root);
    if c.inter {
        if root == s.abi.c.root {
            Role::Root
        } else if root == s.abi.c.proc_null {
            Role::Idle
        } else {
            Role::Other
        }
    } else if root == c.rank {
        Role::Root
    } else {
        Role::Other
    }
}

fn comm(s: &State, comm: usize) -> Option<&'static CommInfo> {
    info(s, s.abi.handle(comm))
}

fn in_place(s: &State, buf: usize) -> bool {
    buf == s.abi.c.in_place
}

type Bytes = fn(&State, &[usize]) -> (u64, u64);

fn none<const L: bool>(_: &State, _: &[usize]) -> (u64, u64) {
    (0, 0)
}

// (buf, count, dt, root, comm)
fn bcast<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[4]) else {
        return (0, 0);
    };
    let n = b(s, count::<L>(a[1]), a[2]);
    match role(s, c, a[3]) {
        Role::Root => (n, 0),
        Role::Other => (0, n),
        Role::Idle => (0, 0),
    }
}

// (sbuf, rbuf, count, dt, op, root, comm)
fn reduce<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[6]) else {
        return (0, 0);
    };
    let n = b(s, count::<L>(a[2]), a[3]);
    match (role(s, c, a[5]), c.inter) {
        (Role::Root, false) => (n, n),
        (Role::Root, true) => (0, n),
        (Role::Other, _) => (n, 0),
        (Role::Idle, _) => (0, 0),
    }
}

// (sbuf, rbuf, count, dt, op, comm): Allreduce, Scan, Exscan.
fn allreduce<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let n = b(s, count::<L>(a[2]), a[3]);
    (n, n)
}

// (sbuf, scount, stype, rbuf, rcount, rtype, root, comm)
fn gather<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[7]) else {
        return (0, 0);
    };
    let rblock = b(s, count::<L>(a[4]), a[5]);
    match role(s, c, a[6]) {
        Role::Root => {
            let send = match (c.inter, in_place(s, a[0])) {
                (true, _) => 0,
                (false, true) => rblock,
                (false, false) => b(s, count::<L>(a[1]), a[2]),
            };
            (send, rblock * c.size as u64)
        }
        Role::Other => (b(s, count::<L>(a[1]), a[2]), 0),
        Role::Idle => (0, 0),
    }
}

// (sbuf, scount, stype, rbuf, rcounts, displs, rtype, root, comm)
fn gatherv<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[8]) else {
        return (0, 0);
    };
    match role(s, c, a[7]) {
        Role::Root => {
            let send = match (c.inter, in_place(s, a[0])) {
                (true, _) => 0,
                (false, true) => b(s, at::<L>(a[4], c.rank), a[6]),
                (false, false) => b(s, count::<L>(a[1]), a[2]),
            };
            (send, b(s, sum::<L>(a[4], c.size), a[6]))
        }
        Role::Other => (b(s, count::<L>(a[1]), a[2]), 0),
        Role::Idle => (0, 0),
    }
}

// (sbuf, scount, stype, rbuf, rcount, rtype, root, comm)
fn scatter<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[7]) else {
        return (0, 0);
    };
    match role(s, c, a[6]) {
        Role::Root => {
            let recv = if c.inter || in_place(s, a[3]) {
                0
            } else {
                b(s, count::<L>(a[4]), a[5])
            };
            (b(s, count::<L>(a[1]), a[2]) * c.size as u64, recv)
        }
        Role::Other => (0, b(s, count::<L>(a[4]), a[5])),
        Role::Idle => (0, 0),
    }
}

// (sbuf, scounts, displs, stype, rbuf, rcount, rtype, root, comm)
fn scatterv<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[8]) else {
        return (0, 0);
    };
    match role(s, c, a[7]) {
        Role::Root => {
            let recv = if c.inter || in_place(s, a[4]) {
                0
            } else {
                b(s, count::<L>(a[5]), a[6])
            };
            (b(s, sum::<L>(a[1], c.size), a[3]), recv)
        }
        Role::Other => (0, b(s, count::<L>(a[5]), a[6])),
        Role::Idle => (0, 0),
    }
}

// (sbuf, scount, stype, rbuf, rcount, rtype, comm)
fn allgather<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[6]) else {
        return (0, 0);
    };
    let rblock = b(s, count::<L>(a[4]), a[5]);
    let send = if in_place(s, a[0]) {
        rblock
    } else {
        b(s, count::<L>(a[1]), a[2])
    };
    (send, rblock * c.size as u64)
}

// (sbuf, scount, stype, rbuf, rcounts, displs, rtype, comm)
fn allgatherv<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[7]) else {
        return (0, 0);
    };
    let send = if in_place(s, a[0]) {
        b(s, at::<L>(a[4], c.rank), a[6])
    } else {
        b(s, count::<L>(a[1]), a[2])
    };
    (send, b(s, sum::<L>(a[4], c.size), a[6]))
}

// (sbuf, scount, stype, rbuf, rcount, rtype, comm)
fn alltoall<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[6]) else {
        return (0, 0);
    };
    let recv = b(s, count::<L>(a[4]), a[5]) * c.size as u64;
    let send = if in_place(s, a[0]) {
        recv
    } else {
        b(s, count::<L>(a[1]), a[2]) * c.size as u64
    };
    (send, recv)
}

// (sbuf, scounts, sdispls, stype, rbuf, rcounts, rdispls, rtype, comm)
fn alltoallv<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[8]) else {
        return (0, 0);
    };
    let recv = b(s, sum::<L>(a[5], c.size), a[7]);
    let send = if in_place(s, a[0]) {
        recv
    } else {
        b(s, sum::<L>(a[1], c.size), a[3])
    };
    (send, recv)
}

// (sbuf, scounts, sdispls, stypes, rbuf, rcounts, rdispls, rtypes, comm)
fn alltoallw<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[8]) else {
        return (0, 0);
    };
    let typed = |counts: usize, types: usize| -> u64 {
        if counts == 0 || types == 0 {
            return 0;
        }
        (0..c.size.max(0))
            .map(|i| {
                let n = at::<L>(counts, i);
                // SAFETY: the caller's array of `size` datatypes.
                let t = unsafe { s.abi.handle_at(types, i as usize) };
                b(s, n, t)
            })
            .sum()
    };
    let recv = typed(a[5], a[7]);
    let send = if in_place(s, a[0]) {
        recv
    } else {
        typed(a[1], a[3])
    };
    (send, recv)
}

// (sbuf, rbuf, rcounts, dt, op, comm)
fn reduce_scatter<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[5]) else {
        return (0, 0);
    };
    (
        b(s, sum::<L>(a[2], c.size), a[3]),
        b(s, at::<L>(a[2], c.rank), a[3]),
    )
}

// (sbuf, rbuf, rcount, dt, op, comm)
fn reduce_scatter_block<const L: bool>(s: &State, a: &[usize]) -> (u64, u64) {
    let Some(c) = comm(s, a[5]) else {
        return (0, 0);
    };
    let n = b(s, count::<L>(a[2]), a[3]);
    (n * c.size as u64, n)
}

/// A blocking collective returned success: counts it, and has a recording
/// see its end (`seq`: its number on `MPI_COMM_WORLD`, see
/// [`super::waits::number`]).
#[inline(always)]
fn record(row: usize, bytes: Bytes, args: &[usize], seq: Option<u64>) {
    if let Some(s) = state() {
        let (send, recv) = bytes(s, args);
        s.call(row, send, recv);
        super::trace::collective_end(s, row, args, send, recv, seq);
    }
}

fn track(row: usize, bytes: Bytes, args: &[usize], req: usize) {
    if let Some(s) = state() {
        let (send, recv) = bytes(s, args);
        s.call(row, send, recv);
        // SAFETY: the library just stored the new request there.
        let handle = unsafe { s.abi.handle_at(req, 0) };
        requests::track(
            s,
            Entry {
                handle,
                kind: Kind::Collective,
                persistent: false,
                comm: 0,
                peer: -1,
                bytes: 0,
                recv_bytes: 0,
                dest_tag: (-1, 0),
                later: None,
            },
        );
    }
}

/// A persistent collective's `*_init`: nothing moves until `MPI_Start`,
/// which counts the call with the bytes computed here (the standard keeps
/// the arguments, count arrays included, fixed until the request is freed).
fn persist(row: usize, bytes: Bytes, args: &[usize], req: usize) {
    if let Some(s) = state() {
        let (send, recv) = bytes(s, args);
        // SAFETY: the library just stored the new request there.
        let handle = unsafe { s.abi.handle_at(req, 0) };
        requests::track(
            s,
            Entry {
                handle,
                kind: Kind::Collective,
                persistent: true,
                comm: row,
                peer: -1,
                bytes: send,
                recv_bytes: recv,
                dest_tag: (-1, 0),
                later: None,
            },
        );
    }
}

/// Defines a blocking collective wrapper, its nonblocking twin (the same
/// arguments and a request) and its persistent one (an info and a request).
///
/// The blocking wrapper also numbers the instance (on `MPI_COMM_WORLD`, or
/// on a communicator whose members name it alike) and writes its wait
/// record ([`super::waits`]): `comm` names the communicator argument,
/// `root` the root's, if it has one.
macro_rules! collective {
    (@root) => { observer_common::waits::NO_ROOT };
    (@root $root:ident) => { int($root) };
    ($blocking:ident / $nonblocking:ident / $persistent:ident, $bytes:ident, ($($a:ident),*), $comm:ident $(, $root:ident)?) => {
        #[doc = concat!("`MPI_", stringify!($blocking), "` (by function row).")]
        pub(crate) unsafe extern "C" fn $blocking<const ROW: usize, const L: bool>($($a: usize),*) -> c_int {
            let n = super::waits::number($comm);
            super::trace::collective_begin(ROW);
            let wait = super::waits::enter(n.as_ref());
            let rc = next!(ROW; $($a),*);
            if rc == 0 {
                record(ROW, $bytes::<L>, &[$($a),*], n.and_then(|n| n.world()));
                super::waits::leave(wait, ROW, collective!(@root $($root)?));
            }
            rc
        }
        #[doc = concat!("`MPI_", stringify!($nonblocking), "` (by function row).")]
        pub(crate) unsafe extern "C" fn $nonblocking<const ROW: usize, const L: bool>($($a: usize,)* req: usize) -> c_int {
            let rc = next!(ROW; $($a,)* req);
            if rc == 0 {
                track(ROW, $bytes::<L>, &[$($a),*], req);
            }
            rc
        }
        #[doc = concat!("`MPI_", stringify!($persistent), "` (by function row).")]
        pub(crate) unsafe extern "C" fn $persistent<const ROW: usize, const L: bool>($($a: usize,)* info: usize, req: usize) -> c_int {
            let rc = next!(ROW; $($a,)* info, req);
            if rc == 0 {
                persist(ROW, $bytes::<L>, &[$($a),*], req);
            }
            rc
        }
    };
}

collective!(barrier / ibarrier / barrier_init, none, (comm), comm);
collective!(
    bcast_ / ibcast / bcast_init,
    bcast,
    (buf, n, dt, root, comm),
    comm,
    root
);
collective!(
    reduce_ / ireduce / reduce_init,
    reduce,
    (sbuf, rbuf, n, dt, op, root, comm),
    comm,
    root
);
collective!(
    allreduce_ / iallreduce / allreduce_init,
    allreduce,
    (sbuf, rbuf, n, dt, op, comm),
    comm
);
collective!(
    gather_ / igather / gather_init,
    gather,
    (sbuf, sn, st, rbuf, rn, rt, root, comm),
    comm,
    root
);
collective!(
    gatherv_ / igatherv / gatherv_init,
    gatherv,
    (sbuf, sn, st, rbuf, rns, ds, rt, root, comm),
    comm,
    root
);
collective!(
    scatter_ / iscatter / scatter_init,
    scatter,
    (sbuf, sn, st, rbuf, rn, rt, root, comm),
    comm,
    root
);
collective!(
    scatterv_ / iscatterv / scatterv_init,
    scatterv,
    (sbuf, sns, ds, st, rbuf, rn, rt, root, comm),
    comm,
    root
);
collective!(
    allgather_ / iallgather / allgather_init,
    allgather,
    (sbuf, sn, st, rbuf, rn, rt, comm),
    comm
);
collective!(
    allgatherv_ / iallgatherv / allgatherv_init,
    allgatherv,
    (sbuf, sn, st, rbuf, rns, ds, rt, comm),
    comm
);
collective!(
    alltoall_ / ialltoall / alltoall_init,
    alltoall,
    (sbuf, sn, st, rbuf, rn, rt, comm),
    comm
);
collective!(
    alltoallv_ / ialltoallv / alltoallv_init,
    alltoallv,
    (sbuf, sns, sds, st, rbuf, rns, rds, rt, comm),
    comm
);
collective!(
    alltoallw_ / ialltoallw / alltoallw_init,
    alltoallw,
    (sbuf, sns, sds, sts, rbuf, rns, rds, rts, comm),
    comm
);
collective!(
    reduce_scatter_ / ireduce_scatter / reduce_scatter_init,
    reduce_scatter,
    (sbuf, rbuf, rns, dt, op, comm),
    comm
);
collective!(
    reduce_scatter_block_ / ireduce_scatter_block / reduce_scatter_block_init,
    reduce_scatter_block,
    (sbuf, rbuf, rn, dt, op, comm),
    comm
);
collective!(
    scan_ / iscan / scan_init,
    allreduce,
    (sbuf, rbuf, n, dt, op, comm),
    comm
);
collective!(
    exscan_ / iexscan / exscan_init,
    allreduce,
    (sbuf, rbuf, n, dt, op, comm),
    comm
);
