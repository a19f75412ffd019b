//! The call sites' naming and bounds, with the real symbolizer process.

use super::*;
use crate::attach::symbolizer;

const MAPS: &str = "\
5581a000-5581b000 r--p 00000000 fe:01 1234                       /opt/app/bin/halo
5581b000-5581c000 r-xp 00001000 fe:01 1234                       /opt/app/bin/halo
7f00a000-7f00b000 r-xp 00002000 fe:01 99                         /usr/lib/lib with space.so
7ffd0000-7ffd1000 rw-p 00000000 00:00 0                          [stack]
7ffd2000-7ffd3000 r-xp 00000000 00:00 0                          [vdso]
";

#[test]
fn maps_keep_executable_file_mappings() {
    let m = Maps::from_entries(procfs::parse_maps(MAPS.as_bytes()));
    assert_eq!(m.ranges.len(), 2);
    let h = m.find(0x5581b010).unwrap();
    assert_eq!(
        (h.entry.offset, h.entry.inode, h.path.as_str()),
        (0x1000, 1234, "/opt/app/bin/halo")
    );
    assert_eq!(h.offset_of(0x5581b010), 0x1010);
    assert_eq!(h.fallback(0x1a2f), "halo+0x1a2f");
    assert_eq!(
        m.find(0x7f00a000).unwrap().path,
        "/usr/lib/lib with space.so"
    );
    assert!(m.find(0x5581a010).is_none(), "not executable");
    assert!(m.find(0x7ffd2010).is_none(), "not a file");
}

/// A running process of uid 0.
fn alive(pid: u32) -> Who {
    Who {
        pid,
        uid: 0,
        alive: true,
    }
}

/// A process of uid 0 that exited.
fn gone(pid: u32) -> Who {
    Who {
        alive: false,
        ..alive(pid)
    }
}

fn site(function: u16, addr: u64, time_ns: u64) -> RawSite {
    RawSite {
        function,
        addr,
        calls: 1,
        time_ns,
    }
}

#[test]
fn budget_is_sticky_and_heaviest_first() {
    let mut cache = Names::new();
    let mut names = cache.session();
    let mut r = RankSites {
        maps: Some(Maps::default()),
        ..Default::default()
    };
    // Pre-name addresses so no maps are needed.
    for (a, n) in [(1, "a"), (2, "b"), (3, "c")] {
        r.names.insert(a, Arc::from(n));
    }
    let b = Budget { per_function: 2 };
    let s = r.resolve(&mut names, gone(0), &[site(7, 1, 5), site(7, 2, 9)], b);
    assert_eq!(
        s.iter().map(|s| (&*s.name, s.exported)).collect::<Vec<_>>(),
        [("b", true), ("a", true)]
    );
    // c is now the heaviest, but the places are taken for good.
    let s = r.resolve(
        &mut names,
        gone(0),
        &[site(7, 1, 5), site(7, 2, 9), site(7, 3, 99)],
        b,
    );
    assert_eq!(
        s.iter().map(|s| (&*s.name, s.exported)).collect::<Vec<_>>(),
        [("c", false), ("b", true), ("a", true)]
    );
}

#[test]
fn sites_of_one_name_are_merged() {
    let mut cache = Names::new();
    let mut names = cache.session();
    let mut r = RankSites::default();
    r.names.insert(1, Arc::from("f at x.c:3"));
    r.names.insert(2, Arc::from("f at x.c:3"));
    let raw = [
        RawSite {
            function: 1,
            addr: 1,
            calls: 2,
            time_ns: 10,
        },
        RawSite {
            function: 1,
            addr: 2,
            calls: 3,
            time_ns: 5,
        },
    ];
    let s = r.resolve(&mut names, gone(0), &raw, Budget::default());
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].calls, s[0].time_ns), (5, 15));
}

/// A mapping of this test binary's own text, for real names.
fn own_text() -> (Maps, u64) {
    let exe = std::fs::read_link("/proc/self/exe").unwrap();
    let maps = Maps::read(std::process::id()).unwrap();
    let m = maps
        .ranges
        .iter()
        .find(|m| Path::new(&m.path) == exe)
        .unwrap()
        .clone();
    // An address inside the text: this function's own.
    let addr = own_text as *const () as u64;
    assert!(m.contains(addr));
    (maps, addr)
}

