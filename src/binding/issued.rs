//! The customer-context handles placed in verified callers' results, and to whom: a handle
//! another caller sends is refused before anything reaches Epode. Remembered by a digest
//! (never the handle itself), each caller's own at most [`PER_CALLER`] (a caller past it
//! forgets its own oldest, never another's), all at most [`ISSUED_MAX`] (the oldest forgotten
//! first: a flood needs a hundred verified callers, each at its share). A forgotten handle,
//! or one placed on another replica, is then anyone's, as one placed in a result no token
//! guards; Epode still binds it to its interaction and ends it after two hours.

use std::collections::{HashMap, VecDeque};
use std::num::NonZeroUsize;

use lru::LruCache;
use sha2::{Digest, Sha256};

use crate::caller::CallerKey;

/// All handles remembered: 100,000 (a hundred callers at their share) take 11 MB, measured
/// as the resident growth of a release build filling the table.
pub(crate) const ISSUED_MAX: usize = 100_000;

/// One caller's handles remembered (a caller placing more within a handle's two hours of
/// life, one call every 7 seconds, forgets its own oldest).
pub(crate) const PER_CALLER: usize = 1_000;

type HandleDigest = [u8; 16];

fn digest(handle: &str) -> HandleDigest {
    let d = Sha256::digest(handle.as_bytes());
    let mut out = [0; 16];
    out.copy_from_slice(&d[..16]);
    out
}

pub(crate) struct IssuedHandles {
    /// Each handle's caller, the oldest placed first out (never promoted by a lookup).
    owner: LruCache<HandleDigest, CallerKey>,
    /// Each caller's handles, oldest first: the share's bookkeeping.
    by_caller: HashMap<CallerKey, VecDeque<HandleDigest>>,
    per_caller: usize,
}

impl IssuedHandles {
    pub(crate) fn new() -> Self {
        Self::bounded(ISSUED_MAX, PER_CALLER)
    }

    fn bounded(max: usize, per_caller: usize) -> Self {
        IssuedHandles {
            owner: LruCache::new(NonZeroUsize::new(max).expect("not zero")),
            by_caller: HashMap::new(),
            per_caller: per_caller.max(1),
        }
    }

    /// Remembers `handle` as placed in `caller`'s result.
    pub(crate) fn place(&mut self, handle: &str, caller: CallerKey) {
        let d = digest(handle);
        if let Some(before) = self.owner.pop(&d) {
            self.forget_of(before, &d);
        }
        let own = self.by_caller.entry(caller).or_default();
        while own.len() >= self.per_caller {
            if let Some(oldest) = own.pop_front() {
                self.owner.pop(&oldest);
            }
        }
        own.push_back(d);
        if let Some((evicted, of)) = self.owner.push(d, caller) {
            // At the cap, the oldest of all goes (push returns the same key when it was only
            // replaced, which pop above rules out).
            self.forget_of(of, &evicted);
        }
    }

    fn forget_of(&mut self, caller: CallerKey, d: &HandleDigest) {
        if let Some(own) = self.by_caller.get_mut(&caller) {
            if let Some(at) = own.iter().position(|x| x == d) {
                own.remove(at);
            }
            if own.is_empty() {
                self.by_caller.remove(&caller);
            }
        }
    }

    /// Whether `handle` was placed in another caller's result than `caller`'s.
    pub(crate) fn foreign(&self, handle: &str, caller: CallerKey) -> bool {
        self.owner
            .peek(&digest(handle))
            .is_some_and(|to| *to != caller)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        debug_assert_eq!(
            self.owner.len(),
            self.by_caller.values().map(VecDeque::len).sum::<usize>()
        );
        debug_assert!(self.owner.len() <= self.owner.cap().get());
        self.owner.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caller(n: u8) -> CallerKey {
        CallerKey::of_token("https://issuer", Some(&format!("user-{n}")), None, &[0; 32])
    }

    #[test]
    fn a_handle_is_its_callers_and_refused_to_another() {
        let mut issued = IssuedHandles::new();
        issued.place("aqr1_one", caller(1));
        assert!(!issued.foreign("aqr1_one", caller(1)));
        assert!(issued.foreign("aqr1_one", caller(2)));
        // Never placed here (another replica's, or forgotten): anyone's.
        assert!(!issued.foreign("aqr1_other", caller(2)));
    }

    #[test]
    fn a_caller_past_its_share_forgets_its_own_oldest_never_anothers() {
        let mut issued = IssuedHandles::bounded(10, 3);
        issued.place("aqr1_victim", caller(1));
        for i in 0..50 {
            issued.place(&format!("aqr1_flood_{i}"), caller(2));
        }
        // The flood kept only its own three newest.
        assert_eq!(issued.len(), 4);
        assert!(issued.foreign("aqr1_victim", caller(2)));
        assert!(!issued.foreign("aqr1_flood_0", caller(1)));
        assert!(issued.foreign("aqr1_flood_49", caller(1)));
        assert!(issued.foreign("aqr1_flood_47", caller(1)));
    }

    #[test]
    fn at_the_cap_the_oldest_of_all_goes_and_the_books_agree() {
        let mut issued = IssuedHandles::bounded(4, 3);
        for (i, c) in [1, 2, 3, 4, 5, 1].into_iter().enumerate() {
            issued.place(&format!("aqr1_{i}"), caller(c));
        }
        assert_eq!(issued.len(), 4);
        assert!(!issued.foreign("aqr1_0", caller(9)), "the oldest went");
        assert!(!issued.foreign("aqr1_1", caller(9)), "then the next");
        assert!(issued.foreign("aqr1_2", caller(9)));
        assert!(issued.foreign("aqr1_5", caller(9)));
        // A caller whose every handle went leaves no entry behind.
        assert!(!issued.by_caller.contains_key(&caller(2)));
    }

    #[test]
    fn the_same_handle_placed_again_counts_once_under_its_newest_caller() {
        let mut issued = IssuedHandles::bounded(10, 2);
        issued.place("aqr1_same", caller(1));
        issued.place("aqr1_same", caller(1));
        issued.place("aqr1_same", caller(2));
        assert_eq!(issued.len(), 1);
        assert!(issued.foreign("aqr1_same", caller(1)));
        assert!(!issued.by_caller.contains_key(&caller(1)));
    }
}
