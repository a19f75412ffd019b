//! `mpi-observer top`: a live terminal view of one node (an observer's
//! `/metrics`) or of a whole cluster (a Prometheus server).
//!
//! [`source`] reads, [`model`] turns readings into rows with rates, [`app`]
//! holds the screens and applies keys, [`view`] draws. A reader thread reads
//! once per interval, so a slow source never freezes the keys; the terminal
//! is redrawn when a reading or a key arrives, and on resize.
//!
//! The first reading is made before the terminal is touched: a source that
//! does not answer, or is not an observer or Prometheus, is one line on
//! stderr and exit 1. Later failures keep the last figures on screen,
//! marked stale, until the source answers again.

pub mod app;
pub mod model;
pub mod source;
pub mod view;

use std::{
    io::IsTerminal as _,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use ratatui::crossterm::event::{self, Event};
use thiserror::Error;

use self::{
    app::App,
    model::Frame,
    source::{Reading, Source, SourceError},
};
use crate::{cli::TopArgs, client::http_get::Client};

/// Why `top` did not start, or stopped.
#[derive(Debug, Error)]
pub enum TopError {
    /// The source could not be read at start.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// Not on a terminal.
    #[error(
        "top needs a terminal, and {0} is not one; for plain text use `mpi-observer report --url URL` or `attach --summary`"
    )]
    NoTerminal(&'static str),
    /// `--interval` out of range.
    #[error("--interval {0} is out of range: give 0.1 to 3600 seconds")]
    Interval(f64),
    /// The terminal failed.
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
    /// The terminal hung up (its window closed, its session ended).
    #[error("the terminal went away")]
    TerminalGone,
}

/// Set by SIGTERM and SIGINT: leave the loop and restore the terminal
/// (Ctrl-C itself arrives as a key in raw mode). SIGHUP keeps its default
/// action: the terminal is gone, there is nothing to restore.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Runs `top` until `q`.
pub fn run(args: &TopArgs) -> Result<(), TopError> {
    let source = match &args.prometheus {
        Some(url) => Source::prometheus(url)?,
        None => Source::endpoint(&args.endpoint)?,
    };
    let client = Client::new(args.ca_file.as_deref(), args.auth_file.as_deref())
        .map_err(SourceError::from)?;
    if !(0.1..=3600.0).contains(&args.interval) {
        return Err(TopError::Interval(args.interval));
    }
    let interval = Duration::from_secs_f64(args.interval);
    // The first reading decides whether the source is usable at all.
    let first = source.read(&client)?;
    if !std::io::stdout().is_terminal() {
        return Err(TopError::NoTerminal("standard output"));
    }
    if !std::io::stdin().is_terminal() {
        return Err(TopError::NoTerminal("standard input"));
    }
    let mut app = App::new(source.describe(), args.job.clone());
    app.frame = Some(Frame::new(&first, None));

    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let (tx, rx) = mpsc::channel();
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let done = done.clone();
        thread::spawn(move || read_loop(&source, &client, interval, first.at, &tx, &done))
    };
    let result = ui(&mut app, &rx, args.exit_when_done);
    done.store(true, Ordering::Relaxed);
    drop(rx);
    // The reader may be inside a request (up to its timeout): not waited for.
    drop(reader);
    result
}

/// Reads every `interval`, from `last`, until told to stop.
fn read_loop(
    source: &Source,
    client: &Client,
    interval: Duration,
    mut last: Instant,
    tx: &mpsc::Sender<Result<Reading, SourceError>>,
    done: &AtomicBool,
) {
    while !done.load(Ordering::Relaxed) {
        let next = last + interval;
        while Instant::now() < next {
            if done.load(Ordering::Relaxed) {
                return;
            }
            thread::sleep((next - Instant::now()).min(Duration::from_millis(50)));
        }
        last = Instant::now();
        if tx.send(source.read(client)).is_err() {
            return;
        }
    }
}

/// The terminal's loop; the terminal is restored however it ends.
fn ui(
    app: &mut App,
    rx: &mpsc::Receiver<Result<Reading, SourceError>>,
    exit_when_done: bool,
) -> Result<(), TopError> {
    let mut term = ratatui::try_init()?;
    let r = (|| -> Result<(), TopError> {
        let mut dirty = true;
        let mut size = ratatui::crossterm::terminal::size()?;
        let mut seen_running = app
            .frame
            .as_ref()
            .is_some_and(|f| f.ranks.values().any(|r| r.up));
        loop {
            if dirty {
                term.draw(|f| view::draw(f, app))?;
                dirty = false;
            }
            if app.quit || STOP.load(Ordering::Relaxed) {
                return Ok(());
            }
            // Input is waited for here, not in crossterm: its reader spins
            // forever on a terminal that hung up (a read of 0 bytes), so it
            // is only asked once there are bytes and no hang-up.
            match wait_input(Duration::from_millis(100)) {
                Input::Gone => return Err(TopError::TerminalGone),
                Input::Ready => {
                    while event::poll(Duration::ZERO)? {
                        if let Event::Key(k) = event::read()? {
                            app.key(k);
                        }
                    }
                    dirty = true;
                }
                Input::None => {}
            }
            // A resize is seen by polling the size (crossterm's SIGWINCH
            // events come through the same reader); draw resizes.
            let now = ratatui::crossterm::terminal::size()?;
            if now != size {
                size = now;
                dirty = true;
            }
            while let Ok(r) = rx.try_recv() {
                dirty = true;
                match r {
                    Ok(reading) => {
                        let f = Frame::new(&reading, app.frame.as_ref());
                        let running = f.ranks.values().any(|r| r.up);
                        if exit_when_done && seen_running && !running {
                            return Ok(());
                        }
                        seen_running |= running;
                        app.frame = Some(f);
                        app.error = None;
                    }
                    Err(e) => {
                        if exit_when_done && seen_running {
                            return Ok(());
                        }
                        app.error = Some(crate::one_line(&e));
                    }
                }
            }
        }
    })();
    ratatui::restore();
    r
}

/// What the terminal has for `top`.
enum Input {
    /// Bytes to read.
    Ready,
    /// Nothing within the timeout.
    None,
    /// It hung up, or is no longer valid.
    Gone,
}

/// Waits up to `timeout` for input on standard input, the terminal.
fn wait_input(timeout: Duration) -> Input {
    let mut fd = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as libc::c_int) };
    if n <= 0 {
        // Timeout, or EINTR (a signal: the loop checks STOP).
        return Input::None;
    }
    if fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        Input::Gone
    } else {
        Input::Ready
    }
}
