//! Building the stack: reading the list, loading the tools, resolving every
//! row at every level and publishing the dispatch table.
//!
//! This runs once, on the first MPI call of the process (never from a
//! constructor: launchers and shells that inherit `LD_PRELOAD` must not pay
//! for, or be broken by, a shim they never use). Everything is resolved
//! before anything is published, so a bad list never leaves a partial stack.

use core::{
    ffi::{CStr, c_void},
    sync::atomic::{AtomicBool, Ordering},
};
use std::{ffi::CString, sync::Once};

use observer_common::{FUNCTION_COUNT, FUNCTIONS};

use crate::{
    config::{ConfigError, KEYWORDS, LIST_VARS, Layer, ToolsList},
    generated::fortran::FORTRAN,
    rows::Raw,
    stats,
    table::{self, MAX_LEVELS, ROWS},
};

/// What can stop the shim from building a stack. Every variant is reported
/// as one line, after which the process exits non-zero.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShimError {
    /// The list itself is malformed.
    #[error("{source}")]
    Config {
        /// What is wrong with it.
        #[from]
        source: ConfigError,
    },
    /// A library entry that `dlopen` refused.
    #[error("tools entry `{entry}`: cannot load {load_as}: {reason}")]
    Load {
        /// The entry as written.
        entry: String,
        /// What was handed to `dlopen`.
        load_as: String,
        /// `dlerror()`.
        reason: String,
    },
    /// A bare word that is no keyword and no loadable `libWORD.so`.
    #[error(
        "tools entry `{entry}`: unknown keyword (known: {KEYWORDS}) and {load_as} cannot be loaded: {reason}"
    )]
    UnknownKeyword {
        /// The entry as written.
        entry: String,
        /// The short-name expansion that was tried.
        load_as: String,
        /// `dlerror()`.
        reason: String,
    },
    /// No loaded object defines `PMPI_Init` (an injected shim only: a
    /// preloaded one reports the missing procedure at its first call).
    #[error("no loaded object defines PMPI_Init: no MPI library in this process")]
    NoLibrary,
    /// More layers than the table has room for.
    #[error(
        "{count} levels requested (with fortran and the MPI library); at most {MAX_LEVELS} are supported"
    )]
    TooManyLevels {
        /// Levels the list would need.
        count: usize,
    },
}

/// One level of the stack.
enum Level {
    /// The MPI library's Fortran bindings, alone.
    Fortran,
    /// A dlopened tool.
    Tool {
        /// The entry as written, for `v`.
        entry: String,
        /// The file the loader picked, for `v`.
        path: String,
        /// `dlopen`'s handle.
        handle: *mut c_void,
        /// The object's link map, to tell its own symbols from its
        /// dependencies' (`dlsym` on a handle searches both).
        map: *mut c_void,
    },
    /// A layer written in Rust inside the shim.
    Builtin(&'static stats::Builtin),
    /// The MPI library: C procedures and Fortran bindings.
    Mpi,
}

static INIT: Once = Once::new();
/// Set when an injected shim commits (crate::inject): its stack was built
/// from the daemon's list, and the environment's is never built.
static INJECTED: AtomicBool = AtomicBool::new(false);

/// Builds and publishes the stack unless already done; on failure, reports
/// one line and exits.
pub(crate) fn ensure() {
    // Keeps the start-up relocation that sets the visible function set
    // (crate::exports) from being discarded by the linker.
    core::hint::black_box(&crate::exports::STARTUP);
    if INJECTED.load(Ordering::Acquire) {
        return;
    }
    INIT.call_once(|| {
        if let Err(e) = ToolsList::from_env()
            .map_err(ShimError::from)
            .and_then(|list| build(list, false))
        {
            fatal(&e.to_string());
        }
    });
}

/// Whether the stack was built from the environment (the shim is
/// preloaded and the process has made an MPI call through it).
pub(crate) fn env_stack_built() -> bool {
    INIT.is_completed()
}

/// What an injected build made.
pub(crate) struct Built {
    /// `stats` is in the list: the caller creates the segment and starts
    /// timing at its commit.
    pub(crate) stats: bool,
    /// The link maps of every object the bottom levels call into (the MPI
    /// library and its Fortran bindings' libraries), for an injected build
    /// only: the objects whose definitions routed calls went to before.
    pub(crate) bottom: Vec<*mut c_void>,
}

/// Builds and publishes the stack of an injected shim from `list` (the
/// daemon's, not the environment's). Nothing is exited on: every failure is
/// returned, and leaves no tool loaded. The table is published but unused
/// until the caller routes calls to the shim; a later build overwrites it.
pub(crate) fn build_injected(list: &str) -> Result<Built, ShimError> {
    build(ToolsList::parse(list)?, true)
}

/// Records that the injected stack is live: [`ensure`] builds nothing more.
pub(crate) fn mark_injected() {
    INJECTED.store(true, Ordering::Release);
}

/// Prints `mpi-observer-shim: MSG` as one write and exits with status 1,
/// without running exit handlers: the caller may be inside MPI, and a
/// handler that waits for peers would hang instead of failing.
pub(crate) fn fatal(msg: &str) -> ! {
    let line = format!("mpi-observer-shim: {msg}\n");
    // SAFETY: plain write(2) of an owned buffer, then _exit(2).
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
        libc::_exit(1)
    }
}