#[test]
fn real_names_come_from_the_symbolizer_process_within_the_wait() {
    let (maps, addr) = own_text();
    let mut cache = Names::with_config(NamesConfig {
        wait: Duration::from_secs(30),
        limits: Limits {
            deadline: Duration::from_secs(30),
            ..Limits::default()
        },
        program: Some(symbolizer::tests::child_program()),
        ..NamesConfig::default()
    });
    let mut r = RankSites {
        maps: Some(maps),
        ..Default::default()
    };
    let pid = std::process::id();
    let mut session = cache.session();
    // A return address just past the function's first byte.
    let s = r.resolve(
        &mut session,
        alive(pid),
        &[site(1, addr + 1, 5)],
        Budget::default(),
    );
    assert_eq!(s.len(), 1);
    assert!(!s[0].pending, "{s:?}");
    assert!(s[0].exported);
    assert!(s[0].name.contains("own_text"), "{s:?}");
    assert_eq!(r.len(), 1);
    assert_eq!(cache.cached(), 1);
    assert_eq!(cache.pending(), 0);
}

#[test]
fn a_site_waits_unexported_while_the_symbolizer_is_slow() {
    let (maps, _) = own_text();
    let mut cache = Names::with_config(NamesConfig {
        wait: Duration::from_millis(50),
        program: Some(symbolizer::tests::child_program()),
        ..NamesConfig::default()
    });
    let mut r = RankSites {
        maps: Some(maps.clone()),
        ..Default::default()
    };
    let m = &maps.ranges[0];
    // The hang hook: the child never answers; the deadline (2 s)
    // poisons the file.
    let addr = m.entry.start + (symbolizer::HANG + 1 - m.entry.offset);
    let mut ok = maps.clone();
    ok.ranges[0].entry.end = u64::MAX;
    r.maps = Some(ok);
    let t = Instant::now();
    let s = r.resolve(
        &mut cache.session(),
        alive(std::process::id()),
        &[site(1, addr, 5)],
        Budget::default(),
    );
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(s[0].pending && !s[0].exported, "{s:?}");
    // After the deadline the file is poisoned: named object+offset.
    std::thread::sleep(Duration::from_millis(2500));
    let s = r.resolve(
        &mut cache.session(),
        alive(std::process::id()),
        &[site(1, addr, 5)],
        Budget::default(),
    );
    assert!(!s[0].pending && s[0].exported, "{s:?}");
    assert!(s[0].name.contains("+0x"), "{s:?}");
    assert!(NamingCounters::global().failures("timeout") >= 1);
}

/// The executable mapping of this process that holds `addr`.
fn own_mapping(addr: u64) -> Mapping {
    Maps::read(std::process::id())
        .unwrap()
        .find(addr)
        .unwrap()
        .clone()
}

