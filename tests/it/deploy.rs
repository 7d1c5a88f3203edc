//! The Helm chart (helm/epode-sidecar) with the real Helm (v4.1.4, installed with kubectl by
//! `scripts/install-deploy-tools.sh` into the peers folder): the product key must never be
//! rendered, whichever way a user gives it as a value (only a Secret reference may carry it),
//! and the default render must have the native sidecar and the restrictive security context.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use crate::support::repo_root;
use serde_json::Value;

struct Tools {
    helm: PathBuf,
    kubectl: PathBuf,
}

/// Installs helm and kubectl once (idempotent: well under a second when already there).
fn tools() -> &'static Tools {
    static TOOLS: OnceLock<Tools> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let out = Command::new("bash")
            .arg(repo_root().join("scripts/install-deploy-tools.sh"))
            .env("EPODE_DEPLOY_TOOLS_ONLY", "k8s")
            .output()
            .expect("run scripts/install-deploy-tools.sh");
        assert!(
            out.status.success(),
            "scripts/install-deploy-tools.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        let path = |key: &str| -> PathBuf {
            let line = stdout
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("no {key}= line from install-deploy-tools.sh"));
            PathBuf::from(line)
        };
        Tools {
            helm: path("HELM"),
            kubectl: path("KUBECTL"),
        }
    })
}

fn chart() -> PathBuf {
    repo_root().join("helm/epode-sidecar")
}

/// A key of the real format (af_live_<32 hex>_<secret>), made here so that no file holds one.
fn fake_key() -> (String, &'static str) {
    let tail = "TestOnlyNotARealSecret4242";
    (
        format!("af_live_{}_{tail}", "0123456789abcdef".repeat(2)),
        tail,
    )
}

