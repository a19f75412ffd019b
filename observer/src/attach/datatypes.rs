//! Open MPI's predefined datatypes are objects at the addresses of known
//! symbols (`ompi_mpi_int`, ...). We find them in the library, check in the
//! live process that the object layout is the one we expect, and hand the
//! probes an address-to-size table plus, when the layout checks out, the
//! means to read a derived datatype's size safely.

use std::{collections::BTreeMap, fs::File, os::unix::fs::FileExt as _};

use observer_common::maps::{ProcConfig, lib_kind};

use crate::{
    attach::symbols::{self, Library},
    os::procfs::{self, MappedLib},
};

/// Offset of `size` in `opal_datatype_t` for release builds of Open MPI 4.x
/// and 5.x: after `opal_object_t` (class pointer, refcount: 16 bytes) come
/// `flags`, `id` (u16 each) and `bdt_used` (u32).
const OMPI_SIZE_OFFSET: u64 = 24;

/// Sizes that hold for every LP64 Open MPI build, used to validate the
/// layout (and as the table itself when validation is impossible).
const KNOWN: &[(&str, u64)] = &[
    ("ompi_mpi_char", 1),
    ("ompi_mpi_signed_char", 1),
    ("ompi_mpi_unsigned_char", 1),
    ("ompi_mpi_byte", 1),
    ("ompi_mpi_packed", 1),
    ("ompi_mpi_short", 2),
    ("ompi_mpi_unsigned_short", 2),
    ("ompi_mpi_int", 4),
    ("ompi_mpi_unsigned", 4),
    ("ompi_mpi_long", 8),
    ("ompi_mpi_unsigned_long", 8),
    ("ompi_mpi_long_long_int", 8),
    ("ompi_mpi_unsigned_long_long", 8),
    ("ompi_mpi_float", 4),
    ("ompi_mpi_double", 8),
    ("ompi_mpi_int8_t", 1),
    ("ompi_mpi_uint8_t", 1),
    ("ompi_mpi_int16_t", 2),
    ("ompi_mpi_uint16_t", 2),
    ("ompi_mpi_int32_t", 4),
    ("ompi_mpi_uint32_t", 4),
    ("ompi_mpi_int64_t", 8),
    ("ompi_mpi_uint64_t", 8),
    ("ompi_mpi_aint", 8),
    ("ompi_mpi_offset", 8),
    ("ompi_mpi_count", 8),
    ("ompi_mpi_2int", 8),
    ("ompi_mpi_c_bool", 1),
];

/// The result of inspecting a process's Open MPI datatypes.
#[derive(Debug, Default)]
pub struct Datatypes {
    /// Runtime address to size in bytes.
    pub sizes: BTreeMap<u64, u64>,
    /// Class pointer and size offset for derived types, if validated.
    pub derived: Option<(u64, u64)>,
}

fn read_u64(mem: &File, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    mem.read_exact_at(&mut b, addr).ok()?;
    Some(u64::from_ne_bytes(b))
}

/// Runtime address of a symbol value in the mapped library.
pub fn runtime_addr(lib: &Library, map: &MappedLib, value: u64) -> u64 {
    map.base.wrapping_sub(map.base_offset) + value.wrapping_sub(lib.load_bias)
}

/// Where the executable defines (copies) Open MPI's datatype objects.
///
/// A position-dependent or PIE executable that names `MPI_INT` gets a copy
/// relocation: the object the program (and, through symbol interposition,
/// the library too) actually uses lives in the executable, not at the
/// library's own address. Returns name to runtime address.
fn executable_copies(pid: u32) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else {
        return out;
    };
    let Some(map) = procfs::mapping_of(pid, &exe) else {
        return out;
    };
    // The executable's lowest mapping, read as the process maps it (the
    // user may have replaced the path since), within the size cap.
    let Some(entry) = procfs::maps(pid).ok().and_then(|maps| {
        maps.into_iter()
            .find(|m| m.start == map.base && m.path.as_deref() == Some(&*exe))
    }) else {
        return out;
    };
    let Ok(lib) = symbols::read_data_symbols(pid, &entry, "ompi_mpi_") else {
        return out;
    };
    for (name, value) in lib.symbols {
        out.insert(
            name,
            map.base.wrapping_sub(map.base_offset) + value.wrapping_sub(lib.load_bias),
        );
    }
    out
}

