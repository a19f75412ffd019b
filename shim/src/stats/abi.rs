//! What the layer needs to know about the MPI library's ABI, without any
//! `mpi.h`: handle values and widths, the status layout, the special ranks,
//! and the library's own entry points for the queries the layer makes.
//!
//! Three ABIs are understood:
//!
//! - the **MPI-5 standard ABI** (`libmpi_abi.so`, MPI 5.0 chapter 21):
//!   handles are pointer-sized, predefined ones are fixed small integers
//!   (`MPI_COMM_WORLD` is `0x101`), and the status is 8 `int`s whose count
//!   lives in the private `MPI_internal` fields;
//! - **Open MPI**'s: handles are pointers to exported objects
//!   (`MPI_COMM_WORLD` is `&ompi_mpi_comm_world`);
//! - **MPICH**'s (MPICH, Intel MPI and the other `libmpi.so.12`s): handles
//!   are `int`s with fixed values.
//!
//! The library is recognised once, at `MPI_Init`, positively and in that
//! order (see [`Abi::detect`]): the standard ABI by the library's own
//! `MPI_Abi_get_version`, then Open MPI and MPICH by a symbol only they
//! export. A library that is none of these is never called with guessed
//! values: the layer passes calls through. The constants below are checked
//! against the headers by `abi_matches_the_headers` and
//! `standard_abi_handles_match_the_header`.

use core::ffi::{CStr, c_int, c_void};

/// The ABI a library speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// The MPI-5 standard ABI, version 1.
    Standard,
    /// Open MPI's own ABI.
    OpenMpi,
    /// MPICH's own ABI.
    Mpich,
}

/// Where a status keeps the received byte count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CountField {
    /// A `size_t` at this offset: Open MPI's `_ucount`.
    SizeT(usize),
    /// MPICH's `count_lo` at this offset, and in the next `int`
    /// `count_hi_and_cancelled`, the high half shifted left by one past the
    /// cancelled bit.
    Split(usize),
    /// Not specified: the standard ABI's `MPI_internal[5]` is private to
    /// the implementation (MPICH 5 and Intel MPI keep `count_lo` in
    /// `MPI_internal[0]` and `count_hi_and_cancelled` in `MPI_internal[1]`,
    /// as measured; Open MPI's standard-ABI work in progress lays them out
    /// differently), so the layer asks the library:
    /// `MPI_Get_count_c(status, MPI_BYTE)`.
    Library,
}

/// The compile-time half of an implementation's ABI.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Constants {
    /// Which ABI.
    pub(crate) family: Family,
    /// Bytes of a handle (`MPI_Comm`, `MPI_Request`, ...): 8 or 4.
    pub(crate) handle_width: usize,
    /// `sizeof(MPI_Status)`.
    pub(crate) status_size: usize,
    /// `offsetof(MPI_Status, MPI_SOURCE)`.
    pub(crate) source_offset: usize,
    /// Where the status keeps the received byte count.
    pub(crate) count: CountField,
    /// `MPI_STATUS_IGNORE` and `MPI_STATUSES_IGNORE` (equal in all three).
    pub(crate) status_ignore: usize,
    /// `MPI_IN_PLACE`.
    pub(crate) in_place: usize,
    /// `MPI_ANY_SOURCE`.
    pub(crate) any_source: i32,
    /// `MPI_PROC_NULL`.
    pub(crate) proc_null: i32,
    /// `MPI_ROOT`.
    pub(crate) root: i32,
    /// `MPI_UNDEFINED`.
    pub(crate) undefined: i32,
    /// `MPI_THREAD_MULTIPLE` (the levels are ordered in all three).
    pub(crate) thread_multiple: i32,
}

/// The MPI-5 standard ABI, version 1 (MPI 5.0 §21.3 and Annex A; MPICH 5's
/// `mpi_abi.h`).
pub(crate) const STANDARD: Constants = Constants {
    family: Family::Standard,
    handle_width: 8,
    // {int MPI_SOURCE, MPI_TAG, MPI_ERROR; int MPI_internal[5]}
    status_size: 32,
    source_offset: 0,
    count: CountField::Library,
    status_ignore: 0,
    in_place: 1,
    any_source: -1,
    proc_null: -3,
    root: -4,
    undefined: -32766,
    thread_multiple: 4096,
};

