//! The `epode-sidecar` binary: see the library's `cli` module.

/// glibc's allocator spent a quarter of the sidecar's CPU time (and took arena locks) under
/// load in the overhead benchmark; mimalloc's per-thread pages do not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    epode_sidecar::main()
}
