//! Several gateways on one image against the test cluster: the managed exclusive lock
//! ([`RbdOwner`]), fencing by blocklist and recovery, and the shared record ([`RadosBlob`]).

use super::*;
use std::time::Instant;

/// Two gateways (each its own RADOS client) on one fresh 4 MiB image.
fn two_gateways(conf: &Path) -> (RbdSpec, RbdBackend, RbdBackend) {
    let spec = fresh(conf, true);
    let a = RbdBackend::open(&spec, Some(4 << 20)).unwrap();
    let b = RbdBackend::open(&spec, Some(4 << 20)).unwrap();
    (spec, a, b)
}

/// The cluster's blocklist, as `ceph osd blocklist ls` prints it.
fn blocklist(conf: &Path) -> String {
    let out = Command::new("timeout")
        .args(["30", "ceph", "-c", &conf.to_string_lossy()])
        .args(["osd", "blocklist", "ls"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Removes `addr`'s blocklist entry, as an administrator would.
fn unblock(conf: &Path, addr: &str) {
    let out = Command::new("timeout")
        .args(["30", "ceph", "-c", &conf.to_string_lossy()])
        .args(["osd", "blocklist", "rm", addr])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

fn block(n: u8) -> Bytes {
    Bytes::from(vec![n; 4096])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_fences_the_old_owner_which_recovers_and_fails_back() {
    let Some(conf) = cluster() else { return };
    let (spec, a, b) = two_gateways(&conf);
    let (oa, ob) = (a.owner(), b.owner());
    let as_trait = a.exclusive_owner().expect("an RBD backend has an owner");
    assert_eq!(as_trait.id(), oa.id());
    assert_ne!(oa.id(), ob.id());
    assert!(b.shared_state().is_some());

    // A takes the lock; B may not without force, and its writes are refused.
    assert!(oa.acquire(false).unwrap());
    assert!(
        oa.acquire(false).unwrap(),
        "acquiring twice is still owning"
    );
    assert!(oa.is_owner().unwrap());
    assert_eq!(ob.owner().unwrap().as_deref(), Some(oa.id()));
    assert_eq!(oa.owner().unwrap().as_deref(), Some(oa.id()));
    a.write_at(0, block(1), false).await.unwrap();
    assert!(!ob.acquire(false).unwrap());
    assert!(!ob.is_owner().unwrap());
    let e = b.write_at(0, block(9), false).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ReadOnlyFilesystem, "{e}");
    assert!(oa.is_owner().unwrap(), "a refused writer takes nothing");

    // B forces: A is fenced (blocklisted); its reads and writes fail as fenced.
    let old_a = oa.id().to_string();
    assert!(ob.acquire(true).unwrap());
    assert!(ob.is_owner().unwrap());
    assert_eq!(ob.owner().unwrap().as_deref(), Some(ob.id()));
    assert!(!oa.is_owner().unwrap());
    let e = a.write_at(0, block(2), false).await.unwrap_err();
    assert!(is_fenced(&e), "{e}");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert!(is_fenced(&a.read_at(0, 4096).await.unwrap_err()));
    assert!(blocklist(&conf).contains(crate::owner::bare(&old_a)));
    b.write_at(0, block(3), true).await.unwrap();
    assert_eq!(b.read_at(0, 4096).await.unwrap(), block(3));

    // A recovers on a new client, as a non-owner: it reads B's data, may not write.
    oa.recover().unwrap();
    assert_ne!(oa.id(), old_a);
    assert!(!oa.is_owner().unwrap());
    assert_eq!(a.read_at(0, 4096).await.unwrap(), block(3));
    let e = a.write_at(0, block(4), false).await.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::ReadOnlyFilesystem, "{e}");
    assert_eq!(oa.owner().unwrap().as_deref(), Some(ob.id()));

    // Failback: A forces, B is fenced and recovers.
    let old_b = ob.id().to_string();
    assert!(oa.acquire(true).unwrap());
    a.write_at(0, block(5), true).await.unwrap();
    assert!(is_fenced(
        &b.write_at(0, block(6), false).await.unwrap_err()
    ));
    assert!(!ob.is_owner().unwrap());
    assert!(is_fenced(&ob.owner().unwrap_err()));
    // acquire without force recovers first, then finds A the owner.
    assert!(!ob.acquire(false).unwrap());
    assert_ne!(ob.id(), old_b);
    assert_eq!(b.read_at(0, 4096).await.unwrap(), block(5));

    // A clean handover: A releases, B takes the lock without fencing anyone.
    oa.release().unwrap();
    assert!(!oa.is_owner().unwrap());
    assert_eq!(ob.owner().unwrap(), None);
    let a_now = oa.id().to_string();
    assert!(ob.acquire(false).unwrap());
    b.write_at(0, block(7), false).await.unwrap();
    let e = a.write_at(0, block(8), false).await.unwrap_err();
    assert!(!is_fenced(&e), "a clean handover fences nobody: {e}");
    assert!(!blocklist(&conf).contains(crate::owner::bare(&a_now)));
    ob.release().unwrap();

    drop((a, b, as_trait));
    unblock(&conf, &old_a);
    unblock(&conf, &old_b);
    remove_image(&conf, &spec);
}

/// A writes one pattern over and over, several writes in flight at a time, while B breaks
/// the lock and writes another once: after B's write completes the image holds B's bytes,
/// and still does once every write of A has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_flight_at_the_old_owner_never_land_after_the_new_owners() {
    let Some(conf) = cluster() else { return };
    let (spec, a, b) = two_gateways(&conf);
    let (oa, ob) = (a.owner(), b.owner());
    let a = Arc::new(a);
    assert!(oa.acquire(false).unwrap());
    let p1 = pattern(1, 65536);
    let p2 = pattern(2, 65536);
    let writer = {
        let (a, p1) = (a.clone(), p1.clone());
        tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut done = 0u64;
            while Instant::now() < deadline {
                let round: Vec<_> = (0..8)
                    .map(|_| {
                        let (a, p1) = (a.clone(), p1.clone());
                        tokio::spawn(async move { a.write_at(0, p1, false).await })
                    })
                    .collect();
                for w in round {
                    match w.await.unwrap() {
                        Ok(()) => done += 1,
                        Err(e) => return (done, e),
                    }
                }
            }
            panic!("A was never fenced");
        })
    };
    // Let A write a while, then take over.
    while a.read_at(0, 16).await.unwrap() != p1.slice(..16) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let old_a = oa.id().to_string();
    assert!(ob.acquire(true).unwrap());
    b.write_at(0, p2.clone(), true).await.unwrap();
    assert_eq!(b.read_at(0, 65536).await.unwrap(), p2);
    let (done, e) = writer.await.unwrap();
    assert!(done > 0, "A wrote before it was fenced");
    assert!(is_fenced(&e), "A's writes end fenced: {e}");
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(b.read_at(0, 65536).await.unwrap(), p2, "B's bytes stay");
    }
    let c = RbdBackend::open(&spec, None).unwrap();
    assert_eq!(
        c.read_at(0, 65536).await.unwrap(),
        p2,
        "as a third client sees it"
    );
    eprintln!("A completed {done} writes before it was fenced");
    drop((a, b, c));
    unblock(&conf, &old_a);
    remove_image(&conf, &spec);
}

