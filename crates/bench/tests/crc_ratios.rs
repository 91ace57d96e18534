//! The performance relations of the engine at 8 KiB, measured in one run (ratios only: absolute
//! cycles per byte depend on the machine and are printed, not asserted). This is a guard
//! against a collapse, each relation with twice its factor: the promise itself (fused within
//! 1.1x of the CRC alone) is checked by `ironsan bench crc --check`, since a test command on
//! a shared 2-core machine cannot hold a 10% bar (it failed once while a build ran beside it).
//! Run optimized: the project's test command uses `cargo test --release`.

use std::time::Duration;

use bench::crc::{check_ratios, run, Clock, Config, Method};

/// Each relation's factor is doubled: only a collapse fails the test.
const COLLAPSE_SLACK: f64 = 2.0;

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "timing ratios need an optimized build: cargo test --release"
)]
fn ratios_at_8k_hold() {
    let clock = Clock::calibrate(Duration::from_millis(20));
    let config = Config {
        sizes: vec![8192],
        methods: Method::all_available(),
        samples: 25,
        bytes_per_sample: 128 << 10,
    };
    // A shared 2-core machine can disturb one whole attempt; the relations must hold in at least
    // one of a few attempts, each already the best of 25 interleaved samples.
    let mut last = Vec::new();
    for attempt in 1..=4 {
        let rows = run(&config, &clock);
        for r in &rows {
            println!(
                "attempt {attempt}: {:>15} {:6.3} {}/byte {:7.2} GB/s",
                r.method.name(),
                r.ticks_per_byte,
                clock.unit(),
                r.gb_per_sec
            );
        }
        match check_ratios(&rows, 8192, COLLAPSE_SLACK) {
            Ok(()) => return,
            Err(problems) => last = problems,
        }
    }
    panic!("CRC32C performance relations do not hold: {last:#?}");
}
