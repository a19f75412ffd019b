//! The entry points and the hot path.
//!
//! **Entry points.** Every exported `MPI_X`, `PMPI_X` and Fortran spelling
//! is a naked trampoline (`entry!`): it stores the return address its
//! caller's `call` pushed (`[rsp]`, the call site) in the thread's TLS
//! block (crate::depth) and jumps to the layered call, `bodyN::<ROW, PMPI,
//! R>` for N argument words (`bodies!`), one function shared by every
//! spelling of a row. A jump, not a call, so the body sees the caller's
//! stack and arguments untouched; the trampoline uses only `rax` and `r11`,
//! which carry nothing at the entry of a non-variadic SysV function. The
//! body reads the site back when it times the call (`dispatch!`), so the
//! `stats` layer can count the call under its call site. Stable Rust has no
//! return-address intrinsic, and reading `[rsp]` from a Rust body would
//! depend on its prologue; the trampoline costs three instructions and a
//! direct jump. The variadic `MPI_Pcontrol` (crate::handwritten) is no
//! trampoline and is not timed.
//!
//! The body looks its target up in the dispatch table ([`crate::table`]).
//! An empty slot sends the call to the cold path ([`fill`]), which builds
//! the stack once ([`crate::layers`]) and retries, or reports a function no
//! layer defines.
//!
//! This is the top of the shim's dependencies: it uses the table, the
//! layers, the timing and the recorder, and nothing below names it (the
//! built-in layers reach the shim's own `PMPI_X` by symbol, see
//! [`crate::generated::next`]).

use core::ffi::c_void;

use crate::table::lookup;

/// [`lookup`] that builds the stack first if needed, for callers off the
/// hot path.
pub(crate) fn target(row: usize, start: u32) -> (*const c_void, u32) {
    let t = lookup(row, start);
    if t.0.is_null() {
        fill(row, start);
        return lookup(row, start);
    }
    t
}

/// The cold path of an empty slot: the first call of the process builds the
/// stack (the caller then calls itself again); a slot still empty after that
/// is a function no layer defines, which is fatal. Kept out of line, and
/// the retry done by the caller, so the hot path never saves its arguments.
#[cold]
#[inline(never)]
pub(crate) fn fill(row: usize, start: u32) {
    crate::layers::ensure();
    if lookup(row, start).0.is_null() {
        crate::layers::fatal(&format!(
            "{} is not defined by any layer, nor by the MPI library",
            crate::layers::row_name(row)
        ));
    }
}

/// Expands to `usize` whatever its argument: one machine word per parameter.
macro_rules! word {
    ($a:ident) => {
        usize
    };
}

/// The layered call itself, the body of `$self::<ROW, PMPI, R>` (see
/// [`bodies!`]), which it re-enters once after building the stack: `ROW`
/// is the table row, `PMPI` 1 for a profiling spelling (the search starts
/// one level below the caller's), `R` the return type.
///
/// Every argument of every MPI procedure but `MPI_Pcontrol`'s varargs is of
/// the INTEGER class in the x86_64 SysV ABI (handles are pointers in Open MPI
/// and `int`s in MPICH, the rest are pointers, integers or `MPI_Aint`s), so
/// forwarding N machine words in the same registers and stack slots passes
/// them through unchanged without knowing either `mpi.h`.
macro_rules! dispatch {
    ($self:ident, ($($a:ident),*)) => {{
        let slot = $crate::depth::slot();
        // SAFETY: this thread's depth variable.
        let depth = unsafe { slot.read() };
        let (f, level) = $crate::table::lookup(ROW, depth + PMPI);
        if f.is_null() {
            // Out of line and entered by a tail call with the same words,
            // so the hot path never has to keep its arguments alive.
            #[cold]
            #[inline(never)]
            unsafe extern "C" fn cold<const ROW: usize, const PMPI: u32, R>($($a: usize),*) -> R {
                let slot = $crate::depth::slot();
                // SAFETY: this thread's depth variable.
                let (start, site) = unsafe { (slot.read() + PMPI, $crate::depth::site(slot)) };
                $crate::dispatch::fill(ROW, start);
                // Building the stack may have run code that called through
                // a trampoline: the call site is this call's again.
                // SAFETY: as above.
                unsafe { $crate::depth::set_site($crate::depth::slot_again(), site) };
                // SAFETY: the same call again, now that the slot is filled.
                unsafe { $self::<ROW, PMPI, R>($($a),*) }
            }
            // SAFETY: the words this call was made with, passed on unchanged.
            return unsafe { cold::<ROW, PMPI, R>($($a),*) };
        }
        // The application's level (see crate::timing): depth 0 and no
        // timed call open on this thread; 0 when not timed. The call site
        // is read now, before any nested call's trampoline overwrites it.
        let (t0, site) = if depth == 0 && $crate::timing::enabled() {
            // SAFETY: this thread's depth variable.
            unsafe { ($crate::timing::enter(slot), $crate::depth::site(slot)) }
        } else {
            (0, 0)
        };
        // Bytes by the probes' definition, read at entry as the probe does;
        // only for the procedures that move data.
        let b = if t0 != 0 && const { $crate::timing::has_bytes(ROW) } {
            $crate::timing::bytes(ROW, &[$($a),*])
        } else {
            $crate::timing::Bytes::default()
        };
        // Enter and Leave for `mpi-observer record`: one load while no
        // recording is on.
        let traced = t0 != 0 && $crate::stats::trace::enter(ROW);
        // SAFETY: this thread's depth variable.
        unsafe { slot.write(level) };
        // SAFETY: `f` is the address of this procedure (or Fortran symbol) in
        // some layer, which takes these words and returns this type.
        let f: unsafe extern "C" fn($(word!($a)),*) -> R = unsafe { core::mem::transmute(f) };
        // SAFETY: the words this call was made with, passed on unchanged
        // (see above: all of the INTEGER class).
        let r = unsafe { f($($a),*) };
        // SAFETY: this thread's depth variable.
        unsafe { $crate::depth::slot_again().write(depth) };
        if traced {
            $crate::stats::trace::leave(ROW);
        }
        if t0 != 0 {
            $crate::timing::leave(ROW, t0, b, site);
        }
        r
    }};
}

