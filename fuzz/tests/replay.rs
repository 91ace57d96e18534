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

/// Runs every input of `kind` (corpus or regressions); returns how many ran.
fn replay(kind: &str) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(kind);
    let mut ran = 0;
    let mut failed = Vec::new();
    for (name, harness) in ironsan_fuzz::TARGETS {
        for file in inputs(&root.join(name)) {
            let data = std::fs::read(&file).expect("readable input");
            let ok = std::panic::catch_unwind(|| harness(&data)).is_ok();
            if !ok {
                failed.push(file.display().to_string());
            }
            ran += 1;
        }
    }
    // Directories named after no target are a mistake (a renamed target).
    if let Ok(rd) = std::fs::read_dir(&root) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            assert!(
                ironsan_fuzz::harness(&n).is_some() || !e.path().is_dir(),
                "{kind}/{n} names no fuzz target"
            );
        }
    }
    assert!(failed.is_empty(), "inputs that panic: {failed:#?}");
    ran
}

#[test]
fn corpus_replays_without_panic() {
    let n = replay("corpus");
    eprintln!("replayed {n} corpus inputs");
    assert!(n > 0, "no corpus inputs found");
}

#[test]
fn regressions_replay_without_panic() {
    let n = replay("regressions");
    eprintln!("replayed {n} regression inputs");
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
