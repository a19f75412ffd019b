//! Size in bytes of an MPI datatype handle, or `None` where it cannot be read
//! safely. A wrong size is worse than none: unknown sizes are counted apart.

use aya_ebpf::helpers::bpf_probe_read_user;
use observer_common::{
    maps::{ProcConfig, TypeKey, lib_kind},
    std_abi,
};

use crate::OMPI_TYPES;

/// MPICH builtin handles: kind bits 30..32 = BUILTIN (01), object bits
/// 26..30 = DATATYPE (0011); the size sits in bits 8..16.
const MPICH_BUILTIN_DATATYPE_MASK: u32 = 0xfc00_0000;
const MPICH_BUILTIN_DATATYPE: u32 = 0x4c00_0000;

#[inline(always)]
pub fn size(tgid: u32, cfg: &ProcConfig, handle: u64) -> Option<u64> {
    match cfg.lib {
        lib_kind::MPICH => {
            let h = handle as u32;
            if h & MPICH_BUILTIN_DATATYPE_MASK != MPICH_BUILTIN_DATATYPE {
                return None;
            }
            let s = (h >> 8) & 0xff;
            (s != 0).then_some(u64::from(s))
        }
        // Predefined handles only: derived ones are the library's pointers.
        lib_kind::STD_ABI => std_abi::datatype_size(handle),
        lib_kind::OPEN_MPI => {
            let key = TypeKey {
                tgid,
                pad: 0,
                addr: handle,
            };
            // SAFETY: an OMPI_TYPES value (a preallocated map), whose memory
            // the kernel keeps for the program's run; copied out at once.
            if let Some(s) = unsafe { OMPI_TYPES.get(&key) } {
                return Some(*s);
            }
            // A derived type: trust its size field only if the object's class
            // pointer says it is a datatype and the layout was validated at
            // attach time against the predefined types.
            if cfg.ompi_dt_size_offset == 0 || handle < 4096 {
                return None;
            }
            // SAFETY: the handle is the rank's to choose, but the helper
            // checks the user address and fails rather than faults on a bad
            // one; any u64 is a valid value.
            let class: u64 = unsafe { bpf_probe_read_user(handle as *const u64) }.ok()?;
            if class != cfg.ompi_dt_class {
                return None;
            }
            // SAFETY: as above: a checked read of user memory.
            unsafe { bpf_probe_read_user((handle + cfg.ompi_dt_size_offset) as *const u64) }.ok()
        }
        _ => None,
    }
}
