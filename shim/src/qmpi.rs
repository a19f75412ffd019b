//! The QMPI tool interface on every MPI (issue 25).
//!
//! MPICH defines QMPI (`mpi.h`, `src/mpi_t/qmpi_register.c` in
//! pmodels/mpich) but builds it only with `--enable-qmpi`; the MPICH
//! releases of the matrix export stubs, and Open MPI and the standard ABI
//! have none. The shim provides the whole interface, with MPICH's
//! signatures, on all of them, and its QMPI instances are levels of the
//! same bound stack as the PMPI tools (crate::bind):
//!
//! - **Registration.** A tool's constructor calls
//!   [`QMPI_Register_tool_name`]; the names listed in
//!   `MPIR_CVAR_QMPI_TOOL_LIST` (or `MPICH_QMPI_TOOL_LIST`, `:`-separated,
//!   a name twice for two instances) become instances with ids 1..N in
//!   list order. When the stack is built (the first MPI call), each
//!   instance's init callback runs in id order and registers its storage
//!   and functions.
//! - **Placement.** A library in `MPI_TOOLS_ENTRY` that registered names
//!   becomes its instances at its place in the list; the others (a tool
//!   preloaded, linked into the program, or loaded as a dependency) sit
//!   below every listed level, just above the MPI library, as MPICH places
//!   its QMPI tools below PMPI ones.
//! - **Calls down.** A level above an instance calls its adapter
//!   (`qenter!`, generated per row and instance slot into
//!   `generated/next.rs`; [`crate::qmpi_table`] holds the adapters' macros
//!   and what they read), which passes the context and the instance's id
//!   before the arguments. [`QMPI_Get_function`] answers, for the calling
//!   instance, the next level that defines the procedure: another
//!   instance's own function and id, or the exit adapter (`qexit!`) with an
//!   id naming that level, which drops the two words and calls the level.
//!   The level travels in the id argument, never in thread-local state, so
//!   a pointer a tool caches works from anywhere.
//! - **Procedure ids.** A tool built with MPICH's `mpi.h` uses that
//!   release's `enum QMPI_Functions_enum`, which differs between releases;
//!   the running library's release picks the table (generated from the
//!   releases' headers). A tool built with our header
//!   (`mpi-observer qmpi-flags`) uses `OURS_BASE + FunctionId`, which no
//!   MPICH numbering reaches. An id of an unknown release, of the other
//!   numbering than the running library's, or out of range is refused with
//!   one line and an error code, never routed.

//! - **The build it was made for.** A tool built with `qmpi-flags` carries
//!   `mpi_observer_qmpi_built_for` (`MPICH 4.0.2`, `Open MPI`, `MPI ABI`);
//!   an object whose marker names another MPI than the running one is left
//!   out in one line, since its handles and ids mean something else there.
//!
//! What a QMPI level cannot give: its function is called by the shim's
//! adapter, so its caller is that adapter (as on MPICH it is the library's
//! `MPI_X`); [`QMPI_Get_calling_address`] names the application's call.

use core::{
    ffi::{CStr, c_char, c_int, c_void},
    sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering},
};
use std::sync::Mutex;

use observer_common::{FUNCTION_COUNT, FUNCTIONS};

use crate::{
    generated::qmpi::{OURS_BASE, RELEASES},
    loaded::{LinkMap, Object},
    qmpi_table::{self, LEVEL_ID_BASE, MAX_INSTANCES, STORAGE},
    rows::Raw,
};

/// What a failing `QMPI_*` call returns: MPICH's `MPI_ERR_OTHER`.
const QMPI_ERROR: c_int = 15;

/// The marker a tool built with `mpi-observer qmpi-flags` carries.
const MARKER: &CStr = c"mpi_observer_qmpi_built_for";

/// An init callback.
type InitFn = unsafe extern "C" fn(c_int);

/// One `QMPI_Register_tool_name`.
struct Registration {
    name: String,
    init: InitFn,
    /// The link map of the object that registered it.
    object: usize,
}

/// Every registration so far, in order.
static REGISTERED: Mutex<Vec<Registration>> = Mutex::new(Vec::new());
/// Set while the shim loads the libraries of `MPI_TOOLS_ENTRY`: their
/// registrations are accepted whatever the QMPI list says.
static LOADING: AtomicBool = AtomicBool::new(false);
/// Set once the stack is built: registering is then too late.
static BUILT: AtomicBool = AtomicBool::new(false);

