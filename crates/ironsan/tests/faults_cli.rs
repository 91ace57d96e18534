//! Faults from the command line: `kill -9` of a target serving a file LUN in the middle of a
//! stream of writes (half of them FUA, a SYNCHRONIZE CACHE every 32), after which every write
//! it acknowledged reads back intact from the restarted target; and `ironsan delay-proxy
//! --fault` flipping a Data-In byte, which `bench --verify` catches without digests and the
//! data digest catches with them.

use std::collections::VecDeque;
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

use iscsi_initiator::{scsi, CommandRequest, IscsiUrl, PendingCommand, Session, SessionConfig};

mod common;
use common::Proc;

const UNIT: usize = 64 * 1024;
const UNITS: usize = 512;
const BLOCK: usize = 512;
const QUEUE_DEPTH: usize = 16;

/// What write `seed` puts in `unit`: the bench's verify pattern (each block names its LBA).
fn pattern(unit: usize, seed: u64) -> bytes::Bytes {
    let mut v = vec![0u8; UNIT];
    bench::workload::fill_pattern(&mut v, (unit * UNIT / BLOCK) as u64, BLOCK as u32, seed);
    v.into()
}

fn start_target(config: &std::path::Path) -> (Proc, IscsiUrl) {
    let mut t = Proc::spawn(&["target", "--config", config.to_str().unwrap()]);
    let portal = t.wait_line("ironsan: serving iSCSI on ", ' ');
    let url = IscsiUrl::parse_lun(&format!("iscsi://{portal}/iqn.2026-11.org.ironsan:kill/0"))
        .expect("url");
    (t, url)
}

/// What is known of each unit when the target dies.
#[derive(Clone, Copy, Default)]
struct Unit {
    /// Seed of the last acknowledged write.
    acked: Option<u64>,
    /// A write to the unit was in flight (its data may or may not have landed).
    in_flight: bool,
}

struct Counts {
    acked: usize,
    fua: usize,
    synced: usize,
}

/// Writes round the units (one write at most in flight per unit) until `kill_after`, then
/// kills the target with SIGKILL and collects every answer.
async fn write_until_killed(
    s: &Session,
    target: &mut Proc,
    kill_after: Duration,
) -> (Vec<Unit>, Counts) {
    let mut units = vec![Unit::default(); UNITS];
    let mut queue: VecDeque<(usize, u64, bool, PendingCommand)> = VecDeque::new();
    let mut unsynced: Vec<usize> = Vec::new();
    let mut counts = Counts {
        acked: 0,
        fua: 0,
        synced: 0,
    };
    let start = Instant::now();
    let mut next = 0u64;
    let mut killed = false;
    loop {
        while !killed && queue.len() < QUEUE_DEPTH {
            let unit = next as usize % UNITS;
            let fua = next % 2 == 1;
            let cdb = scsi::read_write(
                true,
                (unit * UNIT / BLOCK) as u64,
                (UNIT / BLOCK) as u32,
                fua,
            );
            units[unit].in_flight = true;
            let p = s.submit(CommandRequest::write(0, cdb, pattern(unit, next)));
            queue.push_back((unit, next, fua, p));
            next += 1;
        }
        if !killed && start.elapsed() >= kill_after {
            target.child.kill().expect("SIGKILL the target");
            killed = true;
        }
        let Some((unit, seed, fua, p)) = queue.pop_front() else {
            break;
        };
        match p.wait().await {
            Ok(r) => {
                assert_eq!(r.status, 0, "write {seed}");
                units[unit] = Unit {
                    acked: Some(seed),
                    in_flight: false,
                };
                counts.acked += 1;
                counts.fua += usize::from(fua);
                unsynced.push(unit);
            }
            Err(e) => {
                assert!(killed, "write {seed} failed before the kill: {e}");
                assert!(e.to_string().contains("connection"), "a clear error: {e}");
            }
        }
        if !killed && unsynced.len() >= 32 {
            s.synchronize_cache(0).await.expect("SYNCHRONIZE CACHE");
            counts.synced += unsynced.len();
            unsynced.clear();
        }
    }
    assert!(
        next as usize > UNITS,
        "the kill came after every unit was written once"
    );
    (units, counts)
}

