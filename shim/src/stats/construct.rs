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
//! ([`comms::made`]).
//!
//! `MPI_Comm_create_group` is collective over the members of its group
//! only, so it counts nothing on its parent (the parent's other members do
//! not call it). Its members call it in one order for one group, parent
//! and tag (MPI requires it of any collective over the same processes), so
//! the communicator it makes is named by (the parent's id, the tag, the new
//! communicator's members as world ranks in its order, how many such
//! calls with all three the same this rank made before) ([`group_id`]),
//! alike on each member; different groups' calls may interleave
//! differently on different ranks without changing any name.
//!
//! Not followed, so their communicators are not numbered:
//! `MPI_Comm_create_from_group` (no parent), and inter-communicators.

use core::ffi::c_int;
use std::sync::Mutex;

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

/// Distinct (parent, tag, members) of `MPI_Comm_create_group` a process
/// counts at most: past them, what a new one makes is not numbered.
const GROUPS: usize = 4096;

/// For each (parent, tag, members) of `MPI_Comm_create_group` this process
/// called, its key and how many times.
static MADE_FROM_GROUPS: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());

/// The wait-record id of the communicator the next `MPI_Comm_create_group`
/// of `parent` (an id) and `tag` made, whose members are the world ranks
/// `members` in its rank order: [`waits::derive`] of the key of all three
/// and how many this process made before with the same key. `None` when a
/// member is outside `MPI_COMM_WORLD` or the count table is full.
fn group_id(parent: u64, tag: c_int, members: &[i32]) -> Option<u64> {
    let (&first, size) = (members.first()?, members.len());
    if members.iter().any(|&w| w < 0) {
        return None;
    }
    // A marker, so that no key is a constructor's (parent, k).
    let key = [parent, tag as u32 as u64, size as u64]
        .into_iter()
        .chain(members.iter().map(|&w| w as u64))
        .fold(0x6372_6561_7465_5f67_u64, waits::mix);
    let k = {
        // A panic elsewhere never stops the numbering.
        let mut made = MADE_FROM_GROUPS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, n)) = made.iter_mut().find(|(k, _)| *k == key) {
            *n += 1;
            *n - 1
        } else if made.len() < GROUPS {
            made.push((key, 1));
            0
        } else {
            return None;
        }
    };
    waits::derive((key, k), first, i32::try_from(size).ok()?)
}

/// `MPI_Comm_create_group(comm, group, tag, newcomm)`: names what it made
/// by [`group_id`], counting nothing on `comm`.
pub(crate) unsafe extern "C" fn comm_create_group<const ROW: usize>(
    comm: usize,
    group: usize,
    tag: usize,
    newcomm: usize,
) -> c_int {
    let Some(s) = state() else {
        return next!(ROW; comm, group, tag, newcomm);
    };
    let rc = next!(ROW; comm, group, tag, newcomm);
    let (0, Some(parent)) = (rc, waits::group_parent(s, comm)) else {
        return rc;
    };
    // SAFETY: the library just stored the new communicator there.
    let new = unsafe { s.abi.handle_at(newcomm, 0) };
    if new != s.abi.comm_null {
        // The C int in the argument's low half.
        let tag = tag as u32 as c_int;
        comms::made(s, new, None, |i| group_id(parent?, tag, &i.world));
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_named_by_parent_tag_members_and_count() {
        let a = group_id(7, 3, &[1, 3]).unwrap();
        // The next call with all three the same: another communicator.
        let b = group_id(7, 3, &[1, 3]).unwrap();
        assert_ne!(a, b);
        // Each of parent, tag, members, and their order, names another.
        let others = [
            group_id(8, 3, &[1, 3]),
            group_id(7, 4, &[1, 3]),
            group_id(7, 3, &[1, 5]),
            group_id(7, 3, &[3, 1]),
            group_id(7, 3, &[1, 3, 5]),
        ];
        for o in others {
            let o = o.unwrap();
            assert!(o != a && o != b && o != observer_common::waits::WORLD && o & 1 == 1);
        }
        // No constructor's name: (parent 7, k) for the same first and size.
        for k in 0..4 {
            assert_ne!(waits::derive((7, k), 1, 2), Some(a));
        }
        // Outside the world, or empty: not numbered.
        assert_eq!(group_id(7, 3, &[1, -1]), None);
        assert_eq!(group_id(7, 3, &[]), None);
    }

    #[test]
    fn another_process_names_them_alike() {
        // Two members count alike when they call alike, whatever else each
        // made in between (another group's calls, interleaved).
        let calls = |n: u64| {
            let a = group_id(100 + n, 9, &[0, 2]).unwrap();
            let _ = group_id(200 + n, 9, &[0, 2]);
            let b = group_id(100 + n, 9, &[0, 2]).unwrap();
            (a, b)
        };
        let (a0, b0) = calls(0);
        // What a first call on parent 100 names, from a fresh count: the
        // derivation the other member does.
        let k = [100u64, 9, 2, 0, 2]
            .into_iter()
            .fold(0x6372_6561_7465_5f67_u64, waits::mix);
        assert_eq!(Some(a0), waits::derive((k, 0), 0, 2));
        assert_eq!(Some(b0), waits::derive((k, 1), 0, 2));
    }
}
