//! What the process has loaded: the dynamic linker's list of objects and a
//! lookup of a name in one object's dynamic symbol table.
//!
//! This runs where libc may not be usable yet (see [`crate::exports`]: from
//! a resolver during the shim's own relocation), so it calls nothing, takes
//! no lock and allocates nothing: it walks `_r_debug.r_map`, whose public
//! prefix is stable ABI (`<link.h>`), and reads each object's `.gnu.hash`
//! (or `.hash`), `.dynsym`, `.dynstr` and `.gnu.version` in memory.

use core::{
    ffi::{CStr, c_char, c_void},
    sync::atomic::{AtomicUsize, Ordering::Relaxed},
};

/// The public prefix of glibc's `struct link_map`.
#[repr(C)]
pub(crate) struct LinkMap {
    /// Difference between the addresses in the ELF file and in memory.
    pub(crate) l_addr: usize,
    /// The file name, empty for the main program.
    pub(crate) l_name: *const c_char,
    /// The object's dynamic section.
    pub(crate) l_ld: *const Dyn,
    /// The next object in load order.
    pub(crate) l_next: *const LinkMap,
    l_prev: *const LinkMap,
}

/// `struct r_debug` (`<link.h>`).
#[repr(C)]
struct RDebug {
    r_version: i32,
    r_map: *const LinkMap,
}

unsafe extern "C" {
    /// The dynamic linker's debugger interface; `r_map` is the head of the
    /// base namespace's list from before the first relocation on.
    static _r_debug: RDebug;
}

/// `Elf64_Dyn`.
#[repr(C)]
pub(crate) struct Dyn {
    d_tag: i64,
    d_val: usize,
}

/// `Elf64_Sym`.
#[repr(C)]
struct Sym {
    st_name: u32,
    st_info: u8,
    st_other: u8,
    st_shndx: u16,
    st_value: u64,
    st_size: u64,
}

const DT_NULL: i64 = 0;
const DT_HASH: i64 = 4;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_PLTRELSZ: i64 = 2;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_JMPREL: i64 = 23;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
const DT_VERSYM: i64 = 0x6fff_fff0;

/// Every object of the base namespace, in load (and search) order.
pub(crate) fn objects() -> impl Iterator<Item = &'static LinkMap> {
    // SAFETY: `_r_debug` is ld.so's, initialised before any object is
    // relocated; its list only ever links fully set-up maps.
    let mut m = unsafe { core::ptr::addr_of!(_r_debug).read_volatile().r_map };
    core::iter::from_fn(move || {
        // SAFETY: null or a live link map (maps are unlinked before freed).
        let cur = unsafe { m.as_ref()? };
        m = cur.l_next;
        Some(cur)
    })
}

/// One object's dynamic symbol table, as the dynamic linker reads it.
pub(crate) struct Object {
    base: usize,
    strtab: *const u8,
    symtab: *const Sym,
    gnu_hash: *const u32,
    sysv_hash: *const u32,
    /// `.gnu.version`, one entry per dynamic symbol, or null.
    pub(crate) versym: *mut u16,
    /// `DT_RELA` and `DT_JMPREL` (both `Elf64_Rela` on x86_64), and their
    /// sizes in bytes.
    rela: [(*const Rela, usize); 2],
}

/// `Elf64_Rela`.
#[repr(C)]
pub(crate) struct Rela {
    r_offset: u64,
    r_info: u64,
    r_addend: i64,
}