/// Two gateways writing in turn: the managed lock stays with its owner, the other's writes
/// are refused quickly, and nobody is blocklisted (no ping-pong of the lock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_writing_in_turn_do_not_move_the_lock() {
    let Some(conf) = cluster() else { return };
    let (spec, a, b) = two_gateways(&conf);
    let (oa, ob) = (a.owner(), b.owner());
    assert!(oa.acquire(false).unwrap());
    for round in 0..20u8 {
        a.write_at(0, block(round), false).await.unwrap();
        // B first with librbd's automatic policy, then (after a refused acquire) managed.
        if round == 10 {
            assert!(!ob.acquire(false).unwrap());
        }
        let started = Instant::now();
        let e = b.write_at(4096, block(round), false).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ReadOnlyFilesystem, "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "refused quickly"
        );
        assert!(oa.is_owner().unwrap(), "round {round}");
        assert_eq!(ob.owner().unwrap().as_deref(), Some(oa.id()));
    }
    assert_eq!(b.read_at(0, 4096).await.unwrap(), block(19));
    assert!(b.read_at(4096, 4096).await.unwrap().iter().all(|&x| x == 0));
    assert!(!blocklist(&conf).contains(crate::owner::bare(oa.id())));
    assert!(!blocklist(&conf).contains(crate::owner::bare(ob.id())));
    drop((a, b));
    remove_image(&conf, &spec);
}

