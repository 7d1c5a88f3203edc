//! The operations kit (docs/operations.md, "Dashboard and alerts"): the alerting rules
//! (`deploy/prometheus/epode-sidecar-rules.yaml`) and the Grafana dashboard
//! (`deploy/grafana/epode-sidecar-dashboard.json`) name only metrics the sidecar exports, read
//! from a running sidecar's `/metrics`, and the Helm chart carries them unchanged. (What the
//! rules do is tested by promtool: `deploy/prometheus/epode-sidecar-rules.test.yaml`.)

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::auth::{AuthOptions, AuthServer};
use crate::support::*;

const RULES: &str = "deploy/prometheus/epode-sidecar-rules.yaml";
const DASHBOARD: &str = "deploy/grafana/epode-sidecar-dashboard.json";
/// Where the chart keeps its copies (Helm reads no file outside the chart).
const CHART_FILES: &str = "helm/epode-sidecar/files";

/// PromQL's words that are not metric names: aggregations, keywords, the set operators (a
/// function is known by the `(` after it).
const NOT_METRICS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
    "le",
];

/// The words followed by a list of label names, `by (method, le)`.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

fn read(path: &str) -> String {
    let full = repo_root().join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// `expr` with its strings, label matchers (`{…}`) and ranges (`[…]`) made blanks.
fn without_literals(expr: &str) -> String {
    let mut out = String::with_capacity(expr.len());
    let (mut quote, mut escaped, mut depth) = (None, false, 0usize);
    for c in expr.chars() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' | '`' => quote = Some(c),
            '{' | '[' => depth += 1,
            '}' | ']' => depth = depth.saturating_sub(1),
            _ if depth == 0 => {
                out.push(c);
                continue;
            }
            _ => continue,
        }
        out.push(' ');
    }
    out
}

fn word_start(c: u8) -> bool {
    c.is_ascii_alphabetic() || c == b'_' || c == b':'
}

fn word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
}

/// The metric names a PromQL expression reads (Grafana's `$variables` and its
/// `label_values(<selector>, <label>)` allowed).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let expr = match expr.trim().strip_prefix("label_values(") {
        Some(rest) => rest.rsplit_once(',').map_or(rest, |(selector, _)| selector),
        None => expr,
    };
    let text = without_literals(expr);
    let b = text.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_digit() || b[i] == b'$' {
            // A number or a duration (0.99, 1e3, 5m), or a variable.
            i += 1;
            while i < b.len() && word_byte(b[i]) {
                i += 1;
            }
            continue;
        }
        if !word_start(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && word_byte(b[i]) {
            i += 1;
        }
        let word = &text[start..i];
        let rest = text[i..].trim_start();
        if LABEL_LISTS.contains(&word) && rest.starts_with('(') {
            let list = rest.find(')').map_or(rest.len(), |p| p + 1);
            i = text.len() - rest.len() + list;
        } else if !rest.starts_with('(') && !NOT_METRICS.contains(&word) {
            names.insert(word.to_owned());
        }
    }
    names
}

/// Every `expr` of a rules file: `expr: <one line>`, or `expr: |` (or `>`) and the lines
/// indented under it.
fn rule_exprs(yaml: &str) -> Vec<String> {
    let lines: Vec<&str> = yaml.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(value) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let value = value.trim();
        if value.starts_with('|') || value.starts_with('>') {
            let body: Vec<&str> = lines[n + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || indent(l) > indent(line))
                .map(|l| l.trim())
                .collect();
            out.push(body.join(" "));
        } else {
            out.push(value.to_owned());
        }
    }
    out
}

/// Every query of a dashboard: its panels' `expr`s and its variables' `definition`s.
fn dashboard_exprs(node: &Value, out: &mut Vec<String>) {
    match node {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => dashboard_exprs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| dashboard_exprs(v, out)),
        _ => {}
    }
}

/// Every metric name the kit's two files name, with the files that name it.
fn kit_metric_names() -> BTreeMap<String, BTreeSet<&'static str>> {
    let rules = read(RULES);
    let rule_exprs = rule_exprs(&rules);
    let alerts = rules
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    assert!(
        alerts > 0 && rule_exprs.len() == alerts,
        "{RULES}: {} exprs read for {alerts} alerts",
        rule_exprs.len()
    );
    let dashboard: Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut panel_exprs = Vec::new();
    dashboard_exprs(&dashboard, &mut panel_exprs);
    assert!(panel_exprs.len() >= 10, "{DASHBOARD}: {panel_exprs:?}");
    let mut named: BTreeMap<String, BTreeSet<&'static str>> = BTreeMap::new();
    for (file, exprs) in [(RULES, rule_exprs), (DASHBOARD, panel_exprs)] {
        for name in exprs.iter().flat_map(|e| metric_names(e)) {
            named.entry(name).or_default().insert(file);
        }
    }
    named
}

/// The families of a Prometheus text exposition (its `# TYPE` lines), with their types.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_owned(), kind.trim().to_owned()))
        .collect()
}

/// Whether `name` is one of `families`, or a series of one of its histograms.
fn exported(name: &str, families: &BTreeMap<String, String>) -> bool {
    families.contains_key(name)
        || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
            name.strip_suffix(suffix)
                .and_then(|family| families.get(family))
                .is_some_and(|kind| kind == "histogram")
        })
}

