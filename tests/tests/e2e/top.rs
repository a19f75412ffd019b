//! `mpi-observer top` (issue 12), driven in tmux as a person would: keys go
//! in with `send-keys`, the screen comes back with `capture-pane`.
//!
//! The job is `tests/programs/top/busy.c`: every rank waits in
//! `MPI_Barrier` for the last one, which "computes" 4 ms an iteration to the
//! others' 1 ms, so `MPI_Barrier` is the busiest function and the last rank
//! the straggler (the least time in MPI).
//!
//! - Through an observer's /metrics (probes): the jobs screen shows the job
//!   id, its ranks and its busiest function; Enter opens the ranks (pids,
//!   the straggler), Down and Enter a rank's functions; `s` re-sorts, `/`
//!   filters, Esc goes back; `q` exits 0 and the terminal is restored
//!   (primary screen, canonical mode and echo back).
//! - Through a real Prometheus scraping that observer: the same job, its
//!   ranks and busiest function, and navigation into a rank; when the
//!   terminal goes away, `top` ends with it.
//! - A resize redraws at the new size.
//! - The shim's `stats` layer: the rank × rank matrix with the ring's bytes;
//!   SIGTERM ends `top` with the terminal restored, as `q` does.
//! - A dead URL, a URL that is not an observer, one that is not Prometheus:
//!   one line on stderr and exit 1, on a terminal too.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use e2e::{
    Daemon, Job, Mpi, Need, Prometheus, assert_no_probes_left, compile, free_port, observer_bin,
    program, require, run_with_timeout, scratch, shim_launcher, signal,
};

const RANKS: u32 = 3;

