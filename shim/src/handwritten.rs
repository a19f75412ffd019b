//! The entry points that are not "N words in, an `int` out", written by hand.
//!
//! The generator leaves out exactly these (see `xtask/src/codegen_shim.rs`),
//! and `generated/c.rs` names every one of them in a check, so forgetting
//! one here is a compile error rather than a missing symbol. Their gates and
//! `stats` wrappers are generated (`generated/next.rs`), with their
//! signatures.

use core::{cell::Cell, ffi::c_int};

use observer_common::FunctionId as F;

/// `MPI_SUCCESS`, 0 in every implementation (the standard requires it).
const MPI_SUCCESS: c_int = 0;

// MPI_Init and MPI_Init_thread are ordinary entry points: the first call of
// a process (normally one of these) finds its slot empty, and the cold path
// builds the stack before it enters it, so a bad tools list fails every
// rank at the same point, before MPI starts and before any rank can wait
// for another.
c_procedure!(F::Init as usize, MPI_Init, PMPI_Init, c_int, (argc, argv));
c_procedure!(
    F::InitThread as usize,
    MPI_Init_thread,
    PMPI_Init_thread,
    c_int,
    (argc, argv, required, provided)
);

// MPI_Finalize is an ordinary layered call: each tool's code before its
// PMPI_Finalize runs top-down and its code after runs bottom-up, which is the
// order tools expect. The table is deliberately kept after finalisation:
// MPI_Finalized, MPI_Initialized and MPI_Get_version stay legal.
c_procedure!(F::Finalize as usize, MPI_Finalize, PMPI_Finalize, c_int, ());

// Doubles come back in xmm0, not rax: these need their own return type.
c_procedure!(F::Wtime as usize, MPI_Wtime, PMPI_Wtime, f64, ());
c_procedure!(F::Wtick as usize, MPI_Wtick, PMPI_Wtick, f64, ());

// Handles, Fortran integers and addresses, returned in rax at full width
// (an `int` return would be just as correct for the Fortran integers, but a
// pointer handle of Open MPI needs all 64 bits).
c_procedure!(
    F::AintAdd as usize,
    MPI_Aint_add,
    PMPI_Aint_add,
    usize,
    (a0, a1)
);
c_procedure!(
    F::AintDiff as usize,
    MPI_Aint_diff,
    PMPI_Aint_diff,
    usize,
    (a0, a1)
);

/// The three conversions every handle kind has, each taking one word.
macro_rules! handle_conversions {
    ($(($c2f:ident, $f2c:ident, $fromint:ident) => ($mc2f:ident, $pc2f:ident, $mf2c:ident, $pf2c:ident, $mfi:ident, $pfi:ident);)*) => {
        $(
            c_procedure!(F::$c2f as usize, $mc2f, $pc2f, usize, (a0));
            c_procedure!(F::$f2c as usize, $mf2c, $pf2c, usize, (a0));
            c_procedure!(F::$fromint as usize, $mfi, $pfi, usize, (a0));
        )*
    };
}

