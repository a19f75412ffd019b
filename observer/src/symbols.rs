//! Reading an MPI library's ELF file: which PMPI entry points it defines
//! (and at which file offsets the kernel wants uprobes), which MPI flavour it
//! is, its version, and for Open MPI where its predefined datatypes live.

use std::{collections::BTreeMap, fs, io, path::Path};

use object::{Object as _, ObjectSection as _, ObjectSymbol as _, SymbolKind};
use observer_common::{FUNCTIONS, function_by_name, maps::lib_kind};
use thiserror::Error;

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
    /// Whether the kernel emulates this function's first instruction
    /// (cheap probe) or must single-step it out of line (about 10x dearer).
    pub first_insn_emulated: bool,
    /// The function's first bytes, for `mpi-observer sites`.
    pub first_bytes: [u8; 16],
    /// Bytes of the function skipped before the probe (see
    /// [`skippable_prologue`]); `file_offset` already includes them.
    pub skipped: u8,
}

/// What the daemon needs from an MPI library.
#[derive(Clone, Debug)]
pub struct Library {
    /// [`lib_kind`] value.
    pub kind: u32,
    /// "openmpi" or "mpich".
    pub name: &'static str,
    /// Release version, or "unknown".
    pub version: String,
    /// One entry per unique PMPI function address, by function ID.
    pub entries: BTreeMap<u16, Entry>,
    /// Open MPI: predefined datatype symbols, name to virtual address
    /// relative to the load base.
    pub ompi_datatypes: BTreeMap<String, u64>,
    /// Open MPI: `ompi_datatype_t_class`, relative to the load base.
    pub ompi_datatype_class: Option<u64>,
    /// Virtual address corresponding to file offset 0 (first PT_LOAD's
    /// vaddr minus its offset), to turn symbol values into runtime
    /// addresses: runtime = base + (value - load_bias).
    pub load_bias: u64,
}

/// Reads the library at `path` (a host path).
pub fn read_library(path: &Path) -> Result<Library, SymbolError> {
    let shown = path.display().to_string();
    let data = fs::read(path).map_err(|source| SymbolError::Read {
        path: shown.clone(),
        source,
    })?;
    let file = object::File::parse(&*data).map_err(|source| SymbolError::Parse {
        path: shown.clone(),
        source,
    })?;
    let is_ompi = file
        .dynamic_symbols()
        .any(|s| s.name() == Ok("ompi_mpi_comm_world"));
    let (kind, name) = if is_ompi {
        (lib_kind::OPEN_MPI, "openmpi")
    } else {
        (lib_kind::MPICH, "mpich")
    };
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
    let mut entries = BTreeMap::new();
    for (addr, id) in by_addr {
        let Some(off) = file_offset(&file, addr) else {
            continue;
        };
        let first = function_bytes(&data, off);
        let mut first_bytes = [0u8; 16];
        if let Some(b) = first {
            for (d, s) in first_bytes.iter_mut().zip(b) {
                *d = *s;
            }
        }
        let skipped = first.map_or(0, skippable_prologue);
        let probed = first.and_then(|b| b.get(skipped as usize..));
        entries.insert(
            id,
            Entry {
                id,
                file_offset: off + u64::from(skipped),
                first_insn_emulated: probed.is_some_and(emulated_first_insn),
                first_bytes,
                skipped,
            },
        );
    }
    let version = if is_ompi {
        ompi_version(&data)
    } else {
        version_sym
            .and_then(|(a, n)| {
                let off = file_offset(&file, a)? as usize;
                let bytes = data.get(off..off + n.max(1) as usize)?;
                let s = bytes.split(|b| *b == 0).next()?;
                Some(String::from_utf8_lossy(s).trim().to_string())
            })
            .filter(|s| !s.is_empty())
    }
    .unwrap_or_else(|| "unknown".into());
    Ok(Library {
        kind,
        name,
        version,
        entries,
        ompi_datatypes: if is_ompi {
            ompi_datatypes
        } else {
            BTreeMap::new()
        },
        ompi_datatype_class,
        load_bias,
    })
}

/// Defined data symbols of a file whose names start with `prefix`.
pub struct DataSymbols {
    /// Name to symbol value.
    pub symbols: BTreeMap<String, u64>,
    /// See [`Library::load_bias`].
    pub load_bias: u64,
}

/// Reads the defined dynamic data symbols starting with `prefix`.
pub fn read_data_symbols(path: &Path, prefix: &str) -> Result<DataSymbols, SymbolError> {
    let shown = path.display().to_string();
    let data = fs::read(path).map_err(|source| SymbolError::Read {
        path: shown.clone(),
        source,
    })?;
    let file = object::File::parse(&*data).map_err(|source| SymbolError::Parse {
        path: shown,
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
        let (start, size) = (s.address(), s.size());
        if addr < start || addr >= start + size {
            return None;
        }
        let (off, _) = s.file_range()?;
        Some(addr - start + off)
    })
}

fn function_bytes(data: &[u8], off: u64) -> Option<&[u8]> {
    data.get(off as usize..(off as usize + 16).min(data.len()))
}

