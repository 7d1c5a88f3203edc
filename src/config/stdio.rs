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
    /// The user and group the child runs as (the sidecar must run as root to switch).
    pub(crate) run_as: Option<RunAs>,
    /// One child for every client, or one per client credential.
    pub(crate) children: StdioChildren,
}

/// A user and group for the child to run as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RunAs {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// How clients share the stdio MCP server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StdioChildren {
    /// One child process for every client (isolated by the sidecar's own ids and ownership).
    Shared,
    /// One child per client credential, at most `max` at once, each stopped after `idle`.
    PerClient { max: usize, idle: Duration },
}

impl StdioChildren {
    fn shown(&self) -> &'static str {
        match self {
            StdioChildren::Shared => "shared",
            StdioChildren::PerClient { .. } => "per-client",
        }
    }
}

/// `UID` or `UID:GID` (numbers; the group is the user's number when not given).
fn run_as(raw: &str) -> Option<RunAs> {
    let (uid, gid) = raw.split_once(':').unwrap_or((raw, raw));
    Some(RunAs {
        uid: uid.trim().parse().ok()?,
        gid: gid.trim().parse().ok()?,
    })
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
    pub(super) upstream_user: Option<Scalar>,
    pub(super) stdio_children: Option<Scalar>,
    pub(super) stdio_max_children: Option<Scalar>,
    pub(super) stdio_child_idle: Option<Scalar>,
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
                run_as: user(raw.upstream_user)?,
                children: children(raw.stdio_children, raw.stdio_max_children, raw.stdio_child_idle)?,
            }))
        }
    }
}

fn user(raw: Option<Scalar>) -> Result<Option<RunAs>, ConfigError> {
    let Some(text) = value(raw) else {
        return Ok(None);
    };
    let Some(who) = run_as(&text) else {
        return Err(invalid("upstream_user", &text));
    };
    if !nix::unistd::geteuid().is_root() {
        return Err(invalid(
            "upstream_user",
            &format!("{text}, while the sidecar does not run as root (only root may start a process as another user; run the sidecar as root, or leave this unset)"),
        ));
    }
    Ok(Some(who))
}

fn children(
    mode: Option<Scalar>,
    max: Option<Scalar>,
    idle: Option<Scalar>,
) -> Result<StdioChildren, ConfigError> {
    let max = number(max, "stdio_max_children", 1..=1024)?;
    let idle = duration_in(
        idle,
        "stdio_child_idle",
        Duration::from_secs(1)..=Duration::from_secs(24 * 3600),
    )?;
    match value(mode).as_deref() {
        None | Some("shared") => Ok(StdioChildren::Shared),
        Some("per-client") => Ok(StdioChildren::PerClient { max, idle }),
        Some(other) => Err(invalid("stdio_children", other)),
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
        "Messages waiting for the stdio MCP server to read its stdin, at most. A request that finds the queue full waits up to `EPODE_SIDECAR_UPSTREAM_WAIT`, then gets 503 with `Retry-After: 1` and a JSON-RPC error, nothing sent: a server that stops reading never makes the sidecar buffer without bound.",
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
    setting(
        "upstream_user",
        &["EPODE_SIDECAR_UPSTREAM_USER"],
        None,
        "a numeric user id, or UID:GID",
        "Runs the stdio MCP server as this user (and group; the user's number when not given), with no supplementary groups. The sidecar must run as root to switch. Use it where the key lives in a file (`--config`) that the server, as the sidecar's own user, could read.",
        |c| stdio(c, |s| s.run_as.map_or("<the sidecar's own>".to_owned(), |r| format!("{}:{}", r.uid, r.gid)), HTTP),
    ),
    setting(
        "stdio_children",
        &["EPODE_SIDECAR_STDIO_CHILDREN"],
        Some("shared"),
        "shared or per-client",
        "`shared`: one stdio MCP server process for every client; the sidecar keeps their requests apart (its own unguessable ids; answers and cancellations only from the client that owns the request). `per-client`: a process per client credential (`Authorization`, `Cookie` or `X-API-Key`; clients without any share one), for servers that keep per-client state (roots, log level, subscriptions, a login) or ask the client questions mid-call while several clients are connected.",
        |c| stdio(c, |s| s.children.shown(), HTTP),
    ),
    setting(
        "stdio_max_children",
        &["EPODE_SIDECAR_STDIO_MAX_CHILDREN"],
        Some("16"),
        "a whole number from 1 to 1024",
        "With `per-client`, the most server processes at once: a new client makes the least recently used idle one stop; when all are busy, it gets 503 with `Retry-After`.",
        |c| stdio(c, |s| match s.children { StdioChildren::PerClient { max, .. } => max.to_string(), StdioChildren::Shared => "<not used: shared>".to_owned() }, HTTP),
    ),
    setting(
        "stdio_child_idle",
        &["EPODE_SIDECAR_STDIO_CHILD_IDLE"],
        Some("10m"),
        "a duration from 1s to 24h, such as 10m",
        "With `per-client`, a client's server process unused this long (nothing in flight) is stopped; the client's next request starts a new one.",
        |c| stdio(c, |s| match s.children { StdioChildren::PerClient { idle, .. } => duration(idle), StdioChildren::Shared => "<not used: shared>".to_owned() }, HTTP),
    ),
];
