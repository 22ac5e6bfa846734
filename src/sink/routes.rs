//! Outputs routed by the record (an envelope's or the application's `topic`) to a destination
//! that refuses them for what it is, not for what they are: a topic that does not exist, or
//! that exactly may not write. Retrying cannot help the record until someone creates the topic
//! or grants the permission, which may well be under way (a topic created a minute late should
//! still get its records); holding every partition back for ever cannot be right either.
//!
//! So a refused route is first the cluster's fault (abort, rewind, back off, as any failed
//! delivery), and becomes the record's once the destination has kept refusing for
//! `--route-timeout`: the route is *quarantined* for as long again, its records following
//! `--on-error` with reason `route_refused`, naming the topic. Then it is tried again (one
//! unit, one abort if it still refuses, which quarantines it at once). A unit that sends to
//! the route and ends without its refusal (committed, or aborted for something else) clears
//! it; so does a pause in its refusals longer than [`GAP`] (nothing was routed there). The
//! main output and the dead-letter topic are no routes: a refusal there stays the
//! configuration error it is.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::error::TOPIC_DENIED;

/// The longest pause between two refusals of a route that is being retried: a new producer's
/// first send there waits for librdkafka to call the topic missing
/// (`topic.metadata.propagation.max.ms`, at most 30 s), and the producer's back-off adds up to
/// 10 s. A route not refused for longer (and not quarantined) is tried afresh.
pub const GAP: Duration = Duration::from_secs(60);

/// A destination refusing the records routed to it.
#[derive(Debug)]
struct Refusal {
    /// Its first refusal in this run of refusals.
    since: Instant,
    /// Its latest refusal.
    last: Instant,
    /// The destination's error.
    error: &'static str,
    /// Past the bound: its records are their own fault until then; after it the route is
    /// tried again, and a refusal quarantines it again at once.
    quarantine: Option<Instant>,
}

/// Destinations refusing the records routed to them.
#[derive(Debug)]
pub struct Routes {
    bound: Duration,
    /// The output and dead-letter topics: never routes.
    fixed: [String; 2],
    refusing: HashMap<String, Refusal>,
    /// Refusing routes sent to in the open unit.
    sent: HashSet<String>,
    /// Routes refused since the open unit began.
    refused_now: HashSet<String>,
    /// A route was refused a permission since the open unit began: the unit failed for that
    /// route, not for a permission exactly needs.
    denied: bool,
}

impl Default for Routes {
    /// No route ever becomes the record's fault.
    fn default() -> Self {
        Routes::new(Duration::MAX, "", "")
    }
}

impl Routes {
    /// A destination refusing for `bound` makes its records bad ones; the `output` and `dlq`
    /// topics are no routes.
    pub fn new(bound: Duration, output: &str, dlq: &str) -> Routes {
        Routes {
            bound,
            fixed: [output.to_string(), dlq.to_string()],
            refusing: HashMap::new(),
            sent: HashSet::new(),
            refused_now: HashSet::new(),
            denied: false,
        }
    }

    /// Whether `topic` is a route (not the output or dead-letter topic).
    pub fn is_route(&self, topic: &str) -> bool {
        !self.fixed.iter().any(|f| f == topic)
    }

    /// A unit begins: what was refused in earlier ones is no longer its.
    pub fn began(&mut self) {
        self.refused_now.clear();
        self.denied = false;
    }

    /// `topic` refused a record with `error`, at `now`. Whether it is a route (else a refusal
    /// of the output or dead-letter topic: the configuration's fault).
    pub fn refused(&mut self, topic: &str, error: &'static str, now: Instant) -> bool {
        if !self.is_route(topic) {
            return false;
        }
        let (bound, gap) = (self.bound, GAP.max(self.bound));
        let fresh = Refusal {
            since: now,
            last: now,
            error,
            quarantine: None,
        };
        let e = self.refusing.entry(topic.to_string()).or_insert(fresh);
        if e.quarantine.is_none() && now.saturating_duration_since(e.last) > gap {
            e.since = now;
        }
        e.last = now;
        e.error = error;
        if e.quarantine.is_some_and(|until| now >= until) {
            // Tried again after its quarantine, and still refusing.
            e.quarantine = Some(now + bound);
        }
        self.refused_now.insert(topic.to_string());
        self.denied |= error == TOPIC_DENIED;
        true
    }

    /// Whether a route was refused a permission since the open unit began.
    pub fn denied(&self) -> bool {
        self.denied
    }

    /// [`Routes::denied`], and forgets it.
    pub fn take_denied(&mut self) -> bool {
        std::mem::take(&mut self.denied)
    }

    /// A record of the open unit goes to `topic`.
    pub fn sending(&mut self, topic: &str) {
        if !self.refusing.is_empty() && self.refusing.contains_key(topic) {
            self.sent.insert(topic.to_string());
        }
    }

    /// The open unit committed: its routes take records again.
    pub fn committed(&mut self) {
        for t in self.sent.drain() {
            self.refusing.remove(&t);
        }
    }

    /// The open unit ended without a commit: its routes that did not refuse take records
    /// again (the unit failed for something else).
    pub fn aborted(&mut self) {
        for t in self.sent.drain() {
            if !self.refused_now.contains(&t) {
                self.refusing.remove(&t);
            }
        }
    }

