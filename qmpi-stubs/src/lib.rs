//! `libmpi_observer_qmpi.so`: the six `QMPI_*` registration and lookup
//! symbols of MPICH's QMPI interface, inert, as MPICH built without
//! `--enable-qmpi` exports them.
//!
//! A QMPI tool, or a program with a tool compiled in, needs these symbols at
//! link time, and Open MPI and the standard ABI's libraries have none:
//! `mpi-observer qmpi-flags` links against this library. At run time, under
//! the preloaded shim (`libmpi_observer_shim.so`), the shim's definitions
//! come first in symbol resolution and these are never called. Without the
//! shim, registration fails and the tool stays out of the way: the program
//! runs as if no tool were there.
//!
//! No MPI dependency: it must load under every MPI, and touches nothing.

use core::ffi::{c_char, c_int, c_void};

/// What each stub returns: 52, Open MPI's `MPI_ERR_UNSUPPORTED_OPERATION`,
/// the class MPICH's own stubs return (44 in MPICH's numbering, 55 in the
/// standard ABI's). Any non-zero value tells the tool it is not registered.
pub const UNSUPPORTED: c_int = 52;

/// MPICH's `QMPI_Context`: one pointer, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct QmpiContext {
    /// Unused by MPICH and by us.
    pub storage_stack: *mut *mut c_void,
}

/// `QMPI_Register_tool_name(name, init)`: not registered.
#[unsafe(no_mangle)]
pub extern "C" fn QMPI_Register_tool_name(
    _tool_name: *const c_char,
    _init_function_ptr: Option<extern "C" fn(c_int)>,
) -> c_int {
    UNSUPPORTED
}

/// `QMPI_Register_tool_storage(id, storage)`: no such instance.
#[unsafe(no_mangle)]
pub extern "C" fn QMPI_Register_tool_storage(_tool_id: c_int, _tool_storage: *mut c_void) -> c_int {
    UNSUPPORTED
}

/// `QMPI_Register_function(id, MPI_X_T, fn)`: no such instance.
#[unsafe(no_mangle)]
pub extern "C" fn QMPI_Register_function(
    _calling_tool_id: c_int,
    _function_enum: c_int,
    _function_ptr: Option<extern "C" fn()>,
) -> c_int {
    UNSUPPORTED
}

/// `QMPI_Get_function(id, MPI_X_T, &fn, &next)`: no such instance; the
/// outputs are left as they are.
#[unsafe(no_mangle)]
pub extern "C" fn QMPI_Get_function(
    _calling_tool_id: c_int,
    _function_enum: c_int,
    _function_ptr: *mut Option<extern "C" fn()>,
    _next_tool_id: *mut c_int,
) -> c_int {
    UNSUPPORTED
}

/// `QMPI_Get_tool_storage(ctx, id, &storage)`: no such instance.
#[unsafe(no_mangle)]
pub extern "C" fn QMPI_Get_tool_storage(
    _context: QmpiContext,
    _tool_id: c_int,
    _storage: *mut *mut c_void,
) -> c_int {
    UNSUPPORTED
}

/// `QMPI_Get_calling_address(ctx, &address)`: nothing to report.
#[unsafe(no_mangle)]
pub extern "C" fn QMPI_Get_calling_address(
    _context: QmpiContext,
    _address: *mut *mut c_void,
) -> c_int {
    UNSUPPORTED
}
