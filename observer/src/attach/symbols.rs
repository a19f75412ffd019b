//! Reading an MPI library's ELF file: which PMPI entry points it defines
//! (and at which file offsets the kernel wants uprobes), which MPI flavour it
//! is, its version, and for Open MPI where its predefined datatypes live.

use std::{
    collections::BTreeMap,
    fs, io,
    path::Path,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicU64, Ordering},
    },
};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SymbolKind};
use observer_common::{FUNCTIONS, function_by_name, maps::lib_kind};
use thiserror::Error;

use crate::{
    attach::first_insn::{self, FirstInsn, Isa},
    os::procfs::{self, MapEntry, MappedLib},
    os::userfile::{self, FileKey, UserFileError},
};

/// Errors reading a library.
#[derive(Debug, Error)]
pub enum SymbolError {
    /// The file could not be read.
    #[error("cannot read MPI library {path}: {source}")]
    Read {
        /// Library path.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
    /// The file is not an ELF object we can parse.
    #[error("cannot parse MPI library {path} as ELF: {source}")]
    Parse {
        /// Library path.
        path: String,
        /// The parser's error.
        source: object::Error,
    },
    /// The file was refused before reading (not the mapped file, not a
    /// regular file, over the size cap...).
    #[error("refused to read MPI library: {0}")]
    Refused(#[from] UserFileError),
    /// The library's mapping is no longer in the process's maps.
    #[error("process {pid} no longer maps {path}")]
    Unmapped {
        /// The pid.
        pid: u32,
        /// Library path.
        path: String,
    },
    /// The library is code of another instruction set than this machine's:
    /// a process that maps it runs under an emulator (qemu-user through
    /// binfmt_misc), and probing the file would put this machine's
    /// breakpoints into another machine's code.
    #[error(
        "MPI library {path} is {isa} code, and this machine is {host}: the process runs it under an emulator (qemu-user), so it is not probed; observe it on an {isa} node"
    )]
    ForeignIsa {
        /// Library path.
        path: String,
        /// The library's instruction set.
        isa: &'static str,
        /// This machine's.
        host: &'static str,
    },
    /// No PMPI entry point is exported.
    #[error(
        "MPI library {path} exports no dynamic PMPI_* symbols, so there is nothing to probe: \
         use a shared MPI library that has its dynamic symbol table (not stripped with --strip-all of .dynsym, not linked statically)"
    )]
    NoDynamicSymbols {
        /// Library path.
        path: String,
    },
}

/// One probe site: a unique function address with the MPI function there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Function ID in the shared ID space.
    pub id: u16,
    /// File offset the kernel's uprobe API wants.
    pub file_offset: u64,
    /// What the kernel's uprobes do with the probed instruction: emulate
    /// it (cheap), single-step it out of line (about 10x dearer), or refuse
    /// it (then the entry is in [`Library::refused`], not probed).
    pub first_insn: FirstInsn,
    /// The function's first bytes, for `mpi-observer sites`.
    pub first_bytes: [u8; 16],
    /// Bytes of the function skipped before the probe (see
    /// [`first_insn::place`]); `file_offset` already includes them.
    pub skipped: u8,
}

/// What the daemon needs from an MPI library.
#[derive(Clone, Debug)]
pub struct Library {
    /// [`lib_kind`] value: how the probes read this library's arguments.
    pub kind: u32,
    /// The implementation, "openmpi", "mpich" or "intelmpi", with "-abi"
    /// appended for its MPI-5 standard ABI library (`libmpi_abi.so`).
    pub name: &'static str,
    /// The implementation's release version (Intel MPI's own, not the MPICH
    /// it derives from), or "unknown".
    pub version: String,
    /// One entry per unique PMPI function address, by function ID: the
    /// functions that are probed.
    pub entries: BTreeMap<u16, Entry>,
    /// The functions whose first instruction the kernel refuses to probe
    /// (arm64's `mrs`, `ldr (literal)`, ...): not probed, since one refused
    /// site fails a whole `uprobe_multi` link; the daemon says which.
    pub refused: BTreeMap<u16, Entry>,
    /// Open MPI: predefined datatype symbols, name to virtual address
    /// relative to the load base.
    pub ompi_datatypes: BTreeMap<String, u64>,
    /// Open MPI: `ompi_datatype_t_class`, relative to the load base.
    pub ompi_datatype_class: Option<u64>,
    /// The instruction set of its code (its ELF header's machine).
    pub isa: Isa,
    /// Virtual address corresponding to file offset 0 (first PT_LOAD's
    /// vaddr minus its offset), to turn symbol values into runtime
    /// addresses: runtime = base + (value - load_bias).
    pub load_bias: u64,
}

