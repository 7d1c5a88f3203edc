//! A stdio upstream: the MCP server the sidecar starts as its child and speaks to over
//! stdin/stdout, with the environment it may see and how it is restarted and stopped.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use super::limits::Rate;
use super::settings::{duration, invalid, setting, ConfigError, Setting};
use super::{duration_in, number, parsed, split_list, value, Scalar, Transport};

/// Variables a child never sees, whatever the allowlist says: the sidecar's own secrets.
const NEVER_PASSED: [&str; 3] = ["EPODE_API_KEY", "AGENT_FEEDBACK_KEY", "EPODE_SIDECAR_*"];

/// The MCP server to run as a child process.
#[derive(Clone)]
pub(crate) struct StdioCommand {
    pub(crate) program: String,
    pub(crate) args: Vec<String>,
    pub(crate) cwd: Option<PathBuf>,
    /// The allowlist as configured (names and `*` patterns).
    pub(crate) env_allow: Vec<String>,
    /// The variables the child gets: the sidecar's own, filtered by the allowlist.
    pub(crate) env: Vec<(String, String)>,
    /// After SIGTERM, how long the child has before SIGKILL.
    pub(crate) stop_grace: Duration,
    /// The longest pause between restarts of a child that keeps exiting.
    pub(crate) restart_max_delay: Duration,
    /// Messages waiting for the child to read its stdin, at most.
    pub(crate) stdin_queue: usize,
    /// Lines of the child's stderr logged, at most; the rest are counted.
    pub(crate) stderr_rate: Rate,
}

