//! Building the stack: reading the list, loading the tools, resolving every
//! row at every level and publishing the dispatch table.
//!
//! This runs once, on the first MPI call of the process (never from a
//! constructor: launchers and shells that inherit `LD_PRELOAD` must not pay
//! for, or be broken by, a shim they never use). Everything is resolved
//! before anything is published, so a bad list never leaves a partial stack.

use core::{
    ffi::{CStr, c_char, c_int, c_void},
    sync::atomic::{AtomicBool, Ordering},
};
use std::{ffi::CString, sync::Once};

use observer_common::{FUNCTION_COUNT, FUNCTIONS};

use crate::{
    bind,
    config::{self, ConfigError, KEYWORDS, LIST_VARS, Layer, ToolsList},
    dl::{dlerror, dlsym, owner},
    fatal,
    generated::{
        fortran::FORTRAN,
        next::{GATES, QENTER, TIMED},
    },
    loaded::LinkMap,
    qmpi::{Instance, LevelKind},
    qmpi_table::MAX_INSTANCES,
    rows::Raw,
    stats,
    table::{self, MAX_LEVELS, ROWS},
};

/// What can stop the shim from building a stack. Every variant is reported
/// as one line, after which the process exits non-zero, unless the entries
/// it names may be left out ([`config::ON_ERROR_VAR`]).
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
    /// One library named at two places in the list.
    #[error(
        "tools entry `{entry}`: {path} is already a level of this stack; a loaded library can hold one place only (list it once, or copy it under another file name)"
    )]
    TwicePlaced {
        /// The second entry naming it.
        entry: String,
        /// The file the loader picked.
        path: String,
    },
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
    /// A QMPI tool's instance (crate::qmpi), id `slot + 1`.
    Qmpi {
        /// Its instance slot.
        slot: usize,
        /// The name it registered.
        name: String,
        /// The file that registered it, for `v`.
        path: String,
        /// That object's link map.
        object: usize,
    },
    /// The MPI library: C procedures and Fortran bindings.
    Mpi,
}

static INIT: Once = Once::new();
/// Set when an injected shim commits (crate::inject): its stack was built
/// from the daemon's list, and the environment's is never built.
static INJECTED: AtomicBool = AtomicBool::new(false);

/// Builds and publishes the stack unless already done; on failure, reports
/// one line and exits, or, when [`config::ON_ERROR_VAR`] says `skip` (the
/// SPANK plugin's tasks), leaves out what cannot be used, one line each.
pub(crate) fn ensure() {
    // Keeps the start-up relocation that sets the visible function set
    // (crate::exports) from being discarded by the linker.
    core::hint::black_box(&crate::exports::STARTUP);
    if INJECTED.load(Ordering::Acquire) {
        return;
    }
    INIT.call_once(|| {
        let text = ToolsList::env_text();
        let built = if config::skip_from_env() {
            build_skipping(&text)
        } else {
            ToolsList::parse(&text)
                .map_err(ShimError::from)
                .and_then(|list| build(list, Build::Preloaded { skip: false }))
        };
        if let Err(e) = built {
            fatal(&e.to_string());
        }
    });
}

/// [`ensure`]'s build when unusable entries are left out: the list without
/// them, else (a failure no one entry causes, say too many levels) no tool
/// at all. A job must not end because a monitoring option named something
/// this node cannot load.
fn build_skipping(text: &str) -> Result<Built, ShimError> {
    let (list, errors) = ToolsList::parse_skipping(text);
    for e in errors {
        left_out(&e.to_string());
    }
    build(list, Build::Preloaded { skip: true }).or_else(|e| {
        say(&format!(
            "{e}; running with no tool ({}={})",
            config::ON_ERROR_VAR,
            config::ON_ERROR_SKIP
        ));
        build(ToolsList::default(), Build::Preloaded { skip: true })
    })
}

/// One line saying that an entry was left out, and why.
fn left_out(why: &str) {
    say(&format!(
        "{why}; left out ({}={})",
        config::ON_ERROR_VAR,
        config::ON_ERROR_SKIP
    ));
}

/// `mpi-observer-shim: MSG` on stderr as one write.
fn say(msg: &str) {
    let line = format!("mpi-observer-shim: {msg}\n");
    // SAFETY: one write(2) of an owned buffer.
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
    }
}

