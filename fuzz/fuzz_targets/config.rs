//! libFuzzer entry point of the `config` target (see `ironsan_fuzz::config`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::config(data));
