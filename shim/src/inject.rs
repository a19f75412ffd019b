//! The shim loaded into a running rank by `mpi-observer attach --inject`
//! (docs/inject.md).
//!
//! The daemon's loader stub `dlopen`s the shim on one thread of the rank,
//! stopped at the entry of an application-level MPI call, and calls
//! [`mpi_observer_shim_inject`] with the mailbox it shares with the daemon
//! ([`observer_common::inject`]). The entry:
//!
//! 1. builds the stack from the mailbox's tools list and creates the
//!    segment (flag `INJECTED`, not ready), MPI being initialised;
//! 2. publishes the shim's code range and waits for the daemon's go (the
//!    daemon first tells its probes to ignore calls made from that range);
//! 3. rewrites the GOT slots ([`plan`]): in every loaded object but the
//!    shim and the objects its bottom levels call (the MPI library and its
//!    Fortran bindings), each `JUMP_SLOT`/`GLOB_DAT` slot of an MPI name
//!    that is bound to one of those objects' definitions (or not bound yet,
//!    lazily) is pointed at the shim's definition of that name. A slot bound
//!    elsewhere (a tool preloaded by the user) is left alone. Slots in a
//!    read-only `PT_GNU_RELRO` range are written with the range made
//!    writable for the write;
//! 4. marks the segment ready and stores COMMITTED, then waits (up to the
//!    mailbox's timeout) for `go = HANDED`: the daemon's probes then record
//!    no new call of the process, so none is counted twice, even one the
//!    shim hands to a Fortran binding that calls into the library.
//!
//! Every failure before the rewrite undoes what was done (the segment is
//! removed) and stores ABORTED with one line in `error`; nothing here exits.
//!
//! **Ejection.** The daemon stores `go = EJECT` in the mailbox. The next
//! timed call to end (`poll` in [`crate::got`], from
//! [`crate::timing::leave`]) puts every slot that still holds the shim's
//! address back to what it held, and stores EJECTED. The shim stays mapped:
//! a call already inside it, or a function pointer the program took
//! meanwhile, still works.

use core::{
    ffi::{CStr, c_char, c_int, c_void},
    sync::atomic::{AtomicBool, AtomicUsize, Ordering::*},
    time::Duration,
};
use std::time::Instant;

use observer_common::inject::{MAGIC, Mailbox, VERSION, go, state};

use crate::{
    arch::{R_GLOB_DAT, R_JUMP_SLOT},
    dl,
    got::{self, Rewritten, dword, finish, word},
    layers,
    loaded::{self, LinkMap, Object},
    stats::{lifecycle, segment},
};

/// Set once an injection has committed: a second one is refused.
static COMMITTED: AtomicBool = AtomicBool::new(false);

/// The injection entry, called by the daemon's stub on a thread stopped at
/// the entry of an application-level MPI call. Returns 0 once committed.
///
/// # Safety
/// `mb` is null or a mailbox that stays mapped for the life of the process.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn mpi_observer_shim_inject(mb: *mut Mailbox) -> c_int {
    // SAFETY: null or a live mailbox, per the caller.
    let Some(m) = (unsafe { mb.as_ref() }) else {
        return -1;
    };
    if m.magic != MAGIC || m.version != VERSION {
        // Another layout: nothing in it can be trusted to write to.
        return -1;
    }
    // SAFETY: a live mailbox from here on.
    unsafe {
        match prepare(mb) {
            Ok(p) => commit(mb, p),
            Err(e) => finish(mb, state::ABORTED, Some(e)),
        }
    }
}

/// What [`prepare`] made, kept until the go.
struct Prepared {
    segment: Option<lifecycle::Prepared>,
    bottom: Vec<*mut c_void>,
    /// The injected tools: bound by the build, never routed.
    tools: Vec<*mut c_void>,
    /// The library's own objects' bindings (crate::bind), applied with the
    /// routing and put back with it.
    library_slots: Vec<Rewritten>,
}

