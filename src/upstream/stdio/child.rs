//! The child process: started through the trampoline (`exec`) in its own process group with
//! only the allowed environment, its stdin fed from a bounded queue whose bytes count in the
//! memory budget, its stdout read line by line (each line bounded) and routed, its stderr
//! logged at a bounded rate. A child that exits, closes its stdin or stops reading it (a write
//! that makes no progress within the upstream timeout) has ended: every request written to it
//! gets an error at once naming why, its process group and anything it left behind are
//! stopped, and it is started again (at once the first time, then with a doubling pause while
//! it keeps ending soon after its start). At shutdown its stdin is closed and its process
//! group gets SIGTERM, then SIGKILL after the grace period.

use std::process::Stdio;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use backon::BackoffBuilder as _;
use bytes::Bytes;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, BufReader, Interest};
use tokio::net::unix::pipe;
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, oneshot, watch};

use super::exec;
use super::pipe::{next_generation, Generation, Pipe, Queued, StdioBounds};
use super::scan::IdScan;
use crate::config::{StdioChildren, StdioCommand};
use crate::error::{Error, ErrorKind};

/// A child that ends sooner than this after its start is said to exit at start.
const EXITS_AT_START: Duration = Duration::from_secs(5);
/// A child that ran this long before ending is restarted at once.
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// The first pause between restarts of a child that keeps ending.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// How much of a line that is too long is kept (for the log).
const LONG_LINE_START: usize = 4096;
/// Longest stderr line logged (the rest is cut).
const MAX_STDERR_LINE: usize = 8192;

/// Starts a pipe: its first child now (a command that cannot start is an error at once),
/// and the task that restarts it, on the runtime this is called on.
pub(super) fn start(command: &StdioCommand, bounds: &StdioBounds) -> Result<Arc<Pipe>, Error> {
    let first = spawn(command).map_err(|e| {
        Error::caused_by(
            ErrorKind::UpstreamUnreachable,
            format!("cannot start the MCP server `{}`", command.program),
            e,
        )
    })?;
    let pipe = Arc::new(Pipe::new(bounds));
    let task = tokio::spawn(supervise(pipe.clone(), command.clone(), first));
    pipe.supervised_by(task);
    Ok(pipe)
}

fn spawn(command: &StdioCommand) -> std::io::Result<Child> {
    let path = command
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| std::ffi::OsStr::new(v.as_str()));
    let program = exec::resolve(&command.program, path)?;
    let mut cmd = match exec::own_binary() {
        Some(me) => {
            let mut c = Command::new(me);
            // A child per client keeps what it starts (`exec`): when it stops, what is
            // reparented to the sidecar is known to be its own.
            let own_reaper = matches!(command.children, StdioChildren::PerClient { .. });
            c.args(exec::trampoline_args(
                &program,
                &command.args,
                command.run_as,
                own_reaper,
            ));
            c
        }
        None if command.run_as.is_some() => {
            return Err(std::io::Error::other(
                "/proc is not mounted, so the sidecar cannot switch the server's user",
            ))
        }
        None => {
            let mut c = Command::new(&program);
            c.args(&command.args);
            c
        }
    };
    cmd.env_clear()
        .envs(command.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a terminal's Ctrl-C reaches the sidecar only, which then
        // stops the child, and a signal to the group reaches its own children too.
        .process_group(0)
        .kill_on_drop(true);
    if let Some(dir) = &command.cwd {
        cmd.current_dir(dir);
    }
    exec::spawn_tracked(&mut cmd)
}

fn signal_group(pid: Option<u32>, signal: Signal) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        // ESRCH (nobody left in the group) is the expected end.
        let _ = killpg(Pid::from_raw(pid), signal);
    }
}

/// Why a child's run ended.
enum End {
    Exited(String),
    StdoutClosed,
    /// Its stdin: closed, or not read; the reason, for the requests that fail.
    Stdin(String),
    Stop,
}