/// The cap on files read from user processes, set once from
/// `attach --max-file-size`; [`userfile::DEFAULT_MAX_FILE_SIZE`] otherwise.
static MAX_FILE_SIZE: OnceLock<u64> = OnceLock::new();

/// Sets the cap on files read from user processes (once, at start; a
/// second call is ignored).
pub fn set_max_file_size(cap: u64) {
    let _ = MAX_FILE_SIZE.set(cap);
}

/// The cap on files read from user processes.
pub fn max_file_size() -> u64 {
    MAX_FILE_SIZE
        .get()
        .copied()
        .unwrap_or(userfile::DEFAULT_MAX_FILE_SIZE)
}

/// Reads the library at `path` (a path the operator gave, as for
/// `mpi-observer sites`; a user's mapped library goes through
/// [`LibraryCache`]).
pub fn read_library(path: &Path) -> Result<Library, SymbolError> {
    let shown = path.display().to_string();
    let data = fs::read(path).map_err(|source| SymbolError::Read {
        path: shown.clone(),
        source,
    })?;
    parse_library(&data, path)
}

/// Parses a library's bytes; `path` names it (its file name tells the
/// standard ABI apart).
pub fn parse_library(data: &[u8], path: &Path) -> Result<Library, SymbolError> {
    let shown = path.display().to_string();
    let file = object::File::parse(data).map_err(|source| SymbolError::Parse {
        path: shown.clone(),
        source,
    })?;
    let exports = |name: &str| file.dynamic_symbols().any(|s| s.name() == Ok(name));
    let is_ompi = exports("ompi_mpi_comm_world");
    let rodata = read_only_data(&file, data);
    let is_intel = memchr_seq(rodata, INTEL_MARK).is_some();
    let (kind, name) = identify(
        path.file_name().and_then(|n| n.to_str()).unwrap_or(""),
        is_ompi,
        is_intel,
        exports("PMPI_Status_f2c"),
    );
    let mut by_addr: BTreeMap<u64, u16> = BTreeMap::new();
    let mut ompi_datatypes = BTreeMap::new();
    let mut ompi_datatype_class = None;
    let mut version_sym = None;
    for sym in file.dynamic_symbols() {
        if sym.is_undefined() || sym.address() == 0 {
            continue;
        }
        let Ok(sname) = sym.name() else { continue };
        if let Some(rest) = sym_pmpi(sname) {
            if sym.kind() != SymbolKind::Text {
                continue;
            }
            // MPI_X is a weak alias of PMPI_X: one site per address, so a
            // call is counted once whichever name the caller used.
            let std_name = format!("MPI_{rest}");
            if let Some(id) = function_by_name(&std_name) {
                by_addr.entry(sym.address()).or_insert(id);
            }
        } else if let Some(dt) = sname.strip_prefix("ompi_mpi_") {
            if sym.kind() == SymbolKind::Data && !dt.ends_with("_addr") && !dt.ends_with("_f") {
                ompi_datatypes.insert(sname.to_string(), sym.address());
            }
        } else if sname == "ompi_datatype_t_class" {
            ompi_datatype_class = Some(sym.address());
        } else if sname == "MPII_Version_string" {
            version_sym = Some((sym.address(), sym.size()));
        }
    }
    if by_addr.is_empty() {
        return Err(SymbolError::NoDynamicSymbols { path: shown });
    }
    let load_bias = load_bias(&file);
    let isa = Isa::of(file.architecture());
    let mut entries = BTreeMap::new();
    let mut refused = BTreeMap::new();
    for (addr, id) in by_addr {
        // A hostile header can put a symbol past the file's end: a probe
        // there would fail the whole attach, so that function goes unprobed.
        let Some(off) = file_offset(&file, addr).filter(|o| *o < data.len() as u64) else {
            continue;
        };
        let first = function_bytes(data, off);
        let mut first_bytes = [0u8; 16];
        if let Some(b) = first {
            for (d, s) in first_bytes.iter_mut().zip(b) {
                *d = *s;
            }
        }
        let (skipped, class) = first_insn::place(isa, first.unwrap_or(&[]));
        let entry = Entry {
            id,
            file_offset: off + u64::from(skipped),
            first_insn: class,
            first_bytes,
            skipped,
        };
        if matches!(class, FirstInsn::Refused(_)) {
            refused.insert(id, entry);
        } else {
            entries.insert(id, entry);
        }
    }
    let version = if is_ompi {
        ompi_version(rodata)
    } else if is_intel {
        intel_version(rodata)
    } else {
        version_sym
            .and_then(|(a, n)| {
                let off = file_offset(&file, a)? as usize;
                let bytes = data.get(off..off + n.max(1) as usize)?;
                let s = bytes.split(|b| *b == 0).next()?;
                Some(String::from_utf8_lossy(s).trim().to_string())
            })
            .filter(|s| !s.is_empty())
            .or_else(|| mpich_version(rodata))
    }
    .unwrap_or_else(|| "unknown".into());
    Ok(Library {
        kind,
        name,
        version,
        entries,
        refused,
        ompi_datatypes: if is_ompi {
            ompi_datatypes
        } else {
            BTreeMap::new()
        },
        ompi_datatype_class,
        isa,
        load_bias,
    })
}

