//! Login throttling, as a pure structure over keys and instants: failed
//! logins are counted per client address and per (account, address).
//!
//! Invariants:
//! - Only failures count. An attempt is charged before its password is
//!   checked (so many at once cannot outrun the limit) and refunded when
//!   the password was right: a correct password from an address that has
//!   not failed is never refused, whatever others did to the account
//!   (`tests::a_refunded_attempt_does_not_count`,
//!   `tests/tests/dashboard_api.rs::a_guesser_elsewhere_never_locks_the_owner_out`).
//! - A key's count drains by itself (one failure every `every`); a drained
//!   key is the same as an absent one and is pruned (every minute, and
//!   whenever the map is full).
//! - At most `cap` keys are held: when pruning frees none, the key nearest
//!   to drained is dropped. Memory is bounded whatever the number of
//!   addresses or names tried (a name that is no account's name is counted
//!   as the empty name).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// How many failures at once, then one every `every`.
#[derive(Debug, Clone, Copy)]
pub struct Quota {
    pub burst: u32,
    pub every: Duration,
}

/// Failures per key (GCRA: each key holds the instant its count drains).
#[derive(Debug)]
pub struct Throttle<K> {
    quota: Quota,
    cap: usize,
    drained_at: HashMap<K, Instant>,
    pruned_at: Option<Instant>,
}

/// How often the map is swept of drained keys.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

impl<K: Hash + Eq + Clone> Throttle<K> {
    pub fn new(quota: Quota, cap: usize) -> Self {
        Throttle {
            quota,
            cap: cap.max(1),
            drained_at: HashMap::new(),
            pruned_at: None,
        }
    }

    /// Would one more failure of `key` pass the quota?
    pub fn refuses(&self, key: &K, now: Instant) -> bool {
        let allowance = self.quota.every * self.quota.burst.saturating_sub(1);
        self.drained_at
            .get(key)
            .is_some_and(|at| at.saturating_duration_since(now) > allowance)
    }

    /// Counts one (possible) failure of `key`.
    pub fn charge(&mut self, key: K, now: Instant) {
        let since = |p: Instant| now.saturating_duration_since(p);
        let full = !self.drained_at.contains_key(&key) && self.drained_at.len() >= self.cap;
        // Swept every minute, and at most once a second when full.
        let wait = if full {
            Duration::from_secs(1)
        } else {
            PRUNE_EVERY
        };
        if self.pruned_at.is_none_or(|p| since(p) >= wait) {
            self.prune(now);
        }
        // Still full: the key nearest to drained makes room.
        if full && self.drained_at.len() >= self.cap {
            let nearest = self
                .drained_at
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(k, _)| k.clone());
            if let Some(k) = nearest {
                self.drained_at.remove(&k);
            }
        }
        let at = self.drained_at.entry(key).or_insert(now);
        *at = (*at).max(now) + self.quota.every;
    }

    /// Takes back one charge of `key` (the password was right).
    pub fn refund(&mut self, key: &K, now: Instant) {
        if let Some(at) = self.drained_at.get_mut(key) {
            *at = at.checked_sub(self.quota.every).unwrap_or(now);
            if *at <= now {
                self.drained_at.remove(key);
            }
        }
    }

    /// Drops every drained key.
    pub fn prune(&mut self, now: Instant) {
        self.drained_at.retain(|_, at| *at > now);
        self.drained_at.shrink_to(self.cap.min(1024));
        self.pruned_at = Some(now);
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.drained_at.len()
    }

    pub fn is_empty(&self) -> bool {
        self.drained_at.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota() -> Quota {
        Quota {
            burst: 5,
            every: Duration::from_secs(12),
        }
    }

    #[test]
    fn failures_past_the_burst_are_refused_until_they_drain() {
        let mut t = Throttle::new(quota(), 100);
        let now = Instant::now();
        for _ in 0..5 {
            assert!(!t.refuses(&"a", now));
            t.charge("a", now);
        }
        assert!(t.refuses(&"a", now));
        assert!(!t.refuses(&"b", now), "another key is not refused");
        assert!(!t.refuses(&"a", now + Duration::from_secs(12)));
        // Long after, the key is drained and pruned away.
        t.prune(now + Duration::from_secs(61));
        assert!(t.is_empty());
    }

    #[test]
    fn a_refunded_attempt_does_not_count() {
        let mut t = Throttle::new(quota(), 100);
        let now = Instant::now();
        for _ in 0..50 {
            t.charge("a", now);
            t.refund(&"a", now);
        }
        assert!(!t.refuses(&"a", now));
        assert!(t.is_empty());
    }

    /// Many more addresses than the cap hold at most `cap` keys; long
    /// after they stop, none.
    #[test]
    fn memory_is_bounded_by_the_cap_and_freed_by_pruning() {
        let mut t = Throttle::new(quota(), 1024);
        let now = Instant::now();
        for i in 0..20_000u32 {
            t.charge(std::net::IpAddr::from(i.to_be_bytes()), now);
            assert!(t.len() <= 1024);
        }
        assert_eq!(t.len(), 1024);
        t.charge("1.1.1.1".parse().unwrap(), now + Duration::from_secs(3600));
        assert_eq!(t.len(), 1, "drained keys were not pruned");
    }
}
