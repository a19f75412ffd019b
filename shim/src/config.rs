//! The tools list: `MPI_TOOLS_ENTRY`, else `OMPI_MCA_ompi_tools_entry`.
//!
//! This file is also compiled into the `mpi-observer` launcher (with
//! `#[path]`), because the shim is a cdylib and cannot be a dependency: the
//! launcher and the shim must agree on what an entry means. Keep it free of
//! anything but `std` and `thiserror`.

/// Environment variables holding the list, in order of precedence.
pub const LIST_VARS: [&str; 2] = ["MPI_TOOLS_ENTRY", "OMPI_MCA_ompi_tools_entry"];

/// Keywords an entry may be instead of a library.
pub const KEYWORDS: &str = "v, fort, fortran, preload, stats";

/// The variable that turns the `stats` layer's call-site table off.
pub const CALLSITES_VAR: &str = "MPI_OBSERVER_CALLSITES";

/// Whether the `stats` layer records call sites: yes unless
/// [`CALLSITES_VAR`] is `0`, `off`, `no` or `false` (any case).
pub fn callsites_from_env() -> bool {
    std::env::var(CALLSITES_VAR).map_or(true, |v| callsites_value(&v))
}

/// [`callsites_from_env`] for one value of the variable.
fn callsites_value(v: &str) -> bool {
    !["0", "off", "no", "false"]
        .iter()
        .any(|off| v.trim().eq_ignore_ascii_case(off))
}

/// One layer the list asks for, in list order (top first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layer {
    /// A PMPI tool library.
    Library {
        /// The entry as written in the list, for messages.
        entry: String,
        /// What to hand `dlopen`: a path, a name the loader searches for, or
        /// `libNAME.so` for a short name.
        load_as: String,
        /// The entry was a bare word: it may have been meant as a keyword.
        short: bool,
    },
    /// The MPI library's Fortran bindings (`fort`/`fortran`).
    Fortran,
    /// The built-in statistics layer (`stats`).
    Stats,
}

/// A parsed tools list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ToolsList {
    /// The layers, top first, without the MPI library at the bottom and
    /// without the default Fortran layer (see [`ToolsList::with_fortran`]).
    pub layers: Vec<Layer>,
    /// `v`: print the resolved layers once on stderr.
    pub verbose: bool,
    /// `preload`: the launcher also puts the tool libraries in `LD_PRELOAD`.
    pub preload: bool,
}

/// Why a tools list is unusable.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `fort`/`fortran` appears more than once; the Fortran layer is one level.
    #[error("tools entry `{entry}`: the fortran layer is listed twice")]
    FortranTwice {
        /// The second occurrence.
        entry: String,
    },
    /// `stats` appears more than once; the built-in layer has one state.
    #[error("tools entry `{entry}`: the stats layer is listed twice")]
    StatsTwice {
        /// The second occurrence.
        entry: String,
    },
}

impl ToolsList {
    /// Reads the list from the environment; an unset or empty list is a
    /// pure pass-through.
    pub fn from_env() -> Result<ToolsList, ConfigError> {
        let raw = LIST_VARS
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
            .unwrap_or_default();
        ToolsList::parse(&raw)
    }

    /// Parses a comma-separated list. Empty entries are ignored, so trailing
    /// commas are harmless.
    pub fn parse(list: &str) -> Result<ToolsList, ConfigError> {
        let mut out = ToolsList::default();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let layer = match entry {
                "v" => {
                    out.verbose = true;
                    continue;
                }
                "preload" => {
                    out.preload = true;
                    continue;
                }
                "fort" | "fortran" => {
                    if out.layers.contains(&Layer::Fortran) {
                        return Err(ConfigError::FortranTwice {
                            entry: entry.to_string(),
                        });
                    }
                    Layer::Fortran
                }
                "stats" => {
                    if out.layers.contains(&Layer::Stats) {
                        return Err(ConfigError::StatsTwice {
                            entry: entry.to_string(),
                        });
                    }
                    Layer::Stats
                }
                _ => library(entry),
            };
            out.layers.push(layer);
        }
        Ok(out)
    }

    /// The layers with the Fortran layer on top unless the list places it.
    pub fn with_fortran(&self) -> Vec<Layer> {
        let mut v = self.layers.clone();
        if !v.contains(&Layer::Fortran) {
            v.insert(0, Layer::Fortran);
        }
        v
    }

    /// What the launcher puts in `LD_PRELOAD` for `preload`: each library as
    /// `dlopen` would be handed it.
    pub fn preload_names(&self) -> Vec<&str> {
        self.layers
            .iter()
            .filter_map(|l| match l {
                Layer::Library { load_as, .. } => Some(load_as.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// A path (contains `/`), a loader name (`libx.so`, `libx.so.1`), or a short
/// name (`wrap` for `libwrap.so`).
fn library(entry: &str) -> Layer {
    let named = entry.contains('/') || entry.ends_with(".so") || entry.contains(".so.");
    Layer::Library {
        entry: entry.to_string(),
        load_as: if named {
            entry.to_string()
        } else {
            format!("lib{entry}.so")
        },
        short: !named,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lib(entry: &str, load_as: &str, short: bool) -> Layer {
        Layer::Library {
            entry: entry.into(),
            load_as: load_as.into(),
            short,
        }
    }

    #[test]
    fn entries_keep_list_order_and_keywords_are_flags() {
        let l = ToolsList::parse("v, ./a.so,libb.so.2, wrap ,stats,preload,").unwrap();
        assert!(l.verbose && l.preload);
        assert_eq!(
            l.layers,
            vec![
                lib("./a.so", "./a.so", false),
                lib("libb.so.2", "libb.so.2", false),
                lib("wrap", "libwrap.so", true),
                Layer::Stats
            ]
        );
        assert_eq!(l.preload_names(), ["./a.so", "libb.so.2", "libwrap.so"]);
    }

    #[test]
    fn fortran_goes_on_top_unless_placed() {
        let l = ToolsList::parse("a.so").unwrap();
        assert_eq!(
            l.with_fortran(),
            vec![Layer::Fortran, lib("a.so", "a.so", false)]
        );
        let l = ToolsList::parse("a.so,fortran").unwrap();
        assert_eq!(
            l.with_fortran(),
            vec![lib("a.so", "a.so", false), Layer::Fortran]
        );
    }

    #[test]
    fn empty_list_is_pass_through() {
        let l = ToolsList::parse(" , ").unwrap();
        assert_eq!(l, ToolsList::default());
        assert_eq!(l.with_fortran(), vec![Layer::Fortran]);
    }

    #[test]
    fn callsites_are_on_unless_turned_off() {
        for v in ["0", " off", "No", "FALSE"] {
            assert!(!callsites_value(v), "{v}");
        }
        for v in ["", "1", "on", "yes"] {
            assert!(callsites_value(v), "{v}");
        }
    }

    #[test]
    fn duplicates_of_single_layers_are_refused() {
        assert_eq!(
            ToolsList::parse("fort,a.so,fortran"),
            Err(ConfigError::FortranTwice {
                entry: "fortran".into()
            })
        );
        assert_eq!(
            ToolsList::parse("stats,stats"),
            Err(ConfigError::StatsTwice {
                entry: "stats".into()
            })
        );
    }
}