/// The functions each instance being initialised registers, by id - 1.
static DRAFTS: Mutex<Vec<Vec<Raw>>> = Mutex::new(Vec::new());

/// Each instance slot's id.
static IDS: [AtomicU32; MAX_INSTANCES] = [const { AtomicU32::new(0) }; MAX_INSTANCES];
/// `QMPI_Get_function`'s answers: per instance slot, per row, the next
/// function and its id (leaked arrays of `FUNCTION_COUNT`).
static NEXT: [AtomicPtr<(Raw, c_int)>; MAX_INSTANCES] =
    [const { AtomicPtr::new(core::ptr::null_mut()) }; MAX_INSTANCES];
/// The numbering of the running library's `mpi.h`: an index into
/// [`RELEASES`], or `u32::MAX` for none (not MPICH, or a release the shim
/// does not know).
static RELEASE: AtomicU32 = AtomicU32::new(u32::MAX);
/// The running library, as the marker names it (`MPICH 4.0.2`, ...).
static RUNNING: Mutex<String> = Mutex::new(String::new());
/// Set once the refusal of an MPICH numbering the running library does not
/// have has been said.
static UNKNOWN_SAID: AtomicBool = AtomicBool::new(false);

/// One line on stderr, `mpi-observer-shim: QMPI: ...`.
fn say(msg: &str) {
    let line = format!("mpi-observer-shim: QMPI: {msg}\n");
    // SAFETY: one write(2) of an owned buffer.
    unsafe {
        libc::write(2, line.as_ptr().cast(), line.len());
    }
}

