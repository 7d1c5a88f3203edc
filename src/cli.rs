//! The command line, logging, the runtime and signals: start, serve, and on SIGTERM/SIGINT
//! drain, flush telemetry and exit. It builds the pieces the request path, the routes and the
//! shutdown share (`Handles`), hands each its own, and keeps what the shutdown order needs.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use tokio::signal::unix::{signal, SignalKind};
use tokio_rustls::TlsAcceptor;

use crate::auth::Authorizer;
use crate::binding::FeedbackBinding;
use crate::budget::MemoryBudget;
use crate::config::{self, Config, ConnectionCap, FlagValues, LogFormat};
use crate::dispatch::{self, Dispatcher};
use crate::epode::telemetry::Counters;
use crate::error::Error;
use crate::gate::Gate;
use crate::ledger::{self, Ledger};
use crate::limits::RateLimits;
use crate::metrics::Metrics;
use crate::observe::Observer;
use crate::request::{Front, Recorder};
use crate::server;
use crate::trial::Trial;
use crate::upstream::{exec, Upstream};

/// A reverse proxy beside an MCP server: a stateless MCP 2026-07-28 front and Epode feedback.
/// Every setting is also an environment variable (see README.md); flags win over the
/// environment, which wins over the configuration file. `epode-sidecar healthcheck [--ready]`
/// probes a running sidecar (exit 0 when it answers 200).
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// TOML configuration file (also EPODE_SIDECAR_CONFIG).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// `--listen`, `--upstream`, … `--dev`: the settings that are also flags.
    #[command(flatten)]
    settings: SettingFlags,
    /// Print the effective configuration (secrets redacted) and exit.
    #[arg(long)]
    check_config: bool,
    /// Print the settings table (Markdown, as in docs/settings.md) and exit.
    #[arg(long, hide = true)]
    settings_markdown: bool,
    /// A stdio MCP server to run and speak to over stdin/stdout, after `--`:
    /// `epode-sidecar -- python server.py` (EPODE_SIDECAR_UPSTREAM_COMMAND).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

impl Cli {
    fn flag_values(&self) -> FlagValues {
        FlagValues {
            config_file: self.config.clone(),
            values: self.settings.0.clone(),
            command: self.command.clone(),
        }
    }
}

/// The settings given as flags, by key: each flag's name, value name and help are its
/// setting's declaration (`config::FLAGS`), its variable named in the help.
#[derive(Debug, Default)]
struct SettingFlags(std::collections::BTreeMap<&'static str, String>);

impl clap::FromArgMatches for SettingFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = SettingFlags::default();
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        for doc in config::FLAGS {
            let Some(flag) = &doc.flag else { continue };
            let value = match flag.value_name {
                Some(_) => matches.get_one::<String>(doc.key).cloned(),
                // A switch sets its setting only when given: unset, the lower layers decide.
                None => matches.get_flag(doc.key).then(|| "true".to_owned()),
            };
            if let Some(v) = value {
                self.0.insert(doc.key, v);
            }
        }
        Ok(())
    }
}

impl clap::Args for SettingFlags {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for doc in config::FLAGS {
            let Some(flag) = &doc.flag else { continue };
            let arg = clap::Arg::new(doc.key)
                .long(flag.long)
                .help(format!("{} ({})", flag.help, doc.env[0]));
            cmd = cmd.arg(match flag.value_name {
                Some(name) => arg.value_name(name).action(clap::ArgAction::Set),
                None => arg.action(clap::ArgAction::SetTrue),
            });
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

fn init_logging(config: &Config) {
    // The access line is one setting: when it is on, its target is let through even where
    // `log` asks only for warnings (off, the line is never made: see `dispatch`).
    let filter = if config.access_log {
        format!("{},{}=info", config.log, crate::observe::ACCESS_TARGET)
    } else {
        config.log.clone()
    };
    let filter = tracing_subscriber::EnvFilter::builder().parse_lossy(filter);
    use std::io::IsTerminal as _;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only for a person at a terminal, never in collected logs.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// SIGTERM and SIGINT, listened for from the start, so one that arrives while the sidecar
/// starts still drains it rather than killing it outright.
struct StopSignals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    fn listen() -> Self {
        let listen = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for {name}");
                None
            }
        };
        StopSignals {
            term: listen(SignalKind::terminate(), "SIGTERM"),
            int: listen(SignalKind::interrupt(), "SIGINT"),
        }
    }

