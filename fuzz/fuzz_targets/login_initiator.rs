//! libFuzzer entry point of the `login_initiator` target (see `ironsan_fuzz::login_initiator`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::login_initiator(data));
