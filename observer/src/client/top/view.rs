//! Draws [`App`]: a title line, the screen's path, its table (or matrix),
//! and a line of keys. Only what changed reaches the terminal (ratatui
//! diffs each frame against the last), so refreshes do not flicker.

use std::time::Duration;

use ratatui::{
    Frame as TermFrame,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::{Block, Cell, Clear, Paragraph, Row, Table, TableState, Wrap},
};

use super::{
    app::{App, Screen},
    model::{self, Frame, SPREAD_ALERT},
};

/// Draws the whole screen.
pub fn draw(f: &mut TermFrame, app: &App) {
    let [title, path, body, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(f.area());
    f.render_widget(Paragraph::new(title_line(app)), title);
    f.render_widget(Paragraph::new(path_line(app)), path);
    match &app.frame {
        None => f.render_widget(Paragraph::new("reading…"), body),
        Some(frame) => match &app.view().screen {
            Screen::Jobs => jobs(f, app, frame, body),
            Screen::Ranks { job } => ranks(f, app, frame, job, body),
            Screen::Functions { rank } => functions(f, app, frame, rank, body),
            Screen::Matrix { job } => matrix(f, frame, job, body),
        },
    }
    f.render_widget(Paragraph::new(keys_line(app)), keys);
    if app.help {
        help(f, body);
    }
}

fn title_line(app: &App) -> Line<'static> {
    let mut spans = vec![
        Span::styled("mpi-observer top", Style::new().bold()),
        Span::raw(format!(" — {}", app.source)),
    ];
    if let Some(frame) = &app.frame {
        let jobs: std::collections::BTreeSet<&str> =
            frame.ranks.keys().map(|k| k.jobid.as_str()).collect();
        let up = frame.ranks.values().filter(|r| r.up).count();
        spans.push(Span::raw(format!(
            " — {} job{}, {} rank{} running",
            jobs.len(),
            plural(jobs.len()),
            up,
            plural(up)
        )));
        if !frame.rated {
            spans.push(Span::styled(
                " — rates from the next refresh",
                Style::new().fg(Color::DarkGray),
            ));
        }
    }
    if let Some(e) = &app.error {
        spans.push(Span::styled(
            format!(" — stale: {e}"),
            Style::new().fg(Color::Red).bold(),
        ));
    }
    Line::from(spans)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn path_line(app: &App) -> Line<'static> {
    let mut parts = Vec::new();
    for v in &app.stack {
        parts.push(match &v.screen {
            Screen::Jobs => "Jobs".to_string(),
            Screen::Ranks { job } => format!("job {job}"),
            Screen::Functions { rank } => format!("rank {}", rank.rank),
            Screen::Matrix { .. } => "matrix (bytes sent, row → column)".to_string(),
        });
    }
    let v = app.view();
    let mut spans = vec![Span::styled(parts.join(" › "), Style::new().bold())];
    let sorts = v.screen.sorts();
    if !sorts.is_empty() {
        spans.push(Span::raw(format!("   sort: {}", sorts[v.sort])));
    }
    if app.editing.is_some() {
        spans.push(Span::styled(
            format!("   filter: {}▏", v.filter),
            Style::new().fg(Color::Yellow),
        ));
    } else if !v.filter.is_empty() {
        spans.push(Span::raw(format!("   filter: {}", v.filter)));
    }
    Line::from(spans)
}

fn keys_line(app: &App) -> Line<'static> {
    let text = if app.editing.is_some() {
        "type to filter · Enter keep · Esc cancel"
    } else {
        match app.view().screen {
            Screen::Jobs => {
                "↑↓ move · Enter ranks · m matrix · s sort · / filter · ? help · q quit"
            }
            Screen::Ranks { .. } => {
                "↑↓ move · Enter functions · Esc back · m matrix · s sort · / filter · ? help · q quit"
            }
            Screen::Functions { .. } => {
                "↑↓ move · Esc back · m matrix · s sort · / filter · ? help · q quit"
            }
            Screen::Matrix { .. } => "Esc back · ? help · q quit",
        }
    };
    Line::from(Span::styled(text, Style::new().fg(Color::DarkGray)))
}