impl Object {
    /// Reads the dynamic section of `map`; `None` for an object without
    /// the tables a lookup needs (the vDSO has them; a broken map may not).
    pub(crate) fn new(map: &LinkMap) -> Option<Object> {
        if map.l_ld.is_null() {
            return None;
        }
        let base = map.l_addr;
        // glibc rewrites these entries to addresses when the dynamic section
        // is writable, and leaves them as offsets when it is not (the vDSO):
        // an offset is below the load address, an address is not.
        let at = |v: usize| if v < base { v + base } else { v };
        let (mut strtab, mut symtab, mut gnu, mut sysv, mut versym) = (0, 0, 0, 0, 0);
        let (mut rela, mut relasz, mut jmprel, mut pltrelsz) = (0, 0, 0, 0);
        let mut d = map.l_ld;
        loop {
            // SAFETY: the dynamic section is an array ended by DT_NULL.
            let e = unsafe { &*d };
            match e.d_tag {
                DT_NULL => break,
                DT_STRTAB => strtab = at(e.d_val),
                DT_SYMTAB => symtab = at(e.d_val),
                DT_GNU_HASH => gnu = at(e.d_val),
                DT_HASH => sysv = at(e.d_val),
                DT_VERSYM => versym = at(e.d_val),
                DT_RELA => rela = at(e.d_val),
                DT_RELASZ => relasz = e.d_val,
                DT_JMPREL => jmprel = at(e.d_val),
                DT_PLTRELSZ => pltrelsz = e.d_val,
                _ => {}
            }
            // SAFETY: not past DT_NULL.
            d = unsafe { d.add(1) };
        }
        (strtab != 0 && symtab != 0 && (gnu != 0 || sysv != 0)).then_some(Object {
            base,
            strtab: strtab as *const u8,
            symtab: symtab as *const Sym,
            gnu_hash: gnu as *const u32,
            sysv_hash: sysv as *const u32,
            versym: versym as *mut u16,
            rela: [
                (rela as *const Rela, relasz),
                (jmprel as *const Rela, pltrelsz),
            ],
        })
    }

    /// The name of dynamic symbol `i`.
    ///
    /// # Safety
    /// `i` indexes this object's dynamic symbol table.
    pub(crate) unsafe fn name(&self, i: usize) -> &CStr {
        // SAFETY: per the caller; st_name indexes the string table.
        unsafe {
            CStr::from_ptr(
                self.strtab
                    .add((*self.symtab.add(i)).st_name as usize)
                    .cast(),
            )
        }
    }

    /// Whether symbol `i` is one that a lookup without a version binds to:
    /// defined, not local, not hidden, and not a hidden (non-default)
    /// version.
    ///
    /// # Safety
    /// `i` indexes this object's dynamic symbol table.
    unsafe fn binds(&self, i: usize) -> bool {
        // SAFETY: per the caller.
        let s = unsafe { &*self.symtab.add(i) };
        let bind = s.st_info >> 4;
        let visibility = s.st_other & 3;
        let hidden_version =
            // SAFETY: one versym entry per symbol.
            !self.versym.is_null() && unsafe { *self.versym.add(i) } & 0x8000 != 0;
        s.st_shndx != 0
            && (bind == 1 || bind == 2 || bind == 10)
            && (visibility == 0 || visibility == 3)
            && !hidden_version
    }

    /// The index of the symbol `name` (with GNU hash `h`) that a lookup
    /// binds to, if this object defines one.
    pub(crate) fn index(&self, name: &CStr, h: u32) -> Option<usize> {
        self.find_index(name, h, true)
    }

    /// The index of a definition of `name`, even one a lookup would skip.
    pub(crate) fn any_index(&self, name: &CStr) -> Option<usize> {
        self.find_index(name, gnu_hash(name), false)
    }

    fn find_index(&self, name: &CStr, h: u32, binding: bool) -> Option<usize> {
        let found = |i: usize| {
            // SAFETY: `i` comes from this object's hash table.
            unsafe {
                self.name(i) == name
                    && if binding {
                        self.binds(i)
                    } else {
                        (*self.symtab.add(i)).st_shndx != 0
                    }
            }
        };
        if !self.gnu_hash.is_null() {
            // SAFETY: the layout of DT_GNU_HASH: nbuckets, symoffset,
            // bloom words, shift, then the bloom filter, buckets, chains.
            unsafe {
                let t = self.gnu_hash;
                let (nbuckets, symoffset, nbloom, shift) = (*t, *t.add(1), *t.add(2), *t.add(3));
                if nbuckets == 0 || nbloom == 0 {
                    return None;
                }
                let bloom = t.add(4).cast::<u64>();
                let word = *bloom.add(((h / 64) % nbloom) as usize);
                let mask = (1u64 << (h % 64)) | (1u64 << ((h >> shift) % 64));
                if word & mask != mask {
                    return None;
                }
                let buckets = bloom.add(nbloom as usize).cast::<u32>();
                let chains = buckets.add(nbuckets as usize);
                let mut i = *buckets.add((h % nbuckets) as usize);
                if i < symoffset {
                    return None;
                }
                loop {
                    let ch = *chains.add((i - symoffset) as usize);
                    if (ch | 1) == (h | 1) && found(i as usize) {
                        return Some(i as usize);
                    }
                    if ch & 1 != 0 {
                        return None;
                    }
                    i += 1;
                }
            }
        }
        // SAFETY: DT_HASH: nbucket, nchain, buckets, chains.
        unsafe {
            let t = self.sysv_hash;
            let nbucket = *t;
            if nbucket == 0 {
                return None;
            }
            let chains = t.add(2 + nbucket as usize);
            let mut i = *t.add(2 + (sysv_hash(name) % nbucket) as usize);
            while i != 0 {
                if found(i as usize) {
                    return Some(i as usize);
                }
                i = *chains.add(i as usize);
            }
            None
        }
    }

