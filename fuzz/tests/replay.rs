//! Replays every committed fuzz input through its harness, without libFuzzer: the seed
//! corpora (`fuzz/corpus/<target>/`) and the inputs that once crashed a target
//! (`fuzz/regressions/<target>/`). A regression input that panics again fails this test
//! with its file name.

use std::path::{Path, PathBuf};

fn inputs(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    files.sort();
    files
}

/// Runs every input of `kind` (corpus or regressions); returns how many ran per target.
fn replay(kind: &str) -> Vec<(&'static str, usize)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(kind);
    assert!(root.is_dir(), "{} is missing", root.display());
    let mut ran = Vec::new();
    let mut failed = Vec::new();
    for &(name, harness) in ironsan_fuzz::TARGETS {
        let files = inputs(&root.join(name));
        for file in &files {
            let data = std::fs::read(file).expect("readable input");
            let ok = std::panic::catch_unwind(|| harness(&data)).is_ok();
            if !ok {
                failed.push(file.display().to_string());
            }
        }
        ran.push((name, files.len()));
    }
    // Directories named after no target are a mistake (a renamed target).
    for e in std::fs::read_dir(&root).expect("readable dir").flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        assert!(
            ironsan_fuzz::harness(&n).is_some() || !e.path().is_dir(),
            "{kind}/{n} names no fuzz target"
        );
    }
    assert!(failed.is_empty(), "inputs that panic: {failed:#?}");
    eprintln!("replayed {kind} inputs: {ran:?}");
    ran
}

#[test]
fn corpus_replays_without_panic() {
    let ran = replay("corpus");
    let empty: Vec<_> = ran
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(t, _)| t)
        .collect();
    assert!(empty.is_empty(), "targets without corpus inputs: {empty:?}");
}

#[test]
fn regressions_replay_without_panic() {
    let ran = replay("regressions");
    // The inputs of the fixes in fuzz/regressions/README.md.
    for target in ["iscsi_pdu", "pcap"] {
        assert!(
            ran.iter().any(|&(t, n)| t == target && n > 0),
            "no {target} regression input replayed"
        );
    }
}

#[test]
fn every_target_survives_trivial_inputs() {
    for (name, harness) in ironsan_fuzz::TARGETS {
        for data in [&[][..], &[0], &[0xff; 64], &[0; 300]] {
            let ok = std::panic::catch_unwind(|| harness(data)).is_ok();
            assert!(ok, "{name} panics on {} bytes", data.len());
        }
    }
}

/// The seeds cut from real logins still log in through the harness, CHAP included (the
/// harness answers `CHAP_R=auto` with the right response): the fuzzer starts past
/// authentication.
#[test]
fn seed_logins_complete_with_chap() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/login_target");
    let results: Vec<Option<bool>> = inputs(&dir)
        .iter()
        .map(|f| ironsan_fuzz::login::login_target_run(&std::fs::read(f).unwrap()))
        .collect();
    assert!(
        results.contains(&Some(false)),
        "no seed login completes without CHAP"
    );
    assert!(
        results.contains(&Some(true)),
        "no seed login completes with CHAP"
    );
}

/// The session seeds get past login to the session layer: between them the target answers
/// with R2Ts, Data-In, SCSI and task management responses, NOP-Ins, Text and Logout
/// responses and a Reject.
#[test]
fn session_seeds_reach_the_session_layer() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/session_tcp");
    let mut got = std::collections::BTreeSet::new();
    for f in inputs(&dir) {
        let outcome = ironsan_fuzz::session::session_tcp_run(&std::fs::read(&f).unwrap());
        got.extend(outcome.opcodes.keys().copied());
    }
    for (op, what) in [
        (0x31, "R2T"),
        (0x25, "Data-In"),
        (0x21, "SCSI Response"),
        (0x22, "Task Management Response"),
        (0x20, "NOP-In"),
        (0x24, "Text Response"),
        (0x26, "Logout Response"),
        (0x3f, "Reject"),
    ] {
        assert!(got.contains(&op), "no seed brings a {what}; got {got:x?}");
    }
}

