//! libFuzzer entry point of the `session_core` target (see `ironsan_fuzz::session_core`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::session_core(data));
