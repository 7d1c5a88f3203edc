//! How the child is started so that it cannot outlive the sidecar or act as it: the sidecar
//! runs its own binary as a trampoline (`epode-sidecar __stdio-exec …`), which switches to the
//! configured user and group (when the sidecar runs as root), asks the kernel for SIGKILL when
//! the sidecar dies (`PR_SET_PDEATHSIG`: so a SIGKILLed sidecar takes its child with it), and
//! then becomes the MCP server with `execve`, keeping its pid, pipes and environment. All of
//! it through safe system-call wrappers, without code run between fork and exec.
//!
//! Also here: the sidecar as the subreaper of everything its children start (a grandchild
//! that leaves the child's process group or session is still found and stopped), and reaping
//! what is reparented to it. A child per client is in turn the subreaper of its own processes
//! (the trampoline asks for it before `execve`, which keeps it): while it runs, nothing it
//! started is reparented to the sidecar, so what is, is a stopped child's and can go.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nix::sys::signal::{kill, Signal};
use nix::unistd::{Gid, Pid, Uid};

/// The hidden subcommand that runs the trampoline.
pub(crate) const SUBCOMMAND: &str = "__stdio-exec";

/// The trampoline's word for a server that is the subreaper of its own processes.
const REAPER: &str = "reaper";

/// Rounds of looking for leftovers and killing them: one that forked as it was found is
/// caught by the next round (a killed process forks no more).
const KILL_ROUNDS: usize = 4;

pub(crate) use crate::config::RunAs;

/// Finds `program` as `execvp` would, in `path` (the child's `PATH`, else the sidecar's):
/// a name with a `/` is taken as it is. An error names what is wrong, before anything starts.
pub(super) fn resolve(program: &str, path: Option<&OsStr>) -> std::io::Result<PathBuf> {
    let executable = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return if executable(&p) {
            Ok(p)
        } else if p.exists() {
            Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "not an executable file",
            ))
        } else {
            Err(std::io::ErrorKind::NotFound.into())
        };
    }
    let path = path
        .map(OsStr::to_owned)
        .or_else(|| std::env::var_os("PATH"))
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "not found in PATH (give its full path, or allow PATH in EPODE_SIDECAR_UPSTREAM_ENV)",
            )
        })
}

/// The trampoline's command line: the sidecar's pid (to check it is still the parent), the
/// user to become, whether the server is to be the subreaper of its own processes, then the
/// program and its arguments.
pub(super) fn trampoline_args(
    program: &Path,
    args: &[String],
    run_as: Option<RunAs>,
    own_reaper: bool,
) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = vec![
        SUBCOMMAND.into(),
        std::process::id().to_string().into(),
        run_as
            .map_or_else(|| "-".to_owned(), |r| format!("{}:{}", r.uid, r.gid))
            .into(),
        if own_reaper { REAPER } else { "-" }.into(),
        "--".into(),
        program.as_os_str().to_owned(),
    ];
    out.extend(args.iter().map(Into::into));
    out
}

/// The sidecar's own binary, when it can run it again as the trampoline.
pub(super) fn own_binary() -> Option<PathBuf> {
    let exe = PathBuf::from("/proc/self/exe");
    exe.exists().then_some(exe)
}

fn fail(what: &str, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("epode-sidecar: cannot start the MCP server: {what}: {e}");
    ExitCode::from(127)
}

/// The trampoline itself (`args`: after the subcommand). Returns only when it cannot become
/// the server.
pub(crate) fn trampoline(args: Vec<std::ffi::OsString>) -> ExitCode {
    let [parent, run_as, reaper, sep, program, rest @ ..] = args.as_slice() else {
        return fail("the trampoline", "wrong arguments");
    };
    if sep != "--" {
        return fail("the trampoline", "wrong arguments");
    }
    if let Some((uid, gid)) = run_as.to_str().and_then(|s| s.split_once(':')) {
        let (Ok(uid), Ok(gid)) = (uid.parse(), gid.parse()) else {
            return fail("the trampoline", "a bad user");
        };
        // Groups first, the user last: after it, nothing else may change.
        let switched = nix::unistd::setgroups(&[])
            .and_then(|()| nix::unistd::setgid(Gid::from_raw(gid)))
            .and_then(|()| nix::unistd::setuid(Uid::from_raw(uid)));
        if let Err(e) = switched {
            return fail(&format!("switching to user {uid} and group {gid}"), e);
        }
    }
    // After any change of user (which would clear it).
    if let Err(e) = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL) {
        return fail("asking to die with the sidecar", e);
    }
    // Kept across `execve`: what the server leaves behind stays its own while it runs.
    if reaper == REAPER {
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            return fail("becoming the subreaper of its own processes", e);
        }
    }
    let parent_pid = parent.to_str().and_then(|p| p.parse::<i32>().ok());
    if parent_pid != Some(nix::unistd::getppid().as_raw()) {
        // The sidecar died before the request took effect.
        return ExitCode::from(1);
    }
    let c = |s: &OsStr| CString::new(s.as_bytes());
    let Ok(path) = c(program) else {
        return fail("the program", "a NUL byte in its name");
    };
    let Ok(argv) = std::iter::once(program.as_os_str())
        .chain(rest.iter().map(|a| a.as_os_str()))
        .map(c)
        .collect::<Result<Vec<_>, _>>()
    else {
        return fail("the arguments", "a NUL byte in one of them");
    };
    // The environment and working directory were set by the sidecar for this process.
    match nix::unistd::execv(&path, &argv) {
        Err(e) => fail(&program.to_string_lossy(), e),
        Ok(never) => match never {},
    }
}

