//! The Helm chart kept in step with the settings: every declared setting is mapped by the
//! chart (a row of `epode-sidecar.settings` in the helper template, its value in
//! `values.yaml` and `values.schema.json`, its name in the chart's README), or is in
//! [`LEFT_OUT`] with the reason; an integer value's schema bounds are the setting's own.
//! Each problem is one line naming the setting and the file to edit.

use std::collections::{BTreeMap, BTreeSet};

use super::setting::Accepts;
use super::*;

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/helm/epode-sidecar");
const HELPERS: &str = "helm/epode-sidecar/templates/_helpers.tpl";
const VALUES: &str = "helm/epode-sidecar/values.yaml";
const SCHEMA: &str = "helm/epode-sidecar/values.schema.json";
const README: &str = "helm/epode-sidecar/README.md";

/// Settings the chart deliberately does not map (they can still be set through
/// `sidecar.env`), each with its reason. A new setting is either mapped or listed here.
const LEFT_OUT: &[&str] = &[
    // A stdio upstream: in a pod the MCP server is its own container, reached over HTTP.
    "EPODE_SIDECAR_UPSTREAM_COMMAND",
    "EPODE_SIDECAR_UPSTREAM_CWD",
    "EPODE_SIDECAR_UPSTREAM_ENV",
    "EPODE_SIDECAR_UPSTREAM_STOP_GRACE",
    "EPODE_SIDECAR_UPSTREAM_RESTART_MAX_DELAY",
    "EPODE_SIDECAR_UPSTREAM_STDIN_QUEUE",
    "EPODE_SIDECAR_UPSTREAM_STDERR_RATE",
    "EPODE_SIDECAR_UPSTREAM_USER",
    "EPODE_SIDECAR_STDIO_CHILDREN",
    "EPODE_SIDECAR_STDIO_MAX_CHILDREN",
    "EPODE_SIDECAR_STDIO_CHILD_IDLE",
    // OpenTelemetry is off in the chart while observability.otlp.endpoint is empty.
    "OTEL_SDK_DISABLED",
    // The chart sends both signals to observability.otlp.endpoint (a collector Service); an
    // endpoint per signal goes in sidecar.env.
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    // The one protocol spoken (http/protobuf); read only to refuse another.
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    // Likewise: read only to refuse gzip, and a client certificate for the collector.
    "OTEL_EXPORTER_OTLP_COMPRESSION",
    "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    // The local trial: it refuses a non-loopback listener, which a pod's sidecar is not.
    "EPODE_SIDECAR_DEV",
    "EPODE_SIDECAR_DEV_LOG",
    "EPODE_SIDECAR_DEV_LOG_MAX_BYTES",
];

fn read(path: &str) -> String {
    let full = format!("{CHART}/{}", path.trim_start_matches("helm/epode-sidecar/"));
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{full}: {e}"))
}

/// The helper template's rows `(list "NAME" "value path text" value)`: name to path text.
fn rows(helpers: &str) -> BTreeMap<String, String> {
    helpers
        .lines()
        .filter_map(|l| l.trim().strip_prefix("(list \""))
        .filter_map(|rest| {
            let (name, rest) = rest.split_once('"')?;
            let path = rest.trim_start().strip_prefix('"')?.split_once('"')?.0;
            name.bytes()
                .all(|b| b.is_ascii_uppercase() || b == b'_')
                .then(|| (name.to_owned(), path.to_owned()))
        })
        .collect()
}

/// The dotted value paths a row's text names (`sidecar.listenAddress and sidecar.port`).
fn value_paths(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.'))
        .filter(|w| w.contains('.') && w.starts_with(|c: char| c.is_ascii_lowercase()))
        .map(|w| w.trim_end_matches('.').to_owned())
        .collect()
}

/// Every key path of `values.yaml` (`sidecar.limits.maxBodyBytes`), read by indentation:
/// the file is block YAML whose keys are plain words.
fn yaml_paths(yaml: &str) -> BTreeSet<String> {
    let mut stack: Vec<(usize, String)> = Vec::new();
    let mut paths = BTreeSet::new();
    for line in yaml.lines() {
        let indent = line.len() - line.trim_start().len();
        let Some((key, _)) = line.trim_start().split_once(':') else {
            continue;
        };
        if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric()) {
            continue;
        }
        stack.retain(|(i, _)| *i < indent);
        let mut path: Vec<&str> = stack.iter().map(|(_, k)| k.as_str()).collect();
        path.push(key);
        paths.insert(path.join("."));
        stack.push((indent, key.to_owned()));
    }
    paths
}

/// The schema of a value path, through `properties`.
fn schema_of<'a>(schema: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.')
        .try_fold(schema, |node, key| node.get("properties")?.get(key))
}

