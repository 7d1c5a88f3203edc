//! A stdio upstream: the MCP server the sidecar starts as its child and speaks to over
//! stdin/stdout, with the environment it may see and how it is restarted and stopped: its
//! settings and the [`StdioCommand`] built from them. Whether the upstream is this command or
//! an HTTP endpoint is decided where the two settings meet (`Config::read`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::setting::{
    a_duration, bounded, duration, number, read_all, setting, settings, split_list, Accepts, Bad,
    Layers, Refused,
};
use super::types::{Config, Rate, RunAs, StdioChildren, StdioCommand, UpstreamTransport};

/// The command to run: `program` and `args` (from the command line after `--`, or
/// `upstream_command`) with the other stdio settings.
pub(super) fn read(l: &Layers, program: &str, args: &[String]) -> Result<StdioCommand, Refused> {
    read_all!(StdioCommand {
        program: Ok(program.to_owned()),
        args: Ok(args.to_vec()),
        cwd: l.optional(&UPSTREAM_CWD),
        env_allow: l.optional(&UPSTREAM_ENV).map(Option::unwrap_or_default),
        env: Ok(Vec::new()),
        stop_grace: l.get(&UPSTREAM_STOP_GRACE),
        restart_max_delay: l.get(&UPSTREAM_RESTART_MAX_DELAY),
        stdin_queue: l.get(&UPSTREAM_STDIN_QUEUE),
        stderr_rate: l.get(&UPSTREAM_STDERR_RATE),
        run_as: user(l),
        children: children(l),
    })
}

/// A command line split into words as a POSIX shell would.
fn command_line(line: &str) -> Result<Vec<String>, Bad> {
    match shell_words::split(line) {
        Ok(words) if !words.is_empty() => Ok(words),
        _ => Err(Bad::Whole),
    }
}

fn directory(d: &str) -> Result<PathBuf, Bad> {
    if Path::new(d).is_dir() {
        Ok(PathBuf::from(d))
    } else {
        Err(Bad::Whole)
    }
}

