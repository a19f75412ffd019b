//! What the layer needs to know about the MPI library's ABI, without either
//! `mpi.h`: handle values and widths, the status layout, the special ranks,
//! and the library's own entry points for the queries the layer makes.
//!
//! Open MPI's handles are pointers to exported objects (`MPI_COMM_WORLD` is
//! `&ompi_mpi_comm_world`); MPICH's are `int`s with fixed values. The
//! implementation is recognised once, at `MPI_Init`, by a symbol only it
//! exports. The constants below are checked against both headers by
//! `abi_matches_the_headers` (run when the compilers are installed).

use core::ffi::{CStr, c_int, c_void};

/// The compile-time half of an implementation's ABI.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Constants {
    /// Bytes of a handle (`MPI_Comm`, `MPI_Request`, ...): 8 or 4.
    pub(crate) handle_width: usize,
    /// `sizeof(MPI_Status)`.
    pub(crate) status_size: usize,
    /// `offsetof(MPI_Status, MPI_SOURCE)`.
    pub(crate) source_offset: usize,
    /// Where the status keeps the received byte count: Open MPI's `size_t
    /// _ucount`, or MPICH's `count_lo` (the high half is in the next int,
    /// shifted left by one past the cancelled bit).
    pub(crate) count_offset: usize,
    /// `MPI_STATUS_IGNORE` and `MPI_STATUSES_IGNORE` (equal in both).
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
}

/// Open MPI 4.x (`openmpi/include/mpi.h`).
pub(crate) const OPEN_MPI: Constants = Constants {
    handle_width: 8,
    // {int MPI_SOURCE, MPI_TAG, MPI_ERROR, _cancelled; size_t _ucount}
    status_size: 24,
    source_offset: 0,
    count_offset: 16,
    status_ignore: 0,
    in_place: 1,
    any_source: -1,
    proc_null: -2,
    root: -4,
    undefined: -32766,
};

/// MPICH 4.x (`mpich/mpi.h`).
pub(crate) const MPICH: Constants = Constants {
    handle_width: 4,
    // {int count_lo, count_hi_and_cancelled, MPI_SOURCE, MPI_TAG, MPI_ERROR}
    status_size: 20,
    source_offset: 8,
    count_offset: 0,
    status_ignore: 1,
    in_place: usize::MAX,
    any_source: -2,
    proc_null: -1,
    root: -3,
    undefined: -32766,
};

/// The largest status of any supported implementation, for statuses the
/// layer substitutes for `MPI_STATUS_IGNORE`.
pub(crate) const MAX_STATUS: usize = 24;

/// A status the layer owns, aligned for either layout.
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
type CommInt = unsafe extern "C" fn(usize, *mut c_int) -> c_int;
type CommGroup = unsafe extern "C" fn(usize, *mut usize) -> c_int;
type GroupTranslate = unsafe extern "C" fn(usize, c_int, *const c_int, usize, *mut c_int) -> c_int;
type GroupFree = unsafe extern "C" fn(*mut usize) -> c_int;
type QueryThread = unsafe extern "C" fn(*mut c_int) -> c_int;

/// Everything the layer knows about the running library.
pub(crate) struct Abi {
    /// Its compile-time constants.
    pub(crate) c: Constants,
    /// `MPI_COMM_WORLD`.
    pub(crate) comm_world: usize,
    /// `MPI_REQUEST_NULL`.
    pub(crate) request_null: usize,
    /// `MPI_MESSAGE_NO_PROC`.
    pub(crate) message_no_proc: usize,
    /// The library's `PMPI_Type_size_x`.
    pub(crate) type_size_x: TypeSizeX,
    /// The library's `PMPI_Test_cancelled`.
    pub(crate) test_cancelled: TestCancelled,
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
    /// Neither Open MPI's nor MPICH's marker symbol is loaded.
    #[error("unrecognised MPI library (neither Open MPI nor MPICH)")]
    Unknown,
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
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
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
    unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) as usize }
}