/// Defines `bodyN::<ROW, PMPI, R>` for each arity N: the layered call of
/// row `ROW` taking N words, which the trampolines of that row jump to.
macro_rules! bodies {
    ($($name:ident($($a:ident),*);)*) => {$(
        #[doc = concat!("The layered call of a row whose entry points take the words `", stringify!($($a),*), "`.")]
        ///
        /// # Safety
        /// Entered from an entry point's trampoline (or its own cold path),
        /// with the words that entry point was called with.
        pub(crate) unsafe extern "C" fn $name<const ROW: usize, const PMPI: u32, R>($($a: usize),*) -> R {
            dispatch!($name, ($($a),*))
        }
    )*};
}

bodies! {
    body0();
    body1(a0);
    body2(a0, a1);
    body3(a0, a1, a2);
    body4(a0, a1, a2, a3);
    body5(a0, a1, a2, a3, a4);
    body6(a0, a1, a2, a3, a4, a5);
    body7(a0, a1, a2, a3, a4, a5, a6);
    body8(a0, a1, a2, a3, a4, a5, a6, a7);
    body9(a0, a1, a2, a3, a4, a5, a6, a7, a8);
    body10(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9);
    body11(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10);
    body12(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);
    body13(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12);
    body14(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13);
    body15(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14);
    body16(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15);
}

/// Calls `$cb! { $pre... bodyN }` with the body for the arity of `(words)`:
/// one word and one body name dropped per step until the words run out.
macro_rules! with_body {
    ($cb:ident! { $($pre:tt)* } ($($a:ident),*)) => {
        with_body!(@ $cb! { $($pre)* } [$($a)*] [
            body0 body1 body2 body3 body4 body5 body6 body7 body8 body9
            body10 body11 body12 body13 body14 body15 body16
        ]);
    };
    (@ $cb:ident! { $($pre:tt)* } [] [$b:ident $($rest:ident)*]) => {
        $cb! { $($pre)* $b }
    };
    (@ $cb:ident! { $($pre:tt)* } [$a:ident $($more:ident)*] [$b:ident $($rest:ident)*]) => {
        with_body!(@ $cb! { $($pre)* } [$($more)*] [$($rest)*]);
    };
}

/// One exported entry point: a naked trampoline that stores its caller's
/// return address as the thread's call site (offset `crate::depth::SITE`
/// of the TLS block) and jumps to `$target`, which takes the same words.
/// `rax` and `r11` are scratch at the entry of a non-variadic SysV function.
macro_rules! entry {
    // A generated entry point: row `$row`, the body for its arity.
    ([$($vis:tt)*] $name:ident, $doc:expr, $row:expr, $pmpi:expr, $ret:ty, ($($a:ident),*), $body:ident) => {
        entry!(@path [$($vis)*] $name, $doc, $ret, ($($a),*),
            $crate::dispatch::$body::<{ $row }, { $pmpi }, $ret>);
    };
    (@path [$($vis:tt)*] $name:ident, $doc:expr, $ret:ty, ($($a:ident),*), $target:path) => {
        #[doc = $doc]
        #[unsafe(naked)]
        #[unsafe(no_mangle)]
        $($vis)* unsafe extern "C" fn $name($($a: usize),*) -> $ret {
            core::arch::naked_asm!(
                "mov rax, qword ptr [rip + mpi_observer_shim_depth@GOTTPOFF]",
                "mov r11, qword ptr [rsp]",
                "mov qword ptr fs:[rax + 8], r11",
                "jmp {target}",
                target = sym $target,
            )
        }
    };
}

/// A C procedure: exports `MPI_X` (resolved at the current level) and
/// `PMPI_X` (resolved at the next level down).
macro_rules! c_procedure {
    ($row:expr, $mpi:ident, $pmpi:ident, $ret:ty, ($($a:ident),*)) => {
        with_body!(entry! {
            [] $mpi,
            concat!("Layered `", stringify!($mpi), "`: enters the stack at the caller's level."),
            $row, 0, $ret, ($($a),*),
        } ($($a),*));
        with_body!(entry! {
            [pub(crate)] $pmpi,
            concat!("Layered `", stringify!($pmpi), "`: continues one level below the caller."),
            $row, 1, $ret, ($($a),*),
        } ($($a),*));
    };
}

/// A Fortran symbol family: every spelling in `[mpi ...]` enters at the
/// caller's level, every spelling in `[pmpi ...]` one level below.
/// `$index` counts Fortran rows; the row is `FUNCTION_COUNT + $index`.
macro_rules! fortran_procedure {
    ($index:literal, $ret:ty, $args:tt, [$($mpi:ident),*], [$($pmpi:ident),*]) => {
        $( fortran_entry!(observer_common::FUNCTION_COUNT + $index, 0, $ret, $mpi, $args); )*
        $( fortran_entry!(observer_common::FUNCTION_COUNT + $index, 1, $ret, $pmpi, $args); )*
    };
}

/// One exported Fortran spelling.
macro_rules! fortran_entry {
    ($row:expr, $pmpi:expr, $ret:ty, $name:ident, ($($a:ident),*)) => {
        with_body!(entry! {
            [] $name,
            concat!("Layered Fortran `", stringify!($name), "`."),
            $row, $pmpi, $ret, ($($a),*),
        } ($($a),*));
    };
}
