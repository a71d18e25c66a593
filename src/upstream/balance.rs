//! Balance: which instance of an upstream a request goes to, and which are left out.
//!
//! Least outstanding requests over two random choices (as Envoy and linkerd balance): two
//! instances are drawn, the one with fewer requests in flight gets the request. It needs no
//! shared state but a counter per instance, spreads evenly at equal load, and steers away
//! from a slow instance, whose requests pile up.
//!
//! Passive health (outlier detection, as Envoy's): an instance is left out for `eject_for`,
//! doubled at each ejection that follows without a success between, up to `eject_max`, after
//! `eject_after` connect failures running, `eject_after_broken` exchanges running that broke
//! before any answer, or `eject_after_gateway_errors` answers 502, 503 or 504 running. Each
//! kind keeps its own run; any other answer ends them all, and a connection made ends the
//! connect run. A gateway error is an answer, but never a success: were it one, it would end
//! the very run it adds to. Never all of them: with every instance left out, the draw is among
//! all, since a request that might connect beats one refused outright.
//!
//! The hazard is a retry that goes elsewhere. Only a request that was never sent may (a
//! failed connect; an HTTP/2 stream refused): the caller says which instances it tried, and
//! the draw excludes them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::config::Ejection;

/// What went wrong with an instance, each kind with its own run and its own threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trouble {
    /// No connection could be made.
    Connect,
    /// The exchange broke before any answer: reset, or closed.
    Broken,
    /// It answered 502, 503 or 504.
    Gateway,
}

impl Trouble {
    /// How metrics and logs name it.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Broken => "broken",
            Self::Gateway => "gateway_error",
        }
    }

    /// How many running leave an instance out; 0: never.
    pub fn after(self, rule: &Ejection) -> u32 {
        match self {
            Self::Connect => rule.after,
            Self::Broken => rule.after_broken,
            Self::Gateway => rule.after_gateway_errors,
        }
    }
}

/// One instance's state as the balancer sees it.
#[derive(Debug, Default)]
pub struct Load {
    outstanding: AtomicUsize,
    /// Whether it has been left out since its last success: the draw reads this, and takes
    /// the lock only for an instance that was.
    ejected: AtomicBool,
    /// Whether it failed since its last success: a success takes the lock only then.
    troubled: AtomicBool,
    health: Mutex<Health>,
}

#[derive(Debug, Default)]
struct Health {
    /// Each kind's failures running ([`Trouble`] as the index): since the last answer (that
    /// was no gateway error), and for connects since the last connection made.
    runs: [u32; 3],
    /// Ejections since the last success.
    ejections: u32,
    out_until: Option<Instant>,
    /// What left it out last.
    why: Option<Trouble>,
}

/// An instance's health as an operator reads it (`GET /upstreams`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Requests in flight to it.
    pub outstanding: usize,
    /// Left out now: for how much longer, and why.
    pub left_out: Option<(Duration, Trouble)>,
    /// Times it was left out since its last success.
    pub ejections: u32,
}

