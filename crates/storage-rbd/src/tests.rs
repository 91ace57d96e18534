//! Tests without a cluster (library loading, messages), and tests against the one-node
//! test cluster named by `IRONSAN_RBD_TEST_CONF` (its ceph.conf, as printed by
//! `scripts/ceph-test-cluster.sh start DIR`), skipped with a message when it is not set.

use super::*;
use std::process::Command;
use std::sync::atomic::AtomicUsize;

#[test]
fn a_missing_library_names_the_package_to_install() {
    let e = Api::load_from("librados-not-here.so.2", ffi::RBD_LIB)
        .err()
        .expect("a made-up library must not load");
    assert!(e.contains("install librados2"), "{e}");
    assert!(!e.contains('\n'), "one line: {e}");
    if Api::load_from(ffi::RADOS_LIB, ffi::RADOS_LIB).is_ok() {
        panic!("librados does not export rbd_open: loading it as librbd must fail");
    }
}

#[test]
fn the_installed_libraries_load() {
    match Api::get() {
        Ok(_) => {}
        // Not installed: nothing to check here. Installed but lacking a symbol: a failure.
        Err(e) if e.contains("cannot load") => eprintln!("SKIP: librbd is not installed here: {e}"),
        Err(e) => panic!("librbd is installed but cannot be used: {e}"),
    }
}

#[test]
fn names_and_defaults() {
    let mut s = RbdSpec {
        pool: "rbd".into(),
        image: "disk1".into(),
        conf: None,
        user: None,
        namespace: None,
        create: false,
        completions: Completions::default(),
    };
    assert_eq!(s.display_name(), "rbd/disk1");
    assert_eq!(s.conf_path(), Path::new("/etc/ceph/ceph.conf"));
    s.namespace = Some("ns".into());
    assert_eq!(s.display_name(), "rbd/ns/disk1");
    s.image = "a\0b".into();
    let e = cstring("image", &s.image).unwrap_err();
    assert!(e.to_string().contains("NUL"), "{e}");
}