handle_conversions! {
    (CommC2f, CommF2c, CommFromint) => (MPI_Comm_c2f, PMPI_Comm_c2f, MPI_Comm_f2c, PMPI_Comm_f2c, MPI_Comm_fromint, PMPI_Comm_fromint);
    (ErrhandlerC2f, ErrhandlerF2c, ErrhandlerFromint) => (MPI_Errhandler_c2f, PMPI_Errhandler_c2f, MPI_Errhandler_f2c, PMPI_Errhandler_f2c, MPI_Errhandler_fromint, PMPI_Errhandler_fromint);
    (FileC2f, FileF2c, FileFromint) => (MPI_File_c2f, PMPI_File_c2f, MPI_File_f2c, PMPI_File_f2c, MPI_File_fromint, PMPI_File_fromint);
    (GroupC2f, GroupF2c, GroupFromint) => (MPI_Group_c2f, PMPI_Group_c2f, MPI_Group_f2c, PMPI_Group_f2c, MPI_Group_fromint, PMPI_Group_fromint);
    (InfoC2f, InfoF2c, InfoFromint) => (MPI_Info_c2f, PMPI_Info_c2f, MPI_Info_f2c, PMPI_Info_f2c, MPI_Info_fromint, PMPI_Info_fromint);
    (MessageC2f, MessageF2c, MessageFromint) => (MPI_Message_c2f, PMPI_Message_c2f, MPI_Message_f2c, PMPI_Message_f2c, MPI_Message_fromint, PMPI_Message_fromint);
    (OpC2f, OpF2c, OpFromint) => (MPI_Op_c2f, PMPI_Op_c2f, MPI_Op_f2c, PMPI_Op_f2c, MPI_Op_fromint, PMPI_Op_fromint);
    (RequestC2f, RequestF2c, RequestFromint) => (MPI_Request_c2f, PMPI_Request_c2f, MPI_Request_f2c, PMPI_Request_f2c, MPI_Request_fromint, PMPI_Request_fromint);
    (SessionC2f, SessionF2c, SessionFromint) => (MPI_Session_c2f, PMPI_Session_c2f, MPI_Session_f2c, PMPI_Session_f2c, MPI_Session_fromint, PMPI_Session_fromint);
    (TypeC2f, TypeF2c, TypeFromint) => (MPI_Type_c2f, PMPI_Type_c2f, MPI_Type_f2c, PMPI_Type_f2c, MPI_Type_fromint, PMPI_Type_fromint);
    (WinC2f, WinF2c, WinFromint) => (MPI_Win_c2f, PMPI_Win_c2f, MPI_Win_f2c, PMPI_Win_f2c, MPI_Win_fromint, PMPI_Win_fromint);
}

thread_local! {
    /// Set while this thread runs the `MPI_Pcontrol` of every layer.
    static IN_PCONTROL: Cell<bool> = const { Cell::new(false) };
}

/// Layered `MPI_Pcontrol(level, ...)`.
///
/// Not a trampoline and not timed: the varargs cannot be forwarded to
/// several levels (C has no way to re-pass an unknown argument list), and
/// tools commonly do not chain it, so the shim itself calls
/// `MPI_Pcontrol(level)` at every level from the top down, once each
/// ([`crate::table::pcontrol`]); a level's own `PMPI_Pcontrol` or
/// `MPI_Pcontrol` is bound to [`crate::table::pcontrol_nested`], which returns
/// `MPI_SUCCESS` at once, so every level sees the call exactly once whether
/// or not it chains. Received as one `int`: in the SysV ABI a variadic
/// caller passes the fixed argument exactly where a non-variadic one does.
#[unsafe(no_mangle)]
unsafe extern "C" fn MPI_Pcontrol(level: c_int) -> c_int {
    pcontrol(level, 0)
}

/// Layered `PMPI_Pcontrol(level, ...)`: as [`MPI_Pcontrol`], from the
/// level below the top.
#[unsafe(no_mangle)]
pub(crate) unsafe extern "C" fn PMPI_Pcontrol(level: c_int) -> c_int {
    pcontrol(level, 1)
}

fn pcontrol(level: c_int, start: usize) -> c_int {
    if IN_PCONTROL.get() {
        return MPI_SUCCESS;
    }
    crate::layers::ensure();
    IN_PCONTROL.set(true);
    let mut rc = MPI_SUCCESS;
    for f in crate::table::pcontrol(start) {
        // SAFETY: some level's MPI_Pcontrol, variadic after `level`.
        let pc: unsafe extern "C" fn(c_int, ...) -> c_int = unsafe { core::mem::transmute(f) };
        // SAFETY: `pc` has MPI_Pcontrol's C signature; `level` is its one
        // fixed argument, and no variadic one is passed.
        rc = unsafe { pc(level) };
    }
    IN_PCONTROL.set(false);
    rc
}