/// Libraries parsed at most: each entry is a few tens of kilobytes (the
/// entry table and Open MPI's datatype names), and a node runs a handful
/// of MPI builds.
pub const LIBRARY_CACHE_ENTRIES: usize = 64;

/// Parsed MPI libraries, by file contents ([`FileKey`]: device, inode, size,
/// modification time), so that the ranks of a job, all mapping one library,
/// cost one read and one parse. Thread-safe: the lock is held only to look
/// up and insert, never while reading or parsing, so a caller needs no
/// other lock (the attach path calls it without the daemon's state lock).
pub struct LibraryCache {
    entries: Mutex<lru::LruCache<FileKey, Arc<Library>>>,
    hits: AtomicU64,
    parses: AtomicU64,
}

impl Default for LibraryCache {
    fn default() -> Self {
        LibraryCache::new(LIBRARY_CACHE_ENTRIES)
    }
}

impl LibraryCache {
    /// An empty cache of at most `entries` libraries.
    pub fn new(entries: usize) -> LibraryCache {
        LibraryCache {
            entries: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(entries.max(1)).expect("at least one"),
            )),
            hits: AtomicU64::new(0),
            parses: AtomicU64::new(0),
        }
    }

    /// The daemon's one cache.
    pub fn global() -> &'static LibraryCache {
        static CACHE: OnceLock<LibraryCache> = OnceLock::new();
        CACHE.get_or_init(LibraryCache::default)
    }

    /// The library of mapping `m` of process `pid`: opened as
    /// [`userfile::open_mapped`] says (the mapped file, regular, within
    /// [`max_file_size`]), parsed once per contents.
    pub fn get(&self, pid: u32, m: &MapEntry) -> Result<Arc<Library>, SymbolError> {
        let mut f = userfile::open_mapped(pid, m, max_file_size())?;
        let key = f.key();
        if let Some(lib) = self.lock().get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(lib.clone());
        }
        let data = f.read_all()?;
        let name = m.path.as_deref().unwrap_or(Path::new(""));
        let lib = Arc::new(parse_library(&data, name)?);
        self.parses.fetch_add(1, Ordering::Relaxed);
        // Once per library contents, as it is parsed once; a library of
        // another instruction set is refused whole (`get_mapped`).
        if lib.isa == Isa::HOST && !lib.refused.is_empty() {
            let names: Vec<String> = lib
                .refused
                .values()
                .map(|e| match e.first_insn {
                    FirstInsn::Refused(why) => {
                        format!("{} ({why})", FUNCTIONS[e.id as usize].name)
                    }
                    _ => FUNCTIONS[e.id as usize].name.to_string(),
                })
                .collect();
            log::warn!(
                "{}: {} functions are not probed, since the kernel refuses a probe on their first instruction, and their calls are not counted: {}; `mpi-observer sites {}` lists them (the stats layer of the shim counts them)",
                name.display(),
                names.len(),
                names.join(", "),
                name.display()
            );
        }
        self.lock().put(key, lib.clone());
        Ok(lib)
    }

    /// [`LibraryCache::get`] for the library [`procfs::mpi_library`] found:
    /// its lowest mapping, found again in the maps for its device and inode.
    /// A library of another instruction set than this machine's is an
    /// error ([`SymbolError::ForeignIsa`]): the attach paths call this one,
    /// `sites` reads any file.
    pub fn get_mapped(&self, pid: u32, lib: &MappedLib) -> Result<Arc<Library>, SymbolError> {
        let m = mapping(pid, lib)?;
        let parsed = self.get(pid, &m)?;
        if parsed.isa != Isa::HOST {
            return Err(foreign(lib, parsed.isa));
        }
        Ok(parsed)
    }

    /// Lookups answered from the cache.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Libraries read and parsed.
    pub fn parses(&self) -> u64 {
        self.parses.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, lru::LruCache<FileKey, Arc<Library>>> {
        // A panic elsewhere cannot leave the map half-updated: recover it.
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Defined data symbols of a file whose names start with `prefix`.
pub struct DataSymbols {
    /// Name to symbol value.
    pub symbols: BTreeMap<String, u64>,
    /// See [`Library::load_bias`].
    pub load_bias: u64,
}

/// Reads the defined dynamic data symbols starting with `prefix` from the
/// file of mapping `m` of process `pid`, opened and read within the cap
/// (see [`userfile`]).
pub fn read_data_symbols(pid: u32, m: &MapEntry, prefix: &str) -> Result<DataSymbols, SymbolError> {
    let mut f = userfile::open_mapped(pid, m, max_file_size())?;
    let shown = f.shown.clone();
    let data = f.read_all()?;
    parse_data_symbols(&data, &shown, prefix)
}

/// [`read_data_symbols`] of a file's bytes; `shown` names it in errors.
pub fn parse_data_symbols(
    data: &[u8],
    shown: &str,
    prefix: &str,
) -> Result<DataSymbols, SymbolError> {
    let file = object::File::parse(data).map_err(|source| SymbolError::Parse {
        path: shown.to_string(),
        source,
    })?;
    let symbols = file
        .dynamic_symbols()
        .filter(|s| !s.is_undefined() && s.address() != 0 && s.kind() == SymbolKind::Data)
        .filter_map(|s| Some((s.name().ok()?.to_string(), s.address())))
        .filter(|(n, _)| n.starts_with(prefix))
        .collect();
    Ok(DataSymbols {
        symbols,
        load_bias: load_bias(&file),
    })
}

/// The lowest mapping of `lib` in `pid`'s maps, found again by address
/// and path.
fn mapping(pid: u32, lib: &MappedLib) -> Result<MapEntry, SymbolError> {
    let unmapped = || SymbolError::Unmapped {
        pid,
        path: lib.path.display().to_string(),
    };
    let maps = procfs::maps(pid).map_err(|_| unmapped())?;
    maps.into_iter()
        .find(|m| m.start == lib.base && m.path.as_deref() == Some(&*lib.path))
        .ok_or_else(unmapped)
}

fn foreign(lib: &MappedLib, isa: Isa) -> SymbolError {
    SymbolError::ForeignIsa {
        path: lib.path.display().to_string(),
        isa: isa.as_str(),
        host: Isa::HOST.as_str(),
    }
}

/// `--pid`'s input check, before anything starts: refuses a library of
/// another instruction set than this machine's from its ELF header alone
/// (64 bytes; no parse, nothing cached or counted). A file that is no
/// ELF64 header passes here: the attach's parse says what is wrong.
pub fn check_mapped_isa(pid: u32, lib: &MappedLib) -> Result<(), SymbolError> {
    use std::io::Read as _;
    let m = mapping(pid, lib)?;
    let f = userfile::open_mapped(pid, &m, max_file_size())?;
    let mut head = Vec::with_capacity(64);
    (&f.file)
        .take(64)
        .read_to_end(&mut head)
        .map_err(|source| SymbolError::Read {
            path: f.shown.clone(),
            source,
        })?;
    match Isa::of_header(&head) {
        Some(isa) if isa != Isa::HOST => Err(foreign(lib, isa)),
        _ => Ok(()),
    }
}

fn load_bias(file: &object::File<'_>) -> u64 {
    use object::ObjectSegment as _;
    file.segments()
        .filter_map(|s| s.address().checked_sub(s.file_range().0))
        .min()
        .unwrap_or(0)
}

fn sym_pmpi(name: &str) -> Option<&str> {
    name.strip_prefix("PMPI_")
}

fn file_offset(file: &object::File<'_>, addr: u64) -> Option<u64> {
    file.sections().find_map(|s| {
        // Checked: the header values come from the file.
        let rel = addr.checked_sub(s.address())?;
        if rel >= s.size() {
            return None;
        }
        let (off, _) = s.file_range()?;
        off.checked_add(rel)
    })
}

fn function_bytes(data: &[u8], off: u64) -> Option<&[u8]> {
    data.get(off as usize..(off as usize + 16).min(data.len()))
}

/// Marks Intel MPI, which is MPICH underneath.
const INTEL_MARK: &[u8] = b"Intel(R) MPI Library";

/// The library's kind and name. The standard ABI is recognised by its
/// file name, `libmpi_abi.so*` (the name the MPI-5 standard gives it), and
/// confirmed by the library: the ABI leaves out the `MPI_Fint` conversions
/// such as `MPI_Status_f2c`, which every library of the older conventions
/// exports. A name and a content that disagree get [`lib_kind::UNKNOWN`]:
/// calls are counted and timed, bytes are all unknown.
fn identify(file_name: &str, ompi: bool, intel: bool, fint: bool) -> (u32, &'static str) {
    let abi = file_name.starts_with("libmpi_abi.so");
    let kind = match (abi, fint, ompi) {
        (true, false, _) => lib_kind::STD_ABI,
        (true, true, _) => lib_kind::UNKNOWN,
        (false, _, true) => lib_kind::OPEN_MPI,
        (false, _, false) => lib_kind::MPICH,
    };
    let name = match (ompi, intel, abi) {
        (true, _, false) => "openmpi",
        (true, _, true) => "openmpi-abi",
        (false, true, false) => "intelmpi",
        (false, true, true) => "intelmpi-abi",
        (false, false, false) => "mpich",
        (false, false, true) => "mpich-abi",
    };
    (kind, name)
}

/// The contents of the file's read-only data sections (`.rodata*`), where
/// the version strings live, concatenated only when there are several.
fn read_only_data<'d>(file: &object::File<'d>, data: &'d [u8]) -> &'d [u8] {
    let ranges: Vec<(u64, u64)> = file
        .sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".rodata")))
        .filter_map(|s| s.file_range())
        .collect();
    let lo = ranges.iter().map(|r| r.0).min();
    let hi = ranges.iter().map(|r| r.0 + r.1).max();
    match (lo, hi) {
        // One span covering them all: sections are laid out in order and
        // whatever lies between two .rodata sections is read-only too.
        (Some(lo), Some(hi)) => data.get(lo as usize..hi as usize).unwrap_or(data),
        _ => data,
    }
}