    /// Until SIGTERM or SIGINT arrives.
    async fn received(&mut self) {
        async fn next(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(&mut self.term) => tracing::info!("SIGTERM received"),
            () = next(&mut self.int) => tracing::info!("SIGINT received"),
        }
    }
}

/// Makes the process non-dumpable before it reads a secret: its `/proc/PID/environ`, `mem`
/// and `maps` are then readable by root only, not by every process of the same user (such as
/// a stdio MCP server it runs, which gets a dumpable process again at `exec`).
fn refuse_inspection() {
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("epode-sidecar: cannot make the process non-dumpable: {e}");
    }
}

/// Whether this process is the stdio MCP server's trampoline (`epode-sidecar __stdio-exec
/// …`), which becomes the server at once.
pub fn is_stdio_trampoline() -> bool {
    std::env::args_os().nth(1).as_deref() == Some(std::ffi::OsStr::new(exec::SUBCOMMAND))
}

/// The process: parse, configure, serve until a signal, drain, flush.
pub fn main() -> ExitCode {
    if is_stdio_trampoline() {
        // The stdio MCP server's trampoline: becomes the server, or says why it cannot.
        return exec::trampoline(std::env::args_os().skip(2).collect());
    }
    refuse_inspection();
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == "healthcheck")
    {
        // A probe: arguments that are not text are left for it to refuse.
        let args = std::env::args_os()
            .skip(2)
            .map(|a| a.to_string_lossy().into_owned());
        return crate::healthcheck::run(args);
    }
    let cli = Cli::parse();
    if cli.settings_markdown {
        print!("{}", config::settings_markdown());
        return ExitCode::SUCCESS;
    }
    let config = match config::text_environment(std::env::vars_os())
        .map_err(config::ConfigErrors::from)
        .and_then(|env| Config::from_layers(env, &cli.flag_values()))
    {
        Ok(c) => c,
        Err(errors) => {
            // Every mistake, one a line, so all are fixed before the next start.
            for e in errors.iter() {
                eprintln!("epode-sidecar: configuration error: {e}");
            }
            return ExitCode::from(2);
        }
    };
    if cli.check_config {
        // The warnings the start would log, on stderr: stdout stays TOML to feed back.
        for w in &config.warnings {
            eprintln!("epode-sidecar: warning: {w}");
        }
        print!("{config}");
        return ExitCode::SUCCESS;
    }
    init_logging(&config);
    for w in &config.warnings {
        tracing::warn!("{w}");
    }

    // The main thread's loop runs signals, telemetry and the consent lookups' timers; the
    // server workers run their own (see server.rs).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("epode-sidecar: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(config))
}

/// The one connection cap, shared by every listener: 80% of the file-descriptor limit (first
/// raised to its hard limit), or as configured but never above that, so upstream and Epode
/// connections always find a descriptor.
fn connection_cap(cap: ConnectionCap) -> usize {
    let limit = rlimit::increase_nofile_limit(u64::MAX)
        .or_else(|_| rlimit::getrlimit(rlimit::Resource::NOFILE).map(|(soft, _)| soft))
        .unwrap_or(1024);
    let auto = usize::try_from(limit.saturating_mul(8) / 10)
        .unwrap_or(usize::MAX)
        .max(1);
    let cap = match cap {
        ConnectionCap::Auto => auto,
        ConnectionCap::Fixed(n) if n > auto => {
            tracing::warn!(max_connections = n, fd_limit = limit, used = auto, "max_connections is above 80% of the file-descriptor limit; the sidecar keeps the rest for its own connections");
            auto
        }
        ConnectionCap::Fixed(n) => n,
    };
    tracing::info!(fd_limit = limit, max_connections = cap, "connection cap");
    cap
}

/// SIGHUP, listened for from now on: it must never end the process (its default action),
/// with TLS or without.
fn hangup() -> Option<tokio::signal::unix::Signal> {
    match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP");
            None
        }
    }
}