fn helm_template(chart: &Path, args: &[String]) -> Output {
    Command::new(&tools().helm)
        .arg("template")
        .arg("t")
        .arg(chart)
        .args(args)
        .output()
        .expect("run helm template")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// YAML to JSON without a cluster: `kubectl patch --local` with an empty merge patch.
fn to_json(yaml: &[u8]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("object.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new(&tools().kubectl)
        .args([
            "patch", "--local", "--type", "merge", "-p", "{}", "-o", "json", "-f",
        ])
        .arg(&file)
        .env("KUBECONFIG", "/dev/null")
        .output()
        .expect("run kubectl patch --local");
    assert!(out.status.success(), "kubectl: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The sidecar container's plain `env` values in a rendered Deployment.
/// The sidecar container's env as the kubelet gives it: `fieldRef: status.podIP` as a pod's
/// address, and `$(NAME)` in a value expanded from the entries before it.
fn sidecar_env(deployment: &Value) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    let entries = deployment["spec"]["template"]["spec"]["initContainers"][0]["env"]
        .as_array()
        .unwrap();
    for e in entries {
        let Some(name) = e["name"].as_str() else {
            continue;
        };
        let value = match (
            e["value"].as_str(),
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Some(v), _) => env
                .iter()
                .fold(v.to_owned(), |v, (k, x)| v.replace(&format!("$({k})"), x)),
            (None, Some("status.podIP")) => "10.1.2.3".to_owned(),
            (None, Some("metadata.name")) => "demo-7c9f-abcde".to_owned(),
            (None, Some("metadata.uid")) => "0b9c1f7e-1111-2222-3333-444455556666".to_owned(),
            (None, Some("metadata.namespace")) => "shop".to_owned(),
            (None, Some("spec.nodeName")) => "node-a".to_owned(),
            _ => continue,
        };
        env.push((name.to_owned(), value));
    }
    env
}

/// `epode-sidecar --check-config` with `env` alone (and a key of the real format).
fn check_config(env: &[(String, String)]) -> Output {
    let (key, _) = fake_key();
    Command::new(env!("CARGO_BIN_EXE_epode-sidecar"))
        .arg("--check-config")
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .env("EPODE_API_KEY", &key)
        .output()
        .unwrap()
}

fn render_one(template: &str, args: &[&str]) -> Value {
    let mut all: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    all.extend(["--show-only".to_string(), format!("templates/{template}")]);
    let out = helm_template(&chart(), &all);
    assert!(out.status.success(), "helm template: {}", text(&out));
    to_json(&out.stdout)
}

#[test]
fn a_product_key_given_as_a_value_is_refused_and_never_rendered() {
    let (key, tail) = fake_key();
    let dir = tempfile::tempdir().unwrap();
    let values_file = |name: &str, body: String| -> String {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p.to_string_lossy().into_owned()
    };
    let key_file = values_file("key.txt", key.clone());
    let set = |s: &str| vec!["--set".to_string(), s.replace("%KEY%", &key)];
    let set_string = |s: &str| vec!["--set-string".to_string(), s.replace("%KEY%", &key)];
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("--set sidecar.env.EPODE_API_KEY", set("sidecar.env.EPODE_API_KEY=%KEY%")),
        ("--set-string sidecar.env.AGENT_FEEDBACK_KEY", set_string("sidecar.env.AGENT_FEEDBACK_KEY=%KEY%")),
        ("--set sidecar.env under another name", set("sidecar.env.PRODUCT_KEY=%KEY%")),
        (
            "--set-string sidecar.extraEnv[0]",
            set_string("sidecar.extraEnv[0].name=EPODE_API_KEY,sidecar.extraEnv[0].value=%KEY%"),
        ),
        (
            "--set-string extraEnv[0] (top level)",
            set_string("extraEnv[0].name=EPODE_API_KEY,extraEnv[0].value=%KEY%"),
        ),
        (
            "--set upstream.env[0]",
            set("upstream.env[0].name=EPODE_API_KEY,upstream.env[0].value=%KEY%"),
        ),
        (
            "--set upstream.env[0] under another name",
            set("upstream.env[0].name=ORDERS_TOKEN,upstream.env[0].value=%KEY%"),
        ),
        ("--set epode.apiKey", set("epode.apiKey=%KEY%")),
        ("--set epode.existingSecret (the key as the Secret's name)", set("epode.existingSecret=%KEY%")),
        ("--set podAnnotations", set("podAnnotations.epode-key=%KEY%")),
        ("--set sidecar.env with mode off", {
            let mut a = set("epode.mode=off");
            a.extend(set("sidecar.env.EPODE_API_KEY=%KEY%"));
            a
        }),
        (
            "--set-json sidecar.extraEnv",
            vec![
                "--set-json".to_string(),
                format!(r#"sidecar.extraEnv=[{{"name":"EPODE_API_KEY","value":"{key}"}}]"#),
            ],
        ),
        (
            "--set-file sidecar.env.EPODE_API_KEY",
            vec!["--set-file".to_string(), format!("sidecar.env.EPODE_API_KEY={key_file}")],
        ),
        (
            "-f values file: sidecar.env",
            vec![
                "-f".to_string(),
                values_file("v1.yaml", format!("sidecar:\n  env:\n    EPODE_API_KEY: \"{key}\"\n")),
            ],
        ),
        (
            "-f values file: epode.apiKey",
            vec!["-f".to_string(), values_file("v2.yaml", format!("epode:\n  apiKey: {key}\n"))],
        ),
        (
            "-f values file: sidecar.extraEnv with a valueFrom-less entry",
            vec![
                "-f".to_string(),
                values_file(
                    "v3.yaml",
                    format!("sidecar:\n  extraEnv:\n    - name: AGENT_FEEDBACK_KEY\n      value: {key}\n"),
                ),
            ],
        ),
    ];
    // A value of another shape (a mistyped key) is still refused by the variable's name.
    let odd = "af_live_mistyped_TestOnlyNotARealSecret4242";
    let mut cases = cases;
    for (what, arg) in [
        (
            "sidecar.env.EPODE_API_KEY (mistyped key)",
            "sidecar.env.EPODE_API_KEY=%ODD%",
        ),
        (
            "sidecar.env.AGENT_FEEDBACK_KEY (mistyped key)",
            "sidecar.env.AGENT_FEEDBACK_KEY=%ODD%",
        ),
        (
            "sidecar.extraEnv (mistyped key)",
            "sidecar.extraEnv[0].name=EPODE_API_KEY,sidecar.extraEnv[0].value=%ODD%",
        ),
        (
            "upstream.env (mistyped key)",
            "upstream.env[0].name=AGENT_FEEDBACK_KEY,upstream.env[0].value=%ODD%",
        ),
    ] {
        cases.push((
            what,
            vec!["--set-string".to_string(), arg.replace("%ODD%", odd)],
        ));
    }
    let mut problems = Vec::new();
    for (what, args) in &cases {
        let out = helm_template(&chart(), args);
        let all = text(&out);
        if all.contains(tail) {
            problems.push(format!("{what}: the key appears in Helm's output"));
        }
        if out.status.success() {
            problems.push(format!("{what}: rendered (exit 0) instead of refused"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // The refusal says what to do.
    let out = helm_template(&chart(), &set("sidecar.env.EPODE_API_KEY=%KEY%"));
    assert!(
        text(&out).contains("epode.existingSecret"),
        "the refusal should name epode.existingSecret: {}",
        text(&out)
    );
}

#[test]
fn a_parent_chart_using_the_named_templates_refuses_a_key_too() {
    let (key, tail) = fake_key();
    let dir = tempfile::tempdir().unwrap();
    // helm dependency build writes into the chart: work on a copy.
    let copy = dir.path().join("helm");
    let status = Command::new("cp")
        .arg("-r")
        .arg(repo_root().join("helm"))
        .arg(&copy)
        .status()
        .unwrap();
    assert!(status.success());
    let parent = copy.join("examples/existing-app");
    let out = Command::new(&tools().helm)
        .args(["dependency", "build"])
        .arg(&parent)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm dependency build: {}",
        text(&out)
    );

    let ok = helm_template(&parent, &[]);
    assert!(ok.status.success(), "{}", text(&ok));
    let rendered = String::from_utf8_lossy(&ok.stdout);
    assert!(rendered.contains("restartPolicy: Always") && rendered.contains("secretKeyRef"));

    for args in [
        vec![
            "--set".to_string(),
            format!("epode-sidecar.sidecar.env.EPODE_API_KEY={key}"),
        ],
        vec![
            "--set-string".to_string(),
            format!("epode-sidecar.podAnnotations.k={key}"),
        ],
    ] {
        let out = helm_template(&parent, &args);
        assert!(!out.status.success(), "rendered: {args:?}");
        assert!(
            !text(&out).contains(tail),
            "the key appears in Helm's output: {args:?}"
        );
    }
}

#[test]
fn feedback_needs_a_named_secret_and_mode_off_needs_none() {
    let out = helm_template(&chart(), &["--set".into(), "epode.existingSecret=".into()]);
    assert!(!out.status.success());
    let msg = text(&out);
    assert!(
        msg.contains("epode.mode is never_ask") && msg.contains("kubectl create secret generic"),
        "{msg}"
    );

    let off = render_one(
        "deployment.yaml",
        &["--set", "epode.mode=off", "--set", "epode.existingSecret="],
    );
    let env = &off["spec"]["template"]["spec"]["initContainers"][0]["env"];
    let names: Vec<&str> = env
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"EPODE_API_KEY"), "{names:?}");
    assert!(env
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "AGENT_FEEDBACK_MODE" && e["value"] == "off"));
}

fn assert_restrictive(container: &Value, what: &str) {
    let sc = &container["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true, "{what}: {sc}");
    assert_eq!(sc["runAsUser"], 65532, "{what}: {sc}");
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}: {sc}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}: {sc}");
    assert_eq!(
        sc["capabilities"]["drop"],
        serde_json::json!(["ALL"]),
        "{what}: {sc}"
    );
    assert_eq!(
        sc["seccompProfile"]["type"], "RuntimeDefault",
        "{what}: {sc}"
    );
}

#[test]
fn the_default_render_has_the_native_sidecar_and_the_security_context() {
    let d = render_one("deployment.yaml", &[]);
    let pod = &d["spec"]["template"]["spec"];

    // The native sidecar: an init container that keeps running, probed on the admin port.
    let init = pod["initContainers"].as_array().expect("initContainers");
    assert_eq!(init.len(), 1);
    let sidecar = &init[0];
    assert_eq!(sidecar["name"], "epode-sidecar");
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert_eq!(sidecar["startupProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(sidecar["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(sidecar["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(sidecar["readinessProbe"]["httpGet"]["port"], 9090);
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "only the MCP server in containers");
    assert!(containers.iter().all(|c| c["name"] != "epode-sidecar"));
    // The server listens on 127.0.0.1 and the kubelet probes the pod's address: no probe by
    // default (scripts/pod-check.py runs the pod and executes every probe it declares).
    for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
        assert!(
            containers[0].get(probe).is_none(),
            "MCP server {probe}: {}",
            containers[0][probe]
        );
    }

    // The key from the Secret, by reference only.
    let env = sidecar["env"].as_array().unwrap();
    let key = env
        .iter()
        .find(|e| e["name"] == "EPODE_API_KEY")
        .expect("EPODE_API_KEY");
    assert!(key.get("value").is_none(), "{key}");
    assert_eq!(key["valueFrom"]["secretKeyRef"]["name"], "epode-sidecar");
    assert_eq!(key["valueFrom"]["secretKeyRef"]["key"], "api-key");
    let upstream = env
        .iter()
        .find(|e| e["name"] == "EPODE_SIDECAR_UPSTREAM")
        .unwrap();
    assert_eq!(upstream["value"], "http://127.0.0.1:8000/mcp");
    // Where the other replicas reach this one: the pod's IP from the downward API, defined
    // before the value that names it (the kubelet expands only earlier entries).
    let at = |name: &str| env.iter().position(|e| e["name"] == name).unwrap();
    let replica = &env[at("EPODE_SIDECAR_REPLICA_URL")];
    assert_eq!(replica["value"], "http://$(POD_IP):8080/mcp");
    assert_eq!(
        env[at("POD_IP")]["valueFrom"]["fieldRef"]["fieldPath"],
        "status.podIP"
    );
    assert!(at("POD_IP") < at("EPODE_SIDECAR_REPLICA_URL"));

    // Security.
    assert_restrictive(sidecar, "sidecar");
    // The server's container runs as its image defines it (its user, its writable
    // filesystem), less what no server needs; hardened by a value, as the sidecar is.
    let sc = &containers[0]["securityContext"];
    for unset in [
        "runAsNonRoot",
        "runAsUser",
        "runAsGroup",
        "readOnlyRootFilesystem",
    ] {
        assert!(sc.get(unset).is_none(), "MCP server {unset}: {sc}");
    }
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
    assert_eq!(
        sc["capabilities"]["drop"],
        serde_json::json!(["ALL"]),
        "{sc}"
    );
    assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{sc}");
    let hardened = render_one("deployment.yaml", &["--set", "upstream.hardened=true"]);
    assert_restrictive(
        &hardened["spec"]["template"]["spec"]["containers"][0],
        "MCP server, hardened",
    );
    let own_user = render_one(
        "deployment.yaml",
        &[
            "--set",
            "upstream.hardened=true",
            "--set",
            "upstream.securityContext.runAsUser=1000",
        ],
    );
    let sc = &own_user["spec"]["template"]["spec"]["containers"][0]["securityContext"];
    assert_eq!(
        sc["runAsUser"], 1000,
        "the value merged over the hardening: {sc}"
    );
    assert_eq!(sc["readOnlyRootFilesystem"], true, "{sc}");
    let psc = &pod["securityContext"];
    assert!(
        psc.get("runAsUser").is_none() && psc.get("runAsNonRoot").is_none(),
        "{psc}"
    );
    assert_eq!(
        psc["fsGroup"], 65532,
        "the sidecar reads its Secrets (0440) by group"
    );
    assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert_eq!(pod["terminationGracePeriodSeconds"], 30);
    let sa = render_one("serviceaccount.yaml", &[]);
    assert_eq!(sa["automountServiceAccountToken"], false);

    // The Service exposes the sidecar only.
    let svc = render_one("service.yaml", &[]);
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0]["targetPort"], 8080);

    // Classic form: a second container, kept serving by a preStop sleep.
    let c = render_one("deployment.yaml", &["--set", "nativeSidecar=false"]);
    let pod = &c["spec"]["template"]["spec"];
    assert!(pod.get("initContainers").is_none());
    let sidecar = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "epode-sidecar")
        .expect("classic sidecar container");
    assert!(sidecar.get("restartPolicy").is_none());
    assert_eq!(sidecar["lifecycle"]["preStop"]["sleep"]["seconds"], 5);
    assert_restrictive(sidecar, "classic sidecar");
}

