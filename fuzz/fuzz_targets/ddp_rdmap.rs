//! libFuzzer entry point of the `ddp_rdmap` target (see `ironsan_fuzz::ddp_rdmap`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::ddp_rdmap(data));