/// Open MPI 4.x (`openmpi/include/mpi.h`).
pub(crate) const OPEN_MPI: Constants = Constants {
    family: Family::OpenMpi,
    handle_width: 8,
    // {int MPI_SOURCE, MPI_TAG, MPI_ERROR, _cancelled; size_t _ucount}
    status_size: 24,
    source_offset: 0,
    count: CountField::SizeT(16),
    status_ignore: 0,
    in_place: 1,
    any_source: -1,
    proc_null: -2,
    root: -4,
    undefined: -32766,
    thread_multiple: 3,
};

/// MPICH 4.x (`mpich/mpi.h`); Intel MPI's `libmpi.so.12` is the same ABI.
pub(crate) const MPICH: Constants = Constants {
    family: Family::Mpich,
    handle_width: 4,
    // {int count_lo, count_hi_and_cancelled, MPI_SOURCE, MPI_TAG, MPI_ERROR}
    status_size: 20,
    source_offset: 8,
    count: CountField::Split(0),
    status_ignore: 1,
    in_place: usize::MAX,
    any_source: -2,
    proc_null: -1,
    root: -3,
    undefined: -32766,
    thread_multiple: 3,
};

/// The largest status of any supported ABI, for statuses the layer
/// substitutes for `MPI_STATUS_IGNORE`.
pub(crate) const MAX_STATUS: usize = 32;

/// A status the layer owns, aligned for every layout.
#[repr(C, align(8))]
pub(crate) struct Status(pub(crate) [u8; MAX_STATUS]);

impl Status {
    /// A zeroed status.
    pub(crate) const fn new() -> Status {
        Status([0; MAX_STATUS])
    }
}

type TypeSizeX = unsafe extern "C" fn(usize, *mut i64) -> c_int;
type TestCancelled = unsafe extern "C" fn(*const u8, *mut c_int) -> c_int;
type GetCountC = unsafe extern "C" fn(*const u8, usize, *mut i64) -> c_int;
type CommInt = unsafe extern "C" fn(usize, *mut c_int) -> c_int;
type CommGroup = unsafe extern "C" fn(usize, *mut usize) -> c_int;
type GroupTranslate = unsafe extern "C" fn(usize, c_int, *const c_int, usize, *mut c_int) -> c_int;
type GroupFree = unsafe extern "C" fn(*mut usize) -> c_int;
type QueryThread = unsafe extern "C" fn(*mut c_int) -> c_int;
type AbiGetVersion = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;

/// Everything the layer knows about the running library.
pub(crate) struct Abi {
    /// Its compile-time constants.
    pub(crate) c: Constants,
    /// What was recognised, for messages: "MPICH", "Intel MPI (standard
    /// ABI)", ...
    pub(crate) library: &'static str,
    /// `MPI_COMM_WORLD`.
    pub(crate) comm_world: usize,
    /// `MPI_COMM_NULL`.
    pub(crate) comm_null: usize,
    /// `MPI_REQUEST_NULL`.
    pub(crate) request_null: usize,
    /// `MPI_MESSAGE_NO_PROC`.
    pub(crate) message_no_proc: usize,
    /// The library's `PMPI_Type_size_x`.
    pub(crate) type_size_x: TypeSizeX,
    /// The library's `PMPI_Test_cancelled`.
    pub(crate) test_cancelled: TestCancelled,
    /// The library's `PMPI_Get_count_c`, where the status does not say
    /// where the count is ([`CountField::Library`]).
    pub(crate) get_count_c: Option<GetCountC>,
    /// The library's `PMPI_Comm_rank`.
    pub(crate) comm_rank: CommInt,
    /// The library's `PMPI_Comm_size`.
    pub(crate) comm_size: CommInt,
    /// The library's `PMPI_Comm_remote_size`.
    pub(crate) comm_remote_size: CommInt,
    /// The library's `PMPI_Comm_test_inter`.
    pub(crate) comm_test_inter: CommInt,
    /// The library's `PMPI_Comm_group`.
    pub(crate) comm_group: CommGroup,
    /// The library's `PMPI_Comm_remote_group`.
    pub(crate) comm_remote_group: CommGroup,
    /// The library's `PMPI_Group_translate_ranks`.
    pub(crate) group_translate_ranks: GroupTranslate,
    /// The library's `PMPI_Group_free`.
    pub(crate) group_free: GroupFree,
    /// The library's `PMPI_Query_thread`.
    pub(crate) query_thread: QueryThread,
}