macro_rules! entry {
    ($name:literal, $ty:ty) => {
        // SAFETY: the library's entry point of that name has this C signature.
        unsafe { core::mem::transmute::<*mut c_void, $ty>(next($name)?) }
    };
}

impl Abi {
    /// Recognises the library and resolves what the layer calls.
    pub(crate) fn detect() -> Result<Abi, AbiError> {
        let world = global(c"ompi_mpi_comm_world");
        let (c, comm_world, request_null, message_no_proc) = if world != 0 {
            let need = |n: &'static CStr| match global(n) {
                0 => Err(AbiError::Missing {
                    symbol: n.to_str().unwrap_or("?"),
                }),
                p => Ok(p),
            };
            (
                OPEN_MPI,
                world,
                need(c"ompi_request_null")?,
                need(c"ompi_message_no_proc")?,
            )
        } else if global(c"MPIR_Err_return_comm") != 0 {
            (MPICH, MPICH_HANDLES.0, MPICH_HANDLES.1, MPICH_HANDLES.2)
        } else {
            return Err(AbiError::Unknown);
        };
        Ok(Abi {
            c,
            comm_world,
            request_null,
            message_no_proc,
            type_size_x: entry!(c"PMPI_Type_size_x", TypeSizeX),
            test_cancelled: entry!(c"PMPI_Test_cancelled", TestCancelled),
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

    /// Bytes of `count` elements of `datatype`, or `None` if the library
    /// cannot say (an invalid or undefined-size type).
    #[inline(always)]
    pub(crate) fn bytes(&self, count: i64, datatype: usize) -> Option<u64> {
        if self.c.handle_width == 4
            && let Some(size) = mpich_builtin_size(datatype)
            && count >= 0
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
    /// what `MPI_Get_count(status, MPI_BYTE)` returns in both libraries
    /// (`_ucount`; MPICH's `MPIR_STATUS_GET_COUNT`), read in place rather
    /// than through a library call on every receive. It needs no datatype
    /// handle at completion, and the caller may already have freed that
    /// datatype. `abi_matches_the_headers` pins the fields, and the e2e
    /// tests pin the values on both libraries, derived types included.
    ///
    /// # Safety
    /// `status` points to a status filled by the library.
    #[inline(always)]
    pub(crate) unsafe fn received(&self, status: *const u8) -> Option<u64> {
        // SAFETY: per the caller; the fields are naturally aligned.
        unsafe {
            let at = status.add(self.c.count_offset);
            Some(if self.c.handle_width == 8 {
                *(at as *const u64)
            } else {
                let lo = *(at as *const u32) as u64;
                let hi = (*(at.add(4) as *const u32) >> 1) as u64;
                (hi << 32) | lo
            })
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

/// MPICH's `MPI_COMM_WORLD`, `MPI_REQUEST_NULL` and `MPI_MESSAGE_NO_PROC`.
const MPICH_HANDLES: (usize, usize, usize) = (0x4400_0000, 0x2c00_0000, 0x6c00_0000);

/// The size MPICH encodes in a builtin datatype's handle (kind bits `01`,
/// size in bits 8..16: `MPI_INT` is `0x4c000405`), as MPICH's own
/// `MPIR_Datatype_get_basic_size` reads it; `None` for other handles and
/// for builtins of no fixed size.
#[inline(always)]
pub(crate) fn mpich_builtin_size(handle: usize) -> Option<u64> {
    let size = (handle >> 8) & 0xff;
    (handle >> 30 == 1 && size != 0).then_some(size as u64)
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
    use std::process::Command;

    use super::*;

    /// Compiles and runs a C program printing each constant with `mpicc`,
    /// and compares with ours. Skipped (with a message) where the compiler
    /// is absent; the e2e tests run on both libraries regardless.
    fn check(mpicc: &str, c: Constants, handle_type_width: usize) {
        let dir = std::env::temp_dir().join(format!("stats-abi-{}-{mpicc}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("abi.c");
        std::fs::write(
            &src,
            r#"#include <mpi.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
int main(void) {
#ifdef OPEN_MPI
    size_t count = offsetof(MPI_Status, _ucount);
#else
    size_t count = offsetof(MPI_Status, count_lo);
    if (offsetof(MPI_Status, count_hi_and_cancelled) != count + 4) count = 99;
#endif
    printf("%zu %zu %zu %zu %zu %ld %ld %d %d %d %d %zu\n",
        sizeof(MPI_Request), sizeof(MPI_Status), offsetof(MPI_Status, MPI_SOURCE), count,
        sizeof(MPI_Comm), (long)(intptr_t)MPI_STATUS_IGNORE, (long)(intptr_t)MPI_IN_PLACE,
        MPI_ANY_SOURCE, MPI_PROC_NULL, MPI_ROOT, MPI_UNDEFINED,
        (size_t)(MPI_STATUS_IGNORE == MPI_STATUSES_IGNORE));
    return 0;
}
"#,
        )
        .unwrap();
        let exe = dir.join("abi");
        let Ok(o) = Command::new(mpicc).arg("-o").arg(&exe).arg(&src).output() else {
            eprintln!("SKIPPED: {mpicc} not installed");
            return;
        };
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = Command::new(&exe).output().unwrap();
        let got = String::from_utf8(out.stdout).unwrap();
        let want = format!(
            "{} {} {} {} {} {} {} {} {} {} {} 1\n",
            c.handle_width,
            c.status_size,
            c.source_offset,
            c.count_offset,
            handle_type_width,
            c.status_ignore as isize,
            c.in_place as isize,
            c.any_source,
            c.proc_null,
            c.root,
            c.undefined
        );
        assert_eq!(got, want, "{mpicc}: header values differ from ours");
        assert!(c.status_size <= MAX_STATUS);
    }

    /// MPICH's fixed handles and the builtin sizes decoded from handles,
    /// against its header.
    #[test]
    fn mpich_handles_match_the_header() {
        let dir = std::env::temp_dir().join(format!("stats-mpich-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("h.c");
        std::fs::write(
            &src,
            r#"#include <mpi.h>
#include <stdio.h>
#include <stdint.h>
#define T(t, c) printf("%u %zu\n", (unsigned)(t), sizeof(c))
int main(void) {
    printf("%u %u %u\n", (unsigned)MPI_COMM_WORLD, (unsigned)MPI_REQUEST_NULL,
           (unsigned)MPI_MESSAGE_NO_PROC);
    T(MPI_CHAR, char); T(MPI_BYTE, char); T(MPI_SHORT, short); T(MPI_INT, int);
    T(MPI_LONG, long); T(MPI_FLOAT, float); T(MPI_DOUBLE, double);
    T(MPI_LONG_DOUBLE, long double); T(MPI_INT64_T, int64_t);
    T(MPI_C_DOUBLE_COMPLEX, double _Complex); T(MPI_AINT, MPI_Aint);
    return 0;
}
"#,
        )
        .unwrap();
        let exe = dir.join("h");
        let Ok(o) = Command::new("mpicc.mpich")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .output()
        else {
            eprintln!("SKIPPED: mpicc.mpich not installed");
            return;
        };
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8(Command::new(&exe).output().unwrap().stdout).unwrap();
        let mut lines = out.lines();
        let h: Vec<usize> = lines
            .next()
            .unwrap()
            .split(' ')
            .map(|x| x.parse().unwrap())
            .collect();
        assert_eq!((h[0], h[1], h[2]), MPICH_HANDLES);
        for l in lines {
            let (handle, size) = l.split_once(' ').unwrap();
            let handle: usize = handle.parse().unwrap();
            assert_eq!(
                mpich_builtin_size(handle),
                Some(size.parse().unwrap()),
                "handle {handle:#x}"
            );
        }
        // A derived type's handle (kind 10) is not decoded.
        assert_eq!(mpich_builtin_size(0x8c00_0000), None);
    }

    #[test]
    fn abi_matches_the_headers() {
        check("mpicc.openmpi", OPEN_MPI, 8);
        check("mpicc.mpich", MPICH, 4);
    }
}