    /// The address of `name` in this object, if it defines it (not for
    /// IFUNC symbols, whose address needs their resolver: `None`).
    pub(crate) fn address(&self, name: &CStr) -> Option<*const c_void> {
        let i = self.index(name, gnu_hash(name))?;
        // SAFETY: a valid index.
        let s = unsafe { &*self.symtab.add(i) };
        const STT_GNU_IFUNC: u8 = 10;
        (s.st_info & 0xf != STT_GNU_IFUNC)
            .then(|| (self.base + s.st_value as usize) as *const c_void)
    }

    /// The address of the function `name` (GNU hash `h`) that a lookup in
    /// this object binds to: `STT_FUNC` only, so never an IFUNC's resolver
    /// nor a data object.
    pub(crate) fn function(&self, name: &CStr, h: u32) -> Option<usize> {
        const STT_FUNC: u8 = 2;
        let i = self.index(name, h)?;
        // SAFETY: a valid index.
        let s = unsafe { &*self.symtab.add(i) };
        (s.st_info & 0xf == STT_FUNC).then(|| self.base + s.st_value as usize)
    }

    /// Every dynamic relocation of this object against a symbol: the slot's
    /// address, the relocation type, its addend and the symbol's index.
    pub(crate) fn relocations(&self) -> impl Iterator<Item = (*mut usize, u32, i64, usize)> {
        self.rela.into_iter().flat_map(move |(table, size)| {
            let n = if table.is_null() {
                0
            } else {
                size / size_of::<Rela>()
            };
            (0..n).filter_map(move |k| {
                // SAFETY: `k` is within the table the dynamic section gives.
                let r = unsafe { &*table.add(k) };
                let sym = (r.r_info >> 32) as usize;
                (sym != 0).then(|| {
                    (
                        (self.base + r.r_offset as usize) as *mut usize,
                        r.r_info as u32,
                        r.r_addend,
                        sym,
                    )
                })
            })
        })
    }

    /// The address of symbol `i` in memory.
    ///
    /// # Safety
    /// `i` indexes this object's dynamic symbol table.
    pub(crate) unsafe fn value(&self, i: usize) -> usize {
        // SAFETY: per the caller.
        self.base + unsafe { (*self.symtab.add(i)).st_value } as usize
    }

    /// Every relocation of this object against a symbol it does not define
    /// (only weak ones if `weak_only`), with the symbol's name: the slot's
    /// address, the relocation type and its addend.
    pub(crate) fn references(
        &self,
        weak_only: bool,
    ) -> impl Iterator<Item = (*mut usize, u32, i64, &CStr)> {
        const STB_WEAK: u8 = 2;
        self.relocations()
            .filter_map(move |(slot, kind, addend, sym)| {
                // SAFETY: relocations index this object's symbol table.
                let s = unsafe { &*self.symtab.add(sym) };
                (s.st_shndx == 0 && (!weak_only || s.st_info >> 4 == STB_WEAK))
                    // SAFETY: as above.
                    .then(|| (slot, kind, addend, unsafe { self.name(sym) }))
            })
    }

    /// Every symbol a lookup binds to in this object ([`Object::binds`])
    /// whose name passes `first`, a test on its first bytes made before the
    /// name is measured; with its index.
    pub(crate) fn definitions(
        &self,
        first: impl Fn(*const u8) -> bool,
    ) -> impl Iterator<Item = (usize, &CStr)> {
        (1..self.count()).filter_map(move |i| {
            // SAFETY: `i < count`; st_name indexes the string table.
            unsafe {
                let p = self.strtab.add((*self.symtab.add(i)).st_name as usize);
                (first(p) && self.binds(i)).then(|| (i, CStr::from_ptr(p.cast())))
            }
        })
    }