/// Why the layer cannot run on this library.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AbiError {
    /// Neither the standard ABI nor Open MPI's or MPICH's marker symbol.
    #[error(
        "unrecognised MPI library (not the MPI-5 standard ABI, Open MPI or MPICH): its handles and status cannot be read"
    )]
    Unknown,
    /// A standard ABI of a major version the layer does not know: its
    /// handles and status may differ from version 1's.
    #[error(
        "the MPI library implements the standard ABI version {major}.{minor}, and the layer reads version 1 only"
    )]
    StandardVersion {
        /// `MPI_Abi_get_version`'s major version.
        major: i32,
        /// Its minor version.
        minor: i32,
    },
    /// A symbol the layer needs is missing.
    #[error("the MPI library does not export {symbol}")]
    Missing {
        /// The symbol.
        symbol: &'static str,
    },
}

/// The library's definition of `name`: the next one after the shim, so the
/// layer's own queries never run through the stack (a tool below must not
/// count them).
fn next(name: &'static CStr) -> Result<*mut c_void, AbiError> {
    // SAFETY: NUL-terminated name; RTLD_NEXT from inside the shim.
    let mut p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if p.is_null() {
        // A library loaded RTLD_LOCAL (mpi4py loads it so) is in no global
        // search: look in every loaded object.
        p = crate::loaded::find(name, &[]).map_or(p, |a| a.cast_mut());
    }
    if p.is_null() {
        return Err(AbiError::Missing {
            symbol: name.to_str().unwrap_or("?"),
        });
    }
    Ok(p)
}

/// Any loaded object's `name`, or null.
fn global(name: &CStr) -> usize {
    // SAFETY: NUL-terminated name.
    match unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize } {
        // As in `next`: a library loaded RTLD_LOCAL.
        0 => crate::loaded::find(name, &[]).map_or(0, |a| a as usize),
        p => p,
    }
}

macro_rules! entry {
    ($name:literal, $ty:ty) => {
        // SAFETY: the library's entry point of that name has this C signature.
        unsafe { core::mem::transmute::<*mut c_void, $ty>(next($name)?) }
    };
}

/// The library's own `MPI_Abi_get_version` (never the shim's, which would
/// run through the stack): `(major, minor)`, `(-1, -1)` from a library that
/// implements only its own ABI, `None` from one older than MPI 5.
fn standard_abi_version() -> Option<(i32, i32)> {
    let f = next(c"PMPI_Abi_get_version").ok()?;
    // SAFETY: MPI 5.0's `int MPI_Abi_get_version(int *, int *)`, callable
    // at any time and thread-safe (§21.2).
    let f = unsafe { core::mem::transmute::<*mut c_void, AbiGetVersion>(f) };
    let (mut major, mut minor) = (-1, -1);
    // SAFETY: two out-pointers.
    (unsafe { f(&mut major, &mut minor) } == 0).then_some((major, minor))
}

/// A symbol only Intel MPI exports (its `libmpi.so.12` and `libmpi_abi.so`
/// alike), to name it; it speaks MPICH's ABI or the standard one.
const INTEL_MARKER: &CStr = c"I_MPI_Check_image_status";

/// A symbol only MPICH and its derivatives export.
const MPICH_MARKER: &CStr = c"MPIR_Err_return_comm";

/// The ABI of the loaded library and what it is called, with its
/// `MPI_COMM_WORLD`, `MPI_REQUEST_NULL`, `MPI_MESSAGE_NO_PROC` and
/// `MPI_COMM_NULL`; each
/// ABI recognised positively, the standard ABI first (an implementation's
/// `libmpi_abi.so` also exports that implementation's own markers).
fn recognise() -> Result<(Constants, &'static str, [usize; 4]), AbiError> {
    let intel = global(INTEL_MARKER) != 0;
    match standard_abi_version() {
        Some((1, _)) => {
            let library = if intel {
                "Intel MPI (standard ABI)"
            } else if global(MPICH_MARKER) != 0 {
                "MPICH (standard ABI)"
            } else if global(c"ompi_mpi_comm_world") != 0 {
                "Open MPI (standard ABI)"
            } else {
                "an MPI library (standard ABI)"
            };
            return Ok((STANDARD, library, STANDARD_HANDLES));
        }
        Some((major, minor)) if major > 1 => {
            return Err(AbiError::StandardVersion { major, minor });
        }
        // (-1, -1): the library's own ABI; None: MPI 4 or older.
        _ => {}
    }
    let world = global(c"ompi_mpi_comm_world");
    if world != 0 {
        let need = |n: &'static CStr| match global(n) {
            0 => Err(AbiError::Missing {
                symbol: n.to_str().unwrap_or("?"),
            }),
            p => Ok(p),
        };
        let handles = [
            world,
            need(c"ompi_request_null")?,
            need(c"ompi_message_no_proc")?,
            need(c"ompi_mpi_comm_null")?,
        ];
        return Ok((OPEN_MPI, "Open MPI", handles));
    }
    if intel {
        return Ok((MPICH, "Intel MPI", MPICH_HANDLES));
    }
    if global(MPICH_MARKER) != 0 {
        return Ok((MPICH, "MPICH", MPICH_HANDLES));
    }
    Err(AbiError::Unknown)
}

