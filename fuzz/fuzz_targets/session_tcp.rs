//! libFuzzer entry point of the `session_tcp` target (see `ironsan_fuzz::session`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::session_tcp(data));
