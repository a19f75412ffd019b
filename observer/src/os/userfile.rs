//! Opening files that users control: the libraries and executables a rank
//! maps. The daemon runs as root and the path in `/proc/PID/maps` is the
//! user's to change after the mapping was made (a symlink, a FIFO, a
//! device, a sparse file of any size), so a file is read only if it is the
//! one the process maps, a regular file, and within a size cap, and opening
//! it can never block:
//!
//! 1. `/proc/PID/map_files/START-END` names exactly the mapped file (the
//!    kernel's own reference, not a path lookup), so it is opened first.
//! 2. Where that is refused (an unprivileged `--no-bpf` daemon) or gone (the
//!    process exited), the path is opened through the process's root, then
//!    as seen by the daemon, with `O_NOFOLLOW | O_NONBLOCK` (a FIFO opens
//!    without waiting for a writer), and kept only if its device and inode
//!    are those of the maps line. `fstat` and the maps line may disagree
//!    for the very same file: on overlayfs (containers, and the test VMs'
//!    target directory) kernels before 6.8 or so show the upper or lower
//!    layer's device in maps and the overlay's in `fstat`. So where they
//!    differ, the daemon maps the opened file itself, without touching a
//!    byte of it, and asks its own maps how the kernel shows that mapping:
//!    the same file is shown the same way, whatever the file system.
//!
//! Either way the file must be a regular file no larger than the cap, and
//! it is read with a bounded read.

use std::{
    fs::{File, OpenOptions},
    io::{self, Read as _},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
};

use thiserror::Error;

use crate::os::procfs::MapEntry;

/// Why a user's file was not read.
#[derive(Debug, Error)]
pub enum UserFileError {
    /// No way of opening it worked.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The path as the process maps it.
        path: String,
        /// The last error.
        source: io::Error,
    },
    /// Not a regular file (a FIFO, a device, a directory...).
    #[error("{path} is not a regular file; only regular files are read")]
    NotRegular {
        /// The path.
        path: String,
    },
    /// The path now names another file than the one mapped.
    #[error("{path} is no longer the file the process maps (it was replaced); not read")]
    Replaced {
        /// The path.
        path: String,
    },
    /// Larger than the cap.
    #[error(
        "{path} is {size} bytes, over the {cap}-byte cap for files read from user processes; raise --max-file-size if it is genuine"
    )]
    TooLarge {
        /// The path.
        path: String,
        /// Its size.
        size: u64,
        /// The cap.
        cap: u64,
    },
    /// Reading failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The I/O error.
        source: io::Error,
    },
}

/// Default cap on a file read from a user process: far above any MPI
/// library or application binary (Debian's liblammps is 40 MB with its
/// symbols), far below what would hurt the daemon.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 512 << 20;

/// A user's file, opened safely: the descriptor and what `fstat` said.
#[derive(Debug)]
pub struct UserFile {
    /// The open file.
    pub file: File,
    /// Its device (`st_dev`).
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time, nanoseconds since the epoch: with the device
    /// and inode, the key of anything cached about the file.
    pub mtime_ns: i128,
    /// The path as the process sees it, for messages.
    pub shown: String,
}

impl UserFile {
    /// The cache key of the file's contents: device, inode, size and
    /// modification time.
    pub fn key(&self) -> FileKey {
        FileKey {
            dev: self.dev,
            ino: self.ino,
            size: self.size,
            mtime_ns: self.mtime_ns,
        }
    }

    /// Reads the whole file (its size was checked against the cap when it
    /// was opened; a file that grew since is cut at that size plus one byte
    /// and refused).
    pub fn read_all(&mut self) -> Result<Vec<u8>, UserFileError> {
        let mut data = Vec::with_capacity(self.size as usize);
        (&mut self.file)
            .take(self.size + 1)
            .read_to_end(&mut data)
            .map_err(|source| UserFileError::Read {
                path: self.shown.clone(),
                source,
            })?;
        if data.len() as u64 > self.size {
            return Err(UserFileError::Replaced {
                path: self.shown.clone(),
            });
        }
        Ok(data)
    }
}