/// Runs the child, restarting it until the sidecar stops.
async fn supervise(pipe: Arc<Pipe>, command: StdioCommand, first: Child) {
    let mut stop = pipe.stop.subscribe();
    let mut pauses = restart_pauses(&command);
    let mut next = Some(first);
    let mut runs = 0;
    loop {
        let Some(child) = next.take() else { return };
        runs += 1;
        let started = Instant::now();
        let end = run_once(&pipe, &command, child, &mut stop).await;
        let how = match &end {
            End::Stop => return,
            End::Exited(status) => format!("it exited ({status})"),
            End::StdoutClosed => "it closed its stdout".to_owned(),
            End::Stdin(why) => format!("it {why}"),
        };
        let ran = started.elapsed();
        let tail = pipe.stderr_tail();
        if ran < EXITS_AT_START {
            tracing::error!(
                ran = ?ran,
                stderr = %tail,
                "the MCP server process ended {:.1} s after it started ({how}): your server exits at start: check the command and its environment; restarting it",
                ran.as_secs_f64()
            );
        } else {
            tracing::warn!(stderr = %tail, "the MCP server process ended ({how}); restarting it");
        }
        pipe.ended(Some(format!(
            "{how} {:.1} s after it started; its last stderr lines: {}",
            ran.as_secs_f64(),
            if tail.is_empty() { "(none)" } else { &tail }
        )));
        if started.elapsed() >= HEALTHY_RUN {
            pauses = restart_pauses(&command);
        }
        let mut pause = if runs == 1 || started.elapsed() >= HEALTHY_RUN {
            Duration::ZERO
        } else {
            pauses.next().unwrap_or(command.restart_max_delay)
        };
        loop {
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            match spawn(&command) {
                Ok(c) => {
                    next = Some(c);
                    break;
                }
                Err(e) => {
                    tracing::error!(program = %command.program, error = %e, "cannot start the MCP server process");
                    pause = pauses.next().unwrap_or(command.restart_max_delay);
                }
            }
        }
    }
}

fn restart_pauses(command: &StdioCommand) -> impl Iterator<Item = Duration> {
    backon::ExponentialBuilder::default()
        .with_min_delay(FIRST_PAUSE)
        .with_max_delay(command.restart_max_delay)
        .with_factor(2.0)
        .without_max_times()
        .build()
}

/// Starts the tasks around a fresh child: its stdin, stdout and stderr. The receiver learns
/// when its stdin can no longer be written.
fn attach(pipe: &Arc<Pipe>, command: &StdioCommand, child: &mut Child, n: u64) -> Attached {
    let pid = child.id();
    let (stdin_tx, stdin_rx) = mpsc::channel(command.stdin_queue);
    let (broken_tx, broken) = oneshot::channel();
    if let Some(stdin) = child.stdin.take() {
        tokio::spawn(feed(
            stdin,
            stdin_rx,
            pipe.stop.subscribe(),
            pipe.timeout,
            broken_tx,
        ));
    }
    let reading = child
        .stdout
        .take()
        .map(|out| tokio::spawn(read_stdout(pipe.clone(), n, out)));
    let stderr = child
        .stderr
        .take()
        .map(|err| tokio::spawn(log_stderr(pipe.clone(), err, pid, command.stderr_rate)));
    let generation = Arc::new(Generation {
        n,
        stdin: stdin_tx,
        init: OnceLock::new(),
        init_lock: tokio::sync::Mutex::new(()),
        initialized: AtomicBool::new(false),
        answered: AtomicBool::new(false),
    });
    Attached {
        generation,
        reading,
        stderr,
        broken,
    }
}

/// The tasks around a running child.
struct Attached {
    generation: Arc<Generation>,
    reading: Option<tokio::task::JoinHandle<()>>,
    stderr: Option<tokio::task::JoinHandle<()>>,
    broken: oneshot::Receiver<String>,
}

/// One run of the child, from its start to its end; every request still waiting on it gets
/// an error when it ends.
async fn run_once(
    pipe: &Arc<Pipe>,
    command: &StdioCommand,
    mut child: Child,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let pid = child.id();
    let n = next_generation();
    let Attached {
        generation,
        mut reading,
        stderr,
        mut broken,
    } = attach(pipe, command, &mut child, n);
    pipe.live.send_replace(Some(generation));
    tracing::info!(pid, generation = n, program = %command.program, "the MCP server process started");
    let end = tokio::select! {
        status = child.wait() => End::Exited(status.map_or_else(|e| e.to_string(), |s| s.to_string())),
        _ = async { match &mut reading { Some(r) => { let _ = r.await; } None => std::future::pending().await } } => End::StdoutClosed,
        Ok(why) = &mut broken => End::Stdin(why),
        _ = stop.wait_for(|s| *s) => End::Stop,
    };
    pipe.live.send_replace(None);
    let end = match end {
        // Its stdout or stdin usually closes because it exited (a killed child's pipes close
        // as it dies, in no set order): say how, when it did.
        End::StdoutClosed | End::Stdin(_) => {
            match tokio::time::timeout(Duration::from_millis(200), child.wait()).await {
                Ok(Ok(status)) => End::Exited(status.to_string()),
                _ => end,
            }
        }
        other => other,
    };
    let why = match &end {
        End::Stop => {
            stop_child(&mut child, pid, command.stop_grace).await;
            "the sidecar is shutting down".to_owned()
        }
        End::Exited(status) => format!(
            "the MCP server process exited ({status}) before answering; it is being restarted"
        ),
        End::StdoutClosed => {
            "the MCP server process closed its stdout before answering; it is being restarted"
                .to_owned()
        }
        End::Stdin(why) => format!("the MCP server process {why}; it is being restarted"),
    };
    // Whatever it left behind in its process group goes with it.
    signal_group(pid, Signal::SIGKILL);
    let _ = child.wait().await;
    exec::untrack(pid);
    pipe.lock()
        .fail_generation(n, || Error::new(ErrorKind::UpstreamFailed, why.clone()));
    // Its last stderr lines, for the message about its end.
    if let Some(task) = stderr {
        let _ = tokio::time::timeout(Duration::from_millis(500), task).await;
    }
    if matches!(end, End::Stop) {
        pipe.ended(None);
    }
    end
}