/// A fenced gateway serves again by itself once its blocklist entry is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_gateway_recovers_once_its_blocklist_entry_is_removed() {
    let Some(conf) = cluster() else { return };
    let (spec, a, b) = two_gateways(&conf);
    let (oa, ob) = (a.owner(), b.owner());
    assert!(oa.acquire(false).unwrap());
    let old_a = oa.id().to_string();
    assert!(ob.acquire(true).unwrap());
    assert!(is_fenced(&a.read_at(0, 512).await.unwrap_err()));
    b.write_at(0, block(7), false).await.unwrap();
    unblock(&conf, &old_a);
    let deadline = Instant::now() + Duration::from_secs(4 * RECOVER_CHECK_SECS);
    // The old client stays unused (it may work again now), until the new one replaces it.
    while oa.id() == old_a && Instant::now() < deadline {
        assert!(is_fenced(&a.read_at(0, 512).await.unwrap_err()));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_ne!(oa.id(), old_a, "A reconnected without being asked to");
    assert_eq!(a.read_at(0, 4096).await.unwrap(), block(7));
    assert!(!oa.is_owner().unwrap());
    drop((a, b));
    remove_image(&conf, &spec);
}

/// Removes the shared record's object.
fn remove_object(conf: &Path, object: &str) {
    let _ = Command::new("timeout")
        .args(["30", "rados", "-c", &conf.to_string_lossy()])
        .args(["-p", "rbd", "rm", object])
        .output();
}

/// Two gateways append their own marker to the shared record by compare-and-swap, racing:
/// each version has exactly one winner and the record ends with every marker once.
#[test]
fn shared_record_compare_and_swap_has_one_winner_per_version() {
    let Some(conf) = cluster() else { return };
    let (spec, a, b) = two_gateways(&conf);
    let blobs = [a.blob(), b.blob()];
    assert_eq!(blobs[0].object(), format!("ironsan.shared.{}", spec.image));
    assert_eq!(blobs[0].read().unwrap(), (0, Vec::new()), "never written");
    const N: usize = 25;
    let wins = std::thread::scope(|s| {
        let runs: Vec<_> = blobs
            .iter()
            .enumerate()
            .map(|(who, blob)| {
                s.spawn(move || {
                    let mut won = Vec::new(); // (expected, new)
                    let mut tries = 0;
                    while won.len() < N {
                        tries += 1;
                        assert!(tries < 50 * N, "too many lost races");
                        let (v, mut data) = blob.read().unwrap();
                        data.push(b'a' + who as u8);
                        if let Some(new) = blob.compare_and_write(v, &data).unwrap() {
                            assert!(new > v, "{new} after {v}");
                            won.push((v, new));
                        }
                    }
                    won
                })
            })
            .collect();
        runs.into_iter()
            .flat_map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });
    let mut expected: Vec<u64> = wins.iter().map(|w| w.0).collect();
    expected.sort();
    expected.dedup();
    assert_eq!(expected.len(), 2 * N, "one winner per version: {wins:?}");
    let (v, data) = blobs[1].read().unwrap();
    assert_eq!(v, wins.iter().map(|w| w.1).max().unwrap());
    assert_eq!(data.len(), 2 * N);
    assert_eq!(data.iter().filter(|&&c| c == b'a').count(), N);
    assert_eq!(data.iter().filter(|&&c| c == b'b').count(), N);
    // A stale version loses, and so does a second first write.
    assert_eq!(blobs[0].compare_and_write(v - 1, b"x").unwrap(), None);
    assert_eq!(blobs[0].compare_and_write(0, b"x").unwrap(), None);
    // A record larger than one read's first guess comes back whole.
    let big = pattern(3, 100_000).to_vec();
    let v2 = blobs[0].compare_and_write(v, &big).unwrap().unwrap();
    assert_eq!(blobs[1].read().unwrap(), (v2, big));
    remove_object(&conf, blobs[0].object());
    drop((blobs, a, b));
    remove_image(&conf, &spec);
}