    /// Every symbol this object defines, with its index.
    pub(crate) fn symbols(&self) -> impl Iterator<Item = (usize, &CStr)> {
        let n = self.count();
        (1..n).filter_map(move |i| {
            // SAFETY: `i < count`.
            let s = unsafe { &*self.symtab.add(i) };
            // SAFETY: as above.
            (s.st_shndx != 0).then(|| (i, unsafe { self.name(i) }))
        })
    }

    /// The number of dynamic symbols: from `.hash` directly, from
    /// `.gnu.hash` past the last chain.
    pub(crate) fn count(&self) -> usize {
        // SAFETY: the hash tables' layouts as in `index`.
        unsafe {
            if !self.sysv_hash.is_null() {
                return *self.sysv_hash.add(1) as usize;
            }
            let t = self.gnu_hash;
            let (nbuckets, symoffset, nbloom) = (*t, *t.add(1), *t.add(2));
            let buckets = t.add(4).cast::<u64>().add(nbloom as usize).cast::<u32>();
            let chains = buckets.add(nbuckets as usize);
            let last = (0..nbuckets as usize)
                .map(|b| *buckets.add(b))
                .max()
                .unwrap_or(0);
            if last < symoffset {
                return symoffset as usize;
            }
            let mut i = last;
            while *chains.add((i - symoffset) as usize) & 1 == 0 {
                i += 1;
            }
            i as usize + 1
        }
    }
}

/// The GNU hash of a symbol name (DJB's, as in `.gnu.hash`).
pub(crate) fn gnu_hash(name: &CStr) -> u32 {
    name.to_bytes()
        .iter()
        .fold(5381u32, |h, &c| h.wrapping_mul(33).wrapping_add(c as u32))
}

/// The System V ELF hash of a symbol name (as in `.hash`).
fn sysv_hash(name: &CStr) -> u32 {
    name.to_bytes().iter().fold(0u32, |h, &c| {
        let h = (h << 4).wrapping_add(c as u32);
        let g = h & 0xf000_0000;
        (h ^ (g >> 24)) & !g
    })
}

/// Where an address lies in an object's segments.
pub(crate) struct Placement {
    /// In a loadable segment the file maps writable.
    pub(crate) writable: bool,
    /// In a page of the `PT_GNU_RELRO` range: read-only after relocation.
    pub(crate) relro: bool,
}

/// `Elf64_Phdr`.
#[repr(C)]
pub(crate) struct Phdr {
    p_type: u32,
    p_flags: u32,
    p_offset: u64,
    p_vaddr: u64,
    p_paddr: u64,
    p_filesz: u64,
    p_memsz: u64,
    p_align: u64,
}

const PT_LOAD: u32 = 1;
const PT_GNU_RELRO: u32 = 0x6474_e552;
const PF_X: u32 = 1;
const PF_W: u32 = 2;

/// `map`'s program headers in memory: after the ELF header at the object's
/// base (a shared object's first loadable segment maps the file from offset
/// 0 there), or for the main program, whose base is 0 when it is not
/// position-independent, from the auxiliary vector (`AT_PHDR`), which only
/// calls made after libc is initialised need.
fn program_headers(map: &LinkMap) -> Option<&'static [Phdr]> {
    let base = map.l_addr;
    // SAFETY: the magic is checked before the header's other fields are
    // read; the table it names lies in the same mapped segment.
    unsafe {
        if base != 0 && *(base as *const [u8; 4]) == *b"\x7fELF" {
            let phoff = *((base + 32) as *const u64) as usize;
            let phnum = *((base + 56) as *const u16) as usize;
            return Some(core::slice::from_raw_parts(
                (base + phoff) as *const Phdr,
                phnum,
            ));
        }
    }
    let main = objects().next().is_some_and(|m| core::ptr::eq(m, map));
    if !main {
        return None;
    }
    // SAFETY: getauxval reads the vector the kernel passed; AT_PHDR is the
    // address of the program's own mapped program headers.
    let (at, n) = unsafe {
        (
            libc::getauxval(libc::AT_PHDR),
            libc::getauxval(libc::AT_PHNUM),
        )
    };
    // SAFETY: as above.
    (at != 0).then(|| unsafe { core::slice::from_raw_parts(at as *const Phdr, n as usize) })
}