async fn admin_metrics(sc: &Sidecar) -> String {
    let admin = sc.admin.expect("the admin listener");
    let resp = http()
        .get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

/// The families two sidecars export: one that answered a `tools/call` (the request and
/// upstream histograms appear with their first request), and one with the authorization front
/// door on (`jwt`, against a real authorization server) once it has fetched the issuer's keys.
async fn exported_families() -> BTreeMap<String, String> {
    let admin = ("EPODE_SIDECAR_ADMIN_LISTEN", "127.0.0.1:0");
    let up = crate::auth::scripted();
    let plain = Sidecar::start(
        &up.url(),
        &[("EPODE_SIDECAR_UPSTREAM_PROTOCOL", "2026-07-28"), admin],
    );
    let body = modern_body(
        json!(1),
        "tools/call",
        json!({"name": "echo", "arguments": {}}),
    );
    let resp = post_modern(&plain.url(), "tools/call", Some("echo"), &body).await;
    assert_eq!(resp.status(), 200);
    let mut all = families(&admin_metrics(&plain).await);
    let (port, resource) = crate::auth::resource();
    let server = AuthServer::start(AuthOptions::for_resource(&resource));
    let authed = crate::auth::sidecar_for(&up.url(), &server, port, &[admin]);
    let fetched = eventually_async(Duration::from_secs(20), || async {
        admin_metrics(&authed)
            .await
            .contains("# TYPE epode_sidecar_auth_key_fetches_total ")
    })
    .await;
    assert!(fetched, "the sidecar with auth on never fetched the keys");
    all.extend(families(&admin_metrics(&authed).await));
    all
}

/// Every metric the rules' and the dashboard's queries name is exported.
#[tokio::test]
async fn operations_kit_names_only_exported_metrics() {
    let named = kit_metric_names();
    for family in [
        "epode_sidecar_telemetry_dropped_total",
        "epode_sidecar_requests_total",
        "epode_sidecar_request_duration_seconds_bucket",
        "epode_sidecar_pool_in_use",
        "epode_sidecar_auth_key_fetches_total",
    ] {
        assert!(named.contains_key(family), "{family} not read: {named:?}");
    }
    let families = exported_families().await;
    let missing: Vec<String> = named
        .iter()
        .filter(|(name, _)| !exported(name, &families))
        .map(|(name, files)| format!("{name} (in {files:?})"))
        .collect();
    assert!(
        missing.is_empty(),
        "the operations kit names metrics /metrics does not export:\n{}\nthe families exported: {:?}",
        missing.join("\n"),
        families.keys().collect::<Vec<_>>()
    );
}

/// The chart's copies are the files themselves, byte for byte.
#[test]
fn the_chart_carries_the_operations_kit_unchanged() {
    for path in [RULES, DASHBOARD] {
        let name = path.rsplit('/').next().unwrap();
        let copy = format!("{CHART_FILES}/{name}");
        assert!(
            read(path) == read(&copy),
            "{copy} differs from {path}: cp {path} {CHART_FILES}/"
        );
    }
}

/// The names are read from PromQL as the two files write it, and nothing else is: functions,
/// aggregations, label names, strings, ranges, numbers and Grafana's variables are not names.
#[test]
fn metric_names_are_read_from_promql() {
    let names = |e: &str| metric_names(e).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(
            r#"histogram_quantile(0.99, sum by (method, le) (rate(a_seconds_bucket{job=~"$job", x="b{c}"}[$__rate_interval]))) - b_total offset 5m"#
        ),
        ["a_seconds_bucket", "b_total"]
    );
    assert_eq!(
        names(
            "sum without (outcome) (increase(c_total{outcome=\"failed\"}[15m])) > 0\n  unless on (pod) group_left d > 1e3"
        ),
        ["c_total", "d"]
    );
    assert_eq!(
        names(r#"label_values(e_gauge{job=~"$job", namespace=~"$namespace"}, pod)"#),
        ["e_gauge"]
    );
    assert_eq!(
        names("(f >= g) and g > 0 or time() - max(h > 0)"),
        ["f", "g", "h"]
    );
}