/// SIGTERM to the process group (its stdin is already closed), then SIGKILL after `grace`.
async fn stop_child(child: &mut Child, pid: Option<u32>, grace: Duration) {
    signal_group(pid, Signal::SIGTERM);
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(status) => {
            let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
            tracing::info!(pid, %status, "the MCP server process stopped");
        }
        Err(_) => {
            tracing::warn!(pid, grace = ?grace, "the MCP server process did not stop after SIGTERM; killing it");
            signal_group(pid, Signal::SIGKILL);
        }
    }
}

/// Writes queued messages to the child's stdin until the child goes or the sidecar stops
/// (which closes the pipe: end of input, the stdio way to ask a server to exit). Messages
/// ready together leave in one write. A write that fails, one that makes no progress for
/// `stall`, or the child closing its end of the pipe (seen at once, even with nothing to
/// write) ends the child's run (`broken` says why).
async fn feed(
    stdin: ChildStdin,
    mut queue: mpsc::Receiver<Queued>,
    mut stop: watch::Receiver<bool>,
    stall: Duration,
    broken: oneshot::Sender<String>,
) {
    let stdin = match stdin.into_owned_fd().and_then(pipe::Sender::from_owned_fd) {
        Ok(s) => s,
        Err(e) => {
            let _ = broken.send(format!("could not be written to ({e})"));
            return;
        }
    };
    let mut batch = Vec::new();
    loop {
        let got = tokio::select! {
            n = queue.recv_many(&mut batch, 64) => n,
            ready = stdin.ready(Interest::ERROR) => {
                if ready.map_or(true, |r| r.is_error()) {
                    let _ = broken.send("closed its stdin".to_owned());
                    return;
                }
                continue;
            }
            _ = stop.wait_for(|s| *s) => 0,
        };
        if got == 0 {
            return;
        }
        let bytes: Vec<Bytes> = batch.drain(..).map(|(b, _held)| b).collect();
        let data = if bytes.len() == 1 {
            bytes.into_iter().next().unwrap_or_default()
        } else {
            Bytes::from(bytes.concat())
        };
        if let Err(why) = write_with_progress(&stdin, &data, stall).await {
            let _ = broken.send(why);
            return;
        }
    }
}

/// Writes `data`, each write having to make progress within `stall`.
async fn write_with_progress(
    stdin: &pipe::Sender,
    data: &[u8],
    stall: Duration,
) -> Result<(), String> {
    let mut at = 0;
    while at < data.len() {
        let wrote = tokio::time::timeout(stall, async {
            loop {
                stdin.writable().await?;
                match stdin.try_write(&data[at..]) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    other => return other,
                }
            }
        })
        .await;
        match wrote {
            Ok(Ok(0) | Err(_)) => return Err("closed its stdin".to_owned()),
            Ok(Ok(n)) => at += n,
            Err(_) => {
                return Err(format!(
                    "stopped reading its stdin (nothing read for {})",
                    humantime::format_duration(stall)
                ))
            }
        }
    }
    Ok(())
}

/// What one bounded line read gave.
#[derive(Debug, PartialEq)]
pub(super) enum Line {
    Complete,
    /// Longer than the cap: the buffer holds only its start; the scanner saw all of it.
    TooLong,
    End,
}

/// Reads one line into `buf` (without its newline), holding at most `cap` bytes of it. A line
/// past the cap is fed whole to `scan` (when given) as it streams past.
pub(super) async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    cap: usize,
    mut scan: Option<&mut IdScan>,
) -> std::io::Result<Line> {
    buf.clear();
    let mut too_long = false;
    loop {
        let available = r.fill_buf().await?;
        if available.is_empty() {
            return Ok(match (too_long, buf.is_empty()) {
                (true, _) => Line::TooLong,
                (false, true) => Line::End,
                (false, false) => Line::Complete,
            });
        }
        let (chunk, used, found) = match available.iter().position(|b| *b == b'\n') {
            Some(i) => (&available[..i], i + 1, true),
            None => (available, available.len(), false),
        };
        if !too_long && buf.len() + chunk.len() > cap {
            too_long = true;
            if let Some(s) = scan.as_deref_mut() {
                s.feed(buf);
            }
            let keep = LONG_LINE_START.saturating_sub(buf.len()).min(chunk.len());
            buf.extend_from_slice(&chunk[..keep]);
            buf.truncate(LONG_LINE_START);
            buf.shrink_to(LONG_LINE_START);
            if let Some(s) = scan.as_deref_mut() {
                s.feed(chunk);
            }
        } else if too_long {
            if let Some(s) = scan.as_deref_mut() {
                s.feed(chunk);
            }
        } else {
            buf.extend_from_slice(chunk);
        }
        r.consume(used);
        if found {
            return Ok(if too_long {
                Line::TooLong
            } else {
                Line::Complete
            });
        }
    }
}

