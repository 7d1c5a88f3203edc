#![no_main]
//! `cargo fuzz run sse`: see fuzz/README.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    epode_sidecar::fuzzing::sse(data);
});