/// Which build: the environment's list in a preloaded shim, or the daemon's
/// in an injected one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Build {
    /// From the environment; `skip`: leave out entries that cannot be
    /// loaded or placed instead of failing.
    Preloaded {
        /// [`config::ON_ERROR_VAR`] says `skip`.
        skip: bool,
    },
    /// From the daemon: every failure returned, every tool closed again.
    Injected,
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
    /// library and its Fortran bindings' libraries): the objects whose
    /// definitions routed calls went to before.
    pub(crate) bottom: Vec<*mut c_void>,
    /// The tools' link maps: bound already, never routed.
    pub(crate) tools: Vec<*mut c_void>,
    /// An injected build's bindings of the library's own objects, which
    /// its commit applies (and its ejection puts back); empty otherwise.
    pub(crate) library_slots: Vec<crate::got::Rewritten>,
}

/// Builds and publishes the stack of an injected shim from `list` (the
/// daemon's, not the environment's). Nothing is exited on: every failure is
/// returned, and leaves no tool loaded. The table is published but unused
/// until the caller routes calls to the shim; a later build overwrites it.
pub(crate) fn build_injected(list: &str) -> Result<Built, ShimError> {
    build(ToolsList::parse(list)?, Build::Injected)
}

/// Records that the injected stack is live: [`ensure`] builds nothing more.
pub(crate) fn mark_injected() {
    INJECTED.store(true, Ordering::Release);
}

/// The symbol a row is reported under.
pub(crate) fn row_name(row: usize) -> &'static str {
    if row < FUNCTION_COUNT {
        FUNCTIONS[row].name
    } else {
        FORTRAN[row - FUNCTION_COUNT].mpi[0]
    }
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
            // Their functions come from their init callbacks (`build`).
            Level::Builtin(_) | Level::Qmpi { .. } => None,
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

