//! libFuzzer entry point of the `scsi` target (see `ironsan_fuzz::scsi`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ironsan_fuzz::scsi(data));
