//! The process's memory, through `/proc/PID/mem`.

use std::{fs::File, os::unix::fs::FileExt as _};

use super::*;

/// The process's memory, through `/proc/PID/mem` (which writes past page
/// protections, as a debugger's pokes do).
pub(super) struct Mem {
    pub(super) pid: u32,
    pub(super) file: File,
}

impl Mem {
    pub(super) fn open(pid: u32) -> Result<Mem, InjectError> {
        let file = File::options()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|source| os_or_permission(pid, "opening /proc/PID/mem", source))?;
        Ok(Mem { pid, file })
    }

    pub(super) fn write(&self, at: u64, bytes: &[u8]) -> Result<(), InjectError> {
        self.file
            .write_all_at(bytes, at)
            .map_err(|source| InjectError::Os {
                pid: self.pid,
                what: "writing the process's memory",
                source,
            })
    }

    pub(super) fn read(&self, at: u64, buf: &mut [u8]) -> Result<(), InjectError> {
        self.file
            .read_exact_at(buf, at)
            .map_err(|source| match source.raw_os_error() {
                Some(libc::ESRCH) | Some(libc::EIO) if !exists(self.pid) => {
                    InjectError::Gone { pid: self.pid }
                }
                _ => InjectError::Os {
                    pid: self.pid,
                    what: "reading the process's memory",
                    source,
                },
            })
    }

    pub(super) fn u32(&self, at: u64) -> Result<u32, InjectError> {
        let mut b = [0; 4];
        self.read(at, &mut b)?;
        Ok(u32::from_ne_bytes(b))
    }

    pub(super) fn u64(&self, at: u64) -> Result<u64, InjectError> {
        let mut b = [0; 8];
        self.read(at, &mut b)?;
        Ok(u64::from_ne_bytes(b))
    }

    /// A NUL-terminated string of at most 512 bytes.
    pub(super) fn c_string(&self, at: u64) -> Result<String, InjectError> {
        if at == 0 {
            return Ok("no message".into());
        }
        let mut out = Vec::new();
        for i in 0..512u64 {
            let mut b = [0; 1];
            self.read(at + i, &mut b)?;
            if b[0] == 0 {
                break;
            }
            out.push(b[0]);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }
}