/// Builds the stack from `list`; an injected build starts no timing
/// (its caller does, at its commit) and closes the tools it loaded if it
/// fails; a skipping one leaves out, with one line each, the libraries that
/// cannot be loaded or are already a level.
fn build(list: ToolsList, how: Build) -> Result<Built, ShimError> {
    let injected = how == Build::Injected;
    let skip = how == Build::Preloaded { skip: true };
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
    // The listed libraries' constructors may register QMPI tools: accepted
    // whatever the QMPI list says (crate::qmpi).
    crate::qmpi::loading(true);
    for layer in list.with_fortran() {
        levels.push(match layer {
            Layer::Fortran => Level::Fortran,
            Layer::Stats => {
                stats = true;
                stats::segment::set_callsites(crate::config::callsites_from_env());
                if !injected {
                    crate::timing::enable();
                }
                stats::segment::set_waits(
                    crate::config::waits_from_env(),
                    crate::config::waits_p2p_from_env(),
                    crate::timing::counter_trusted(),
                );
                Level::Builtin(&stats::LAYER)
            }
            Layer::Library {
                entry,
                load_as,
                short,
            } => match load(&entry, &load_as, short) {
                Ok(l) => l,
                Err(e) if skip => {
                    left_out(&e.to_string());
                    continue;
                }
                Err(e) => {
                    crate::qmpi::loading(false);
                    if injected {
                        close(&levels);
                    }
                    return Err(e);
                }
            },
        });
    }
    crate::qmpi::loading(false);
    if skip {
        // A library that is already a level is left out where it comes
        // again, rather than failing the stack below.
        let mut seen: Vec<*mut c_void> = Vec::new();
        levels.retain(|l| {
            let Level::Tool {
                entry,
                path,
                handle,
                map,
            } = l
            else {
                return true;
            };
            if !seen.contains(map) {
                seen.push(*map);
                return true;
            }
            left_out(
                &ShimError::TwicePlaced {
                    entry: entry.clone(),
                    path: path.clone(),
                }
                .to_string(),
            );
            // SAFETY: this entry's own reference to an object the earlier
            // level keeps open; nothing uses this handle.
            unsafe { libc::dlclose(*handle) };
            false
        });
    }
    levels.push(Level::Mpi);
    let fail = |levels: &[Level], e: ShimError| {
        if injected {
            close(levels);
        }
        Err(e)
    };
    let tool_maps: Vec<*mut c_void> = levels
        .iter()
        .filter_map(|l| match l {
            Level::Tool { map, .. } => Some(*map),
            _ => None,
        })
        .collect();
    // One loaded object has one set of slots: it can be bound to one
    // place in the stack only.
    for (i, m) in tool_maps.iter().enumerate() {
        if tool_maps[..i].contains(m)
            && let Some(Level::Tool { entry, path, .. }) = levels
                .iter()
                .filter(|l| matches!(l, Level::Tool { map, .. } if map == m))
                .nth(1)
        {
            let (entry, path) = (entry.clone(), path.clone());
            return fail(&levels, ShimError::TwicePlaced { entry, path });
        }
    }
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
        return fail(&levels, ShimError::NoLibrary);
    }
    let (levels, instance_fns) = with_qmpi(levels, &r, library);
    let n = levels.len();
    if n > MAX_LEVELS {
        return fail(&levels, ShimError::TooManyLevels { count: n });
    }
    let bottom_at = n - 1;
    let fort_at = levels
        .iter()
        .position(|l| matches!(l, Level::Fortran))
        .unwrap_or(0);
    let stats_at = levels.iter().position(|l| matches!(l, Level::Builtin(_)));
    // The library is entered through its gate when a level above it could
    // otherwise see the calls the library makes by name (crate::dispatch).
    let gated = levels.iter().any(|l| {
        matches!(
            l,
            Level::Tool { .. } | Level::Builtin(_) | Level::Qmpi { .. }
        )
    });
    let own = match stats_at.map(|s| &levels[s]) {
        Some(Level::Builtin(b)) => (b.wrappers)(),
        _ => Vec::new(),
    };
    // fns[row * n + level]: what each level runs for each row.
    let mut fns = vec![Raw::NONE; ROWS * n];
    let mut raw = vec![Raw::NONE; ROWS];
    let mut defined = vec![0usize; n];
    for row in 0..ROWS {
        let at = &mut fns[row * n..(row + 1) * n];
        for (l, level) in levels.iter().enumerate() {
            at[l] = match level {
                Level::Builtin(_) => Raw::NONE,
                Level::Qmpi { slot, .. } if row < FUNCTION_COUNT => {
                    if instance_fns[*slot][row].is_none() {
                        Raw::NONE
                    } else {
                        QENTER[row][*slot]
                    }
                }
                level => r.at(level, row),
            };
        }
        raw[row] = at[bottom_at];
        if gated && !raw[row].is_none() && !GATES[row].is_none() {
            at[bottom_at] = GATES[row];
        }
        // `stats` times every C row some level below it defines, and the
        // Fortran rows only if the Fortran layer is below it (otherwise it
        // sees the C calls the bindings make).
        if let Some(s) = stats_at
            && (row < FUNCTION_COUNT || fort_at > s)
            && !TIMED[row].is_none()
            && let Some(next) = at[s + 1..].iter().copied().find(|f| !f.is_none())
        {
            at[s] = TIMED[row];
            stats::bind(row, own.get(row).copied().unwrap_or(Raw::NONE), next);
        }
        for (l, f) in at.iter().enumerate() {
            defined[l] += usize::from(!f.is_none());
        }
    }
    // The seed's search: the first level at or below `start` that defines
    // the row; a start past the bottom means the bottom.
    let find = |row: usize, start: usize| -> Raw {
        let at = &fns[row * n..(row + 1) * n];
        (start.min(n - 1)..n)
            .map(|l| at[l])
            .find(|f| !f.is_none())
            .unwrap_or(Raw::NONE)
    };
    // MPI_Pcontrol is called at every level by the shim itself
    // (crate::handwritten); a level's own calls of it return at once.
    let pcontrol = observer_common::FunctionId::Pcontrol as usize;
    for l in 0..n {
        table::publish_pcontrol(l, fns[pcontrol * n + l]);
    }
    unsafe extern "C" {
        /// The shim's own, which calls every level's (crate::handwritten).
        fn MPI_Pcontrol(level: core::ffi::c_int, ...) -> core::ffi::c_int;
    }
    let from_tool = |row: usize, start: usize| -> Raw {
        if row == pcontrol {
            Raw(table::pcontrol_nested as *const c_void)
        } else {
            find(row, start)
        }
    };
    // The Fortran bindings' `MPI_Pcontrol` is the application's.
    let from_bindings = |row: usize, start: usize| -> Raw {
        if row == pcontrol {
            Raw(MPI_Pcontrol as *const c_void)
        } else {
            find(row, start)
        }
    };
    // Bind every level's slots (crate::bind): tools now (nothing calls
    // them yet), the library's objects now, or at the injection's commit.
    let names = bind::Names::new();
    let mut now = Vec::new();
    for (k, level) in levels.iter().enumerate() {
        if let Level::Tool { map, .. } = level {
            // SAFETY: a live link map from dlinfo.
            let m = unsafe { &*map.cast::<LinkMap>() };
            now.extend(bind::plan(m, &names, |row, p| from_tool(row, k + p)));
        }
    }
    // A QMPI tool's library (not the program, which is the application's
    // own code): its own MPI calls enter below its last instance, so no
    // level above sees them and none of its functions re-enters itself.
    let mut qmpi_maps: Vec<*mut c_void> = Vec::new();
    for (k, level) in levels.iter().enumerate() {
        if let Level::Qmpi { object, .. } = level
            && !levels[k + 1..]
                .iter()
                .any(|l| matches!(l, Level::Qmpi { object: o, .. } if o == object))
        {
            let map = *object as *mut c_void;
            // SAFETY: a live link map, from dladdr1.
            let m = unsafe { &*map.cast::<LinkMap>() };
            if is_program(m) || crate::loaded::is_shim(m) || qmpi_maps.contains(&map) {
                continue;
            }
            qmpi_maps.push(map);
            now.extend(bind::plan(m, &names, |row, _| from_tool(row, k + 1)));
        }
    }
    let mut fort_maps: Vec<*mut c_void> = Vec::new();
    let mut bottom_maps: Vec<*mut c_void> = Vec::new();
    for row in 0..ROWS {
        let f = fns[row * n + fort_at];
        if row >= FUNCTION_COUNT && !f.is_none() {
            let m = bind::owner_of(f);
            if !m.is_null() && !fort_maps.contains(&m) {
                fort_maps.push(m);
            }
        }
    }
    for f in &raw {
        if !f.is_none() {
            let m = bind::owner_of(*f);
            if !m.is_null() && !fort_maps.contains(&m) && !bottom_maps.contains(&m) {
                bottom_maps.push(m);
            }
        }
    }
    let mut library_slots = Vec::new();
    for &m in &fort_maps {
        // SAFETY: a live link map from dladdr1.
        let m = unsafe { &*m.cast::<LinkMap>() };
        library_slots.extend(bind::plan(m, &names, |row, p| {
            from_bindings(row, fort_at + p)
        }));
    }
    for &m in &bottom_maps {
        // SAFETY: as above.
        let m = unsafe { &*m.cast::<LinkMap>() };
        library_slots.extend(bind::plan(m, &names, |row, _| raw[row]));
    }
    for (row, f) in raw.iter().enumerate() {
        table::publish_raw(row, *f);
    }
    crate::got::rewrite(now);
    if !injected {
        crate::got::rewrite(core::mem::take(&mut library_slots));
    }
    // Last, the entries: the application's calls enter a bound stack.
    let kinds: Vec<LevelKind> = levels
        .iter()
        .map(|l| match l {
            Level::Qmpi { slot, .. } => LevelKind::Instance(*slot),
            _ => LevelKind::Other,
        })
        .collect();
    crate::qmpi::publish(instance_fns, &kinds, &fns);
    for row in 0..ROWS {
        table::publish_entry(row, 0, find(row, 0));
        table::publish_entry(row, 1, find(row, 1));
    }
    if list.verbose {
        report(&levels, &defined);
    }
    let mut bottom = fort_maps;
    bottom.extend(bottom_maps);
    let mut tools = tool_maps;
    tools.extend(qmpi_maps.into_iter().filter(|m| !bottom.contains(m)));
    Ok(Built {
        stats,
        bottom,
        tools,
        library_slots,
    })
}