    /// Why a record routed to `topic` at `now` is its own fault, if it is: the route has
    /// refused for the bound and is quarantined.
    pub fn unroutable(&mut self, topic: &str, now: Instant) -> Option<String> {
        if self.refusing.is_empty() {
            return None;
        }
        let (bound, gap) = (self.bound, GAP.max(self.bound));
        let e = self.refusing.get_mut(topic)?;
        match e.quarantine {
            Some(until) if now < until => {}
            // Tried again: a refusal quarantines it at once.
            Some(_) => return None,
            None if now.saturating_duration_since(e.last) > gap => {
                // Nothing was refused there for a while: tried afresh.
                self.refusing.remove(topic);
                return None;
            }
            None if now.saturating_duration_since(e.since) >= bound => {
                e.quarantine = Some(now + bound);
            }
            None => return None,
        }
        let refusing = e.last.saturating_duration_since(e.since);
        let error = e.error;
        Some(format!(
            "the output's topic '{topic}' refused it ({error}) for {} (--route-timeout {})",
            humantime::format_duration(Duration::from_secs(refusing.as_secs())),
            humantime::format_duration(bound)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MISSING: &str = "UNKNOWN_TOPIC_OR_PARTITION";
    const DENIED: &str = TOPIC_DENIED;

    fn routes() -> (Routes, impl Fn(u64) -> Instant) {
        let t0 = Instant::now();
        let r = Routes::new(Duration::from_secs(60), "out", "out.dlq");
        (r, move |s| t0 + Duration::from_secs(s))
    }

    /// A unit that sends to `topic` and is refused at `at`, as the driver sees it.
    fn refused_unit(r: &mut Routes, topic: &str, at: Instant) {
        r.began();
        r.sending(topic);
        r.refused(topic, MISSING, at);
        r.aborted();
    }

    #[test]
    fn a_route_refusing_for_the_bound_is_quarantined_then_tried_again() {
        let (mut r, at) = routes();
        assert!(!r.refused("out", MISSING, at(0)), "the output is no route");
        refused_unit(&mut r, "elsewhere", at(0));
        // Retried every few seconds: the cluster's fault until the bound.
        for s in (5..60).step_by(5) {
            assert_eq!(r.unroutable("elsewhere", at(s)), None, "at {s} s");
            refused_unit(&mut r, "elsewhere", at(s));
        }
        let why = r.unroutable("elsewhere", at(61)).unwrap();
        assert!(
            why.contains("'elsewhere'") && why.contains(MISSING),
            "{why}"
        );
        // Quarantined for a bound: nothing is sent there, so nothing refreshes it.
        assert!(r.unroutable("elsewhere", at(120)).is_some());
        // Then tried again: refused, quarantined again at once.
        assert_eq!(r.unroutable("elsewhere", at(122)), None);
        refused_unit(&mut r, "elsewhere", at(122));
        assert!(r.unroutable("elsewhere", at(123)).is_some());
        // Tried again and committed (the topic was created meanwhile): cleared.
        assert_eq!(r.unroutable("elsewhere", at(183)), None);
        r.began();
        r.sending("elsewhere");
        r.committed();
        assert_eq!(r.unroutable("elsewhere", at(183)), None);
        r.began();
        r.sending("elsewhere");
        r.aborted();
        assert_eq!(r.unroutable("elsewhere", at(500)), None);
        assert_eq!(r.unroutable("never-refused", at(500)), None);
    }

    #[test]
    fn a_route_that_did_not_refuse_in_a_failed_unit_is_cleared() {
        let (mut r, at) = routes();
        refused_unit(&mut r, "missing", at(0));
        refused_unit(&mut r, "late", at(0));
        refused_unit(&mut r, "late", at(30));
        // `late` was created: the next unit sends to both, only `missing` refuses.
        r.began();
        r.sending("missing");
        r.sending("late");
        r.refused("missing", MISSING, at(50));
        r.aborted();
        assert!(r.unroutable("missing", at(61)).is_some());
        assert_eq!(r.unroutable("late", at(61)), None);
    }

    #[test]
    fn an_old_refusal_is_no_reason_to_skip_a_route() {
        let (mut r, at) = routes();
        refused_unit(&mut r, "once", at(0));
        // Nothing routed there for longer than the gap: tried afresh, and its bound starts
        // again with the next refusal.
        assert_eq!(r.unroutable("once", at(3_600)), None);
        refused_unit(&mut r, "once", at(3_600));
        assert_eq!(r.unroutable("once", at(3_610)), None);
        assert!(r.unroutable("once", at(3_660)).is_some());
    }

    #[test]
    fn a_denied_route_excuses_its_own_unit_only() {
        let (mut r, at) = routes();
        r.began();
        assert!(r.refused("missing", MISSING, at(0)));
        assert!(!r.denied(), "a missing topic is no permission");
        r.refused("secret", DENIED, at(0));
        assert!(r.denied());
        assert!(r.take_denied() && !r.denied());
        // A late report after the decision is forgotten when the next unit begins.
        r.refused("secret", DENIED, at(1));
        r.began();
        assert!(!r.denied());
    }
}
