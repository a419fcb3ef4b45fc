#![no_main]
//! Fuzz target: see `wedgewatch::fuzz_entry::daemon_request`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| wedgewatch::fuzz_entry::daemon_request(data));