/// Whether `map` is the main program's.
fn is_program(map: &LinkMap) -> bool {
    // SAFETY: the loader's NUL-terminated name, empty for the program.
    map.l_name.is_null() || unsafe { *map.l_name } == 0
}

/// The file name of the object `map`, or "the program".
fn object_name(map: usize) -> String {
    // SAFETY: a live link map of the loader's.
    let m = unsafe { &*(map as *const LinkMap) };
    if is_program(m) {
        "the program".to_string()
    } else {
        // SAFETY: non-null and NUL-terminated, as above.
        unsafe { CStr::from_ptr(m.l_name) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Places the QMPI tools (crate::qmpi) in `levels`: a listed library that
/// registered names becomes its instances at its place; the instances of
/// the QMPI list registered elsewhere go just above the MPI library, in
/// list order. Then checks each tool was built for the running MPI, gives
/// ids top first, and runs the init callbacks. Returns the levels and
/// each instance's functions by row. With no QMPI tool, `levels` is
/// returned as it was and nothing else is done.
fn with_qmpi(
    levels: Vec<Level>,
    r: &Resolver<'_>,
    library: *mut c_void,
) -> (Vec<Level>, Vec<Vec<Raw>>) {
    let list = crate::qmpi::list();
    let mut placed = Vec::new();
    let mut out: Vec<(Level, Option<Instance>)> = Vec::with_capacity(levels.len());
    for level in levels {
        if let Level::Tool { map, path, .. } = &level {
            let found = crate::qmpi::instances_of(*map as usize, list.as_deref());
            if !found.is_empty() {
                placed.push(*map as usize);
                let path = path.clone();
                out.extend(found.into_iter().map(|i| {
                    let q = Level::Qmpi {
                        slot: 0,
                        name: i.name.clone(),
                        path: path.clone(),
                        object: i.object,
                    };
                    (q, Some(i))
                }));
                continue;
            }
        }
        out.push((level, None));
    }
    if let Some(l) = &list {
        let bottom = out.len() - 1;
        let others = crate::qmpi::listed_elsewhere(l, &placed);
        let others = others.into_iter().map(|i| {
            let q = Level::Qmpi {
                slot: 0,
                name: i.name.clone(),
                path: object_name(i.object),
                object: i.object,
            };
            (q, Some(i))
        });
        out.splice(bottom..bottom, others);
    }
    if out.iter().all(|(_, i)| i.is_none()) {
        return (out.into_iter().map(|(l, _)| l).collect(), Vec::new());
    }
    // The running library, for the procedure numbering and the check of
    // each tool's build.
    let mut version = vec![0u8; 8192];
    let mut len: c_int = 0;
    let get = r.at(
        &Level::Mpi,
        observer_common::FunctionId::GetLibraryVersion as usize,
    );
    if !get.is_none() {
        // SAFETY: the library's MPI_Get_library_version(char *, int *),
        // which may be called before MPI_Init, writes at most
        // MPI_MAX_LIBRARY_VERSION_STRING (8192 in MPICH, less elsewhere)
        // bytes.
        let f: unsafe extern "C" fn(*mut c_char, *mut c_int) -> c_int =
            unsafe { core::mem::transmute(get.0) };
        // SAFETY: as above, into buffers of ours.
        unsafe { f(version.as_mut_ptr().cast(), &mut len) };
    }
    let end = version.iter().position(|b| *b == 0).unwrap_or(0);
    let lib_path = if library.is_null() {
        String::new()
    } else {
        object_name(library as usize)
    };
    crate::qmpi::set_running(&String::from_utf8_lossy(&version[..end]), &lib_path);
    let mut refused: Vec<usize> = Vec::new();
    let mut accepted: Vec<usize> = Vec::new();
    let mut levels = Vec::with_capacity(out.len());
    let mut instances = Vec::new();
    for (mut level, inst) in out {
        let Some(i) = inst else {
            levels.push(level);
            continue;
        };
        if !accepted.contains(&i.object) && !refused.contains(&i.object) {
            match crate::qmpi::check_built_for(i.object, &object_name(i.object)) {
                Ok(()) => accepted.push(i.object),
                Err(line) => {
                    crate::qmpi::refuse(&line);
                    refused.push(i.object);
                }
            }
        }
        if refused.contains(&i.object) {
            continue;
        }
        if instances.len() == MAX_INSTANCES {
            crate::qmpi::refuse(&format!(
                "at most {MAX_INSTANCES} QMPI instances per process: `{}` and those below it are left out",
                i.name
            ));
            refused.push(i.object);
            continue;
        }
        if let Level::Qmpi { slot, .. } = &mut level {
            *slot = instances.len();
        }
        instances.push(i);
        levels.push(level);
    }
    let fns = crate::qmpi::initialise(&instances.iter().collect::<Vec<_>>());
    (levels, fns)
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
                Level::Qmpi {
                    slot, name, path, ..
                } => format!("qmpi {name} id {} ({path})", slot + 1),
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
