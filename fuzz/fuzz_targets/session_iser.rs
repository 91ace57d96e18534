//! libFuzzer entry point of the `session_iser` target (see `ironsan_fuzz::session_iser`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::session_iser(data));
