//! libFuzzer entry point of the `control_request` target (see `ironsan_fuzz::control_request`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::control_request(data));
