//! The child process: started in its own process group with only the allowed environment, its
//! stdin fed from a bounded queue, its stdout read line by line (each line bounded) and routed,
//! its stderr logged at a bounded rate. When it exits, every request written to it gets an
//! error at once and it is started again (at once the first time, then with a doubling
//! pause while it keeps exiting soon after its start). At shutdown its stdin is closed and its
//! process group gets SIGTERM, then SIGKILL after the grace period.

use std::process::Stdio;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use backon::BackoffBuilder as _;
use bytes::Bytes;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{mpsc, watch};

use super::{Generation, Shared};
use crate::config::StdioCommand;
use crate::error::{Error, Kind};

/// A child that ran this long before exiting is restarted at once.
const HEALTHY_RUN: Duration = Duration::from_secs(60);
/// The first pause between restarts of a child that keeps exiting.
const FIRST_PAUSE: Duration = Duration::from_millis(100);
/// How much of a line that is too long is kept, to find which request it answers.
const LONG_LINE_START: usize = 4096;
/// Longest stderr line logged (the rest is cut).
const MAX_STDERR_LINE: usize = 8192;

pub(super) fn spawn(command: &StdioCommand) -> std::io::Result<Child> {
    let mut cmd = Command::new(&command.program);
    cmd.args(&command.args)
        .env_clear()
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
    cmd.spawn()
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
    Stop,
}

