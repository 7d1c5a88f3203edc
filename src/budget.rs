//! One memory budget for everything the sidecar buffers at once (request bodies, upstream
//! answers it must parse, SSE events it must rewrite, Epode answers), so no combination of
//! clients and upstream answers can push the process past it. Bytes are taken from the budget
//! as they arrive and given back when the holder is dropped. A holder past [`SMALL`] bytes may
//! use only three quarters of the budget: a crowd of large bodies cannot starve the small
//! requests and answers that make up normal traffic. Bytes on their way to a client stay
//! counted until their memory is freed, wherever they then are ([`keep`], [`counted`]): in a
//! response body, or in a connection's write buffer waiting for a slow client.
//!
//! Not a `gate` (a semaphore), though it counts too: whether bytes may be taken depends on
//! the holder's size (past [`SMALL`], only while the total stays within three quarters), which
//! a semaphore's "are there n permits" cannot say; bytes already in memory are counted even
//! past the limit ([`counted`]), which a semaphore cannot go below zero for; and a reservation
//! grows and shrinks in place as a body arrives.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

/// What a holder may take from the whole budget; past it, only three quarters.
pub(crate) const SMALL: usize = 64 * 1024;

/// One budget of bytes for everything the sidecar holds at once.
#[derive(Debug)]
pub(crate) struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
}

/// Bytes taken from the budget; given back when dropped.
#[derive(Debug)]
pub(crate) struct Reservation {
    budget: Arc<MemoryBudget>,
    held: usize,
}

impl MemoryBudget {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(MemoryBudget {
            limit,
            used: AtomicUsize::new(0),
        })
    }

    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// An empty reservation that grows as bytes arrive.
    pub(crate) fn start(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: self.clone(),
            held: 0,
        }
    }

    /// Takes `n` bytes for a holder that will then hold `held` in all.
    fn take(&self, n: usize, held: usize) -> bool {
        let ceiling = if held > SMALL {
            self.limit / 4 * 3
        } else {
            self.limit
        };
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(n).filter(|total| *total <= ceiling)
            })
            .is_ok()
    }
}

impl Reservation {
    /// Holds exactly `n` bytes (growing or giving back); false (changing nothing) when the
    /// budget would be passed.
    pub(crate) fn resize(&mut self, n: usize) -> bool {
        if n <= self.held {
            self.budget.used.fetch_sub(self.held - n, Ordering::AcqRel);
            self.held = n;
            return true;
        }
        self.grow(n - self.held)
    }

    /// Takes `n` more bytes; false (taking nothing) when the budget would be passed.
    pub(crate) fn grow(&mut self, n: usize) -> bool {
        if self.budget.take(n, self.held + n) {
            self.held += n;
            true
        } else {
            false
        }
    }

    /// The budget this reservation is taken from.
    pub(crate) fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.held, Ordering::AcqRel);
    }
}

/// Bytes that hold their reservation until the last piece of them is dropped (pieces split
/// off them share their memory, so it is freed only then): wherever they go, a response body
/// or a connection's write buffer, they stay counted until written.
pub(crate) fn keep(bytes: Bytes, reservation: Reservation) -> Bytes {
    Bytes::from_owner(Counted {
        bytes,
        _reservation: reservation,
    })
}

/// Bytes already in memory, counted in `budget` from now on until the last piece of them is
/// dropped. They are counted even past the budget (they exist already; what comes next is
/// refused instead).
pub(crate) fn counted(budget: &Arc<MemoryBudget>, bytes: Bytes) -> Bytes {
    let held = bytes.len();
    budget.used.fetch_add(held, Ordering::AcqRel);
    keep(
        bytes,
        Reservation {
            budget: budget.clone(),
            held,
        },
    )
}

struct Counted {
    bytes: Bytes,
    _reservation: Reservation,
}