#[test]
fn an_unreadable_conf_says_which_file() {
    if Api::get().is_err() {
        eprintln!("SKIP: librbd is not installed here");
        return;
    }
    let spec = RbdSpec {
        pool: "rbd".into(),
        image: "x".into(),
        conf: Some("/nonexistent/ceph.conf".into()),
        user: None,
        namespace: None,
        create: false,
        completions: Completions::default(),
    };
    let e = RbdBackend::open(&spec, None).err().expect("no such conf");
    assert!(e.to_string().contains("/nonexistent/ceph.conf"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_cluster_leaves_the_backend_not_ready() {
    if Api::get().is_err() {
        eprintln!("SKIP: librbd is not installed here");
        return;
    }
    // A monitor address nothing listens on (the discard port).
    let dir = std::env::temp_dir().join(format!("rbd-unreachable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("ceph.conf");
    std::fs::write(
        &conf,
        "[global]\nmon host = 127.0.0.1:9\nauth cluster required = none\nauth service required = none\nauth client required = none\n",
    )
    .unwrap();
    let spec = RbdSpec {
        pool: "rbd".into(),
        image: "x".into(),
        conf: Some(conf.clone()),
        user: None,
        namespace: None,
        create: false,
        completions: Completions::default(),
    };
    let b = RbdBackend::open(&spec, Some(1 << 20)).unwrap();
    assert!(!b.ready());
    assert_eq!(b.size(), 1 << 20);
    let e = b.read_at(0, 512).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotConnected, "{e}");
    let e = b
        .write_at(0, Bytes::from(vec![1; 512]), true)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::NotConnected, "{e}");
    assert!(b.flush().await.is_err());
    let b = RbdBackend::open(&spec, None).unwrap();
    assert_eq!(b.size(), UNKNOWN_SIZE);
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The test cluster's ceph.conf, or None (with a message) when no cluster is available.
fn cluster() -> Option<PathBuf> {
    match std::env::var_os("IRONSAN_RBD_TEST_CONF") {
        Some(c) if Path::new(&c).exists() => Some(c.into()),
        _ => {
            eprintln!("SKIP: no test cluster (start one with scripts/ceph-test-cluster.sh start DIR and set IRONSAN_RBD_TEST_CONF=DIR/ceph.conf)");
            None
        }
    }
}

/// Removes a test image, waiting at most 30 s (an image left open would hold `rbd rm`).
fn remove_image(conf: &Path, spec: &RbdSpec) {
    let conf = conf.to_string_lossy();
    let name = spec.display_name();
    let _ = Command::new("timeout")
        .args(["30", "rbd", "-c", &conf, "rm", &name])
        .output();
}

/// A spec for a fresh image name in the test cluster's pool "rbd".
fn fresh(conf: &Path, create: bool) -> RbdSpec {
    fresh_in(conf, create, Completions::default())
}

/// As [`fresh`], with completions reported as `mode` says.
fn fresh_in(conf: &Path, create: bool, mode: Completions) -> RbdSpec {
    static N: AtomicUsize = AtomicUsize::new(0);
    RbdSpec {
        pool: "rbd".into(),
        image: format!(
            "unit-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ),
        conf: Some(conf.to_path_buf()),
        user: None,
        namespace: None,
        create,
        completions: mode,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_round_trips_on_the_test_cluster_by_eventfd() {
    io_round_trips(Completions::Eventfd).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_round_trips_on_the_test_cluster_by_callback() {
    io_round_trips(Completions::Callback).await
}

async fn io_round_trips(mode: Completions) {
    let Some(conf) = cluster() else { return };
    let spec = fresh_in(&conf, true, mode);
    let b = RbdBackend::open(&spec, Some(8 << 20)).unwrap();
    assert_eq!(b.completions(), Some(mode));
    assert_eq!(b.size(), 8 << 20);
    assert_eq!(b.kind(), "rbd");
    let data: Bytes = (0..65536u32)
        .map(|i| (i * 7) as u8)
        .collect::<Vec<_>>()
        .into();
    b.write_at(4096, data.clone(), false).await.unwrap();
    b.write_at(1 << 20, data.clone(), true).await.unwrap();
    b.flush().await.unwrap();
    assert_eq!(b.read_at(4096, data.len()).await.unwrap(), data);
    assert_eq!(b.read_at(1 << 20, data.len()).await.unwrap(), data);
    // Never-written ranges read as zeroes, in an untouched object and behind written bytes
    // (librbd fills the whole read buffer; nothing is zeroed before it does).
    assert!(b
        .read_at(6 << 20, 65536)
        .await
        .unwrap()
        .iter()
        .all(|&x| x == 0));
    let across = b.read_at((1 << 20) + 32768, 65536).await.unwrap();
    assert_eq!(across[..32768], data[32768..]);
    assert!(across[32768..].iter().all(|&x| x == 0));
    // Punched and zeroed ranges read back as zeroes, however small.
    b.punch(4096 + 512, 512).await.unwrap();
    b.write_zeroes(4096 + 4096, 1024).await.unwrap();
    let back = b.read_at(4096, data.len()).await.unwrap();
    assert!(back[512..1024].iter().all(|&x| x == 0));
    assert!(back[4096..5120].iter().all(|&x| x == 0));
    assert_eq!(back[..512], data[..512]);
    assert_eq!(back[5120..], data[5120..]);
    assert!(b.map_status(0, 4096).await.unwrap().mapped);
    // COMPARE AND WRITE in the cluster (librbd does one 512-byte sector): a match writes, a
    // mismatch names its first byte, a longer range is left to the engine.
    let old = b.read_at(8192, 512).await.unwrap();
    let new = Bytes::from(vec![0x5A; 512]);
    assert_eq!(
        b.compare_and_write(8192, old.clone(), new.clone(), true)
            .await
            .map(|r| r.unwrap()),
        Some(None)
    );
    assert_eq!(b.read_at(8192, 512).await.unwrap(), new);
    let mut wrong = new.to_vec();
    wrong[100] ^= 1;
    assert_eq!(
        b.compare_and_write(8192, wrong.into(), old.clone(), false)
            .await
            .map(|r| r.unwrap()),
        Some(Some(100))
    );
    assert_eq!(b.read_at(8192, 512).await.unwrap(), new);
    let long = Bytes::from(vec![0; 4096]);
    assert!(b
        .compare_and_write(8192, long.clone(), long, false)
        .await
        .is_none());
    // Out of range is an error, not a panic.
    assert!(b.read_at(8 << 20, 1).await.is_err());
    // Many operations at once, each on its own completion.
    let b = Arc::new(b);
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let b = b.clone();
        tasks.push(tokio::spawn(async move {
            let d = Bytes::from(vec![i as u8; 4096]);
            b.write_at((2 << 20) + i * 4096, d.clone(), false)
                .await
                .unwrap();
            assert_eq!(b.read_at((2 << 20) + i * 4096, 4096).await.unwrap(), d);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // A read dropped before its completion leaves librbd a buffer that is still valid.
    let dropped = tokio::time::timeout(Duration::from_micros(1), b.read_at(0, 1 << 20)).await;
    drop(dropped);
    b.flush().await.unwrap();
    drop(b);
    remove_image(&conf, &spec);
}

/// Resizes the test image with the `rbd` tool (`--allow-shrink` when it shrinks).
fn rbd_resize(conf: &Path, spec: &RbdSpec, size: &str) {
    let out = Command::new("timeout")
        .args(["30", "rbd", "-c", &conf.to_string_lossy(), "resize"])
        .arg(spec.display_name())
        .args(["--size", size, "--allow-shrink"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// Waits (10 s at most) for `b` to report `want` bytes; returns what it reports then.
async fn size_becomes(b: &RbdBackend, want: u64) -> u64 {
    for _ in 0..100 {
        if b.size() == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    b.size()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_changes_the_size_within_a_configured_one() {
    let Some(conf) = cluster() else { return };
    let spec = fresh(&conf, true);
    // Created at 4 MiB with that size configured; a second LUN on it configures none.
    let capped = RbdBackend::open(&spec, Some(4 << 20)).unwrap();
    let follows = RbdBackend::open(&spec, None).unwrap();
    rbd_resize(&conf, &spec, "12M");
    assert_eq!(size_becomes(&follows, 12 << 20).await, 12 << 20);
    assert_eq!(capped.size(), 4 << 20, "a configured size is not outgrown");
    rbd_resize(&conf, &spec, "2M");
    assert_eq!(size_becomes(&follows, 2 << 20).await, 2 << 20);
    assert_eq!(
        size_becomes(&capped, 2 << 20).await,
        2 << 20,
        "a shrunk image shrinks the LUN"
    );
    drop((capped, follows));
    remove_image(&conf, &spec);
}

#[test]
fn the_lun_size_is_the_configured_one_within_the_image() {
    assert_eq!(lun_bytes(None, 8 << 20), 8 << 20);
    assert_eq!(lun_bytes(Some(4 << 20), 8 << 20), 4 << 20);
    assert_eq!(lun_bytes(Some(4 << 20), 2 << 20), 2 << 20);
}

#[test]
fn missing_images_and_pools_say_what_to_do() {
    let Some(conf) = cluster() else { return };
    let spec = fresh(&conf, false);
    let e = RbdBackend::open(&spec, None).err().expect("no such image");
    assert!(e.to_string().contains("rbd create"), "{e}");
    let e = RbdBackend::open(&fresh(&conf, true), None)
        .err()
        .expect("no size");
    assert!(e.to_string().contains("without a size"), "{e}");
    let mut spec = fresh(&conf, false);
    spec.pool = "no-such-pool".into();
    let e = RbdBackend::open(&spec, None).err().expect("no such pool");
    assert!(e.to_string().contains("no-such-pool"), "{e}");
    let spec = fresh(&conf, true);
    let b = RbdBackend::open(&spec, Some(1 << 20)).unwrap();
    drop(b);
    let e = RbdBackend::open(&spec, Some(2 << 20))
        .err()
        .expect("too small");
    assert!(e.to_string().contains("rbd resize"), "{e}");
    remove_image(&conf, &spec);
}

/// The bytes test I/O number `i` writes: distinct per I/O and per byte.
fn pattern(i: u64, len: usize) -> Bytes {
    (0..len)
        .map(|k| (i as usize * 131 + k * 7 + (k >> 8)) as u8)
        .collect::<Vec<_>>()
        .into()
}

/// Writes then reads back `n` 4 KiB blocks, all at once, on a runtime without the I/O
/// driver (the reaper needs none); every one comes back with its own bytes.
fn many_at_once(mode: Completions, n: u64) {
    let Some(conf) = cluster() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    let spec = fresh_in(&conf, true, mode);
    rt.block_on(async {
        let b = Arc::new(RbdBackend::open(&spec, Some(n * 4096)).unwrap());
        assert_eq!(b.completions(), Some(mode));
        let writes: Vec<_> = (0..n)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { b.write_at(i * 4096, pattern(i, 4096), false).await })
            })
            .collect();
        for w in writes {
            w.await.unwrap().unwrap();
        }
        let reads: Vec<_> = (0..n)
            .map(|i| {
                let b = b.clone();
                tokio::spawn(async move { (i, b.read_at(i * 4096, 4096).await) })
            })
            .collect();
        for r in reads {
            let (i, got) = r.await.unwrap();
            assert_eq!(got.unwrap(), pattern(i, 4096), "block {i} ({mode:?})");
        }
    });
    drop(rt);
    remove_image(&conf, &spec);
}

#[test]
fn many_concurrent_ios_complete_with_their_bytes_by_eventfd() {
    // Far more than one reap takes (reap::BATCH).
    many_at_once(Completions::Eventfd, 20 * reap::BATCH as u64);
}

#[test]
fn many_concurrent_ios_complete_with_their_bytes_by_callback() {
    many_at_once(Completions::Callback, 20 * reap::BATCH as u64);
}

/// Starts many reads and writes and drops them in flight, then drops the backend with
/// operations still in flight: librbd keeps writing into buffers that stay valid, the
/// backend closes once they complete, and the image holds what the finished writes wrote.
async fn dropped_in_flight(mode: Completions) {
    let Some(conf) = cluster() else { return };
    let spec = fresh_in(&conf, true, mode);
    let b = Arc::new(RbdBackend::open(&spec, Some(4 << 20)).unwrap());
    assert_eq!(b.completions(), Some(mode));
    b.write_at(0, pattern(1, 65536), false).await.unwrap();
    for round in 0..3u64 {
        let futures: Vec<_> = (0..64u64)
            .map(|i| {
                let b = b.clone();
                async move {
                    if i % 2 == 0 {
                        b.read_at((i % 16) * 65536, 65536).await.map(drop)
                    } else {
                        b.write_at((1 << 20) + i * 4096, pattern(i + round, 4096), false)
                            .await
                    }
                }
            })
            .collect();
        // Each future is polled once (its AIO issued), then dropped.
        let all = futures_join(futures);
        let _ = tokio::time::timeout(Duration::from_micros(50), all).await;
    }
    // Spawned tasks aborted mid-flight as well.
    let tasks: Vec<_> = (0..32u64)
        .map(|i| {
            let b = b.clone();
            tokio::spawn(async move { b.read_at(i * 65536, 65536).await })
        })
        .collect();
    for t in &tasks {
        t.abort();
    }
    assert_eq!(b.read_at(0, 65536).await.unwrap(), pattern(1, 65536));
    // Dropped with operations in flight: they finish, then the image closes.
    let _ = tokio::time::timeout(
        Duration::from_micros(10),
        b.write_at(2 << 20, pattern(9, 65536), false),
    )
    .await;
    let started = std::time::Instant::now();
    drop(b);
    assert!(started.elapsed() < Duration::from_secs(30));
    let again = RbdBackend::open(&spec, Some(4 << 20)).unwrap();
    assert_eq!(again.read_at(0, 65536).await.unwrap(), pattern(1, 65536));
    drop(again);
    remove_image(&conf, &spec);
}

/// Polls all of `futures` until every one is done (a join without another dependency).
async fn futures_join<F: std::future::Future>(futures: Vec<F>) {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).map(Some).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for slot in futures.iter_mut() {
            if let Some(f) = slot {
                if f.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    pending = true;
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_in_flight_ios_are_safe_by_eventfd() {
    dropped_in_flight(Completions::Eventfd).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_in_flight_ios_are_safe_by_callback() {
    dropped_in_flight(Completions::Callback).await
}

#[test]
fn completions_parse_from_a_lun_table() {
    use serde::de::{value::Error, Deserialize, IntoDeserializer};
    let parse =
        |s: &str| Completions::deserialize(IntoDeserializer::<Error>::into_deserializer(s)).ok();
    assert_eq!(parse("eventfd"), Some(Completions::Eventfd));
    assert_eq!(parse("callback"), Some(Completions::Callback));
    assert_eq!(parse("poll"), None);
    assert_eq!(Completions::default(), Completions::Eventfd);
}

mod fence;