impl Abi {
    /// Recognises the library and resolves what the layer calls. Nothing is
    /// called with a handle or a status before the ABI is known.
    pub(crate) fn detect() -> Result<Abi, AbiError> {
        let (c, library, [comm_world, request_null, message_no_proc, comm_null]) = recognise()?;
        let get_count_c = match c.count {
            CountField::Library => Some(entry!(c"PMPI_Get_count_c", GetCountC)),
            CountField::SizeT(_) | CountField::Split(_) => None,
        };
        Ok(Abi {
            c,
            library,
            comm_world,
            comm_null,
            request_null,
            message_no_proc,
            type_size_x: entry!(c"PMPI_Type_size_x", TypeSizeX),
            test_cancelled: entry!(c"PMPI_Test_cancelled", TestCancelled),
            get_count_c,
            comm_rank: entry!(c"PMPI_Comm_rank", CommInt),
            comm_size: entry!(c"PMPI_Comm_size", CommInt),
            comm_remote_size: entry!(c"PMPI_Comm_remote_size", CommInt),
            comm_test_inter: entry!(c"PMPI_Comm_test_inter", CommInt),
            comm_group: entry!(c"PMPI_Comm_group", CommGroup),
            comm_remote_group: entry!(c"PMPI_Comm_remote_group", CommGroup),
            group_translate_ranks: entry!(c"PMPI_Group_translate_ranks", GroupTranslate),
            group_free: entry!(c"PMPI_Group_free", GroupFree),
            query_thread: entry!(c"PMPI_Query_thread", QueryThread),
        })
    }

    /// A handle argument as the library sees it: MPICH passes an `int`, whose
    /// register's upper half is unspecified in the SysV ABI.
    #[inline(always)]
    pub(crate) fn handle(&self, word: usize) -> usize {
        if self.c.handle_width == 4 {
            word as u32 as usize
        } else {
            word
        }
    }

    /// Element `i` of a caller's handle array (requests, messages).
    ///
    /// # Safety
    /// `array` points to at least `i + 1` handles.
    #[inline(always)]
    pub(crate) unsafe fn handle_at(&self, array: usize, i: usize) -> usize {
        // SAFETY: per the caller; handle arrays are naturally aligned.
        unsafe {
            if self.c.handle_width == 4 {
                *(array as *const u32).add(i) as usize
            } else {
                *(array as *const usize).add(i)
            }
        }
    }

    /// `MPI_SOURCE` of the status at `status`.
    ///
    /// # Safety
    /// `status` points to a status of this implementation.
    #[inline(always)]
    pub(crate) unsafe fn source(&self, status: *const u8) -> i32 {
        // SAFETY: per the caller; MPI_SOURCE is an aligned int.
        unsafe { *(status.add(self.c.source_offset) as *const i32) }
    }

    /// `MPI_TAG` of the status at `status`: the int after `MPI_SOURCE` in
    /// every layout (Open MPI's, MPICH's and the standard ABI's).
    ///
    /// # Safety
    /// `status` points to a status of this implementation.
    #[inline(always)]
    pub(crate) unsafe fn tag(&self, status: *const u8) -> i32 {
        // SAFETY: per the caller; MPI_TAG is an aligned int.
        unsafe { *(status.add(self.c.source_offset + 4) as *const i32) }
    }

    /// The size a predefined datatype's handle encodes, if it does: MPICH's
    /// builtins, the standard ABI's fixed-size types.
    #[inline(always)]
    fn builtin_size(&self, datatype: usize) -> Option<u64> {
        match self.c.family {
            Family::Mpich => mpich_builtin_size(datatype),
            Family::Standard => standard_builtin_size(datatype),
            Family::OpenMpi => None,
        }
    }

