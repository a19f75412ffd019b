//! Running a libtest binary so that a failure can be read from the end of
//! the log: its output is streamed as it comes and kept whole in a file,
//! and on failure the last lines printed are each failed test's panic
//! message. CI shows the tail of a long log, and with RUST_BACKTRACE=1
//! that tail was backtraces, with the reasons scrolled away.

use std::{
    fs,
    io::{BufRead as _, BufReader, Write as _},
    path::Path,
    process::{Command, Stdio},
};

use anyhow::{Context as _, Result, bail};

/// Lines kept of one test's panic message in the digest.
const MESSAGE_LINES: usize = 24;
/// Characters kept of one line of it.
const LINE_CHARS: usize = 600;

/// Runs `cmd` (a `cargo test` or a test binary), its standard output
/// streamed to ours and written whole to `log`. On failure the error
/// carries the digest of what failed (see [`digest`]), and the log's path.
pub fn run(cmd: &mut Command, log: &Path) -> Result<()> {
    if let Some(dir) = log.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {cmd:?}"))?;
    let mut kept = Vec::new();
    if let Some(out) = child.stdout.take() {
        let mut stdout = std::io::stdout().lock();
        for line in BufReader::new(out).split(b'\n') {
            let mut line = line.with_context(|| format!("reading the output of {cmd:?}"))?;
            line.push(b'\n');
            // Our stdout gone (a closed pipe) must not stop the tests.
            let _ = stdout.write_all(&line).and_then(|()| stdout.flush());
            kept.extend_from_slice(&line);
        }
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for {cmd:?}"))?;
    fs::write(log, &kept).with_context(|| format!("writing {}", log.display()))?;
    if !status.success() {
        let text = String::from_utf8_lossy(&kept);
        bail!(
            "{cmd:?} failed with {status}; whole output in {}\n{}",
            log.display(),
            digest(&text)
        );
    }
    Ok(())
}

/// What failed in libtest's `stdout`, one paragraph per failed test: its
/// name and the panic message, without the backtrace. When no test
/// section is found (a build failure, a crash of the binary itself), the
/// last lines of the output instead.
pub fn digest(stdout: &str) -> String {
    let mut out = String::new();
    let mut failed = 0;
    let mut lines = stdout.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|l| l.strip_suffix(" stdout ----"))
        else {
            continue;
        };
        failed += 1;
        out.push_str(&format!("FAILED {name}:\n"));
        let mut in_panic = false;
        let mut kept = 0;
        while let Some(l) = lines.peek() {
            if l.starts_with("---- ") || *l == "failures:" {
                break;
            }
            let l = lines.next().unwrap_or_default();
            if l.starts_with("thread '") && l.contains("panicked at") {
                in_panic = true;
                kept = 0;
            } else if l.starts_with("stack backtrace:") || l.starts_with("note: run with") {
                in_panic = false;
            }
            if in_panic && kept < MESSAGE_LINES {
                let cut: String = l.chars().take(LINE_CHARS).collect();
                out.push_str(&format!("  {cut}\n"));
                kept += 1;
            }
        }
    }
    if failed == 0 {
        let all: Vec<&str> = stdout.lines().collect();
        let tail = &all[all.len().saturating_sub(MESSAGE_LINES)..];
        out.push_str("no failed test's section found; the output ended with:\n");
        for l in tail {
            out.push_str(&format!("  {l}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_keeps_the_message_and_drops_the_backtrace() {
        let log = "running 2 tests\n\
                   test a::one ... FAILED\n\
                   test b::two ... ok\n\
                   \n\
                   failures:\n\
                   \n\
                   ---- a::one stdout ----\n\
                   daemon said something\n\
                   thread 'a::one' panicked at tests/a.rs:10:5:\n\
                   counts differ: 3 vs 4\n\
                   second line\n\
                   stack backtrace:\n\
                   \x20  0: std::panicking::begin_panic\n\
                   \x20  1: a::one\n\
                   ---- c::three stdout ----\n\
                   thread 'c::three' panicked at tests/c.rs:1:1:\n\
                   timeout\n\
                   note: run with `RUST_BACKTRACE=1`\n\
                   \n\
                   failures:\n\
                   \x20   a::one\n\
                   \n\
                   test result: FAILED. 1 passed; 1 failed\n";
        let d = digest(log);
        assert!(d.contains("FAILED a::one:\n"), "{d}");
        assert!(d.contains("counts differ: 3 vs 4\n  second line\n"), "{d}");
        assert!(!d.contains("begin_panic"), "{d}");
        assert!(!d.contains("daemon said"), "{d}");
        assert!(d.contains("FAILED c::three:\n  thread 'c::three'"), "{d}");
        assert!(d.contains("  timeout\n"), "{d}");
    }

    #[test]
    fn digest_without_sections_gives_the_tail() {
        let d = digest("Compiling x\nerror[E0308]: mismatched types\n");
        assert!(d.contains("no failed test's section"), "{d}");
        assert!(d.contains("  error[E0308]: mismatched types\n"), "{d}");
    }
}
