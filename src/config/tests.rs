//! Unit tests of the configuration layers and checks.

use std::time::Duration;

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

/// The settings with an upstream, feedback off, and `extra`.
fn read(extra: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
    let mut pairs = vec![UP, OFF];
    pairs.extend_from_slice(extra);
    Config::from_layers(env(&pairs), &FlagValues::default())
}
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
    let UpstreamTransport::Http(target) = &c.upstream else {
        panic!("an HTTP upstream")
    };
    assert_eq!(target.authority, "127.0.0.1:8000");
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
        command: Vec::new(),
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
    let UpstreamTransport::Http(target) = &c.upstream else {
        panic!("an HTTP upstream")
    };
    assert_eq!(target.url.as_str(), "http://127.0.0.1:1/mcp");
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

fn stdio_config(pairs: &[(&str, &str)], command: &[&str]) -> Result<Config, ConfigErrors> {
    let flags = FlagValues {
        command: command.iter().map(|s| (*s).to_owned()).collect(),
        ..FlagValues::default()
    };
    Config::from_layers(env(pairs), &flags)
}

#[test]
fn a_command_after_the_separator_or_in_the_setting_is_a_stdio_upstream() {
    let c = stdio_config(&[OFF], &["python", "server.py", "--stdio"]).unwrap();
    let UpstreamTransport::Stdio(cmd) = &c.upstream else {
        panic!("stdio")
    };
    assert_eq!(cmd.program, "python");
    assert_eq!(cmd.args, ["server.py", "--stdio"]);
    let c = stdio_config(
        &[
            OFF,
            (
                "EPODE_SIDECAR_UPSTREAM_COMMAND",
                r#"uv run "my server.py" --name 'a b'"#,
            ),
        ],
        &[],
    )
    .unwrap();
    let UpstreamTransport::Stdio(cmd) = &c.upstream else {
        panic!("stdio")
    };
    assert_eq!(cmd.program, "uv");
    assert_eq!(cmd.args, ["run", "my server.py", "--name", "a b"]);
    // The command line wins over the setting.
    let c = stdio_config(
        &[OFF, ("EPODE_SIDECAR_UPSTREAM_COMMAND", "other")],
        &["mine"],
    )
    .unwrap();
    let UpstreamTransport::Stdio(cmd) = &c.upstream else {
        panic!("stdio")
    };
    assert_eq!(cmd.program, "mine");
}

#[test]
fn an_upstream_is_one_url_or_one_command() {
    let both = stdio_config(&[UP, OFF], &["python", "server.py"])
        .unwrap_err()
        .to_string();
    assert!(both.contains("give one of them"), "{both}");
    let neither = stdio_config(&[OFF], &[]).unwrap_err().to_string();
    assert!(
        neither.contains("--") && neither.contains("EPODE_SIDECAR_UPSTREAM"),
        "{neither}"
    );
    let unbalanced = stdio_config(
        &[OFF, ("EPODE_SIDECAR_UPSTREAM_COMMAND", "python 'server.py")],
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        unbalanced.contains("EPODE_SIDECAR_UPSTREAM_COMMAND"),
        "{unbalanced}"
    );
}

#[test]
fn the_child_sees_only_the_allowed_environment_and_never_the_key() {
    let c = stdio_config(
        &[
            ("EPODE_API_KEY", KEY),
            ("AGENT_FEEDBACK_KEY", KEY),
            ("EPODE_SIDECAR_LOG", "debug"),
            ("EPODE_SIDECAR_UPSTREAM_ENV", "PATH,MYAPP_*,EPODE_*,AGENT_*"),
            ("PATH", "/usr/bin"),
            ("MYAPP_TOKEN", "t"),
            ("OTHER_SECRET", "s"),
            ("HOME", "/root"),
        ],
        &["server"],
    )
    .unwrap();
    let UpstreamTransport::Stdio(cmd) = &c.upstream else {
        panic!("stdio")
    };
    let names: Vec<&str> = cmd.env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["MYAPP_TOKEN", "PATH"]);
    // The default list passes the usual variables, and never the key.
    let c = stdio_config(
        &[
            ("EPODE_API_KEY", KEY),
            ("HOME", "/h"),
            ("LC_ALL", "C"),
            ("PYTHONPATH", "/p"),
            ("SECRET", "x"),
        ],
        &["server"],
    )
    .unwrap();
    let UpstreamTransport::Stdio(cmd) = &c.upstream else {
        panic!("stdio")
    };
    let names: Vec<&str> = cmd.env.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["HOME", "LC_ALL", "PYTHONPATH"]);
    assert!(
        !format!("{cmd:?}").contains("/p"),
        "Debug never shows values"
    );
}