fn help(f: &mut TermFrame, area: Rect) {
    let lines = [
        "↑ ↓ k j   move          PgUp PgDn Home End",
        "Enter →   open: a job's ranks, a rank's functions",
        "Esc ← ⌫   back",
        "m         the job's rank × rank matrix (stats layer)",
        "s S       next / previous sort key",
        "/         filter rows (Enter keeps, Esc cancels)",
        "q Ctrl-C  quit",
        "",
        "MPI %: share of wall time inside MPI calls over the",
        "last refresh; rates come from successive readings.",
    ];
    let w = 58.min(area.width);
    let h = (lines.len() as u16 + 2).min(area.height);
    let r = Rect::new(area.x + (area.width - w) / 2, area.y + 1, w, h);
    f.render_widget(Clear, r);
    f.render_widget(
        Paragraph::new(lines.iter().map(|l| Line::raw(*l)).collect::<Vec<_>>())
            .block(Block::bordered().title(" keys ")),
        r,
    );
}

fn header(cells: &[&'static str]) -> Row<'static> {
    Row::new(cells.iter().map(|c| Cell::from(*c))).style(Style::new().bold().reversed())
}

fn table<'a>(
    f: &mut TermFrame,
    app: &App,
    area: Rect,
    head: &[&'static str],
    widths: &[Constraint],
    rows: Vec<(String, Row<'a>)>,
) {
    let keys: Vec<String> = rows.iter().map(|(k, _)| k.clone()).collect();
    let mut state = TableState::default().with_selected(app.selected_index(&keys));
    if rows.is_empty() {
        let what = if app.view().filter.is_empty() {
            "nothing observed here yet"
        } else {
            "no row matches the filter"
        };
        let [h, msg] = Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(area);
        f.render_widget(Table::new([header(head)], widths.to_vec()), h);
        f.render_widget(
            Paragraph::new(Span::styled(what, Style::new().fg(Color::DarkGray))),
            msg,
        );
        return;
    }
    let t = Table::new(rows.into_iter().map(|(_, r)| r), widths.to_vec())
        .header(header(head))
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol("▶ ");
    f.render_stateful_widget(t, area, &mut state);
}

fn jobs(f: &mut TermFrame, app: &App, frame: &Frame, area: Rect) {
    let v = app.view();
    let rows = model::jobs(frame, &v.filter, v.sort)
        .into_iter()
        .map(|j| {
            let row = Row::new(vec![
                Cell::from(j.jobid.clone()),
                Cell::from(if j.running == j.ranks {
                    j.ranks.to_string()
                } else {
                    format!("{}/{}", j.running, j.ranks)
                }),
                Cell::from(j.nodes.to_string()),
                Cell::from(percent(j.mpi, frame.rated)),
                Cell::from(rate(j.calls_rate, frame.rated, "")),
                Cell::from(rate_bytes(j.bytes_rate, frame.rated)),
                Cell::from(j.busiest.clone().unwrap_or_else(|| "-".into())),
            ]);
            (j.jobid, row)
        })
        .collect();
    table(
        f,
        app,
        area,
        &[
            "JOB",
            "RANKS",
            "NODES",
            "MPI %",
            "CALLS/S",
            "BYTES/S",
            "BUSIEST FUNCTION",
        ],
        &[
            Constraint::Min(12),
            Constraint::Length(7),
            Constraint::Length(5),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(11),
            Constraint::Min(16),
        ],
        rows,
    );
}

/// The job's waiting for late ranks, in one line.
fn waiting_line(frame: &Frame, job: &str) -> Line<'static> {
    let w = model::waiting(frame, job);
    let Some(w) = w else {
        return Line::raw(if frame.rated {
            "waiting: no wait states (they come from the shim's `stats` layer)"
        } else {
            "waiting: from the next refresh"
        });
    };
    let pct = |v: f64| format!("{:.1}%", v * 100.0);
    // The culprit first: a narrow terminal cuts the patterns, not the rank.
    let who = match &w.culprit {
        Some((rank, f)) => format!(", most for rank {rank} ({f:.3} s/s)"),
        None => ", nobody in the last minute".to_string(),
    };
    let parts: Vec<String> = w
        .patterns
        .iter()
        .map(|(p, v)| format!("{p} {}", pct(*v)))
        .collect();
    Line::from(vec![
        Span::raw(format!("waiting: {} of the ranks' time", pct(w.share))),
        Span::styled(who, Style::new().bold()),
        Span::raw(if parts.is_empty() {
            String::new()
        } else {
            format!(": {}", parts.join(", "))
        }),
    ])
}

fn ranks(f: &mut TermFrame, app: &App, frame: &Frame, job: &str, area: Rect) {
    let [top, waits, rest] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(2),
    ])
    .areas(area);
    f.render_widget(Paragraph::new(waiting_line(frame, job)), waits);
    let im = model::imbalance(frame, job);
    let alert = im.as_ref().is_some_and(|i| i.spread() > SPREAD_ALERT);
    let line = match &im {
        Some(i) => {
            let style = if alert {
                Style::new().fg(Color::Yellow).bold()
            } else {
                Style::new()
            };
            Line::from(vec![
                Span::raw("imbalance: MPI % min "),
                Span::styled(format!("{:.1} (rank {})", i.min.0 * 100.0, i.min.1), style),
                Span::raw(format!(
                    ", max {:.1} (rank {}), spread {:.1}",
                    i.max.0 * 100.0,
                    i.max.1,
                    i.spread() * 100.0
                )),
                Span::styled(
                    if alert {
                        format!(" > {:.0}: straggler rank {}", SPREAD_ALERT * 100.0, i.min.1)
                    } else {
                        String::new()
                    },
                    style,
                ),
            ])
        }
        None if !frame.rated => Line::raw("imbalance: from the next refresh"),
        None => Line::raw("imbalance: needs two running ranks"),
    };
    f.render_widget(Paragraph::new(line), top);
    let v = app.view();
    let straggler = im.filter(|_| alert).map(|i| i.min.1);
    let rows = model::ranks(frame, job, &v.filter, v.sort)
        .into_iter()
        .map(|r| {
            let (reqs, oldest) = match r.requests {
                Some((n, age)) => (
                    format!("{n:.0}"),
                    if n > 0.0 { duration(age) } else { "-".into() },
                ),
                None => ("-".into(), "-".into()),
            };
            let mut row = Row::new(vec![
                Cell::from(r.key.rank.clone()),
                Cell::from(r.node.clone()),
                Cell::from(r.pid.clone()),
                Cell::from(bar(r.mpi, frame.rated && r.up, 10)),
                Cell::from(rate(r.calls_rate, frame.rated, "")),
                Cell::from(rate_bytes(r.bytes_rate, frame.rated)),
                Cell::from(if r.up {
                    r.busiest.clone().unwrap_or_else(|| "-".into())
                } else {
                    "(exited)".into()
                }),
                Cell::from(reqs),
                Cell::from(oldest),
            ]);
            if !r.up {
                row = row.style(Style::new().fg(Color::DarkGray));
            } else if straggler.as_deref() == Some(r.key.rank.as_str()) {
                row = row.style(Style::new().fg(Color::Yellow));
            }
            (r.key.rank, row)
        })
        .collect();
    table(
        f,
        app,
        rest,
        &[
            "RANK",
            "NODE",
            "PID",
            "MPI %",
            "CALLS/S",
            "BYTES/S",
            "TOP FUNCTION",
            "REQS",
            "OLDEST",
        ],
        &[
            Constraint::Length(6),
            Constraint::Min(8),
            Constraint::Length(8),
            Constraint::Length(18),
            Constraint::Length(9),
            Constraint::Length(11),
            Constraint::Min(16),
            Constraint::Length(6),
            Constraint::Length(8),
        ],
        rows,
    );
}