/// The listener's TLS, and the task that reloads its certificate when the files change or
/// on SIGHUP. Without TLS, SIGHUP is logged and otherwise ignored.
fn listener_tls(config: &Config) -> Result<Option<TlsAcceptor>, String> {
    let mut hup = hangup();
    let Some(tls) = &config.tls else {
        tokio::spawn(async move {
            while let Some(()) = async { hup.as_mut()?.recv().await }.await {
                tracing::info!("SIGHUP received: nothing to reload (no TLS configured)");
            }
        });
        return Ok(None);
    };
    let (server, cert) = crate::tls::server_config(tls)?;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(cert.reload_every());
        loop {
            let forced = tokio::select! {
                _ = tick.tick() => false,
                Some(()) = async { match &mut hup { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            };
            cert.reload(forced);
        }
    });
    Ok(Some(TlsAcceptor::from(server)))
}

/// Housekeeping every 30 s (sooner when sessions idle out sooner): idle upstream sessions
/// closed, recovered rate-limit entries forgotten.
fn spawn_sweeper(
    config: &Config,
    upstream: Arc<Upstream>,
    rates: Arc<RateLimits>,
) -> tokio::task::JoinHandle<()> {
    let every = std::time::Duration::from_secs(30)
        .min(config.limits.upstream_session_idle / 2)
        .max(std::time::Duration::from_millis(100));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            upstream.sweep_sessions();
            rates.sweep();
        }
    })
}

/// How long after start the upstream may take to answer before the sidecar says so.
const STARTUP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Probes the upstream once it can (it may start after the sidecar, as in a pod) and says
/// what it found: one line, plain enough to act on.
async fn startup_check(upstream: Arc<Upstream>, binding: Arc<FeedbackBinding>) {
    say_upstream_epode(&binding);
    let started = std::time::Instant::now();
    loop {
        match upstream.ready().await {
            Ok(()) => {
                tracing::info!("the upstream MCP server answers: ready");
                if binding.looks_for_epode() {
                    hear_discovery(&upstream).await;
                }
                return;
            }
            Err(not) if not.lasting => {
                tracing::warn!("the upstream MCP server is not usable: {}", not.reason);
                return;
            }
            Err(not) if started.elapsed() >= STARTUP_PATIENCE => {
                tracing::warn!(
                    "the upstream MCP server has not answered in the {} since start: {}",
                    humantime::format_duration(STARTUP_PATIENCE),
                    not.reason
                );
                return;
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_secs(1)).await,
        }
    }
}

/// Says once at start whether the binding looks for Epode in the upstream itself.
fn say_upstream_epode(binding: &FeedbackBinding) {
    if !binding.enabled() {
        return;
    }
    if binding.looks_for_epode() {
        tracing::info!(upstream_epode = "auto", "the feedback binding looks for Epode in the upstream itself (its capabilities, its tools, its results); where it is found the sidecar steps back, so no call is counted twice");
    } else {
        tracing::info!(upstream_epode = "none", "the upstream is taken to carry no Epode of its own (EPODE_SIDECAR_UPSTREAM_EPODE=none): the sidecar binds whatever it says");
    }
}

/// Asks a 2026 upstream's discovery once, in the sidecar's own name, so that whether it
/// carries Epode itself is known before the first client call (a 2025 upstream says its
/// capabilities in the handshake of the first session anyway). A refusal (an upstream that
/// wants credentials) leaves it to the clients' own discoveries.
async fn hear_discovery(upstream: &Upstream) {
    let headers = http::HeaderMap::new();
    let itself = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let client = crate::upstream::Client::new(
        &headers,
        crate::caller::Caller::of_address(itself.ip(), itself),
    );
    if matches!(
        upstream.era(&client).await,
        Ok(crate::mcp::era::Era::Modern)
    ) {
        if let Err(e) = upstream.discover(&client, None, None).await {
            tracing::debug!(error = %e, "the upstream's discovery, for whether it carries Epode");
        }
    }
}

