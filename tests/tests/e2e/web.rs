//! The exporter as a production service (issue 9): the HTTP(S) server of
//! `mpi-observer attach` against real clients.
//!
//! - A real Prometheus scrapes the daemon over HTTPS with basic auth
//!   (`--web.config.file`, certificates made with rcgen by [`e2e::tls`]):
//!   `up` is 1 with the right password, 0 with a wrong one or over plain
//!   HTTP; direct requests without or with a wrong password get 401; the
//!   files are reread when they change.
//! - 3,000 half-sent requests held open cost no collection: a scrape still
//!   answers within a second, the daemon's threads and memory stay bounded,
//!   and `mpi_observer_scrapes_total` does not move for them.
//! - gzip when asked; `promtool check metrics` clean; a bad config is one
//!   line and exit 1; a non-loopback address without TLS or auth warns.
//! - `mpi-observer report --url https://... --ca-file --auth-file` reads
//!   a real job's exact figures from a daemon serving the shipped web
//!   config (TLS and basic auth), as the Slurm Epilog does; a wrong CA, a
//!   wrong password, no CA, an auth file others may read and plain HTTP to
//!   the TLS port are each one line and exit 1; a password in the URL
//!   works with a one-line warning; `top --endpoint https://...` reads it
//!   the same way.
//!
//! The daemons run with `--no-bpf`: the server is the same either way, and
//! loaded BPF programs would trip the probe-leak checks
//! (`assert_no_probes_left`) of other suites running at the same time.

