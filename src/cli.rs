//! The command line, logging, the runtime and signals: start, serve, and on SIGTERM/SIGINT
//! drain, flush telemetry and exit.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use crate::config::{self, Config, FlagValues, LogFormat};
use crate::dispatch::Dispatcher;
use crate::server;

/// A reverse proxy beside an MCP server: a stateless MCP 2026-07-28 front and Epode feedback.
/// Every setting is also an environment variable (see README.md); flags win over the
/// environment, which wins over the configuration file.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// TOML configuration file (also EPODE_SIDECAR_CONFIG).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Listen address (EPODE_SIDECAR_LISTEN).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Upstream MCP endpoint URL (EPODE_SIDECAR_UPSTREAM).
    #[arg(long, value_name = "URL")]
    upstream: Option<String>,
    /// Path clients post to (EPODE_SIDECAR_PATH).
    #[arg(long, value_name = "PATH")]
    path: Option<String>,
    /// Log filter (EPODE_SIDECAR_LOG).
    #[arg(long, value_name = "FILTER")]
    log: Option<String>,
    /// Log format, text or json (EPODE_SIDECAR_LOG_FORMAT).
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,
    /// Print the effective configuration (secrets redacted) and exit.
    #[arg(long)]
    check_config: bool,
    /// Print the settings table (Markdown, as in the README) and exit.
    #[arg(long, hide = true)]
    settings_markdown: bool,
}

impl Cli {
    fn flag_values(&self) -> FlagValues {
        let mut values = std::collections::BTreeMap::new();
        for (key, v) in [
            ("listen", &self.listen),
            ("upstream", &self.upstream),
            ("path", &self.path),
            ("log", &self.log),
            ("log_format", &self.log_format),
        ] {
            if let Some(v) = v {
                values.insert(key, v.clone());
            }
        }
        FlagValues {
            config_file: self.config.clone(),
            values,
        }
    }
}

fn init_logging(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::builder().parse_lossy(&config.log);
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

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate());
    let mut term = match term {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM; only SIGINT stops the sidecar");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

/// The process: parse, configure, serve until a signal, drain, flush.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.settings_markdown {
        print!("{}", config::settings_markdown());
        return ExitCode::SUCCESS;
    }
    let config = match Config::from_layers(std::env::vars(), &cli.flag_values()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("epode-sidecar: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.check_config {
        print!("{config}");
        return ExitCode::SUCCESS;
    }
    init_logging(&config);

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
    runtime.block_on(run(Arc::new(config)))
}

async fn run(config: Arc<Config>) -> ExitCode {
    let listeners = match server::bind(config.listen, config.workers) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("epode-sidecar: cannot listen on {}: {e}", config.listen);
            return ExitCode::FAILURE;
        }
    };
    let local = listeners.local_addr;
    let dispatcher = match Dispatcher::new(config.clone()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("epode-sidecar: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // One line on stdout, so scripts and tests started with port 0 learn the address.
    println!("epode-sidecar listening on {local}");
    tracing::info!(listen = %local, upstream = %config.upstream.url, path = %config.path, workers = config.workers, "epode-sidecar serving");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let serving = server::serve(listeners, &dispatcher, stopped);
    tokio::pin!(serving);
    tokio::select! {
        _ = &mut serving => {}
        () = shutdown_signal() => {
            tracing::info!("shutting down: no new connections; waiting for in-flight requests");
            let _ = stop.send(true);
            serving.await;
        }
    }
    // Queued telemetry is delivered within its own deadline before the process exits.
    dispatcher.binding().shutdown().await;
    ExitCode::SUCCESS
}