/// Runs the child, restarting it until the sidecar stops.
pub(super) async fn supervise(shared: Arc<Shared>, command: StdioCommand, first: Child) {
    let mut stop = shared.stop.subscribe();
    let mut pauses = restart_pauses(&command);
    let mut next = Some(first);
    let mut n = 0;
    loop {
        let Some(child) = next.take() else { return };
        n += 1;
        let started = Instant::now();
        match run_once(&shared, &command, child, n, &mut stop).await {
            End::Stop => return,
            End::Exited(status) => {
                tracing::warn!(generation = n, %status, "the MCP server process exited; restarting it");
            }
            End::StdoutClosed => {
                tracing::warn!(
                    generation = n,
                    "the MCP server process closed its stdout; restarting it"
                );
            }
        }
        if started.elapsed() >= HEALTHY_RUN {
            pauses = restart_pauses(&command);
        }
        let mut pause = if n == 1 || started.elapsed() >= HEALTHY_RUN {
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

/// One run of the child, from its start to its end; every request still waiting on it gets
/// an error when it ends.
async fn run_once(
    shared: &Arc<Shared>,
    command: &StdioCommand,
    mut child: Child,
    n: u64,
    stop: &mut watch::Receiver<bool>,
) -> End {
    let pid = child.id();
    let (stdin_tx, stdin_rx) = mpsc::channel(command.stdin_queue);
    if let Some(stdin) = child.stdin.take() {
        tokio::spawn(feed(stdin, stdin_rx, shared.stop.subscribe()));
    }
    let mut reading = child
        .stdout
        .take()
        .map(|out| tokio::spawn(read_stdout(shared.clone(), n, out)));
    if let Some(err) = child.stderr.take() {
        tokio::spawn(log_stderr(err, pid, command.stderr_rate));
    }
    shared.live.send_replace(Some(Arc::new(Generation {
        n,
        stdin: stdin_tx,
        init: OnceLock::new(),
        init_lock: tokio::sync::Mutex::new(()),
        initialized: AtomicBool::new(false),
    })));
    tracing::info!(pid, generation = n, program = %command.program, "the MCP server process started");
    let end = tokio::select! {
        status = child.wait() => End::Exited(status.map_or_else(|e| e.to_string(), |s| s.to_string())),
        _ = async { match &mut reading { Some(r) => { let _ = r.await; } None => std::future::pending().await } } => End::StdoutClosed,
        _ = stop.wait_for(|s| *s) => End::Stop,
    };
    shared.live.send_replace(None);
    let end = match end {
        // Its stdout usually closes because it exited: say how, when it did.
        End::StdoutClosed => {
            match tokio::time::timeout(Duration::from_millis(200), child.wait()).await {
                Ok(Ok(status)) => End::Exited(status.to_string()),
                _ => End::StdoutClosed,
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
    };
    // Whatever it left behind in its process group goes with it.
    signal_group(pid, Signal::SIGKILL);
    let _ = child.wait().await;
    shared
        .lock()
        .fail_generation(n, || Error::new(Kind::UpstreamFailed, why.clone()));
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
/// (which closes the pipe: end of input, the stdio way to ask a server to exit).
async fn feed(
    mut stdin: ChildStdin,
    mut queue: mpsc::Receiver<Bytes>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let msg = tokio::select! {
            m = queue.recv() => m,
            _ = stop.wait_for(|s| *s) => None,
        };
        let Some(msg) = msg else { return };
        if stdin.write_all(&msg).await.is_err() {
            return;
        }
    }
}

/// What one bounded line read gave.
#[derive(Debug, PartialEq)]
pub(super) enum Line {
    Complete,
    /// Longer than the cap: the buffer holds only its start.
    TooLong,
    End,
}

/// Reads one line into `buf` (without its newline), holding at most `cap` bytes of it.
pub(super) async fn read_line<R: AsyncBufRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    cap: usize,
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
            let keep = LONG_LINE_START.saturating_sub(buf.len()).min(chunk.len());
            buf.extend_from_slice(&chunk[..keep]);
            buf.truncate(LONG_LINE_START);
            buf.shrink_to(LONG_LINE_START);
        } else if !too_long {
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

async fn read_stdout(shared: Arc<Shared>, n: u64, out: tokio::process::ChildStdout) {
    let mut reader = BufReader::with_capacity(64 * 1024, out);
    let mut buf = Vec::new();
    loop {
        match read_line(&mut reader, &mut buf, shared.max_line).await {
            Ok(Line::Complete) => {
                let text = buf.trim_ascii();
                if !text.is_empty() {
                    shared.on_line(n, text);
                }
            }
            Ok(Line::TooLong) => shared.on_long_line(&buf),
            Ok(Line::End) | Err(_) => return,
        }
        if buf.capacity() > 1024 * 1024 {
            buf = Vec::new();
        }
    }
}

/// Logs the child's stderr line by line, at most `rate`; lines past it are counted and the
/// count logged when logging resumes (and at the end).
async fn log_stderr(err: tokio::process::ChildStderr, pid: Option<u32>, rate: crate::config::Rate) {
    let quota = governor::Quota::with_period(rate.per / rate.count.get())
        .unwrap_or_else(|| governor::Quota::per_second(rate.count))
        .allow_burst(rate.count);
    let limiter = governor::RateLimiter::direct(quota);
    let mut reader = BufReader::new(err);
    let mut buf = Vec::new();
    let mut unlogged: u64 = 0;
    while let Ok(Line::Complete | Line::TooLong) =
        read_line(&mut reader, &mut buf, MAX_STDERR_LINE).await
    {
        if limiter.check().is_err() {
            unlogged += 1;
            continue;
        }
        if unlogged > 0 {
            tracing::warn!(target: "epode_sidecar::upstream", pid, unlogged, "lines of the MCP server's stderr were not logged (over EPODE_SIDECAR_UPSTREAM_STDERR_RATE)");
            unlogged = 0;
        }
        let text = String::from_utf8_lossy(buf.trim_ascii_end());
        tracing::info!(target: "epode_sidecar::upstream", pid, "{text}");
    }
    if unlogged > 0 {
        tracing::warn!(target: "epode_sidecar::upstream", pid, unlogged, "lines of the MCP server's stderr were not logged (over EPODE_SIDECAR_UPSTREAM_STDERR_RATE)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8], cap: usize) -> Vec<(Line, Vec<u8>)> {
        let mut r = BufReader::with_capacity(4, input);
        let mut buf = Vec::new();
        let mut out = Vec::new();
        loop {
            let l = read_line(&mut r, &mut buf, cap).await.unwrap();
            if l == Line::End {
                return out;
            }
            out.push((l, buf.clone()));
        }
    }

    #[tokio::test]
    async fn lines_are_bounded_and_the_stream_stays_in_step() {
        let mut input = b"{\"a\":1}\n".to_vec();
        input.extend(std::iter::repeat_n(b'x', 10_000));
        input.extend(b"\n{\"b\":2}\nlast");
        let got = lines(&input, 100).await;
        assert_eq!(got.len(), 4);
        assert_eq!(got[0], (Line::Complete, b"{\"a\":1}".to_vec()));
        assert_eq!(got[1].0, Line::TooLong);
        assert!(got[1].1.len() <= LONG_LINE_START && got[1].1.starts_with(b"xxxx"));
        assert_eq!(got[2], (Line::Complete, b"{\"b\":2}".to_vec()));
        assert_eq!(got[3], (Line::Complete, b"last".to_vec()));
    }
}
