//! The shim presents exactly the process's MPI function set.
//!
//! The shim defines every `MPI_*`/`PMPI_*` procedure of the standard and its
//! Fortran spellings, but a process must see only those that its MPI library
//! (or a tool) defines: libraries that support several MPI versions test for
//! optional procedures with weak references (`#pragma weak`, `if (fn)`) or
//! `dlsym`, and mpi4py dies at import if it finds `MPI_Abi_get_version` in a
//! library that lacks it.
//!
//! How: an export the process lacks is *hidden* in the shim's own
//! `.gnu.version` table. The dynamic linker skips a definition whose version
//! entry has the hidden bit (0x8000) and a non-base index, so a weak
//! reference to it resolves to null and `dlsym` fails with a proper error,
//! exactly as without the shim. The table is brought up to date ([`refresh`]):
//! - while the shim itself is relocated, before the program is: a private
//!   IFUNC whose resolver the dynamic linker runs then ([`startup_ifunc`]),
//!   after every object of the program is mapped;
//! - at the entry of every `dlopen` and `dlsym` (the shim interposes both
//!   and tail-jumps to libc's, so the caller libc sees, which decides search
//!   paths and `RTLD_NEXT`, is the real one).
//!
//! Why not the alternatives: exporting each procedure as an IFUNC answers a
//! weak reference right, but a resolver that returns null makes `dlsym`
//! return null *without an error*, which crashes CPython's ctypes (mpi4py's
//! probe), and a library loaded after the preloaded shim and bound eagerly
//! (`-z now`, `LD_BIND_NOW`) runs the resolver before the shim is relocated:
//! glibc prints "Relink ... for IFUNC symbol" and the resolver crashes. An
//! export object generated per library cannot serve a plain `LD_PRELOAD` of
//! one path, nor a library that, as in Python, is loaded long after start.
//!
//! A library loaded at start-up after the shim is relocated before it: its
//! eager weak references to a name that turns out hidden are cleared at
//! once ([`unbind_early_weak_references`]). Objects that a `dlopen` loads
//! as dependencies become visible at the next `dlopen` or `dlsym`, so the
//! eager relocations made inside that `dlopen` bound past the shim; that
//! next call points them at the shim ([`rebind_past_shim`]).

use core::{
    ffi::{CStr, c_void},
    sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering::*},
};

use crate::loaded::{self, LinkMap, Object};

/// The version entry of a visible export (`VER_NDX_GLOBAL`, as linked).
const VISIBLE: u16 = 1;
/// The hidden bit of a version entry.
const HIDDEN_BIT: u16 = 0x8000;

/// Whether `name` is one of the layered entry points: the C and Fortran
/// spellings all start with `mpi`/`pmpi` in some case, and nothing else the
/// shim exports does but its own entries (`mpi_observer_shim_inject`...),
/// which must never be hidden.
pub(crate) fn managed(name: &CStr) -> bool {
    let b = name.to_bytes();
    let starts = |p: &[u8]| b.len() > p.len() && b[..p.len()].eq_ignore_ascii_case(p);
    (starts(b"mpi_") || starts(b"pmpi")) && !b.starts_with(b"mpi_observer_")
}

/// [`managed`]'s test on the first bytes of a name, before it is measured:
/// most names of most objects fail at the first byte.
fn starts_managed(name: *const u8) -> bool {
    // SAFETY: a NUL-terminated string; no byte past the NUL is read, since
    // the comparison stops at the first mismatch and NUL matches nothing.
    let at = |k: usize| unsafe { name.add(k).read() }.to_ascii_lowercase();
    let prefix = |p: &[u8]| p.iter().enumerate().all(|(k, &c)| at(k) == c);
    prefix(b"mpi_") || prefix(b"pmpi")
}

static LOCK: AtomicBool = AtomicBool::new(false);
/// Objects scanned so far, and the last of them: a list that only grew
/// needs only its new objects scanned.
static SEEN: AtomicUsize = AtomicUsize::new(0);
static LAST: AtomicPtr<LinkMap> = AtomicPtr::new(core::ptr::null_mut());
/// Set while [`with_all_visible`] runs its closure: updates wait.
static ALL_VISIBLE: AtomicBool = AtomicBool::new(false);
/// Libc's `dlopen` and `dlsym`, which the hooks jump to.
static REAL_DLOPEN: AtomicUsize = AtomicUsize::new(0);
static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Holds [`LOCK`] while alive. A spin lock: this may run during relocation,
/// before libc is initialised, and is held for microseconds.
struct Locked;

