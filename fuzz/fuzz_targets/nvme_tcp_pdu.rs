//! libFuzzer entry point of the `nvme_tcp_pdu` target (see `ironsan_fuzz::nvme_tcp_pdu`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::nvme_tcp_pdu(data));
