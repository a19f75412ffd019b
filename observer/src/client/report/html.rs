//! The HTML report: one self-contained file (no script, no fetch, no font),
//! the text report's tables plus plots drawn as inline SVG: MPI % per rank,
//! latency histograms of the top functions, message sizes, and the rank x
//! rank traffic matrix as a heatmap. Every plotted figure is also in the
//! plot's tooltips (`<title>`) and `data-*` attributes, so the file can be
//! read by a program as well as a person.

use std::fmt::Write as _;

use super::{Report, advice::secs, slot_label, waits::pattern_name};

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

const STYLE: &str = "
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#1b1b1b;max-width:1200px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ccc}
table{border-collapse:collapse;margin:.5em 0}td,th{padding:2px 8px;border-bottom:1px solid #eee}
th{text-align:left;background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#666}.plots{display:flex;flex-wrap:wrap;gap:1.5em}
ol.findings li{margin:.4em 0}ol.findings .next{display:block;color:#333}
svg text{font:11px system-ui,sans-serif}figure{margin:0}figcaption{font-weight:600}
";

/// Renders every report as one HTML document.
pub fn render(reports: &[Report]) -> String {
    let mut o = String::new();
    let title = match reports {
        [one] => format!("mpi-observer report: job {}", one.title()),
        _ => format!("mpi-observer report: {} jobs", reports.len()),
    };
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n",
        esc(&title)
    );
    for r in reports {
        job(&mut o, r);
    }
    o.push_str("</body></html>\n");
    o
}

fn table_head(o: &mut String, cols: &[&str]) {
    o.push_str("<table><thead><tr>");
    for c in cols {
        let _ = write!(o, "<th>{}</th>", esc(c));
    }
    o.push_str("</tr></thead><tbody>\n");
}

fn job(o: &mut String, r: &Report) {
    let _ = writeln!(
        o,
        "<section class=\"job\" data-jobid=\"{}\"><h1>Job {} <span class=\"note\">({} ranks on {})</span></h1>",
        esc(&r.jobid),
        esc(&r.title()),
        r.totals.ranks,
        esc(&r.hosts.join(", "))
    );
    if let Some(s) = &r.scheduler {
        let _ = writeln!(
            o,
            "<p id=\"scheduler\">Scheduler: {}</p>",
            esc(&s.line(&r.jobid))
        );
    }
    let _ = writeln!(
        o,
        "<p id=\"totals\">MPI time <b>{:.6} s</b> of {:.6} s counted (<b>{:.2}%</b>), <b>{}</b> calls.</p>",
        r.totals.mpi_seconds, r.totals.wall_seconds, r.totals.mpi_percent, r.totals.calls
    );

    findings(o, r);
    o.push_str("<h2>Where the time goes</h2>\n");
    split_bar(o, r);
    waits(o, r);

    o.push_str("<h2>MPI time per rank</h2>\n");
    mpi_bars(o, r);
    table_head(
        o,
        &[
            "Rank", "Host", "Pid", "Wall (s)", "MPI (s)", "MPI %", "Calls", "Source",
        ],
    );
    for l in &r.ranks {
        let _ = writeln!(
            o,
            "<tr class=\"rank\" data-rank=\"{}\"><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.6}</td>\
             <td class=\"n\">{:.6}</td><td class=\"n\">{:.2}</td><td class=\"n calls\">{}</td><td>{}{}{}</td></tr>",
            esc(&l.rank),
            esc(&l.rank),
            esc(&l.host),
            l.pid,
            l.wall_seconds,
            l.mpi_seconds,
            l.mpi_percent,
            l.calls,
            esc(&l.source),
            if l.running { " (running)" } else { "" },
            esc(&super::step_note(l))
        );
    }
    o.push_str("</tbody></table>\n");

    o.push_str("<h2>Top functions</h2>\n");
    table_head(
        o,
        &[
            "Function",
            "Calls",
            "Time (s)",
            "MPI %",
            "Mean (µs)",
            "Bytes sent",
            "Bytes recv",
        ],
    );
    for f in &r.functions {
        let _ = writeln!(
            o,
            "<tr class=\"function\" data-function=\"{}\"><td>{}</td><td class=\"n calls\">{}</td><td class=\"n\">{:.6}</td>\
             <td class=\"n\">{:.2}</td><td class=\"n\">{:.3}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
            esc(&f.name),
            esc(&f.name),
            f.calls,
            f.seconds,
            f.mpi_percent,
            f.mean_us,
            f.bytes_sent,
            f.bytes_recv
        );
    }
    o.push_str("</tbody></table>\n");

    o.push_str("<h2>Top call sites</h2>\n");
    if r.callsites.is_empty() {
        o.push_str("<p class=\"note\">None captured: attach with --callsites, or run the ranks under the shim's stats layer.</p>\n");
    } else {
        table_head(
            o,
            &[
                "Function",
                "Call site",
                "Calls",
                "Time (s)",
                "Mean (µs)",
                "Ranks",
            ],
        );
        for s in &r.callsites {
            let _ = writeln!(
                o,
                "<tr class=\"callsite\" data-function=\"{}\" data-site=\"{}\"><td>{}</td><td><code>{}</code></td>\
                 <td class=\"n calls\">{}</td><td class=\"n\">{:.6}</td><td class=\"n\">{:.3}</td><td class=\"n\">{}</td></tr>",
                esc(&s.function),
                esc(&s.site),
                esc(&s.function),
                esc(&s.site),
                s.calls,
                s.seconds,
                s.mean_us,
                s.ranks
            );
        }
        o.push_str("</tbody></table>\n");
    }

    o.push_str("<h2>Imbalance across ranks</h2>\n");
    table_head(
        o,
        &[
            "Function",
            "Min (s)",
            "Mean (s)",
            "Max (s)",
            "Max / mean",
            "Max rank",
        ],
    );
    for l in &r.imbalance {
        let _ = writeln!(
            o,
            "<tr class=\"imbalance\" data-function=\"{}\"><td>{}</td><td class=\"n\">{:.6}</td><td class=\"n\">{:.6}</td>\
             <td class=\"n\">{:.6}</td><td class=\"n\">{:.2}</td><td class=\"n\">{}</td></tr>",
            esc(&l.name),
            esc(&l.name),
            l.min_seconds,
            l.mean_seconds,
            l.max_seconds,
            l.max_over_mean,
            esc(&l.max_rank)
        );
    }
    o.push_str("</tbody></table>\n");

    o.push_str("<h2>Latency</h2>\n<div class=\"plots\">\n");
    for l in &r.latency {
        histogram(
            o,
            &format!("{} latency", l.name),
            "latency",
            &l.name,
            &l.hist,
            "ns",
        );
    }
    o.push_str("</div>\n");

    o.push_str("<h2>Message sizes</h2>\n");
    if r.message_sizes.ranks_with_stats > 0 {
        o.push_str("<div class=\"plots\">\n");
        histogram(
            o,
            "Messages sent, by size",
            "sizes",
            "sent",
            &r.message_sizes.sent,
            "B",
        );
        histogram(
            o,
            "Messages received, by size",
            "sizes",
            "recv",
            &r.message_sizes.recv,
            "B",
        );
        o.push_str("</div>\n");
    } else {
        o.push_str("<p class=\"note\">No size histogram: the ranks ran without the shim's stats layer.</p>\n");
    }
    if !r.message_sizes.mean_bytes.is_empty() {
        table_head(o, &["Function", "Calls", "Mean bytes per call"]);
        for m in &r.message_sizes.mean_bytes {
            let _ = writeln!(
                o,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{:.1}</td></tr>",
                esc(&m.name),
                m.calls,
                m.mean_bytes
            );
        }
        o.push_str("</tbody></table>\n");
    }

    o.push_str("<h2>Traffic between ranks</h2>\n");
    if r.matrix.is_empty() {
        o.push_str("<p class=\"note\">No matrix: needs the shim's stats layer (<code>mpi-observer run --tools stats</code> or <code>attach --inject</code>).</p>\n");
    } else {
        heatmap(o, r);
        table_head(o, &["From", "To", "Messages", "Bytes"]);
        for p in &r.peer_pairs {
            let _ = writeln!(
                o,
                "<tr class=\"pair\" data-from=\"{}\" data-to=\"{}\"><td class=\"n\">{}</td><td class=\"n\">{}</td>\
                 <td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                p.from, p.to, p.from, p.to, p.messages, p.bytes
            );
        }
        o.push_str("</tbody></table>\n");
    }
    o.push_str("</section>\n");
}

/// MPI % per rank as horizontal bars.
fn mpi_bars(o: &mut String, r: &Report) {
    let row = 18;
    let left = 60;
    let width = 500;
    let h = row * r.ranks.len() + 30;
    let max = r.ranks.iter().map(|l| l.mpi_percent).fold(100.0, f64::max);
    let _ = writeln!(
        o,
        "<figure><figcaption>MPI % per rank</figcaption><svg id=\"mpi-percent\" class=\"plot\" width=\"{}\" height=\"{h}\" \
         viewBox=\"0 0 {} {h}\" role=\"img\" aria-label=\"MPI percent per rank\">",
        left + width + 70,
        left + width + 70
    );
    for (i, l) in r.ranks.iter().enumerate() {
        let y = i * row + 4;
        let w = (l.mpi_percent / max * width as f64).round().max(0.0);
        let _ = writeln!(
            o,
            "<g class=\"bar\" data-rank=\"{}\" data-mpi-percent=\"{:.2}\"><title>rank {}: {:.2}% MPI ({:.6} s of {:.6} s)</title>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"end\">rank {}</text>\
             <rect x=\"{left}\" y=\"{y}\" width=\"{w}\" height=\"{}\" fill=\"#4e79a7\"></rect>\
             <text x=\"{}\" y=\"{}\">{:.2}%</text></g>",
            esc(&l.rank),
            l.mpi_percent,
            esc(&l.rank),
            l.mpi_percent,
            l.mpi_seconds,
            l.wall_seconds,
            left - 6,
            y + 12,
            esc(&l.rank),
            row - 4,
            left as f64 + w + 4.0,
            y + 12,
            l.mpi_percent
        );
    }
    let axis = r.ranks.len() * row + 18;
    let _ = writeln!(
        o,
        "<text x=\"{left}\" y=\"{axis}\">0%</text><text x=\"{}\" y=\"{axis}\" text-anchor=\"end\">{max:.0}%</text></svg></figure>",
        left + width
    );
}

/// A log2 histogram as vertical bars, over its non-empty slot range.
fn histogram(o: &mut String, caption: &str, class: &str, key: &str, hist: &[u64], unit: &str) {
    let first = hist.iter().position(|&v| v > 0);
    let last = hist.iter().rposition(|&v| v > 0);
    let (Some(first), Some(last)) = (first, last) else {
        let _ = writeln!(
            o,
            "<figure><figcaption>{}</figcaption><p class=\"note\">no calls</p></figure>",
            esc(caption)
        );
        return;
    };
    let n = last - first + 1;
    let bw = 28;
    let ph = 140;
    let top = 10;
    let w = n * bw + 50;
    let h = ph + top + 40;
    let max = hist[first..=last].iter().copied().max().unwrap_or(1).max(1);
    let _ = writeln!(
        o,
        "<figure><figcaption>{}</figcaption><svg class=\"plot {class}\" data-key=\"{}\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{}\">",
        esc(caption),
        esc(key),
        esc(caption)
    );
    for (i, &v) in hist[first..=last].iter().enumerate() {
        let slot = first + i;
        let bh = (v as f64 / max as f64 * ph as f64).round() as usize;
        let x = 40 + i * bw;
        let from = if unit == "B" && slot == 0 {
            "0B".to_string()
        } else {
            slot_label(slot, unit)
        };
        let _ = writeln!(
            o,
            "<g class=\"bin\" data-from=\"{from}\" data-count=\"{v}\"><title>{from} and up: {v}</title>\
             <rect x=\"{x}\" y=\"{}\" width=\"{}\" height=\"{bh}\" fill=\"#59a14f\"></rect>\
             <text x=\"{}\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-45 {} {})\">{from}</text></g>",
            top + ph - bh,
            bw - 3,
            x + bw / 2,
            top + ph + 14,
            x + bw / 2,
            top + ph + 14
        );
    }
    let _ = writeln!(
        o,
        "<text x=\"2\" y=\"{}\">{max}</text><text x=\"2\" y=\"{}\">0</text></svg></figure>",
        top + 10,
        top + ph
    );
}

/// The rank x rank matrix of bytes sent, as a heatmap (white to dark red on
/// a log scale).
fn heatmap(o: &mut String, r: &Report) {
    let n = r.matrix_ranks.len();
    let cell = if n <= 16 {
        28
    } else if n <= 64 {
        10
    } else {
        4
    };
    let left = 50;
    let top = 30;
    let w = left + n * cell + 20;
    let h = top + n * cell + 20;
    let max = r.matrix.iter().flatten().copied().max().unwrap_or(0).max(1);
    let lmax = (max as f64 + 1.0).ln();
    let _ = writeln!(
        o,
        "<figure><figcaption>Bytes sent, rank (row) to rank (column)</figcaption>\
         <svg id=\"matrix\" class=\"plot heatmap\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"traffic matrix\">"
    );
    let labels = n <= 32;
    for (j, c) in r.matrix_ranks.iter().enumerate() {
        if labels {
            let _ = write!(
                o,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{c}</text>",
                left + j * cell + cell / 2,
                top - 6
            );
        }
    }
    for (i, row) in r.matrix.iter().enumerate() {
        let from = r.matrix_ranks[i];
        if labels {
            let _ = write!(
                o,
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{from}</text>",
                left - 6,
                top + i * cell + cell / 2 + 4
            );
        }
        for (j, &v) in row.iter().enumerate() {
            let to = r.matrix_ranks[j];
            let t = if v == 0 {
                0.0
            } else {
                (v as f64 + 1.0).ln() / lmax
            };
            // White (255,255,255) to dark red (140,20,20).
            let c = |hi: f64, lo: f64| (hi + (lo - hi) * t).round() as u8;
            let _ = write!(
                o,
                "<rect class=\"cell\" data-from=\"{from}\" data-to=\"{to}\" data-bytes=\"{v}\" x=\"{}\" y=\"{}\" \
                 width=\"{cell}\" height=\"{cell}\" fill=\"rgb({},{},{})\" stroke=\"#ddd\"><title>{from} to {to}: {v} bytes</title></rect>",
                left + j * cell,
                top + i * cell,
                c(255.0, 140.0),
                c(255.0, 20.0),
                c(255.0, 20.0)
            );
        }
        o.push('\n');
    }
    o.push_str("</svg></figure>\n");
}

/// The findings, the most costly first, each with its next step.
fn findings(o: &mut String, r: &Report) {
    o.push_str("<h2>Findings</h2>\n");
    if r.findings.is_empty() {
        o.push_str("<p class=\"note\">None: no rule of the report applies.</p>\n");
        return;
    }
    o.push_str("<ol class=\"findings\">\n");
    for f in &r.findings {
        let ranks: Vec<String> = f.ranks.iter().map(u32::to_string).collect();
        let _ = writeln!(
            o,
            "<li class=\"finding\" data-rule=\"{}\" data-ranks=\"{}\" data-seconds=\"{:.6}\">{}\
             <span class=\"next\">Next: {}</span></li>",
            esc(&f.rule),
            esc(&ranks.join(" ")),
            f.seconds,
            esc(&f.text),
            esc(&f.next)
        );
    }
    o.push_str("</ol>\n");
}

/// The colour of a part of the time split.
fn part_colour(label: &str) -> &'static str {
    match label {
        "compute" => "#59a14f",
        "wait_barrier" => "#e15759",
        "wait_nxn" => "#f28e2b",
        "late_broadcast" => "#b07aa1",
        "early_reduce" => "#ff9da7",
        "late_sender" => "#edc948",
        "late_receiver" => "#9c755f",
        _ => "#4e79a7",
    }
}

/// The job's time as one stacked bar: computation, waiting per pattern,
/// the rest of MPI.
fn split_bar(o: &mut String, r: &Report) {
    let t = &r.split;
    let mut parts: Vec<(String, String, f64)> =
        vec![("compute".into(), "computation".into(), t.compute_seconds)];
    for (label, v) in &t.waiting {
        parts.push((
            label.clone(),
            format!("waiting: {}", pattern_name(label)),
            *v,
        ));
    }
    let rest = if r.waits.is_some() {
        "the rest of MPI"
    } else {
        "MPI (waiting not measured)"
    };
    parts.push(("mpi".into(), rest.into(), t.other_mpi_seconds));
    let total: f64 = parts.iter().map(|p| p.2).sum();
    let width = 640.0;
    let _ = writeln!(
        o,
        "<figure><figcaption>Time summed over ranks: {} s</figcaption>\
         <svg id=\"time-split\" class=\"plot\" width=\"660\" height=\"{}\" viewBox=\"0 0 660 {}\" role=\"img\" \
         aria-label=\"time split\">",
        secs(t.wall_seconds),
        40 + 16 * parts.len(),
        40 + 16 * parts.len()
    );
    let mut x = 0.0;
    for (label, name, v) in &parts {
        let w = if total > 0.0 { v / total * width } else { 0.0 };
        let _ = writeln!(
            o,
            "<g class=\"part\" data-part=\"{}\" data-seconds=\"{v:.6}\"><title>{}: {v:.6} s ({:.1}%)</title>\
             <rect x=\"{x:.1}\" y=\"4\" width=\"{w:.1}\" height=\"22\" fill=\"{}\"></rect></g>",
            esc(label),
            esc(name),
            super::per_cent(*v, total),
            part_colour(label)
        );
        x += w;
    }
    for (i, (label, name, v)) in parts.iter().enumerate() {
        let y = 36 + 16 * i;
        let _ = writeln!(
            o,
            "<rect x=\"0\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"></rect>\
             <text x=\"16\" y=\"{}\">{}: {} s ({:.1}%)</text>",
            y,
            part_colour(label),
            y + 9,
            esc(name),
            secs(*v),
            super::per_cent(*v, total)
        );
    }
    o.push_str("</svg></figure>\n");
}

/// The wait states: per pattern, the ranks that waited and those that
/// made them wait, and the calls waited in.
fn waits(o: &mut String, r: &Report) {
    let Some(w) = &r.waits else {
        o.push_str(
            "<p class=\"note\" id=\"no-waits\">Who waits for whom was not measured: the ranks ran \
             without the shim's wait records (<code>mpi-observer run --tools stats</code>).</p>\n",
        );
        return;
    };
    o.push_str("<h2>Wait states</h2>\n");
    table_head(o, &["Pattern", "Waited (s)", "Instances", "MPI %"]);
    for p in &w.patterns {
        let _ = writeln!(
            o,
            "<tr class=\"pattern\" data-pattern=\"{}\"><td>{}</td><td class=\"n\">{:.6}</td>\
             <td class=\"n\">{}</td><td class=\"n\">{:.2}</td></tr>",
            esc(&p.pattern),
            esc(&p.name),
            p.seconds,
            p.instances,
            p.mpi_percent
        );
    }
    o.push_str("</tbody></table>\n");
    let _ = writeln!(
        o,
        "<p class=\"note\">Sampled one in {} collectives{}. Unresolved: {}. Pending: {}. Records lost: {}, invalid: {}{}.</p>",
        w.sample_period.max(1),
        if w.p2p_sample_period == 0 {
            ", no messages".to_string()
        } else {
            format!(" and one in {} messages", w.p2p_sample_period)
        },
        if w.unresolved.is_empty() {
            "none".to_string()
        } else {
            esc(&w.reasons())
        },
        w.pending,
        w.records_lost,
        w.records_invalid,
        esc(&w.clocks())
    );
    o.push_str("<div class=\"plots\"><div>\n");
    table_head(o, &["Rank that waited", "Seconds", "Own MPI %", "Mostly"]);
    for l in &w.waiting {
        let _ = writeln!(
            o,
            "<tr class=\"waiting\" data-rank=\"{}\"><td>{}</td><td class=\"n\">{:.6}</td>\
             <td class=\"n\">{:.2}</td><td>{}</td></tr>",
            l.rank,
            l.rank,
            l.seconds,
            l.mpi_percent,
            esc(pattern_name(&l.pattern))
        );
    }
    o.push_str("</tbody></table></div><div>\n");
    table_head(
        o,
        &[
            "Rank that made others wait",
            "Seconds",
            "% of waiting",
            "Mostly",
        ],
    );
    for c in &w.culprits {
        let _ = writeln!(
            o,
            "<tr class=\"culprit\" data-rank=\"{}\"><td>{}</td><td class=\"n\">{:.6}</td>\
             <td class=\"n\">{:.2}</td><td>{}</td></tr>",
            c.rank,
            c.rank,
            c.seconds,
            c.wait_percent,
            esc(pattern_name(&c.pattern))
        );
    }
    o.push_str("</tbody></table></div></div>\n");
    if !w.functions.is_empty() {
        table_head(o, &["Waited in", "Pattern", "Seconds"]);
        for f in &w.functions {
            let _ = writeln!(
                o,
                "<tr class=\"waited-in\"><td>{}</td><td>{}</td><td class=\"n\">{:.6}</td></tr>",
                esc(&f.function),
                esc(pattern_name(&f.pattern)),
                f.seconds
            );
        }
        o.push_str("</tbody></table>\n");
    }
}
