//! The global definitions, written once at the close: strings interned
//! first, then the system tree, locations, regions, groups and comms.

use std::collections::HashMap;
use std::ffi::CString;
use std::path::Path;

use otf2_sys as sys;

use super::*;

/// The global definitions, with their strings interned first: OTF2 wants a
/// string defined before a definition refers to it.
pub(super) struct Definitions {
    strings: Vec<CString>,
    string_refs: HashMap<String, sys::OTF2_StringRef>,
    /// (name, class, parent, domain).
    nodes: Vec<(u32, u32, u32, sys::OTF2_SystemTreeDomain)>,
    /// (rank, name, node, pid).
    groups: Vec<(u32, u32, u32, u32)>,
    /// (id, name, rank).
    locations: Vec<(sys::OTF2_LocationRef, u32, u32, u64)>,
    /// (name, role).
    regions: Vec<(u32, sys::OTF2_RegionRole)>,
    world: u32,
    /// (comm ref, name, world ranks), by comm ref.
    comms: Vec<(sys::OTF2_CommRef, u32, Vec<u64>)>,
    s_empty: u32,
    s_mpi: u32,
    s_comm_locations: u32,
    s_pid: u32,
    s_metric: [u32; 3],
}

impl Definitions {
    pub(super) fn new(
        a: &Archive,
        world: u32,
        locations: &[(sys::OTF2_LocationRef, u64)],
    ) -> Definitions {
        let mut d = Definitions {
            strings: Vec::new(),
            string_refs: HashMap::new(),
            nodes: Vec::new(),
            groups: Vec::new(),
            locations: Vec::new(),
            regions: Vec::new(),
            world,
            comms: Vec::new(),
            s_empty: 0,
            s_mpi: 0,
            s_comm_locations: 0,
            s_pid: 0,
            s_metric: [0; 3],
        };
        d.s_empty = d.string("");
        d.s_mpi = d.string("MPI");
        d.s_comm_locations = d.string("MPI_COMM_WORLD locations");
        d.s_pid = d.string("MPI_OBSERVER::PID");
        d.s_metric = [
            d.string(DROPPED_METRIC_NAME),
            d.string("events the capture dropped because its ring was full, since recording began"),
            d.string("events"),
        ];

        let (cluster, machine, node_class) =
            (d.string("cluster"), d.string("machine"), d.string("node"));
        d.nodes.push((
            cluster,
            machine,
            sys::OTF2_UNDEFINED_SYSTEM_TREE_NODE,
            sys::OTF2_SYSTEM_TREE_DOMAIN_MACHINE,
        ));
        let mut node_refs: HashMap<&str, u32> = HashMap::new();
        for (&rank, info) in &a.ranks {
            // Ranks of unknown host hang from the root.
            let node = match &info.node {
                None => 0,
                Some(host) => match node_refs.get(host.as_str()) {
                    Some(&n) => n,
                    None => {
                        let n = d.nodes.len() as u32;
                        let name = d.string(host);
                        d.nodes.push((
                            name,
                            node_class,
                            0,
                            sys::OTF2_SYSTEM_TREE_DOMAIN_SHARED_MEMORY,
                        ));
                        node_refs.insert(host, n);
                        n
                    }
                },
            };
            let name = d.string(&format!("MPI Rank {rank}"));
            d.groups.push((rank, name, node, info.pid));
        }
        for &(id, records) in locations {
            let (rank, thread) = ((id & 0xffff_ffff) as u32, (id >> 32) as u32);
            let name = if thread == 0 {
                d.string("Master thread")
            } else {
                d.string(&format!("Thread {thread}"))
            };
            d.locations.push((id, name, rank, records));
        }
        for r in &a.regions {
            let name = d.string(&r.name);
            d.regions.push((name, r.role.raw()));
        }
        let mut comms: Vec<(u32, sys::OTF2_CommRef)> =
            a.comm_refs.iter().map(|(&id, &r)| (id, r)).collect();
        comms.sort_unstable_by_key(|&(_, r)| r);
        for (id, r) in comms {
            let (name, members) = match a.comms.get(&id) {
                Some(c) => (
                    d.string(&c.name),
                    c.world_ranks.iter().map(|&w| u64::from(w)).collect(),
                ),
                None => (d.string(&format!("comm {id} (undefined)")), Vec::new()),
            };
            d.comms.push((r, name, members));
        }
        d
    }

    fn string(&mut self, s: &str) -> sys::OTF2_StringRef {
        if let Some(&r) = self.string_refs.get(s) {
            return r;
        }
        let r = self.strings.len() as sys::OTF2_StringRef;
        self.strings.push(c_string(s));
        self.string_refs.insert(s.to_string(), r);
        r
    }

