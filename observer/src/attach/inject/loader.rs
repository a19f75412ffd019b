//! The dynamic loader's entry points in the process (`dlopen`, `dlsym`,
//! `dlerror` of its libc), which the stub calls.

use std::path::Path;

use super::*;

/// `dlopen`, `dlsym` and `dlerror` in the process's libc.
pub(super) struct Loader {
    pub(super) dlopen: u64,
    pub(super) dlsym: u64,
    pub(super) dlerror: u64,
}

impl Loader {
    pub(super) fn find(pid: u32, maps: &Maps) -> Result<Loader, InjectError> {
        use object::{Object as _, ObjectSymbol as _, read::elf::ProgramHeader as _};
        let static_err = || InjectError::Static {
            pid,
            comm: procfs::comm(pid),
        };
        let libc = maps
            .lines
            .iter()
            .filter(|m| {
                m.path
                    .as_deref()
                    .and_then(Path::file_name)
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libc.so"))
            })
            .min_by_key(|m| m.start)
            .ok_or_else(static_err)?;
        let data = read_mapped(pid, &libc.entry).map_err(|_| static_err())?;
        let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data)
            .map_err(|_| static_err())?;
        let endian = elf.endian();
        // The load bias: the lowest mapping holds the segment at its offset
        // (both rounded down to the kernel's page, as it maps them).
        let page_mask = !(crate::os::sys::page_size() as u64 - 1);
        let bias = elf
            .elf_program_headers()
            .iter()
            .find(|ph| {
                ph.p_type(endian) == object::elf::PT_LOAD
                    && ph.p_offset(endian) & page_mask == libc.offset
            })
            .and_then(|ph| libc.start.checked_sub(ph.p_vaddr(endian) & page_mask))
            .ok_or_else(static_err)?;
        let find = |name: &str| {
            elf.dynamic_symbols()
                .find(|s| s.name() == Ok(name) && s.is_definition())
                .map(|s| bias + s.address())
                .ok_or_else(static_err)
        };
        Ok(Loader {
            dlopen: find("dlopen")?,
            dlsym: find("dlsym")?,
            dlerror: find("dlerror")?,
        })
    }
}