/// The local trial, when `--dev` is on (its embedded Epode is bound; [`prepare`] points the
/// binding at it).
fn start_trial(config: &Config) -> Result<Option<Trial>, ExitCode> {
    if config.dev.is_none() {
        return Ok(None);
    }
    match Trial::start(config) {
        Ok(t) => Ok(Some(t)),
        Err(e) => {
            eprintln!("epode-sidecar: cannot start the local trial: {e}");
            Err(ExitCode::FAILURE)
        }
    }
}

/// The pieces the request path, the routes and the shutdown share, built once.
struct Handles {
    metrics: Arc<Metrics>,
    budget: Arc<MemoryBudget>,
    binding: Arc<FeedbackBinding>,
    upstream: Arc<Upstream>,
    rates: Arc<RateLimits>,
    /// The MCP requests being served (every worker's).
    in_flight: Gate,
    /// The authorization front door, when on.
    auth: Option<Arc<Authorizer>>,
}

/// Builds the shared pieces; with feedback on, the binding starts the telemetry task, so this
/// must run inside the runtime. `observer` watches the requests; `epode` is where the binding
/// reaches Epode instead of the configured API (the local trial's embedded one).
fn handles(
    config: &Config,
    observer: Option<Arc<dyn Observer>>,
    epode: Option<url::Url>,
) -> Result<Handles, Error> {
    let counters = Counters::new();
    let metrics = Arc::new(Metrics::new(|r| counters.register(r)));
    let budget = MemoryBudget::new(config.limits.memory_budget);
    let mut feedback = config.feedback.clone();
    if let Some(url) = epode {
        feedback.api_url = url;
    }
    let ledger = Ledger::new(pools(config), metrics.clone());
    let auth = match &config.auth {
        Some(a) => {
            let auth = Authorizer::new(
                a.clone(),
                metrics.clone(),
                feedback.key.as_ref(),
                ledger.clone(),
            )?;
            tokio::spawn(auth.clone().watch());
            Some(auth)
        }
        None => None,
    };
    let binding = FeedbackBinding::new(
        feedback,
        counters,
        metrics.clone(),
        observer,
        ledger.clone(),
    )?;
    let upstream = Arc::new(Upstream::new(
        config,
        budget.clone(),
        metrics.clone(),
        ledger.clone(),
    )?);
    // A tools/list_changed the sidecar hears (on a listen feed, or taken off a call's stream)
    // makes the catalog learn the tools again.
    let forget = Arc::downgrade(&binding);
    upstream.on_tools_changed(Arc::new(move || {
        if let Some(b) = forget.upgrade() {
            b.tools_changed();
        }
    }));
    // The upstream's capabilities tell whether it carries Epode itself.
    let hears = Arc::downgrade(&binding);
    upstream.on_capabilities(Arc::new(move |caps| {
        if let Some(b) = hears.upgrade() {
            b.heard_capabilities(caps);
        }
    }));
    Ok(Handles {
        auth,
        metrics,
        budget,
        binding,
        upstream,
        rates: RateLimits::new(&config.limits),
        in_flight: Gate::new(config.limits.max_in_flight),
    })
}