/// The NUL-terminated strings in `data`.
fn c_strings(data: &[u8]) -> impl Iterator<Item = &[u8]> {
    data.split(|b| *b == 0).filter(|s| !s.is_empty())
}

/// `X.Y` or `X.Y.Z`, optionally followed by a pre-release tag (`a2`, `b1`,
/// `rc3`): a release version as MPICH and Open MPI spell them.
fn is_release_version(s: &[u8]) -> bool {
    let tail = s
        .iter()
        .position(|b| b.is_ascii_alphabetic())
        .unwrap_or(s.len());
    let (nums, tag) = s.split_at(tail);
    let parts: Vec<&[u8]> = nums.split(|b| *b == b'.').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.iter().all(u8::is_ascii_digit))
        && tag.len() <= 4
        && tag.iter().all(u8::is_ascii_alphanumeric)
}

/// Open MPI's version (`OMPI_VERSION`, e.g. "5.0.11"). The repository
/// revision is stored as "vX.Y.Z..." ("v5.0.11rc1" for 5.0.11, "v4.1.4" for
/// 4.1.4: the tag the release was built from); the version is the plain
/// string it starts with. Without one, the revision without its "v".
fn ompi_version(rodata: &[u8]) -> Option<String> {
    let strings: Vec<&[u8]> = c_strings(rodata).collect();
    let rev = strings.iter().find_map(|s| {
        let r = s.strip_prefix(b"v")?;
        (r.len() <= 24
            && r.first().is_some_and(u8::is_ascii_digit)
            && r.iter().filter(|b| **b == b'.').count() == 2
            && r.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'.'))
        .then_some(r)
    })?;
    let version = strings
        .iter()
        .filter(|s| is_release_version(s) && rev.starts_with(s))
        .filter(|s| rev.get(s.len()).is_none_or(|b| !b.is_ascii_digit()))
        .max_by_key(|s| s.len())
        .copied()
        .unwrap_or(rev);
    Some(String::from_utf8_lossy(version).into_owned())
}

