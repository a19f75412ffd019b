//! What the project knows about each MPI procedure. The table itself,
//! [`FUNCTIONS`](crate::FUNCTIONS), is generated; these are its types.

/// The family a procedure belongs to; the default probe set is every family
/// but [`Family::Local`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Sends, receives, probes and their persistent and partitioned forms.
    PointToPoint,
    /// Collectives, blocking, nonblocking and persistent.
    Collective,
    /// Barriers, initialisation and finalisation, communicator and window
    /// construction, and one-sided synchronisation: calls that wait for peers.
    Synchronisation,
    /// Request completion: the Wait and Test families, Start, Cancel.
    Completion,
    /// One-sided data movement.
    OneSided,
    /// MPI-IO that touches the file system.
    Io,
    /// Pure local queries and object management (`MPI_Wtime`,
    /// `MPI_Comm_rank`, `MPI_Type_size`, ...): not probed by default.
    Local,
}

impl Family {
    /// The lowercase name used in documentation and on the command line.
    pub const fn as_str(self) -> &'static str {
        match self {
            Family::PointToPoint => "p2p",
            Family::Collective => "collective",
            Family::Synchronisation => "sync",
            Family::Completion => "completion",
            Family::OneSided => "rma",
            Family::Io => "io",
            Family::Local => "local",
        }
    }
}

/// The collective operation a procedure performs, whatever its form:
/// blocking, nonblocking (`MPI_Ibcast`), persistent (`MPI_Bcast_init`) or
/// large-count (`MPI_Bcast_c`) all name [`Collective::Bcast`]. The barrier
/// is one too, although its [`Family`] is synchronisation. Generated from
/// `xtask/src/semantics.rs`, so no reader has to parse names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Collective {
    /// `MPI_Barrier`.
    Barrier,
    /// `MPI_Bcast`.
    Bcast,
    /// `MPI_Gather`.
    Gather,
    /// `MPI_Gatherv`.
    Gatherv,
    /// `MPI_Scatter`.
    Scatter,
    /// `MPI_Scatterv`.
    Scatterv,
    /// `MPI_Allgather`.
    Allgather,
    /// `MPI_Allgatherv`.
    Allgatherv,
    /// `MPI_Alltoall`.
    Alltoall,
    /// `MPI_Alltoallv`.
    Alltoallv,
    /// `MPI_Alltoallw`.
    Alltoallw,
    /// `MPI_Reduce`.
    Reduce,
    /// `MPI_Allreduce`.
    Allreduce,
    /// `MPI_Reduce_scatter`.
    ReduceScatter,
    /// `MPI_Reduce_scatter_block`.
    ReduceScatterBlock,
    /// `MPI_Scan`.
    Scan,
    /// `MPI_Exscan`.
    Exscan,
    /// `MPI_Neighbor_allgather`.
    NeighborAllgather,
    /// `MPI_Neighbor_allgatherv`.
    NeighborAllgatherv,
    /// `MPI_Neighbor_alltoall`.
    NeighborAlltoall,
    /// `MPI_Neighbor_alltoallv`.
    NeighborAlltoallv,
    /// `MPI_Neighbor_alltoallw`.
    NeighborAlltoallw,
}

/// How a procedure returns its result in the C ABI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ret {
    /// An `int` error code, error class or index.
    Int,
    /// A handle, a Fortran integer or an address: one integer register.
    Word,
    /// A `double` (`MPI_Wtime`, `MPI_Wtick`).
    Double,
    /// Nothing.
    Void,
}

/// Which way a buffer's bytes go, from the calling rank's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Direction {
    /// Data the rank supplies.
    Send = 0,
    /// Data the rank is handed.
    Recv = 1,
}

impl Direction {
    /// The `direction` label value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Direction::Send => "send",
            Direction::Recv => "recv",
        }
    }
}

/// How the count argument of a [`BytePart`] is passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum CountKind {
    /// Unused slot.
    None = 0,
    /// A C `int`.
    Int32 = 1,
    /// An `MPI_Count` (large-count `_c` variants).
    Count64 = 2,
    /// The byte figure cannot be derived from the arguments (count arrays,
    /// communicator-size-dependent counts): the call is counted as unknown.
    Unknowable = 3,
}

