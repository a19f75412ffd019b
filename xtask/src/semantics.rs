//! What `apis.json` does not say: which family each MPI procedure belongs to,
//! which collective it performs, and the few byte-accounting exceptions.
//! This is the small hand table that mpiP and PnMPI keep beside their
//! prototype specs; everything else about a function is read from the MPI
//! Forum's data.

/// The collectives, by the name of their blocking form without `MPI_`; the
/// barrier, whose family is synchronisation, is not among them.
const COLLECTIVE_BASES: &[&str] = &[
    "Bcast",
    "Gather",
    "Gatherv",
    "Scatter",
    "Scatterv",
    "Allgather",
    "Allgatherv",
    "Alltoall",
    "Alltoallv",
    "Alltoallw",
    "Reduce",
    "Allreduce",
    "Reduce_scatter",
    "Reduce_scatter_block",
    "Scan",
    "Exscan",
    "Neighbor_allgather",
    "Neighbor_allgatherv",
    "Neighbor_alltoall",
    "Neighbor_alltoallv",
    "Neighbor_alltoallw",
];

/// The family of an MPI procedure, by its standard name without the `MPI_`
/// prefix and without a large-count `_c` suffix.
pub fn family(base: &str) -> &'static str {
    const P2P: &[&str] = &[
        "Send",
        "Bsend",
        "Ssend",
        "Rsend",
        "Recv",
        "Isend",
        "Ibsend",
        "Issend",
        "Irsend",
        "Irecv",
        "Sendrecv",
        "Sendrecv_replace",
        "Isendrecv",
        "Isendrecv_replace",
        "Probe",
        "Iprobe",
        "Mprobe",
        "Improbe",
        "Mrecv",
        "Imrecv",
        "Send_init",
        "Bsend_init",
        "Ssend_init",
        "Rsend_init",
        "Recv_init",
        "Psend_init",
        "Precv_init",
        "Pready",
        "Pready_range",
        "Pready_list",
        "Parrived",
    ];
    const SYNC: &[&str] = &[
        "Barrier",
        "Ibarrier",
        "Barrier_init",
        "Init",
        "Init_thread",
        "Finalize",
        "Abort",
        "Session_init",
        "Session_finalize",
        "Comm_split",
        "Comm_split_type",
        "Comm_dup",
        "Comm_dup_with_info",
        "Comm_idup",
        "Comm_idup_with_info",
        "Comm_create",
        "Comm_create_group",
        "Comm_create_from_group",
        "Comm_disconnect",
        "Comm_spawn",
        "Comm_spawn_multiple",
        "Comm_accept",
        "Comm_connect",
        "Comm_join",
        "Intercomm_create",
        "Intercomm_create_from_groups",
        "Intercomm_merge",
        "Cart_create",
        "Cart_sub",
        "Graph_create",
        "Dist_graph_create",
        "Dist_graph_create_adjacent",
        "Win_create",
        "Win_allocate",
        "Win_allocate_shared",
        "Win_create_dynamic",
        "Win_free",
        "Win_fence",
        "Win_lock",
        "Win_unlock",
        "Win_lock_all",
        "Win_unlock_all",
        "Win_post",
        "Win_start",
        "Win_complete",
        "Win_wait",
        "Win_test",
        "Win_flush",
        "Win_flush_all",
        "Win_flush_local",
        "Win_flush_local_all",
        "Win_sync",
    ];
    const COMPLETION: &[&str] = &[
        "Wait",
        "Waitall",
        "Waitany",
        "Waitsome",
        "Test",
        "Testall",
        "Testany",
        "Testsome",
        "Start",
        "Startall",
        "Request_get_status",
        "Request_get_status_all",
        "Request_get_status_any",
        "Request_get_status_some",
        "Cancel",
        "Request_free",
        "Grequest_complete",
    ];
    const RMA: &[&str] = &[
        "Put",
        "Get",
        "Accumulate",
        "Get_accumulate",
        "Fetch_and_op",
        "Compare_and_swap",
        "Rput",
        "Rget",
        "Raccumulate",
        "Rget_accumulate",
    ];
    if P2P.contains(&base) {
        return "PointToPoint";
    }
    if COLLECTIVE_BASES.contains(&blocking_form(base).as_str()) {
        return "Collective";
    }
    if SYNC.contains(&base) {
        return "Synchronisation";
    }
    if COMPLETION.contains(&base) {
        return "Completion";
    }
    if RMA.contains(&base) {
        return "OneSided";
    }
    if let Some(file_op) = base.strip_prefix("File_") {
        const IO_VERBS: &[&str] = &[
            "open",
            "close",
            "delete",
            "sync",
            "set_size",
            "preallocate",
            "set_view",
        ];
        let data = ["read", "write", "iread", "iwrite"]
            .iter()
            .any(|v| file_op.starts_with(v));
        if data || IO_VERBS.contains(&file_op) {
            return "Io";
        }
    }
    "Local"
}

/// Functions whose buffers move data but whose byte figure cannot be derived
/// from the count and datatype arguments alone, so the probe must report them
/// as unknown. The send side of Reduce_scatter_block is `recvcount` times the
/// communicator size, which a probe cannot see.
pub fn send_side_unknowable(base: &str) -> bool {
    blocking_form(base) == "Reduce_scatter_block"
}

/// `Iallreduce` and `Allreduce_init` name the same operation as `Allreduce`.
fn blocking_form(base: &str) -> String {
    let base = base.strip_suffix("_init").unwrap_or(base);
    let mut chars = base.chars();
    match (chars.next(), chars.next()) {
        (Some('I'), Some(c)) if c.is_ascii_lowercase() => {
            let mut s = c.to_ascii_uppercase().to_string();
            s.push_str(chars.as_str());
            s
        }
        _ => base.to_string(),
    }
}

/// Persistent and partitioned set-up calls take a buffer but move no data;
/// the data moves at `MPI_Start`, where the probe cannot see the arguments.
pub fn moves_no_data(base: &str) -> bool {
    base.ends_with("_init") || base == "Pready" || base.starts_with("Pready_") || base == "Parrived"
}

/// The collective operation a procedure performs, by its blocking form's
/// name (`Ibcast`, `Bcast_init` and, through `base`, `MPI_Bcast_c` →
/// `Bcast`), barriers included; `None` for any other procedure. `base` is
/// the name without `MPI_` and without a large-count `_c`.
pub fn collective(base: &str) -> Option<&'static str> {
    let b = blocking_form(base);
    if b == "Barrier" {
        return Some("Barrier");
    }
    COLLECTIVE_BASES.iter().find(|c| **c == b).copied()
}