/// Reports a QMPI tool left out of the stack, in one line.
pub(crate) fn refuse(line: &str) {
    say(line);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The names of the QMPI list, if one is set.
pub(crate) fn list() -> Option<Vec<String>> {
    let v = std::env::var("MPIR_CVAR_QMPI_TOOL_LIST")
        .or_else(|_| std::env::var("MPICH_QMPI_TOOL_LIST"))
        .ok()?;
    Some(
        v.split(':')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect(),
    )
}

/// Marks the loading of the listed libraries (their constructors
/// register).
pub(crate) fn loading(on: bool) {
    LOADING.store(on, Ordering::Release);
}

/// One instance to place.
pub(crate) struct Instance {
    /// The name it registered.
    pub(crate) name: String,
    /// The link map of the object that registered it.
    pub(crate) object: usize,
    init: InitFn,
}

/// The instances of the object `object` (a library of `MPI_TOOLS_ENTRY`):
/// each name it registered, as many times as the QMPI list names it, or
/// once if the list does not.
pub(crate) fn instances_of(object: usize, list: Option<&[String]>) -> Vec<Instance> {
    let reg = lock(&REGISTERED);
    let mut out = Vec::new();
    for r in reg.iter().filter(|r| r.object == object) {
        if out.iter().any(|i: &Instance| i.name == r.name) {
            continue;
        }
        let listed = list.map_or(0, |l| l.iter().filter(|n| **n == r.name).count());
        for _ in 0..listed.max(1) {
            out.push(Instance {
                name: r.name.clone(),
                object,
                init: r.init,
            });
        }
    }
    out
}

/// The instances of the QMPI list registered by objects other than
/// `placed`, in list order. A listed name nobody registered is reported in
/// one line and left out.
pub(crate) fn listed_elsewhere(list: &[String], placed: &[usize]) -> Vec<Instance> {
    let reg = lock(&REGISTERED);
    let mut out = Vec::new();
    for name in list {
        if reg
            .iter()
            .any(|r| r.name == *name && placed.contains(&r.object))
        {
            continue;
        }
        match reg.iter().find(|r| r.name == *name) {
            Some(r) => out.push(Instance {
                name: name.clone(),
                object: r.object,
                init: r.init,
            }),
            None => say(&format!(
                "`{name}` in the QMPI tool list was registered by no loaded object; it is left out (load its library through MPI_TOOLS_ENTRY or LD_PRELOAD after the shim, or link it into the program)"
            )),
        }
    }
    out
}

/// Learns the running library: `version` is its
/// `MPI_Get_library_version`, `path` its file. Picks the procedure
/// numbering of an MPICH release.
pub(crate) fn set_running(version: &str, path: &str) {
    let mpich = version.find("MPICH Version:").and_then(|i| {
        version[i + "MPICH Version:".len()..]
            .split_whitespace()
            .next()
    });
    let release = mpich.and_then(|v| RELEASES.iter().position(|(r, _)| *r == v));
    RELEASE.store(release.map_or(u32::MAX, |r| r as u32), Ordering::Release);
    let name = if path.contains("libmpi_abi") {
        "MPI ABI".to_string()
    } else if let Some(v) = mpich {
        format!("MPICH {v}")
    } else if version.contains("Open MPI") {
        "Open MPI".to_string()
    } else {
        version.lines().next().unwrap_or("").trim().to_string()
    };
    *lock(&RUNNING) = name;
}

/// Whether the object `object` was built for the running MPI: `Err` with
/// the line to print if its `qmpi-flags` marker names another.
pub(crate) fn check_built_for(object: usize, path: &str) -> Result<(), String> {
    // SAFETY: a live link map of the loader's (the registering object's).
    let map = unsafe { &*(object as *const LinkMap) };
    let Some(p) = Object::new(map).and_then(|o| o.address(MARKER)) else {
        return Ok(());
    };
    // SAFETY: the marker is a NUL-terminated string constant; read at most
    // 64 bytes of it.
    let bytes = unsafe { core::slice::from_raw_parts(p.cast::<u8>(), 64) };
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let built = String::from_utf8_lossy(&bytes[..end]).into_owned();
    let running = lock(&RUNNING).clone();
    if built == running {
        Ok(())
    } else {
        Err(format!(
            "{path} was built for {built}, but this process runs {running}: its tools are left out (rebuild it with `mpicc $(mpi-observer qmpi-flags)` of the running MPI)"
        ))
    }
}

/// Runs the init callback of every instance, with ids 1.. in the order
/// given (top first), and returns the functions each registered by row.
pub(crate) fn initialise(instances: &[&Instance]) -> Vec<Vec<Raw>> {
    *lock(&DRAFTS) = instances
        .iter()
        .map(|_| vec![Raw::NONE; FUNCTION_COUNT])
        .collect();
    for (k, i) in instances.iter().enumerate() {
        // SAFETY: the tool's init callback, with its instance id.
        unsafe { (i.init)(k as c_int + 1) };
    }
    core::mem::take(&mut *lock(&DRAFTS))
}

/// One level of the built stack, as the QMPI calls see it.
#[derive(Clone, Copy)]
pub(crate) enum LevelKind {
    /// QMPI instance slot `k` (id `k + 1`).
    Instance(usize),
    /// Any other level.
    Other,
}

/// Publishes the built stack: each instance's functions, every level's
/// functions (`fns[row * n + level]`, C rows first), and the answers of
/// `QMPI_Get_function`. Registering is refused from now on.
pub(crate) fn publish(instance_fns: Vec<Vec<Raw>>, kinds: &[LevelKind], fns: &[Raw]) {
    let n = kinds.len();
    for (k, f) in instance_fns.into_iter().enumerate() {
        IDS[k].store(k as u32 + 1, Ordering::Release);
        qmpi_table::publish_instance(k, f);
    }
    if kinds.iter().any(|k| matches!(k, LevelKind::Instance(_))) {
        qmpi_table::publish_levels(fns, n);
    }
    for (l, kind) in kinds.iter().enumerate() {
        let LevelKind::Instance(k) = *kind else {
            continue;
        };
        let mut next = vec![(Raw::NONE, 0); FUNCTION_COUNT];
        for (row, slot) in next.iter_mut().enumerate() {
            let Some(below) = (l + 1..n).find(|&m| !fns[row * n + m].is_none()) else {
                continue;
            };
            *slot = match kinds[below] {
                LevelKind::Instance(k2) => (qmpi_table::function(k2, row), k2 as c_int + 1),
                LevelKind::Other => (
                    crate::generated::next::QEXIT[row],
                    if below == n - 1 {
                        0
                    } else {
                        LEVEL_ID_BASE + below as c_int
                    },
                ),
            };
        }
        NEXT[k].store(Vec::leak(next).as_mut_ptr(), Ordering::Release);
    }
    BUILT.store(true, Ordering::Release);
}

/// The row of procedure id `fid` as the running library numbers it, or a
/// one-line reason.
fn row_of(fid: c_int) -> Result<usize, String> {
    let f = fid as u32;
    if f >= OURS_BASE {
        return match (f - OURS_BASE) as usize {
            row if row < FUNCTION_COUNT => Ok(row),
            _ => Err(format!(
                "procedure id {fid:#x} is out of range (at most MPI_LAST_FUNC_T - 1 of mpi_observer_qmpi.h)"
            )),
        };
    }
    let r = RELEASE.load(Ordering::Acquire);
    let Some((version, table)) = RELEASES.get(r as usize) else {
        // Said once: a tool registers many procedures, all refused alike.
        if UNKNOWN_SAID.swap(true, Ordering::AcqRel) {
            return Err(String::new());
        }
        return Err(format!(
            "procedure id {fid} is in an MPICH mpi.h's numbering, but this process runs {} (known MPICH releases: {}): every id of that numbering is refused; build the tool with `mpicc $(mpi-observer qmpi-flags)` of the running MPI",
            lock(&RUNNING),
            RELEASES
                .iter()
                .map(|(v, _)| *v)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    match usize::try_from(fid).ok().and_then(|i| table.get(i)) {
        Some(&row) if usize::from(row) < FUNCTION_COUNT => Ok(usize::from(row)),
        _ => Err(format!(
            "procedure id {fid} is out of range for MPICH {version}'s QMPI numbering"
        )),
    }
}

/// `QMPI_Register_tool_name(name, init)`, from a tool's constructor. The
/// object that registers is the one holding `init`: not the caller's
/// return address, which a constructor's tail call (`-O2`) leaves naming
/// the dynamic loader.
///
/// # Safety
/// `name` is null or NUL-terminated.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn QMPI_Register_tool_name(
    name: *const c_char,
    init: Option<InitFn>,
) -> c_int {
    if name.is_null() {
        say("QMPI_Register_tool_name: the name is null");
        return QMPI_ERROR;
    }
    // SAFETY: a NUL-terminated name, per the interface.
    let name = unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned();
    let Some(init) = init else {
        say(&format!(
            "QMPI_Register_tool_name(`{name}`): the init callback is null"
        ));
        return QMPI_ERROR;
    };
    if BUILT.load(Ordering::Acquire) {
        say(&format!(
            "`{name}` registered after the tool stack was built (at the process's first MPI call): it takes no part; register from the tool's constructor"
        ));
        return QMPI_ERROR;
    }
    let object = crate::dl::owner(init as *const c_void).0 as usize;
    lock(&REGISTERED).push(Registration {
        name: name.clone(),
        init,
        object,
    });
    // As MPICH: with a list, a name it does not hold is an error (unless
    // the library is one of MPI_TOOLS_ENTRY's, being loaded); without one,
    // registration succeeds and the tool stays inert.
    match list() {
        Some(l) if !l.contains(&name) && !LOADING.load(Ordering::Acquire) => QMPI_ERROR,
        _ => 0,
    }
}

/// `QMPI_Register_tool_storage(id, storage)`, from an init callback.
#[unsafe(no_mangle)]
pub extern "C" fn QMPI_Register_tool_storage(id: c_int, storage: *mut c_void) -> c_int {
    let n = lock(&DRAFTS).len();
    match usize::try_from(id) {
        Ok(i) if (1..=n).contains(&i) && !BUILT.load(Ordering::Acquire) => {
            STORAGE[i].store(storage, Ordering::Release);
            0
        }
        _ => {
            say(&format!(
                "QMPI_Register_tool_storage: id {id} is no instance being initialised (register from the init callback)"
            ));
            QMPI_ERROR
        }
    }
}

/// `QMPI_Register_function(id, procedure, function)`, from an init
/// callback.
#[unsafe(no_mangle)]
pub extern "C" fn QMPI_Register_function(id: c_int, fid: c_int, f: *const c_void) -> c_int {
    let why = {
        let mut drafts = lock(&DRAFTS);
        match usize::try_from(id)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| drafts.get_mut(i))
        {
            None => format!(
                "id {id} is no instance being initialised (register from the init callback)"
            ),
            Some(d) => match row_of(fid) {
                Ok(_) if f.is_null() => "the function is null".to_string(),
                Ok(row) if crate::generated::next::QEXIT[row].is_none() => {
                    format!("{} cannot be layered through QMPI", FUNCTIONS[row].name)
                }
                Ok(row) => {
                    d[row] = Raw(f);
                    return 0;
                }
                Err(why) => why,
            },
        }
    };
    if !why.is_empty() {
        say(&format!(
            "QMPI_Register_function: instance {id}: {why}; not registered"
        ));
    }
    QMPI_ERROR
}

/// `QMPI_Get_function(calling_id, procedure, &function, &next_id)`: the
/// next level below the calling instance that defines the procedure.
///
/// # Safety
/// `out` and `next` are valid out-pointers.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn QMPI_Get_function(
    calling: c_int,
    fid: c_int,
    out: *mut *const c_void,
    next: *mut c_int,
) -> c_int {
    if out.is_null() || next.is_null() {
        say("QMPI_Get_function: a null out-pointer");
        return QMPI_ERROR;
    }
    if !BUILT.load(Ordering::Acquire) {
        say(
            "QMPI_Get_function: called before the tool stack was built (ask from the tool's functions, not its init callback)",
        );
        return QMPI_ERROR;
    }
    let row = match row_of(fid) {
        Ok(r) => r,
        Err(why) => {
            if !why.is_empty() {
                say(&format!("QMPI_Get_function: {why}"));
            }
            return QMPI_ERROR;
        }
    };
    let table = usize::try_from(calling)
        .ok()
        .and_then(|i| i.checked_sub(1))
        .filter(|&k| k < MAX_INSTANCES)
        .map_or(core::ptr::null_mut(), |k| NEXT[k].load(Ordering::Acquire));
    if table.is_null() {
        say(&format!(
            "QMPI_Get_function: calling id {calling} is no instance"
        ));
        return QMPI_ERROR;
    }
    // SAFETY: a leaked array of FUNCTION_COUNT; `row` is a C row.
    let (f, id) = unsafe { *table.add(row) };
    if f.is_none() {
        say(&format!(
            "QMPI_Get_function: no level below instance {calling} defines {}",
            FUNCTIONS[row].name
        ));
        return QMPI_ERROR;
    }
    // SAFETY: valid out-pointers, per the caller.
    unsafe {
        *out = f.0;
        *next = id;
    }
    0
}

/// `QMPI_Get_tool_storage(context, id, &storage)`: what instance `id`
/// registered (as MPICH, by id; the context is not read).
///
/// # Safety
/// `out` is a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn QMPI_Get_tool_storage(
    _context: usize,
    id: c_int,
    out: *mut *mut c_void,
) -> c_int {
    match usize::try_from(id) {
        Ok(i) if (1..=MAX_INSTANCES).contains(&i) && !out.is_null() => {
            // SAFETY: a valid out-pointer, per the caller.
            unsafe { *out = STORAGE[i].load(Ordering::Acquire) };
            0
        }
        _ => {
            say(&format!("QMPI_Get_tool_storage: id {id} is no instance"));
            QMPI_ERROR
        }
    }
}

/// `QMPI_Get_calling_address(context, &address)`: the application's call
/// site, as MPICH gives it: a `malloc`'d string `0x...`, which the caller
/// frees.
///
/// # Safety
/// `address` is a valid out-pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn QMPI_Get_calling_address(
    _context: usize,
    address: *mut *mut c_char,
) -> c_int {
    if address.is_null() {
        return QMPI_ERROR;
    }
    // SAFETY: this thread's block.
    let site = unsafe { crate::depth::site(crate::depth::slot()) };
    let text = format!("{site:#x}\0");
    // SAFETY: a fresh malloc'd block of the string's length, which the
    // caller owns; `address` is valid per the caller.
    unsafe {
        let p = libc::malloc(text.len()).cast::<c_char>();
        if !p.is_null() {
            core::ptr::copy_nonoverlapping(text.as_ptr().cast(), p, text.len());
        }
        *address = p;
        if p.is_null() { QMPI_ERROR } else { 0 }
    }
}