/// One data buffer of a call: argument positions (0-based, C binding) of the
/// buffer, its element count and its datatype.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BytePart {
    /// Position of the buffer argument.
    pub buf: u8,
    /// Position of the count argument.
    pub count: u8,
    /// Position of the datatype argument.
    pub datatype: u8,
    /// Direction the bytes are accounted to.
    pub direction: Direction,
    /// How to read the count.
    pub kind: CountKind,
}

impl BytePart {
    /// An empty slot.
    pub const NONE: BytePart = BytePart {
        buf: 0,
        count: 0,
        datatype: 0,
        direction: Direction::Send,
        kind: CountKind::None,
    };
}

/// One MPI procedure.
#[derive(Clone, Copy, Debug)]
pub struct FunctionInfo {
    /// Standard name, e.g. `MPI_Send` or `MPI_Send_c`: the `function` label.
    pub name: &'static str,
    /// The family, which decides the default probe set.
    pub family: Family,
    /// The collective it performs, in any form; `None` for the rest.
    pub collective: Option<Collective>,
    /// Number of parameters of the C binding.
    pub c_params: u8,
    /// Return convention.
    pub ret: Ret,
    /// This is the large-count (`_c`) variant.
    pub large_count: bool,
    /// A large-count `_c` variant of this procedure exists.
    pub has_large_variant: bool,
    /// Buffers whose bytes the probe accounts; [`BytePart::NONE`] if unused.
    pub bytes: [BytePart; 2],
}

impl FunctionInfo {
    /// The `PMPI_` symbol name, without allocation: `PMPI_` + `name[4..]`.
    pub fn pmpi_suffix(&self) -> &'static str {
        // Every name starts with "MPI_", checked by the codegen.
        &self.name[4..]
    }
}

/// Looks a procedure up by its standard name (`MPI_Send`).
pub fn function_by_name(name: &str) -> Option<u16> {
    // FUNCTIONS is sorted by name: the codegen emits it from a BTreeMap.
    crate::FUNCTIONS
        .binary_search_by(|f| f.name.cmp(name))
        .ok()
        .map(|i| i as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collective(name: &str) -> Option<Collective> {
        let id = function_by_name(name).unwrap_or_else(|| panic!("{name} is not in FUNCTIONS"));
        crate::FUNCTIONS[usize::from(id)].collective
    }

    #[test]
    fn every_form_of_a_collective_names_it() {
        for name in [
            "MPI_Bcast",
            "MPI_Ibcast",
            "MPI_Bcast_init",
            "MPI_Bcast_c",
            "MPI_Ibcast_c",
            "MPI_Bcast_init_c",
        ] {
            assert_eq!(collective(name), Some(Collective::Bcast), "{name}");
        }
        assert_eq!(
            collective("MPI_Ireduce_scatter_block"),
            Some(Collective::ReduceScatterBlock)
        );
        assert_eq!(
            collective("MPI_Neighbor_alltoallw_init"),
            Some(Collective::NeighborAlltoallw)
        );
    }

    #[test]
    fn barriers_are_collectives_of_the_synchronisation_family() {
        for name in ["MPI_Barrier", "MPI_Ibarrier", "MPI_Barrier_init"] {
            assert_eq!(collective(name), Some(Collective::Barrier), "{name}");
            let id = function_by_name(name).unwrap();
            assert_eq!(
                crate::FUNCTIONS[usize::from(id)].family,
                Family::Synchronisation
            );
        }
    }

    #[test]
    fn other_functions_are_no_collective() {
        for name in [
            "MPI_Send",
            "MPI_Init",
            "MPI_Iprobe",
            "MPI_Comm_rank",
            "MPI_Wait",
        ] {
            assert_eq!(collective(name), None, "{name}");
        }
        // Every collective-family function names its collective.
        for f in crate::FUNCTIONS.iter() {
            if f.family == Family::Collective {
                assert!(f.collective.is_some(), "{}", f.name);
            }
        }
    }
}
