//! libFuzzer entry point of the `send_targets` target (see `ironsan_fuzz::send_targets`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::send_targets(data));