/// Each ledger pool's cap and per-caller share, from the settings (in [`ledger::Pool::ALL`]'s
/// order).
fn pools(config: &Config) -> [ledger::Bounds; 9] {
    let l = &config.limits;
    let bounds = |cap, share, cap_setting, share_setting, retry_after| ledger::Bounds {
        cap,
        share,
        cap_setting,
        share_setting,
        retry_after,
    };
    [
        bounds(
            l.held_calls,
            l.held_calls_per_caller,
            "EPODE_SIDECAR_HELD_CALLS",
            "EPODE_SIDECAR_HELD_CALLS_PER_CALLER",
            1,
        ),
        bounds(
            l.questions,
            l.questions_per_caller,
            "EPODE_SIDECAR_QUESTIONS",
            "EPODE_SIDECAR_QUESTIONS_PER_CALLER",
            1,
        ),
        bounds(
            l.listen_streams,
            l.listen_streams_per_caller,
            "EPODE_SIDECAR_LISTEN_STREAMS",
            "EPODE_SIDECAR_LISTEN_STREAMS_PER_CALLER",
            5,
        ),
        bounds(
            l.upstream_sessions,
            l.upstream_sessions_per_caller,
            "EPODE_SIDECAR_UPSTREAM_SESSIONS",
            "EPODE_SIDECAR_UPSTREAM_SESSIONS_PER_CALLER",
            1,
        ),
        bounds(
            stdio_children(config),
            1,
            "EPODE_SIDECAR_STDIO_MAX_CHILDREN",
            "EPODE_SIDECAR_STDIO_CHILDREN",
            1,
        ),
        bounds(
            l.introspections,
            l.introspections_per_caller,
            "EPODE_SIDECAR_AUTH_INTROSPECTIONS",
            "EPODE_SIDECAR_AUTH_INTROSPECTIONS_PER_CALLER",
            1,
        ),
        // A caller's held connections follow from its shares of held calls and of sessions
        // (one listen feed each): no share of their own.
        bounds(
            l.held_connections(mcp_connections(config)),
            usize::MAX,
            "EPODE_SIDECAR_UPSTREAM_HOLD_SHARE",
            "EPODE_SIDECAR_HELD_CALLS_PER_CALLER",
            1,
        ),
        bounds(
            l.tasks,
            l.tasks_per_caller,
            "EPODE_SIDECAR_TASKS",
            "EPODE_SIDECAR_TASKS_PER_CALLER",
            1,
        ),
        bounds(
            l.context_requests,
            l.context_requests_per_caller,
            "EPODE_SIDECAR_CUSTOMER_CONTEXT_REQUESTS",
            "EPODE_SIDECAR_CUSTOMER_CONTEXT_REQUESTS_PER_CALLER",
            1,
        ),
    ]
}

/// The stdio MCP server processes the sidecar may run (one per caller, or the one shared).
fn stdio_children(config: &Config) -> usize {
    match &config.upstream {
        config::UpstreamTransport::Stdio(c) => match c.children {
            config::StdioChildren::PerClient { max, .. } => max,
            config::StdioChildren::Shared => 1,
        },
        config::UpstreamTransport::Http(_) => 1,
    }
}

/// The MCP path's upstream connections (with the HTTP surface on, less its share).
fn mcp_connections(config: &Config) -> usize {
    let l = &config.limits;
    l.upstream_max_connections
        - config
            .http
            .as_ref()
            .map_or(0, |h| h.upstream_connections(l.upstream_max_connections))
}

/// What the housekeeping and the shutdown order need, kept here: the upstream (its sessions
/// swept; stopped after the last request), the rate limits (swept), the binding (its queued
/// telemetry delivered before the process exits).
struct Kept {
    upstream: Arc<Upstream>,
    rates: Arc<RateLimits>,
    binding: Arc<FeedbackBinding>,
    /// OpenTelemetry, when on: its queued spans and last metrics sent before the exit.
    otel: Option<Arc<crate::otel::Otel>>,
}

/// Everything bound and built before serving starts.
struct Prepared {
    listeners: server::Listeners,
    admin: Option<std::net::TcpListener>,
    dispatcher: Dispatcher,
    operations: server::Operations,
    shared: server::Serving,
    kept: Kept,
    cut: tokio::sync::watch::Sender<bool>,
}

/// The other replicas, with `EPODE_SIDECAR_REPLICA_URL` (the configuration made sure the
/// product key that seals their states is set).
fn replicas(
    config: &Config,
    budget: &Arc<MemoryBudget>,
) -> Result<Option<Arc<crate::replica::Replicas>>, String> {
    let (Some(_), Some(key)) = (&config.replica_url, &config.feedback.key) else {
        return Ok(None);
    };
    crate::replica::Replicas::new(
        key.expose_secret(),
        config.upstream_timeout,
        (config.limits.max_upstream_answer, budget.clone()),
    )
    .map(|r| Some(Arc::new(r)))
}

fn failed(what: &str, e: impl std::fmt::Display) -> ExitCode {
    eprintln!("epode-sidecar: {what}: {e}");
    ExitCode::FAILURE
}