fn functions(f: &mut TermFrame, app: &App, frame: &Frame, rank: &model::RankKey, area: Rect) {
    let v = app.view();
    let rows = model::functions(frame, rank, &v.filter, v.sort)
        .into_iter()
        .map(|r| {
            let row = Row::new(vec![
                Cell::from(r.name.clone()),
                Cell::from(rate(r.calls_rate, frame.rated, "")),
                Cell::from(count(r.calls)),
                Cell::from(format!("{:.1}", r.share * 100.0)),
                Cell::from(r.mean_latency.map_or_else(|| "-".into(), duration)),
                Cell::from(rate_bytes(r.bytes_rate, frame.rated)),
                Cell::from(if r.bytes > 0.0 {
                    bytes(r.bytes)
                } else {
                    "-".into()
                }),
            ]);
            (r.name, row)
        })
        .collect();
    table(
        f,
        app,
        area,
        &[
            "FUNCTION", "CALLS/S", "CALLS", "TIME %", "MEAN", "BYTES/S", "BYTES",
        ],
        &[
            Constraint::Min(22),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(11),
            Constraint::Length(10),
        ],
        rows,
    );
}

fn matrix(f: &mut TermFrame, frame: &Frame, job: &str, area: Rect) {
    let Some(m) = model::matrix(frame, job) else {
        f.render_widget(
            Paragraph::new(vec![
                Line::raw(format!("job {job}: no peer figures.")),
                Line::raw(
                    "The matrix needs the shim's stats layer in the ranks: \
                     `mpi-observer run --tools stats -- APP`, or `attach --inject`.",
                ),
            ])
            .wrap(Wrap { trim: true }),
            area,
        );
        return;
    };
    // Rates once known, totals before.
    let value = |c: &model::Counter| if frame.rated { c.rate } else { c.total };
    let max = m.cells.values().map(value).fold(0.0, f64::max);
    let cell_w = 10u16;
    let fit = ((area.width.saturating_sub(8)) / cell_w) as usize;
    let n = m.ranks.len().min(fit.max(1));
    let mut lines = vec![Line::raw(if frame.rated {
        "bytes sent per second, sender row → receiver column".to_string()
    } else {
        "bytes sent since attach (rates from the next refresh)".to_string()
    })];
    let mut head = vec![Span::styled(
        format!("{:>7} ", "from\\to"),
        Style::new().bold(),
    )];
    for r in &m.ranks[..n] {
        head.push(Span::styled(
            format!("{r:>w$}", w = cell_w as usize),
            Style::new().bold(),
        ));
    }
    lines.push(Line::from(head));
    for (i, r) in m.ranks.iter().enumerate().take(area.height as usize) {
        let mut spans = vec![Span::styled(format!("{r:>7} "), Style::new().bold())];
        for j in 0..n {
            let v = m.cells.get(&(i, j)).map(value).unwrap_or(0.0);
            let text = if v > 0.0 { bytes(v) } else { "·".into() };
            let heat = if max > 0.0 { v / max } else { 0.0 };
            spans.push(Span::styled(
                format!("{text:>w$}", w = cell_w as usize),
                heat_style(heat),
            ));
        }
        lines.push(Line::from(spans));
    }
    if n < m.ranks.len() {
        lines.push(Line::styled(
            format!(
                "(columns of {} of {} ranks: widen the terminal for more)",
                n,
                m.ranks.len()
            ),
            Style::new().fg(Color::DarkGray),
        ));
    }
    f.render_widget(Paragraph::new(lines), area);
}