/// Variable names and `*` patterns; `=` would mean the operator meant to set a value here.
fn env_allowlist(raw: &str) -> Result<Vec<String>, Bad> {
    let list = split_list(raw);
    match list
        .iter()
        .find(|p| globset::Glob::new(p).is_err() || p.contains('='))
    {
        Some(bad) => Err(Bad::Entry(bad.clone())),
        None => Ok(list),
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

/// Only root may start a process as another user: refused at start rather than at the
/// child's first spawn.
fn user(l: &Layers) -> Result<Option<RunAs>, Refused> {
    let Some(who) = l.optional(&UPSTREAM_USER)? else {
        return Ok(None);
    };
    if !nix::unistd::geteuid().is_root() {
        let text = l.text(&UPSTREAM_USER).unwrap_or_default();
        return Err(l.refuse(&UPSTREAM_USER.doc, UPSTREAM_USER.doc.invalid(&format!("{text}, while the sidecar does not run as root (only root may start a process as another user; run the sidecar as root, or leave this unset)"))));
    }
    Ok(Some(who))
}

/// `true` for `per-client`, `false` for `shared`.
fn per_client(mode: &str) -> Result<bool, Bad> {
    match mode {
        "shared" => Ok(false),
        "per-client" => Ok(true),
        _ => Err(Bad::Whole),
    }
}

fn children(l: &Layers) -> Result<StdioChildren, Refused> {
    let max = l.get(&STDIO_MAX_CHILDREN);
    let idle = l.get(&STDIO_CHILD_IDLE);
    if l.get_or_default(&STDIO_CHILDREN)? {
        Ok(StdioChildren::PerClient {
            max: max?,
            idle: idle?,
        })
    } else {
        // A bad maximum or idle time is listed all the same.
        Ok(StdioChildren::Shared)
    }
}

fn stdio<T>(c: &Config, f: impl FnOnce(&StdioCommand) -> T, http: &str) -> String
where
    T: ToString,
{
    match &c.upstream {
        UpstreamTransport::Stdio(s) => f(s).to_string(),
        UpstreamTransport::Http(_) => http.to_owned(),
    }
}

const HTTP: &str = "<not used: the upstream is an HTTP endpoint>";

settings! {
    /// A stdio upstream's settings.
    pub(super) STDIO {
        UPSTREAM_COMMAND: Vec<String> = setting(
            "upstream_command",
            &["EPODE_SIDECAR_UPSTREAM_COMMAND"],
            None,
            "a command line, split into words as a POSIX shell would (quotes and backslashes; no variables, globs or pipes)",
            "An MCP server to start and speak to over stdin/stdout (newline-delimited JSON-RPC), instead of `EPODE_SIDECAR_UPSTREAM`. Or give it on the command line after `--`: `epode-sidecar -- python server.py`. Restarted with backoff when it exits; stopped with the sidecar (SIGTERM to its process group, then SIGKILL after `EPODE_SIDECAR_UPSTREAM_STOP_GRACE`).",
            command_line,
            |c| stdio(c, StdioCommand::shown, "<unset: the upstream is an HTTP endpoint>"),
        ),
        UPSTREAM_CWD: PathBuf = setting(
            "upstream_cwd",
            &["EPODE_SIDECAR_UPSTREAM_CWD"],
            None,
            "an existing directory",
            "The working directory of the stdio MCP server (default: the sidecar's).",
            directory,
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
        UPSTREAM_ENV: Vec<String> = setting(
            "upstream_env",
            &["EPODE_SIDECAR_UPSTREAM_ENV"],
            Some("PATH,HOME,USER,LOGNAME,LANG,LC_*,TZ,TMPDIR,TERM,PYTHON*,VIRTUAL_ENV,UV_*,NODE_OPTIONS,NODE_PATH,SSL_CERT_FILE,SSL_CERT_DIR"),
            "comma-separated variable names, `*` matching any characters (such as MYAPP_*)",
            "The sidecar's environment variables the stdio MCP server sees; no others. `EPODE_API_KEY`, `AGENT_FEEDBACK_KEY` and `EPODE_SIDECAR_*` are never passed, whatever this says. Add the server's own settings here (`PATH,HOME,MYAPP_*`).",
            env_allowlist,
            |c| stdio(c, |s| s.env_allow.join(","), HTTP),
        ),
        UPSTREAM_STOP_GRACE: Duration = bounded(
            "upstream_stop_grace",
            &["EPODE_SIDECAR_UPSTREAM_STOP_GRACE"],
            Some("5s"),
            Accepts::duration(Duration::ZERO, Duration::from_secs(600), "5s"),
            "At shutdown, the stdio MCP server's stdin is closed and its process group gets SIGTERM; whatever still runs after this long gets SIGKILL.",
            a_duration,
            |c| stdio(c, |s| duration(s.stop_grace), HTTP),
        ),
        UPSTREAM_RESTART_MAX_DELAY: Duration = bounded(
            "upstream_restart_max_delay",
            &["EPODE_SIDECAR_UPSTREAM_RESTART_MAX_DELAY"],
            Some("30s"),
            Accepts::duration(Duration::from_millis(10), Duration::from_secs(3600), "30s"),
            "A stdio MCP server that exits is restarted at once the first time, then after a pause that doubles from 100 ms up to this long while it keeps exiting within a minute of its start.",
            a_duration,
            |c| stdio(c, |s| duration(s.restart_max_delay), HTTP),
        ),
        UPSTREAM_STDIN_QUEUE: usize = bounded(
            "upstream_stdin_queue",
            &["EPODE_SIDECAR_UPSTREAM_STDIN_QUEUE"],
            Some("256"),
            Accepts::whole("", 1, 65_536),
            "Messages waiting for the stdio MCP server to read its stdin, at most. A request that finds the queue full waits up to `EPODE_SIDECAR_UPSTREAM_WAIT`, then gets 503 with `Retry-After: 1` and a JSON-RPC error, nothing sent: a server that stops reading never makes the sidecar buffer without bound.",
            number,
            |c| stdio(c, |s| s.stdin_queue, HTTP),
        ),
        UPSTREAM_STDERR_RATE: Rate = setting(
            "upstream_stderr_rate",
            &["EPODE_SIDECAR_UPSTREAM_STDERR_RATE"],
            Some("20/s"),
            "a rate such as 20/s, 600/m or 1000/h",
            "Lines of the stdio MCP server's stderr written to the sidecar's log (target `epode_sidecar::upstream`, level info), at most; lines past it are counted and reported as one summary line.",
            |r| Rate::parse(r).ok_or(Bad::Whole),
            |c| stdio(c, |s| s.stderr_rate.shown(), HTTP),
        ),
        UPSTREAM_USER: RunAs = setting(
            "upstream_user",
            &["EPODE_SIDECAR_UPSTREAM_USER"],
            None,
            "a numeric user id, or UID:GID",
            "Runs the stdio MCP server as this user (and group; the user's number when not given), with no supplementary groups. The sidecar must run as root to switch. Use it where the key lives in a file (`--config`) that the server, as the sidecar's own user, could read.",
            |u| run_as(u).ok_or(Bad::Whole),
            |c| stdio(c, |s| s.run_as.map_or("<the sidecar's own>".to_owned(), |r| format!("{}:{}", r.uid, r.gid)), HTTP),
        ),
        STDIO_CHILDREN: bool = setting(
            "stdio_children",
            &["EPODE_SIDECAR_STDIO_CHILDREN"],
            Some("shared"),
            "shared or per-client",
            "`shared`: one stdio MCP server process for every client; the sidecar keeps their requests apart (its own unguessable ids; answers and cancellations only from the client that owns the request). `per-client`: a process per client credential (`Authorization`, `Cookie` or `X-API-Key`; clients without any share one), for servers that keep per-client state (roots, log level, subscriptions, a login) or ask the client questions mid-call while several clients are connected.",
            per_client,
            |c| stdio(c, |s| s.children.shown(), HTTP),
        ),
        STDIO_MAX_CHILDREN: usize = bounded(
            "stdio_max_children",
            &["EPODE_SIDECAR_STDIO_MAX_CHILDREN"],
            Some("16"),
            Accepts::whole("", 1, 1024),
            "With `per-client`, the most server processes at once: a new client makes the least recently used idle one stop; when all are busy, it gets 503 with `Retry-After`.",
            number,
            |c| stdio(c, |s| match s.children { StdioChildren::PerClient { max, .. } => max.to_string(), StdioChildren::Shared => "<not used: shared>".to_owned() }, HTTP),
        ),
        STDIO_CHILD_IDLE: Duration = bounded(
            "stdio_child_idle",
            &["EPODE_SIDECAR_STDIO_CHILD_IDLE"],
            Some("10m"),
            Accepts::duration(Duration::from_secs(1), Duration::from_secs(24 * 3600), "10m"),
            "With `per-client`, a client's server process unused this long (nothing in flight) is stopped; the client's next request starts a new one.",
            a_duration,
            |c| stdio(c, |s| match s.children { StdioChildren::PerClient { idle, .. } => duration(idle), StdioChildren::Shared => "<not used: shared>".to_owned() }, HTTP),
        ),
    }
}
