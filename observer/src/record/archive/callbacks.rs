//! What OTF2 calls back: its process-wide error handler, which keeps the
//! messages for the calling thread instead of printing them (they become
//! one [`ArchiveError`]), and the flush callbacks; and the error type.

use std::cell::RefCell;
use std::ffi::{CStr, c_char, c_void};
use std::io;
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Once;

use otf2_sys as sys;
use thiserror::Error;

use super::*;

/// Why an archive could not be created or written.
#[derive(Debug, Error)]
pub enum ArchiveError {
    /// The archive name cannot name files in one directory.
    #[error(
        "bad OTF2 archive name {name:?}: it names DIR/NAME.otf2, so it must be non-empty, without '/' or NUL"
    )]
    BadName {
        /// The name given.
        name: String,
    },
    /// One of the archive's paths already exists; nothing is overwritten.
    #[error("{path} already exists: refusing to overwrite a trace; choose another directory")]
    Exists {
        /// The path.
        path: PathBuf,
    },
    /// The output directory could not be created.
    #[error("cannot create the trace directory {dir}: {source}")]
    CreateDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The output directory exists but cannot be written.
    #[error("cannot write in the trace directory {dir}: {source}")]
    NotWritable {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A rank at or above [`MAX_RANKS`].
    #[error("rank {rank} is out of range: a trace holds ranks below {MAX_RANKS}")]
    RankOutOfRange {
        /// The rank.
        rank: u32,
    },
    /// An Enter or Leave of a region that is not in the list.
    #[error("region {region} is not defined: the archive has {regions} regions")]
    UnknownRegion {
        /// The region id.
        region: u32,
        /// How many regions there are.
        regions: usize,
    },
    /// A communicator definition that cannot be written.
    #[error("bad communicator {id} ({name}): {why}")]
    BadComm {
        /// Its id.
        id: u32,
        /// Its name.
        name: String,
        /// What is wrong.
        why: String,
    },
    /// The OTF2 library failed.
    #[error("cannot write the OTF2 archive {anchor}: {message} (in {call})")]
    Otf2 {
        /// The anchor file.
        anchor: PathBuf,
        /// The OTF2 function that failed.
        call: &'static str,
        /// OTF2's own message, or its error code's description.
        message: String,
    },
}

// ___ OTF2's error callback ___________________________________________________

thread_local! {
    /// The errors OTF2 reported on this thread since they were last taken.
    static OTF2_ERRORS: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

/// Keeps the first errors (the cause comes first; the rest are its echoes up
/// OTF2's call stack).
const KEPT_ERRORS: usize = 8;

/// Replaces OTF2's default error handler, which prints to standard error.
unsafe extern "C" fn keep_otf2_error(
    _user: *mut c_void,
    _file: *const c_char,
    _line: u64,
    _function: *const c_char,
    code: sys::OTF2_ErrorCode,
    format: *const c_char,
    va: *mut c_void,
) -> sys::OTF2_ErrorCode {
    // Warnings and deprecation notices are not failures.
    if code == sys::OTF2_WARNING || code == sys::OTF2_DEPRECATED || code == sys::OTF2_SUCCESS {
        return code;
    }
    let mut text = [0 as c_char; 512];
    let message = if format.is_null() {
        String::new()
    } else {
        // SAFETY: OTF2 hands us its printf format and the matching va_list,
        // used once; vsnprintf writes at most text.len() bytes, NUL included.
        let n = unsafe { sys::vsnprintf(text.as_mut_ptr(), text.len(), format, va) };
        if n < 0 {
            String::new()
        } else {
            // SAFETY: vsnprintf NUL-terminated text.
            unsafe { CStr::from_ptr(text.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        }
    };
    let line = match (describe(code), message.is_empty()) {
        (d, true) => d,
        (d, false) => format!("{d}: {message}"),
    };
    let _ = OTF2_ERRORS.try_with(|errors| {
        if let Ok(mut errors) = errors.try_borrow_mut()
            && errors.len() < KEPT_ERRORS
        {
            errors.push(line);
        }
    });
    code
}

/// OTF2's description of an error code.
fn describe(code: sys::OTF2_ErrorCode) -> String {
    // SAFETY: OTF2 returns a static NUL-terminated string (or null).
    let d = unsafe { sys::OTF2_Error_GetDescription(code) };
    if d.is_null() {
        return format!("OTF2 error {code}");
    }
    // SAFETY: non-null, static, NUL-terminated.
    unsafe { CStr::from_ptr(d) }.to_string_lossy().into_owned()
}

pub(super) fn install_error_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: the callback has the signature OTF2 calls (va_list is a
        // pointer on the supported targets) and needs no user data.
        unsafe { sys::OTF2_Error_RegisterCallback(Some(keep_otf2_error), ptr::null_mut()) };
    });
}

/// Takes the errors OTF2 reported on this thread.
pub(super) fn take_errors() -> Vec<String> {
    OTF2_ERRORS
        .try_with(|e| {
            e.try_borrow_mut()
                .map(|mut e| std::mem::take(&mut *e))
                .unwrap_or_default()
        })
        .unwrap_or_default()
}

/// The error for a failed OTF2 call: OTF2's first message, else the code.
pub(super) fn otf2_error(
    anchor: &Path,
    call: &'static str,
    code: Option<sys::OTF2_ErrorCode>,
) -> ArchiveError {
    let message = take_errors()
        .into_iter()
        .next()
        .unwrap_or_else(|| match code {
            Some(code) => describe(code),
            None => "failed without saying why".to_string(),
        });
    ArchiveError::Otf2 {
        anchor: anchor.to_path_buf(),
        call,
        message,
    }
}

/// A call is good if it returned success and reported no error on the way
/// (some, like writing the anchor file at close, only report).
pub(super) fn check(
    anchor: &Path,
    call: &'static str,
    code: sys::OTF2_ErrorCode,
) -> Result<(), ArchiveError> {
    let reported = OTF2_ERRORS
        .try_with(|e| e.try_borrow().map(|e| !e.is_empty()).unwrap_or(false))
        .unwrap_or(false);
    if code == sys::OTF2_SUCCESS && !reported {
        Ok(())
    } else {
        Err(otf2_error(anchor, call, Some(code)))
    }
}

// ___ The archive ______________________________________________________________

/// Buffers are flushed to their files whenever they fill up.
unsafe extern "C" fn always_flush(
    _user: *mut c_void,
    _file_type: sys::OTF2_FileType,
    _location: sys::OTF2_LocationRef,
    _caller: *mut c_void,
    _final: bool,
) -> sys::OTF2_FlushType {
    sys::OTF2_FLUSH
}

/// No post-flush callback: OTF2 then writes no BufferFlush events, which
/// would carry its idea of time rather than the caller's.
pub(super) static FLUSH_CALLBACKS: sys::OTF2_FlushCallbacks = sys::OTF2_FlushCallbacks {
    otf2_pre_flush: Some(always_flush),
    otf2_post_flush: None,
};
