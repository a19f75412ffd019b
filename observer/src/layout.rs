//! Where a job's ranks run, as its launcher laid them out: what maps a peer
//! rank to its node, so peer traffic can be exported node × node (issue 22)
//! rather than rank × rank. Read from a rank's environment, so hostile:
//! parsed in bounded time and space, never expanded into a list.

use std::sync::OnceLock;

use crate::identity::Identity;

/// A job's layout as one of its ranks' launcher described it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {}

/// The node world rank `world_rank` of `identity`'s job runs on, from the
/// launcher layout in the rank's environment; `None` when it is not known.
pub fn node_of(identity: &Identity, world_rank: u32) -> Option<String> {
    let _ = (identity, world_rank);
    None
}

/// This node's name (its hostname), read once.
pub fn this_node() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(crate::report::hostname)
}
