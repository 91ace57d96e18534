//! libFuzzer entry point of the `tcp_stream` target (see `ironsan_fuzz::tcp_stream`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::tcp_stream(data));