/// The same over iSER: the seeds reach SCSI and task management responses, NOP-Ins, Text
/// and Logout responses and a Reject, and a write whose Write STag names nothing ends its
/// connection (the target's RDMA Read is refused) without harming the target.
#[test]
fn iser_session_seeds_reach_the_session_layer() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/session_iser");
    let mut got = std::collections::BTreeSet::new();
    for f in inputs(&dir) {
        let outcome = ironsan_fuzz::session_iser::session_iser_run(&std::fs::read(&f).unwrap());
        got.extend(outcome.opcodes.keys().copied());
        if f.ends_with("write-bad-stag") {
            assert!(outcome.closed, "a bad Write STag left the connection up");
        }
    }
    for (op, what) in [
        (0x21, "SCSI Response"),
        (0x22, "Task Management Response"),
        (0x20, "NOP-In"),
        (0x24, "Text Response"),
        (0x26, "Logout Response"),
        (0x3f, "Reject"),
    ] {
        assert!(got.contains(&op), "no seed brings a {what}; got {got:x?}");
    }
}

/// The sans-IO session seeds reach the core's decisions: tasks run and answer, ABORT TASK
/// claims one, the window turns commands away, a command is refused, pings go out and one
/// goes unanswered, status is resent for a Status SNACK, and at level 2 tasks are
/// reassigned and expire after DefaultTime2Retain.
#[test]
fn session_core_seeds_reach_the_core_decisions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/session_core");
    let mut sum = ironsan_fuzz::session_core::Outcome::default();
    for f in inputs(&dir) {
        let o = ironsan_fuzz::session_core::session_core_run(&std::fs::read(&f).unwrap());
        sum.started += o.started;
        sum.responses += o.responses;
        sum.aborted += o.aborted;
        sum.ignored += o.ignored;
        sum.refused += o.refused;
        sum.pings += o.pings;
        sum.unanswered += o.unanswered;
        sum.reassigned += o.reassigned;
        sum.expired += o.expired;
        sum.status_resent += o.status_resent;
        sum.logouts += o.logouts;
    }
    eprintln!("session_core seeds: {sum:?}");
    for (n, what) in [
        (sum.started, "task started"),
        (sum.responses, "response"),
        (sum.aborted, "task aborted by ABORT TASK"),
        (sum.ignored, "PDU the window ignored"),
        (sum.refused, "command refused"),
        (sum.pings, "ping"),
        (sum.unanswered, "unanswered ping"),
        (sum.reassigned, "task reassigned"),
        (sum.expired, "kept task expired"),
        (sum.status_resent, "status resent"),
        (sum.logouts, "logout"),
    ] {
        assert!(n > 0, "no seed brings a {what}: {sum:?}");
    }
}

#[test]
fn nvme_tcp_seeds_reach_the_queues_commands() {
    use nvme_tcp::pdu::{encode, Framing, IcReq, PduHeader};
    use nvme_tcp::queue::{Action, ControllerQueue, QueueConfig};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/nvme_tcp_pdu");
    let mut best = 0;
    for file in inputs(&dir) {
        let data = std::fs::read(&file).expect("readable seed");
        if data.len() < 2 || data[0] & 8 == 0 {
            continue;
        }
        let opts = data[0];
        let ic = IcReq {
            pfv: 0,
            hpda: opts >> 5,
            hdgst: opts & 1 != 0,
            ddgst: opts & 2 != 0,
            maxr2t: 0,
        };
        let mut stream = encode(&PduHeader::IcReq(ic), &[], &Framing::default()).to_vec();
        stream.extend_from_slice(&data[2..]);
        let mut q = ControllerQueue::new(QueueConfig::default());
        let actions = q.receive(&stream);
        let executed = actions
            .iter()
            .filter(|a| matches!(a, Action::Execute(_)))
            .count();
        best = best.max(executed);
    }
    // Connect, Property Get, two writes, a read and a flush.
    assert_eq!(best, 6, "no NVMe/TCP seed reaches every command");
}
