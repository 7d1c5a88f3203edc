//! One gate for every resource counted in places: the connections a listener may hold open,
//! the MCP requests in flight, the connections to the upstream (and those being opened). A
//! place is taken with a [`Permit`] and given back when the permit is dropped; the count is a
//! `tokio::sync::Semaphore`, so a caller may also wait for a place in order of asking. A gate
//! may keep a gauge of the places taken. A refusal is counted by the caller, which knows its
//! limit's kind. (The memory budget counts bytes with other rules: `budget`.)

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A fixed number of places, shared by whoever holds a clone.
#[derive(Clone, Debug)]
pub(crate) struct Gate {
    places: Arc<Semaphore>,
    cap: usize,
    /// Places taken now, when someone shows it.
    gauge: Option<Gauge>,
}

/// One place taken; given back when dropped.
#[derive(Debug)]
pub(crate) struct Permit {
    _place: OwnedSemaphorePermit,
    gauge: Option<Gauge>,
}

impl Gate {
    /// `cap` places (at most [`Semaphore::MAX_PERMITS`]).
    pub(crate) fn new(cap: usize) -> Self {
        let cap = cap.min(Semaphore::MAX_PERMITS);
        Gate {
            places: Arc::new(Semaphore::new(cap)),
            cap,
            gauge: None,
        }
    }

    /// `cap` places, `gauge` counting those taken.
    pub(crate) fn with_gauge(cap: usize, gauge: Gauge) -> Self {
        Gate {
            gauge: Some(gauge),
            ..Gate::new(cap)
        }
    }

    /// A place now, or `None` when all are taken.
    pub(crate) fn try_enter(&self) -> Option<Permit> {
        let place = self.places.clone().try_acquire_owned().ok()?;
        Some(self.taken(place))
    }

    /// A place, once one is free (places go in order of asking).
    pub(crate) async fn enter(&self) -> Option<Permit> {
        // Fails only for a closed semaphore, and a gate never closes its own.
        let place = self.places.clone().acquire_owned().await.ok()?;
        Some(self.taken(place))
    }

    fn taken(&self, place: OwnedSemaphorePermit) -> Permit {
        if let Some(g) = &self.gauge {
            g.inc();
        }
        Permit {
            _place: place,
            gauge: self.gauge.clone(),
        }
    }

    /// Places taken now.
    pub(crate) fn held(&self) -> usize {
        self.cap.saturating_sub(self.places.available_permits())
    }

    /// Whether every place is taken.
    pub(crate) fn full(&self) -> bool {
        self.places.available_permits() == 0
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_bounded_and_given_back_when_dropped() {
        let gauge = Gauge::default();
        let gate = Gate::with_gauge(2, gauge.clone());
        let a = gate.try_enter().unwrap();
        let b = gate.clone().try_enter().unwrap();
        assert!(gate.try_enter().is_none(), "a clone shares the places");
        assert!(gate.full());
        assert_eq!((gate.held(), gauge.get()), (2, 2));
        drop(a);
        assert_eq!((gate.held(), gauge.get()), (1, 1));
        assert!(!gate.full());
        let c = gate.try_enter().unwrap();
        drop((b, c));
        assert_eq!((gate.held(), gauge.get()), (0, 0));
    }

    #[test]
    fn a_gate_without_places_refuses_everyone() {
        let gate = Gate::new(0);
        assert!(gate.try_enter().is_none());
        assert!(gate.full());
        assert_eq!(gate.held(), 0);
    }

    #[tokio::test]
    async fn a_waiter_gets_the_place_given_back() {
        use futures_util::FutureExt as _;
        let gate = Gate::new(1);
        let held = gate.try_enter().unwrap();
        let mut waiting = Box::pin(gate.enter());
        assert!((&mut waiting).now_or_never().is_none(), "no place yet");
        drop(held);
        let place = waiting.await.unwrap();
        assert_eq!(gate.held(), 1);
        drop(place);
        assert_eq!(gate.held(), 0);
    }
}
