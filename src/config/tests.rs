//! Unit tests of the configuration layers and checks.

use super::*;
use crate::feedback::FeedbackMode;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const UP: (&str, &str) = ("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:8000/mcp");
const OFF: (&str, &str) = ("AGENT_FEEDBACK_MODE", "off");
const KEY: &str = "af_live_0123456789abcdef0123456789abcdef_conformance_secret_0123456789abcdef";

#[test]
fn defaults_apply() {
    let c = Config::from_layers(env(&[UP, OFF]), &FlagValues::default()).unwrap();
    assert_eq!(c.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(c.path, "/mcp");
    assert_eq!(c.max_body_bytes, 4 * 1024 * 1024);
    assert_eq!(c.upstream_timeout, Duration::from_secs(30));
    assert_eq!(c.shutdown_grace, Duration::from_secs(10));
    assert_eq!(c.allowed_origins, OriginPolicy::Loopback);
    assert_eq!(c.allowed_hosts, HostPolicy::Loopback);
    assert_eq!(c.upstream.authority, "127.0.0.1:8000");
    assert_eq!(c.log_format, LogFormat::Text);
}

#[test]
fn non_loopback_listener_refuses_origins_and_skips_host_check() {
    let c = Config::from_layers(
        env(&[UP, OFF, ("EPODE_SIDECAR_LISTEN", "0.0.0.0:9000")]),
        &FlagValues::default(),
    )
    .unwrap();
    assert_eq!(c.allowed_origins, OriginPolicy::RefuseAll);
    assert_eq!(c.allowed_hosts, HostPolicy::Any);
}

#[test]
fn upstream_is_required_and_named() {
    let err = Config::from_layers(env(&[]), &FlagValues::default()).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("EPODE_SIDECAR_UPSTREAM"), "{msg}");
    assert!(msg.contains("http://"), "{msg}");
}

#[test]
fn bad_values_name_the_setting_and_what_it_accepts() {
    for (name, value, expect) in [
        ("EPODE_SIDECAR_LISTEN", "nowhere", "socket address"),
        ("EPODE_SIDECAR_UPSTREAM_TIMEOUT", "soon", "duration"),
        ("EPODE_SIDECAR_MAX_BODY_BYTES", "-1", "whole number"),
        ("EPODE_SIDECAR_LOG_FORMAT", "xml", "text or json"),
        ("EPODE_SIDECAR_PATH", "mcp", "starting with /"),
        (
            "EPODE_SIDECAR_ALLOWED_ORIGINS",
            "example.com",
            "exact origins",
        ),
    ] {
        let err = Config::from_layers(env(&[UP, OFF, (name, value)]), &FlagValues::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(name), "{err}");
        assert!(err.contains(expect), "{err}");
    }
    let err = Config::from_layers(
        env(&[("EPODE_SIDECAR_UPSTREAM", "ftp://x.example/mcp"), OFF]),
        &FlagValues::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("EPODE_SIDECAR_UPSTREAM"));
}

#[test]
fn layers_override_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "upstream = \"http://127.0.0.1:1/mcp\"\nmax_body_bytes = 10\npath = \"/file\"\nallowed_origins = [\"https://a.example\", \"https://b.example\"]\n",
    )
    .unwrap();
    let flags = FlagValues {
        config_file: Some(file),
        values: [("path", "/flag".to_owned())].into_iter().collect(),
    };
    let c = Config::from_layers(
        env(&[
            ("EPODE_SIDECAR_MAX_BODY_BYTES", "20"),
            ("EPODE_SIDECAR_PATH", "/env"),
            OFF,
        ]),
        &flags,
    )
    .unwrap();
    assert_eq!(c.upstream.url.as_str(), "http://127.0.0.1:1/mcp");
    assert_eq!(c.max_body_bytes, 20);
    assert_eq!(c.path, "/flag");
    assert_eq!(
        c.allowed_origins,
        OriginPolicy::Exact(vec!["https://a.example".into(), "https://b.example".into()])
    );
}

#[test]
fn unknown_file_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "upstreem = \"http://127.0.0.1:1/mcp\"\n").unwrap();
    let flags = FlagValues {
        config_file: Some(file),
        ..Default::default()
    };
    let err = Config::from_layers(env(&[UP]), &flags)
        .unwrap_err()
        .to_string();
    assert!(err.contains("upstreem"), "{err}");
}

#[test]
fn missing_file_is_an_error() {
    let err = Config::from_layers(
        env(&[UP, OFF, (CONFIG_FILE_ENV, "/nonexistent/epode.toml")]),
        &FlagValues::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("/nonexistent/epode.toml"), "{err}");
}

#[test]
fn feedback_needs_a_key_unless_off() {
    let err = Config::from_layers(env(&[UP]), &FlagValues::default())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("EPODE_API_KEY") && err.contains("AGENT_FEEDBACK_MODE=off"),
        "{err}"
    );
    let c = Config::from_layers(
        env(&[
            UP,
            ("AGENT_FEEDBACK_KEY", KEY),
            ("AGENT_FEEDBACK_MODE", "ask_once"),
        ]),
        &FlagValues::default(),
    )
    .unwrap();
    assert_eq!(c.feedback.mode, FeedbackMode::AskOnce);
    assert!(c.feedback.key.is_some());
    let c = Config::from_layers(
        env(&[
            UP,
            ("EPODE_API_KEY", KEY),
            ("AGENT_FEEDBACK_ENABLED", "false"),
        ]),
        &FlagValues::default(),
    )
    .unwrap();
    assert_eq!(c.feedback.mode, FeedbackMode::Off);
}

#[test]
fn bad_keys_and_urls_are_refused_without_echoing_the_key() {
    let secret = "af_live_0123456789abcdef0123456789abcdef_short";
    let err = Config::from_layers(
        env(&[UP, ("EPODE_API_KEY", secret)]),
        &FlagValues::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("EPODE_API_KEY"), "{err}");
    assert!(!err.contains("short"), "the key leaked: {err}");
    for url in ["http://epode.example.com", "ftp://x", "not a url"] {
        let err = Config::from_layers(
            env(&[UP, ("EPODE_API_KEY", KEY), ("EPODE_API_URL", url)]),
            &FlagValues::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("EPODE_API_URL"), "{err}");
    }
    Config::from_layers(
        env(&[
            UP,
            ("EPODE_API_KEY", KEY),
            ("EPODE_API_URL", "http://127.0.0.1:9/"),
        ]),
        &FlagValues::default(),
    )
    .unwrap();
}

#[test]
fn tool_selection() {
    let c = Config::from_layers(
        env(&[
            UP,
            ("EPODE_API_KEY", KEY),
            ("EPODE_SIDECAR_INCLUDE_TOOLS", "browser_*,get_order"),
            ("EPODE_SIDECAR_EXCLUDE_TOOLS", "browser_internal"),
            ("EPODE_SIDECAR_FEEDBACK_TOOLS", "browser_close"),
            (
                "EPODE_SIDECAR_IDENTITY_HEADERS",
                "accountRef=X-Auth-Request-User",
            ),
        ]),
        &FlagValues::default(),
    )
    .unwrap();
    let f = &c.feedback;
    assert!(f.includes("browser_navigate") && !f.decorates("browser_navigate"));
    assert!(f.includes("browser_close") && f.decorates("browser_close"));
    assert!(!f.includes("browser_internal"));
    assert!(!f.includes("admin_health"));
    assert!(!f.includes("browser_a/b"), "* does not cross /");
    assert!(f.includes("get_order"));
    assert_eq!(f.identity_headers.len(), 1);
}
