//! `mpi-observer shim-path` and `mpi-observer run`: the layering shim's
//! launcher, the "prepended script" of Open MPI PR 6245.
//!
//! `mpirun -np 4 mpi-observer run --tools a.so,b.so -- ./app` runs this in
//! every rank: it sets `MPI_TOOLS_ENTRY`, puts the shim first in
//! `LD_PRELOAD` (and the tool libraries after it with the `preload`
//! keyword), then execs the application in place, so the rank keeps its pid
//! and its launcher's environment.

use std::{
    convert::Infallible,
    ffi::{OsStr, OsString},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Command,
};

/// The list parser, shared source with the shim: the shim is a cdylib and
/// cannot be a dependency, and both sides must read a list the same way.
#[path = "../../../shim/src/config.rs"]
#[expect(
    dead_code,
    reason = "the launcher needs only the preload half of the shared parser"
)]
pub(crate) mod tools_list;

use tools_list::{ConfigError, LIST_VARS, ToolsList};

/// The shim's file name, as cargo builds it and as it is installed.
pub const SHIM_FILE: &str = "libmpi_observer_shim.so";

/// Why the launcher cannot start the command.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The path of the running executable cannot be read.
    #[error("cannot locate the running executable: {source}")]
    CurrentExe {
        /// What `/proc/self/exe` said.
        source: std::io::Error,
    },
    /// The shim is neither beside the executable nor in the install layout.
    #[error("{SHIM_FILE} not found: looked for {beside} and {installed}")]
    ShimNotFound {
        /// Beside the executable (a cargo build).
        beside: PathBuf,
        /// `../lib/mpi-observer/` from the executable (an install).
        installed: PathBuf,
    },
    /// The tools list does not parse.
    #[error("tools list `{list}`: {source}")]
    ToolsList {
        /// The list as given.
        list: String,
        /// What is wrong with it.
        source: ConfigError,
    },
    /// `run` was given no command.
    #[error("no command to run: use `mpi-observer run [--tools LIST] -- CMD...`")]
    NoCommand,
    /// `exec` failed (not found, not executable, ...).
    #[error("cannot run {program}: {source}")]
    Exec {
        /// The command.
        program: String,
        /// What `execvp` said.
        source: std::io::Error,
    },
}

/// The absolute path of the shim: beside the running executable, else in
/// `../lib/mpi-observer/` relative to it.
pub fn shim_path() -> Result<PathBuf, LaunchError> {
    let exe = std::env::current_exe().map_err(|source| LaunchError::CurrentExe { source })?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let beside = dir.join(SHIM_FILE);
    let installed = dir.join("../lib/mpi-observer").join(SHIM_FILE);
    let found = [&beside, &installed]
        .into_iter()
        .find_map(|p| p.canonicalize().ok());
    found.ok_or(LaunchError::ShimNotFound { beside, installed })
}

/// Sets up the environment for the shim and execs `cmd`; returns only on
/// failure. `tools`, if given, becomes `MPI_TOOLS_ENTRY`; otherwise the list
/// already in the environment is used (for its `preload` keyword).
pub fn run(tools: Option<&str>, cmd: &[OsString]) -> Result<Infallible, LaunchError> {
    let (program, args) = cmd.split_first().ok_or(LaunchError::NoCommand)?;
    let shim = shim_path()?;
    let list_text = match tools {
        Some(t) => t.to_string(),
        None => LIST_VARS
            .iter()
            .find_map(|v| std::env::var(v).ok())
            .unwrap_or_default(),
    };
    let list = ToolsList::parse(&list_text).map_err(|source| LaunchError::ToolsList {
        list: list_text.clone(),
        source,
    })?;
    let mut c = Command::new(program);
    c.args(args);
    if let Some(t) = tools {
        // MPI_TOOLS_ENTRY wins over an inherited OMPI_MCA_ompi_tools_entry.
        c.env(LIST_VARS[0], t);
    }
    c.env(
        "LD_PRELOAD",
        preload_value(&shim, &list, std::env::var_os("LD_PRELOAD").as_deref()),
    );
    let source = c.exec();
    Err(LaunchError::Exec {
        program: program.to_string_lossy().into_owned(),
        source,
    })
}

/// The new `LD_PRELOAD`: the shim first (it must define `MPI_X` before any
/// tool or MPI library does), then the tools when the list says `preload`,
/// then what was there, without repeating the shim.
fn preload_value(shim: &Path, list: &ToolsList, existing: Option<&OsStr>) -> OsString {
    let mut parts: Vec<OsString> = vec![shim.as_os_str().to_owned()];
    if list.preload {
        parts.extend(list.preload_names().into_iter().map(OsString::from));
    }
    if let Some(old) = existing {
        // ld.so accepts both separators.
        for p in old
            .to_string_lossy()
            .split([':', ' '])
            .filter(|p| !p.is_empty())
        {
            if Path::new(p) != shim && Path::new(p).file_name() != Some(OsStr::new(SHIM_FILE)) {
                parts.push(p.into());
            }
        }
    }
    parts.join(OsStr::new(":"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_goes_first_and_tools_only_with_preload() {
        let shim = Path::new("/opt/lib/libmpi_observer_shim.so");
        let plain = ToolsList::parse("./a.so,wrap,v").unwrap();
        assert_eq!(
            preload_value(shim, &plain, None),
            "/opt/lib/libmpi_observer_shim.so"
        );
        let pre = ToolsList::parse("preload,./a.so,wrap,fort,stats").unwrap();
        assert_eq!(
            preload_value(
                shim,
                &pre,
                Some(OsStr::new("libx.so /old/libmpi_observer_shim.so:liby.so"))
            ),
            "/opt/lib/libmpi_observer_shim.so:./a.so:libwrap.so:libx.so:liby.so"
        );
    }
}
