#![no_main]
//! `cargo fuzz run frontdoor`: see fuzz/README.md.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    epode_sidecar::fuzzing::frontdoor(data);
});