fn heat_style(h: f64) -> Style {
    if h <= 0.0 {
        Style::new().fg(Color::DarkGray)
    } else if h < 0.25 {
        Style::new().fg(Color::Blue)
    } else if h < 0.5 {
        Style::new().fg(Color::Cyan)
    } else if h < 0.75 {
        Style::new().fg(Color::Yellow)
    } else {
        Style::new().fg(Color::Red).bold()
    }
}

/// A bar and a percentage: `███▌      35.2`.
fn bar(fraction: f64, known: bool, width: usize) -> Line<'static> {
    if !known {
        return Line::raw("-");
    }
    let x = fraction.clamp(0.0, 1.0) * width as f64;
    let full = x.floor() as usize;
    let eighths = ((x - full as f64) * 8.0).round() as usize;
    let mut s = "█".repeat(full);
    if full < width && eighths > 0 {
        s.push([' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉', '█'][eighths]);
    }
    let pad = width.saturating_sub(s.chars().count());
    let color = if fraction >= 0.5 {
        Color::Red
    } else if fraction >= 0.2 {
        Color::Yellow
    } else {
        Color::Green
    };
    Line::from(vec![
        Span::styled(s, Style::new().fg(color)),
        Span::raw(format!("{} {:>5.1}", " ".repeat(pad), fraction * 100.0)),
    ])
}

fn percent(fraction: f64, known: bool) -> String {
    if known {
        format!("{:.1}", fraction * 100.0)
    } else {
        "-".into()
    }
}

/// `12.3k`-style counts.
pub fn count(x: f64) -> String {
    si(x, 1000.0, &["", "k", "M", "G", "T"])
}

fn rate(x: f64, known: bool, unit: &str) -> String {
    if known {
        format!("{}{unit}", count(x))
    } else {
        "-".into()
    }
}

fn rate_bytes(x: f64, known: bool) -> String {
    if known && x > 0.0 {
        bytes(x)
    } else if known {
        "0".into()
    } else {
        "-".into()
    }
}

