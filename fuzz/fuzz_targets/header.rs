#![no_main]
//! `cargo fuzz run header`: see fuzz/README.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    epode_sidecar::fuzzing::header(data);
});