    /// Bytes of `count` elements of `datatype`, or `None` if the library
    /// cannot say (an invalid or undefined-size type).
    #[inline(always)]
    pub(crate) fn bytes(&self, count: i64, datatype: usize) -> Option<u64> {
        if count >= 0
            && let Some(size) = self.builtin_size(datatype)
        {
            return Some((count as u64).saturating_mul(size));
        }
        let mut size = 0i64;
        // SAFETY: the library's PMPI_Type_size_x with an out-pointer.
        let rc = unsafe { (self.type_size_x)(datatype, &mut size) };
        (rc == 0 && size >= 0 && count >= 0).then(|| (count as u64).saturating_mul(size as u64))
    }

    /// Bytes a completed receive delivered, from its status.
    ///
    /// This is the byte count the library stores in the status, which is
    /// what `MPI_Get_count(status, MPI_BYTE)` returns. Open MPI's
    /// (`_ucount`) and MPICH's (`MPIR_STATUS_GET_COUNT`) are read in place
    /// rather than through a library call on every receive; the standard
    /// ABI does not say where the count is, so there the library's
    /// `MPI_Get_count_c` answers. It needs no datatype handle at
    /// completion, and the caller may already have freed that datatype.
    /// `abi_matches_the_headers` pins the fields, and the e2e tests pin the
    /// values on every ABI, derived types included.
    ///
    /// # Safety
    /// `status` points to a status filled by the library.
    #[inline(always)]
    pub(crate) unsafe fn received(&self, status: *const u8) -> Option<u64> {
        // SAFETY: per the caller; the fields are naturally aligned.
        unsafe {
            match self.c.count {
                CountField::SizeT(at) => Some(*(status.add(at) as *const u64)),
                CountField::Split(at) => {
                    let at = status.add(at);
                    let lo = *(at as *const u32) as u64;
                    let hi = (*(at.add(4) as *const u32) >> 1) as u64;
                    Some((hi << 32) | lo)
                }
                CountField::Library => {
                    let mut n = 0i64;
                    let rc = (self.get_count_c?)(status, STANDARD_BYTE, &mut n);
                    (rc == 0 && n >= 0).then_some(n as u64)
                }
            }
        }
    }

    /// Whether the status says the request was cancelled.
    ///
    /// # Safety
    /// `status` points to a status filled by the library.
    pub(crate) unsafe fn cancelled(&self, status: *const u8) -> bool {
        let mut flag: c_int = 0;
        // SAFETY: per the caller.
        unsafe { (self.test_cancelled)(status, &mut flag) == 0 && flag != 0 }
    }
}

/// MPICH's `MPI_COMM_WORLD`, `MPI_REQUEST_NULL`, `MPI_MESSAGE_NO_PROC` and
/// `MPI_COMM_NULL`.
const MPICH_HANDLES: [usize; 4] = [0x4400_0000, 0x2c00_0000, 0x6c00_0000, 0x0400_0000];

/// The standard ABI's `MPI_COMM_WORLD`, `MPI_REQUEST_NULL`,
/// `MPI_MESSAGE_NO_PROC` and `MPI_COMM_NULL` (MPI 5.0 §21.5).
const STANDARD_HANDLES: [usize; 4] = [0x101, 0x180, 0x129, 0x100];

/// The standard ABI's `MPI_BYTE`.
const STANDARD_BYTE: usize = 0x247;

/// The size MPICH encodes in a builtin datatype's handle (kind bits `01`,
/// size in bits 8..16: `MPI_INT` is `0x4c000405`), as MPICH's own
/// `MPIR_Datatype_get_basic_size` reads it; `None` for other handles and
/// for builtins of no fixed size.
#[inline(always)]
pub(crate) fn mpich_builtin_size(handle: usize) -> Option<u64> {
    let size = (handle >> 8) & 0xff;
    (handle >> 30 == 1 && size != 0).then_some(size as u64)
}

/// The size the standard ABI encodes in a fixed-size predefined datatype's
/// handle (MPI 5.0 §21.5, "Handle Constants"): datatypes are
/// `0b0010_xxxx_xxxx`, the fixed-size ones have bit 6 set and the base-2
/// logarithm of their size in bits 5:3 (`MPI_INT32_T` is `0x250`: 4 bytes;
/// `MPI_COMPLEX32` is `0x2eb`: 32). `None` for other handles, among them
/// the types of platform-dependent size (`MPI_INT` is `0x209`), which the
/// library sizes. An optional type the library does not support has a
/// size here but fails the call, which is then not counted.
#[inline(always)]
pub(crate) fn standard_builtin_size(handle: usize) -> Option<u64> {
    (handle >> 8 == 0b0010 && handle & 0x40 != 0).then(|| 1 << ((handle >> 3) & 7))
}