/// Whether x86-64 uprobes emulate this first instruction instead of
/// single-stepping it out of line (about 20 us instead of 1.3 us per hit
/// here). Measured on Linux 6.18 with `cargo xtask bench observer`: `push`
/// of a register, one- and multi-byte `nop`, `jmp`, `call` and conditional
/// jumps are emulated; `endbr64`, `mov` between registers, ALU with an
/// immediate (`sub $x,%rsp`) and RIP-relative loads are stepped.
pub fn emulated_first_insn(code: &[u8]) -> bool {
    match code {
        // push %r8..%r15
        [0x41, 0x50..=0x57, ..] => true,
        // push %rax..%rdi
        [0x50..=0x57, ..] => true,
        // nop, jmp rel32/rel8, call rel32, jcc rel8
        [0x90, ..] | [0xe9, ..] | [0xeb, ..] | [0xe8, ..] | [0x70..=0x7f, ..] => true,
        // multi-byte nop (0f 1f /0), jcc rel32 (0f 80..8f)
        [0x0f, 0x1f, ..] | [0x0f, 0x80..=0x8f, ..] => true,
        // endbr64, mov, sub/add $imm, lea, ...: stepped.
        _ => false,
    }
}

/// How many leading bytes of a function the probe may skip so that it sits
/// on an emulated instruction instead of a single-stepped one: about 20 us
/// less per call. Open MPI 4.1 starts `MPI_Test` and `MPI_Waitall` with
/// `mov sym(%rip),%rax` and MPICH 4.0 a dozen functions with
/// `lea sym(%rip),%rax`, each followed by a `push`. Skipping that one
/// instruction is safe because it writes neither an argument register nor
/// %rsp (so the arguments and the return address the uretprobe needs are
/// still where the entry has them), and the `push` after it belongs to the
/// prologue, which no branch inside the function targets. Anything else is
/// probed at its first byte.
pub fn skippable_prologue(code: &[u8]) -> u8 {
    match code {
        // REX.W (no REX.R), mov or lea, ModRM mod=00 rm=101 (RIP-relative),
        // reg = rax or rbx; then push.
        [0x48, 0x8b | 0x8d, m, _, _, _, _, rest @ ..]
            if m & 0xc7 == 0x05
                && matches!((m >> 3) & 7, 0 | 3)
                && matches!(rest, [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..]) =>
        {
            7
        }
        _ => 0,
    }
}

fn ompi_version(data: &[u8]) -> Option<String> {
    // OMPI_VERSION is stored as "\0vX.Y.Z\0".
    let mut i = 0;
    while let Some(p) = memchr_seq(&data[i..], b"\0v") {
        let s = i + p + 2;
        let end = data[s..].iter().position(|b| *b == 0).map(|e| s + e)?;
        let cand = &data[s..end];
        if cand.len() <= 24
            && cand.first().is_some_and(u8::is_ascii_digit)
            && cand.iter().filter(|b| **b == b'.').count() == 2
            && cand.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'.')
        {
            return Some(String::from_utf8_lossy(cand).into_owned());
        }
        i = s;
    }
    None
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

    #[test]
    fn first_instruction_classes() {
        // As measured by the probe-cost benchmark on Linux 6.18.
        assert!(emulated_first_insn(&[0x41, 0x57]));
        assert!(emulated_first_insn(&[0x55]));
        assert!(emulated_first_insn(&[0x0f, 0x1f, 0x44, 0x00]));
        assert!(emulated_first_insn(&[0x74, 0x05]));
        assert!(!emulated_first_insn(&[0xf3, 0x0f, 0x1e, 0xfa]));
        assert!(!emulated_first_insn(&[0x48, 0x89, 0xe5]));
        assert!(!emulated_first_insn(&[0x48, 0x83, 0xec, 0x18]));
    }

    #[test]
    fn rip_relative_loads_before_a_push_are_skipped() {
        // Open MPI's MPI_Test: mov 0x8a001(%rip),%rax; push %r15
        assert_eq!(
            skippable_prologue(&[0x48, 0x8b, 0x05, 0x01, 0xa0, 0x08, 0x00, 0x41, 0x57]),
            7
        );
        // MPICH: lea ...(%rip),%rax; push %rbx
        assert_eq!(
            skippable_prologue(&[0x48, 0x8d, 0x05, 0x01, 0x04, 0x3e, 0x00, 0x53]),
            7
        );
        // Open MPI's MPI_Finalize: the load is followed by a compare, not a push.
        assert_eq!(
            skippable_prologue(&[0x48, 0x8b, 0x05, 0x81, 0xfd, 0x09, 0x00, 0x80]),
            0
        );
        // Into %rdi, an argument register: never skipped.
        assert_eq!(skippable_prologue(&[0x48, 0x8d, 0x3d, 0, 0, 0, 0, 0x53]), 0);
        // sub $8,%rsp moves the return address: never skipped.
        assert_eq!(skippable_prologue(&[0x48, 0x83, 0xec, 0x08, 0x53]), 0);
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
            let send = function_by_name("MPI_Send").unwrap();
            assert!(lib.entries.contains_key(&send), "{p}");
            assert!(lib.entries.len() > 300, "{p}: {}", lib.entries.len());
            assert_ne!(lib.version, "unknown", "{p}");
        }
    }
}