/// What identifies a file's contents for a cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileKey {
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Size.
    pub size: u64,
    /// Modification time in nanoseconds.
    pub mtime_ns: i128,
}

fn open_nonblocking(path: &Path, nofollow: bool) -> io::Result<File> {
    let mut flags = libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC;
    if nofollow {
        flags |= libc::O_NOFOLLOW;
    }
    OpenOptions::new().read(true).custom_flags(flags).open(path)
}

/// `makedev` of a maps line's `major:minor`.
fn dev_of(d: (u32, u32)) -> u64 {
    libc::makedev(d.0, d.1)
}

/// Opens the file of mapping `m` of process `pid`, checked as the module
/// says, within `cap` bytes.
pub fn open_mapped(pid: u32, m: &MapEntry, cap: u64) -> Result<UserFile, UserFileError> {
    let shown = m
        .path
        .as_deref()
        .map_or_else(|| "[anonymous]".to_string(), |p| p.display().to_string());
    let map_files = PathBuf::from(format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end));
    // The kernel's own link to the mapped file: following it is safe, it
    // cannot be redirected by the process.
    let mut last = match open_nonblocking(&map_files, false) {
        Ok(f) => return checked(f, None, shown, cap),
        Err(e) => e,
    };
    let mut tried: Vec<PathBuf> = Vec::new();
    if let Some(p) = m.host_path(pid) {
        tried.push(p);
    }
    if let Some(p) = &m.path {
        tried.push(p.clone());
    }
    let want = Some((dev_of(m.dev), m.inode));
    for p in tried {
        match open_nonblocking(&p, true) {
            Ok(f) => return checked(f, want, shown, cap),
            Err(e) => last = e,
        }
    }
    Err(UserFileError::Open {
        path: shown,
        source: last,
    })
}

/// Opens `path` (no symlink followed at its last component, never
/// blocking) if it is the regular file with device and inode `want` and at
/// most `cap` bytes.
pub fn open_expected(path: &Path, want: (u64, u64), cap: u64) -> Result<UserFile, UserFileError> {
    let shown = path.display().to_string();
    let f = open_nonblocking(path, true).map_err(|source| UserFileError::Open {
        path: shown.clone(),
        source,
    })?;
    checked(f, Some(want), shown, cap)
}

/// Whether `file` (with metadata `meta`) is the file a maps line shows as
/// device and inode `want`: by `fstat`, or else, for a regular file only,
/// by how the kernel shows a mapping of it (see the module's
/// documentation). A path a user controls may lead to a device through a
/// directory symlink, and mapping a device can have effects: never done.
pub fn is_mapped_file(file: &File, meta: &std::fs::Metadata, want: (u64, u64)) -> bool {
    want == (meta.dev(), meta.ino())
        || (meta.file_type().is_file() && shown_in_maps(file).is_ok_and(|s| s == want))
}

/// How `/proc/self/maps` shows a mapping of `file`: its device and inode
/// as maps lines give them, to compare with another process's maps line
/// (see the module's documentation). The file is mapped one page, read
/// only and private, and unmapped again; no byte of it is read, so a file
/// truncated meanwhile faults nobody.
fn shown_in_maps(file: &File) -> io::Result<(u64, u64)> {
    use std::os::fd::AsRawFd as _;
    let page = crate::os::sys::page_size();
    // SAFETY: a new private read-only mapping at an address the kernel
    // picks; it aliases no memory of ours and is never dereferenced.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let shown = std::fs::read("/proc/self/maps").map(|text| {
        crate::os::procfs::parse_maps(&text)
            .into_iter()
            .find(|m| m.start == addr as u64)
            .map(|m| (dev_of(m.dev), m.inode))
    });
    // SAFETY: the mapping made above, of that length, unused since.
    unsafe { libc::munmap(addr, page) };
    shown?.ok_or_else(|| io::Error::other("our own mapping is not in /proc/self/maps"))
}

