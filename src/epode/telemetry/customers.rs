//! Which batches may be in flight together, by the customers they name.
//!
//! The real Epode locks every customer a batch names (an advisory lock per identity ref, then
//! the customer row), in the batch's interaction-id order, and holds the locks until the batch
//! commits. Batches in flight that wait on each other in a cycle deadlock there (one of them
//! fails with a 500 after about a second). A wait-for cycle needs a cycle in the graph whose
//! nodes are the batches in flight and the customers they name, an edge joining a batch to
//! each customer it names: batch X holds A and waits for B, held by Y, which waits for A. So
//! the batches in flight are kept a forest: a batch may join them when each group of batches
//! already connected through shared customers shares at most one customer with it. Many
//! batches naming one hot customer (a star) all go at once (Epode serialises them on that one
//! lock, without deadlock); two batches that both name A and B never do.
//!
//! The groups are found with a union-find over the customers the batches in flight name,
//! rebuilt when a delivery starts or ends (at most `concurrency × batch × 4` keys).

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher as _, Hash as _, Hasher as _};

use tokio::task;

use super::event::TelemetryEvent;
use crate::feedback::identity::RefKind;

/// The identity references of an event that name a customer (its session is locked in a
/// sorted order by Epode, so it is not one), as keys.
pub(super) fn customer_keys(event: &TelemetryEvent) -> Vec<u64> {
    static HASHER: std::sync::OnceLock<std::collections::hash_map::RandomState> =
        std::sync::OnceLock::new();
    let hasher = HASHER.get_or_init(Default::default);
    event
        .refs()
        .iter()
        .filter(|(kind, _)| *kind != RefKind::Session)
        .map(|(kind, value)| {
            let field = kind.key();
            let mut h = hasher.build_hasher();
            field.hash(&mut h);
            value.hash(&mut h);
            h.finish()
        })
        .collect()
}

/// The customers of the batches in flight.
#[derive(Default)]
pub(super) struct InFlight {
    batches: HashMap<task::Id, Vec<u64>>,
    /// Union-find over the keys the batches in flight name: a batch joins its keys in one
    /// group. Rebuilt from `batches` when stale.
    parent: HashMap<u64, u64>,
    stale: bool,
    /// How many times the groups were rebuilt.
    rebuilds: u64,
}

/// The batch being formed: the customers it names, and the groups in flight it touches.
#[derive(Default)]
pub(super) struct Forming {
    keys: HashSet<u64>,
    touched: HashSet<u64>,
    /// The groups were found before the last rebuild: find them again.
    seen_at: u64,
}

impl InFlight {
    pub(super) fn started(&mut self, id: task::Id, keys: Vec<u64>) {
        self.batches.insert(id, keys);
        self.stale = true;
    }

    pub(super) fn ended(&mut self, id: task::Id) {
        if self.batches.remove(&id).is_some() {
            self.stale = true;
        }
    }

    /// Whether an event naming `keys` may join the batch being formed without two batches in
    /// flight together closing a cycle through their customers; if so, it joins.
    pub(super) fn admit(&mut self, forming: &mut Forming, keys: &[u64]) -> bool {
        self.refresh(forming);
        let mut groups = Vec::new();
        for k in keys {
            if forming.keys.contains(k) {
                continue;
            }
            if let Some(group) = self.group_of(*k) {
                // A second way into a group already reached: a cycle.
                if forming.touched.contains(&group) || groups.contains(&group) {
                    return false;
                }
                groups.push(group);
            }
        }
        forming.touched.extend(groups);
        forming.keys.extend(keys.iter().copied());
        true
    }

    /// The customer keys the batch names, to hold while it is in flight.
    pub(super) fn keys(forming: Forming) -> Vec<u64> {
        forming.keys.into_iter().collect()
    }

    /// Rebuilds the groups if a delivery started or ended; the batch being formed finds its
    /// groups again (with fewer batches in flight, what it was allowed stays allowed).
    fn refresh(&mut self, forming: &mut Forming) {
        if self.stale {
            self.parent.clear();
            for keys in self.batches.values() {
                let Some(first) = keys.first() else { continue };
                let root = find(&mut self.parent, *first);
                for k in &keys[1..] {
                    let other = find(&mut self.parent, *k);
                    if other != root {
                        self.parent.insert(other, root);
                    }
                }
            }
            self.stale = false;
            self.rebuilds += 1;
        }
        if forming.seen_at != self.rebuilds {
            forming.seen_at = self.rebuilds;
            let keys: Vec<u64> = forming.keys.iter().copied().collect();
            forming.touched = keys.into_iter().filter_map(|k| self.group_of(k)).collect();
        }
    }