/// A tmux server of its own (`-L`), one window of a fixed size.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Runs `shell_cmd` in a new 120×32 session. When it ends the pane
    /// stays, with what it printed.
    fn start(name: &str, shell_cmd: &str) -> Tmux {
        let t = Tmux {
            socket: format!("mpi-observer-top-{name}-{}", std::process::id()),
        };
        let _ = t.tmux(&["kill-server"]);
        // Keep the pane when the command ends, no status line: set by the
        // server's configuration, before the command starts. Set after
        // new-session, a command that ends at once (top with a dead
        // endpoint) could close its pane, and the server with it, first.
        let conf = std::env::temp_dir().join(format!("{}.conf", t.socket));
        std::fs::write(
            &conf,
            "set-option -g remain-on-exit on\nset-option -g status off\n",
        )
        .expect("write tmux's configuration");
        let out = t.tmux(&[
            "-f",
            conf.to_str().expect("UTF-8 temporary directory"),
            "new-session",
            "-d",
            "-x",
            "120",
            "-y",
            "32",
            "sh",
            "-c",
            shell_cmd,
        ]);
        assert!(out.status.success(), "tmux new-session: {out:?}");
        let _ = std::fs::remove_file(&conf);
        t
    }

    fn tmux(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            .env_remove("TMUX")
            .env("TERM", "xterm-256color")
            .output()
            .expect("run tmux")
    }

    /// Sends keys (tmux key names, e.g. `Enter`, `Down`, `q`), then waits a
    /// little: a key right after Esc would be read as Alt+key.
    fn keys(&self, keys: &[&str]) {
        for k in keys {
            let o = self.tmux(&["send-keys", "-t", "0", k]);
            assert!(o.status.success(), "send-keys {k}: {o:?}");
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    /// Types text literally.
    fn type_text(&self, text: &str) {
        let o = self.tmux(&["send-keys", "-t", "0", "-l", text]);
        assert!(o.status.success(), "send-keys -l {text}: {o:?}");
        std::thread::sleep(Duration::from_millis(150));
    }

    /// The screen and its history, wrapped lines joined.
    fn screen(&self) -> String {
        let o = self.tmux(&["capture-pane", "-p", "-J", "-S", "-", "-t", "0"]);
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// A pane variable, e.g. `alternate_on`.
    fn var(&self, name: &str) -> String {
        let o = self.tmux(&["display-message", "-p", "-t", "0", &format!("#{{{name}}}")]);
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    /// Waits until the screen satisfies `ok`; panics with the last screen.
    fn wait_screen(&self, what: &str, limit: Duration, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            assert!(
                start.elapsed() < limit,
                "timed out after {limit:?} waiting for {what}; the screen:\n{s}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
    }
}

/// The pid of the `top` the pane's shell runs.
fn top_pid(t: &Tmux) -> u32 {
    let shell = t.var("pane_pid");
    let o = Command::new("pgrep")
        .args(["-P", &shell, "-f", "mpi-observer top"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("top's pid under the pane's shell {shell}: {o:?}"))
}

/// The shell command tmux runs: `top ARGS`, then its exit status and the
/// terminal's modes as `top` left them.
fn top_cmd(args: &str) -> String {
    format!(
        "{} top {args}; echo \"TOP_EXIT=$?\"; \
         echo \"TTY_MODES=$(stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo -e -echo | tr '\\n' ' ')\"",
        observer_bin().display()
    )
}

/// The busy job on Debian's Open MPI, built here; `tools` preloads the shim.
fn busy_job(dir: &Path, tools: Option<&str>) -> Job {
    let exe = dir.join("busy");
    compile(Mpi::OpenMpi, &program("top/busy.c"), &exe, &[]);
    let mut l = match tools {
        Some(t) => shim_launcher(Mpi::OpenMpi, RANKS, t),
        None => Mpi::OpenMpi.launcher(RANKS),
    };
    l.arg(&exe);
    Job::spawn(l, RANKS, dir.join("stop"))
}

/// The job's id as the observer labels it.
fn jobid(d: &mut Daemon) -> String {
    e2e::wait_for("the ranks' mpi_rank_info", Duration::from_secs(30), || {
        let (_, samples) = d.scrape();
        let ids: Vec<String> = samples
            .iter()
            .filter(|s| s.name == "mpi_rank_info")
            .filter_map(|s| s.label("jobid").map(str::to_string))
            .collect();
        (ids.len() == RANKS as usize).then(|| ids[0].clone())
    })
}

/// The row of the screen that contains `what`.
fn line_with<'a>(screen: &'a str, what: &str) -> &'a str {
    screen
        .lines()
        .find(|l| l.contains(what))
        .unwrap_or_else(|| panic!("no line with {what:?} on the screen:\n{screen}"))
}

/// Asserts the jobs screen: the job with its 3 ranks on 1 node, and
/// MPI_Barrier as its busiest function once rates are known.
fn assert_jobs_screen(t: &Tmux, id: &str) {
    let s = t.wait_screen(
        "the job's row with its busiest function",
        Duration::from_secs(30),
        |s| {
            s.lines()
                .any(|l| l.contains(id) && l.contains("MPI_Barrier"))
        },
    );
    let row = line_with(&s, id);
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cols[..4], ["▶", id, "3", "1"], "job, ranks, nodes: {row}");
    assert!(s.contains("JOB") && s.contains("BUSIEST FUNCTION"), "{s}");
}

/// From the jobs screen: Enter shows the ranks with their pids, and the
/// last rank flagged as the straggler; Down, Enter shows rank 1's
/// functions.
fn assert_navigation(t: &Tmux, id: &str, job: &Job) {
    t.keys(&["Enter"]);
    let s = t.wait_screen("the ranks screen", Duration::from_secs(20), |s| {
        s.contains(&format!("job {id}")) && s.contains("straggler rank 2")
    });
    for (rank, pid) in &job.ranks {
        let row = line_with(&s, &format!(" {pid} "));
        assert!(
            row.split_whitespace().any(|c| c == rank.to_string()),
            "rank {rank} on pid {pid}'s row: {row}"
        );
    }
    assert!(
        line_with(&s, &format!(" {} ", job.pid(0))).contains("MPI_Barrier"),
        "rank 0's top function:\n{s}"
    );
    t.keys(&["Down", "Enter"]);
    let s = t.wait_screen("rank 1's functions", Duration::from_secs(20), |s| {
        s.contains(&format!("job {id} › rank 1")) && s.contains("MPI_Sendrecv")
    });
    let first = s
        .lines()
        .find(|l| l.starts_with('▶'))
        .unwrap_or_else(|| panic!("a selected row:\n{s}"));
    assert!(
        first.contains("MPI_Barrier"),
        "sorted by time, MPI_Barrier first:\n{s}"
    );
}

#[test]
fn top_on_an_observer_endpoint() {
    if !require(&[Need::Root, Need::Mpi(Mpi::OpenMpi), Need::Command("tmux")]) {
        return;
    }
    let dir = scratch("top-endpoint");
    let job = busy_job(&dir, None);
    let mut d = Daemon::start(&job.pid_args());
    let id = jobid(&mut d);
    let t = Tmux::start(
        "endpoint",
        &top_cmd(&format!("--endpoint http://{}", d.addr)),
    );
    assert_jobs_screen(&t, &id);
    assert_eq!(
        t.var("alternate_on"),
        "1",
        "top draws on the alternate screen"
    );
    // A narrower terminal is redrawn to its new size, the job still there,
    // with the keys line at its new bottom. Until top redraws, tmux shows
    // the old 120 x 32 frame cut to 72 x 24: the job's row without the keys
    // line, which was on row 32. So the wait is for the keys line too.
    let o = t.tmux(&["resize-window", "-t", "0", "-x", "72", "-y", "24"]);
    assert!(o.status.success(), "resize-window: {o:?}");
    t.wait_screen(
        "the redraw at 72 x 24, the keys line on it",
        Duration::from_secs(10),
        |s| s.contains(&id) && s.contains("q quit") && s.lines().all(|l| l.chars().count() <= 72),
    );
    let o = t.tmux(&["resize-window", "-t", "0", "-x", "120", "-y", "32"]);
    assert!(o.status.success(), "resize-window: {o:?}");
    assert_jobs_screen(&t, &id);
    assert_navigation(&t, &id, &job);

    // `s` cycles the sort key; `/` filters as it is typed; Esc goes back.
    t.keys(&["s"]);
    t.wait_screen("sort by calls/s", Duration::from_secs(5), |s| {
        s.contains("sort: calls/s")
    });
    t.keys(&["/"]);
    t.type_text("sendr");
    t.keys(&["Enter"]);
    let s = t.wait_screen("the filtered functions", Duration::from_secs(5), |s| {
        s.contains("filter: sendr") && s.contains("MPI_Sendrecv")
    });
    assert!(
        !s.contains("MPI_Barrier") && !s.contains("MPI_Allreduce"),
        "only MPI_Sendrecv passes the filter:\n{s}"
    );
    t.keys(&["Escape"]);
    let s = t.wait_screen("back on the ranks", Duration::from_secs(5), |s| {
        s.contains("imbalance:") && !s.contains("› rank 1")
    });
    // Without the stats layer there are no wait states, and top says so.
    assert!(
        s.contains("waiting: no wait states (they come from the shim's `stats` layer)"),
        "{s}"
    );

    // The job goes on while top watches; `q` ends top, not the job.
    t.keys(&["q"]);
    let s = t.wait_screen("top's exit", Duration::from_secs(10), |s| {
        s.contains("TTY_MODES=")
    });
    assert!(s.contains("TOP_EXIT=0"), "q exits 0:\n{s}");
    let modes = line_with(&s, "TTY_MODES=");
    assert!(
        modes.contains("icanon") && !modes.contains("-icanon"),
        "canonical mode restored: {modes}"
    );
    assert!(
        modes.contains("echo") && !modes.contains("-echo"),
        "echo restored: {modes}"
    );
    assert_eq!(t.var("alternate_on"), "0", "the primary screen is back");
    assert!(!s.contains("JOB "), "top's screen is gone:\n{s}");
    job.finish("OK");
    d.stop(signal::TERM);
    assert_no_probes_left();
}

#[test]
fn top_through_prometheus() {
    if !require(&[
        Need::Root,
        Need::Mpi(Mpi::OpenMpi),
        Need::Command("tmux"),
        Need::Command("prometheus"),
    ]) {
        return;
    }
    let dir = scratch("top-prometheus");
    let job = busy_job(&dir, None);
    let mut d = Daemon::start(&job.pid_args());
    let id = jobid(&mut d);
    let prom = Prometheus::start(&dir, &[&d.addr]);
    // Two scrapes at least, so Prometheus has rates.
    prom.wait_query(
        &format!("count(irate(mpi_calls_total{{jobid=\"{id}\"}}[2m]))"),
        Duration::from_secs(60),
    );
    // SIGHUP ignored, as under nohup: top must see the hang-up itself.
    let t = Tmux::start(
        "prometheus",
        &format!(
            "trap '' HUP; {}",
            top_cmd(&format!("--prometheus http://{}", prom.addr))
        ),
    );
    t.wait_screen("the Prometheus source", Duration::from_secs(20), |s| {
        s.contains(&format!("Prometheus http://{}", prom.addr))
    });
    assert_jobs_screen(&t, &id);
    assert_navigation(&t, &id, &job);
    // The terminal goes away under top (its window closed): top ends too,
    // at once, and does not spin on the dead terminal.
    let top = top_pid(&t);
    drop(t);
    e2e::wait_for(
        "top to end with its terminal",
        Duration::from_secs(5),
        || (!Path::new(&format!("/proc/{top}")).exists()).then_some(()),
    );
    drop(prom);
    job.finish("OK");
    d.stop(signal::TERM);
    assert_no_probes_left();
}

#[test]
fn top_matrix_and_requests_with_the_stats_layer() {
    if !require(&[Need::Root, Need::Mpi(Mpi::OpenMpi), Need::Command("tmux")]) {
        return;
    }
    let dir = scratch("top-stats");
    let job = busy_job(&dir, Some("stats"));
    let mut d = Daemon::start(&job.pid_args());
    let id = jobid(&mut d);
    let t = Tmux::start(
        "stats",
        &top_cmd(&format!("--endpoint http://{} --job {id}", d.addr)),
    );
    // --job opens the ranks; with `stats` the request columns have figures.
    let s = t.wait_screen(
        "the ranks with request figures",
        Duration::from_secs(30),
        |s| s.contains(&format!("job {id}")) && s.contains("straggler rank"),
    );
    let row = line_with(&s, &format!(" {} ", job.pid(0)));
    assert!(
        !row.trim_end().ends_with("-      -"),
        "the stats layer's REQS column is filled: {row}"
    );
    // The wait states (read from the observer's /metrics): ranks 0 and 1
    // wait about 3 ms an iteration in MPI_Barrier for rank 2.
    let s = t.wait_screen(
        "the waiting line naming rank 2",
        Duration::from_secs(30),
        |s| s.contains("most for rank 2 (") && s.contains("Wait at Barrier"),
    );
    let line = line_with(&s, "waiting: ");
    let share: f64 = line
        .split("waiting: ")
        .nth(1)
        .and_then(|r| r.split('%').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("a share: {line}"));
    assert!(share > 0.0 && share < 100.0, "{line}");
    t.keys(&["m"]);
    let s = t.wait_screen("the matrix", Duration::from_secs(20), |s| {
        s.contains("from\\to") && s.contains("KiB")
    });
    // The ring: rank r sends 1 KiB an iteration to r+1 only.
    let rows: Vec<Vec<&str>> = s
        .lines()
        .skip_while(|l| !l.contains("from\\to"))
        .skip(1)
        .take(RANKS as usize)
        .map(|l| l.split_whitespace().collect())
        .collect();
    for (r, cols) in rows.iter().enumerate() {
        assert_eq!(cols[0], r.to_string(), "{s}");
        let cells = &cols[1..];
        let right = (r + 1) % RANKS as usize;
        // A cell is "·" or "<number> <unit>" (two words).
        let mut filled = Vec::new();
        let mut i = 0;
        let mut col = 0;
        while i < cells.len() {
            if cells[i] == "·" {
                i += 1;
            } else {
                filled.push(col);
                i += 2;
            }
            col += 1;
        }
        assert_eq!(filled, [right], "rank {r} sends to rank {right} only:\n{s}");
    }
    // SIGTERM (`kill`) restores the terminal too.
    let top = top_pid(&t);
    let o = Command::new("kill")
        .args(["-TERM", &top.to_string()])
        .status()
        .unwrap();
    assert!(o.success());
    let s = t.wait_screen("top's exit", Duration::from_secs(10), |s| {
        s.contains("TTY_MODES=")
    });
    assert!(s.contains("TOP_EXIT=0"), "{s}");
    let modes = line_with(&s, "TTY_MODES=");
    assert!(
        !modes.contains("-icanon") && !modes.contains("-echo"),
        "{modes}"
    );
    assert_eq!(t.var("alternate_on"), "0", "the primary screen is back");
    job.finish("OK");
    d.stop(signal::TERM);
    assert_no_probes_left();
}

/// `top ARGS` without a terminal: (exit code, stderr lines).
fn top_plain(args: &[&str]) -> (Option<i32>, Vec<String>) {
    let o = run_with_timeout(
        Command::new(observer_bin()).arg("top").args(args),
        Duration::from_secs(30),
    );
    let err: Vec<String> = String::from_utf8_lossy(&o.stderr)
        .lines()
        .map(str::to_string)
        .collect();
    (o.status.code(), err)
}

#[test]
fn a_bad_source_is_one_line_and_exit_1() {
    if !require(&[Need::Command("tmux"), Need::Command("prometheus")]) {
        return;
    }
    let dead = format!("http://127.0.0.1:{}", free_port());
    // An HTTP server that is neither: Prometheus's own /metrics has no
    // mpi_observer_ series, and an observer is no Prometheus API.
    let dir = scratch("top-bad");
    let prom = Prometheus::start(&dir, &[]);
    let observer = Daemon::start(&["--all".to_string(), "--no-bpf".to_string()]);
    let cases: [(Vec<String>, &str); 5] = [
        (vec!["--endpoint".into(), dead.clone()], "no answer from"),
        (
            vec!["--prometheus".into(), dead.clone()],
            "is Prometheus running there",
        ),
        (
            vec!["--endpoint".into(), format!("http://{}/metrics", prom.addr)],
            "is not an mpi-observer's /metrics",
        ),
        (
            vec!["--prometheus".into(), format!("http://{}", observer.addr)],
            "not as Prometheus's /api/v1/query",
        ),
        (
            vec!["--endpoint".into(), "https://node7:9479".into()],
            "give --ca-file",
        ),
    ];
    for (args, want) in &cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, err) = top_plain(&a);
        assert_eq!(code, Some(1), "top {a:?}: {err:?}");
        assert_eq!(err.len(), 1, "one line for top {a:?}: {err:?}");
        assert!(err[0].contains(want), "top {a:?}: {err:?}");
    }
    // On a terminal, as a person would meet it: one line, exit 1, and the
    // terminal untouched.
    let t = Tmux::start("dead", &top_cmd(&format!("--endpoint {dead}")));
    let s = t.wait_screen("top's exit", Duration::from_secs(20), |s| {
        s.contains("TTY_MODES=")
    });
    let printed: Vec<&str> = s
        .lines()
        .filter(|l| !l.trim().is_empty())
        .take_while(|l| !l.starts_with("TOP_EXIT="))
        .collect();
    assert_eq!(printed.len(), 1, "one line:\n{s}");
    assert!(
        printed[0].starts_with("mpi-observer: error: no answer from"),
        "{s}"
    );
    assert!(s.contains("TOP_EXIT=1"), "{s}");
    assert!(!line_with(&s, "TTY_MODES=").contains("-icanon"), "{s}");
    // Without a terminal a good source is refused with one line too.
    let (code, err) = top_plain(&["--endpoint", &observer.addr]);
    assert_eq!(code, Some(1), "{err:?}");
    assert_eq!(err.len(), 1, "{err:?}");
    assert!(err[0].contains("top needs a terminal"), "{err:?}");
    drop(prom);
}