/// The values the chart maps reach the sidecar as settings it reads: the render's env, given
/// to `epode-sidecar --check-config`, is accepted and shows each value. These are the settings
/// the chart lacked until `config::chart_tests` tied it to the declarations; the alias
/// `AGENT_FEEDBACK_URL` is now refused in `sidecar.env` like the names the chart sets.
#[test]
fn newly_mapped_values_render_as_settings_the_sidecar_accepts() {
    let sets = [
        (
            "sidecar.limits.upstreamMaxConnections=64",
            "upstream_max_connections = \"64\"",
        ),
        ("sidecar.limits.upstreamWait=2s", "upstream_wait = \"2s\""),
        (
            "sidecar.rateLimit.clients=5000",
            "rate_limit_clients = \"5000\"",
        ),
        ("epode.maxTools=500", "max_tools = \"500\""),
        (
            "epode.httpSurface.operationsPrefix=/_ops",
            "operations_prefix = \"/_ops\"",
        ),
        (
            "observability.otlp.endpoint=http://otel-collector.observability:4318",
            "otlp_endpoint = \"http://otel-collector.observability:4318/\"",
        ),
        ("observability.otlp.queue=4096", "otlp_queue = \"4096\""),
        ("observability.otlp.metrics=false", "otlp_metrics = \"off\""),
        (
            "observability.otlp.resourceAttributes.deployment\\.environment=prod",
            ",deployment.environment=prod\"",
        ),
        (
            "observability.otlp.sampler=parentbased_traceidratio",
            "otel_traces_sampler = \"parentbased_traceidratio\"",
        ),
        (
            "observability.otlp.samplerArg=0.25",
            "otel_traces_sampler_arg = \"0.25\"",
        ),
    ];
    let mut args = vec!["--set", "epode.httpSurface.enabled=true"];
    for (set, _) in &sets {
        args.extend(["--set", set]);
    }
    let d = render_one("deployment.yaml", &args);
    let env = sidecar_env(&d);
    let out = check_config(&env);
    let shown = text(&out);
    assert!(
        out.status.success(),
        "the rendered env {env:?} is refused:\n{shown}"
    );
    for (set, line) in &sets {
        assert!(
            shown.contains(line),
            "{set} did not reach the sidecar:\n{shown}"
        );
    }
    let refused = helm_template(
        &chart(),
        &[
            "--set".into(),
            "sidecar.env.AGENT_FEEDBACK_URL=https://epode.example.com".into(),
        ],
    );
    assert!(
        !refused.status.success(),
        "sidecar.env.AGENT_FEEDBACK_URL rendered"
    );
    assert!(
        text(&refused).contains(
            "AGENT_FEEDBACK_URL is refused: the chart sets AGENT_FEEDBACK_URL from epode.apiUrl"
        ),
        "{}",
        text(&refused)
    );
}

