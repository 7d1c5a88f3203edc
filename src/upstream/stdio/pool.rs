//! A child per client (`EPODE_SIDECAR_STDIO_CHILDREN=per-client`): for servers that keep
//! per-client state (roots, a log level, subscriptions, a login) and assume one client per
//! process. Each caller (see `crate::caller`: its verified token, its credentials, or its
//! address) gets its own child, started on first use, from a bounded pool (the child started
//! with the sidecar answers readiness probes, and is the first to make room): when
//! it is full, the least recently used child with nothing in flight makes room; when every
//! child is busy, the request gets 503. A child unused for the idle time is stopped. Each child
//! has the restart, budget and isolation rules of a shared one. Children are started on the
//! runtime the pool was made on (the main one), so their supervisors outlive any worker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::child;
use super::pipe::{Pipe, StdioBounds};
use crate::caller::{Caller, CallerKey};
use crate::config::StdioCommand;
use crate::error::{Error, ErrorKind};
use crate::ledger::{self, Charge, Ledger};

/// How long a child that has not answered anything yet counts as starting, not idle.
const START_PATIENCE: Duration = Duration::from_secs(30);

struct Entry {
    pipe: Arc<Pipe>,
    used: Instant,
    /// Its place in the ledger, charged to its caller (the sidecar's, until one takes it).
    _place: Option<Charge>,
}

/// A child's place in the pool: its caller's, or `None` for the sidecar's own (started with
/// it, for readiness: it makes room first).
type Place = Option<CallerKey>;

/// The pool's children by caller, and what it needs to start and stop them.
struct ChildSlots {
    command: StdioCommand,
    bounds: StdioBounds,
    max: usize,
    idle: Duration,
    children: Mutex<HashMap<Place, Entry>>,
    /// One start at a time, so two requests of a new client start one child.
    starting: tokio::sync::Mutex<()>,
    runtime: tokio::runtime::Handle,
    /// Whether a child stopped for room or idleness had answered: readiness then holds with
    /// no child running, and no child is started just to answer a probe.
    answered_before: AtomicBool,
    /// Where each child is charged to its caller.
    ledger: Arc<Ledger>,
}

pub(super) struct Pool {
    slots: Arc<ChildSlots>,
    sweeper: tokio::task::JoinHandle<()>,
}

impl ChildSlots {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Place, Entry>> {
        self.children.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The caller's child.
    fn find(&self, key: CallerKey) -> Option<Arc<Pipe>> {
        let mut children = self.lock();
        let entry = children.get_mut(&Some(key))?;
        entry.used = Instant::now();
        Some(entry.pipe.clone())
    }

    /// Remembers that `pipe`, about to stop, had answered.
    fn note_answered(&self, pipe: &Pipe) {
        if pipe.has_answered() {
            self.answered_before.store(true, Ordering::Relaxed);
        }
    }

    /// Makes room for one more child: the least recently used idle one goes.
    fn make_room(&self) -> Result<(), Error> {
        let mut children = self.lock();
        if children.len() < self.max {
            return Ok(());
        }
        let victim = children
            .iter()
            .filter(|(_, e)| !e.pipe.busy())
            .min_by_key(|(_, e)| e.used)
            .map(|(k, _)| *k);
        let Some(entry) = victim.and_then(|k| children.remove(&k)) else {
            return Err(Error::new(
                ErrorKind::Overloaded { retry_after: 1 },
                "every MCP server process it may run (EPODE_SIDECAR_STDIO_MAX_CHILDREN) is busy with another client's requests",
            )
            .unsent());
        };
        self.note_answered(&entry.pipe);
        self.runtime.spawn(async move { entry.pipe.stop().await });
        Ok(())
    }
}

impl Pool {
    /// A pool holding `first` (started with the sidecar, for readiness: no caller's).
    pub(super) fn new(
        command: StdioCommand,
        bounds: StdioBounds,
        first: Arc<Pipe>,
        (max, idle): (usize, Duration),
        ledger: Arc<Ledger>,
    ) -> Self {
        let mut children = HashMap::new();
        children.insert(
            None,
            Entry {
                pipe: first,
                used: Instant::now(),
                _place: ledger
                    .try_charge(ledger::Pool::Children, Caller::internal().key())
                    .ok(),
            },
        );
        let slots = Arc::new(ChildSlots {
            command,
            bounds,
            max: max.max(1),
            idle,
            children: Mutex::new(children),
            starting: tokio::sync::Mutex::new(()),
            runtime: tokio::runtime::Handle::current(),
            answered_before: AtomicBool::new(false),
            ledger,
        });
        let sweeper = tokio::spawn(sweep(Arc::downgrade(&slots)));
        Pool { slots, sweeper }
    }

