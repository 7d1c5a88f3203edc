//! The command line: `--check-config`, configuration errors, and the README's settings table.

use std::process::Command;

use epode_sidecar::config::SETTINGS;

const KEY: &str = "af_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789abcdef";

fn sidecar(env: &[(&str, &str)], args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_epode-sidecar"))
        .env_clear()
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn check_config_prints_the_effective_configuration() {
    let (code, out, _) = sidecar(
        &[
            ("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:8000/mcp"),
            ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "2m"),
            ("EPODE_API_KEY", KEY),
        ],
        &["--check-config", "--listen", "127.0.0.1:9999"],
    );
    assert_eq!(code, 0);
    assert!(out.contains("listen = \"127.0.0.1:9999\""), "{out}");
    assert!(
        out.contains("upstream = \"http://127.0.0.1:8000/mcp\""),
        "{out}"
    );
    assert!(out.contains("upstream_timeout = \"2m\""), "{out}");
    assert!(out.contains("max_body_bytes = \"4194304\""), "{out}");
    assert!(out.contains("api_key = \"<set, redacted>\""), "{out}");
    assert!(!out.contains("conformance_secret"), "the key leaked: {out}");
}

#[test]
fn bad_configuration_exits_non_zero_naming_the_setting() {
    let (code, _, err) = sidecar(
        &[
            ("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:8000/mcp"),
            ("EPODE_SIDECAR_SHUTDOWN_GRACE", "forever"),
            ("AGENT_FEEDBACK_MODE", "off"),
        ],
        &["--check-config"],
    );
    assert_ne!(code, 0);
    assert!(err.contains("EPODE_SIDECAR_SHUTDOWN_GRACE"), "{err}");
    assert!(
        err.contains("30s, 500ms or 2m") || err.contains("duration"),
        "{err}"
    );

    let (code, _, err) = sidecar(&[], &["--check-config"]);
    assert_ne!(code, 0);
    assert!(err.contains("EPODE_SIDECAR_UPSTREAM"), "{err}");
}

#[test]
fn config_file_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sidecar.toml");
    std::fs::write(
        &file,
        "upstream = \"http://127.0.0.1:7000/mcp\"\nallowed_hosts = [\"mcp.internal\"]\n",
    )
    .unwrap();
    let (code, out, err) = sidecar(
        &[("AGENT_FEEDBACK_MODE", "off")],
        &["--check-config", "--config", file.to_str().unwrap()],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("http://127.0.0.1:7000/mcp"), "{out}");
    assert!(out.contains("allowed_hosts = \"mcp.internal\""), "{out}");
}

#[test]
fn readme_documents_every_setting() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for s in SETTINGS {
        assert!(
            readme.contains(s.env[0]),
            "README.md does not document {}",
            s.env[0]
        );
        if let Some(d) = s.default {
            let row = readme
                .lines()
                .find(|l| l.contains(s.env[0]) && l.starts_with('|'))
                .unwrap_or_else(|| panic!("no README table row for {}", s.env[0]));
            assert!(
                row.contains(d),
                "README row for {} lacks its default {d}: {row}",
                s.env[0]
            );
        }
    }
}
