//! Reading back what the guest handed over in the run directory
//! (`guest.rs` writes it): the command's output, whole, and its status.

use std::{fs, io, path::Path};

use anyhow::{Context as _, Result, bail};

use super::guest::{DMESG, STATUS, STDERR, STDOUT};

/// What the command did in the guest.
#[derive(Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Its exit status (128 + N for a signal, as bash reports it).
    pub status: i32,
    /// Its standard output, whole.
    pub stdout: Vec<u8>,
    /// Its standard error, whole.
    pub stderr: Vec<u8>,
    /// The guest kernel's log after the command (empty if unreadable).
    pub dmesg: Vec<u8>,
}

/// Reads the run directory. No status means the guest did not finish the
/// script (it hung, panicked or was stopped): its output may be partial,
/// and the caller says so with what the live stream showed instead.
pub fn read(dir: &Path) -> Result<Outcome> {
    let status = match fs::read_to_string(dir.join(STATUS)) {
        Ok(s) => parse_status(&s)
            .with_context(|| format!("{}: not an exit status", dir.join(STATUS).display()))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            bail!("the guest wrote no exit status (it did not finish the command)")
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.join(STATUS).display())),
    };
    // The status is written after the output: both files must be there.
    let read = |name: &str| {
        fs::read(dir.join(name)).with_context(|| format!("reading {}", dir.join(name).display()))
    };
    Ok(Outcome {
        status,
        stdout: read(STDOUT)?,
        stderr: read(STDERR)?,
        dmesg: fs::read(dir.join(DMESG)).unwrap_or_default(),
    })
}

/// The status file's text: one decimal number and a newline.
fn parse_status(s: &str) -> Result<i32> {
    let t = s.strip_suffix('\n').unwrap_or(s);
    match t.parse::<i32>() {
        Ok(n) if (0..=255).contains(&n) && !t.starts_with('+') => Ok(n),
        _ => bail!("{s:?}"),
    }
}

/// libtest's closing lines in `stdout`: how many tests passed and failed
/// over every `test result:` line (one per test binary run).
pub fn libtest_counts(stdout: &str) -> Option<(u32, u32)> {
    let mut seen = false;
    let (mut passed, mut failed) = (0, 0);
    for line in stdout.lines() {
        let Some(rest) = line.strip_prefix("test result: ") else {
            continue;
        };
        seen = true;
        for part in rest.split(['.', ';']) {
            let mut w = part.split_whitespace();
            if let (Some(n), Some(what)) = (w.next(), w.next()) {
                let n: u32 = n.parse().unwrap_or(0);
                match what {
                    "passed" => passed += n,
                    "failed" => failed += n,
                    _ => {}
                }
            }
        }
    }
    seen.then_some((passed, failed))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("xtask-vm-output-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_finished_run_gives_its_status_and_whole_output() {
        let d = dir("finished");
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        fs::write(d.join(STDOUT), &big).unwrap();
        fs::write(d.join(STDERR), b"warning\n").unwrap();
        fs::write(d.join(STATUS), "3\n").unwrap();
        let o = read(&d).unwrap();
        assert_eq!(o.status, 3);
        assert_eq!(o.stdout, big);
        assert_eq!(o.stderr, b"warning\n");
        assert!(o.dmesg.is_empty());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn no_status_means_the_guest_did_not_finish() {
        let d = dir("unfinished");
        // What a guest killed mid-copy leaves: a partial file, no status.
        fs::write(d.join("stdout.partial"), b"half").unwrap();
        let e = read(&d).unwrap_err().to_string();
        assert!(e.contains("no exit status"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_status_without_its_output_is_an_error() {
        let d = dir("nooutput");
        fs::write(d.join(STATUS), "0\n").unwrap();
        assert!(read(&d).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn statuses_are_decimal_bytes() {
        assert_eq!(parse_status("0\n").unwrap(), 0);
        assert_eq!(parse_status("137\n").unwrap(), 137);
        assert_eq!(parse_status("255").unwrap(), 255);
        for bad in ["", "\n", "-1\n", "256\n", "+1\n", "1 \n", "x\n", "1\n\n"] {
            assert!(parse_status(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn libtest_counts_add_up_every_binary() {
        let out = "running 2 tests\ntest a ... ok\n\n\
                   test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 40 filtered out; finished in 3.20s\n\n\
                   test result: FAILED. 1 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.00s\n";
        assert_eq!(libtest_counts(out), Some((3, 1)));
        assert_eq!(
            libtest_counts(
                "test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 9 filtered out; finished in 0.00s\n"
            ),
            Some((0, 0))
        );
        assert_eq!(libtest_counts("error: no such binary\n"), None);
    }
}
