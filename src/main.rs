//! The `epode-sidecar` binary: see the library's `cli` module.

use std::process::ExitCode;

/// glibc's allocator spent a quarter of the sidecar's CPU time (and took arena locks) under
/// load in the overhead benchmark; mimalloc's per-thread pages do not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc returns freed memory to the system only after this many milliseconds, and only
/// when it is called again after that: a sidecar that goes idle after a burst kept what the
/// burst's last second freed (9 to 16 MiB more than idle, 30 s after a burst of 20,000
/// calls/s; `benches/openloop.rs`). At 0 it returns memory as it frees it: 1 to 4 MiB more
/// than idle after the same burst, for about a hundred more `madvise` and a thousand more
/// page faults a second at 3,000 calls/s (no measurable CPU per call).
const PURGE_DELAY: (&str, &str) = ("MIMALLOC_PURGE_DELAY", "0");

fn main() -> ExitCode {
    // The stdio trampoline becomes the MCP server at once: the option is not for the server,
    // whose environment is exactly what the operator allowed, and a re-exec is one more
    // `execve` per child, run before the trampoline switches user.
    if !epode_sidecar::is_stdio_trampoline() {
        with_allocator_options();
    }
    epode_sidecar::main()
}

/// mimalloc reads its options from the environment as the process loads, and setting one
/// later takes a foreign call, which this crate forbids (`unsafe`): so when the option is not
/// in the environment, the binary starts itself again with it (same process id, arguments
/// and descriptors). An operator's own `MIMALLOC_PURGE_DELAY` is kept; if the binary cannot
/// be started again (no `/proc`), it runs with mimalloc's default.
fn with_allocator_options() {
    use std::os::unix::process::CommandExt as _;
    if std::env::var_os(PURGE_DELAY.0).is_some() {
        return;
    }
    let mut args = std::env::args_os();
    // The running binary itself, even once replaced on disk (`current_exe()` is only the
    // link's text, then `PATH (deleted)`: whatever file has that name).
    let mut again = std::process::Command::new("/proc/self/exe");
    if let Some(arg0) = args.next() {
        again.arg0(arg0);
    }
    // Returns only when it failed.
    let _ = again.args(args).env(PURGE_DELAY.0, PURGE_DELAY.1).exec();
}
