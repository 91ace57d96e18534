//! libFuzzer entry point of the `text_keys` target (see `ironsan_fuzz::text_keys`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::text_keys(data));
