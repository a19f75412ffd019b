//! Scrape time and memory at scale: `cargo bench -p mpi-observer --bench scrape`.
//!
//! Loads the real eBPF object (needs root, like the daemon), fills the
//! `MPI_STATS` map with 256 ranks × 60 functions of synthetic figures
//! (calls, time, bytes, a spread-out histogram), registers 256 synthetic ranks, then times
//! [`State::scrape`] (wall and thread CPU time: the default, bounded
//! exposition, then every rank in full with per-rank histograms) and a real
//! HTTP scrape through the daemon's server.
//! Prints `key=value` lines that `cargo xtask bench observer` reads.

use std::{
    io::{Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    sync::{Arc, Mutex, mpsc},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};
use aya::maps::{HashMap, MapData, MapError};
use mpi_observer::{
    EBPF_OBJECT,
    attach::functions,
    attach::probes::Probes,
    export::metrics::RenderOptions,
    export::registry::{Rank, State},
    export::server,
};
use observer_common::maps::{self, CallStats, HIST_SLOTS, StatKey};

const RANKS: u32 = 256;
const FUNCTIONS: usize = 60;
const SCRAPES: usize = 31;
const HTTP_SCRAPES: usize = 11;
/// Synthetic pids start here, far above any real pid on a small machine.
const PID_BASE: u32 = 3_000_000;

fn median_ms(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// This thread's CPU time in ms: the scrape's own cost, without the time
/// other load on the machine holds the CPU.
fn thread_cpu_ms() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 * 1e3 + t.tv_nsec as f64 / 1e6
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn fill(probes: &mut Probes, ids: &[u16], retries: &mut u64) -> Result<()> {
    let map = probes
        .ebpf_mut()
        .map_mut(maps::STATS)
        .context("MPI_STATS map in the object")?;
    let mut stats = HashMap::<&mut MapData, StatKey, CallStats>::try_from(map)?;
    for r in 0..RANKS {
        for (j, &id) in ids.iter().enumerate() {
            let mut value = CallStats::ZERO;
            value.calls = 1000 + j as u64;
            value.time_ns = value.calls * 1500;
            value.bytes = [value.calls * 64, value.calls * 32];
            value.bytes_unknown = [u64::from(r % 2), 0];
            for (k, h) in value.hist.iter_mut().enumerate().take(HIST_SLOTS) {
                *h = (k as u64 + r as u64) % 7;
            }
            let key = StatKey {
                tgid: PID_BASE + r,
                func: id as u32,
            };
            // Elements of a BPF_F_NO_PREALLOC map come from a cache the
            // kernel refills asynchronously; a burst of inserts can find it
            // empty (ENOMEM) for a moment.
            let mut tries = 0;
            loop {
                match stats.insert(key, value, 0) {
                    Ok(()) => break,
                    Err(MapError::SyscallError(e))
                        if e.io_error.raw_os_error() == Some(libc::ENOMEM) && tries < 1000 =>
                    {
                        tries += 1;
                        *retries += 1;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(())
}

fn http_get(addr: SocketAddr) -> Result<usize> {
    let mut c = TcpStream::connect(addr)?;
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
    let mut body = Vec::new();
    c.read_to_end(&mut body)?;
    if !body.starts_with(b"HTTP/1.1 200") {
        bail!(
            "scrape answered {}",
            String::from_utf8_lossy(&body[..body.len().min(80)])
        );
    }
    Ok(body.len())
}

fn main() -> Result<()> {
    // `cargo bench` passes `--bench`; there are no options to parse.
    let mut probes = Probes::load(EBPF_OBJECT).context("loading the eBPF object (run as root)")?;
    let ids: Vec<u16> = functions::select(None)?
        .into_iter()
        .take(FUNCTIONS)
        .collect();
    if ids.len() != FUNCTIONS {
        bail!("only {} default functions", ids.len());
    }
    let mut retries = 0;
    fill(&mut probes, &ids, &mut retries)?;
    let mut state = State::new(Some(probes), ids, true, RenderOptions::default());
    for r in 0..RANKS {
        state
            .ranks
            .insert(PID_BASE + r, Rank::synthetic(PID_BASE + r, r, "bench-job"));
    }

    let mut out_len = 0;
    let mut series = 0;
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..SCRAPES {
        let (t, c) = (Instant::now(), thread_cpu_ms());
        let text = state.scrape();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        cpu.push(thread_cpu_ms() - c);
        out_len = text.len();
        series = text.lines().filter(|l| !l.starts_with('#')).count();
    }
    let scrape_ms = median_ms(times);
    let scrape_cpu_ms = median_ms(cpu);

    // The map-reading part alone.
    let probes = state.probes.as_ref().context("probes loaded")?;
    let mut cpu = Vec::new();
    for _ in 0..SCRAPES {
        let c = thread_cpu_ms();
        let stats = probes.read_stats();
        cpu.push(thread_cpu_ms() - c);
        assert_eq!(stats.len(), RANKS as usize);
    }
    let read_cpu_ms = median_ms(cpu);

    // Every rank in full with its histograms: the costliest exposition
    // (before issue 22's bounded default, --per-rank-histograms alone).
    state.render.per_rank_histograms = true;
    state.render.per_rank_detail = true;
    let mut times = Vec::new();
    let mut cpu = Vec::new();
    let mut series_per_rank = 0;
    for _ in 0..SCRAPES {
        let (t, c) = (Instant::now(), thread_cpu_ms());
        let text = state.scrape();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        cpu.push(thread_cpu_ms() - c);
        series_per_rank = text.lines().filter(|l| !l.starts_with('#')).count();
    }
    let scrape_per_rank_ms = median_ms(times);
    let scrape_per_rank_cpu_ms = median_ms(cpu);
    state.render.per_rank_histograms = false;
    state.render.per_rank_detail = false;

    // The same through the daemon's HTTP server, on its own runtime thread.
    let state = Arc::new(Mutex::new(state));
    let (tx, rx) = mpsc::channel();
    let served = state.clone();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        rt.block_on(async move {
            let l = server::bind("127.0.0.1:0".parse().expect("address"))
                .await
                .expect("bind 127.0.0.1:0");
            tx.send(l.local_addr().expect("local address"))
                .expect("bench waits");
            server::serve(l, served, None).await;
        });
    });
    let addr = rx.recv()?;
    let mut times = Vec::new();
    let mut http_len = 0;
    for _ in 0..HTTP_SCRAPES {
        let t = Instant::now();
        http_len = http_get(addr)?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let http_ms = median_ms(times);

    println!("ranks={RANKS}");
    println!("functions={FUNCTIONS}");
    println!("map_entries={}", RANKS as usize * FUNCTIONS);
    println!("cpus={}", aya::util::nr_cpus().unwrap_or(0));
    println!("insert_enomem_retries={retries}");
    println!("series={series}");
    println!("exposition_bytes={out_len}");
    println!("scrape_ms={scrape_ms:.2}");
    println!("scrape_cpu_ms={scrape_cpu_ms:.2}");
    println!("read_stats_cpu_ms={read_cpu_ms:.2}");
    println!("series_per_rank_hist={series_per_rank}");
    println!("scrape_per_rank_hist_ms={scrape_per_rank_ms:.2}");
    println!("scrape_per_rank_hist_cpu_ms={scrape_per_rank_cpu_ms:.2}");
    println!("http_scrape_ms={http_ms:.2}");
    println!("http_response_bytes={http_len}");
    println!("vmhwm_kib={}", status_kib("VmHWM:"));
    println!("vmrss_kib={}", status_kib("VmRSS:"));
    Ok(())
}
