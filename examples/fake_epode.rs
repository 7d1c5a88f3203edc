//! A runnable fake of the Epode API for local demos.
//!
//! ```text
//! cargo run --example fake_epode -- [--port N] [--mode never_ask|ask_once|ask_always|off]
//!                                   [--key af_live_...] [--public-url URL] [--now UNIX_SECONDS]
//! ```
//!
//! Prints `fake-epode listening on http://127.0.0.1:PORT` on stdout once it accepts
//! connections, logs one line per request (method, path, status — never the
//! Authorization value) to stderr, and runs until killed.
//!
//! Without `--key` the product key is the fixed demo key
//! `af_live_0123456789abcdef0123456789abcdef_fedcba9876543210fedcba9876543210_demo_secret_not_a_real_key`
//! (keyId `0123456789abcdef0123456789abcdef`, consentScope
//! `fedcba9876543210fedcba9876543210`). It is not a credential for the real service;
//! configure the sidecar with the same key so its capabilities verify here.

#[path = "../tests/support/fake_epode.rs"]
mod fake_epode;

use std::io::Write as _;
use std::process::ExitCode;

use fake_epode::{FakeConfig, FakeEpode, DEMO_PRODUCT_KEY};

const USAGE: &str = "usage: fake_epode [--port N] [--mode never_ask|ask_once|ask_always|off] \
[--key af_live_...] [--public-url URL] [--now UNIX_SECONDS]";

fn parse_args() -> Result<FakeConfig, String> {
    let mut config = FakeConfig::new(DEMO_PRODUCT_KEY, "never_ask");
    config.log_requests = true;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let (name, inline) = match flag.split_once('=') {
            Some((name, value)) => (name.to_owned(), Some(value.to_owned())),
            None => (flag.clone(), None),
        };
        if name == "-h" || name == "--help" {
            return Err(USAGE.to_owned());
        }
        let value = match inline {
            Some(value) => value,
            None => args
                .next()
                .ok_or_else(|| format!("{name} needs a value\n{USAGE}"))?,
        };
        match name.as_str() {
            "--port" => {
                config.port = value
                    .parse()
                    .map_err(|_| format!("--port: not a port number: {value}"))?;
            }
            "--mode" => {
                if !["never_ask", "ask_once", "ask_always", "off"].contains(&value.as_str()) {
                    return Err(format!(
                        "--mode must be never_ask, ask_once, ask_always or off (got {value})"
                    ));
                }
                config.mode = value;
            }
            "--key" => {
                if fake_epode::product_key_parts(&value).is_none() {
                    return Err(
                        "--key must look like af_live_<32 hex>_[<32 hex>_]<secret of 20+ chars>"
                            .to_owned(),
                    );
                }
                config.product_key = value;
            }
            "--public-url" => config.public_base_url = Some(value),
            "--now" => {
                config.now_override = Some(
                    value
                        .parse()
                        .map_err(|_| format!("--now: not unix seconds: {value}"))?,
                );
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(config)
}

fn main() -> ExitCode {
    let config = match parse_args() {
        Ok(config) => config,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let mode = config.mode.clone();
    let demo_key = config.product_key == DEMO_PRODUCT_KEY;
    let fake = match FakeEpode::try_start(config) {
        Ok(fake) => fake,
        Err(error) => {
            eprintln!("fake-epode: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "fake-epode: mode {mode}, {} product key",
        if demo_key { "demo" } else { "custom" }
    );
    println!("fake-epode listening on {}", fake.url());
    let _ = std::io::stdout().flush();
    loop {
        std::thread::park();
    }
}
