//! The tools list: `MPI_TOOLS_ENTRY`, else `OMPI_MCA_ompi_tools_entry`.
//!
//! This file is also compiled into the `mpi-observer` launcher (with
//! `#[path]`), because the shim is a cdylib and cannot be a dependency: the
//! launcher and the shim must agree on what an entry means. Keep it free of
//! anything but `std` and `thiserror`.

/// Environment variables holding the list, in order of precedence.
pub const LIST_VARS: [&str; 2] = ["MPI_TOOLS_ENTRY", "OMPI_MCA_ompi_tools_entry"];

/// What a keyword of the list stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keyword {
    /// `v`: print the resolved layers.
    Verbose,
    /// `preload`: the launcher also preloads the tools.
    Preload,
    /// `fort`/`fortran`: the Fortran layer, one level.
    Fortran,
    /// `stats`: the built-in statistics layer, one level.
    Stats,
}

/// The keywords an entry may be instead of a library, in the order messages
/// list them. The one definition: the SPANK plugin's checker reads them from
/// `slurm/tools_list.h`, which `cargo xtask codegen` writes from this table.
pub const KEYWORD_TABLE: [(&str, Keyword); 5] = [
    ("v", Keyword::Verbose),
    ("fort", Keyword::Fortran),
    ("fortran", Keyword::Fortran),
    ("preload", Keyword::Preload),
    ("stats", Keyword::Stats),
];

/// [`KEYWORD_TABLE`]'s names as messages list them (a unit test keeps the
/// two equal: a `const` cannot join them).
pub const KEYWORDS: &str = "v, fort, fortran, preload, stats";

/// The variable that says what the shim does with an entry it cannot use:
/// unset (or anything else) ends the process with one line, as a tool run
/// by hand should; [`ON_ERROR_SKIP`] leaves the entry out with one line and
/// builds the rest. The SPANK plugin sets it in every task it preloads, so
/// that a monitoring option never costs a user their job.
pub const ON_ERROR_VAR: &str = "MPI_OBSERVER_TOOLS_ON_ERROR";

/// [`ON_ERROR_VAR`]'s value that leaves unusable entries out.
pub const ON_ERROR_SKIP: &str = "skip";

/// Whether [`ON_ERROR_VAR`] says to leave unusable entries out.
pub fn skip_from_env() -> bool {
    std::env::var(ON_ERROR_VAR).is_ok_and(|v| v.trim() == ON_ERROR_SKIP)
}

/// The keyword `entry` is, if it is one.
pub fn keyword(entry: &str) -> Option<Keyword> {
    KEYWORD_TABLE
        .iter()
        .find_map(|(name, k)| (*name == entry).then_some(*k))
}

/// The variable that turns the `stats` layer's call-site table off.
pub const CALLSITES_VAR: &str = "MPI_OBSERVER_CALLSITES";

/// Whether the `stats` layer records call sites: yes unless
/// [`CALLSITES_VAR`] is `0`, `off`, `no` or `false` (any case).
pub fn callsites_from_env() -> bool {
    std::env::var(CALLSITES_VAR).map_or(true, |v| callsites_value(&v))
}

/// The variable that sets the `stats` layer's wait-state records:
/// `0`/`off`/`no`/`false` keeps none; a power of two `N` keeps one
/// collective instance in `N` (every rank of a job keeps the same ones);
/// unset, anything else: every instance.
pub const WAITS_VAR: &str = "MPI_OBSERVER_WAITS";

/// What [`WAITS_VAR`] says: `None` for no records, else log2 of the
/// sampling period.
pub fn waits_from_env() -> Option<u32> {
    std::env::var(WAITS_VAR).map_or(Some(0), |v| waits_value(&v))
}

/// The variable that sets the point-to-point wait-state records (Late
/// Sender): `0`/`off`/`no`/`false` keeps none; a power of two `N` keeps
/// the messages whose number on their envelope is a multiple of `N` (the
/// sender and the receiver keep the same ones); unset, anything else: one
/// in [`WAITS_P2P_DEFAULT`]. Only with [`WAITS_VAR`] on.
pub const WAITS_P2P_VAR: &str = "MPI_OBSERVER_WAITS_P2P";

/// The point-to-point sampling period unless told: a message costs tens of
/// nanoseconds, and a record about 15 (a counter read and a cache line), so
/// one in 8 keeps the average under 2 ns a message.
pub const WAITS_P2P_DEFAULT: u32 = 8;

/// What [`WAITS_P2P_VAR`] says: `None` for no records, else log2 of the
/// sampling period.
pub fn waits_p2p_from_env() -> Option<u32> {
    std::env::var(WAITS_P2P_VAR).map_or(Some(WAITS_P2P_DEFAULT.trailing_zeros()), |v| {
        waits_p2p_value(&v)
    })
}

