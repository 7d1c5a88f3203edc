//! `epode-sidecar healthcheck [--ready] [--url URL]`: the probe an image without a shell or curl
//! can run (Docker's `HEALTHCHECK`). It asks the running sidecar's `/healthz` (`/readyz` with
//! `--ready`) on the admin listener when `admin_listen` is set, else on `listen` (an
//! unspecified address such as 0.0.0.0 means this machine), and exits 0 on 200, 1 otherwise,
//! saying why on stderr. Both are read through the configuration's settings, as the sidecar
//! reads them: the environment (aliases included) and the file (`--config` or
//! `EPODE_SIDECAR_CONFIG`), over the same defaults.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use crate::config::ProbeSettings;

/// How long the whole probe may take.
const TIMEOUT: Duration = Duration::from_secs(3);

/// Asks the running sidecar whether it is alive (or ready) and exits 0 when it is.
#[derive(Debug, Parser)]
#[command(name = "epode-sidecar healthcheck")]
struct Args {
    /// Ask `/readyz` (the upstream answers) instead of `/healthz` (the process serves).
    #[arg(long)]
    ready: bool,
    /// Ask this `http://host:port` instead of the configured listener.
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// The sidecar's TOML configuration file (also EPODE_SIDECAR_CONFIG).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// The address the probe asks, from the settings the sidecar itself reads.
fn target(
    settings: Result<ProbeSettings, crate::config::ConfigError>,
) -> Result<SocketAddr, String> {
    let settings = settings.map_err(|e| e.to_string())?;
    if settings.admin_listen.is_none() && settings.tls {
        return Err("the listener serves TLS: set EPODE_SIDECAR_ADMIN_LISTEN (plain HTTP, for probes) or pass --url".to_owned());
    }
    let mut addr = settings.admin_listen.unwrap_or(settings.listen);
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    Ok(addr)
}

fn from_url(url: &str) -> Result<(SocketAddr, String), String> {
    let u = url::Url::parse(url).map_err(|e| format!("--url {url}: {e}"))?;
    if u.scheme() != "http" {
        return Err(format!("--url {url}: only http:// is probed"));
    }
    let host = u.host_str().ok_or(format!("--url {url}: no host"))?;
    let port = u.port_or_known_default().unwrap_or(80);
    let addr = (host.trim_matches(['[', ']']), port)
        .to_socket_addrs()
        .map_err(|e| format!("--url {url}: {e}"))?
        .next()
        .ok_or(format!("--url {url}: no address"))?;
    Ok((addr, u.authority().to_owned()))
}

/// GETs `path` and returns the status line.
fn probe(addr: SocketAddr, host: &str, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes())
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut head = Vec::new();
    s.take(4096)
        .read_to_end(&mut head)
        .map_err(|e| format!("{addr}: {e}"))?;
    let text = String::from_utf8_lossy(&head);
    Ok(text.lines().next().unwrap_or_default().to_owned())
}

/// Runs the subcommand on `args` (without the program name and `healthcheck`).
pub(crate) fn run(args: impl Iterator<Item = String>) -> ExitCode {
    let args =
        Args::parse_from(std::iter::once("epode-sidecar healthcheck".to_owned()).chain(args));
    let path = if args.ready { "/readyz" } else { "/healthz" };
    let target = match &args.url {
        Some(url) => from_url(url),
        None => target(
            crate::config::text_environment(std::env::vars_os())
                .and_then(|env| ProbeSettings::from_layers(env, args.config.clone())),
        )
        .map(|a| (a, a.to_string())),
    };
    let answer = target.and_then(|(addr, host)| probe(addr, &host, path).map(|s| (addr, s)));
    match answer {
        Ok((_, status)) if status.split_whitespace().nth(1) == Some("200") => ExitCode::SUCCESS,
        Ok((addr, status)) => {
            eprintln!("epode-sidecar healthcheck: {addr}{path} answered {status:?}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("epode-sidecar healthcheck: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target_of(pairs: &[(&str, &str)]) -> Result<SocketAddr, String> {
        target(ProbeSettings::from_layers(pairs.iter().copied(), None))
    }

    #[test]
    fn the_admin_listener_wins_and_unspecified_means_this_machine() {
        let a = target_of(&[
            ("EPODE_SIDECAR_LISTEN", "0.0.0.0:8080"),
            ("EPODE_SIDECAR_ADMIN_LISTEN", "0.0.0.0:9090"),
        ]);
        assert_eq!(a.unwrap(), "127.0.0.1:9090".parse().unwrap());
        let l = target_of(&[("EPODE_SIDECAR_LISTEN", "[::]:8080")]);
        assert_eq!(l.unwrap(), "[::1]:8080".parse().unwrap());
        assert_eq!(target_of(&[]).unwrap(), "127.0.0.1:8080".parse().unwrap());
        assert!(target_of(&[("EPODE_SIDECAR_TLS_CERT", "/c.pem")]).is_err());
        // Through the same table: an alias-free setting from a file, and a bad value named.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "admin_listen = \"[::]:9191\"\n").unwrap();
        let f = target(ProbeSettings::from_layers(
            [("EPODE_SIDECAR_LISTEN", "0.0.0.0:8080")],
            Some(file),
        ));
        assert_eq!(f.unwrap(), "[::1]:9191".parse().unwrap());
        let bad = target_of(&[("EPODE_SIDECAR_LISTEN", "nowhere")]).unwrap_err();
        assert!(bad.contains("EPODE_SIDECAR_LISTEN"), "{bad}");
    }
}
