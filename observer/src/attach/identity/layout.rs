//! Where a job's ranks run, as its launcher laid them out: what maps a peer
//! rank to its node, so peer traffic can be exported node × node (issue 22)
//! rather than rank × rank.
//!
//! Two sources, tried in order, each checked against what the rank itself
//! is (its world rank and size, and for Slurm this node's name) and dropped
//! when it does not fit, so a wrong guess costs a peer its node name
//! (`None`), never a wrong one:
//! - **Slurm** (`srun`): the step's node list (`SLURM_STEP_NODELIST`, a
//!   compressed host list such as `node[01-04,07]`), its tasks per node
//!   (`SLURM_STEP_TASKS_PER_NODE`, `2(x3),1`) and its distribution
//!   (`SLURM_DISTRIBUTION`: block, the default, or cyclic with as many tasks
//!   on every node). Nodes are named by their host names.
//! - **Uniform blocks** (Open MPI's `mpirun`/`prterun`, MPICH's Hydra, which
//!   fill each node's slots in turn): the local size
//!   (`OMPI_COMM_WORLD_LOCAL_SIZE`, `MPI_LOCALNRANKS`) when it divides the
//!   world size and the local rank is the world rank modulo it. Those
//!   launchers do not pass the host list, so nodes are named by their index
//!   in launch order, `#0`, `#1`, …: the same name on every node's daemon.
//!
//! Read from a rank's environment, so hostile: parsed in bounded time and
//! space (at most [`MAX_ITEMS`] list items), never expanded into a list,
//! and every name it yields is cut to the label cap.

use std::sync::OnceLock;

use super::{Identity, LABEL_CAP, cut};

/// Items (comma-separated host list entries or ranges, task-count runs)
/// parsed at most; a longer list gives no layout.
pub const MAX_ITEMS: usize = 4096;

/// A job's layout as one of its ranks' launcher described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Slurm's step layout: nodes by host name.
    Slurm {
        /// The node list.
        hosts: HostList,
        /// Runs of (tasks on a node, how many nodes in a row).
        tasks: Vec<(u32, u32)>,
        /// Tasks dealt node by node (block) or one per node in turn
        /// (cyclic, only with the same count on every node).
        cyclic: bool,
    },
    /// `per_node` consecutive world ranks on each node, nodes by index.
    Blocks {
        /// Ranks on every node.
        per_node: u32,
    },
}

/// A compressed host list: items of a prefix, an optional range of numbers
/// (with their zero-padded width) and a suffix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostList {
    items: Vec<HostItem>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct HostItem {
    prefix: String,
    /// First and last number, and the digits to pad to.
    range: Option<(u64, u64, usize)>,
    suffix: String,
}

impl HostItem {
    fn len(&self) -> u64 {
        self.range.map_or(1, |(a, b, _)| b - a + 1)
    }
}

impl HostList {
    /// Parses Slurm's compressed form: `a,b[1-3,07],c[01-02]-ib`. One
    /// bracket group per host; `None` for anything else or past
    /// [`MAX_ITEMS`].
    pub fn parse(s: &str) -> Option<HostList> {
        let mut items = Vec::new();
        let mut rest = s;
        while !rest.is_empty() {
            // The next host: up to a comma outside brackets.
            let end = {
                let mut depth = 0;
                let mut end = rest.len();
                for (i, c) in rest.char_indices() {
                    match c {
                        '[' => depth += 1,
                        ']' => depth -= 1,
                        ',' if depth == 0 => {
                            end = i;
                            break;
                        }
                        _ => {}
                    }
                }
                end
            };
            let host = &rest[..end];
            rest = rest.get(end + 1..).unwrap_or("");
            if host.is_empty() {
                return None;
            }
            match host.split_once('[') {
                None => {
                    if host.contains(']') {
                        return None;
                    }
                    items.push(HostItem {
                        prefix: host.to_string(),
                        range: None,
                        suffix: String::new(),
                    });
                }
                Some((prefix, tail)) => {
                    let (ranges, suffix) = tail.split_once(']')?;
                    if suffix.contains(['[', ']']) || ranges.is_empty() {
                        return None;
                    }
                    for r in ranges.split(',') {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        let digits =
                            |x: &str| !x.is_empty() && x.bytes().all(|c| c.is_ascii_digit());
                        if !digits(a) || !digits(b) || a.len() > 18 || b.len() > 18 {
                            return None;
                        }
                        let (lo, hi) = (a.parse::<u64>().ok()?, b.parse::<u64>().ok()?);
                        if hi < lo {
                            return None;
                        }
                        items.push(HostItem {
                            prefix: prefix.to_string(),
                            range: Some((lo, hi, a.len())),
                            suffix: suffix.to_string(),
                        });
                    }
                }
            }
            if items.len() > MAX_ITEMS {
                return None;
            }
        }
        (!items.is_empty()).then_some(HostList { items })
    }