impl Locked {
    fn take() -> Locked {
        while LOCK
            .compare_exchange_weak(false, true, Acquire, Relaxed)
            .is_err()
        {
            core::hint::spin_loop();
        }
        Locked
    }
}

impl Drop for Locked {
    fn drop(&mut self) {
        LOCK.store(false, Release);
    }
}

/// Brings the shim's visible function set up to date with what the process
/// has loaded. Cheap when nothing was loaded since the last call.
pub(crate) extern "C" fn refresh() {
    let _l = Locked::take();
    if REAL_DLOPEN.load(Relaxed) == 0 {
        find_real();
    }
    if !ALL_VISIBLE.load(Relaxed) {
        update(false);
    }
}

/// Finds libc's `dlopen` and `dlsym` (the next definitions after the shim).
fn find_real() {
    let real = |n: &CStr, none: usize| loaded::find(n, &[]).map_or(none, |p| p as usize);
    REAL_DLOPEN.store(real(c"dlopen", no_dlopen as *const () as usize), Relaxed);
    REAL_DLSYM.store(real(c"dlsym", no_dlsym as *const () as usize), Relaxed);
}

/// Runs `f` with every export visible, then recomputes the set from
/// scratch. Tools are loaded this way: a tool's references bind to the shim
/// when it is loaded (`RTLD_NOW`) even for procedures the library lacks, as
/// they always did; calling one ends in the dispatch table's one-line error.
pub(crate) fn with_all_visible<T>(f: impl FnOnce() -> T) -> T {
    {
        let _l = Locked::take();
        if let Some(shim) = shim() {
            set(&shim, |_, v| if v & HIDDEN_BIT != 0 { VISIBLE } else { v });
        }
        // The `dlopen` inside `f` refreshes on entry: it must not hide
        // anything again before the tool is bound.
        ALL_VISIBLE.store(true, Relaxed);
    }
    let r = f();
    let _l = Locked::take();
    ALL_VISIBLE.store(false, Relaxed);
    update(true);
    r
}

/// The shim's own dynamic table, with its versions.
fn shim() -> Option<Object> {
    loaded::objects()
        .find(|m| loaded::is_shim(m))
        .and_then(Object::new)
        .filter(|o| !o.versym.is_null())
}

/// The version entry that hides an export: the hidden bit and the highest
/// index the shim's table uses (glibc reads `l_versions[index]` for a
/// versioned lookup, so it must exist; an unversioned lookup skips a hidden
/// entry only if its index is at least 3). `None` if there is none such.
fn hidden_entry(shim: &Object) -> Option<u16> {
    // Imported symbols carry the indices of the versions they need.
    let max = (0..shim.count())
        // SAFETY: one version entry per symbol.
        .map(|i| unsafe { *shim.versym.add(i) } & !HIDDEN_BIT)
        .max()?;
    (max >= 3).then_some(HIDDEN_BIT | max)
}

/// Recomputes which exports are visible: from scratch if `full`, else only
/// from the objects appended since the last call (if the list only grew).
fn update(full: bool) {
    let (mut n, mut last) = (0usize, core::ptr::null_mut());
    for m in loaded::objects() {
        n += 1;
        last = core::ptr::from_ref(m).cast_mut();
    }
    let seen = SEEN.load(Relaxed);
    if !full && n == seen && last == LAST.load(Relaxed) {
        return;
    }
    let grown = !full
        && seen > 0
        && n > seen
        && loaded::objects()
            .nth(seen - 1)
            .is_some_and(|m| core::ptr::eq(m, LAST.load(Relaxed)));
    SEEN.store(n, Relaxed);
    LAST.store(last, Relaxed);
    if !grown {
        find_real();
    }
    let Some(shim) = shim() else {
        return;
    };
    let Some(hidden) = hidden_entry(&shim) else {
        return;
    };
    // Which of the shim's symbols some other object defines: one pass over
    // each object's own symbols (most define no MPI name at all), looking up
    // only the managed names in the shim's table, rather than a lookup of
    // each of the shim's 6,400 names in every object.
    let count = shim.count();
    if count > PRESENT_BITS {
        return;
    }
    let mut present = [0u64; PRESENT_BITS / 64];
    let from = if grown { seen } else { 0 };
    for m in loaded::objects().skip(from).filter(|m| !loaded::is_shim(m)) {
        let Some(o) = Object::new(m) else {
            continue;
        };
        for (_, name) in o.definitions(starts_managed) {
            if managed(name)
                && let Some(j) = shim.any_index(name)
            {
                present[j / 64] |= 1 << (j % 64);
            }
        }
    }
    let defined = |j: usize| present[j / 64] & (1 << (j % 64)) != 0;
    set(&shim, |j, v| {
        if v != VISIBLE && v != hidden {
            v
        } else if defined(j) {
            VISIBLE
        } else if grown {
            // Appended objects can only reveal a hidden name.
            v
        } else {
            hidden
        }
    });
    if grown {
        rebind_past_shim(&shim, seen);
    }
}