/// `observability.otlp.metrics` takes the setting's words as well as a boolean: `conventions`
/// reaches the sidecar, which accepts it; a word it does not know is refused by the schema.
#[test]
fn the_otlp_metrics_value_takes_its_words() {
    let d = render_one(
        "deployment.yaml",
        &[
            "--set",
            "observability.otlp.endpoint=http://otel-collector.observability:4318",
            "--set",
            "observability.otlp.metrics=conventions",
        ],
    );
    let env = sidecar_env(&d);
    assert!(
        env.contains(&("EPODE_SIDECAR_OTLP_METRICS".into(), "conventions".into())),
        "{env:?}"
    );
    let out = check_config(&env);
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(shown.contains("otlp_metrics = \"conventions\""), "{shown}");
    // Unset: conventions while Prometheus scrapes /metrics (the annotations, on by default),
    // else the sidecar's own default (no variable).
    let otlp_metrics = |sets: &[&str]| -> Option<String> {
        let mut args = vec!["--set", "observability.otlp.endpoint=http://c:4318"];
        for s in sets {
            args.extend(["--set", s]);
        }
        sidecar_env(&render_one("deployment.yaml", &args))
            .into_iter()
            .find(|(k, _)| k == "EPODE_SIDECAR_OTLP_METRICS")
            .map(|(_, v)| v)
    };
    assert_eq!(otlp_metrics(&[]).as_deref(), Some("conventions"));
    assert_eq!(otlp_metrics(&["metrics.annotations=false"]), None);
    assert_eq!(
        otlp_metrics(&[
            "metrics.annotations=false",
            "metrics.podMonitor.enabled=true"
        ])
        .as_deref(),
        Some("conventions")
    );
    assert_eq!(
        otlp_metrics(&["observability.otlp.metrics=all"]).as_deref(),
        Some("all")
    );
    let refused = helm_template(
        &chart(),
        &[
            "--set".into(),
            "observability.otlp.metrics=sometimes".into(),
        ],
    );
    assert!(
        !refused.status.success(),
        "the schema took metrics=sometimes"
    );
}