/// The MCP server processes the sidecar runs and waits for itself (never reaped by
/// [`reap_orphans`]). Held while a child starts and while leftovers are looked for: a child
/// just started but not yet in the list would look like one.
static TRACKED: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

fn tracked_lock() -> std::sync::MutexGuard<'static, Vec<i32>> {
    TRACKED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts a child and notes it as one the sidecar waits for itself.
pub(super) fn spawn_tracked(
    cmd: &mut tokio::process::Command,
) -> std::io::Result<tokio::process::Child> {
    let mut tracked = tracked_lock();
    let child = cmd.spawn()?;
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        tracked.push(pid);
    }
    Ok(child)
}

pub(super) fn untrack(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        tracked_lock().retain(|p| *p != pid);
    }
}

/// Makes the sidecar the subreaper of its descendants: a process its child leaves behind (even
/// one that called `setsid`) is reparented to the sidecar, where [`descendants`] finds it.
pub(crate) fn become_subreaper() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::debug!(error = %e, "cannot become the subreaper of the MCP server's processes");
    }
}

/// The parent of each process, from `/proc`.
fn parents() -> Vec<(i32, i32, bool)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after = stat.get(stat.rfind(')')? + 2..)?;
            let mut fields = after.split_whitespace();
            let zombie = fields.next()? == "Z";
            let ppid = fields.next()?.parse().ok()?;
            Some((pid, ppid, zombie))
        })
        .collect()
}

/// Every live process descended from the sidecar, but for the MCP server processes it still
/// runs (`keep`) and theirs.
fn descendants(keep: &[i32]) -> Vec<i32> {
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    let table = parents();
    let mut found = vec![me];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        let children: Vec<i32> = table
            .iter()
            .filter(|(pid, ppid, zombie)| {
                *ppid == parent && !zombie && !keep.contains(pid) && !found.contains(pid)
            })
            .map(|(pid, _, _)| *pid)
            .collect();
        found.extend(children);
        i += 1;
    }
    found.retain(|p| *p != me);
    found
}

/// SIGKILLs every process the sidecar's MCP servers left behind (what a child started and
/// left running when it ended, in its process group or not), then reaps those reparented to
/// the sidecar. The servers it still runs, and their own processes, are left alone: a shared
/// child is the only one, and a child per client holds its own (see the module's comment).
pub(super) fn kill_leftovers() {
    let keep = tracked_lock();
    let mut killed: Vec<i32> = Vec::new();
    for _ in 0..KILL_ROUNDS {
        let left: Vec<i32> = descendants(&keep)
            .into_iter()
            .filter(|p| !killed.contains(p))
            .collect();
        if left.is_empty() {
            break;
        }
        for pid in &left {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        killed.extend(left);
    }
    if !killed.is_empty() {
        tracing::info!(
            processes = killed.len(),
            "stopped processes the MCP server left behind"
        );
    }
    reap(&keep);
}

/// Reaps the sidecar's exited children that are not the MCP server processes it waits for
/// itself: processes reparented to it as their subreaper (or as PID 1 in a container).
pub(super) fn reap_orphans() {
    reap(&tracked_lock());
}

fn reap(keep: &[i32]) {
    let me = i32::try_from(std::process::id()).unwrap_or(0);
    for (pid, ppid, zombie) in parents() {
        if ppid == me && zombie && !keep.contains(&pid) {
            let _ = nix::sys::wait::waitpid(
                Pid::from_raw(pid),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_as_execvp_would() {
        assert_eq!(
            resolve("sh", Some(OsStr::new("/nonexistent:/bin"))).unwrap(),
            PathBuf::from("/bin/sh")
        );
        assert!(resolve("no-such-program-xyz", Some(OsStr::new("/bin"))).is_err());
        assert_eq!(
            resolve("/nonexistent/x", None).unwrap_err().kind(),
            std::io::ErrorKind::NotFound
        );
        assert!(
            resolve(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"), None).is_err(),
            "not executable"
        );
    }

    #[test]
    fn the_trampoline_is_told_who_to_be() {
        let args = trampoline_args(
            Path::new("/bin/sh"),
            &["-c".into(), "x".into()],
            Some(RunAs { uid: 1, gid: 2 }),
            true,
        );
        let text: Vec<String> = args.iter().map(|a| a.to_string_lossy().into()).collect();
        assert_eq!(text[0], SUBCOMMAND);
        assert_eq!(text[2], "1:2");
        assert_eq!(text[3], REAPER);
        assert_eq!(&text[4..], ["--", "/bin/sh", "-c", "x"]);
        let shared = trampoline_args(Path::new("/bin/sh"), &[], None, false);
        assert_eq!(shared[2], "-");
        assert_eq!(shared[3], "-");
    }
}
