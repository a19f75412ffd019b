//! Asking libc's dynamic loader (`<dlfcn.h>`): which object holds an
//! address, a symbol through a handle, the last error.
//!
//! Unlike [`crate::loaded`], which must work before libc is usable, these
//! call libc and allocate, so they run only once the process is up: when
//! the stack is built, a QMPI tool registers, or an injection plans. A
//! leaf: the stack's builder, its binder, QMPI and the injection all ask
//! the loader, and none of them needs the others for it.

use core::ffi::{CStr, c_void};
use std::ffi::CString;

/// What the last failing `dlopen` (or `dlinfo`) said.
pub(crate) fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated thread-local string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated, per dlerror's contract.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// `dlsym(handle, name)`; null if not found, or if `name` holds a NUL.
pub(crate) fn dlsym(handle: *mut c_void, name: &str) -> *const c_void {
    let Ok(c) = CString::new(name) else {
        return core::ptr::null();
    };
    // SAFETY: valid handle (or RTLD_NEXT) and NUL-terminated name.
    unsafe { libc::dlsym(handle, c.as_ptr()) }.cast_const()
}

/// The link map of the object containing `addr`, and its file name.
pub(crate) fn owner(addr: *const c_void) -> (*mut c_void, String) {
    // Not exported by the libc crate: dladdr1's RTLD_DL_LINKMAP request.
    const RTLD_DL_LINKMAP: libc::c_int = 2;
    // SAFETY: Dl_info is plain data; dladdr1 fills it and the map pointer.
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    let mut map: *mut c_void = core::ptr::null_mut();
    // SAFETY: valid out-pointers for the RTLD_DL_LINKMAP request.
    let found = unsafe { libc::dladdr1(addr, &mut info, &mut map, RTLD_DL_LINKMAP) };
    if found == 0 || info.dli_fname.is_null() {
        return (map, String::new());
    }
    // SAFETY: dli_fname is the loader's NUL-terminated object name.
    (
        map,
        unsafe { CStr::from_ptr(info.dli_fname) }
            .to_string_lossy()
            .into_owned(),
    )
}
