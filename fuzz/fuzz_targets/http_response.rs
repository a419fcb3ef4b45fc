#![no_main]
//! Fuzz target: see `wedgewatch::fuzz_entry::http_response`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| wedgewatch::fuzz_entry::http_response(data));