/// MPICH's version where `MPII_Version_string` is not exported (MPICH 5
/// hides it): the library keeps its version strings together, the release
/// date (`date` output, or "unreleased development copy") just before the
/// version, as MPICH 4.0 and 5.0 builds and Intel MPI do. Several such
/// pairs must agree.
fn mpich_version(rodata: &[u8]) -> Option<String> {
    const DAYS: [&[u8]; 7] = [
        b"Mon ", b"Tue ", b"Wed ", b"Thu ", b"Fri ", b"Sat ", b"Sun ",
    ];
    let is_date = |s: &[u8]| {
        s == b"unreleased development copy"
            || (DAYS.iter().any(|d| s.starts_with(d))
                && s.len() <= 40
                && s.len() >= 8
                && s[s.len() - 4..].iter().all(u8::is_ascii_digit))
    };
    let mut found: Option<&[u8]> = None;
    let mut prev: &[u8] = b"";
    // Adjacent strings only: split on every NUL, empty pieces included.
    for s in rodata.split(|b| *b == 0) {
        if is_date(prev) && is_release_version(s) {
            if found.is_some_and(|f| f != s) {
                return None;
            }
            found = Some(s);
        }
        prev = s;
    }
    found.map(|v| String::from_utf8_lossy(v).into_owned())
}