/// [`waits_p2p_from_env`] for one value of the variable.
fn waits_p2p_value(v: &str) -> Option<u32> {
    if !callsites_value(v) {
        return None;
    }
    match v.trim().parse::<u32>() {
        Ok(n) if n.is_power_of_two() => Some(n.trailing_zeros()),
        _ => Some(WAITS_P2P_DEFAULT.trailing_zeros()),
    }
}

/// [`waits_from_env`] for one value of the variable. A value that is
/// neither off nor a power of two up to 2^31 keeps every instance: a typo
/// in a monitoring option must not cost figures.
fn waits_value(v: &str) -> Option<u32> {
    if !callsites_value(v) {
        return None;
    }
    match v.trim().parse::<u32>() {
        Ok(n) if n.is_power_of_two() => Some(n.trailing_zeros()),
        _ => Some(0),
    }
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
    /// The list in the environment (the first of [`LIST_VARS`] that is set
    /// and not blank), or "".
    pub fn env_text() -> String {
        LIST_VARS
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.trim().is_empty()))
            .unwrap_or_default()
    }

    /// Parses a comma-separated list. Empty entries are ignored, so trailing
    /// commas are harmless.
    pub fn parse(list: &str) -> Result<ToolsList, ConfigError> {
        let (out, mut errors) = ToolsList::parse_skipping(list);
        if errors.is_empty() {
            Ok(out)
        } else {
            Err(errors.swap_remove(0))
        }
    }

    /// Parses a list as [`ToolsList::parse`] does, but leaves out each entry
    /// that makes it unusable (a second `stats`, a second Fortran layer)
    /// and returns why, in list order, beside what is left.
    pub fn parse_skipping(list: &str) -> (ToolsList, Vec<ConfigError>) {
        let mut out = ToolsList::default();
        let mut errors = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let layer = match keyword(entry) {
                Some(Keyword::Verbose) => {
                    out.verbose = true;
                    continue;
                }
                Some(Keyword::Preload) => {
                    out.preload = true;
                    continue;
                }
                Some(Keyword::Fortran) => Layer::Fortran,
                Some(Keyword::Stats) => Layer::Stats,
                None => library(entry),
            };
            // A library named twice is the loader's to judge (the build
            // refuses one object at two levels, not two copies of a file).
            let twice = match layer {
                Layer::Fortran if out.layers.contains(&layer) => Some(ConfigError::FortranTwice {
                    entry: entry.to_string(),
                }),
                Layer::Stats if out.layers.contains(&layer) => Some(ConfigError::StatsTwice {
                    entry: entry.to_string(),
                }),
                _ => None,
            };
            if let Some(e) = twice {
                errors.push(e);
                continue;
            }
            out.layers.push(layer);
        }
        (out, errors)
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
    fn waits_are_every_instance_unless_told() {
        for v in ["0", "off", "No"] {
            assert_eq!(waits_value(v), None, "{v}");
        }
        for (v, shift) in [("1", 0), (" 8", 3), ("1024", 10), ("2147483648", 31)] {
            assert_eq!(waits_value(v), Some(shift), "{v}");
        }
        // Not a power of two, or not a number: every instance.
        for v in ["", "3", "on", "-8", "4294967296", "1e3"] {
            assert_eq!(waits_value(v), Some(0), "{v}");
        }
    }

    #[test]
    fn point_to_point_waits_are_one_in_eight_unless_told() {
        for v in ["0", "off", "FALSE"] {
            assert_eq!(waits_p2p_value(v), None, "{v}");
        }
        for (v, shift) in [("1", 0), ("16 ", 4), ("2147483648", 31)] {
            assert_eq!(waits_p2p_value(v), Some(shift), "{v}");
        }
        for v in ["", "6", "every", "-1", "8.0"] {
            assert_eq!(waits_p2p_value(v), Some(3), "{v}");
        }
    }

    #[test]
    fn keywords_text_lists_the_table() {
        let names: Vec<&str> = KEYWORD_TABLE.iter().map(|(n, _)| *n).collect();
        assert_eq!(names.join(", "), KEYWORDS);
        for (name, k) in KEYWORD_TABLE {
            assert_eq!(keyword(name), Some(k));
            assert!(
                !ToolsList::parse(name)
                    .unwrap()
                    .layers
                    .iter()
                    .any(|l| matches!(l, Layer::Library { .. })),
                "{name} is no library"
            );
        }
    }

    #[test]
    fn skipping_drops_second_single_layers_only() {
        let (l, errors) = ToolsList::parse_skipping("stats,a.so,fort,stats,a.so,fortran,v");
        assert_eq!(
            l.layers,
            vec![
                Layer::Stats,
                lib("a.so", "a.so", false),
                Layer::Fortran,
                lib("a.so", "a.so", false)
            ]
        );
        assert!(l.verbose);
        assert_eq!(
            errors,
            vec![
                ConfigError::StatsTwice {
                    entry: "stats".into()
                },
                ConfigError::FortranTwice {
                    entry: "fortran".into()
                }
            ]
        );
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
