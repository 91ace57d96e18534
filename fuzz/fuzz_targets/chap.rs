//! libFuzzer entry point of the `chap` target (see `ironsan_fuzz::chap`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::chap(data));