/// `1.5 MiB`-style sizes.
pub fn bytes(x: f64) -> String {
    si(x, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB"])
}

fn si(mut x: f64, step: f64, units: &[&str]) -> String {
    let mut i = 0;
    while x >= step && i + 1 < units.len() {
        x /= step;
        i += 1;
    }
    let sep = if units[i].len() > 1 || units[0] == "B" {
        " "
    } else {
        ""
    };
    if (i == 0 && x.fract() == 0.0) || x >= 100.0 {
        format!("{x:.0}{sep}{}", units[i])
    } else {
        format!("{x:.1}{sep}{}", units[i])
    }
}

/// `3.2 µs`-style durations from seconds.
pub fn duration(secs: f64) -> String {
    let d = Duration::from_secs_f64(secs.max(0.0));
    let ns = d.as_nanos() as f64;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1e9 {
        format!("{:.1} ms", ns / 1e6)
    } else {
        format!("{:.1} s", ns / 1e9)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use ratatui::{Terminal, backend::TestBackend, crossterm::event::KeyCode};

    use super::*;
    use crate::client::top::source::{Reading, parse_exposition};

    #[test]
    fn numbers() {
        assert_eq!(count(0.0), "0");
        assert_eq!(count(1234.0), "1.2k");
        assert_eq!(count(250_000.0), "250k");
        assert_eq!(bytes(1024.0), "1.0 KiB");
        assert_eq!(bytes(12.0), "12 B");
        assert_eq!(duration(0.0000032), "3.2 µs");
        assert_eq!(duration(0.25), "250.0 ms");
    }

    fn screen(app: &App, w: u16, h: u16) -> String {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| draw(f, app)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..h)
            .map(|y| {
                (0..w)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn reading(at: Instant, barrier0: f64, barrier1: f64) -> Reading {
        let text = format!(
            "mpi_rank_info{{jobid=\"4242\",rank=\"0\",pid=\"10\"}} 1\n\
             mpi_rank_info{{jobid=\"4242\",rank=\"1\",pid=\"11\"}} 1\n\
             mpi_calls_total{{jobid=\"4242\",rank=\"0\",function=\"MPI_Barrier\"}} {c}\n\
             mpi_call_seconds_total{{jobid=\"4242\",rank=\"0\",function=\"MPI_Barrier\"}} {barrier0}\n\
             mpi_calls_total{{jobid=\"4242\",rank=\"1\",function=\"MPI_Barrier\"}} {c}\n\
             mpi_call_seconds_total{{jobid=\"4242\",rank=\"1\",function=\"MPI_Barrier\"}} {barrier1}\n\
             mpi_peer_bytes_total{{jobid=\"4242\",rank=\"1\",peer=\"0\",direction=\"send\"}} {b}\n\
             mpi_requests_outstanding{{jobid=\"4242\",rank=\"1\"}} 2\n\
             mpi_request_oldest_age_seconds{{jobid=\"4242\",rank=\"1\"}} 0.5\n",
            c = (barrier0 * 1000.0) as u64,
            b = (barrier0 * 4096.0) as u64,
        );
        let samples = parse_exposition(&text)
            .into_iter()
            .map(|mut s| {
                s.labels.push(("instance".into(), "node1:9479".into()));
                s
            })
            .collect();
        Reading {
            at,
            samples,
            rates: None,
        }
    }

    fn rated_app() -> App {
        let t0 = Instant::now();
        let f0 = Frame::new(&reading(t0, 1.0, 1.0), None);
        let f1 = Frame::new(&reading(t0 + Duration::from_secs(1), 1.9, 1.1), Some(&f0));
        let mut app = App::new("observer http://node1:9479/metrics".into(), None);
        app.frame = Some(f1);
        app
    }

    #[test]
    fn every_screen_draws_its_figures() {
        let mut app = rated_app();
        let s = screen(&app, 100, 20);
        assert!(s.contains("4242"), "{s}");
        assert!(s.contains("MPI_Barrier"), "{s}");
        assert!(s.contains("50.0"), "mean of 90 % and 10 %: {s}");
        app.key(ratatui::crossterm::event::KeyEvent::from(KeyCode::Enter));
        let s = screen(&app, 100, 20);
        assert!(s.contains("job 4242"), "{s}");
        assert!(s.contains("90.0"), "{s}");
        assert!(s.contains("straggler rank 1"), "{s}");
        assert!(s.contains("500.0 ms"), "oldest request: {s}");
        app.key(ratatui::crossterm::event::KeyEvent::from(KeyCode::Enter));
        let s = screen(&app, 100, 20);
        assert!(s.contains("rank 0"), "{s}");
        assert!(s.contains("1.0 ms"), "0.9 s over 900 calls: {s}");
        app.key(ratatui::crossterm::event::KeyEvent::from(KeyCode::Char(
            'm',
        )));
        let s = screen(&app, 100, 20);
        assert!(s.contains("from\\to"), "{s}");
        assert!(
            s.contains("3.6 KiB"),
            "0.9 × 4096 B/s from rank 1 to 0: {s}"
        );
        // Tiny terminals draw without panicking.
        for (w, h) in [(10, 4), (1, 1), (200, 3)] {
            screen(&app, w, h);
        }
        app.key(ratatui::crossterm::event::KeyEvent::from(KeyCode::Char(
            '?',
        )));
        assert!(screen(&app, 80, 20).contains("keys"));
    }
}