/// Where `addr` lies in `map`'s segments, from its program headers in
/// memory; `None` if they cannot be found or `addr` is in no loadable
/// segment.
pub(crate) fn placement(map: &LinkMap, addr: usize) -> Option<Placement> {
    let base = map.l_addr;
    let mut place = Placement {
        writable: false,
        relro: false,
    };
    let mut loaded = false;
    for ph in program_headers(map)? {
        let vaddr = ph.p_vaddr as usize + base;
        let memsz = ph.p_memsz as usize;
        if !(vaddr..vaddr + memsz).contains(&addr) {
            continue;
        }
        match ph.p_type {
            PT_LOAD => {
                loaded = true;
                place.writable = ph.p_flags & PF_W != 0;
            }
            // glibc protects the range's whole pages only: a slot in
            // its last, partial page stays writable.
            PT_GNU_RELRO => place.relro = in_relro_pages(addr, vaddr, memsz, page_size()),
            _ => {}
        }
    }
    loaded.then_some(place)
}

/// The pages of `map`'s `PT_GNU_RELRO` range that glibc made read-only
/// after relocation (`_dl_protect_relro`: the start rounded down, the end
/// rounded down), or `None`.
pub(crate) fn relro_pages(map: &LinkMap) -> Option<(usize, usize)> {
    let ph = program_headers(map)?
        .iter()
        .find(|p| p.p_type == PT_GNU_RELRO)?;
    relro_span(
        ph.p_vaddr as usize + map.l_addr,
        ph.p_memsz as usize,
        page_size(),
    )
}

/// The page size the kernel runs this process with (`AT_PAGESZ`), read
/// once: 4 KiB on x86_64; 4, 16 or 64 KiB on aarch64.
pub(crate) fn page_size() -> usize {
    static PAGE: AtomicUsize = AtomicUsize::new(0);
    let p = PAGE.load(Relaxed);
    if p != 0 {
        return p;
    }
    // SAFETY: getauxval reads the vector the kernel passed, which ld.so
    // recorded before it relocated any object.
    let p = match unsafe { libc::getauxval(libc::AT_PAGESZ) } as usize {
        p if p.is_power_of_two() => p,
        // Linux always passes it; the smallest page rounds least wrongly.
        _ => 4096,
    };
    PAGE.store(p, Relaxed);
    p
}

/// The whole pages that hold `addr..addr + len` as `(start, length)`: the
/// start rounded down, the end up, to `page` (a power of two).
pub(crate) fn page_span(addr: usize, len: usize, page: usize) -> (usize, usize) {
    let lo = addr & !(page - 1);
    (lo, (addr + len).next_multiple_of(page) - lo)
}

/// The pages of a `PT_GNU_RELRO` range at `start`, `memsz` long, that
/// glibc's `_dl_protect_relro` makes read-only: start and end both rounded
/// down to `page`, so a last, partial page stays writable. `None` if that
/// leaves no page.
fn relro_span(start: usize, memsz: usize, page: usize) -> Option<(usize, usize)> {
    let (lo, hi) = (start & !(page - 1), (start + memsz) & !(page - 1));
    (hi > lo).then_some((lo, hi))
}

/// Whether `addr`, inside the `PT_GNU_RELRO` range at `start`, `memsz`
/// long, lies in one of the pages [`relro_span`] protects.
fn in_relro_pages(addr: usize, start: usize, memsz: usize, page: usize) -> bool {
    addr < (start + memsz) & !(page - 1)
}

/// The addresses of `map`'s executable loadable segments: from the lowest
/// start to the highest end.
pub(crate) fn code_range(map: &LinkMap) -> Option<(usize, usize)> {
    let code = program_headers(map)?
        .iter()
        .filter(|p| p.p_type == PT_LOAD && p.p_flags & PF_X != 0);
    let (lo, hi) = code.fold((usize::MAX, 0), |(lo, hi), p| {
        let start = p.p_vaddr as usize + map.l_addr;
        (lo.min(start), hi.max(start + p.p_memsz as usize))
    });
    (lo < hi).then_some((lo, hi))
}

/// Whether `map` is the shim itself.
pub(crate) fn is_shim(map: &LinkMap) -> bool {
    unsafe extern "C" {
        /// The shim's own dynamic section (defined by the linker).
        static _DYNAMIC: [Dyn; 0];
    }
    core::ptr::eq(map.l_ld, core::ptr::addr_of!(_DYNAMIC).cast())
}