async fn read_stdout(pipe: Arc<Pipe>, n: u64, out: tokio::process::ChildStdout) {
    let mut reader = BufReader::with_capacity(64 * 1024, out);
    let mut buf = Vec::new();
    loop {
        let mut scan = IdScan::new();
        match read_line(&mut reader, &mut buf, pipe.max_line, Some(&mut scan)).await {
            Ok(Line::Complete) => {
                let text = buf.trim_ascii();
                if !text.is_empty() {
                    pipe.on_line(n, text);
                }
            }
            Ok(Line::TooLong) => pipe.on_long_line(scan.id()),
            Ok(Line::End) | Err(_) => return,
        }
        if buf.capacity() > 1024 * 1024 {
            buf = Vec::new();
        }
    }
}

/// Logs the child's stderr line by line, at most `rate` lines: a line past it is counted, and
/// the count rides on the next line logged (and on one last line at the end), so the log
/// never gets more lines than the rate allows.
async fn log_stderr(
    pipe: Arc<Pipe>,
    err: tokio::process::ChildStderr,
    pid: Option<u32>,
    rate: crate::config::Rate,
) {
    let quota = governor::Quota::with_period(rate.per / rate.count.get())
        .unwrap_or_else(|| governor::Quota::per_second(rate.count))
        .allow_burst(rate.count);
    let limiter = governor::RateLimiter::direct(quota);
    let mut reader = BufReader::new(err);
    let mut buf = Vec::new();
    let mut unlogged: u64 = 0;
    while let Ok(Line::Complete | Line::TooLong) =
        read_line(&mut reader, &mut buf, MAX_STDERR_LINE, None).await
    {
        pipe.stderr_line(&String::from_utf8_lossy(buf.trim_ascii_end()));
        if limiter.check().is_err() {
            unlogged += 1;
            continue;
        }
        let text = String::from_utf8_lossy(buf.trim_ascii_end());
        if unlogged > 0 {
            tracing::info!(target: "epode_sidecar::upstream", pid, unlogged, "{text} (and {unlogged} earlier lines of the MCP server's stderr not logged: over EPODE_SIDECAR_UPSTREAM_STDERR_RATE)");
            unlogged = 0;
        } else {
            tracing::info!(target: "epode_sidecar::upstream", pid, "{text}");
        }
    }
    if unlogged > 0 {
        tracing::warn!(target: "epode_sidecar::upstream", pid, unlogged, "lines of the MCP server's stderr were not logged (over EPODE_SIDECAR_UPSTREAM_STDERR_RATE)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], cap: usize) -> Vec<(Line, Vec<u8>, Option<Vec<u8>>)> {
        let mut r = BufReader::with_capacity(4, input);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        loop {
            let mut scan = IdScan::new();
            let l = read_line(&mut r, &mut buf, cap, Some(&mut scan))
                .await
                .unwrap();
            if l == Line::End {
                return out;
            }
            out.push((l, buf.clone(), scan.id().map(<[u8]>::to_vec)));
        }
    }

    #[tokio::test]
    async fn lines_are_bounded_and_the_stream_stays_in_step() {
        let mut input = b"{\"a\":1}\n".to_vec();
        input.extend(br#"{"result":{"id":"x","t":""#);
        input.extend(std::iter::repeat_n(b'x', 10_000));
        input.extend(b"\"},\"id\":\"real\"}\n{\"b\":2}\nlast");
        let got = lines(&input, 100).await;
        assert_eq!(got.len(), 4);
        assert_eq!(got[0].0, Line::Complete);
        assert_eq!(got[0].1, b"{\"a\":1}".to_vec());
        assert_eq!(got[1].0, Line::TooLong);
        assert!(got[1].1.len() <= LONG_LINE_START && got[1].1.starts_with(b"{\"result\""));
        assert_eq!(
            got[1].2.as_deref(),
            Some(&br#""real""#[..]),
            "the top-level id"
        );
        assert_eq!(got[2].1, b"{\"b\":2}".to_vec());
        assert_eq!((&got[3].0, &got[3].1[..]), (&Line::Complete, &b"last"[..]));
    }
}