    /// Writes them all, in an order where everything is defined before use.
    pub(super) fn write(
        &self,
        g: *mut sys::OTF2_GlobalDefWriter,
        anchor: &Path,
        offset: u64,
        length: u64,
        realtime: u64,
    ) -> Result<(), ArchiveError> {
        let ok = |call, code| check(anchor, call, code);
        let mpi = sys::OTF2_PARADIGM_MPI;
        // SAFETY: g is the open global definition writer; every pointer
        // passed points to live data of the stated length.
        unsafe {
            ok(
                "OTF2_GlobalDefWriter_WriteClockProperties",
                sys::OTF2_GlobalDefWriter_WriteClockProperties(
                    g,
                    TICKS_PER_SECOND,
                    offset,
                    length,
                    realtime,
                ),
            )?;
            for (r, s) in self.strings.iter().enumerate() {
                ok(
                    "OTF2_GlobalDefWriter_WriteString",
                    sys::OTF2_GlobalDefWriter_WriteString(g, r as u32, s.as_ptr()),
                )?;
            }
            ok(
                "OTF2_GlobalDefWriter_WriteParadigm",
                sys::OTF2_GlobalDefWriter_WriteParadigm(
                    g,
                    mpi,
                    self.s_mpi,
                    sys::OTF2_PARADIGM_CLASS_PROCESS,
                ),
            )?;
            for (r, &(name, class, parent, domain)) in self.nodes.iter().enumerate() {
                ok(
                    "OTF2_GlobalDefWriter_WriteSystemTreeNode",
                    sys::OTF2_GlobalDefWriter_WriteSystemTreeNode(g, r as u32, name, class, parent),
                )?;
                ok(
                    "OTF2_GlobalDefWriter_WriteSystemTreeNodeDomain",
                    sys::OTF2_GlobalDefWriter_WriteSystemTreeNodeDomain(g, r as u32, domain),
                )?;
            }
            for &(rank, name, node, _) in &self.groups {
                ok(
                    "OTF2_GlobalDefWriter_WriteLocationGroup",
                    sys::OTF2_GlobalDefWriter_WriteLocationGroup(
                        g,
                        rank,
                        name,
                        sys::OTF2_LOCATION_GROUP_TYPE_PROCESS,
                        node,
                        sys::OTF2_UNDEFINED_LOCATION_GROUP,
                    ),
                )?;
            }
            for &(rank, _, _, pid) in self.groups.iter().filter(|g| g.3 != 0) {
                ok(
                    "OTF2_GlobalDefWriter_WriteLocationGroupProperty",
                    sys::OTF2_GlobalDefWriter_WriteLocationGroupProperty(
                        g,
                        rank,
                        self.s_pid,
                        sys::OTF2_TYPE_UINT64,
                        sys::OTF2_AttributeValue {
                            uint64: u64::from(pid),
                        },
                    ),
                )?;
            }
            for &(id, name, rank, records) in &self.locations {
                ok(
                    "OTF2_GlobalDefWriter_WriteLocation",
                    sys::OTF2_GlobalDefWriter_WriteLocation(
                        g,
                        id,
                        name,
                        sys::OTF2_LOCATION_TYPE_CPU_THREAD,
                        records,
                        rank,
                    ),
                )?;
            }
            for (r, &(name, role)) in self.regions.iter().enumerate() {
                ok(
                    "OTF2_GlobalDefWriter_WriteRegion",
                    sys::OTF2_GlobalDefWriter_WriteRegion(
                        g,
                        r as u32,
                        name,
                        name,
                        self.s_empty,
                        role,
                        mpi,
                        sys::OTF2_REGION_FLAG_NONE,
                        // The source file "MPI": Score-P's convention for
                        // MPI regions, which Scalasca's classification of
                        // regions reads.
                        self.s_mpi,
                        0,
                        0,
                    ),
                )?;
            }
            // Group 0: world rank i → its master location, which is i.
            let masters: Vec<u64> = (0..u64::from(self.world)).collect();
            ok(
                "OTF2_GlobalDefWriter_WriteGroup",
                sys::OTF2_GlobalDefWriter_WriteGroup(
                    g,
                    0,
                    self.s_comm_locations,
                    sys::OTF2_GROUP_TYPE_COMM_LOCATIONS,
                    mpi,
                    sys::OTF2_GROUP_FLAG_NONE,
                    self.world,
                    masters.as_ptr(),
                ),
            )?;
            // Group 1 + c: communicator c's members, as world ranks.
            for (r, _, members) in &self.comms {
                ok(
                    "OTF2_GlobalDefWriter_WriteGroup",
                    sys::OTF2_GlobalDefWriter_WriteGroup(
                        g,
                        1 + r,
                        self.s_empty,
                        sys::OTF2_GROUP_TYPE_COMM_GROUP,
                        mpi,
                        sys::OTF2_GROUP_FLAG_NONE,
                        members.len() as u32,
                        members.as_ptr(),
                    ),
                )?;
            }
            for &(r, name, _) in &self.comms {
                ok(
                    "OTF2_GlobalDefWriter_WriteComm",
                    sys::OTF2_GlobalDefWriter_WriteComm(
                        g,
                        r,
                        name,
                        1 + r,
                        sys::OTF2_UNDEFINED_COMM,
                        sys::OTF2_COMM_FLAG_NONE,
                    ),
                )?;
            }
            let [name, description, unit] = self.s_metric;
            ok(
                "OTF2_GlobalDefWriter_WriteMetricMember",
                sys::OTF2_GlobalDefWriter_WriteMetricMember(
                    g,
                    0,
                    name,
                    description,
                    sys::OTF2_METRIC_TYPE_OTHER,
                    sys::OTF2_METRIC_ACCUMULATED_START,
                    sys::OTF2_TYPE_UINT64,
                    sys::OTF2_BASE_DECIMAL,
                    0,
                    unit,
                ),
            )?;
            let members = [0];
            ok(
                "OTF2_GlobalDefWriter_WriteMetricClass",
                sys::OTF2_GlobalDefWriter_WriteMetricClass(
                    g,
                    DROPPED_METRIC,
                    1,
                    members.as_ptr(),
                    sys::OTF2_METRIC_ASYNCHRONOUS,
                    sys::OTF2_RECORDER_KIND_CPU,
                ),
            )?;
        }
        Ok(())
    }
}