use std::{
    io::{BufRead as _, Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use e2e::{
    Job, Mpi, Need, compile, free_port,
    http::{self, Request, Response},
    http_get, observer_bin, parse_metrics, program, promtool_check, require, run_with_timeout,
    scratch, shim_launcher,
    tls::{
        WEB_USER as USER, basic, get_tls, make_certs, tls_client, tls_client_with_cert, web_config,
    },
    wait_for, workspace_root,
};

const PASSWORD: &str = "s3cret-scrape";

// ------------------------------------------------------------ HTTP clients

/// How long a request may take to connect, and between reads.
const LIMIT: Duration = Duration::from_secs(10);

/// GET over plain TCP with extra headers.
fn get(addr: &str, path: &str, headers: &[(&str, String)]) -> std::io::Result<Response> {
    http::send(
        addr,
        &Request {
            headers,
            ..Request::get(path)
        },
        LIMIT,
    )
}

/// GET over HTTP/1.0 (never chunked), for Prometheus's API.
fn get10(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let req = Request {
        http10: true,
        ..Request::get(path)
    };
    let r = http::send(addr, &req, Duration::from_secs(15))?;
    Ok((r.status, r.text()))
}

fn gunzip(data: &[u8]) -> String {
    let mut out = String::new();
    flate2::read::GzDecoder::new(data)
        .read_to_string(&mut out)
        .expect("a gzip body");
    out
}

/// The exposition without the two self-metrics that change from one
/// scrape to the next.
fn stable(text: &str) -> String {
    text.lines()
        .filter(|l| {
            !l.starts_with("mpi_observer_scrape_duration_seconds ")
                && !l.starts_with("mpi_observer_scrapes_total ")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn scrapes_total(text: &str) -> f64 {
    parse_metrics(text)
        .iter()
        .find(|s| s.name == "mpi_observer_scrapes_total")
        .map(|s| s.value)
        .expect("mpi_observer_scrapes_total in the exposition")
}

// ---------------------------------------------------------------- daemons

/// `mpi-observer attach --all --no-bpf --listen LISTEN ARGS`, its stderr
/// echoed with a `[daemon]` tag and kept.
struct WebDaemon {
    child: Option<Child>,
    /// Where to connect: 127.0.0.1 and the port.
    addr: String,
    lines: Arc<Mutex<Vec<String>>>,
}

impl WebDaemon {
    fn start(listen_host: &str, args: &[&str]) -> WebDaemon {
        let port = free_port();
        let mut child = Command::new(observer_bin())
            .args(["attach", "--all", "--no-bpf"])
            // Exited ranks go soon, unless the test keeps them.
            .args(if args.contains(&"--retain-exited") {
                &[][..]
            } else {
                &["--retain-exited", "1"][..]
            })
            .args(["--listen", &format!("{listen_host}:{port}")])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mpi-observer");
        let stderr = child.stderr.take().expect("piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let keep = lines.clone();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                eprintln!("[daemon] {l}");
                keep.lock().unwrap().push(l);
            }
        });
        let d = WebDaemon {
            child: Some(child),
            addr: format!("127.0.0.1:{port}"),
            lines,
        };
        wait_for("the daemon to listen", Duration::from_secs(60), || {
            d.assert_running();
            TcpStream::connect(&d.addr).ok()
        });
        d
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn assert_running(&self) {
        // SAFETY: signal 0 only checks that our child exists.
        let alive = unsafe { libc::kill(self.pid() as i32, 0) } == 0
            && std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
                .is_ok_and(|s| !s.contains(") Z "));
        assert!(alive, "the daemon must keep running");
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    /// Threads and VmRSS (KiB) from /proc/PID/status.
    fn threads_rss(&self) -> (u64, u64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} in /proc/PID/status"))
        };
        (field("Threads:"), field("VmRSS:"))
    }
}

impl Drop for WebDaemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Waits for the daemon to exit on its own; returns (status, stderr).
fn run_daemon(args: &[&str]) -> (std::process::ExitStatus, String) {
    let o = run_with_timeout(
        Command::new(observer_bin())
            .args(["attach", "--all", "--no-bpf", "--listen"])
            .arg(format!("127.0.0.1:{}", free_port()))
            .args(args),
        Duration::from_secs(30),
    );
    (o.status, String::from_utf8_lossy(&o.stderr).into_owned())
}

// ------------------------------------------------------------------ tests

#[test]
fn prometheus_scrapes_over_https_with_basic_auth() {
    if !require(&[Need::Command("prometheus"), Need::Command("promtool")]) {
        return;
    }
    let dir = scratch("web-https");
    make_certs(&dir);
    let cfg = web_config(&dir, PASSWORD);
    // The daemon runs from elsewhere: the relative paths in the file must
    // resolve against its directory, not the working directory.
    let daemon = WebDaemon::start("127.0.0.1", &["--web.config.file", cfg.to_str().unwrap()]);
    let client = tls_client(&dir.join("ca.crt"));
    let ok = [basic(USER, PASSWORD)];
    let r = wait_for(
        "an authenticated HTTPS scrape",
        Duration::from_secs(30),
        || {
            get_tls(&client, &daemon.addr, "/metrics", &ok)
                .ok()
                .filter(|r| r.status == 200)
        },
    );
    assert!(
        r.text()
            .contains("# TYPE mpi_observer_scrapes_total counter")
    );
    assert!(
        daemon
            .lines()
            .iter()
            .any(|l| l.contains("serving https://")),
        "the start-up line names https: {:?}",
        daemon.lines()
    );
    assert!(
        !daemon.lines().iter().any(|l| l.contains("warning")),
        "no warning on loopback with TLS and auth: {:?}",
        daemon.lines()
    );
    promtool_check(&r.text());
    // The example's headers.
    assert_eq!(r.header("X-Content-Type-Options"), Some("nosniff"));

    // No password, a wrong one, an unknown user, a malformed header: 401
    // with a Basic challenge, and no metrics.
    for (what, headers) in [
        ("no password", vec![]),
        ("a wrong password", vec![basic(USER, "wrong")]),
        ("an unknown user", vec![basic("nobody", PASSWORD)]),
        ("an empty password", vec![basic(USER, "")]),
        (
            "a bearer token",
            vec![("Authorization", "Bearer abc".to_string())],
        ),
    ] {
        for path in [
            "/metrics",
            "/metrics/ranks",
            "/metrics/ranks?jobid=1",
            "/",
            "/nope",
        ] {
            let r = get_tls(&client, &daemon.addr, path, &headers).unwrap();
            assert_eq!(r.status, 401, "{what} on {path}: {}", r.text());
            assert!(
                r.header("WWW-Authenticate")
                    .is_some_and(|v| v.starts_with("Basic")),
                "{what}: a Basic challenge: {:?}",
                r.headers
            );
            assert!(!r.text().contains("mpi_"), "{what}: no metrics");
        }
    }
    // Authenticated: the landing page, 404 and 405 as before.
    let r = get_tls(&client, &daemon.addr, "/", &ok).unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("<a href=\"/metrics\">"));
    // /metrics/ranks behind the same authentication.
    let r = get_tls(&client, &daemon.addr, "/metrics/ranks", &ok).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().starts_with("# mpi-observer:"), "{}", r.text());
    assert_eq!(
        get_tls(&client, &daemon.addr, "/nope", &ok).unwrap().status,
        404
    );

    // Plain HTTP to the TLS port: a 400 that says why, never metrics.
    let (code, body) = http_get(&daemon.addr, "/metrics").unwrap();
    assert_eq!(code, 400, "plain HTTP to the TLS port: {body}");
    assert!(body.contains("HTTPS") && !body.contains("mpi_"), "{body}");

    // A real Prometheus, configured with the shipped scrape snippet
    // (dashboards/deploy/scrape-tls.yml): the right password scrapes (up
    // 1); a wrong password and plain HTTP do not (up 0).
    let target = format!("['{}']", daemon.addr);
    let ca = dir.join("ca.crt");
    std::fs::write(dir.join("password"), PASSWORD).unwrap();
    let snippet =
        std::fs::read_to_string(workspace_root().join("dashboards/deploy/scrape-tls.yml")).unwrap();
    for path in [
        "/etc/prometheus/mpi-observer-ca.crt",
        "/etc/prometheus/mpi-observer.password",
    ] {
        assert!(snippet.contains(path), "scrape-tls.yml names {path}");
    }
    let snippet = snippet
        .replace("/etc/prometheus/mpi-observer-ca.crt", ca.to_str().unwrap())
        .replace(
            "/etc/prometheus/mpi-observer.password",
            dir.join("password").to_str().unwrap(),
        );
    let job = |name: &str, scheme: &str, password: &str| {
        format!(
            "  - job_name: {name}\n    scheme: {scheme}\n    tls_config:\n      ca_file: {}\n    \
             basic_auth:\n      username: {USER}\n      password: {password}\n    \
             static_configs:\n      - targets: {target}\n",
            ca.display()
        )
    };
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n{}\n    static_configs:\n      - targets: {target}\n{}{}",
            snippet.trim_end(),
            job("web-wrong-password", "https", "wrong"),
            job("web-plain-http", "http", PASSWORD),
        ),
    )
    .unwrap();
    let prom_addr = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
    let mut prometheus = Command::new("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address={prom_addr}"))
        .arg("--log.level=warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start prometheus");
    struct Kill<'a>(&'a mut Child);
    impl Drop for Kill<'_> {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let prometheus = Kill(&mut prometheus);
    let started = Instant::now();
    let up = || -> Option<Vec<(String, f64)>> {
        let (code, body) = get10(&prom_addr, "/api/v1/query?query=up").ok()?;
        (code == 200).then_some(())?;
        let v: serde_json::Value = serde_json::from_str(&body).ok()?;
        Some(
            v["data"]["result"]
                .as_array()?
                .iter()
                .map(|r| {
                    (
                        r["metric"]["job"].as_str().unwrap_or("").to_string(),
                        r["value"][1]
                            .as_str()
                            .unwrap_or("NaN")
                            .parse()
                            .unwrap_or(f64::NAN),
                    )
                })
                .collect(),
        )
    };
    let want =
        |job: &str, v: f64, up: &[(String, f64)]| up.iter().any(|(j, x)| j == job && *x == v);
    let seen = wait_for(
        "Prometheus: up 1 for mpi-observer, 0 for the wrong password and plain HTTP",
        Duration::from_secs(90),
        || {
            if let Ok(Some(st)) = prometheus.0.try_wait() {
                panic!(
                    "prometheus exited ({st}): {}",
                    std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
                );
            }
            let up = up()?;
            (want("mpi-observer", 1.0, &up)
                && want("web-wrong-password", 0.0, &up)
                && want("web-plain-http", 0.0, &up))
            .then_some(up)
        },
    );
    eprintln!("Prometheus up after {:?}: {seen:?}", started.elapsed());
    // And the samples got in.
    wait_for(
        "Prometheus to store mpi_observer_scrapes_total from mpi-observer",
        Duration::from_secs(30),
        || {
            let (_, body) =
                get10(&prom_addr, "/api/v1/query?query=mpi_observer_scrapes_total").ok()?;
            body.contains("\"job\":\"mpi-observer\"").then_some(())
        },
    );
    drop(prometheus);

    // A changed file is reread: a new password works without a restart,
    // the old one stops working.
    web_config(&dir, "rotated-password");
    wait_for(
        "the daemon to reread the web config",
        Duration::from_secs(30),
        || {
            get_tls(
                &client,
                &daemon.addr,
                "/metrics",
                &[basic(USER, "rotated-password")],
            )
            .ok()
            .filter(|r| r.status == 200)
        },
    );
    assert_eq!(
        get_tls(&client, &daemon.addr, "/metrics", &ok)
            .unwrap()
            .status,
        401,
        "the old password after the rotation"
    );
    assert!(daemon.lines().iter().any(|l| l.contains("reloaded")));
    daemon.assert_running();
}

