//! libFuzzer entry point of the `mpa` target (see `ironsan_fuzz::mpa`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::mpa(data));