fn checked(
    file: File,
    want: Option<(u64, u64)>,
    shown: String,
    cap: u64,
) -> Result<UserFile, UserFileError> {
    let meta = file.metadata().map_err(|source| UserFileError::Open {
        path: shown.clone(),
        source,
    })?;
    if !meta.file_type().is_file() {
        return Err(UserFileError::NotRegular { path: shown });
    }
    if want.is_some_and(|w| !is_mapped_file(&file, &meta, w)) {
        return Err(UserFileError::Replaced { path: shown });
    }
    if meta.len() > cap {
        return Err(UserFileError::TooLarge {
            path: shown,
            size: meta.len(),
            cap,
        });
    }
    Ok(UserFile {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.len(),
        mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        file,
        shown,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::os::procfs;

    fn own_exe_mapping() -> MapEntry {
        let exe = std::fs::read_link("/proc/self/exe").unwrap();
        procfs::maps(std::process::id())
            .unwrap()
            .into_iter()
            .find(|m| m.path.as_deref() == Some(&*exe))
            .unwrap()
    }

    #[test]
    fn the_mapped_file_opens_and_reads_whole() {
        let m = own_exe_mapping();
        let mut f = open_mapped(std::process::id(), &m, DEFAULT_MAX_FILE_SIZE).unwrap();
        assert_eq!(f.ino, m.inode);
        let data = f.read_all().unwrap();
        assert_eq!(data.len() as u64, f.size);
        assert_eq!(&data[..4], b"\x7fELF");
    }

    #[test]
    fn the_cap_refuses_a_large_file() {
        let m = own_exe_mapping();
        let e = open_mapped(std::process::id(), &m, 1000).unwrap_err();
        assert!(
            matches!(e, UserFileError::TooLarge { cap: 1000, .. }),
            "{e}"
        );
    }

    #[test]
    fn fifos_devices_symlinks_and_replacements_are_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("userfile-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("libmpi.so.40");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // No writer: a blocking open would wait forever.
        let e = open_expected(&fifo, (0, 0), DEFAULT_MAX_FILE_SIZE).unwrap_err();
        assert!(matches!(e, UserFileError::NotRegular { .. }), "{e}");
        let e = open_expected(Path::new("/dev/zero"), (0, 0), u64::MAX).unwrap_err();
        assert!(matches!(e, UserFileError::NotRegular { .. }), "{e}");
        let link = dir.join("link.so");
        symlink("/dev/zero", &link).unwrap();
        let e = open_expected(&link, (0, 0), u64::MAX).unwrap_err();
        assert!(matches!(e, UserFileError::Open { .. }), "{e}");
        let real = dir.join("real.so");
        std::fs::write(&real, b"x").unwrap();
        let e = open_expected(&real, (1, 1), u64::MAX).unwrap_err();
        assert!(matches!(e, UserFileError::Replaced { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_is_shown_in_maps_as_another_process_sees_it() {
        // Our executable, as our own maps line shows it (what a rank's
        // maps line would show), and as mapping it again shows it.
        let m = own_exe_mapping();
        let f = File::open(m.path.as_deref().unwrap()).unwrap();
        assert_eq!(shown_in_maps(&f).unwrap(), (dev_of(m.dev), m.inode));
        // Another file is another identity, and an empty one maps too.
        let dir = std::env::temp_dir().join(format!("userfile-maps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.so");
        std::fs::write(&empty, b"").unwrap();
        let md = std::fs::metadata(&empty).unwrap();
        let shown = shown_in_maps(&File::open(&empty).unwrap()).unwrap();
        assert_eq!(shown.1, md.ino());
        assert_ne!(shown, (dev_of(m.dev), m.inode));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
