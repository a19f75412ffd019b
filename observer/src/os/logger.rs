//! What the daemon says, one line per event on stderr, at a level a site
//! can filter (`--log.level`, as node_exporter's).
//!
//! Every message of the crate goes through the `log` macros; this is the
//! one place that writes them. A line reads `mpi-observer: MESSAGE` at
//! `info`, with `error: `, `warning: ` or `debug: ` after the prefix at the
//! other levels, as a terminal user reads it. Under systemd (stderr is the
//! journal stream `JOURNAL_STREAM` names) the line is the message behind a
//! `<N>` syslog priority instead: journald stamps the time, the unit and
//! the pid itself, and `journalctl -p warning` filters by level.
//!
//! Other crates' messages (aya, rustls) are shown at `debug` only, named
//! by their crate: at `info` the daemon's lines are the whole log.

use std::{
    io::Write,
    os::fd::AsRawFd,
    sync::atomic::{AtomicBool, Ordering},
};

use log::{Level, LevelFilter, Log, Metadata, Record};

/// The crate's own target prefix.
const OURS: &str = "mpi_observer";

/// The levels `--log.level` takes, least said last.
pub const LEVELS: [(&str, LevelFilter); 4] = [
    ("error", LevelFilter::Error),
    ("warn", LevelFilter::Warn),
    ("info", LevelFilter::Info),
    ("debug", LevelFilter::Debug),
];

/// Parses a `--log.level` value.
pub fn parse_level(s: &str) -> Result<LevelFilter, String> {
    LEVELS
        .iter()
        .find(|(name, _)| *name == s)
        .map(|(_, l)| *l)
        .ok_or_else(|| {
            let names: Vec<&str> = LEVELS.iter().map(|(n, _)| *n).collect();
            format!("unknown log level {s:?}: one of {}", names.join(", "))
        })
}

/// Installs the logger at `level` (once; a second call changes the level).
pub fn init(level: LevelFilter) {
    static JOURNAL: Stderr = Stderr {
        journal: AtomicBool::new(false),
    };
    JOURNAL
        .journal
        .store(stderr_is_journal(), Ordering::Relaxed);
    // Only fails if a logger is installed already (a second call): the
    // level below still applies.
    let _ = log::set_logger(&JOURNAL);
    log::set_max_level(level);
}

/// Whether stderr is the journal's stream: `JOURNAL_STREAM` is `DEV:INO`
/// of the socket systemd connected it to (systemd.exec(5)), which a child
/// inheriting the variable but not the descriptor no longer matches.
fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a stat into the buffer on success.
    let r = unsafe { libc::fstat(std::io::stderr().as_raw_fd(), st.as_mut_ptr()) };
    if r != 0 {
        return false;
    }
    // SAFETY: fstat succeeded.
    let st = unsafe { st.assume_init() };
    st.st_dev == dev && st.st_ino == ino
}

struct Stderr {
    /// Whether stderr is the journal's stream.
    journal: AtomicBool,
}

impl Log for Stderr {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
            && (m.target().starts_with(OURS) || log::max_level() >= LevelFilter::Debug)
    }

    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let line = format_line(
            self.journal.load(Ordering::Relaxed),
            r.level(),
            r.target(),
            r.args(),
        );
        // One write per line, so lines of threads never interleave; a
        // closed stderr loses the line, never the daemon.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// The line for one message, newline included. A message's own newlines
/// become spaces: one event, one line.
fn format_line(journal: bool, level: Level, target: &str, args: &std::fmt::Arguments) -> String {
    let msg = args.to_string().replace('\n', " ");
    let whose = if target.starts_with(OURS) {
        String::new()
    } else {
        let krate = target.split("::").next().unwrap_or(target);
        format!("{krate}: ")
    };
    if journal {
        // sd-daemon(3)'s priorities.
        let prio = match level {
            Level::Error => 3,
            Level::Warn => 4,
            Level::Info => 6,
            Level::Debug | Level::Trace => 7,
        };
        return format!("<{prio}>{whose}{msg}\n");
    }
    let tag = match level {
        Level::Error => "error: ",
        Level::Warn => "warning: ",
        Level::Info => "",
        Level::Debug | Level::Trace => "debug: ",
    };
    format!("mpi-observer: {tag}{whose}{msg}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_carries_its_level_for_a_terminal_and_for_the_journal() {
        let l = |journal, level, target: &str| {
            format_line(journal, level, target, &format_args!("pid 7: gone\nreally"))
        };
        assert_eq!(
            l(false, Level::Info, "mpi_observer::daemon"),
            "mpi-observer: pid 7: gone really\n"
        );
        assert_eq!(
            l(false, Level::Warn, "mpi_observer::x"),
            "mpi-observer: warning: pid 7: gone really\n"
        );
        assert_eq!(
            l(false, Level::Error, "mpi_observer"),
            "mpi-observer: error: pid 7: gone really\n"
        );
        assert_eq!(
            l(false, Level::Debug, "aya::programs"),
            "mpi-observer: debug: aya: pid 7: gone really\n"
        );
        assert_eq!(
            l(true, Level::Warn, "mpi_observer"),
            "<4>pid 7: gone really\n"
        );
        assert_eq!(
            l(true, Level::Info, "mpi_observer"),
            "<6>pid 7: gone really\n"
        );
    }

    #[test]
    fn a_level_is_one_of_four_names() {
        assert_eq!(parse_level("warn"), Ok(LevelFilter::Warn));
        assert_eq!(parse_level("debug"), Ok(LevelFilter::Debug));
        assert_eq!(
            parse_level("verbose").unwrap_err(),
            "unknown log level \"verbose\": one of error, warn, info, debug"
        );
    }
}