impl Load {
    /// Requests in flight to it.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Counts a request to it until the guard drops.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(self))
    }

    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Its standing at `now`, for an operator (takes the lock only for an instance that has
    /// been left out since its last success).
    pub fn standing(&self, now: Instant) -> Standing {
        let outstanding = self.outstanding();
        if !self.ejected.load(Ordering::Relaxed) {
            return Standing { outstanding, left_out: None, ejections: 0 };
        }
        let h = self.health();
        let left_out = match (h.out_until, h.why) {
            (Some(until), Some(why)) if until > now => Some((until - now, why)),
            _ => None,
        };
        Standing { outstanding, left_out, ejections: h.ejections }
    }

    /// Whether it is left out now.
    pub fn out(&self, now: Instant) -> bool {
        self.ejected.load(Ordering::Relaxed) && self.health().out_until.is_some_and(|until| until > now)
    }

    /// It answered: every failure and ejection is forgotten. An instance that never failed
    /// takes no lock: this runs once per request.
    pub fn answered(&self) {
        if !self.troubled.load(Ordering::Relaxed) {
            return;
        }
        let mut h = self.health();
        *h = Health::default();
        self.ejected.store(false, Ordering::Relaxed);
        self.troubled.store(false, Ordering::Relaxed);
    }

    /// A connection to it was made: its connect failures are no longer running. (Whether it
    /// comes back, if left out, is for an answer to say.)
    pub fn dialed(&self) {
        if self.troubled.load(Ordering::Relaxed) {
            self.health().runs[Trouble::Connect as usize] = 0;
        }
    }

    /// `trouble` with it; it is left out after [`Trouble::after`] running (never when that is
    /// 0, and then no lock is taken), and `Some` says for how long.
    pub fn failed(&self, trouble: Trouble, rule: &Ejection, now: Instant) -> Option<Duration> {
        let after = trouble.after(rule);
        if after == 0 {
            return None;
        }
        let mut h = self.health();
        self.troubled.store(true, Ordering::Relaxed);
        let run = &mut h.runs[trouble as usize];
        *run += 1;
        if *run < after {
            return None;
        }
        *run = 0;
        let factor = 1u32.checked_shl(h.ejections.min(16)).unwrap_or(u32::MAX);
        let out_for = rule.base.saturating_mul(factor).min(rule.max);
        h.ejections = h.ejections.saturating_add(1);
        h.out_until = Some(now + out_for);
        h.why = Some(trouble);
        self.ejected.store(true, Ordering::Relaxed);
        Some(out_for)
    }
}