impl std::fmt::Debug for StdioCommand {
    /// Never the environment's values, nor the arguments (either may hold a credential).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioCommand")
            .field("program", &self.program)
            .field("args", &self.args.len())
            .field("cwd", &self.cwd)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl StdioCommand {
    /// How logs and `--check-config` show it: the program and how many arguments.
    pub(crate) fn shown(&self) -> String {
        match self.args.len() {
            0 => self.program.clone(),
            1 => format!("{} (and 1 argument)", self.program),
            n => format!("{} (and {n} arguments)", self.program),
        }
    }

    /// Keeps the variables of `env` the allowlist names, never the sidecar's secrets.
    pub(super) fn select_env(&mut self, env: &BTreeMap<String, String>) {
        let allowed = globs(&self.env_allow);
        let never = globs(&NEVER_PASSED.map(str::to_owned));
        self.env = env
            .iter()
            .filter(|(k, _)| allowed.is_match(k.as_str()) && !never.is_match(k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
    }
}

fn globs(patterns: &[String]) -> globset::GlobSet {
    let mut set = globset::GlobSetBuilder::new();
    for p in patterns {
        if let Ok(g) = globset::GlobBuilder::new(p)
            .literal_separator(false)
            .build()
        {
            set.add(g);
        }
    }
    set.build().unwrap_or_else(|_| globset::GlobSet::empty())
}

#[derive(Default)]
pub(super) struct RawStdio {
    pub(super) upstream: Option<Scalar>,
    pub(super) upstream_command: Option<Scalar>,
    pub(super) upstream_cwd: Option<Scalar>,
    pub(super) upstream_env: Option<Scalar>,
    pub(super) upstream_stop_grace: Option<Scalar>,
    pub(super) upstream_restart_max_delay: Option<Scalar>,
    pub(super) upstream_stdin_queue: Option<Scalar>,
    pub(super) upstream_stderr_rate: Option<Scalar>,
}

/// The upstream: an HTTP endpoint, or a command (from the command line after `--`, which wins,
/// or the setting); exactly one of them.
pub(super) fn check(raw: RawStdio, argv: &[String]) -> Result<Transport, ConfigError> {
    let url = value(raw.upstream);
    let argv = if argv.is_empty() {
        match value(raw.upstream_command) {
            Some(line) => match shell_words::split(&line) {
                Ok(words) if !words.is_empty() => words,
                _ => return Err(invalid("upstream_command", &line)),
            },
            None => Vec::new(),
        }
    } else {
        argv.to_vec()
    };
    match (url, argv.split_first()) {
        (Some(url), None) => super::parse_upstream(&url)
            .map(Transport::Http)
            .ok_or_else(|| invalid("upstream", &url)),
        (Some(url), Some(_)) => Err(invalid(
            "upstream",
            &format!("{url}, while a command to run is also given; give one of them"),
        )),
        (None, None) => Err(ConfigError::Missing {
            name: "the upstream: EPODE_SIDECAR_UPSTREAM (an http:// or https:// URL), or a command to run after `--` (or EPODE_SIDECAR_UPSTREAM_COMMAND)".to_owned(),
            accepts: "for instance `epode-sidecar -- python server.py` for a stdio MCP server, or EPODE_SIDECAR_UPSTREAM=http://127.0.0.1:8000/mcp",
        }),
        (None, Some((program, args))) => {
            let cwd = value(raw.upstream_cwd)
                .map(|d| {
                    if std::path::Path::new(&d).is_dir() {
                        Ok(PathBuf::from(d))
                    } else {
                        Err(invalid("upstream_cwd", &d))
                    }
                })
                .transpose()?;
            let env_allow = split_list(&value(raw.upstream_env).unwrap_or_default());
            if let Some(bad) = env_allow
                .iter()
                .find(|p| globset::Glob::new(p).is_err() || p.contains('='))
            {
                return Err(invalid("upstream_env", bad));
            }
            Ok(Transport::Stdio(StdioCommand {
                program: program.clone(),
                args: args.to_vec(),
                cwd,
                env_allow,
                env: Vec::new(),
                stop_grace: duration_in(
                    raw.upstream_stop_grace,
                    "upstream_stop_grace",
                    Duration::ZERO..=Duration::from_secs(600),
                )?,
                restart_max_delay: duration_in(
                    raw.upstream_restart_max_delay,
                    "upstream_restart_max_delay",
                    Duration::from_millis(10)..=Duration::from_secs(3600),
                )?,
                stdin_queue: number(raw.upstream_stdin_queue, "upstream_stdin_queue", 1..=65_536)?,
                stderr_rate: parsed(raw.upstream_stderr_rate, "upstream_stderr_rate", Rate::parse)?,
            }))
        }
    }
}

fn stdio<T>(c: &super::Config, f: impl FnOnce(&StdioCommand) -> T, http: &str) -> String
where
    T: ToString,
{
    match &c.upstream {
        Transport::Stdio(s) => f(s).to_string(),
        Transport::Http(_) => http.to_owned(),
    }
}

const HTTP: &str = "<not used: the upstream is an HTTP endpoint>";

pub(super) const STDIO: &[Setting] = &[
    setting(
        "upstream_command",
        &["EPODE_SIDECAR_UPSTREAM_COMMAND"],
        None,
        "a command line, split into words as a POSIX shell would (quotes and backslashes; no variables, globs or pipes)",
        "An MCP server to start and speak to over stdin/stdout (newline-delimited JSON-RPC), instead of `EPODE_SIDECAR_UPSTREAM`. Or give it on the command line after `--`: `epode-sidecar -- python server.py`. Restarted with backoff when it exits; stopped with the sidecar (SIGTERM to its process group, then SIGKILL after `EPODE_SIDECAR_UPSTREAM_STOP_GRACE`).",
        |c| stdio(c, StdioCommand::shown, "<unset: the upstream is an HTTP endpoint>"),
    ),
    setting(
        "upstream_cwd",
        &["EPODE_SIDECAR_UPSTREAM_CWD"],
        None,
        "an existing directory",
        "The working directory of the stdio MCP server (default: the sidecar's).",
        |c| {
            stdio(
                c,
                |s| {
                    s.cwd
                        .as_ref()
                        .map_or("<the sidecar's>".to_owned(), |d| d.display().to_string())
                },
                HTTP,
            )
        },
    ),
    setting(
        "upstream_env",
        &["EPODE_SIDECAR_UPSTREAM_ENV"],
        Some("PATH,HOME,USER,LOGNAME,LANG,LC_*,TZ,TMPDIR,TERM,PYTHON*,VIRTUAL_ENV,UV_*,NODE_OPTIONS,NODE_PATH,SSL_CERT_FILE,SSL_CERT_DIR"),
        "comma-separated variable names, `*` matching any characters (such as MYAPP_*)",
        "The sidecar's environment variables the stdio MCP server sees; no others. `EPODE_API_KEY`, `AGENT_FEEDBACK_KEY` and `EPODE_SIDECAR_*` are never passed, whatever this says. Add the server's own settings here (`PATH,HOME,MYAPP_*`).",
        |c| stdio(c, |s| s.env_allow.join(","), HTTP),
    ),
    setting(
        "upstream_stop_grace",
        &["EPODE_SIDECAR_UPSTREAM_STOP_GRACE"],
        Some("5s"),
        "a duration up to 10m, such as 5s",
        "At shutdown, the stdio MCP server's stdin is closed and its process group gets SIGTERM; whatever still runs after this long gets SIGKILL.",
        |c| stdio(c, |s| duration(s.stop_grace), HTTP),
    ),
    setting(
        "upstream_restart_max_delay",
        &["EPODE_SIDECAR_UPSTREAM_RESTART_MAX_DELAY"],
        Some("30s"),
        "a duration from 10ms to 1h, such as 30s",
        "A stdio MCP server that exits is restarted at once the first time, then after a pause that doubles from 100 ms up to this long while it keeps exiting within a minute of its start.",
        |c| stdio(c, |s| duration(s.restart_max_delay), HTTP),
    ),
    setting(
        "upstream_stdin_queue",
        &["EPODE_SIDECAR_UPSTREAM_STDIN_QUEUE"],
        Some("256"),
        "a whole number from 1 to 65536",
        "Messages waiting for the stdio MCP server to read its stdin, at most. A request that finds the queue full waits up to `EPODE_SIDECAR_UPSTREAM_TIMEOUT`, then gets 504: a server that stops reading never makes the sidecar buffer without bound.",
        |c| stdio(c, |s| s.stdin_queue, HTTP),
    ),
    setting(
        "upstream_stderr_rate",
        &["EPODE_SIDECAR_UPSTREAM_STDERR_RATE"],
        Some("20/s"),
        "a rate such as 20/s, 600/m or 1000/h",
        "Lines of the stdio MCP server's stderr written to the sidecar's log (target `epode_sidecar::upstream`, level info), at most; lines past it are counted and reported as one summary line.",
        |c| stdio(c, |s| s.stderr_rate.shown(), HTTP),
    ),
];
