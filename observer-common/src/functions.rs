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
