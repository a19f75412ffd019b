//! Choosing which MPI functions to probe: `--functions GLOB,...`.

use observer_common::{FUNCTIONS, functions::Family};
use thiserror::Error;

/// A `--functions` list that selects nothing useful.
#[derive(Debug, Error)]
pub enum SelectError {
    /// A pattern matched no MPI function.
    #[error(
        "--functions pattern '{pattern}' matches no MPI function: run `mpi-observer functions` to list them"
    )]
    NoMatch {
        /// The pattern.
        pattern: String,
    },
}

/// Glob match with `*` and `?`, case-sensitive.
pub fn glob(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni, mut star, mut mark) = (0, 0, None, 0);
    while ni < n.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = ni;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ni = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == b'*')
}

/// Whether a function is in the default set: everything that communicates,
/// synchronises, completes requests or does I/O; not the local queries.
pub fn is_default(id: u16) -> bool {
    FUNCTIONS[id as usize].family != Family::Local
}

/// Resolves a comma-separated list of globs over standard names (`MPI_Send`,
/// `MPI_*send*`) and family keywords (`@default`, `@all`, `@p2p`,
/// `@collective`, `@sync`, `@completion`, `@rma`, `@io`, `@local`) into IDs.
pub fn select(list: Option<&str>) -> Result<Vec<u16>, SelectError> {
    let ids = 0..FUNCTIONS.len() as u16;
    let Some(list) = list else {
        return Ok(ids.filter(|i| is_default(*i)).collect());
    };
    let mut chosen = vec![false; FUNCTIONS.len()];
    for pat in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let mut any = false;
        for id in ids.clone() {
            let f = &FUNCTIONS[id as usize];
            let hit = match pat.strip_prefix('@') {
                Some("all") => true,
                Some("default") => is_default(id),
                Some(fam) => f.family.as_str() == fam,
                None => glob(pat, f.name),
            };
            if hit {
                chosen[id as usize] = true;
                any = true;
            }
        }
        if !any {
            return Err(SelectError::NoMatch {
                pattern: pat.to_string(),
            });
        }
    }
    Ok(ids.filter(|i| chosen[*i as usize]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use observer_common::function_by_name;

    #[test]
    fn globbing() {
        assert!(glob("MPI_*", "MPI_Send"));
        assert!(glob("MPI_?send", "MPI_Isend"));
        assert!(!glob("MPI_?send", "MPI_Send"));
        assert!(glob("*reduce*", "MPI_Allreduce"));
        assert!(!glob("MPI_Send", "MPI_Send_c"));
    }

    #[test]
    fn default_set_excludes_local_queries() {
        let d = select(None).unwrap();
        for n in [
            "MPI_Wtime",
            "MPI_Comm_rank",
            "MPI_Initialized",
            "MPI_Type_size",
        ] {
            assert!(!d.contains(&function_by_name(n).unwrap()), "{n}");
        }
        for n in [
            "MPI_Send",
            "MPI_Waitall",
            "MPI_Allreduce",
            "MPI_Barrier",
            "MPI_File_write_all",
            "MPI_Put",
        ] {
            assert!(d.contains(&function_by_name(n).unwrap()), "{n}");
        }
    }

    #[test]
    fn bad_pattern_is_named() {
        let e = select(Some("MPI_Send,MPI_Sned")).unwrap_err();
        assert!(e.to_string().contains("'MPI_Sned'"));
        assert!(select(Some("@p2p,MPI_Barrier")).unwrap().len() > 10);
    }
}
