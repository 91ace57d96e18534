//! libFuzzer entry point of the `iscsi_pdu` target (see `ironsan_fuzz::iscsi_pdu`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::iscsi_pdu(data));