/// OpenTelemetry, when an OTLP endpoint is set; a failure is reported and ends the process.
fn start_otel(
    config: &Config,
    metrics: &Arc<Metrics>,
    gauges: server::GaugeReader,
) -> Result<Option<Arc<crate::otel::Otel>>, ExitCode> {
    config
        .otel
        .as_ref()
        .map(|c| {
            let read = Box::new(move || gauges.read());
            let started = crate::otel::Otel::start(c, &config.upstream, metrics.clone(), read);
            if started.is_ok() {
                let every = c.metrics_every.map_or_else(
                    || "off".to_owned(),
                    |d| humantime::format_duration(d).to_string(),
                );
                let shown = |u: &url::Url| crate::config::redact_url(u.as_str()).into_owned();
                tracing::info!(
                    traces = %shown(&c.traces_url),
                    metrics = %c.metrics_url.as_ref().filter(|_| c.metrics_every.is_some()).map_or_else(|| "off".to_owned(), shown),
                    metrics_every = %every,
                    timeout = %humantime::format_duration(c.timeout),
                    "OpenTelemetry on: spans and metrics go over OTLP/HTTP"
                );
            }
            started
        })
        .transpose()
        .map_err(|e| failed("cannot start OpenTelemetry", e))
}

/// The MCP listeners (one per worker) and the admin listener (when configured).
fn bind_all(
    config: &Config,
) -> Result<(server::Listeners, Option<std::net::TcpListener>), ExitCode> {
    let listeners = server::bind(config.listen, config.workers).map_err(|e| {
        failed(
            &format!("cannot listen on {}", config.listen),
            bind_error(&e, "EPODE_SIDECAR_LISTEN (or --listen)"),
        )
    })?;
    let admin = (config.admin_listen)
        .map(|at| {
            std::net::TcpListener::bind(at).map_err(|e| {
                failed(
                    &format!("cannot listen on the admin address {at}"),
                    bind_error(&e, "EPODE_SIDECAR_ADMIN_LISTEN"),
                )
            })
        })
        .transpose()?;
    Ok((listeners, admin))
}

/// Why an address could not be bound, and the setting that chooses it.
fn bind_error(e: &std::io::Error, setting: &str) -> String {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => format!(
            "{e}: another process listens there (`ss -ltnp` names it); stop it, or set {setting} to a free address"
        ),
        std::io::ErrorKind::PermissionDenied => format!(
            "{e}: a port below 1024 needs privileges; set {setting} to a port of 1024 or above"
        ),
        std::io::ErrorKind::AddrNotAvailable => format!(
            "{e}: no interface of this machine has that address; set {setting} to one it has (0.0.0.0 for all, 127.0.0.1 for this machine only)"
        ),
        _ => format!("{e} (the address comes from {setting})"),
    }
}

/// Binds the listeners and builds the request path (with `trial`, observed by its console and
/// its binding pointed at its Epode); a failure is reported and ends the process.
fn prepare(config: &Arc<Config>, trial: Option<&Trial>) -> Result<Prepared, ExitCode> {
    let (listeners, admin) = bind_all(config)?;
    let (cut, cut_rx) = tokio::sync::watch::channel(false);
    let (observer, epode) = (trial.map(Trial::observer), trial.map(Trial::epode_url));
    let Handles {
        metrics,
        budget,
        binding,
        upstream,
        rates,
        in_flight,
        auth,
    } = handles(config, observer.clone(), epode).map_err(|e| failed("cannot start", e))?;
    let operations = server::Operations::new(
        upstream.clone(),
        metrics.clone(),
        in_flight.clone(),
        budget.clone(),
        rates.clone(),
        auth.clone(),
    );
    let otel = start_otel(config, &metrics, operations.gauges())?;
    if otel.is_some() {
        // The sidecar's own upstream requests are spans of their own, which the upstream sees.
        upstream.trace_own_requests(Arc::new(crate::otel::OwnRequests));
    }
    // The one front and the one record, for the MCP path and the HTTP surface alike.
    let replicas = replicas(config, &budget).map_err(|e| failed("cannot start", e))?;
    let front = Front::new(
        config.clone(),
        (rates.clone(), budget.clone()),
        metrics.clone(),
        (auth.clone(), replicas.clone()),
        in_flight,
    );
    let records = Recorder::new(config.clone(), metrics.clone(), observer, otel.clone());
    let tls = listener_tls(config).map_err(|e| failed("cannot start TLS on the listener", e))?;
    let shared = server::Serving::new(
        config.clone(),
        &metrics,
        budget.clone(),
        connection_cap(config.limits.max_connections),
        tls,
        trial.map(Trial::console),
    )
    .with_surface(
        crate::surface::HttpSurfaceRoute::new(
            config.clone(),
            binding.clone(),
            metrics.clone(),
            budget,
            (front.clone(), records.clone()),
        )
        .map_err(|e| failed("cannot start the HTTP surface", e))?,
    )
    .with_auth(auth.clone());
    let dispatcher = Dispatcher::new(dispatch::Parts {
        config: config.clone(),
        upstream: upstream.clone(),
        binding: binding.clone(),
        metrics,
        rates: rates.clone(),
        front,
        records,
        cut: cut_rx,
        auth,
        otel: otel.clone(),
        replicas,
    });
    Ok(Prepared {
        listeners,
        admin,
        dispatcher,
        operations,
        shared,
        kept: Kept {
            upstream,
            rates,
            binding,
            otel,
        },
        cut,
    })
}

