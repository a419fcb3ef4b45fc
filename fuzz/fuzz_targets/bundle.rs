#![no_main]
//! Fuzz target: see `wedgewatch::fuzz_entry::bundle`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| wedgewatch::fuzz_entry::bundle(data));
