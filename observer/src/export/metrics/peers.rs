//! Peer traffic as the job's peer series count it: which node a peer rank
//! is on, and directed sums. Shared by the job-level families
//! ([`super::job`]) and the departed ranks' sums ([`super::departed`]), so
//! neither needs the other for it.

use crate::collect::snapshot::{Directed, RankSnapshot};

/// Adds `b` to `a`, each direction saturating.
pub(super) fn add(a: &mut Directed, b: Directed) {
    a.send = a.send.saturating_add(b.send);
    a.recv = a.recv.saturating_add(b.recv);
}

/// The node of `peer`, a world rank `r` exchanged messages with, as the
/// job's peer series name it: the launcher's layout says, with the rank's
/// own node this one (the layout names nodes its own way: Slurm's short
/// names, or `#k` for uniform blocks); without a layout, this node for a
/// rank of the job observed here (`local`), else `remote`.
pub(super) fn peer_node(
    r: &RankSnapshot,
    peer: u32,
    local: &impl Fn(&str) -> bool,
    node: &str,
) -> String {
    let own = r
        .identity
        .rank
        .parse::<u32>()
        .ok()
        .and_then(|me| crate::attach::identity::layout::node_of(&r.identity, me));
    match crate::attach::identity::layout::node_of(&r.identity, peer) {
        Some(p) if Some(&p) == own.as_ref() => node.to_string(),
        Some(p) => p,
        None if local(&peer.to_string()) => node.to_string(),
        None => "remote".into(),
    }
}