    /// The child of caller `key`, started when it has none.
    pub(super) async fn get(&self, key: CallerKey) -> Result<Arc<Pipe>, Error> {
        if let Some(pipe) = self.slots.find(key) {
            return Ok(pipe);
        }
        let _one = self.slots.starting.lock().await;
        if let Some(pipe) = self.slots.find(key) {
            return Ok(pipe);
        }
        self.slots.make_room()?;
        self.start(Some(key)).await
    }

    /// Starts a child for `place` (room was made for it).
    async fn start(&self, place: Place) -> Result<Arc<Pipe>, Error> {
        let slots = self.slots.clone();
        let started = self
            .slots
            .runtime
            .spawn(async move { child::start(&slots.command, &slots.bounds) })
            .await
            .map_err(|e| Error::caused_by(ErrorKind::Internal, "starting a child", e))??;
        let charged = place.unwrap_or_else(|| Caller::internal().key());
        self.slots.lock().insert(
            place,
            Entry {
                pipe: started.clone(),
                used: Instant::now(),
                _place: self
                    .slots
                    .ledger
                    .try_charge(ledger::Pool::Children, charged)
                    .ok(),
            },
        );
        Ok(started)
    }

    /// The child used most recently (for readiness); when none runs, `None` if a child
    /// stopped before had answered (a probe must not start a process, nor take a client's
    /// place in the pool), else one no caller has yet, started now.
    pub(super) async fn any(&self) -> Result<Option<Arc<Pipe>>, Error> {
        let newest = {
            let children = self.slots.lock();
            children
                .values()
                .max_by_key(|e| e.used)
                .map(|e| e.pipe.clone())
        };
        match newest {
            Some(pipe) => Ok(Some(pipe)),
            None if self.slots.answered_before.load(Ordering::Relaxed) => Ok(None),
            None => {
                let _one = self.slots.starting.lock().await;
                if let Some(e) = self.slots.lock().get(&None) {
                    return Ok(Some(e.pipe.clone()));
                }
                self.slots.make_room()?;
                self.start(None).await.map(Some)
            }
        }
    }

    /// Stops every child and waits until they are gone.
    pub(super) async fn shutdown(&self) {
        self.sweeper.abort();
        let pipes: Vec<Arc<Pipe>> = self.slots.lock().drain().map(|(_, e)| e.pipe).collect();
        futures_util::future::join_all(pipes.iter().map(|p| p.stop())).await;
    }
}

/// Stops the children unused for the idle time, now and then, while the pool lives.
async fn sweep(pool: std::sync::Weak<ChildSlots>) {
    let every = {
        let Some(p) = pool.upgrade() else { return };
        (p.idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(30))
    };
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let Some(p) = pool.upgrade() else { return };
        let idle: Vec<Arc<Pipe>> = {
            let mut children = p.lock();
            let gone: Vec<Place> = children
                .iter()
                .filter(|(_, e)| {
                    let unused = e.used.elapsed();
                    // A child that has not answered yet may still be starting (a Python
                    // server on a loaded machine takes seconds): it is idle only later.
                    let idle = if e.pipe.has_answered() {
                        p.idle
                    } else {
                        p.idle.max(START_PATIENCE)
                    };
                    unused >= idle && !e.pipe.busy()
                })
                .map(|(k, _)| *k)
                .collect();
            gone.iter()
                .filter_map(|k| children.remove(k))
                .map(|e| e.pipe)
                .inspect(|pipe| p.note_answered(pipe))
                .collect()
        };
        for pipe in idle {
            tracing::info!(
                "stopping an MCP server process idle for {}",
                humantime::format_duration(p.idle)
            );
            pipe.stop().await;
        }
    }
}