impl AsRef<[u8]> for Counted {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Why a body could not be read whole.
#[derive(Debug)]
pub(crate) enum Collect {
    /// Larger than its own cap.
    TooLarge,
    /// The memory budget is spent.
    OverBudget,
    /// Not complete within the deadline.
    TimedOut,
    Failed(String),
}

/// Reads a body whole, at most `cap` bytes, each byte counted in the budget, within `within`.
/// The bytes come back with their reservation, which the caller holds as long as the bytes.
pub(crate) async fn collect<B>(
    body: B,
    cap: usize,
    budget: &Arc<MemoryBudget>,
    within: Duration,
) -> Result<(Bytes, Reservation), Collect>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut reservation = budget.start();
    let read = read_all(body, cap, &mut reservation);
    match tokio::time::timeout(within, read).await {
        Ok(Ok(bytes)) => Ok((bytes, reservation)),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Collect::TimedOut),
    }
}

async fn read_all<B>(
    mut body: B,
    cap: usize,
    reservation: &mut Reservation,
) -> Result<Bytes, Collect>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    // A declared length is checked and reserved before anything is read, and the buffer is
    // allocated once; otherwise the buffer's capacity, not just its length, is counted.
    let mut buf = match body.size_hint().exact() {
        Some(n) if n > cap as u64 => return Err(Collect::TooLarge),
        Some(n) => {
            let n = n as usize;
            if !reservation.grow(n) {
                return Err(Collect::OverBudget);
            }
            BytesMut::with_capacity(n)
        }
        None => BytesMut::new(),
    };
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Collect::Failed(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let len = buf.len() + data.len();
        if len > cap {
            return Err(Collect::TooLarge);
        }
        if len > buf.capacity() {
            let grown = len.max(buf.capacity().saturating_mul(2)).min(cap);
            if !reservation.resize(grown.max(reservation.held)) {
                return Err(Collect::OverBudget);
            }
            buf.reserve(grown - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_shared_and_given_back() {
        let budget = MemoryBudget::new(100);
        let mut a = budget.start();
        let mut b = budget.start();
        assert!(a.grow(60));
        assert!(!b.grow(50), "the sum may not pass the budget");
        assert!(b.grow(40));
        assert_eq!(budget.used(), 100);
        drop(a);
        assert_eq!(budget.used(), 40);
        assert!(b.grow(60));
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn large_holders_leave_a_quarter_for_small_ones() {
        let budget = MemoryBudget::new(4 * SMALL * 4);
        let mut large = Vec::new();
        loop {
            let mut r = budget.start();
            if !r.grow(SMALL * 2) {
                break;
            }
            large.push(r);
        }
        assert_eq!(
            budget.used(),
            4 * SMALL * 3,
            "large holders stop at three quarters"
        );
        let mut small = budget.start();
        assert!(small.grow(SMALL), "a small holder still fits");
    }

    #[test]
    fn kept_bytes_stay_counted_until_their_last_piece_is_dropped() {
        let budget = MemoryBudget::new(1 << 20);
        let mut r = budget.start();
        assert!(r.grow(1000));
        let mut kept = keep(Bytes::from(vec![b'x'; 1000]), r);
        let head = kept.split_to(400);
        let tail = kept.split_off(300);
        drop(kept);
        assert_eq!(budget.used(), 1000, "pieces still held");
        drop(head);
        assert_eq!(budget.used(), 1000);
        drop(tail);
        assert_eq!(budget.used(), 0);
        // Bytes already in memory are counted even past the budget.
        let small = MemoryBudget::new(10);
        let counted = counted(&small, Bytes::from_static(&[1; 64]));
        assert_eq!(small.used(), 64);
        drop(counted);
        assert_eq!(small.used(), 0);
    }

    #[tokio::test]
    async fn collect_honours_cap_and_budget() {
        let budget = MemoryBudget::new(1024);
        let body = http_body_util::Full::new(Bytes::from(vec![b'x'; 512]));
        let (bytes, r) = collect(body, 600, &budget, Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!((bytes.len(), r.held(), budget.used()), (512, 512, 512));
        let too_big = http_body_util::Full::new(Bytes::from(vec![b'x'; 700]));
        assert!(matches!(
            collect(too_big, 600, &budget, Duration::from_secs(1)).await,
            Err(Collect::TooLarge)
        ));
        let over = http_body_util::Full::new(Bytes::from(vec![b'x'; 600]));
        assert!(matches!(
            collect(over, 1000, &budget, Duration::from_secs(1)).await,
            Err(Collect::OverBudget)
        ));
        drop(r);
        assert_eq!(budget.used(), 0);
    }
}