#[test]
fn every_acknowledged_write_survives_kill_9_of_the_target() {
    let dir = std::env::temp_dir().join(format!("ironsan-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let image = dir.join("lun0.img");
    let config = dir.join("target.toml");
    std::fs::write(
        &config,
        format!(
            "portals = [\"127.0.0.1:0\"]\n\n[[target]]\nname = \"iqn.2026-11.org.ironsan:kill\"\n\
             [target.lun.0]\nsize = \"32MiB\"\nbackend = {{ type = \"file\", path = \"{}\", create = true }}\n",
            image.display()
        ),
    )
    .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (mut target, url) = start_target(&config);
    let (units, counts) = rt.block_on(async {
        let s = transports::connect_session(&url, SessionConfig::from_url(&url))
            .await
            .expect("login");
        tokio::time::timeout(
            common::LIMIT,
            write_until_killed(&s, &mut target, Duration::from_millis(1500)),
        )
        .await
        .expect("every write answered or failed in time")
    });
    assert!(
        target.wait_exit(common::LIMIT).code().is_none(),
        "killed by a signal"
    );
    drop(target);

    let (_target, url) = start_target(&config);
    let (checked, skipped) = rt.block_on(async {
        let s = transports::connect_session(&url, SessionConfig::from_url(&url))
            .await
            .expect("login after the restart");
        let (mut checked, mut skipped) = (0, 0);
        for (i, u) in units.iter().enumerate() {
            let Some(seed) = u.acked else { continue };
            if u.in_flight {
                // A later write was in flight: either version (or a mix) may be there.
                skipped += 1;
                continue;
            }
            let back = s
                .read(
                    0,
                    (i * UNIT / BLOCK) as u64,
                    (UNIT / BLOCK) as u32,
                    BLOCK as u32,
                )
                .await
                .expect("read back");
            assert!(
                back == pattern(i, seed),
                "unit {i}: acknowledged write {seed} lost"
            );
            checked += 1;
        }
        s.logout().await.expect("logout");
        (checked, skipped)
    });
    eprintln!(
        "kill -9: {} writes acknowledged ({} FUA, {} before a SYNCHRONIZE CACHE); \
         {checked} units verified, {skipped} had a write in flight",
        counts.acked, counts.fua, counts.synced
    );
    assert!(checked > UNITS / 2, "most units verified: {checked}");
    assert!(counts.fua > 0 && counts.synced > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

fn run(args: &[&str]) -> (bool, String) {
    let o = Command::new("timeout")
        .arg(common::LIMIT.as_secs().to_string())
        .arg(common::exe())
        .args(args)
        .env_remove("IRONSAN_LOG")
        .output()
        .expect("run ironsan");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status.success(), text)
}

/// `ironsan delay-proxy` on a free port in front of `portal`, injecting `faults` and
/// logging to `log`; returns its address once it listens (that probe is its connection 0).
fn proxy_in_front(portal: &str, faults: &[&str], log: &std::path::Path) -> (String, Proc) {
    let free = TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = free.local_addr().unwrap().to_string();
    drop(free);
    let mut args = vec!["delay-proxy", "--listen", &listen, "--upstream", portal];
    for f in faults {
        args.extend(["--fault", f]);
    }
    let proxy = Proc::spawn_logging_to(&args, log);
    let wait_start = Instant::now();
    while std::net::TcpStream::connect(&listen).is_err() {
        assert!(wait_start.elapsed() < common::LIMIT, "the proxy listens");
        std::thread::sleep(Duration::from_millis(20));
    }
    (listen, proxy)
}

#[test]
fn a_fault_spec_the_proxy_cannot_read_is_one_line_saying_what_to_write() {
    let (ok, text) = run(&["delay-proxy", "--fault", "down:data-in#0:reset"]);
    assert!(!ok);
    assert!(
        text.contains("fault \"down:data-in#0:reset\"") && text.contains("OPCODE#N"),
        "{text}"
    );
}

#[test]
fn a_flipped_data_in_byte_is_caught_by_verify_and_by_the_data_digest() {
    let mut target = Proc::spawn(&["target", "--portal", "127.0.0.1:0"]);
    let portal = target.wait_line("ironsan: serving iSCSI on ", ' ');
    let log = std::env::temp_dir().join(format!("ironsan-fault-proxy-{}.log", std::process::id()));
    // 200 writes of 64 KiB, then their verify reads: one Data-In each; the 40th is flipped.
    let (listen, _proxy) = proxy_in_front(
        &portal,
        &[
            "down:data-in#40:corrupt=data+0:conn=1",
            "down:data-in#40:corrupt=data+0:conn=2",
        ],
        &log,
    );
    // That probe was connection 0; each bench runs on one connection: 1, then 2.
    let bench = |query: &str| {
        run(&[
            "bench",
            &format!("iscsi://{listen}/iqn.2026-11.org.ironsan:default/0{query}"),
            "--rw",
            "write",
            "--size",
            "64k",
            "--qd",
            "1",
            "--count",
            "200",
            "--verify",
        ])
    };
    let (ok, text) = bench("");
    assert!(
        !ok,
        "without digests the flipped byte reaches the reader: {text}"
    );
    assert!(text.contains("verify: data read at LBA"), "{text}");
    let fired = std::fs::read_to_string(&log).unwrap();
    assert!(
        fired.contains("fault down:data-in#40:corrupt=data+0:conn=1 fired"),
        "{fired}"
    );
    // With the data digest the initiator sees the damage before any caller does.
    let (ok, text) = bench("?data_digest=crc32c");
    assert!(!ok, "{text}");
    assert!(text.contains("data digest error on Data-In"), "{text}");
    assert!(!text.contains("verify: data read at LBA"), "{text}");
    let _ = std::fs::remove_file(&log);
    drop(target);
}

#[test]
fn at_error_recovery_level_1_a_corrupting_link_costs_resends_not_the_session() {
    let mut target = Proc::spawn(&[
        "target",
        "--portal",
        "127.0.0.1:0",
        "--error-recovery-level",
        "1",
    ]);
    let portal = target.wait_line("ironsan: serving iSCSI on ", ' ');
    let log = std::env::temp_dir().join(format!("ironsan-erl1-proxy-{}.log", std::process::id()));
    // One Data-In and Data-Out in 50 damaged, and one command in 100, on every connection;
    // a command without data loses a header byte (it has no data): the target discards
    // it, and the initiator finds it missing and sends it again.
    let (listen, _proxy) = proxy_in_front(
        &portal,
        &[
            "down:data-in%50:corrupt=data+3",
            "up:data-out%50:corrupt=data+3",
            "up:scsi-cmd%100:corrupt=data+3",
        ],
        &log,
    );
    let json = std::env::temp_dir().join(format!("ironsan-erl1-{}.json", std::process::id()));
    let (ok, text) = run(&[
        "bench",
        &format!("iscsi://{listen}/iqn.2026-11.org.ironsan:default/0"),
        "--header-digest",
        "crc32c",
        "--data-digest",
        "crc32c",
        "--error-recovery-level",
        "1",
        "--rw",
        "read,write",
        "--size",
        "256k",
        "--qd",
        "4",
        "--count",
        "200",
        "--span",
        "16m",
        "--verify",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(ok, "every command completes, verified: {text}");
    assert!(text.contains("no difference"), "{text}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let sum = |key: &str| -> u64 {
        v["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["recovery"][key].as_u64().unwrap())
            .sum()
    };
    assert!(sum("data_snacks") > 0, "Data-In asked for again: {v}");
    assert!(
        sum("data_out_rejects") + sum("command_retries") > 0,
        "write data sent again: {v}"
    );
    assert_eq!(sum("reinstatements"), 0, "the session never dropped");
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&json);
    drop(target);
}
