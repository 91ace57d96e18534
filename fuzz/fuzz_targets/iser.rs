//! libFuzzer entry point of the `iser` target (see `ironsan_fuzz::iser`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::iser(data));