/// Sets every managed export's version entry to `want(index, current)`.
/// The table lies in the shim's read-only segment: it is made writable for
/// the writes, then read-only again.
fn set(shim: &Object, want: impl Fn(usize, u16) -> u16) {
    let count = shim.count();
    let Some((lo, len)) = protect_pages(shim.versym as usize, 2 * count, PROT_READ | PROT_WRITE)
    else {
        return;
    };
    // Every definition, hidden ones included (a lookup skips those).
    for (i, name) in shim.symbols() {
        if !managed(name) {
            continue;
        }
        // SAFETY: one version entry per symbol, writable now.
        unsafe {
            let e = shim.versym.add(i);
            let v = want(i, *e);
            if *e != v {
                e.write_volatile(v);
            }
        }
    }
    mprotect(lo, len, PROT_READ);
}

/// Bits for [`update`]'s table of the shim's symbols (it has about 6,500).
const PRESENT_BITS: usize = 16_384;

const PROT_READ: usize = 1;
const PROT_WRITE: usize = 2;

/// `mprotect(2)` by a raw system call: libc may not be initialised yet, and
/// this must not touch `errno` (thread-local storage).
fn mprotect(addr: usize, len: usize, prot: usize) -> isize {
    // SAFETY: changes the protection of pages of the shim's own read-only
    // segment, which no one executes or writes, or of a RELRO page of GOT
    // slots.
    unsafe { crate::arch::mprotect_raw(addr, len, prot) }
}

/// `-EINVAL`, as a raw system call returns it.
const NEG_EINVAL: isize = -22;

/// [`mprotect`]s the pages holding `addr..addr + len` without knowing the
/// page size, which takes libc ([`loaded::page_size`]) and this runs in the
/// startup IFUNC too: the start rounded down to each page size the ISA
/// has ([`crate::arch::PAGE_SIZES`]) in turn, until the kernel accepts one. A start that is not
/// page-aligned fails with `EINVAL` and changes nothing, so the first start
/// accepted is the page's, and the kernel rounds the length up itself.
/// Returns the range changed, for the call that restores it.
fn protect_pages(addr: usize, len: usize, prot: usize) -> Option<(usize, usize)> {
    for &page in crate::arch::PAGE_SIZES {
        let (lo, n) = loaded::page_span(addr, len, page);
        match mprotect(lo, n, prot) {
            0 => return Some((lo, n)),
            NEG_EINVAL => {}
            _ => return None,
        }
    }
    None
}

/// What the hooks jump to if libc's `dlopen`/`dlsym` cannot be found (a
/// libc without them): "not found", never a jump to nothing.
extern "C" fn no_dlopen(_: *const i8, _: i32) -> *mut c_void {
    core::ptr::null_mut()
}

/// As [`no_dlopen`].
extern "C" fn no_dlsym(_: *mut c_void, _: *const i8) -> *mut c_void {
    core::ptr::null_mut()
}