/// Where a process's Open MPI datatype objects live: found once, from its
/// library's and executable's symbols (reading the executable, which may
/// be large), and then looked at in its memory as often as needed
/// ([`check`]).
#[derive(Clone, Debug, Default)]
pub struct Located {
    /// Each datatype symbol's runtime address (the executable's copy if it
    /// has one).
    addrs: BTreeMap<String, u64>,
    /// The runtime address of `ompi_datatype_t_class`, if the library
    /// names it.
    derived_class: Option<u64>,
}

/// Finds where `pid`'s Open MPI datatypes are; empty for other libraries.
pub fn locate(pid: u32, lib: &Library, map: &MappedLib) -> Located {
    if lib.kind != lib_kind::OPEN_MPI {
        return Located::default();
    }
    let copies = executable_copies(pid);
    let names = lib
        .ompi_datatypes
        .keys()
        .map(String::as_str)
        .chain(KNOWN.iter().map(|(n, _)| *n));
    let addrs = names
        .filter_map(|name| {
            let a = copies.get(name).copied().or_else(|| {
                lib.ompi_datatypes
                    .get(name)
                    .map(|v| runtime_addr(lib, map, *v))
            })?;
            Some((name.to_string(), a))
        })
        .collect();
    Located {
        addrs,
        derived_class: lib.ompi_datatype_class.map(|c| runtime_addr(lib, map, c)),
    }
}

/// Inspects `pid`'s Open MPI datatypes: [`locate`], then [`check`].
pub fn inspect(pid: u32, lib: &Library, map: &MappedLib) -> Datatypes {
    check(pid, &locate(pid, lib, map))
}

/// Reads `pid`'s datatypes where `at` says they are. Never fails: what
/// cannot be verified is left out, and those calls' bytes are counted as
/// unknown. Cheap (a few dozen 8-byte reads of its memory): a rank still
/// in its MPI_Init is looked at again until they check out.
pub fn check(pid: u32, at: &Located) -> Datatypes {
    let mut out = Datatypes::default();
    if at.addrs.is_empty() {
        return out;
    }
    let addr = |name: &str| at.addrs.get(name).copied();
    // The fixed LP64 sizes: the whole table when the layout cannot be
    // checked, and the reference the check compares against.
    let known = || {
        KNOWN
            .iter()
            .filter_map(|(name, size)| Some((addr(name)?, *size)))
    };
    let Ok(mem) = File::open(format!("/proc/{pid}/mem")) else {
        out.sizes.extend(known());
        return out;
    };
    let class = |a: u64| read_u64(&mem, a);
    // Validate: every known type must carry the same class pointer and its
    // documented size at OMPI_SIZE_OFFSET.
    let mut predefined_class = None;
    let mut valid = true;
    for (name, size) in KNOWN {
        let Some(a) = addr(name) else { continue };
        let (Some(c), Some(s)) = (class(a), read_u64(&mem, a + OMPI_SIZE_OFFSET)) else {
            valid = false;
            break;
        };
        if s != *size || predefined_class.is_some_and(|p| p != c) || c == 0 {
            valid = false;
            break;
        }
        predefined_class = Some(c);
    }
    let Some(pclass) = predefined_class.filter(|_| valid) else {
        out.sizes.extend(known());
        return out;
    };
    for &a in at.addrs.values() {
        if class(a) != Some(pclass) {
            continue;
        }
        if let Some(s) = read_u64(&mem, a + OMPI_SIZE_OFFSET).filter(|s| *s > 0 && *s <= 1 << 20) {
            out.sizes.insert(a, s);
        }
    }
    // Derived types are created as ompi_datatype_t objects: trust their
    // size field only when their class is ompi_datatype_t_class.
    if let Some(c) = at.derived_class {
        out.derived = Some((c, OMPI_SIZE_OFFSET));
    }
    out
}

/// The per-process configuration the probes read.
pub fn proc_config(lib: &Library, dt: &Datatypes, bytes: bool) -> ProcConfig {
    let (class, offset) = dt.derived.unwrap_or((0, 0));
    ProcConfig {
        lib: lib.kind,
        bytes: u32::from(bytes),
        ompi_dt_class: class,
        ompi_dt_size_offset: offset,
        max_sites: observer_common::maps::DEFAULT_MAX_SITES,
        ..ProcConfig::default()
    }
}