    /// The group of a key some batch in flight names.
    fn group_of(&mut self, key: u64) -> Option<u64> {
        self.parent
            .contains_key(&key)
            .then(|| find(&mut self.parent, key))
    }
}

/// The root of `key`'s group (adding it as a group of its own), halving the path.
fn find(parent: &mut HashMap<u64, u64>, key: u64) -> u64 {
    let mut k = key;
    loop {
        let p = *parent.entry(k).or_insert(k);
        if p == k {
            return k;
        }
        let gp = *parent.get(&p).unwrap_or(&p);
        parent.insert(k, gp);
        k = gp;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch formed from `events` (each a list of customer keys): the keys of the events
    /// admitted, and the events refused.
    fn form(f: &mut InFlight, events: &[&[u64]]) -> (Vec<u64>, Vec<usize>) {
        let mut forming = Forming::default();
        let refused = events
            .iter()
            .enumerate()
            .filter(|(_, keys)| !f.admit(&mut forming, keys))
            .map(|(i, _)| i)
            .collect();
        let mut keys = InFlight::keys(forming);
        keys.sort_unstable();
        (keys, refused)
    }

    /// Task ids for the tests (a task's id is the only way to make one).
    async fn ids(n: usize) -> Vec<task::Id> {
        let mut set = task::JoinSet::new();
        (0..n).map(|_| set.spawn(async {}).id()).collect()
    }

    #[tokio::test]
    async fn one_hot_customer_lets_every_batch_go() {
        let mut f = InFlight::default();
        for (i, id) in (100..).zip(ids(8).await) {
            // Each also names a user of its own.
            let (keys, refused) = form(&mut f, &[&[1], &[1, i]]);
            assert!(refused.is_empty(), "a star has no cycle");
            f.started(id, keys);
        }
    }

    #[tokio::test]
    async fn two_batches_naming_the_same_two_customers_never_fly_together() {
        let ids = ids(2).await;
        let mut f = InFlight::default();
        let (keys, refused) = form(&mut f, &[&[1], &[2]]);
        assert!(refused.is_empty());
        f.started(ids[0], keys);
        // The second may name one of them, not both.
        let (keys, refused) = form(&mut f, &[&[2], &[1], &[3]]);
        assert_eq!(refused, [1]);
        assert_eq!(keys, [2, 3]);
        // One event naming both (an account and its user) is refused whole.
        let (_, refused) = form(&mut f, &[&[1, 2]]);
        assert_eq!(refused, [0]);
        // Once the first has ended, both go.
        f.ended(ids[0]);
        let (keys, refused) = form(&mut f, &[&[1], &[2]]);
        assert!(refused.is_empty());
        assert_eq!(keys, [1, 2]);
    }

    #[tokio::test]
    async fn a_cycle_through_three_batches_is_refused() {
        let ids = ids(2).await;
        let mut f = InFlight::default();
        f.started(ids[0], vec![1, 2]); // X names A and B
        let (keys, refused) = form(&mut f, &[&[2], &[3]]);
        assert!(refused.is_empty());
        f.started(ids[1], keys); // Y names B and C
                                 // Z naming C and A would close X–A–Z–C–Y–B–X.
        let (keys, refused) = form(&mut f, &[&[3], &[1], &[4]]);
        assert_eq!(refused, [1]);
        assert_eq!(keys, [3, 4]);
    }

    #[tokio::test]
    async fn what_was_allowed_stays_allowed_when_a_delivery_ends_mid_batch() {
        let ids = ids(2).await;
        let mut f = InFlight::default();
        f.started(ids[0], vec![1, 2]);
        f.started(ids[1], vec![3, 4]);
        let mut forming = Forming::default();
        assert!(f.admit(&mut forming, &[1]));
        assert!(f.admit(&mut forming, &[3]));
        f.ended(ids[0]);
        // The group of 3 and 4 is still reached once: 4 would be a second way in.
        assert!(!f.admit(&mut forming, &[4]));
        // 2's batch has ended: 2 is a customer no batch in flight names.
        assert!(f.admit(&mut forming, &[2]));
    }
}