/// The first definition of `name` in an object other than the shim and
/// those in `skip`, searched from the object after the shim (the order of
/// `dlsym(RTLD_NEXT)`), then from the start. Unlike `dlsym`, this also
/// finds objects loaded with `RTLD_LOCAL`, as mpi4py loads the MPI library.
pub(crate) fn find(name: &CStr, skip: &[*mut c_void]) -> Option<*const c_void> {
    let after_shim = objects().skip_while(|m| !is_shim(m)).skip(1);
    let before_shim = objects().take_while(|m| !is_shim(m));
    after_shim
        .chain(before_shim)
        .filter(|m| !skip.contains(&(core::ptr::from_ref(*m) as *mut c_void)))
        .find_map(|m| Object::new(m)?.address(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_the_elf_specification() {
        // Reference values from the gABI and the GNU hash description.
        assert_eq!(gnu_hash(c""), 5381);
        assert_eq!(gnu_hash(c"printf"), 0x156b_2bb8);
        assert_eq!(sysv_hash(c"printf"), 0x077905a6);
    }

    const PAGES: [usize; 3] = [4096, 16_384, 65_536];

    #[test]
    fn page_spans_cover_whole_pages_of_every_size() {
        for page in PAGES {
            let base = 16 * 65_536;
            // An aligned start and a range inside one page: that page.
            assert_eq!(page_span(base, 8, page), (base, page));
            // A slot in the middle of a page: its page, however it lies.
            assert_eq!(page_span(base + page / 2, 8, page), (base, page));
            // The last byte of one page and the first of the next: both.
            assert_eq!(page_span(base + page - 1, 2, page), (base, 2 * page));
            // An end exactly at a boundary takes no further page.
            assert_eq!(page_span(base + 100, page - 100, page), (base, page));
        }
        // 4 KiB rounding inside a 16 KiB page is not the 16 KiB page.
        assert_eq!(page_span(0x13000, 8, 4096), (0x13000, 4096));
        assert_eq!(page_span(0x13000, 8, 16_384), (0x10000, 16_384));
        assert_eq!(page_span(0x13000, 8, 65_536), (0x10000, 65_536));
    }

    #[test]
    fn relro_pages_round_both_ends_down_as_glibc_does() {
        for page in PAGES {
            let start = 32 * 65_536 + page / 2;
            // Three pages' length from the middle of one: both ends
            // rounded down, so the first page counts and the last half
            // page stays out.
            let memsz = 3 * page;
            let (lo, hi) = relro_span(start, memsz, page).expect("pages");
            assert_eq!((lo, hi), (start - page / 2, start - page / 2 + 3 * page));
            assert!(in_relro_pages(start, start, memsz, page));
            assert!(in_relro_pages(hi - 8, start, memsz, page));
            assert!(!in_relro_pages(hi, start, memsz, page));
            // A range inside one page protects nothing.
            assert_eq!(relro_span(start, page / 4, page), None);
            assert!(!in_relro_pages(start, start, page / 4, page));
        }
        // The same range is one 16 KiB page but three 4 KiB ones, and no
        // 64 KiB page.
        assert_eq!(relro_span(0x21000, 0x3800, 4096), Some((0x21000, 0x24000)));
        assert_eq!(
            relro_span(0x21000, 0x3800, 16_384),
            Some((0x20000, 0x24000))
        );
        assert_eq!(relro_span(0x21000, 0x3800, 65_536), None);
    }

    #[test]
    fn the_page_size_is_the_kernels() {
        // SAFETY: sysconf has no preconditions.
        let sys = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        assert_eq!(page_size(), sys);
        assert_eq!(page_size(), sys);
    }

    #[test]
    fn finds_libc_functions_in_this_process() {
        // The test binary links libc: `find` must agree with dlsym.
        let ours = find(c"getpid", &[]).expect("libc's getpid");
        // SAFETY: NUL-terminated name.
        let theirs = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"getpid".as_ptr()) };
        assert_eq!(ours, theirs.cast_const());
        assert!(find(c"no_such_symbol_anywhere_42", &[]).is_none());
        // Every object's table can be read and counted.
        for m in objects() {
            if let Some(o) = Object::new(m) {
                assert!(o.symbols().count() < 1_000_000);
            }
        }
    }
}
