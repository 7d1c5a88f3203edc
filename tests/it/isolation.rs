//! What a stdio MCP server the sidecar runs can see of the sidecar. Run as the same user (as it
//! is unless the operator separates them), the child cannot read the sidecar's environment
//! (where `EPODE_API_KEY` lives) or its memory map: the sidecar makes itself non-dumpable at
//! start. Its command line stays readable.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

const KEY: &str = "af_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789abcdef";

/// The child: reports its uid and which of its parent's `/proc` files it could read into
/// `$1`, keeps what it read of `environ` in `$1.environ`, then waits for its stdin to close.
const PROBE: &str = r#"#!/bin/sh
out="$1"
{
  echo "uid=$(/usr/bin/id -u)"
  for f in environ maps cmdline; do
    if /bin/cat "/proc/$PPID/$f" > "$out.$f" 2>/dev/null; then
      echo "$f=readable"
    else
      echo "$f=refused"
    fi
  done
} > "$out.tmp"
/bin/mv "$out.tmp" "$out"
exec /bin/cat > /dev/null
"#;

/// The sidecar runs as `nobody` (the tests run as root; setpriv drops to that uid before the
/// sidecar starts, as a service manager would), with the key in its environment, in front of
/// a child that tries to read it from `/proc/$PPID/environ`.
#[test]
fn a_child_of_the_same_user_cannot_read_the_sidecars_environment() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let probe = dir.path().join("probe.sh");
    std::fs::write(&probe, PROBE).unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let report = dir.path().join("report");
    let bin = env!("CARGO_BIN_EXE_epode-sidecar");
    let as_root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    let mut cmd = if as_root {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            bin,
        ]);
        c
    } else {
        Command::new(bin)
    };
    cmd.args(["--", "/bin/sh"])
        .arg(&probe)
        .arg(&report)
        .env_clear()
        .env("EPODE_SIDECAR_LISTEN", "127.0.0.1:0")
        .env("EPODE_API_KEY", KEY)
        .env("EPODE_API_URL", "http://127.0.0.1:9")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut sidecar = Proc {
        child: cmd.spawn().expect("start the sidecar through setpriv"),
        name: "epode-sidecar".into(),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !report.exists() {
        assert!(Instant::now() < deadline, "the child wrote no report");
        if let Ok(Some(status)) = sidecar.child.try_wait() {
            panic!("the sidecar exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(&report).unwrap();
    let environ = std::fs::read(dir.path().join("report.environ")).unwrap_or_default();
    let _ = Command::new("kill")
        .args(["-TERM", &sidecar.child.id().to_string()])
        .status();
    let _ = sidecar.child.wait();

    if as_root {
        assert!(text.contains("uid=65534"), "{text}");
    }
    assert!(
        !String::from_utf8_lossy(&environ).contains("conformance_secret"),
        "the child read the key from /proc/$PPID/environ: {text}"
    );
    assert!(text.contains("environ=refused"), "{text}");
    assert!(text.contains("maps=refused"), "{text}");
    // What stays visible, as documented: the command line.
    assert!(text.contains("cmdline=readable"), "{text}");
}