/// A count argument: an `int`, or an `MPI_Count` in the `_c` variants.
#[inline(always)]
pub(crate) fn count<const LARGE: bool>(word: usize) -> i64 {
    if LARGE {
        word as i64
    } else {
        word as u32 as i32 as i64
    }
}

/// An `int` argument (rank, tag, root): the low half of its register.
#[inline(always)]
pub(crate) fn int(word: usize) -> i32 {
    word as u32 as i32
}

#[cfg(test)]
mod tests {
    use std::{
        path::{Path, PathBuf},
        process::Command,
    };

    use super::*;

    /// Compiles `src` with `mpicc` into a fresh directory; `None` (with a
    /// message) where the compiler is absent.
    fn compile(mpicc: &Path, name: &str, src: &str) -> Option<PathBuf> {
        let tag = mpicc.to_string_lossy().replace(['/', '.'], "_");
        let dir = std::env::temp_dir().join(format!("stats-{name}-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c = dir.join(format!("{name}.c"));
        std::fs::write(&c, src).unwrap();
        let exe = dir.join(name);
        let Ok(o) = Command::new(mpicc).arg("-o").arg(&exe).arg(&c).output() else {
            eprintln!("SKIPPED: {} not installed", mpicc.display());
            return None;
        };
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        Some(exe)
    }

    fn in_ci() -> bool {
        std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
    }

    /// A compiler wrapper from a wheel `cargo xtask setup` installs under
    /// `<target>/mpi/`, e.g. MPICH 5's `mpich5/bin/mpicc_abi` (the standard
    /// ABI). Missing: skipped, or under `CI=true` a failure, as in the e2e
    /// harness.
    fn wheel(path: &str) -> Option<PathBuf> {
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
        let p = target.join("mpi").join(path);
        if p.exists() {
            return Some(p);
        }
        assert!(
            !in_ci(),
            "CI=true and this test needs {}: install it (cargo xtask setup) instead of skipping",
            p.display()
        );
        eprintln!("SKIPPED: {} not installed (cargo xtask setup)", p.display());
        None
    }

    /// Compiles and runs a C program printing each constant with `mpicc`,
    /// and compares with ours. The e2e tests run on every library
    /// regardless.
    fn check(mpicc: &Path, c: Constants, handle_type_width: usize) {
        let Some(exe) = compile(
            mpicc,
            "abi",
            r#"#include <mpi.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
int main(void) {
#if defined(MPI_ABI_VERSION) && MPI_ABI_VERSION >= 1
    /* MPI_internal[5] is private: the count is the library's to say. */
    long count = -1;
#elif defined(OPEN_MPI)
    long count = offsetof(MPI_Status, _ucount);
#else
    long count = offsetof(MPI_Status, count_lo);
    if (offsetof(MPI_Status, count_hi_and_cancelled) != count + 4) count = 99;
#endif
    printf("%zu %zu %zu %ld %zu %ld %ld %d %d %d %d %d %zu\n",
        sizeof(MPI_Request), sizeof(MPI_Status), offsetof(MPI_Status, MPI_SOURCE), count,
        sizeof(MPI_Comm), (long)(intptr_t)MPI_STATUS_IGNORE, (long)(intptr_t)MPI_IN_PLACE,
        MPI_ANY_SOURCE, MPI_PROC_NULL, MPI_ROOT, MPI_UNDEFINED, MPI_THREAD_MULTIPLE,
        (size_t)(MPI_STATUS_IGNORE == MPI_STATUSES_IGNORE));
    return 0;
}
"#,
        ) else {
            return;
        };
        let out = Command::new(&exe).output().unwrap();
        let got = String::from_utf8(out.stdout).unwrap();
        let count = match c.count {
            CountField::SizeT(at) | CountField::Split(at) => at as i64,
            CountField::Library => -1,
        };
        let want = format!(
            "{} {} {} {} {} {} {} {} {} {} {} {} 1\n",
            c.handle_width,
            c.status_size,
            c.source_offset,
            count,
            handle_type_width,
            c.status_ignore as isize,
            c.in_place as isize,
            c.any_source,
            c.proc_null,
            c.root,
            c.undefined,
            c.thread_multiple,
        );
        assert_eq!(
            got,
            want,
            "{}: header values differ from ours",
            mpicc.display()
        );
        assert!(c.status_size <= MAX_STATUS);
    }

    /// Parses lines of integers (decimal, or hex with `0x`).
    fn parse(out: &str) -> Vec<Vec<i64>> {
        out.lines()
            .map(|l| {
                l.split_whitespace()
                    .map(|x| match x.strip_prefix("0x") {
                        Some(h) => i64::from_str_radix(h, 16).unwrap(),
                        None => x.parse().unwrap(),
                    })
                    .collect()
            })
            .collect()
    }

    /// MPICH's fixed handles and the builtin sizes decoded from handles,
    /// against its header.
    #[test]
    fn mpich_handles_match_the_header() {
        let Some(exe) = compile(
            Path::new("mpicc.mpich"),
            "h",
            r#"#include <mpi.h>
#include <stdio.h>
#include <stdint.h>
#define T(t, c) printf("%u %zu\n", (unsigned)(t), sizeof(c))
int main(void) {
    printf("%u %u %u %u\n", (unsigned)MPI_COMM_WORLD, (unsigned)MPI_REQUEST_NULL,
           (unsigned)MPI_MESSAGE_NO_PROC, (unsigned)MPI_COMM_NULL);
    T(MPI_CHAR, char); T(MPI_BYTE, char); T(MPI_SHORT, short); T(MPI_INT, int);
    T(MPI_LONG, long); T(MPI_FLOAT, float); T(MPI_DOUBLE, double);
    T(MPI_LONG_DOUBLE, long double); T(MPI_INT64_T, int64_t);
    T(MPI_C_DOUBLE_COMPLEX, double _Complex); T(MPI_AINT, MPI_Aint);
    return 0;
}
"#,
        ) else {
            return;
        };
        let out = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
        let rows = parse(&out);
        let h: Vec<usize> = rows[0].iter().map(|&x| x as usize).collect();
        assert_eq!(h, MPICH_HANDLES);
        for r in &rows[1..] {
            let handle = r[0] as usize;
            assert_eq!(
                mpich_builtin_size(handle),
                Some(r[1] as u64),
                "handle {handle:#x}"
            );
        }
        // A derived type's handle (kind 10) is not decoded.
        assert_eq!(mpich_builtin_size(0x8c00_0000), None);
    }

    /// The standard ABI's fixed handles and the sizes decoded from handles,
    /// against MPICH 5's `mpi_abi.h` and against the library itself: every
    /// handle in the datatype range `MPI_Type_size_c` accepts is either not
    /// decoded, or decoded to the size the library gives.
    #[test]
    fn standard_abi_handles_match_the_header() {
        let Some(mpicc) = wheel("mpich5/bin/mpicc_abi") else {
            return;
        };
        let Some(exe) = compile(
            &mpicc,
            "h",
            r#"#include <mpi.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#define H(h) ((long)(intptr_t)(h))
/* A named type and its size, -1 for "of no size fixed by the ABI". */
#define T(t, n) printf("0x%lx %d\n", H(t), (int)(n))
int main(int argc, char **argv) {
    printf("0x%lx 0x%lx 0x%lx 0x%lx 0x%lx\n", H(MPI_COMM_WORLD), H(MPI_REQUEST_NULL),
           H(MPI_MESSAGE_NO_PROC), H(MPI_COMM_NULL), H(MPI_BYTE));
    if (argc > 1 && strcmp(argv[1], "library") == 0) {
        MPI_Init(&argc, &argv);
        MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        for (intptr_t h = 0x200; h < 0x300; h++) {
            MPI_Count size;
            if (MPI_Type_size_c((MPI_Datatype)h, &size) == MPI_SUCCESS && size != MPI_UNDEFINED)
                printf("0x%lx %lld\n", (long)h, (long long)size);
        }
        MPI_Finalize();
        return 0;
    }
    T(MPI_INT8_T, sizeof(int8_t)); T(MPI_UINT8_T, sizeof(uint8_t)); T(MPI_CHAR, sizeof(char));
    T(MPI_SIGNED_CHAR, 1); T(MPI_UNSIGNED_CHAR, 1); T(MPI_BYTE, 1);
    T(MPI_INT16_T, sizeof(int16_t)); T(MPI_UINT16_T, 2); T(MPI_INT32_T, sizeof(int32_t));
    T(MPI_UINT32_T, 4); T(MPI_INT64_T, sizeof(int64_t)); T(MPI_UINT64_T, 8);
    T(MPI_LOGICAL1, 1); T(MPI_INTEGER1, 1); T(MPI_LOGICAL2, 2); T(MPI_INTEGER2, 2);
    T(MPI_REAL2, 2); T(MPI_LOGICAL4, 4); T(MPI_INTEGER4, 4); T(MPI_REAL4, 4);
    T(MPI_COMPLEX4, 4); T(MPI_LOGICAL8, 8); T(MPI_INTEGER8, 8); T(MPI_REAL8, 8);
    T(MPI_COMPLEX8, 8); T(MPI_LOGICAL16, 16); T(MPI_INTEGER16, 16); T(MPI_REAL16, 16);
    T(MPI_COMPLEX16, 16); T(MPI_COMPLEX32, 32);
    T(MPI_DATATYPE_NULL, -1); T(MPI_AINT, -1); T(MPI_COUNT, -1); T(MPI_OFFSET, -1);
    T(MPI_PACKED, -1); T(MPI_SHORT, -1); T(MPI_INT, -1); T(MPI_LONG, -1);
    T(MPI_LONG_LONG, -1); T(MPI_UNSIGNED, -1); T(MPI_FLOAT, -1); T(MPI_DOUBLE, -1);
    T(MPI_C_DOUBLE_COMPLEX, -1); T(MPI_LOGICAL, -1); T(MPI_INTEGER, -1); T(MPI_REAL, -1);
    T(MPI_DOUBLE_PRECISION, -1); T(MPI_CHARACTER, -1); T(MPI_LONG_DOUBLE, -1);
    T(MPI_C_LONG_DOUBLE_COMPLEX, -1); T(MPI_2INT, -1); T(MPI_LONG_DOUBLE_INT, -1);
    T(MPI_2INTEGER, -1); T(MPI_C_BOOL, -1); T(MPI_WCHAR, -1);
    /* Handles of other kinds are never sizes. */
    T(MPI_COMM_WORLD, -1); T(MPI_REQUEST_NULL, -1); T(MPI_SUM, -1); T(MPI_NO_OP, -1);
    T(MPI_MESSAGE_NO_PROC, -1); T(MPI_ERRORS_RETURN, -1); T(MPI_INFO_ENV, -1);
    return 0;
}
"#,
        ) else {
            return;
        };
        let out = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
        let rows = parse(&out);
        let h: Vec<usize> = rows[0].iter().map(|&x| x as usize).collect();
        assert_eq!(
            h[..4],
            STANDARD_HANDLES,
            "COMM_WORLD, REQUEST_NULL, MESSAGE_NO_PROC, COMM_NULL"
        );
        assert_eq!(h[4], STANDARD_BYTE, "MPI_BYTE");
        assert!(rows.len() > 60, "{out}");
        for r in &rows[1..] {
            let want = u64::try_from(r[1]).ok();
            assert_eq!(
                standard_builtin_size(r[0] as usize),
                want,
                "handle {:#x}",
                r[0]
            );
        }
        // A user's handle (a pointer) is never decoded.
        assert_eq!(standard_builtin_size(0x5555_5555_5250), None);
        // The library's own sizes, in a singleton.
        let o = Command::new(&exe).arg("library").output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let lib = parse(&String::from_utf8(o.stdout).unwrap());
        let mut decoded = 0;
        for r in &lib[1..] {
            if let Some(size) = standard_builtin_size(r[0] as usize) {
                assert_eq!(size, r[1] as u64, "handle {:#x}", r[0]);
                decoded += 1;
            }
        }
        assert_eq!(decoded, 30, "every fixed-size type the library has");
    }

    #[test]
    fn abi_matches_the_headers() {
        check(Path::new("mpicc.openmpi"), OPEN_MPI, 8);
        check(Path::new("mpicc.mpich"), MPICH, 4);
        // The wheels: MPICH 5 through the standard ABI and natively, Open
        // MPI 5.
        if let Some(mpicc) = wheel("mpich5/bin/mpicc_abi") {
            check(&mpicc, STANDARD, 8);
        }
        if let Some(mpicc) = wheel("mpich5/bin/mpicc") {
            check(&mpicc, MPICH, 4);
        }
        if let Some(mpicc) = wheel("openmpi5/bin/mpicc") {
            check(&mpicc, OPEN_MPI, 8);
        }
    }
}
