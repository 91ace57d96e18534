//! libFuzzer entry point of the `pcap` target (see `ironsan_fuzz::pcap`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::pcap(data));