#[test]
fn dev_needs_no_key_refuses_one_and_stays_on_loopback() {
    let c = Config::from_layers(
        env(&[UP, ("EPODE_SIDECAR_DEV", "1")]),
        &FlagValues::default(),
    )
    .unwrap();
    assert!(c.dev.is_some());
    assert!(c.feedback.key.is_some(), "an ephemeral key");
    assert_eq!(c.feedback.mode, FeedbackMode::NeverAsk);
    let with_key = Config::from_layers(
        env(&[UP, ("EPODE_SIDECAR_DEV", "true"), ("EPODE_API_KEY", KEY)]),
        &FlagValues::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        with_key.contains("--dev") && !with_key.contains("secret"),
        "{with_key}"
    );
    let public = Config::from_layers(
        env(&[
            UP,
            ("EPODE_SIDECAR_DEV", "1"),
            ("EPODE_SIDECAR_LISTEN", "0.0.0.0:8080"),
        ]),
        &FlagValues::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(public.contains("loopback"), "{public}");
}

#[test]
fn without_a_key_the_error_says_how_to_try_or_turn_feedback_off() {
    let msg = Config::from_layers(env(&[UP]), &FlagValues::default())
        .unwrap_err()
        .to_string();
    assert!(msg.contains("EPODE_API_KEY"), "{msg}");
    assert!(msg.contains("--dev"), "{msg}");
    assert!(msg.contains("AGENT_FEEDBACK_MODE=off"), "{msg}");
}

#[test]
fn zero_timeouts_are_refused_naming_the_setting() {
    for name in [
        "EPODE_SIDECAR_UPSTREAM_TIMEOUT",
        "EPODE_SIDECAR_UPSTREAM_SESSION_IDLE",
        "EPODE_SIDECAR_HEADER_TIMEOUT",
        "EPODE_SIDECAR_BODY_TIMEOUT",
        "EPODE_SIDECAR_IDLE_TIMEOUT",
        "EPODE_SIDECAR_UPSTREAM_IDLE_TIMEOUT",
        "EPODE_SIDECAR_FEEDBACK_TIMEOUT",
        "EPODE_SIDECAR_TELEMETRY_FLUSH",
        "EPODE_SIDECAR_TELEMETRY_RETRY_BASE",
        "AGENT_FEEDBACK_CONSENT_TIMEOUT_MS",
    ] {
        let zero = if name.ends_with("_MS") { "0" } else { "0s" };
        let err = Config::from_layers(env(&[UP, OFF, (name, zero)]), &FlagValues::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(name), "{name}: {err}");
    }
    // Zero is a meaning of its own for these: cut at once, drop what is queued.
    for name in [
        "EPODE_SIDECAR_SHUTDOWN_GRACE",
        "EPODE_SIDECAR_TELEMETRY_SHUTDOWN",
    ] {
        Config::from_layers(env(&[UP, OFF, (name, "0s")]), &FlagValues::default()).unwrap();
    }
}

#[test]
fn url_credentials_are_never_shown() {
    assert_eq!(
        redact_url("http://user:pa55@host:8000/mcp?x=@"),
        "http://<redacted>@host:8000/mcp?<redacted>"
    );
    assert_eq!(
        redact_url("http://h/mcp?api_key=QUERYSECRET"),
        "http://h/mcp?<redacted>"
    );
    assert_eq!(redact_url("http://h/mcp#tok=1"), "http://h/mcp#<redacted>");
    assert_eq!(
        redact_url("http://h/mcp?k=s3cret (with a command too)"),
        "http://h/mcp?<redacted> (with a command too)"
    );
    assert_eq!(redact_url("http://h/mcp"), "http://h/mcp");
    assert_eq!(redact_url("https://tok@h/"), "https://<redacted>@h/");
    assert_eq!(redact_url("http://h/a@b"), "http://h/a@b");
    assert_eq!(redact_url("not a url @ all"), "not a url @ all");
    let c = Config::from_layers(
        env(&[
            (
                "EPODE_SIDECAR_UPSTREAM",
                "http://user:pa55@127.0.0.1:8000/mcp",
            ),
            ("EPODE_API_URL", "https://key:s3cret@api.example.com"),
            ("EPODE_API_KEY", KEY),
        ]),
        &FlagValues::default(),
    )
    .unwrap();
    let shown = format!("{c}\n{}", c.upstream.shown());
    assert!(
        !shown.contains("pa55") && !shown.contains("s3cret"),
        "{shown}"
    );
    assert!(
        shown.contains("http://<redacted>@127.0.0.1:8000/mcp"),
        "{shown}"
    );
    for (name, bad) in [
        (
            "EPODE_SIDECAR_UPSTREAM",
            "http://user:pa55@127.0.0.1:99999/mcp",
        ),
        ("EPODE_API_URL", "http://key:pa55@api.example.com"),
    ] {
        let err = Config::from_layers(
            env(&[UP, (name, bad), ("EPODE_API_KEY", KEY)]),
            &FlagValues::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains(name) && !err.contains("pa55"), "{err}");
    }
}

#[test]
fn an_environment_that_is_not_text_is_refused_only_where_the_sidecar_reads_it() {
    use std::ffi::OsString;
    use std::os::unix::ffi::OsStringExt;
    let bad = || OsString::from_vec(b"af_live_\xff_secret".to_vec());
    let ok = text_environment([
        (OsString::from("FOO"), bad()),
        (
            OsString::from_vec(b"\xffNAME".to_vec()),
            OsString::from("x"),
        ),
        (OsString::from("EPODE_SIDECAR_LOG"), OsString::from("debug")),
    ])
    .unwrap();
    assert_eq!(ok, vec![("EPODE_SIDECAR_LOG".into(), "debug".into())]);
    for name in [
        "EPODE_API_KEY",
        "AGENT_FEEDBACK_KEY",
        "EPODE_SIDECAR_UPSTREAM",
    ] {
        let err = text_environment([(OsString::from(name), bad())])
            .unwrap_err()
            .to_string();
        assert!(err.contains(name) && err.contains("UTF-8"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }
}

#[test]
fn a_file_error_never_quotes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    for text in [
        "api_key = \"af_live_0123_topsecret\n",
        "api_key = \"af_live_0123_topsecret\" x\n",
        "api_key = \"af_live_0123_topsecret\"\napi_key = \"topsecret\"\n",
    ] {
        std::fs::write(&file, text).unwrap();
        let flags = FlagValues {
            config_file: Some(file.clone()),
            ..FlagValues::default()
        };
        let err = Config::from_layers(env(&[UP, OFF]), &flags)
            .unwrap_err()
            .to_string();
        assert!(!err.contains("topsecret"), "{err}");
        assert!(err.contains("line "), "{err}");
    }
}

#[test]
fn every_key_and_variable_is_declared_once() {
    let mut keys = std::collections::BTreeSet::new();
    let mut vars = std::collections::BTreeSet::new();
    for s in all() {
        assert!(keys.insert(s.key), "the key {} is declared twice", s.key);
        for v in s.env {
            assert!(vars.insert(*v), "the variable {v} is declared twice");
        }
    }
    assert!(!vars.contains(CONFIG_FILE_ENV));
    // Every default is a value its parser accepts (the file, the environment and the flags
    // left out): the groups read from the defaults alone, with a command for an upstream.
    let mut defaults = Layers::default();
    for s in all() {
        if let Some(d) = s.default {
            defaults.set(s.key, d.to_owned());
        }
    }
    defaults.set(core::UPSTREAM.doc.key, "http://127.0.0.1:1/mcp".to_owned());
    tls::read(&defaults).unwrap();
    limits::read(&defaults).unwrap();
    stdio::read(&defaults, "server", &[]).unwrap();
    dev::read(&defaults).unwrap();
    feedback::read(&defaults, Some(true)).unwrap();
    let err = Config::read(&defaults, &[]).unwrap_err().to_string();
    assert!(
        err.contains("EPODE_API_KEY"),
        "only the key is missing: {err}"
    );
}

#[test]
fn the_http_surface_is_off_by_default_and_reads_its_settings_when_on() {
    let c = Config::from_layers(env(&[UP, OFF]), &FlagValues::default()).unwrap();
    assert!(c.http.is_none());
    let c = Config::from_layers(
        env(&[
            UP,
            OFF,
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
            ("EPODE_SIDECAR_HTTP_MAX_BODY", "256KiB"),
            ("EPODE_SIDECAR_HTTP_CACHE_MODE", "private"),
            ("EPODE_SIDECAR_HTTP_EXCLUDE", "/internal/**, /a/*/b"),
        ]),
        &FlagValues::default(),
    )
    .unwrap();
    let h = c.http.expect("on");
    assert_eq!(h.max_body, 256 * 1024);
    assert_eq!(h.cache_mode, HttpCacheMode::Private);
    assert_eq!(h.exclude, ["/internal/**", "/a/*/b"]);
    assert_eq!(h.operations_prefix, "/_epode-sidecar");
    assert!(h.routes.is_empty());
    assert_eq!(h.upstream_share, 50);
    assert_eq!(
        h.upstream_connections(c.limits.upstream_max_connections),
        128
    );
    let UpstreamTransport::Http(t) = &c.upstream else {
        panic!("an HTTP upstream")
    };
    assert_eq!(t.url.path(), "/mcp", "a path given is kept");
}

#[test]
fn with_the_http_surface_a_bare_origin_upstream_has_its_mcp_endpoint_at_the_path() {
    let bare = |surface: &str| {
        let c = Config::from_layers(
            env(&[
                ("EPODE_SIDECAR_UPSTREAM", "http://127.0.0.1:8000"),
                ("EPODE_SIDECAR_PATH", "/rpc"),
                ("EPODE_SIDECAR_HTTP_SURFACE", surface),
                OFF,
            ]),
            &FlagValues::default(),
        )
        .unwrap();
        let UpstreamTransport::Http(t) = c.upstream else {
            panic!("an HTTP upstream")
        };
        t.url.to_string()
    };
    assert_eq!(bare("on"), "http://127.0.0.1:8000/rpc");
    assert_eq!(bare("off"), "http://127.0.0.1:8000/", "unchanged when off");
}

#[test]
fn http_surface_values_are_checked_and_named() {
    for (var, value) in [
        ("EPODE_SIDECAR_HTTP_SURFACE", "yes"),
        ("EPODE_SIDECAR_HTTP_MAX_BODY", "2GiB"),
        ("EPODE_SIDECAR_HTTP_MAX_BODY", "lots"),
        ("EPODE_SIDECAR_HTTP_CACHE_MODE", "shared"),
        ("EPODE_SIDECAR_HTTP_EXCLUDE", "/ok,nope"),
        ("EPODE_SIDECAR_OPERATIONS_PREFIX", "/ops/"),
        ("EPODE_SIDECAR_HTTP_ROUTES", "/users/{id},/orders/{id"),
        ("EPODE_SIDECAR_HTTP_UPSTREAM_SHARE", "100%"),
        ("EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS", "1"),
    ] {
        let err = Config::from_layers(
            env(&[UP, OFF, ("EPODE_SIDECAR_HTTP_SURFACE", "on"), (var, value)]),
            &FlagValues::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with(var), "{var}={value}: {err}");
        assert!(err.contains("expected"), "{err}");
    }
    let err = stdio_config(
        &[("EPODE_SIDECAR_HTTP_SURFACE", "on")],
        &["python3", "s.py"],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("EPODE_SIDECAR_HTTP_SURFACE"), "{err}");
    assert!(err.contains("stdio"), "{err}");
}

#[test]
fn auto_workers_are_one_per_core_for_http_and_one_for_a_stdio_child() {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let http = Config::from_layers(env(&[UP, OFF]), &FlagValues::default()).unwrap();
    assert_eq!(http.workers, cores);
    let stdio = stdio_config(&[OFF], &["python", "server.py"]).unwrap();
    assert_eq!(
        stdio.workers, 1,
        "one worker, on the loop of the child's pipe"
    );
    let set = stdio_config(
        &[OFF, ("EPODE_SIDECAR_WORKERS", "3")],
        &["python", "server.py"],
    )
    .unwrap();
    assert_eq!(set.workers, 3, "a number set is kept");
    let err = Config::from_layers(
        env(&[UP, OFF, ("EPODE_SIDECAR_WORKERS", "0")]),
        &FlagValues::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("EPODE_SIDECAR_WORKERS"), "{err}");
}

/// A value shaped like a product key is refused in every setting but the key's own, and no
/// error, nor `--check-config`, shows it; nor the configured key's own text, shaped or not.
#[test]
fn a_key_in_the_wrong_setting_is_refused_and_never_shown() {
    for (name, value) in [
        ("EPODE_API_URL", KEY.to_owned()),
        ("EPODE_SIDECAR_UPSTREAM", KEY.to_owned()),
        (
            "EPODE_SIDECAR_UPSTREAM",
            format!("http://127.0.0.1:1/{KEY}/mcp"),
        ),
        ("AGENT_FEEDBACK_MODE", KEY.to_owned()),
        ("EPODE_SIDECAR_LISTEN", KEY.to_owned()),
        ("EPODE_SIDECAR_LOG", KEY.to_owned()),
        // Settings that take any text: their value would be shown where a value is.
        ("EPODE_SIDECAR_SERVER_NAME", KEY.to_owned()),
        ("EPODE_SIDECAR_INCLUDE_TOOLS", format!("search,{KEY}")),
    ] {
        let err = Config::from_layers(
            env(&[UP, ("EPODE_API_KEY", KEY), (name, &value)]),
            &FlagValues::default(),
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with(name), "{name}: {err}");
        assert!(err.contains("EPODE_API_KEY only"), "{name}: {err}");
        assert!(!err.contains("conformance_secret"), "{name}: {err}");
    }
    // The configured key's text, malformed, is not key-shaped: still never shown elsewhere.
    let err = Config::from_layers(
        env(&[
            UP,
            ("EPODE_API_KEY", "hunter2hunter2"),
            ("EPODE_SIDECAR_LISTEN", "hunter2hunter2"),
        ]),
        &FlagValues::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("EPODE_SIDECAR_LISTEN"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
    // The description names the key's setting as declared.
    assert!(setting::KEY_SHAPED.contains(feedback::API_KEY.doc.env[0]));
}

/// A misspelt variable of any of the sidecar's prefixes is refused when it is a typo of a
/// setting and a warning otherwise, with the setting it likely meant.
#[test]
fn misspelt_variables_of_every_prefix_are_caught() {
    for (typo, meant) in [
        ("AGENT_FEEDBACK_ENABLD", "AGENT_FEEDBACK_ENABLED"),
        ("EPODE_API_KY", "EPODE_API_KEY"),
        (
            "EPODE_SIDECAR_MAX_BODY_BYTE",
            "EPODE_SIDECAR_MAX_BODY_BYTES",
        ),
    ] {
        let err = Config::from_layers(env(&[UP, OFF, (typo, "x")]), &FlagValues::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(&format!("did you mean `{meant}`")), "{err}");
    }
    for (far, meant) in [
        (
            "EPODE_SIDECAR_MAX_BODY",
            Some("EPODE_SIDECAR_MAX_BODY_BYTES"),
        ),
        ("EPODE_SIDECAR_LOG_LEVEL", Some("EPODE_SIDECAR_LOG")),
        ("AGENT_FEEDBACK_TOKEN", Some("AGENT_FEEDBACK_KEY")),
        ("AGENT_FEEDBACK_SOMETHING_ELSE", None),
        ("EPODE_API_SECRET_TOKEN", None),
    ] {
        let c = Config::from_layers(env(&[UP, OFF, (far, "x")]), &FlagValues::default()).unwrap();
        assert_eq!(c.warnings.len(), 1, "{far}: {:?}", c.warnings);
        assert!(c.warnings[0].contains(far), "{:?}", c.warnings);
        match meant {
            Some(m) => assert!(
                c.warnings[0].ends_with(&format!("did you mean `{m}`?")),
                "{:?}",
                c.warnings
            ),
            None => assert!(!c.warnings[0].contains("did you mean"), "{:?}", c.warnings),
        }
    }
    // Kubernetes service links of a Service named after a prefix are no one's mistake.
    for link in [
        "EPODE_API_SERVICE_HOST",
        "AGENT_FEEDBACK_PORT",
        "EPODE_SIDECAR_PORT_8080_TCP",
    ] {
        let c = Config::from_layers(env(&[UP, OFF, (link, "x")]), &FlagValues::default()).unwrap();
        assert!(c.warnings.is_empty(), "{link}: {:?}", c.warnings);
    }
    // Every variable the sidecar reads has one of the prefixes, so its typos are caught.
    for name in all().flat_map(|s| s.env.iter()).chain([&CONFIG_FILE_ENV]) {
        assert!(
            PREFIXES
                .iter()
                .chain(&STANDARD_PREFIXES)
                .any(|p| name.starts_with(p)),
            "{name} has none of the prefixes {PREFIXES:?}: add its prefix there"
        );
    }
}

/// A bounded setting's bounds are its check and its text: its lowest and highest values are
/// read (typed, through the whole configuration), one beyond either is refused, and no
/// setting states a bound in prose.
#[test]
fn bounds_are_checked_and_stated_from_one_place() {
    use setting::Accepts;
    // Every group read: the HTTP surface and the trial with an HTTP upstream, then a stdio one.
    let http = [
        ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
        ("EPODE_SIDECAR_DEV", "true"),
        ("EPODE_SIDECAR_AUTH", "jwt"),
        ("EPODE_SIDECAR_AUTH_ISSUER", "https://as.example.com"),
        ("EPODE_SIDECAR_AUTH_RESOURCE", "https://mcp.example.com/mcp"),
        ("EPODE_SIDECAR_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
    ];
    let stdio = [
        ("EPODE_SIDECAR_UPSTREAM_COMMAND", "server"),
        ("EPODE_SIDECAR_STDIO_CHILDREN", "per-client"),
    ];
    let read = |base: &[(&str, &str)], name: &str, value: &str| {
        let mut pairs = base.to_vec();
        pairs.push(OFF);
        pairs.push((name, value));
        Config::from_layers(env(&pairs), &FlagValues::default())
    };
    let accepted = |name: &str, value: &str| {
        let with_up: Vec<_> = [UP].into_iter().chain(http).collect();
        read(&with_up, name, value).is_ok() || read(&stdio, name, value).is_ok()
    };
    // Refused where it is read (a stdio setting is not read with an HTTP upstream).
    let refused = |name: &str, value: &str| {
        let with_up: Vec<_> = [UP].into_iter().chain(http).collect();
        let results = [read(&with_up, name, value), read(&stdio, name, value)];
        let named = |r: &Result<Config, ConfigErrors>| matches!(r, Err(e) if e.to_string().starts_with(name));
        results.iter().any(named) && results.iter().all(|r| r.is_ok() || named(r))
    };
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let mut checked = 0;
    for s in all() {
        let name = s.env[0];
        let (low, high, below, above) = match s.accepts {
            Accepts::Prose(text) => {
                let states_a_bound = ["from 0", "from 1", "at least", "up to"]
                    .iter()
                    .any(|b| text.contains(b));
                assert!(
                    !states_a_bound,
                    "{name}: a bound in prose ({text}); declare it with `bounded` and `Accepts`"
                );
                continue;
            }
            Accepts::Whole { min, max, .. } | Accepts::Size { min, max, .. } => (
                min.to_string(),
                max.to_string(),
                min.checked_sub(1).map(|n| n.to_string()),
                max.checked_add(1).map(|n| n.to_string()),
            ),
            Accepts::Duration { min, max, .. } => (
                ms(min),
                if max == Duration::MAX {
                    "1000000h".to_owned()
                } else {
                    ms(max)
                },
                (!min.is_zero()).then(|| ms(min - Duration::from_millis(1))),
                (max != Duration::MAX).then(|| ms(max + Duration::from_millis(1))),
            ),
        };
        assert!(
            accepted(name, &low),
            "{name}: its lowest value {low} is refused"
        );
        assert!(
            accepted(name, &high),
            "{name}: its highest value {high} is refused"
        );
        for beyond in [below, above].into_iter().flatten() {
            assert!(refused(name, &beyond), "{name}: {beyond} is accepted");
        }
        checked += 1;
    }
    assert!(checked > 30, "only {checked} bounded settings");
}

/// The error of a configuration of `UP`, the key and `pairs`, one line per mistake.
fn mistakes(pairs: &[(&str, &str)], flags: &FlagValues) -> Vec<String> {
    let mut all = vec![UP, ("EPODE_API_KEY", KEY)];
    all.extend_from_slice(pairs);
    match Config::from_layers(env(&all), flags) {
        Ok(_) => Vec::new(),
        Err(e) => e.to_string().lines().map(str::to_owned).collect(),
    }
}

#[test]
fn every_mistake_is_named_at_once_in_declaration_order() {
    // One in each of three groups and a misspelt variable, given in no particular order.
    let each = [
        ("EPODE_SIDECAR_MAX_BODY_BYTS", "10"),
        ("AGENT_FEEDBACK_MODE", "sometimes"),
        ("EPODE_SIDECAR_HEADER_TIMEOUT", "soon"),
        ("EPODE_SIDECAR_LISTEN", "nowhere"),
    ];
    let flags = FlagValues::default();
    let all = mistakes(&each, &flags);
    // Each alone reads as one line, exactly as the list shows it.
    let alone: Vec<String> = each
        .iter()
        .map(|pair| {
            let one = mistakes(&[*pair], &flags);
            assert_eq!(one.len(), 1, "{pair:?} alone: {one:?}");
            one[0].clone()
        })
        .collect();
    assert_eq!(all, [3, 2, 1, 0].map(|i| alone[i].clone()), "{all:#?}");
    assert!(
        all[0].starts_with("EPODE_SIDECAR_LISTEN (config key `listen`): `nowhere` is not valid")
    );
    assert!(all[1].starts_with("EPODE_SIDECAR_HEADER_TIMEOUT"));
    assert!(all[2].starts_with("AGENT_FEEDBACK_MODE"));
    assert!(
        all[3].contains("EPODE_SIDECAR_MAX_BODY_BYTS")
            && all[3].contains("did you mean `EPODE_SIDECAR_MAX_BODY_BYTES`?"),
        "{}",
        all[3]
    );
    // Two bad values in one group are both named.
    let two = mistakes(
        &[
            ("EPODE_SIDECAR_MAX_HEADERS", "many"),
            ("EPODE_SIDECAR_BODY_TIMEOUT", "soon"),
        ],
        &flags,
    );
    assert_eq!(two.len(), 2, "{two:?}");
}

#[test]
fn a_check_between_settings_runs_only_on_what_parsed() {
    let flags = FlagValues::default();
    // A bad `dev` decides neither the loopback check nor whether a key is needed.
    let dev_bad = Config::from_layers(env(&[UP, ("EPODE_SIDECAR_DEV", "maybe")]), &flags)
        .unwrap_err()
        .to_string();
    assert_eq!(dev_bad.lines().count(), 1, "{dev_bad}");
    assert!(dev_bad.starts_with("EPODE_SIDECAR_DEV"), "{dev_bad}");
    // Parsed, both checks of `--dev` run, and both refusals are named.
    let both = mistakes(
        &[
            ("EPODE_SIDECAR_DEV", "1"),
            ("EPODE_SIDECAR_LISTEN", "0.0.0.0:8080"),
        ],
        &flags,
    );
    assert_eq!(both.len(), 2, "{both:?}");
    assert!(both[0].starts_with("EPODE_SIDECAR_LISTEN") && both[0].contains("loopback"));
    assert!(both[1].starts_with("EPODE_API_KEY") && both[1].contains("--dev"));
    // A bad connection cap with the surface on is named once, not checked against 2 too.
    let cap = mistakes(
        &[
            ("AGENT_FEEDBACK_MODE", "off"),
            ("EPODE_SIDECAR_HTTP_SURFACE", "on"),
            ("EPODE_SIDECAR_UPSTREAM_MAX_CONNECTIONS", "0"),
        ],
        &flags,
    );
    assert_eq!(cap.len(), 1, "{cap:?}");
}

#[test]
fn the_file_and_the_environment_mistakes_are_listed_together() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "upstreem = \"x\"\nlisen = \"y\"\npath = \"/mcp\"\n").unwrap();
    let flags = FlagValues {
        config_file: Some(file),
        ..Default::default()
    };
    let all = mistakes(&[("EPODE_SIDECAR_MAX_BODY_BYTES", "lots")], &flags);
    assert_eq!(all.len(), 3, "{all:#?}");
    assert!(
        all[0].contains("`lisen` is not a setting; did you mean `listen`?"),
        "{}",
        all[0]
    );
    assert!(all[1].contains("`upstreem` is not a setting"), "{}", all[1]);
    assert!(
        all[2].starts_with("EPODE_SIDECAR_MAX_BODY_BYTES"),
        "{}",
        all[2]
    );
    // A file that is not TOML is its only mistake: the settings are not judged without it.
    std::fs::write(flags.config_file.as_ref().unwrap(), "not toml [").unwrap();
    let broken = mistakes(&[("EPODE_SIDECAR_MAX_BODY_BYTES", "lots")], &flags);
    assert_eq!(broken.len(), 1, "{broken:#?}");
    assert!(broken[0].starts_with("configuration file"), "{}", broken[0]);
}

#[test]
fn the_flags_are_the_declarations_that_say_so() {
    let declared: Vec<&str> = all().filter(|s| s.flag.is_some()).map(|s| s.key).collect();
    let mut listed: Vec<&str> = FLAGS.iter().map(|s| s.key).collect();
    listed.sort_by_key(|k| all().position(|s| s.key == *k));
    assert_eq!(declared, listed, "FLAGS lists every declared flag, once");
    for s in FLAGS {
        let flag = s.flag.as_ref().unwrap();
        assert_eq!(flag.long, s.key.replace('_', "-"), "{}", s.key);
        assert!(!flag.help.ends_with('.'), "{}: clap adds no period", s.key);
    }
}

#[test]
fn the_authorization_front_door_names_every_setting_it_lacks_and_keeps_its_secret() {
    let flags = FlagValues::default();
    let all = mistakes(&[("EPODE_SIDECAR_AUTH", "introspect")], &flags);
    for name in [
        "EPODE_SIDECAR_AUTH_ISSUER",
        "EPODE_SIDECAR_AUTH_RESOURCE",
        "EPODE_SIDECAR_AUTH_CLIENT_ID",
        "EPODE_SIDECAR_AUTH_CLIENT_SECRET",
    ] {
        assert!(
            all.iter()
                .any(|l| l.contains(name) && l.contains("required")),
            "{name}: {all:?}"
        );
    }
    // jwt needs no client credentials; a personal claim and a trailing slash are refused.
    let jwt = mistakes(
        &[
            ("EPODE_SIDECAR_AUTH", "jwt"),
            ("EPODE_SIDECAR_AUTH_ISSUER", "https://as.example.com"),
            (
                "EPODE_SIDECAR_AUTH_RESOURCE",
                "https://mcp.example.com/mcp/",
            ),
            ("EPODE_SIDECAR_AUTH_USER_CLAIM", "email"),
        ],
        &flags,
    );
    assert_eq!(jwt.len(), 2, "{jwt:?}");
    assert!(jwt[0].contains("EPODE_SIDECAR_AUTH_RESOURCE"), "{jwt:?}");
    assert!(jwt[1].contains("EPODE_SIDECAR_AUTH_USER_CLAIM"), "{jwt:?}");
    // Auth off (the default): nothing is needed, nothing changes.
    assert!(mistakes(&[], &flags).is_empty());
    // With its four settings, introspection reads.
    let secret = mistakes(
        &[
            ("EPODE_SIDECAR_AUTH", "introspect"),
            ("EPODE_SIDECAR_AUTH_ISSUER", "https://as.example.com"),
            ("EPODE_SIDECAR_AUTH_RESOURCE", "https://mcp.example.com/mcp"),
            ("EPODE_SIDECAR_AUTH_CLIENT_ID", "sidecar"),
            ("EPODE_SIDECAR_AUTH_CLIENT_SECRET", "s3cret-value"),
        ],
        &flags,
    );
    assert!(secret.is_empty(), "{secret:?}");
    // --check-config never shows the client secret.
    let mut all = vec![UP, ("EPODE_API_KEY", KEY)];
    all.extend_from_slice(&[
        ("EPODE_SIDECAR_AUTH", "introspect"),
        ("EPODE_SIDECAR_AUTH_ISSUER", "https://as.example.com"),
        ("EPODE_SIDECAR_AUTH_RESOURCE", "https://mcp.example.com/mcp"),
        ("EPODE_SIDECAR_AUTH_CLIENT_ID", "sidecar"),
        ("EPODE_SIDECAR_AUTH_CLIENT_SECRET", "s3cret-value"),
    ]);
    let shown = Config::from_layers(env(&all), &flags).unwrap().describe();
    assert!(!shown.contains("s3cret-value"), "{shown}");
    assert!(
        shown.contains("auth_client_secret = <set, redacted>"),
        "{shown}"
    );
}

/// OpenTelemetry: off without an endpoint or with `OTEL_SDK_DISABLED`; the standard variables
/// read and checked (a sampler the specification does not name is refused, not replaced); the
/// headers never shown.
#[test]
fn otel_settings_are_read_checked_and_the_headers_never_shown() {
    assert!(read(&[("OTEL_SERVICE_NAME", "x")]).unwrap().otel.is_none());
    let ep = ("EPODE_SIDECAR_OTLP_ENDPOINT", "http://collector:4318");
    assert!(read(&[ep, ("OTEL_SDK_DISABLED", "true")])
        .unwrap()
        .otel
        .is_none());
    let alias = read(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")]).unwrap();
    let o = alias.otel.unwrap();
    assert_eq!(o.endpoint.unwrap().as_str(), "http://collector:4318/");
    assert_eq!(o.traces_url.as_str(), "http://collector:4318/v1/traces");
    assert_eq!(
        o.metrics_url.unwrap().as_str(),
        "http://collector:4318/v1/metrics"
    );
    let c = read(&[
        ep,
        ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
        (
            "OTEL_RESOURCE_ATTRIBUTES",
            "deployment.environment=prod,team=a%2Cb",
        ),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=secret-4f1d"),
        ("EPODE_SIDECAR_OTLP_METRICS", "off"),
    ])
    .unwrap();
    let o = c.otel.as_ref().unwrap();
    assert_eq!(o.sampling, Sampling::ParentRatio(0.25));
    assert_eq!(
        o.resource,
        [
            ("deployment.environment".to_owned(), "prod".to_owned()),
            ("team".to_owned(), "a,b".to_owned())
        ]
    );
    assert_eq!(
        o.headers,
        [("api-key".to_owned(), "secret-4f1d".to_owned())]
    );
    assert_eq!(o.metrics_every, None);
    assert!(!c.describe().contains("secret-4f1d"), "{}", c.describe());
    for (name, bad) in [
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
        ("OTEL_RESOURCE_ATTRIBUTES", "novalue"),
        ("EPODE_SIDECAR_OTLP_ENDPOINT", "grpc://collector:4317"),
        (
            "EPODE_SIDECAR_OTLP_ENDPOINT",
            "http://user:secret-4f1d@collector:4318",
        ),
        ("OTEL_EXPORTER_OTLP_HEADERS", "api-key=secret-4f1d,broken"),
    ] {
        let mut pairs = vec![(name, bad)];
        if name != ep.0 {
            pairs.push(ep);
        }
        let err = read(&pairs).unwrap_err().to_string();
        assert!(err.contains(name), "{name}={bad}: {err}");
        assert!(!err.contains("secret-4f1d"), "{err}");
    }
}

/// The standard `OTEL_*` variables of the exporter are read (a timeout and an interval in
/// milliseconds as the specification writes them, a CA bundle) or refused at start (gzip, a
/// client certificate), never ignored.
#[test]
fn the_standard_otlp_variables_are_read_or_refused() {
    let ep = ("EPODE_SIDECAR_OTLP_ENDPOINT", "https://collector:4318");
    let c = read(&[
        ep,
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "15000"),
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
    ])
    .unwrap();
    let o = c.otel.as_ref().unwrap();
    assert_eq!(o.timeout, Duration::from_millis(2500));
    assert_eq!(o.metrics_every, Some(Duration::from_secs(15)));
    let dir = tempfile::tempdir().unwrap();
    let (good, empty) = (dir.path().join("ca.pem"), dir.path().join("empty.pem"));
    let cert = rcgen::generate_simple_self_signed(vec!["collector".into()]).unwrap();
    std::fs::write(&good, cert.cert.pem()).unwrap();
    std::fs::write(&empty, "no certificate here").unwrap();
    let c = read(&[
        ep,
        ("OTEL_EXPORTER_OTLP_CERTIFICATE", good.to_str().unwrap()),
    ])
    .unwrap();
    assert_eq!(c.otel.unwrap().ca_file.as_deref(), Some(good.as_path()));
    // (An error names the setting's first name, which says what it accepts.)
    for (name, bad, named) in [
        ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip", "uncompressed"),
        (
            "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION",
            "br",
            "OTEL_EXPORTER_OTLP_COMPRESSION",
        ),
        (
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
            "/etc/cert.pem",
            "mutual TLS",
        ),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            empty.to_str().unwrap(),
            "no PEM certificate",
        ),
        (
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
            "/nonexistent/ca.pem",
            "no readable file",
        ),
        (
            "OTEL_EXPORTER_OTLP_TIMEOUT",
            "10",
            "EPODE_SIDECAR_OTLP_TIMEOUT",
        ),
        (
            "OTEL_METRIC_EXPORT_INTERVAL",
            "soon",
            "EPODE_SIDECAR_OTLP_METRICS_INTERVAL",
        ),
    ] {
        let err = read(&[ep, (name, bad)]).unwrap_err().to_string();
        assert!(err.contains(named), "{name}={bad}: {err}");
    }
}

/// `EPODE_SIDECAR_OTLP_METRICS`: all (the default, and what on and true mean), conventions (the
/// MCP histograms only), off; anything else refused, naming what it accepts.
#[test]
fn otlp_metrics_says_which_metrics_go() {
    let ep = ("EPODE_SIDECAR_OTLP_ENDPOINT", "http://collector:4318");
    for (value, families) in [
        (None, true),
        (Some("on"), true),
        (Some("all"), true),
        (Some("conventions"), false),
    ] {
        let mut extra = vec![ep];
        extra.extend(value.map(|v| ("EPODE_SIDECAR_OTLP_METRICS", v)));
        let c = read(&extra).unwrap();
        let o = c.otel.as_ref().unwrap();
        assert_eq!(o.metrics_every, Some(Duration::from_secs(60)), "{value:?}");
        assert_eq!(o.metrics_families, families, "{value:?}");
    }
    let bad = read(&[ep, ("EPODE_SIDECAR_OTLP_METRICS", "some")])
        .unwrap_err()
        .to_string();
    assert!(
        bad.contains("EPODE_SIDECAR_OTLP_METRICS") && bad.contains("all, conventions or off"),
        "{bad}"
    );
    let off = read(&[ep, ("EPODE_SIDECAR_OTLP_METRICS", "false")]).unwrap();
    assert_eq!(off.otel.unwrap().metrics_every, None);
}

/// The specification's per-signal endpoints, used as they are; the traces one alone turns
/// tracing on (with no metrics unless their own is set), the metrics one alone is refused;
/// `OTEL_EXPORTER_OTLP_PROTOCOL` other than `http/protobuf` is refused, naming what is spoken.
#[test]
fn otlp_per_signal_endpoints_and_the_protocol() {
    let base = ("EPODE_SIDECAR_OTLP_ENDPOINT", "http://collector:4318/otlp/");
    let o = read(&[base]).unwrap().otel.unwrap();
    assert_eq!(
        o.traces_url.as_str(),
        "http://collector:4318/otlp/v1/traces"
    );
    let traces = (
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "http://tempo:4318/v1/traces",
    );
    let metrics = (
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        "http://mimir:4318/otlp/v1/metrics",
    );
    let o = read(&[base, traces, metrics]).unwrap().otel.unwrap();
    assert_eq!(o.traces_url.as_str(), "http://tempo:4318/v1/traces");
    assert_eq!(
        o.metrics_url.unwrap().as_str(),
        "http://mimir:4318/otlp/v1/metrics"
    );
    let o = read(&[traces]).unwrap().otel.unwrap();
    assert_eq!(o.traces_url.as_str(), "http://tempo:4318/v1/traces");
    assert_eq!((o.metrics_url, o.metrics_every), (None, None));
    let o = read(&[traces, metrics]).unwrap().otel.unwrap();
    assert!(o.metrics_every.is_some());
    let alone = read(&[metrics]).unwrap_err().to_string();
    assert!(
        alone.contains("EPODE_SIDECAR_OTLP_ENDPOINT")
            && alone.contains("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"),
        "{alone}"
    );
    assert!(read(&[metrics, ("OTEL_SDK_DISABLED", "true")])
        .unwrap()
        .otel
        .is_none());
    let grpc = read(&[base, ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])
        .unwrap_err()
        .to_string();
    assert!(
        grpc.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && grpc.contains("4318"),
        "{grpc}"
    );
    assert!(read(&[base, ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")]).is_ok());
    // Off, a protocol meant for other components is not the sidecar's business.
    assert!(read(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")])
        .unwrap()
        .otel
        .is_none());
}
