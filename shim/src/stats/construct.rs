//! Communicator constructors: each names the communicator it makes alike
//! on every member, so that collectives on it can be matched across ranks
//! as those on `MPI_COMM_WORLD` are (docs/waits.md, "Other
//! communicators").
//!
//! A constructor is collective over its parent, so every member of the
//! parent calls the parent's constructors in one order: the `k`-th on a
//! parent is the `k`-th on each member. A communicator it makes is then
//! named by (the parent's id, `k`, the world rank of its rank 0, its
//! size) ([`waits::derive`]): the communicators one call makes (the colours
//! of an `MPI_Comm_split`, the nodes of an `MPI_Comm_split_type`) have
//! disjoint members, so different first ranks. Nothing is exchanged.
//!
//! Followed: the constructors collective over an intra-communicator
//! (`MPI_Comm_dup`, `_dup_with_info`, `_split`, `_split_type`, `_create`,
//! `MPI_Cart_create`, `MPI_Cart_sub`, `MPI_Graph_create`,
//! `MPI_Dist_graph_create`, `_create_adjacent`), and `MPI_Comm_idup` and
//! `_idup_with_info`: nonblocking, but ordered with the parent's other
//! collectives alike on every member, and a duplicate, so described as its
//! parent is without using it before its request completes
//! ([`comms::made`]). Not followed, so their communicators are not
//! numbered: `MPI_Comm_create_group` (not collective over the parent),
//! `MPI_Comm_create_from_group` (no parent), and inter-communicators.

use core::ffi::c_int;

use super::{
    comms,
    p2p::next,
    segment::{State, state},
    waits,
};

/// After a constructor on `parent` returned `rc`, having stored the new
/// communicator at `out`: names it on every member alike, from `from`
/// ([`waits::constructing`] before the call). `dup`: a nonblocking
/// duplicate, described as its parent ([`comms::made`]).
#[inline(never)]
fn name_made(
    s: &State,
    rc: c_int,
    from: Option<Option<(u64, u64)>>,
    parent: usize,
    out: usize,
    dup: bool,
) {
    let (0, Some(from)) = (rc, from) else {
        return;
    };
    // SAFETY: the library just stored the new communicator there.
    let new = unsafe { s.abi.handle_at(out, 0) };
    if new != s.abi.comm_null {
        let dup_of = dup.then(|| s.abi.handle(parent));
        comms::made(s, new, dup_of, |i| {
            from.and_then(|f| waits::derive(f, i.world.first().copied()?, i.size))
        });
    }
}

/// Defines the wrapper of a constructor whose first argument is the parent
/// and whose last is where the library stores the new communicator (then,
/// for a nonblocking duplicate, `dup` and its request).
macro_rules! constructor {
    ($(#[$doc:meta])* $name:ident($parent:ident $(, $a:ident)*) -> $out:ident $(, dup $req:ident)?) => {
        $(#[$doc])*
        pub(crate) unsafe extern "C" fn $name<const ROW: usize>(
            $parent: usize,
            $($a: usize,)*
            $out: usize,
            $($req: usize,)?
        ) -> c_int {
            let Some(s) = state() else {
                return next!(ROW; $parent, $($a,)* $out $(, $req)?);
            };
            let from = waits::constructing(s, $parent);
            let rc = next!(ROW; $parent, $($a,)* $out $(, $req)?);
            name_made(s, rc, from, $parent, $out, constructor!(@dup $($req)?));
            rc
        }
    };
    (@dup) => { false };
    (@dup $req:ident) => { true };
}

constructor!(
    /// `MPI_Comm_dup`.
    comm_dup(comm) -> newcomm
);
constructor!(
    /// `MPI_Comm_dup_with_info`.
    comm_dup_with_info(comm, info) -> newcomm
);
constructor!(
    /// `MPI_Comm_split`.
    comm_split(comm, color, key) -> newcomm
);
constructor!(
    /// `MPI_Comm_split_type`.
    comm_split_type(comm, kind, key, info) -> newcomm
);
constructor!(
    /// `MPI_Comm_create`.
    comm_create(comm, group) -> newcomm
);
constructor!(
    /// `MPI_Cart_create`.
    cart_create(comm, ndims, dims, periods, reorder) -> newcomm
);
constructor!(
    /// `MPI_Cart_sub`.
    cart_sub(comm, remain) -> newcomm
);
constructor!(
    /// `MPI_Graph_create`.
    graph_create(comm, nnodes, index, edges, reorder) -> newcomm
);
constructor!(
    /// `MPI_Dist_graph_create`.
    dist_graph_create(comm, n, sources, degrees, dests, weights, info, reorder) -> newcomm
);
constructor!(
    /// `MPI_Dist_graph_create_adjacent`.
    dist_graph_create_adjacent(comm, indegree, sources, sw, outdegree, dests, dw, info, reorder) -> newcomm
);

constructor!(
    /// `MPI_Comm_idup`.
    comm_idup(comm) -> newcomm, dup request
);
constructor!(
    /// `MPI_Comm_idup_with_info`.
    comm_idup_with_info(comm, info) -> newcomm, dup request
);