/// The ways in from outside: an Ingress and an HTTPRoute to the Service's MCP port only, all
/// paths (the MCP path, the OAuth metadata, the facade), never the admin port; with auth on,
/// `auth.resource` must be what a client outside reaches, else the render fails naming both.
#[test]
fn the_ingress_and_the_httproute_lead_to_the_mcp_port_and_the_resource_is_checked_against_them() {
    let values = |name: &str| chart().join("ci").join(name).to_string_lossy().into_owned();
    let ingress = render_one("ingress.yaml", &["-f", &values("ingress-values.yaml")]);
    let rule = &ingress["spec"]["rules"][0];
    assert_eq!(rule["host"], "mcp.example.com");
    let path = &rule["http"]["paths"][0];
    assert_eq!(
        (path["path"].as_str(), path["pathType"].as_str()),
        (Some("/"), Some("Prefix"))
    );
    assert_eq!(path["backend"]["service"]["port"]["name"], "mcp");
    assert_eq!(
        ingress["spec"]["tls"][0]["secretName"],
        "mcp-example-com-tls"
    );
    assert_eq!(ingress["spec"]["ingressClassName"], "nginx");
    let route = render_one("httproute.yaml", &["-f", &values("httproute-values.yaml")]);
    assert_eq!(route["apiVersion"], "gateway.networking.k8s.io/v1");
    assert_eq!(route["spec"]["parentRefs"][0]["sectionName"], "https");
    assert_eq!(
        route["spec"]["hostnames"],
        serde_json::json!(["mcp.example.com"])
    );
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!(backend["port"], 8080, "the Service's MCP port");
    assert_eq!(
        route["spec"]["rules"][0]["matches"][0]["path"]["value"],
        "/"
    );
    // Off by default: neither is rendered.
    let all = helm_template(&chart(), &[]);
    let all = text(&all);
    assert!(!all.contains("kind: Ingress") && !all.contains("kind: HTTPRoute"));
    // The resource clients are given must be the host they come in through, and the MCP path.
    let auth = |resource: &str| {
        vec![
            "--set".to_owned(),
            "auth.mode=jwt".to_owned(),
            "--set".to_owned(),
            "auth.issuer=https://as.example.com".to_owned(),
            "--set".to_owned(),
            format!("auth.resource={resource}"),
        ]
    };
    for (way, args, resource, says) in [
        (
            "ingress",
            vec![
                "--set",
                "ingress.enabled=true",
                "--set",
                "ingress.host=mcp.example.com",
            ],
            "https://mcp.internal/mcp",
            "names the host \"mcp.internal\"",
        ),
        (
            "ingress",
            vec![
                "--set",
                "ingress.enabled=true",
                "--set",
                "ingress.host=mcp.example.com",
            ],
            "https://mcp.example.com/api",
            "has the path \"/api\"",
        ),
        (
            "httpRoute",
            vec![
                "--set",
                "httpRoute.enabled=true",
                "--set",
                "httpRoute.hostnames={a.example.com}",
                "--set",
                "httpRoute.parentRefs[0].name=gw",
            ],
            "https://b.example.com/mcp",
            "clients come in through a.example.com",
        ),
    ] {
        let mut all: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        all.extend(auth(resource));
        let out = helm_template(&chart(), &all);
        assert!(!out.status.success(), "{way} with {resource}");
        assert!(text(&out).contains(says), "{way}: {}", text(&out));
    }
    let mut ok: Vec<String> = [
        "--set",
        "ingress.enabled=true",
        "--set",
        "ingress.host=mcp.example.com",
    ]
    .map(str::to_owned)
    .to_vec();
    ok.extend(auth("https://mcp.example.com/mcp"));
    assert!(helm_template(&chart(), &ok).status.success());
    let no_host = helm_template(
        &chart(),
        &["--set".to_owned(), "ingress.enabled=true".to_owned()],
    );
    assert!(
        text(&no_host).contains("ingress.enabled needs ingress.host"),
        "{}",
        text(&no_host)
    );
}