/// The symbol a row is reported under.
pub(crate) fn row_name(row: usize) -> &'static str {
    if row < FUNCTION_COUNT {
        FUNCTIONS[row].name
    } else {
        FORTRAN[row - FUNCTION_COUNT].mpi[0]
    }
}

fn dlerror() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated thread-local string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".to_string()
    } else {
        // SAFETY: non-null, NUL-terminated, per dlerror's contract.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn dlsym(handle: *mut c_void, name: &str) -> *const c_void {
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

/// Opens a library entry; `short` says it was a bare word, which may have
/// been meant as a keyword.
fn load(entry: &str, load_as: &str, short: bool) -> Result<Level, ShimError> {
    let c = CString::new(load_as).map_err(|_| ShimError::Load {
        entry: entry.to_string(),
        load_as: load_as.to_string(),
        reason: "contains a NUL byte".into(),
    })?;
    // RTLD_LOCAL: two tools that both define a global `count` keep their
    // own. RTLD_NOW: a tool with unresolved symbols fails here, not halfway
    // through a run.
    // SAFETY: NUL-terminated file name.
    let handle = crate::exports::with_all_visible(|| unsafe {
        libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL)
    });
    if handle.is_null() {
        let reason = dlerror();
        let (entry, load_as) = (entry.to_string(), load_as.to_string());
        return Err(if short {
            ShimError::UnknownKeyword {
                entry,
                load_as,
                reason,
            }
        } else {
            ShimError::Load {
                entry,
                load_as,
                reason,
            }
        });
    }
    let mut map: *mut c_void = core::ptr::null_mut();
    // SAFETY: valid handle; RTLD_DI_LINKMAP writes one pointer.
    if unsafe { libc::dlinfo(handle, libc::RTLD_DI_LINKMAP, (&raw mut map).cast()) } != 0 {
        return Err(ShimError::Load {
            entry: entry.to_string(),
            load_as: load_as.to_string(),
            reason: dlerror(),
        });
    }
    // SAFETY: glibc's `struct link_map` (<link.h>) starts with `l_addr`
    // then `l_name`, a NUL-terminated path.
    let path = unsafe {
        let name = *map.cast::<*const libc::c_char>().add(1);
        if name.is_null() {
            String::new()
        } else {
            CStr::from_ptr(name).to_string_lossy().into_owned()
        }
    };
    Ok(Level::Tool {
        entry: entry.to_string(),
        path,
        handle,
        map,
    })
}

/// Resolves rows at one level.
struct Resolver<'a> {
    /// Link maps of every tool, so the MPI library's symbols are never taken
    /// from a tool that is also in `LD_PRELOAD` (the `preload` keyword).
    tool_maps: &'a [*mut c_void],
}

impl Resolver<'_> {
    fn at(&self, level: &Level, row: usize) -> Raw {
        match level {
            Level::Tool { handle, map, .. } => self.names(row, false).find_map(|n| {
                let p = dlsym(*handle, n);
                (!p.is_null() && owner(p).0 == *map).then_some(Raw(p))
            }),
            Level::Builtin(b) => Some((b.resolve)(row)).filter(|r| !r.is_none()),
            Level::Fortran if row < FUNCTION_COUNT => None,
            Level::Fortran | Level::Mpi => self.in_mpi_library(row),
        }
        .unwrap_or(Raw::NONE)
    }

    /// The spellings a layer may define a row under. Tools are searched for
    /// the `MPI_`/`mpi_` names only; the MPI library also by the profiling
    /// names, after the plain ones (see [`Resolver::in_mpi_library`]).
    fn names(&self, row: usize, with_pmpi: bool) -> impl Iterator<Item = &'static str> {
        let (mpi, pmpi): (&'static [&'static str], &'static [&'static str]) =
            if row < FUNCTION_COUNT {
                (&[], &[])
            } else {
                let f = &FORTRAN[row - FUNCTION_COUNT];
                (f.mpi, if with_pmpi { f.pmpi } else { &[] })
            };
        let c = (row < FUNCTION_COUNT).then(|| FUNCTIONS[row].name);
        c.into_iter()
            .chain(mpi.iter().copied())
            .chain(pmpi.iter().copied())
    }

    /// The MPI library's definition: the next definition after the shim in
    /// the global search order that is not a tool's, else (a library loaded
    /// `RTLD_LOCAL`, as mpi4py loads it) the first in any loaded object. C procedures are taken
    /// by their `PMPI_` name, so an `MPI_X` of a preloaded tool is never
    /// mistaken for the library. Fortran symbols are taken by their `mpi_`
    /// name first: MPICH's `mpi_send_f08ts_` calls `MPI_Send` while its
    /// `pmpir_` twin may bypass the stack.
    fn in_mpi_library(&self, row: usize) -> Option<Raw> {
        let candidates: Vec<String> = if row < FUNCTION_COUNT {
            vec![format!("P{}", FUNCTIONS[row].name)]
        } else {
            self.names(row, true).map(str::to_string).collect()
        };
        candidates.iter().find_map(|n| {
            let p = dlsym(libc::RTLD_NEXT, n);
            if !p.is_null() && !self.tool_maps.contains(&owner(p).0) {
                return Some(Raw(p));
            }
            let c = CString::new(n.as_str()).ok()?;
            crate::loaded::find(&c, self.tool_maps).map(Raw)
        })
    }
}