/// Intel MPI's own version ("2021.18.1"): its year-based numbers, the one
/// such string the library holds (several copies must agree).
fn intel_version(rodata: &[u8]) -> Option<String> {
    let mut found: Option<&[u8]> = None;
    for s in c_strings(rodata) {
        let year = s.len() >= 6 && s.starts_with(b"20") && s[4] == b'.';
        if year && is_release_version(s) && s[..4].iter().all(u8::is_ascii_digit) {
            if found.is_some_and(|f| f != s) {
                return None;
            }
            found = Some(s);
        }
    }
    found.map(|v| String::from_utf8_lossy(v).into_owned())
}

fn memchr_seq(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The standard name of a function ID.
pub fn name_of(id: u16) -> &'static str {
    FUNCTIONS[id as usize].name
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_entries(p: &Path, lib: &Library) {
        let send = function_by_name("MPI_Send").unwrap();
        assert!(lib.entries.contains_key(&send), "{}", p.display());
        assert!(
            lib.entries.len() > 300,
            "{}: {}",
            p.display(),
            lib.entries.len()
        );
    }

    #[test]
    fn real_libraries_when_present() {
        for (p, kind) in [
            ("/usr/lib/x86_64-linux-gnu/libmpi.so.40", lib_kind::OPEN_MPI),
            ("/usr/lib/x86_64-linux-gnu/libmpich.so.12", lib_kind::MPICH),
        ] {
            if !Path::new(p).exists() {
                continue;
            }
            let lib = read_library(Path::new(p)).unwrap();
            assert_eq!(lib.kind, kind);
            check_entries(Path::new(p), &lib);
            assert_ne!(lib.version, "unknown", "{p}");
            assert!(
                is_release_version(lib.version.as_bytes()),
                "{p}: {}",
                lib.version
            );
        }
    }

    /// Debian's arm64 MPICH (unpacked by `cargo xtask test` into
    /// target/foreign/arm64, which runs the unit tests after): decoded as
    /// arm64 whatever the host is, and a function whose first word the
    /// kernel refuses (`ldr x16, .+8` written over MPI_Send's) moves
    /// from the probed entries to `refused`, the rest unchanged.
    #[test]
    fn arm64_sites_and_a_refused_one() {
        let p = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/foreign/arm64/usr/lib/aarch64-linux-gnu/libmpich.so.12");
        if !p.exists() {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(
                !ci,
                "CI=true and {} is missing (cargo xtask fetch-foreign)",
                p.display()
            );
            eprintln!("SKIPPED: needs {}", p.display());
            return;
        }
        let mut data = std::fs::read(&p).unwrap();
        let lib = parse_library(&data, &p).unwrap();
        check_entries(&p, &lib);
        assert!(lib.refused.is_empty());
        assert!(
            lib.entries
                .values()
                .all(|e| e.skipped == 0 && e.file_offset % 4 == 0)
        );
        let send = function_by_name("MPI_Send").unwrap();
        let at = usize::try_from(lib.entries[&send].file_offset).unwrap();
        data[at..at + 4].copy_from_slice(&0x5800_0050_u32.to_le_bytes());
        let patched = parse_library(&data, &p).unwrap();
        assert!(!patched.entries.contains_key(&send));
        assert!(matches!(
            patched.refused[&send].first_insn,
            FirstInsn::Refused(w) if w.starts_with("ldr")
        ));
        assert_eq!(patched.entries.len() + 1, lib.entries.len());
    }

    /// Where `cargo xtask setup` installs the PyPI wheels:
    /// `<workspace>/target/mpi/NAME/lib`. Missing, the test fails under
    /// `CI=true`; otherwise it falls back to a developer's venvs in
    /// /tmp/venvs, else skips with a message.
    fn wheel_lib(name: &str, venv: &str) -> Option<std::path::PathBuf> {
        let lib = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/mpi")
            .join(name)
            .join("lib");
        if lib.is_dir() {
            return Some(lib);
        }
        let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert!(
            !ci,
            "CI=true and {} is missing: run cargo xtask setup",
            lib.display()
        );
        let dev = Path::new("/tmp/venvs").join(venv).join("lib");
        if dev.is_dir() {
            return Some(dev);
        }
        eprintln!("SKIPPED: {} is missing", lib.display());
        None
    }

    /// The PyPI wheels: exact kinds, names and versions, the MPI-5
    /// standard ABI libraries included.
    #[test]
    fn wheel_libraries() {
        let cases = [
            (
                "openmpi5",
                "ompi5",
                "libmpi.so.40",
                lib_kind::OPEN_MPI,
                "openmpi",
                "5.0.11",
            ),
            (
                "mpich5",
                "mpich5",
                "libmpi.so.12",
                lib_kind::MPICH,
                "mpich",
                "5.0.2",
            ),
            (
                "mpich5",
                "mpich5",
                "libmpi_abi.so.1",
                lib_kind::STD_ABI,
                "mpich-abi",
                "5.0.2",
            ),
            (
                "impi",
                "impi",
                "libmpi.so.12",
                lib_kind::MPICH,
                "intelmpi",
                "2021.18.1",
            ),
            (
                "impi",
                "impi",
                "libmpi_abi.so.1",
                lib_kind::STD_ABI,
                "intelmpi-abi",
                "2021.18.1",
            ),
        ];
        for (dir, venv, file, kind, name, version) in cases {
            let Some(lib_dir) = wheel_lib(dir, venv) else {
                continue;
            };
            // As a process maps it: the file the soname link points to.
            let p = std::fs::canonicalize(lib_dir.join(file)).unwrap();
            let file_name = p.file_name().unwrap().to_str().unwrap();
            assert!(crate::os::procfs::is_mpi_library(file_name), "{file_name}");
            let lib = read_library(&p).unwrap();
            assert_eq!(
                (lib.kind, lib.name, lib.version.as_str()),
                (kind, name, version),
                "{}",
                p.display()
            );
            check_entries(&p, &lib);
        }
    }

    #[test]
    fn kinds_and_names() {
        // (file name, Open MPI symbols, Intel MPI, exports MPI_Status_f2c)
        assert_eq!(
            identify("libmpi.so.40.30.4", true, false, true),
            (lib_kind::OPEN_MPI, "openmpi")
        );
        assert_eq!(
            identify("libmpich.so.12", false, false, true),
            (lib_kind::MPICH, "mpich")
        );
        assert_eq!(
            identify("libmpi.so.12.0.0", false, true, true),
            (lib_kind::MPICH, "intelmpi")
        );
        assert_eq!(
            identify("libmpi_abi.so.1", false, false, false),
            (lib_kind::STD_ABI, "mpich-abi")
        );
        assert_eq!(
            identify("libmpi_abi.so.1.0", false, true, false),
            (lib_kind::STD_ABI, "intelmpi-abi")
        );
        // Named like the ABI but with the old conventions' conversions: no
        // byte figure can be trusted.
        assert_eq!(
            identify("libmpi_abi.so.1", false, false, true),
            (lib_kind::UNKNOWN, "mpich-abi")
        );
    }

    #[test]
    fn version_strings() {
        assert!(is_release_version(b"5.0.2"));
        assert!(is_release_version(b"4.1"));
        assert!(is_release_version(b"3.4a2"));
        assert!(is_release_version(b"5.0.0rc12"));
        assert!(!is_release_version(b"18:2:6"));
        assert!(!is_release_version(b"5"));
        assert!(!is_release_version(b"1.2.3.4"));
        assert!(!is_release_version(b"v5.0.11"));
        let ompi = b"\x00x\x00v5.0.11rc1\x00Open MPI\x00MPI API\x005.0.1\x005.0.11\x00ident\x00";
        assert_eq!(ompi_version(ompi).as_deref(), Some("5.0.11"));
        assert_eq!(
            ompi_version(b"\x00v4.1.4\x00a\x00").as_deref(),
            Some("4.1.4")
        );
        let mpich = b"12:0:0\x00Thu Apr  7 12:34:45 CDT 2022\x004.0.2\x00\x00x\x00";
        assert_eq!(mpich_version(mpich).as_deref(), Some("4.0.2"));
        // Two release dates followed by different versions: no guess.
        let two =
            b"Thu Apr  7 12:34:45 CDT 2022\x004.0.2\x00Fri Sep 25 20:45:26 UTC 2026\x005.0.2\x00";
        assert_eq!(mpich_version(two), None);
        let intel = b"Intel(R) MPI Library %s\n\x002021.18.1\x00x\x002021.18.1\x00";
        assert_eq!(intel_version(intel).as_deref(), Some("2021.18.1"));
    }
}