    /// Hosts in the list.
    pub fn len(&self) -> u64 {
        self.items
            .iter()
            .fold(0u64, |n, i| n.saturating_add(i.len()))
    }

    /// Whether the list is empty (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The `n`th host (from 0).
    pub fn nth(&self, mut n: u64) -> Option<String> {
        for item in &self.items {
            if n < item.len() {
                return Some(match item.range {
                    None => item.prefix.clone(),
                    Some((lo, _, width)) => {
                        format!("{}{:0width$}{}", item.prefix, lo + n, item.suffix)
                    }
                });
            }
            n -= item.len();
        }
        None
    }
}

/// Parses Slurm's tasks per node: `2(x3),1` is 2 tasks on each of 3 nodes,
/// then 1.
pub fn parse_tasks(s: &str) -> Option<Vec<(u32, u32)>> {
    let mut runs = Vec::new();
    for item in s.split(',') {
        let (count, repeat) = match item.split_once("(x") {
            Some((c, r)) => (c, r.strip_suffix(')')?),
            None => (item, "1"),
        };
        let (count, repeat) = (count.parse::<u32>().ok()?, repeat.parse::<u32>().ok()?);
        if count == 0 || repeat == 0 {
            return None;
        }
        runs.push((count, repeat));
        if runs.len() > MAX_ITEMS {
            return None;
        }
    }
    Some(runs)
}

impl Layout {
    /// The layout in a rank's environment (`get` looks a variable up), if
    /// one fits what the rank is: world rank `rank` of `size`, on the node
    /// named `host`.
    pub fn from_env<'a>(
        get: impl Fn(&str) -> Option<&'a str>,
        rank: u32,
        size: u32,
        host: &str,
    ) -> Option<Layout> {
        let slurm = || -> Option<Layout> {
            let hosts = HostList::parse(get("SLURM_STEP_NODELIST")?)?;
            let tasks = parse_tasks(get("SLURM_STEP_TASKS_PER_NODE")?)?;
            let dist = get("SLURM_DISTRIBUTION").unwrap_or("block");
            let dist = dist.split([':', ',']).next().unwrap_or("block");
            let cyclic = match dist {
                "block" | "" => false,
                "cyclic" if tasks.len() == 1 => true,
                _ => return None,
            };
            let nodes = tasks.iter().map(|&(_, r)| u64::from(r)).sum::<u64>();
            let total = tasks
                .iter()
                .map(|&(c, r)| u64::from(c) * u64::from(r))
                .sum::<u64>();
            if nodes != hosts.len() || total != u64::from(size) {
                return None;
            }
            let l = Layout::Slurm {
                hosts,
                tasks,
                cyclic,
            };
            // This rank's node must be this node: the step is the MPI
            // job's, not (as under `mpirun` in an allocation) the step that
            // started the launcher's daemons.
            same_host(&l.node(rank)?, host).then_some(l)
        };
        let blocks = || -> Option<Layout> {
            let local_size = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
                .iter()
                .find_map(|v| get(v)?.parse::<u32>().ok())?;
            let local_rank = ["OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID"]
                .iter()
                .find_map(|v| get(v)?.parse::<u32>().ok())?;
            (local_size > 0
                && size.is_multiple_of(local_size)
                && rank < size
                && rank % local_size == local_rank)
                .then_some(Layout::Blocks {
                    per_node: local_size,
                })
        };
        slurm().or_else(blocks)
    }

    /// The node world rank `rank` runs on, if the layout covers it.
    pub fn node(&self, rank: u32) -> Option<String> {
        let name = match self {
            Layout::Blocks { per_node } => format!("#{}", rank / per_node),
            Layout::Slurm {
                hosts,
                tasks,
                cyclic,
            } => {
                let index = if *cyclic {
                    u64::from(rank) % hosts.len()
                } else {
                    let (mut first, mut node) = (0u64, 0u64);
                    let mut found = None;
                    for &(count, repeat) in tasks {
                        let run = u64::from(count) * u64::from(repeat);
                        if u64::from(rank) < first + run {
                            found = Some(node + (u64::from(rank) - first) / u64::from(count));
                            break;
                        }
                        first += run;
                        node += u64::from(repeat);
                    }
                    found?
                };
                hosts.nth(index)?
            }
        };
        Some(cut(&name, LABEL_CAP).to_string())
    }
}

/// Whether two host names name one host: equal, or equal up to the first
/// dot (Slurm's short names against a fully qualified hostname).
fn same_host(a: &str, b: &str) -> bool {
    let short = |s: &str| s.split('.').next().unwrap_or(s).to_string();
    a == b || short(a) == short(b)
}