/// Raises this process's soft descriptor limit towards `want`; returns the
/// limit in force.
fn raise_nofile(want: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a valid struct.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        if r.rlim_cur < want {
            let mut n = r;
            n.rlim_cur = want.min(r.rlim_max);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &n) == 0 {
                r = n;
            }
        }
    }
    r.rlim_cur
}

#[test]
fn half_sent_requests_cost_nothing() {
    const HALF: usize = 3_000;
    let limit = raise_nofile(HALF as u64 + 256);
    // Leave room for the test harness's own descriptors.
    let batch = HALF.min(limit.saturating_sub(128) as usize).max(100);
    let daemon = WebDaemon::start("127.0.0.1", &[]);
    // Warm up, then the baseline.
    for _ in 0..3 {
        assert_eq!(http_get(&daemon.addr, "/metrics").unwrap().0, 200);
    }
    std::thread::sleep(Duration::from_millis(500));
    let (threads0, rss0) = daemon.threads_rss();
    let (_, body) = http_get(&daemon.addr, "/metrics").unwrap();
    let mut expect = scrapes_total(&body);

    let started = Instant::now();
    let mut sent = 0;
    let mut slowest = Duration::ZERO;
    while sent < HALF {
        let n = batch.min(HALF - sent);
        let mut held = Vec::with_capacity(n);
        for i in 0..n {
            let Ok(mut s) =
                TcpStream::connect_timeout(&daemon.addr.parse().unwrap(), Duration::from_secs(5))
            else {
                continue;
            };
            // Two kinds of half a request: a head without its blank line,
            // and a whole head whose body never comes.
            let half: &[u8] = if i % 2 == 0 {
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n"
            } else {
                b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n0123456789"
            };
            let _ = s.write_all(half);
            held.push(s);
        }
        sent += n;
        // With every one of them held open: a whole scrape still answers,
        // within a second.
        let t = Instant::now();
        let (code, body) = http_get(&daemon.addr, "/metrics").expect("a scrape while flooded");
        let took = t.elapsed();
        slowest = slowest.max(took);
        assert_eq!(code, 200);
        assert!(
            took < Duration::from_secs(1),
            "a scrape with {} half-sent requests open took {took:?}",
            held.len()
        );
        // Only that scrape's predecessors count: the value shown is the
        // number of collections completed before this one.
        expect += 1.0;
        assert_eq!(
            scrapes_total(&body),
            expect,
            "mpi_observer_scrapes_total must count only whole scrapes"
        );
        drop(held);
    }
    eprintln!(
        "{HALF} half-sent requests in batches of {batch}: {:?}, slowest scrape {slowest:?}",
        started.elapsed()
    );

    // After they closed: threads and memory back within bounds, and still
    // no collection for them.
    std::thread::sleep(Duration::from_secs(1));
    let (threads, rss) = daemon.threads_rss();
    eprintln!("daemon threads {threads0} -> {threads}, VmRSS {rss0} -> {rss} KiB");
    assert!(threads <= 64, "{threads} threads after the flood");
    assert!(
        rss.saturating_sub(rss0) <= 64 * 1024,
        "VmRSS grew by {} KiB",
        rss - rss0
    );
    let (code, body) = http_get(&daemon.addr, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert_eq!(scrapes_total(&body), expect + 1.0);
    daemon.assert_running();
}

#[test]
fn gzip_when_asked_and_promtool_clean() {
    if !require(&[Need::Command("promtool")]) {
        return;
    }
    let daemon = WebDaemon::start("127.0.0.1", &[]);
    let plain = get(&daemon.addr, "/metrics", &[]).unwrap();
    assert_eq!(plain.status, 200);
    // `--all` may pick up other MPI processes on the machine between two
    // scrapes: compare a gzip body with the plain bodies around it, until
    // those two agree.
    let same_as_plain = |zipped: &str, what: &str| {
        for _ in 0..20 {
            let before = get(&daemon.addr, "/metrics", &[]).unwrap().text();
            let after = get(&daemon.addr, "/metrics", &[]).unwrap().text();
            if stable(&before) == stable(&after) && stable(&before) == stable(zipped) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let plain = stable(&get(&daemon.addr, "/metrics", &[]).unwrap().text());
        let zipped = stable(zipped);
        let only = |a: &str, b: &str| -> Vec<String> {
            let b: std::collections::BTreeSet<&str> = b.lines().collect();
            a.lines()
                .filter(|l| !b.contains(l))
                .map(str::to_string)
                .collect()
        };
        panic!(
            "{what}: the gzip body differs from the plain one: only in gzip {:?}, only in plain {:?}",
            only(&zipped, &plain),
            only(&plain, &zipped)
        );
    };
    assert_eq!(plain.header("Content-Encoding"), None);
    assert_eq!(
        plain.header("Content-Type"),
        Some("text/plain; version=0.0.4; charset=utf-8")
    );
    promtool_check(&plain.text());
    for accept in ["gzip", "deflate, gzip;q=0.5", "br, GZIP"] {
        let z = get(
            &daemon.addr,
            "/metrics",
            &[("Accept-Encoding", accept.to_string())],
        )
        .unwrap();
        assert_eq!(z.status, 200);
        assert_eq!(z.header("Content-Encoding"), Some("gzip"), "{accept}");
        let text = gunzip(&z.body);
        assert!(z.body.len() < text.len(), "compressed");
        same_as_plain(&text, accept);
        promtool_check(&text);
    }
    let r = get(
        &daemon.addr,
        "/metrics",
        &[("Accept-Encoding", "gzip;q=0, identity".to_string())],
    )
    .unwrap();
    assert_eq!(r.header("Content-Encoding"), None, "gzip;q=0 refuses gzip");
    assert!(
        r.text()
            .contains("# TYPE mpi_observer_scrapes_total counter")
    );
    // The landing page, 404 and 405 are as before.
    let (code, body) = http_get(&daemon.addr, "/").unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("<h1>mpi-observer</h1>"));
    assert_eq!(
        http_get(&daemon.addr, "/nope").unwrap(),
        (404, "not found\n".to_string())
    );
    let post = Request {
        method: "POST",
        ..Request::get("/metrics")
    };
    let r = http::send(&daemon.addr, &post, LIMIT).unwrap();
    assert_eq!((r.status, r.text().as_str()), (405, "only GET\n"));
}

#[test]
fn bad_web_config_is_one_line_and_exit_1() {
    let dir = scratch("web-bad-config");
    make_certs(&dir);
    std::fs::write(dir.join("notes.txt"), "not a certificate\n").unwrap();
    let hash = bcrypt::hash(PASSWORD, 4).unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        ("missing.yml", String::new(), "cannot read the web config file"),
        ("syntax.yml", "tls_server_config: [\n".into(), "is not valid"),
        (
            "unknown.yml",
            "basic_auth_user:\n  a: b\n".into(),
            "unknown field `basic_auth_user`",
        ),
        (
            "nokey.yml",
            "tls_server_config:\n  cert_file: tls.crt\n".into(),
            "no private key",
        ),
        (
            "nocert.yml",
            "tls_server_config:\n  cert_file: absent.crt\n  key_file: tls.key\n".into(),
            "cannot read cert_file",
        ),
        (
            "mismatch.yml",
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: other.key\n".into(),
            "do not make a TLS configuration",
        ),
        (
            "notpem.yml",
            "tls_server_config:\n  cert_file: notes.txt\n  key_file: tls.key\n".into(),
            "holds no certificate",
        ),
        (
            "hash.yml",
            "basic_auth_users:\n  prometheus: plaintext\n".into(),
            "not a bcrypt hash",
        ),
        (
            "tls10.yml",
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  min_version: TLS10\n"
                .into(),
            "use TLS12 or TLS13",
        ),
        (
            "clientca.yml",
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  client_auth_type: RequireAndVerifyClientCert\n".into(),
            "needs client_ca_file",
        ),
        (
            "ok-then-bad-user.yml",
            format!("basic_auth_users:\n  'a:b': '{hash}'\n"),
            "contains ':'",
        ),
    ];
    for (name, text, want) in cases {
        let path = dir.join(name);
        if !text.is_empty() {
            std::fs::write(&path, text).unwrap();
        }
        let (status, stderr) = run_daemon(&["--web.config.file", path.to_str().unwrap()]);
        assert_eq!(status.code(), Some(1), "{name}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "{name}: one line: {stderr}");
        assert!(
            lines[0].starts_with("mpi-observer: error: ") && lines[0].contains(want),
            "{name}: want {want:?}: {stderr}"
        );
        assert!(lines[0].contains(name), "{name}: names the file: {stderr}");
    }
}

#[test]
fn non_loopback_without_tls_or_auth_warns_once() {
    let dir = scratch("web-warning");
    make_certs(&dir);
    let warnings = |d: &WebDaemon| -> Vec<String> {
        d.lines()
            .into_iter()
            .filter(|l| l.contains("warning"))
            .collect()
    };
    let wait_serving = |d: &WebDaemon| {
        wait_for("the start-up line", Duration::from_secs(30), || {
            d.lines()
                .iter()
                .any(|l| l.contains("serving"))
                .then_some(())
        })
    };
    let d = WebDaemon::start("0.0.0.0", &[]);
    wait_serving(&d);
    let w = warnings(&d);
    assert_eq!(w.len(), 1, "one warning line: {:?}", d.lines());
    assert!(
        w[0].starts_with("mpi-observer: warning:")
            && w[0].contains("without TLS and without authentication")
            && w[0].contains("--web.config.file"),
        "{w:?}"
    );
    drop(d);

    // TLS without users: still warned, about authentication.
    let tls_only = dir.join("tls-only.yml");
    std::fs::write(
        &tls_only,
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n",
    )
    .unwrap();
    let d = WebDaemon::start(
        "0.0.0.0",
        &["--web.config.file", tls_only.to_str().unwrap()],
    );
    wait_serving(&d);
    let w = warnings(&d);
    assert_eq!(w.len(), 1, "{:?}", d.lines());
    assert!(w[0].contains("without authentication"), "{w:?}");
    drop(d);

    // TLS and basic auth: no warning.
    let cfg = web_config(&dir, PASSWORD);
    let d = WebDaemon::start("0.0.0.0", &["--web.config.file", cfg.to_str().unwrap()]);
    wait_serving(&d);
    assert!(warnings(&d).is_empty(), "{:?}", d.lines());
}

#[test]
fn mutual_tls_requires_a_client_certificate() {
    let dir = scratch("web-mtls");
    make_certs(&dir);
    let cfg = dir.join("mtls.yml");
    std::fs::write(
        &cfg,
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  \
         client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  \
         min_version: TLS13\n",
    )
    .unwrap();
    let daemon = WebDaemon::start("0.0.0.0", &["--web.config.file", cfg.to_str().unwrap()]);
    let with_cert = tls_client_with_cert(
        &dir.join("ca.crt"),
        &dir.join("client.crt"),
        &dir.join("client.key"),
    );
    let r = wait_for(
        "a scrape with a client certificate",
        Duration::from_secs(30),
        || {
            get_tls(&with_cert, &daemon.addr, "/metrics", &[])
                .ok()
                .filter(|r| r.status == 200)
        },
    );
    assert!(r.text().contains("mpi_observer_scrapes_total"));
    // Without one the handshake fails: no response at all.
    let without = tls_client(&dir.join("ca.crt"));
    let r = get_tls(&without, &daemon.addr, "/metrics", &[]);
    assert!(r.is_err(), "no client certificate: {r:?}");
    // A verified client certificate is authentication: no warning on a
    // non-loopback address.
    wait_for("the start-up line", Duration::from_secs(30), || {
        daemon
            .lines()
            .iter()
            .any(|l| l.contains("serving https"))
            .then_some(())
    });
    assert!(
        !daemon.lines().iter().any(|l| l.contains("warning")),
        "{:?}",
        daemon.lines()
    );
}

/// `mpi-observer report ARGS` (the test's environment, less
/// MPI_OBSERVER_AUTH_FILE unless `env` sets it): status, stdout, stderr.
fn report(args: &[&str], env: &[(&str, &Path)]) -> (bool, String, String) {
    let mut c = Command::new(observer_bin());
    c.arg("report")
        .args(args)
        .env_remove("MPI_OBSERVER_AUTH_FILE");
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run_with_timeout(&mut c, Duration::from_secs(30));
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The daemon's figures for the job through `report --url https://...
/// --ca-file --auth-file`, as the Slurm Epilog reads them when the unit
/// keeps TLS and basic auth on: exact once the job has ended; each wrong
/// setting is one line naming what to do, and exit 1.
#[test]
fn report_reads_a_tls_daemon_with_an_auth_file() {
    const JOB: &str = "4242";
    const ITERS: u64 = 25;
    let mpi = Mpi::OpenMpi;
    if !require(&[Need::Mpi(mpi)]) {
        return;
    }
    let dir = scratch("web-report");
    make_certs(&dir);
    let cfg = web_config(&dir, PASSWORD);
    let exe = dir.join("claim");
    compile(mpi, &program("identity/claim.c"), &exe, &[]);
    let daemon = WebDaemon::start(
        "127.0.0.1",
        &[
            "--web.config.file",
            cfg.to_str().unwrap(),
            "--retain-exited",
            "300",
        ],
    );
    let set_mode = |p: &Path, mode: u32| {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    let auth = dir.join("auth");
    std::fs::write(&auth, format!("{USER}:{PASSWORD}\n")).unwrap();
    set_mode(&auth, 0o600);
    let ca = dir.join("ca.crt");
    let url = format!("https://{}", daemon.addr);
    let good = [
        "--url",
        url.as_str(),
        "--ca-file",
        ca.to_str().unwrap(),
        "--auth-file",
        auth.to_str().unwrap(),
        "--job",
        JOB,
        "--format",
        "json",
    ];
    let parsed = |out: &str| -> serde_json::Value {
        let v: serde_json::Value = serde_json::from_str(out).expect("report JSON");
        v["reports"][0].clone()
    };

    // Two ranks under the shim's stats layer, held before their calls.
    let mut launcher = shim_launcher(mpi, 2, "stats");
    launcher.args(["-x", &format!("SLURM_JOB_ID={JOB}")]);
    launcher.arg(&exe).arg(ITERS.to_string());
    let job = Job::spawn(launcher, 2, dir.join("go"));
    wait_for("the job in the report", Duration::from_secs(30), || {
        let (ok, out, _) = report(&good, &[]);
        (ok && parsed(&out)["ranks"]
            .as_array()
            .is_some_and(|r| r.len() == 2))
        .then_some(())
    });
    job.go();
    job.finish("OK ");
    let r = wait_for(
        "the job's final figures in the report",
        Duration::from_secs(30),
        || {
            let (ok, out, err) = report(&good, &[]);
            assert!(ok, "report over https: {err}");
            assert_eq!(err, "", "no warning with --auth-file");
            let r = parsed(&out);
            let done = r["ranks"]
                .as_array()
                .unwrap()
                .iter()
                .all(|x| x["running"] == false);
            done.then_some(r)
        },
    );
    let barrier = r["functions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "MPI_Barrier")
        .unwrap_or_else(|| panic!("MPI_Barrier in the report: {r}"));
    assert_eq!(barrier["calls"], 2 * ITERS, "{r}");

    // The text report, by host name (the certificate names localhost),
    // with the auth file from the environment, as scripts give it.
    let port = daemon.addr.rsplit_once(':').unwrap().1;
    let by_name = format!("https://localhost:{port}");
    let (ok, out, err) = report(
        &[
            "--url",
            &by_name,
            "--ca-file",
            ca.to_str().unwrap(),
            "--job",
            JOB,
        ],
        &[("MPI_OBSERVER_AUTH_FILE", &auth)],
    );
    assert!(ok, "{err}");
    assert!(out.contains(JOB) && out.contains("MPI_Barrier"), "{out}");

    // A password in the URL still works, with one line of warning.
    let with_password = format!("https://{USER}:{PASSWORD}@{}", daemon.addr);
    let (ok, out, err) = report(
        &[
            "--url",
            &with_password,
            "--ca-file",
            ca.to_str().unwrap(),
            "--job",
            JOB,
        ],
        &[],
    );
    assert!(ok && out.contains("MPI_Barrier"), "{err}");
    assert_eq!(err.lines().count(), 1, "one warning: {err}");
    assert!(
        err.contains("warning") && err.contains("--auth-file") && !err.contains(PASSWORD),
        "{err}"
    );

    // Each wrong setting: one line that says what to do, exit 1, no report.
    let other = dir.join("other-ca");
    std::fs::create_dir_all(&other).unwrap();
    make_certs(&other);
    let wrong_auth = dir.join("wrong-auth");
    std::fs::write(&wrong_auth, format!("{USER}:wrong\n")).unwrap();
    set_mode(&wrong_auth, 0o600);
    let open_auth = dir.join("open-auth");
    std::fs::write(&open_auth, format!("{USER}:{PASSWORD}\n")).unwrap();
    set_mode(&open_auth, 0o644);
    let plain = format!("http://{}", daemon.addr);
    let with = |url: &str, ca: &Path, auth: &Path| -> Vec<String> {
        [
            "--url",
            url,
            "--ca-file",
            ca.to_str().unwrap(),
            "--auth-file",
            auth.to_str().unwrap(),
            "--job",
            JOB,
        ]
        .map(String::from)
        .into()
    };
    for (what, args, want) in [
        (
            "a CA that did not sign the daemon's certificate",
            with(&url, &other.join("ca.crt"), &auth),
            &["TLS with", "invalid peer certificate", "--ca-file"][..],
        ),
        (
            "a wrong password",
            with(&url, &ca, &wrong_auth),
            &["401", "--auth-file"][..],
        ),
        (
            "an auth file others may read",
            with(&url, &ca, &open_auth),
            &["--auth-file", "mode 0644", "chmod 600"][..],
        ),
        (
            "plain HTTP to the TLS port",
            with(&plain, &ca, &auth),
            &["400", "https://"][..],
        ),
        (
            "https without a CA",
            ["--url", url.as_str(), "--auth-file", auth.to_str().unwrap()]
                .map(String::from)
                .into(),
            &["give --ca-file"][..],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (ok, out, err) = report(&args, &[]);
        assert!(!ok, "{what}: must fail");
        assert_eq!(out, "", "{what}: no report");
        assert_eq!(err.trim_end().lines().count(), 1, "{what}: one line: {err}");
        for w in want {
            assert!(err.contains(w), "{what}: `{w}` in {err}");
        }
        assert!(!err.contains(PASSWORD), "{what}: no password: {err}");
    }

    // `top` reads the same way: its first reading (before it asks for a
    // terminal, which it has none of here) succeeds with the CA and the
    // password, and a wrong password is one line.
    let top = |auth: &Path| -> String {
        let o = run_with_timeout(
            Command::new(observer_bin())
                .args(["top", "--endpoint", &url, "--ca-file"])
                .arg(&ca)
                .arg("--auth-file")
                .arg(auth)
                .stdin(Stdio::null())
                .env_remove("MPI_OBSERVER_AUTH_FILE"),
            Duration::from_secs(30),
        );
        assert_eq!(o.status.code(), Some(1), "top without a terminal");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = top(&auth);
    assert!(err.contains("top needs a terminal"), "{err}");
    let err = top(&wrong_auth);
    assert!(
        err.trim_end().lines().count() == 1 && err.contains("401") && err.contains("--auth-file"),
        "{err}"
    );
    daemon.assert_running();
}