/// What is out of step, one line per problem, naming the setting and the file to edit.
fn problems(helpers: &str, values: &str, schema: &serde_json::Value, readme: &str) -> Vec<String> {
    let rows = rows(helpers);
    let values = yaml_paths(values);
    let declared: BTreeSet<&str> = all().flat_map(|s| s.env.iter().copied()).collect();
    let mut out = Vec::new();
    for s in all() {
        let name = s.env[0];
        if LEFT_OUT.contains(&name) {
            if rows.contains_key(name) {
                out.push(format!("{name}: mapped in {HELPERS} and listed in LEFT_OUT in src/config/chart_tests.rs; drop one"));
            }
            continue;
        }
        let Some(text) = rows.get(name) else {
            out.push(format!(
                "{name}: the chart does not map it: add a row (list \"{name}\" \"<value path>\" <value>) to `epode-sidecar.settings` in {HELPERS}, the value to {VALUES} and {SCHEMA}, and `{name}` to {README}; or list it in LEFT_OUT in src/config/chart_tests.rs, saying why"
            ));
            continue;
        };
        // An alias the chart does not know could be set in `sidecar.env` behind the value.
        for alias in &s.env[1..] {
            if !rows.contains_key(*alias) {
                out.push(format!("{alias} (an alias of {name}): no row in {HELPERS}, so `sidecar.env.{alias}` is not refused: add (list \"{alias}\" \"{text}\" \"\")"));
            }
        }
        if !readme.contains(&format!("`{name}`")) {
            out.push(format!(
                "{name}: {README} does not name it: write `{name}` in full beside its value"
            ));
        }
        let paths = value_paths(text);
        if paths.is_empty() {
            out.push(format!(
                "{name}: its row in {HELPERS} names no value path (\"{text}\")"
            ));
        }
        for path in &paths {
            if !values.contains(path) {
                out.push(format!(
                    "{name}: {path} (its row in {HELPERS}) is not in {VALUES}"
                ));
            }
            match schema_of(schema, path) {
                None => out.push(format!(
                    "{name}: {path} (its row in {HELPERS}) is not in {SCHEMA}"
                )),
                Some(entry) => out.extend(schema_bounds(name, path, s, entry)),
            }
        }
    }
    for name in rows.keys() {
        if !declared.contains(name.as_str()) {
            out.push(format!("{name}: a row in {HELPERS} for no declared setting: remove it, or declare the setting in src/config/"));
        }
    }
    for name in LEFT_OUT {
        if !declared.contains(name) {
            out.push(format!("{name}: in LEFT_OUT in src/config/chart_tests.rs but no declared setting: remove it"));
        }
    }
    out
}

/// An integer value's schema bounds against the setting's own (the first path of its row).
fn schema_bounds(name: &str, path: &str, s: &Doc, entry: &serde_json::Value) -> Option<String> {
    let Accepts::Whole { min, max, .. } = s.accepts else {
        return None;
    };
    let integer = match &entry["type"] {
        serde_json::Value::String(t) => t == "integer",
        serde_json::Value::Array(ts) => ts.iter().any(|t| t == "integer"),
        _ => false,
    };
    if !integer {
        return None;
    }
    let want_max = (max != u64::MAX).then_some(max);
    let (got_min, got_max) = (entry["minimum"].as_u64(), entry["maximum"].as_u64());
    (got_min != Some(min) || got_max != want_max).then(|| {
        format!("{name}: {path} in {SCHEMA} has minimum {got_min:?} and maximum {got_max:?}; the setting accepts {min} to {want_max:?} (None: no maximum)")
    })
}

#[test]
fn every_setting_is_mapped_by_the_chart_or_left_out_on_purpose() {
    let schema: serde_json::Value = serde_json::from_str(&read(SCHEMA)).unwrap();
    let found = problems(&read(HELPERS), &read(VALUES), &schema, &read(README));
    assert!(
        found.is_empty(),
        "the chart is out of step with the settings:\n{}",
        found.join("\n")
    );
}

/// The check finds what it is for: a row removed, a value missing, a bound changed.
#[test]
fn a_missing_mapping_is_found_and_named() {
    let helpers = read(HELPERS);
    let values = read(VALUES);
    let schema: serde_json::Value = serde_json::from_str(&read(SCHEMA)).unwrap();
    let readme = read(README);
    let row = helpers
        .lines()
        .find(|l| l.contains("(list \"EPODE_SIDECAR_MAX_HEADERS\""))
        .unwrap();
    let without_row = helpers.replace(row, "");
    let found = problems(&without_row, &values, &schema, &readme);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("EPODE_SIDECAR_MAX_HEADERS: the chart does not map it")
            && found[0].contains(HELPERS)
            && found[0].contains("LEFT_OUT"),
        "{found:?}"
    );
    let mut narrower = schema.clone();
    narrower["properties"]["sidecar"]["properties"]["limits"]["properties"]["maxHeaders"]
        ["maximum"] = 999.into();
    let found = problems(&helpers, &values, &narrower, &readme);
    assert!(
        found.len() == 1 && found[0].contains("maxHeaders") && found[0].contains("1000"),
        "{found:?}"
    );
    let found = problems(
        &helpers,
        &values,
        &schema,
        &readme.replace("`EPODE_SIDECAR_MAX_HEADERS`", "`_MAX_HEADERS`"),
    );
    assert!(found.len() == 1 && found[0].contains(README), "{found:?}");
    let found = problems(
        &helpers,
        &values.replace("maxHeaders:", "maxHeaderz:"),
        &schema,
        &readme,
    );
    assert!(found.len() == 1 && found[0].contains(VALUES), "{found:?}");
}
