//! BPF objects pinned in bpffs across a planned daemon restart (a package
//! upgrade): the old daemon pins its maps and every rank's links under
//! [`DIR`]`/<layout>/` and exits without detaching; the new one opens them
//! again and removes the pins (see `crate::daemon::handover`).
//!
//! Only root (or the daemon's own user) may have written there: [`DIR`]
//! and each directory below must be real directories (never a symlink)
//! owned by the daemon's effective uid with mode 0700, and a pin is opened
//! only if it is not a symlink. Anything else is refused, not followed.

use std::{
    ffi::CString,
    io,
    mem::zeroed,
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd, RawFd},
        unix::fs::{DirBuilderExt as _, MetadataExt as _},
    },
    path::{Path, PathBuf},
};

use aya_obj::generated::{bpf_attr, bpf_cmd};
use thiserror::Error;

use crate::os::sys;

/// Where bpffs is mounted.
pub const ROOT: &str = "/sys/fs/bpf";
/// Our directory in it.
pub const DIR: &str = "/sys/fs/bpf/mpi-observer";
/// `statfs` magic of bpffs.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Errors of the pin directory.
#[derive(Debug, Error)]
pub enum PinError {
    /// bpffs is not mounted and could not be.
    #[error(
        "{path} is not a BPF filesystem and mounting one failed: {source}; mount it (mount -t bpf bpf {path})"
    )]
    Mount {
        /// The mount point.
        path: String,
        /// The OS error.
        source: io::Error,
    },
    /// A directory that is not the daemon's alone.
    #[error(
        "{path} is not a directory of uid {uid} with mode 0700 (a symlink, another owner or open to others); remove it"
    )]
    Untrusted {
        /// The path.
        path: String,
        /// The daemon's effective uid.
        uid: u32,
    },
    /// The probes are attached in a way bpffs cannot hold.
    #[error(
        "this kernel attaches classic uprobes by ioctl ({mechanism}), and a perf event so attached cannot be pinned"
    )]
    NotPinnable {
        /// The attach mechanism.
        mechanism: &'static str,
    },
    /// A file operation failed.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: String,
        /// The OS error.
        source: io::Error,
    },
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> PinError {
    let path = path.display().to_string();
    move |source| PinError::Io { what, path, source }
}

fn euid() -> u32 {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() }
}

/// [`DIR`] if there is one to look in: bpffs mounted at [`ROOT`] and the
/// directory there; `Ok(None)` if not (nothing was handed over), an error
/// if it is not trusted. Makes and mounts nothing.
pub fn existing_dir() -> Result<Option<PathBuf>, PinError> {
    let dir = PathBuf::from(DIR);
    if !is_bpffs(Path::new(ROOT)) || std::fs::symlink_metadata(&dir).is_err() {
        return Ok(None);
    }
    check_dir(&dir)?;
    Ok(Some(dir))
}

/// Removes [`DIR`] if it is empty, so a completed handover leaves nothing.
pub fn remove_dir_if_empty() {
    let _ = std::fs::remove_dir(DIR);
}

/// [`DIR`], checked: bpffs mounted at [`ROOT`] (mounted here if it is not,
/// which takes CAP_SYS_ADMIN), the directory made if absent, and trusted.
pub fn base_dir() -> Result<PathBuf, PinError> {
    if !is_bpffs(Path::new(ROOT)) {
        mount_bpffs()?;
    }
    let dir = PathBuf::from(DIR);
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_err("create", &dir)(e)),
    }
    check_dir(&dir)?;
    Ok(dir)
}

/// Whether `path` is the root of a bpffs mount.
fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs is plain old data; zero is a valid value.
    let mut st: libc::statfs = unsafe { zeroed() };
    // SAFETY: c is NUL-terminated, st a valid out-pointer.
    let r = unsafe { libc::statfs(c.as_ptr(), &mut st) };
    r == 0 && st.f_type as i64 == BPF_FS_MAGIC
}

fn mount_bpffs() -> Result<(), PinError> {
    let err = |source| PinError::Mount {
        path: ROOT.into(),
        source,
    };
    let (src, target, fstype, opts) = (c"bpf", c"/sys/fs/bpf", c"bpf", c"mode=0700");
    // SAFETY: every pointer is a NUL-terminated string literal.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            opts.as_ptr().cast(),
        )
    };
    if r != 0 {
        return Err(err(io::Error::last_os_error()));
    }
    Ok(())
}

/// Refuses `dir` unless it is a real directory, ours, mode 0700.
pub fn check_dir(dir: &Path) -> Result<(), PinError> {
    let m = std::fs::symlink_metadata(dir).map_err(io_err("inspect", dir))?;
    if !m.file_type().is_dir() || m.uid() != euid() || m.mode() & 0o077 != 0 {
        return Err(PinError::Untrusted {
            path: dir.display().to_string(),
            uid: euid(),
        });
    }
    Ok(())
}

/// Makes directory `dir` (mode 0700), which must not exist.
pub fn make_dir(dir: &Path) -> Result<(), PinError> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(io_err("create", dir))
}

/// Pins the BPF object `fd` (a map or a link) at `path`.
pub fn pin(fd: BorrowedFd<'_>, path: &Path) -> Result<(), PinError> {
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io_err("pin", path)(io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: plain old data, zero is the default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    // SAFETY: writing the obj-pin member of a zeroed union.
    let o = unsafe { &mut attr.__bindgen_anon_4 };
    o.pathname = c.as_ptr() as u64;
    o.bpf_fd = fd.as_raw_fd() as u32;
    sys::bpf(bpf_cmd::BPF_OBJ_PIN, &mut attr)
        .map(drop)
        .map_err(io_err("pin", path))
}

/// Opens the object pinned at `path`, which must be a pin (not a symlink
/// nor a directory).
pub fn get(path: &Path) -> Result<OwnedFd, PinError> {
    let m = std::fs::symlink_metadata(path).map_err(io_err("inspect", path))?;
    if !m.file_type().is_file() || m.uid() != euid() {
        return Err(PinError::Untrusted {
            path: path.display().to_string(),
            uid: euid(),
        });
    }
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| io_err("open", path)(io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: plain old data, zero is the default.
    let mut attr: bpf_attr = unsafe { zeroed() };
    // SAFETY: writing the obj-get member of a zeroed union.
    let o = unsafe { &mut attr.__bindgen_anon_4 };
    o.pathname = c.as_ptr() as u64;
    let fd = sys::bpf(bpf_cmd::BPF_OBJ_GET, &mut attr).map_err(io_err("open", path))?;
    // SAFETY: a non-negative return of BPF_OBJ_GET is a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Removes `dir` and every pin in it: a removed pin's object goes when no
/// one else holds it (a link's probes with it). Symlinks are removed, not
/// followed.
pub fn remove_tree(dir: &Path) {
    let _ = std::fs::remove_dir_all(dir);
}

/// The FNV-1a hash of `bytes`, stable across builds and compilers (the
/// daemon that pins and the one that adopts may be built apart).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_is_the_reference() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