/// Defines an interposed libc entry point that calls [`refresh`], then
/// jumps to libc's with the caller's own return address still on the stack:
/// libc decides from it which object called (for `dlopen`, whose `RUNPATH`
/// and namespace to search; for `dlsym`, what `RTLD_NEXT` means), so it must
/// be the real caller's, not the shim's. The two arguments are kept.
macro_rules! refresh_then {
    ($(#[$doc:meta])* $name:ident, $real:ident) => {
        $(#[$doc])*
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name() {
            refresh_then_asm!(refresh, $real)
        }
    };
}

refresh_then!(
    /// `dlopen`, after [`refresh`].
    dlopen,
    REAL_DLOPEN
);
refresh_then!(
    /// `dlsym`, after [`refresh`].
    dlsym,
    REAL_DLSYM
);

/// A private IFUNC: the dynamic linker calls its resolver while it
/// relocates the shim (for the IRELATIVE relocation of [`STARTUP`]), after
/// every object of the program is mapped and before the program itself is
/// relocated, so the program's own references, weak ones included, see
/// the right set. On x86_64 glibc applies an object's IRELATIVE relocations
/// after its others (`ELF_MACHINE_IRELATIVE`), so the shim's GOT is
/// complete; the resolver calls nothing in libc all the same, but for
/// `getauxval` ([`loaded::page_size`]). glibc's aarch64 port has no such
/// rule and applies them in table order; there the reference is a branch
/// (`ifunc_reference!` in [`crate::arch`]), which puts the IRELATIVE after
/// the shim's JUMP_SLOTs (with a pointer, GNU ld put it in `.rela.dyn`, and
/// the resolver's first PLT call, `strlen`, jumped to an unrelocated PLT0
/// under qemu-user). Only TLSDESC relocations follow it, so the resolver
/// touches no general-dynamic `thread_local!`.
#[unsafe(naked)]
unsafe extern "C" fn startup_ifunc() {
    ifunc_asm!(startup_ifunc, startup_resolver)
}

/// The resolver of [`startup_ifunc`]: refreshes, clears what was bound
/// before it could, and names a function that does nothing as the IFUNC's
/// value.
extern "C" fn startup_resolver() -> usize {
    let _l = Locked::take();
    update(true);
    unbind_early_weak_references();
    inert as *const () as usize
}

/// Clears the eager weak references that the objects relocated before the
/// shim (those after it in load order: the program's libraries) bound to an
/// export that is now hidden, so they read null as without the shim. Only a
/// slot that still holds the shim's address is written: a lazily bound one
/// holds its PLT stub and will see the hidden entry when first called.
fn unbind_early_weak_references() {
    let Some(shim) = shim() else {
        return;
    };
    let Some(hidden) = hidden_entry(&shim) else {
        return;
    };
    let after = loaded::objects()
        .skip_while(|m| !loaded::is_shim(m))
        .skip(1);
    rewrite(after, &shim, true, |entry, ours, _| {
        (entry == hidden).then_some((ours, 0))
    });
}

/// Points at the shim the references that objects loaded since the last
/// scan (from object `from` on) bound past it: a `dlopen` that loads a
/// library and, as its dependency, the MPI library binds eagerly (Python
/// loads modules `RTLD_NOW`) before the shim could show the library's names.
fn rebind_past_shim(shim: &Object, from: usize) {
    let new = loaded::objects().skip(from).filter(|m| !loaded::is_shim(m));
    rewrite(new, shim, false, |entry, ours, name| {
        let theirs = loaded::find(name, &[])? as usize;
        (entry == VISIBLE).then_some((theirs, ours))
    });
}

/// For each relocation of `objects` against a managed name the shim
/// defines (only weak ones if `weak_only`), asks `decide(entry, ours,
/// name)` for `(bound, target)`: a slot holding `bound` is rewritten to
/// `target` (both plus the addend for absolute relocations).
fn rewrite<'a>(
    objects: impl Iterator<Item = &'a LinkMap>,
    shim: &Object,
    weak_only: bool,
    decide: impl Fn(u16, usize, &CStr) -> Option<(usize, usize)>,
) {
    for m in objects {
        let Some(o) = Object::new(m) else {
            continue;
        };
        for (slot, ty, addend, name) in o.references(weak_only) {
            let Some(i) = managed(name).then(|| shim.any_index(name)).flatten() else {
                continue;
            };
            // SAFETY: one version entry per symbol; `i` is a definition.
            let (entry, ours) = unsafe { (*shim.versym.add(i), shim.value(i)) };
            let Some((bound, target)) = decide(entry, ours, name) else {
                continue;
            };
            let Some(add) = crate::arch::slot_addend(ty, addend) else {
                continue;
            };
            let (bound, target) = (bound.wrapping_add(add), target.wrapping_add(add));
            // SAFETY: the slot is in the object's mapped segments (its
            // relocation says so); only read here.
            if unsafe { slot.read_volatile() } != bound {
                continue;
            }
            let Some(place) = loaded::placement(m, slot as usize) else {
                continue;
            };
            if place.relro
                && let Some((lo, len)) =
                    protect_pages(slot as usize, size_of::<usize>(), PROT_READ | PROT_WRITE)
            {
                // SAFETY: writable now.
                unsafe { slot.write_volatile(target) };
                mprotect(lo, len, PROT_READ);
            } else if place.writable && !place.relro {
                // SAFETY: a writable data segment.
                unsafe { slot.write_volatile(target) };
            }
        }
    }
}

extern "C" fn inert() {}

// The reference that makes the linker emit the IRELATIVE relocation:
// `STARTUP`.
ifunc_reference!(STARTUP, startup_ifunc);
