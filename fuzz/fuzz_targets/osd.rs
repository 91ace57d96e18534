//! libFuzzer entry point of the `osd` target (see `ironsan_fuzz::osd`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::osd(data));