/// Builds the stack from `list`; an `injected` build starts no timing
/// (its caller does, at its commit) and closes the tools it loaded if it
/// fails.
fn build(list: ToolsList, injected: bool) -> Result<Built, ShimError> {
    let mut levels = Vec::new();
    let close = |levels: &[Level]| {
        for l in levels {
            if let Level::Tool { handle, .. } = l {
                // SAFETY: a handle of ours that nothing else uses yet.
                unsafe { libc::dlclose(*handle) };
            }
        }
    };
    let mut stats = false;
    for layer in list.with_fortran() {
        levels.push(match layer {
            Layer::Fortran => Level::Fortran,
            Layer::Stats => {
                stats = true;
                crate::timing::set_callsites(crate::config::callsites_from_env());
                if !injected {
                    crate::timing::enable();
                }
                Level::Builtin(&stats::LAYER)
            }
            Layer::Library {
                entry,
                load_as,
                short,
            } => match load(&entry, &load_as, short) {
                Ok(l) => l,
                Err(e) => {
                    if injected {
                        close(&levels);
                    }
                    return Err(e);
                }
            },
        });
    }
    levels.push(Level::Mpi);
    let n = levels.len();
    if n > MAX_LEVELS {
        if injected {
            close(&levels);
        }
        return Err(ShimError::TooManyLevels { count: n });
    }
    let tool_maps: Vec<*mut c_void> = levels
        .iter()
        .filter_map(|l| match l {
            Level::Tool { map, .. } => Some(*map),
            _ => None,
        })
        .collect();
    let r = Resolver {
        tool_maps: &tool_maps,
    };
    let init = r.at(&Level::Mpi, observer_common::FunctionId::Init as usize);
    let library = if init.is_none() {
        core::ptr::null_mut()
    } else {
        owner(init.0).0
    };
    if injected && library.is_null() {
        close(&levels);
        return Err(ShimError::NoLibrary);
    }
    let mut defined = vec![0usize; n];
    let mut fns = vec![Raw::NONE; n];
    let mut bottom: Vec<*mut c_void> = Vec::new();
    for row in 0..ROWS {
        for (l, level) in levels.iter().enumerate() {
            fns[l] = r.at(level, row);
            defined[l] += usize::from(!fns[l].is_none());
            if injected && !fns[l].is_none() && matches!(level, Level::Mpi | Level::Fortran) {
                let m = owner(fns[l].0).0;
                if !m.is_null() && !bottom.contains(&m) {
                    bottom.push(m);
                }
            }
        }
        // The seed's search, done once per start level: a start past the
        // bottom means the bottom; a level lacking the row is skipped.
        for start in 0..=MAX_LEVELS {
            if let Some(l) = (start.min(n - 1)..n).find(|&l| !fns[l].is_none()) {
                table::publish(row, start, fns[l], l as u32);
            }
        }
    }
    if list.verbose {
        report(&levels, &defined);
    }
    Ok(Built { stats, bottom })
}

/// The `v` line: every level, top first, with how many entry points it
/// defines.
fn report(levels: &[Level], defined: &[usize]) {
    let mpi_lib = {
        let p = match dlsym(libc::RTLD_NEXT, "PMPI_Init") {
            p if p.is_null() => crate::loaded::find(c"PMPI_Init", &[]).unwrap_or(p),
            p => p,
        };
        if p.is_null() {
            "not found".to_string()
        } else {
            owner(p).1
        }
    };
    let parts: Vec<String> = levels
        .iter()
        .zip(defined)
        .enumerate()
        .map(|(i, (l, d))| {
            let what = match l {
                Level::Fortran => "fortran".to_string(),
                Level::Tool { entry, path, .. } => format!("{entry} ({path})"),
                Level::Builtin(b) => format!("{} (built-in)", b.name),
                Level::Mpi => format!("mpi ({mpi_lib})"),
            };
            format!("[{i}] {what}: {d} entry points")
        })
        .collect();
    let line = format!(
        "mpi-observer-shim: pid {} layers (top first, from {}): {}\n",
        std::process::id(),
        LIST_VARS.join(" or "),
        parts.join(", ")
    );
    // SAFETY: one write(2) of an owned buffer, so ranks' lines do not interleave.
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
    }
}