async fn run(config: Config) -> ExitCode {
    let mut signals = StopSignals::listen();
    let trial = match start_trial(&config) {
        Ok(trial) => trial,
        Err(code) => return code,
    };
    let console = trial.as_ref().map(Trial::closer);
    let config = Arc::new(config);
    let Prepared {
        listeners,
        admin: admin_listener,
        dispatcher,
        operations,
        shared,
        kept,
        cut,
    } = match prepare(&config, trial.as_ref()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let local = listeners.local_addr;
    // One line on stdout, so scripts and tests started with port 0 learn the address.
    println!("epode-sidecar listening on {local}");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    if let Some(listener) = admin_listener {
        if let Ok(addr) = listener.local_addr() {
            println!("epode-sidecar admin listening on {addr}");
        }
        if let Some(bounds) = shared.admin() {
            tokio::spawn(server::admin(
                listener,
                operations.clone(),
                bounds,
                stopped.clone(),
            ));
        }
    }
    tracing::info!(listen = %local, upstream = %config.upstream.shown(), path = %config.path, workers = config.workers, tls = config.tls.is_some(), "epode-sidecar serving");
    if let Some(trial) = &trial {
        trial.announce(&config, local);
    }
    if let (Some(trial), Some(bounds)) = (trial, shared.dev_epode()) {
        trial.serve(bounds);
    }
    let sweeper = spawn_sweeper(&config, kept.upstream.clone(), kept.rates.clone());
    let first_check = tokio::spawn(startup_check(kept.upstream.clone(), kept.binding.clone()));
    let serving = server::serve(listeners, &dispatcher, &operations, shared, stopped);
    tokio::pin!(serving);
    let mut cut_short = false;
    let drained = tokio::select! {
        drained = &mut serving => drained,
        () = signals.received() => {
            tracing::info!("shutting down: no new connections; waiting for in-flight requests");
            let _ = stop.send(true);
            if let Some(console) = &console {
                console.close();
            }
            tokio::select! {
                drained = &mut serving => drained,
                () = tokio::time::sleep(config.shutdown_grace) => {
                    tracing::warn!("the shutdown grace period is over: in-flight requests are answered with an error and closed");
                    cut_short = true;
                    let _ = cut.send(true);
                    serving.await
                }
            }
        }
    };
    sweeper.abort();
    first_check.abort();
    // A stdio upstream's child is stopped after the last request, and waited for.
    kept.upstream.shutdown().await;
    // Queued telemetry is delivered within its own deadline before the process exits.
    kept.binding.shutdown().await;
    if let Some(otel) = &kept.otel {
        otel.shutdown().await;
    }
    if cut_short || !drained {
        tracing::warn!("requests were cut short at shutdown; exiting with status 3");
        return ExitCode::from(3);
    }
    ExitCode::SUCCESS
}