/// A request in flight to one instance.
#[derive(Debug)]
pub struct InFlight(Arc<Load>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Picks among `count` instances (`load(i)` of each), leaving out `tried`: two random
/// candidates among those not left out (all of them if every one is), the one with fewer
/// requests in flight. `None` when every instance was tried. Allocates nothing: it runs once
/// per request.
pub fn pick<'a>(
    count: usize,
    load: impl Fn(usize) -> &'a Load,
    tried: &[usize],
    now: Instant,
    random: &mut impl FnMut(usize) -> usize,
) -> Option<usize> {
    let healthy_only = (0..count).any(|i| !tried.contains(&i) && !load(i).out(now));
    let eligible = |i: &usize| !(tried.contains(i) || (healthy_only && load(*i).out(now)));
    let nth = |n: usize| (0..count).filter(eligible).nth(n);
    match (0..count).filter(eligible).count() {
        0 => None,
        1 => nth(0),
        n => {
            let a = random(n);
            // A second draw among the others: two distinct candidates.
            let b = (a + 1 + random(n - 1)) % n;
            let (a, b) = (nth(a)?, nth(b)?);
            Some(if load(b).outstanding() < load(a).outstanding() { b } else { a })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Ejection = Ejection {
        after: 3,
        after_broken: 2,
        after_gateway_errors: 4,
        base: Duration::from_secs(5),
        max: Duration::from_secs(40),
    };
    const CONNECT: Trouble = Trouble::Connect;

    #[test]
    fn an_instance_is_left_out_after_failures_running_for_longer_each_time() {
        let load = Load::default();
        let now = Instant::now();
        assert_eq!(load.failed(CONNECT, &RULE, now), None);
        assert_eq!(load.failed(CONNECT, &RULE, now), None);
        assert_eq!(load.failed(CONNECT, &RULE, now), Some(Duration::from_secs(5)));
        assert!(load.out(now) && !load.out(now + Duration::from_secs(5)));
        // Still failing when it comes back: 10 s, 20 s, then the cap.
        for want in [10, 20, 40, 40] {
            for _ in 0..2 {
                assert_eq!(load.failed(CONNECT, &RULE, now), None);
            }
            assert_eq!(load.failed(CONNECT, &RULE, now), Some(Duration::from_secs(want)));
        }
        // An answer forgets it all.
        load.answered();
        assert!(!load.out(now));
        assert_eq!(load.failed(CONNECT, &RULE, now), None);
        // A connection made ends the run, but leaves an instance that is out where it is.
        load.dialed();
        assert_eq!(load.failed(CONNECT, &RULE, now), None);
        assert_eq!(load.failed(CONNECT, &RULE, now), None);
        assert_eq!(load.failed(CONNECT, &RULE, now), Some(Duration::from_secs(5)));
        load.dialed();
        assert!(load.out(now));
    }

    #[test]
    fn broken_exchanges_and_gateway_errors_each_have_their_run_and_only_an_answer_ends_them() {
        let now = Instant::now();
        let (broken, gateway) = (Trouble::Broken, Trouble::Gateway);
        // Two broken exchanges running (after_broken = 2): out for 5 s.
        let load = Load::default();
        assert_eq!(load.failed(broken, &RULE, now), None);
        assert_eq!(load.failed(broken, &RULE, now), Some(Duration::from_secs(5)));
        // Gateway errors: four running (after_gateway_errors = 4); a gateway error ends
        // neither its own run nor a broken exchange's. Out for 5 s again: the answer between
        // forgot the first ejection.
        load.answered();
        for _ in 0..3 {
            assert_eq!(load.failed(gateway, &RULE, now), None);
        }
        assert_eq!(load.failed(broken, &RULE, now), None);
        assert_eq!(load.failed(gateway, &RULE, now), Some(Duration::from_secs(5)));
        assert!(load.out(now));
        // The kinds do not add up: one connect failure, one broken exchange, three gateway
        // errors leave it in; a connection made ends only the connect run.
        let load = Load::default();
        load.failed(CONNECT, &RULE, now);
        load.failed(CONNECT, &RULE, now);
        load.dialed();
        load.failed(broken, &RULE, now);
        for _ in 0..3 {
            load.failed(gateway, &RULE, now);
        }
        assert_eq!(load.failed(CONNECT, &RULE, now), None);
        assert!(!load.out(now));
        assert_eq!(load.failed(broken, &RULE, now), Some(Duration::from_secs(5)));
        // An answer ends every run; 0 turns a kind off, without taking the lock.
        load.answered();
        assert_eq!(load.failed(gateway, &RULE, now), None);
        let off = Ejection { after_broken: 0, after_gateway_errors: 0, ..RULE };
        let load = Load::default();
        for _ in 0..100 {
            assert_eq!(load.failed(broken, &off, now), None);
            assert_eq!(load.failed(gateway, &off, now), None);
        }
        assert!(!load.troubled.load(Ordering::Relaxed));
    }

    #[test]
    fn the_less_loaded_of_two_draws_wins_and_tried_or_left_out_instances_are_skipped() {
        let loads: Vec<Arc<Load>> = (0..3).map(|_| Arc::new(Load::default())).collect();
        let refs = |i: usize| &*loads[i];
        let now = Instant::now();
        let _busy: Vec<InFlight> = (0..5).map(|_| loads[0].begin()).collect();
        assert_eq!(loads[0].outstanding(), 5);
        // Draws 0 and 1: the idle one.
        let mut draws = [0usize, 0].into_iter();
        assert_eq!(pick(3, refs, &[], now, &mut |_| draws.next().unwrap()), Some(1));
        // Tried: never drawn again; all tried: none.
        assert_eq!(pick(3, refs, &[1, 2], now, &mut |_| 0), Some(0));
        assert_eq!(pick(3, refs, &[0, 1, 2], now, &mut |_| 0), None);
        // Left out: skipped while another is healthy, drawn when none is.
        for _ in 0..3 {
            loads[1].failed(CONNECT, &RULE, now);
            loads[2].failed(CONNECT, &RULE, now);
        }
        for draw in 0..3 {
            assert_eq!(pick(3, refs, &[], now, &mut |n| draw % n), Some(0));
        }
        for _ in 0..3 {
            loads[0].failed(CONNECT, &RULE, now);
        }
        let mut seen = [false; 3];
        for draw in 0..3 {
            seen[pick(3, refs, &[], now, &mut |n| draw % n).unwrap()] = true;
        }
        assert!(seen.iter().filter(|s| **s).count() >= 2, "never all left out: {seen:?}");
        drop(_busy);
        assert_eq!(loads[0].outstanding(), 0);
    }
}