/// Steps 1 and 2: the stack, the segment and the code range.
///
/// # Safety
/// `mb` is a live mailbox.
unsafe fn prepare(mb: *mut Mailbox) -> Result<Prepared, String> {
    if COMMITTED.load(Acquire) {
        return Err("the shim is already injected into this process".into());
    }
    if layers::env_stack_built() || segment::state().is_some() {
        return Err("the shim is already active in this process (preloaded)".into());
    }
    mpi_running()?;
    // SAFETY: the daemon's NUL-terminated list, alive during the call.
    let tools = unsafe {
        let p = (*mb).tools as *const c_char;
        if p.is_null() {
            return Err("the mailbox names no tools list".into());
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    };
    let built = layers::build_injected(&tools).map_err(|e| e.to_string())?;
    let seg = if built.stats {
        Some(lifecycle::prepare_injected().map_err(|e| format!("stats: {e}"))?)
    } else {
        None
    };
    let shim = own_map().ok_or("the shim cannot find its own link map")?;
    let Some((lo, hi)) = loaded::code_range(shim) else {
        if let Some(s) = seg {
            s.discard();
        }
        return Err("the shim cannot find its own code range".into());
    };
    // SAFETY: a live mailbox.
    unsafe {
        dword(&raw mut (*mb).shim_lo).store(lo as u64, Relaxed);
        dword(&raw mut (*mb).shim_hi).store(hi as u64, Relaxed);
    }
    Ok(Prepared {
        segment: seg,
        bottom: built.bottom,
        tools: built.tools,
        library_slots: built.library_slots,
    })
}

/// Steps 2 (the wait) to 4.
///
/// # Safety
/// `mb` is a live mailbox.
unsafe fn commit(mb: *mut Mailbox, p: Prepared) -> c_int {
    // SAFETY: a live mailbox.
    let (st, go_word, timeout) = unsafe {
        (
            word(&raw mut (*mb).state),
            word(&raw mut (*mb).go),
            Duration::from_millis(u64::from((*mb).timeout_ms)),
        )
    };
    st.store(state::PREPARED, Release);
    let t = Instant::now();
    let said = loop {
        match go_word.load(Acquire) {
            go::WAIT if t.elapsed() < timeout => {
                std::thread::sleep(Duration::from_micros(100));
            }
            go::WAIT => break None,
            g => break Some(g),
        }
    };
    if said != Some(go::GO) {
        if let Some(s) = p.segment {
            s.discard();
        }
        let why = match said {
            None => format!(
                "no go from the daemon within {} ms; nothing changed",
                timeout.as_millis()
            ),
            Some(_) => "the daemon aborted; nothing changed".into(),
        };
        // SAFETY: a live mailbox.
        return unsafe { finish(mb, state::ABORTED, Some(why)) };
    }
    if let Some(s) = p.segment {
        s.publish();
        crate::timing::enable();
    }
    let mut planned = p.library_slots;
    planned.extend(plan(&p.bottom, &p.tools));
    let n = got::apply(planned);
    layers::mark_injected();
    segment::mark_ready();
    COMMITTED.store(true, Release);
    got::arm(mb);
    // SAFETY: a live mailbox.
    unsafe { word(&raw mut (*mb).slots).store(n as u32, Relaxed) };
    st.store(state::COMMITTED, Release);
    // The probes still count calls the shim does not make itself (a
    // Fortran binding's into the library, say) until the daemon tells them
    // to record no new call: only then may this thread make another. A
    // daemon gone meanwhile took its probes with it; the wait ends anyway.
    let t = Instant::now();
    while go_word.load(Acquire) != go::HANDED && t.elapsed() < timeout {
        std::thread::sleep(Duration::from_micros(20));
    }
    // SAFETY: a live mailbox.
    unsafe { finish(mb, state::COMMITTED, None) }
}

/// Whether MPI is initialised and not finalised, asked of the library.
fn mpi_running() -> Result<(), String> {
    type Flag = unsafe extern "C" fn(*mut c_int) -> c_int;
    let get = |n: &CStr| -> Result<Flag, String> {
        let p = loaded::find(n, &[]).ok_or_else(|| {
            format!(
                "no loaded object defines {}: no MPI library in this process",
                n.to_string_lossy()
            )
        })?;
        // SAFETY: the library's procedure of this signature.
        Ok(unsafe { core::mem::transmute::<*const c_void, Flag>(p) })
    };
    let (initialized, finalized) = (get(c"PMPI_Initialized")?, get(c"PMPI_Finalized")?);
    let (mut i, mut f) = (0, 0);
    // SAFETY: out-pointers; both may be called at any time.
    unsafe {
        initialized(&mut i);
        finalized(&mut f);
    }
    if i == 0 {
        return Err("MPI is not initialised yet in this process; inject after MPI_Init".into());
    }
    if f != 0 {
        return Err("MPI is finalised in this process".into());
    }
    Ok(())
}

/// The shim's own link map.
fn own_map() -> Option<&'static LinkMap> {
    loaded::objects().find(|m| loaded::is_shim(m))
}

/// The link map holding `addr`, or null.
fn map_of(addr: usize) -> *mut c_void {
    dl::owner(addr as *const c_void).0
}

/// Step 3's choice: the slots to point at the shim, with what they hold.
fn plan(bottom: &[*mut c_void], tools: &[*mut c_void]) -> Vec<Rewritten> {
    let Some(shim_map) = own_map() else {
        return Vec::new();
    };
    let Some(shim) = Object::new(shim_map) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for map in loaded::objects() {
        let me = core::ptr::from_ref(map) as *mut c_void;
        if loaded::is_shim(map) || bottom.contains(&me) || tools.contains(&me) {
            continue;
        }
        let Some(obj) = Object::new(map) else {
            continue;
        };
        let relro = loaded::relro_pages(map);
        for (slot, ty, addend, sym) in obj.relocations() {
            if ty != R_JUMP_SLOT && ty != R_GLOB_DAT {
                continue;
            }
            let Some(add) = crate::arch::slot_addend(ty, addend) else {
                continue;
            };
            // SAFETY: `sym` comes from this object's own relocation.
            let name = unsafe { obj.name(sym) };
            if !crate::exports::managed(name) {
                continue;
            }
            let Some(new) = shim.function(name, loaded::gnu_hash(name)) else {
                continue;
            };
            let new = new.wrapping_add(add);
            // SAFETY: a slot of a loaded object's GOT, naturally aligned.
            let old = unsafe { AtomicUsize::from_ptr(slot) }.load(Relaxed);
            let holder = map_of(old);
            let routed = if bottom.contains(&holder) {
                true
            } else if holder == me && ty == R_JUMP_SLOT {
                // Not bound yet (lazy binding): it would bind to the
                // library's definition.
                loaded::find(name, &[]).is_some_and(|d| bottom.contains(&map_of(d as usize)))
            } else {
                false
            };
            if routed && old != new {
                let slot_at = slot as usize;
                out.push(Rewritten {
                    slot,
                    old,
                    new,
                    relro: relro.filter(|(a, b)| (*a..*b).contains(&slot_at)),
                });
            }
        }
    }
    out
}