/// `n` files of their own (distinct inodes) under a fresh directory,
/// as mappings of this process; the symbolizer child hangs on any of
/// them when asked for [`symbolizer::HANG`].
fn hanging_files(tag: &str, n: u64) -> (std::path::PathBuf, Vec<Mapping>) {
    use std::os::unix::fs::MetadataExt as _;
    let dir = std::env::temp_dir().join(format!("mpi-observer-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let maps = (0..n)
        .map(|i| {
            let p = dir.join(format!("slow{i}"));
            std::fs::write(&p, b"\x7fELF").unwrap();
            let md = std::fs::metadata(&p).unwrap();
            let (maj, min) = (libc::major(md.dev()), libc::minor(md.dev()));
            let line = format!(
                "1000-2000 r-xp 00000000 {maj:x}:{min:x} {} {}\n",
                md.ino(),
                p.display()
            );
            let entry = procfs::parse_maps(line.as_bytes()).remove(0);
            Mapping {
                path: p.display().to_string(),
                entry,
            }
        })
        .collect();
    (dir, maps)
}

/// The names `uid` waits for, asked and waited for (`wait` at most);
/// how long it took.
fn name_for(
    cache: &mut Names,
    uid: u32,
    m: &Mapping,
    off: u64,
    wait: Duration,
) -> (Option<Arc<str>>, Duration) {
    let pid = std::process::id();
    let t = Instant::now();
    if let Some(n) = cache.lookup(uid, pid, m, off) {
        return (Some(n), t.elapsed());
    }
    cache.wait_for(uid, &[(m.file(), off)], t + wait);
    (cache.lookup(uid, pid, m, off), t.elapsed())
}

#[test]
fn one_users_slow_files_delay_anothers_names_by_one_deadline() {
    let deadline = Duration::from_millis(800);
    let config = NamesConfig {
        limits: Limits {
            deadline,
            ..Limits::default()
        },
        program: Some(symbolizer::tests::child_program()),
        fairness: Fairness {
            budget: Duration::ZERO,
            ..Fairness::default()
        },
        ..NamesConfig::default()
    };
    // libc's getpid, mapped by this process: a small, quick name.
    let getpid = libc::getpid as *const () as u64;
    let libc_map = own_mapping(getpid);
    let off = libc_map.offset_of(getpid) + 1;
    // What naming it costs alone (the child's start included).
    let mut alone = Names::with_config(config.clone());
    let (name, normal) = name_for(&mut alone, 5002, &libc_map, off, Duration::from_secs(30));
    assert!(name.is_some_and(|n| n.contains("getpid")), "{normal:?}");
    drop(alone);
    // uid 5001 asks first for ten files that each hang until the
    // deadline: ten deadlines of work.
    let (dir, slow) = hanging_files("fair", 10);
    let mut cache = Names::with_config(config);
    let pid = std::process::id();
    for m in &slow {
        assert!(cache.lookup(5001, pid, m, symbolizer::HANG + 1).is_none());
    }
    // Its first request is in flight.
    std::thread::sleep(Duration::from_millis(100));
    let (name, took) = name_for(&mut cache, 5002, &libc_map, off, Duration::from_secs(30));
    assert!(name.is_some_and(|n| n.contains("getpid")), "{took:?}");
    // At most the request in flight (one deadline), then its own.
    let bound = deadline + normal * 2 + Duration::from_millis(500);
    assert!(
        took <= bound,
        "uid 5002's name took {took:?}: more than one deadline ({deadline:?}) plus its own naming ({normal:?})"
    );
    assert!(
        took < deadline * 3,
        "{took:?}, with ten deadlines ({:?}) queued ahead",
        deadline * 10
    );
    // uid 5001's files are still being tried, and fall back one by one.
    assert!(cache.pending() > 0);
    let (n, _) = name_for(
        &mut cache,
        5001,
        &slow[9],
        symbolizer::HANG + 1,
        deadline * 15,
    );
    assert!(n.is_some_and(|n| n.starts_with("slow9+0x")));
    assert_eq!(cache.pending(), 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_file_poisoned_for_one_uid_is_tried_for_another() {
    let (dir, slow) = hanging_files("poison", 1);
    let mut cache = Names::with_config(NamesConfig {
        limits: Limits {
            deadline: Duration::from_millis(300),
            ..Limits::default()
        },
        program: Some(symbolizer::tests::child_program()),
        ..NamesConfig::default()
    });
    let m = &slow[0];
    let off = symbolizer::HANG + 1;
    let before = NamingCounters::global().failures("timeout");
    let (n, _) = name_for(&mut cache, 6001, m, off, Duration::from_secs(10));
    assert!(n.is_some_and(|n| n.starts_with("slow0+0x")));
    // Poisoned for 6001: named at once, no new try.
    let (n, took) = name_for(&mut cache, 6001, m, off, Duration::ZERO);
    assert!(n.is_some() && took < Duration::from_millis(100));
    // 6002 pays for its own try: another timeout.
    assert!(cache.lookup(6002, std::process::id(), m, off).is_none());
    let (n, _) = name_for(&mut cache, 6002, m, off, Duration::from_secs(10));
    assert!(n.is_some_and(|n| n.starts_with("slow0+0x")));
    assert!(NamingCounters::global().failures("timeout") >= before + 2);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_name_cache_is_bounded_by_entries_and_bytes() {
    let mut inner = Inner {
        cache: lru::LruCache::new(NonZeroUsize::new(3).unwrap()),
        bytes: 0,
        max_bytes: 10,
        sched: Scheduler::new(Fairness::default()),
        closed: false,
    };
    let f = ((1, 2), 3);
    let before = NamingCounters::global().evictions.load(Ordering::Relaxed);
    for i in 0..5 {
        inner.insert((f, i), Arc::from("ab"));
    }
    assert_eq!(inner.cache.len(), 3, "entries");
    assert_eq!(inner.bytes, 6);
    assert!(inner.cache.contains(&(f, 4)) && !inner.cache.contains(&(f, 1)));
    inner.insert((f, 9), Arc::from("0123456789"));
    assert!(inner.bytes <= 10, "bytes: {}", inner.bytes);
    assert!(inner.cache.contains(&(f, 9)));
    let after = NamingCounters::global().evictions.load(Ordering::Relaxed);
    assert!(after - before >= 4, "{before} {after}");
}

#[test]
fn a_full_rank_sends_new_sites_to_other_for_good() {
    let mut cache = Names::new();
    let mut names = cache.session();
    let mut r = RankSites {
        maps: Some(Maps::default()),
        ..Default::default()
    };
    for a in 0..PER_RANK_NAMES as u64 {
        r.names.insert(a, Arc::from(format!("s{a}")));
    }
    let extra = PER_RANK_NAMES as u64 + 7;
    for _ in 0..2 {
        let s = r.resolve(&mut names, gone(0), &[site(1, extra, 5)], Budget::default());
        assert_eq!(s.len(), 1);
        assert_eq!(&*s[0].name, OTHER);
        assert!(!s[0].exported && !s[0].pending);
    }
    assert_eq!(r.len(), PER_RANK_NAMES);
}