/// The admin port (/metrics has no authentication) is admitted only from the peers
/// `networkPolicy.adminFrom` names: by default no rule admits it.
#[test]
fn the_admin_port_is_admitted_only_from_the_peers_named() {
    let np = render_one("networkpolicy.yaml", &[]);
    let rules = np["spec"]["ingress"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "the MCP port alone: {np}");
    assert_eq!(rules[0]["ports"][0]["port"], 8080);
    let values = chart().join("ci/hardened-values.yaml");
    let np = render_one("networkpolicy.yaml", &["-f", values.to_str().unwrap()]);
    let rules = np["spec"]["ingress"].as_array().unwrap();
    let admin = rules
        .iter()
        .find(|r| r["ports"][0]["port"] == 9090)
        .expect("an admin rule");
    assert_eq!(
        admin["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "monitoring"
    );
    assert!(admin["from"].as_array().unwrap().len() == 1, "{admin}");
}

/// With OTLP on, the Kubernetes resource attributes come from the downward API, defined
/// before the value that names them, and the sidecar reads them as its resource.
#[test]
fn otlp_data_carries_the_kubernetes_resource_attributes() {
    let d = render_one(
        "deployment.yaml",
        &[
            "--set",
            "observability.otlp.endpoint=http://otel-collector.observability:4318",
            "--set",
            "observability.otlp.resourceAttributes.deployment\\.environment=prod",
        ],
    );
    let sidecar = &d["spec"]["template"]["spec"]["initContainers"][0];
    let env = sidecar["env"].as_array().unwrap();
    let at = |name: &str| {
        env.iter()
            .position(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    let attrs = env[at("OTEL_RESOURCE_ATTRIBUTES")]["value"]
        .as_str()
        .unwrap();
    for (name, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_UID", "metadata.uid"),
        ("POD_NAMESPACE", "metadata.namespace"),
        ("NODE_NAME", "spec.nodeName"),
    ] {
        assert_eq!(env[at(name)]["valueFrom"]["fieldRef"]["fieldPath"], field);
        assert!(
            at(name) < at("OTEL_RESOURCE_ATTRIBUTES"),
            "{name} is defined first"
        );
    }
    for want in [
        "k8s.pod.name=$(POD_NAME)",
        "k8s.namespace.name=$(POD_NAMESPACE)",
        "k8s.node.name=$(NODE_NAME)",
        "k8s.pod.uid=$(POD_UID)",
        "k8s.deployment.name=t-epode-sidecar",
        "k8s.container.name=epode-sidecar",
    ] {
        assert!(attrs.contains(want), "{want} in {attrs}");
    }
    assert!(
        attrs.ends_with(",deployment.environment=prod"),
        "the values' own last: {attrs}"
    );
    let out = check_config(&sidecar_env(&d));
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("k8s.pod.name=demo-7c9f-abcde") && shown.contains("k8s.namespace.name=shop"),
        "{shown}"
    );
}