/// The node world rank `world_rank` of `identity`'s job runs on, from the
/// launcher layout in the rank's environment; `None` when it is not known.
pub fn node_of(identity: &Identity, world_rank: u32) -> Option<String> {
    identity.layout.as_ref()?.node(world_rank)
}

/// This node's name (its hostname), read once.
pub fn this_node() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(crate::os::host::hostname)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn layout(vars: &[(&str, &str)], rank: u32, size: u32, host: &str) -> Option<Layout> {
        let env: HashMap<&str, &str> = vars.iter().copied().collect();
        Layout::from_env(|k| env.get(k).copied(), rank, size, host)
    }

    #[test]
    fn host_lists_in_slurms_forms() {
        let l = HostList::parse("login,node[01-03,07],gpu[8-9]-ib").unwrap();
        let all: Vec<String> = (0..l.len()).map(|i| l.nth(i).unwrap()).collect();
        assert_eq!(
            all,
            [
                "login", "node01", "node02", "node03", "node07", "gpu8-ib", "gpu9-ib"
            ]
        );
        assert_eq!(l.nth(7), None);
        for bad in [
            "",
            ",",
            "a,,b",
            "n[1-",
            "n]1",
            "n[3-1]",
            "n[a-b]",
            "n[]",
            "n[1][2]",
            "n[1-99999999999999999999]",
        ] {
            assert_eq!(HostList::parse(bad), None, "{bad}");
        }
        // A huge range stays a range: nothing is expanded.
        let big = HostList::parse("n[0-999999999999]").unwrap();
        assert_eq!(big.len(), 1_000_000_000_000);
        assert_eq!(big.nth(999_999_999_999).unwrap(), "n999999999999");
        // Past the item cap: no layout rather than unbounded work.
        let many = vec!["h"; MAX_ITEMS + 1].join(",");
        assert_eq!(HostList::parse(&many), None);
    }

    #[test]
    fn tasks_per_node() {
        assert_eq!(parse_tasks("2(x3),1"), Some(vec![(2, 3), (1, 1)]));
        for bad in ["", "0", "2(x0)", "2(x3", "x", "-1"] {
            assert_eq!(parse_tasks(bad), None, "{bad}");
        }
    }

    #[test]
    fn slurm_block_and_cyclic() {
        let env = [
            ("SLURM_STEP_NODELIST", "node[01-03]"),
            ("SLURM_STEP_TASKS_PER_NODE", "3(x2),1"),
        ];
        let l = layout(&env, 4, 7, "node02.cluster").expect("rank 4 is on node02");
        let nodes: Vec<String> = (0..7).map(|r| l.node(r).unwrap()).collect();
        assert_eq!(
            nodes,
            [
                "node01", "node01", "node01", "node02", "node02", "node02", "node03"
            ]
        );
        assert_eq!(l.node(7), None);
        // The rank is not where the layout puts it: not this job's layout.
        assert_eq!(layout(&env, 0, 7, "node02"), None);
        // Tasks that do not add up to the world size.
        assert_eq!(layout(&env, 4, 8, "node02"), None);

        let cyclic = [
            ("SLURM_STEP_NODELIST", "n[1-2]"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_DISTRIBUTION", "cyclic:block"),
        ];
        let l = layout(&cyclic, 1, 4, "n2").unwrap();
        let nodes: Vec<String> = (0..4).map(|r| l.node(r).unwrap()).collect();
        assert_eq!(nodes, ["n1", "n2", "n1", "n2"]);
        let plane = [
            ("SLURM_STEP_NODELIST", "n[1-2]"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_DISTRIBUTION", "plane=2"),
        ];
        assert_eq!(layout(&plane, 0, 4, "n1"), None);
    }

    #[test]
    fn uniform_blocks_from_open_mpi_and_hydra() {
        let ompi = [
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ];
        let l = layout(&ompi, 5, 8, "any").unwrap();
        assert_eq!(l.node(5).unwrap(), "#1");
        assert_eq!(l.node(3).unwrap(), "#0");
        // Round-robin placement (local rank not rank mod local size), or a
        // size the local size does not divide: unknown.
        assert_eq!(layout(&ompi, 4, 8, "any"), None);
        assert_eq!(layout(&ompi, 5, 7, "any"), None);
        let hydra = [("MPI_LOCALNRANKS", "2"), ("MPI_LOCALRANKID", "0")];
        assert_eq!(layout(&hydra, 2, 4, "x").unwrap().node(3).unwrap(), "#1");
        assert_eq!(layout(&[("MPI_LOCALNRANKS", "0")], 0, 4, "x"), None);
    }
}
