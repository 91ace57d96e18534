//! libFuzzer entry point of the `login_target` target (see `ironsan_fuzz::login_target`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::login_target(data));
