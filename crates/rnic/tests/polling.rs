//! An RNIC whose progress thread polls after work (`Rnic::polling`): it moves data as one that
//! sleeps does, and once the work stops it goes back to sleeping in epoll. (A binary of its
//! own: the check reads the CPU time of every `rnic-progress` thread in the process.)

mod common;
use common::*;
use rdma::*;
use rnic::Rnic;
use std::time::Duration;

/// Clock ticks of CPU (user + system) used so far by this process's RNIC progress threads.
fn progress_thread_ticks() -> u64 {
    let mut ticks = 0;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim() != "rnic-progress" {
            continue;
        }
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // Fields after the command name's closing parenthesis; utime and stime are the 14th
        // and 15th fields of the line, the 12th and 13th after it.
        let rest = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    ticks
}

#[test]
fn a_polling_engine_moves_data_then_sleeps_when_idle() {
    let poll = Duration::from_micros(50);
    let a = Rnic::polling(poll).unwrap();
    let b = Rnic::polling(poll).unwrap();
    let (pda, pdb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ea, _eb) = pair(&a, &pda, &b, &pdb, ConnParams::default(), |_, _| {});
    let len = 64 << 10;
    let src = mr_with(&a, &pda, &pattern(7, len * 4), Access::LOCAL_WRITE);
    let dst = b
        .reg_mr(&pdb, len * 4, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
        .unwrap();
    for i in 0..200usize {
        let at = (i % 4) * len;
        ea.qp
            .post_send(rdma_write(i as u64, &dst, at, vec![src.sge(at, len)]))
            .unwrap();
        let wc = wait_wc(&ea.scq, Duration::from_secs(10));
        assert_eq!(wc.status, WcStatus::Success, "RDMA Write {i}");
    }
    let mut landed = vec![0u8; len * 4];
    dst.read_at(0, &mut landed);
    assert!(landed == pattern(7, len * 4), "the written bytes arrived");

    // Idle now: both threads poll 50 µs more, then sleep. A thread that kept polling would
    // use about the whole interval (two threads: up to twice it, on two cores).
    std::thread::sleep(Duration::from_millis(50));
    let before = progress_thread_ticks();
    std::thread::sleep(Duration::from_millis(500));
    let used = progress_thread_ticks() - before;
    let hz = 100; // USER_HZ on Linux
    assert!(
        used * 1000 / hz <= 60,
        "idle progress threads used {} ms of CPU in 500 ms",
        used * 1000 / hz
    );
}
