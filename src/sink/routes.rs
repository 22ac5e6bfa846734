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
//! unit, one abort if it still refuses, which quarantines it at once). Only evidence clears a
//! route: a unit that sent there and committed, or a record delivered there in a unit that
//! aborted for something else (a record merely not refused yet proves nothing: librdkafka
//! forgets a missing topic after 100 ms and queues the next send for as long as the first).
//! A route is forgotten when a unit begins more than [`GAP`] after its last refusal (or the
//! end of its quarantine): nothing was refused there since, and its next refusal starts a new
//! bound. The main output
//! and the dead-letter topic are no routes: a refusal there stays the configuration error it
//! is. A record is routed again after a rewind, so at-least-once can write one copy to the
//! DLQ (quarantined) and a later one to the route (tried again and taken).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::kafka::failure::TOPIC_DENIED;

/// How long a route's refusal outlives it when nothing is routed there: between a unit's
/// abort (its refusal) and the next unit's begin there are only the back-offs (at most 5 s
/// after aborts, 10 s to replace a producer) and the rewind. Measured when a unit begins,
/// never within one, so a long `--commit-interval` (refusals a unit apart) cannot restart
/// the bound for ever.
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
    /// Topics that took a record since the open unit began.
    accepted: HashSet<String>,
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
            accepted: HashSet::new(),
            refused_now: HashSet::new(),
            denied: false,
        }
    }

    /// What `topic` is if it is no route: "output" or "dead-letter".
    pub fn fixed_role(&self, topic: &str) -> Option<&'static str> {
        let at = self.fixed.iter().position(|f| f == topic)?;
        Some(["output", "dead-letter"][at])
    }

    /// Whether `topic` is a route (not the output or dead-letter topic).
    pub fn is_route(&self, topic: &str) -> bool {
        self.fixed_role(topic).is_none()
    }

    /// A unit begins at `now`: what was sent, taken or refused in earlier ones is no longer
    /// its; routes long quiet are forgotten. Whether a refusing route may be sent to in it (not
    /// quarantined): then the sink reports the topics that take records
    /// ([`Routes::accepted`]), at a lock per delivery, which a route quarantined for good does
    /// not cost.
    pub fn began(&mut self, now: Instant) -> bool {
        self.sent.clear();
        self.accepted.clear();
        self.refused_now.clear();
        self.denied = false;
        if !self.refusing.is_empty() {
            self.refusing.retain(|_, e| {
                let quiet = e.quarantine.map_or(e.last, |until| until.max(e.last));
                now.saturating_duration_since(quiet) <= GAP
            });
        }
        (self.refusing.values()).any(|e| e.quarantine.is_none_or(|until| now >= until))
    }

    /// Whether `topic` is a refusing route (the sink's deliveries may be worth asking for
    /// before [`Routes::unroutable`]).
    pub fn refusing(&self, topic: &str) -> bool {
        !self.refusing.is_empty() && self.refusing.contains_key(topic)
    }

    /// `topic` refused a record with `error`, at `now`. Whether it is a route (else a refusal
    /// of the output or dead-letter topic: the configuration's fault).
    pub fn refused(&mut self, topic: &str, error: &'static str, now: Instant) -> bool {
        if !self.is_route(topic) {
            return false;
        }
        let bound = self.bound;
        let fresh = Refusal {
            since: now,
            last: now,
            error,
            quarantine: None,
        };
        let e = self.refusing.entry(topic.to_string()).or_insert(fresh);
        e.last = e.last.max(now);
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
        if self.refusing(topic) {
            self.sent.insert(topic.to_string());
        }
    }

    /// The open unit committed: its routes take records again.
    pub fn committed(&mut self) {
        for t in self.sent.drain() {
            self.refusing.remove(&t);
        }
    }

    /// The sink delivered records of the open unit to `topics`.
    pub fn accepted(&mut self, topics: impl IntoIterator<Item = String>) {
        self.accepted.extend(topics);
    }

    /// The open unit ended without a commit: its routes that took a record and refused none
    /// take records again (the unit failed for something else).
    pub fn aborted(&mut self) {
        for t in self.sent.drain() {
            if self.accepted.contains(&t) && !self.refused_now.contains(&t) {
                self.refusing.remove(&t);
            }
        }
        self.accepted.clear();
    }

    /// Why a record routed to `topic` at `now` is its own fault, if it is: the route has
    /// refused for the bound and is quarantined.
    pub fn unroutable(&mut self, topic: &str, now: Instant) -> Option<String> {
        if self.refusing.is_empty() {
            return None;
        }
        let bound = self.bound;
        if self.accepted.contains(topic) && !self.refused_now.contains(topic) {
            // A record of this unit was delivered there: it takes records again.
            self.refusing.remove(topic);
            return None;
        }
        let e = self.refusing.get_mut(topic)?;
        match e.quarantine {
            Some(until) if now < until => {}
            // Tried again: a refusal quarantines it at once.
            Some(_) => return None,
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

    /// A unit that begins at `at`, sends to `topic` and is refused when it aborts at `at`, as
    /// the driver sees it.
    fn refused_unit(r: &mut Routes, topic: &str, at: Instant) {
        r.began(at);
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
        assert!(!r.began(at(120)), "quarantined: not watched");
        assert!(r.unroutable("elsewhere", at(120)).is_some());
        // Then tried again: refused, quarantined again at once.
        assert_eq!(r.unroutable("elsewhere", at(122)), None);
        refused_unit(&mut r, "elsewhere", at(122));
        assert!(r.unroutable("elsewhere", at(123)).is_some());
        // Tried again and committed (the topic was created meanwhile): cleared.
        assert_eq!(r.unroutable("elsewhere", at(183)), None);
        assert!(r.began(at(183)));
        r.sending("elsewhere");
        r.committed();
        assert_eq!(r.unroutable("elsewhere", at(183)), None);
        assert!(!r.began(at(184)), "nothing refuses any more");
        r.sending("elsewhere");
        r.aborted();
        assert_eq!(r.unroutable("elsewhere", at(500)), None);
        assert_eq!(r.unroutable("never-refused", at(500)), None);
    }

    #[test]
    fn only_a_delivery_clears_a_route_in_a_failed_unit() {
        let (mut r, at) = routes();
        refused_unit(&mut r, "missing", at(0));
        refused_unit(&mut r, "late", at(0));
        refused_unit(&mut r, "silent", at(0));
        refused_unit(&mut r, "late", at(30));
        refused_unit(&mut r, "silent", at(30));
        // `late` was created: the next unit sends to all three and aborts for `missing`'s
        // refusal; `late` took its record, `silent`'s has no report yet (librdkafka queued it
        // while it looks the topic up again).
        assert!(r.began(at(50)));
        for t in ["missing", "late", "silent"] {
            r.sending(t);
        }
        r.refused("missing", MISSING, at(50));
        r.accepted(["late".to_string(), "out".to_string()]);
        r.aborted();
        assert!(r.unroutable("missing", at(61)).is_some());
        assert_eq!(r.unroutable("late", at(61)), None);
        assert!(
            r.unroutable("silent", at(61)).is_some(),
            "no refusal is no evidence"
        );
    }

    #[test]
    fn a_delivery_within_the_unit_keeps_a_route_out_of_quarantine() {
        let (mut r, at) = routes();
        refused_unit(&mut r, "late", at(0));
        // A long unit: `late` was created meanwhile and took a record early on; the bound
        // passes before the unit ends.
        r.began(at(5));
        r.sending("late");
        r.accepted(["late".to_string()]);
        assert_eq!(r.unroutable("late", at(65)), None);
        assert!(!r.refusing("late"), "cleared");
    }

    #[test]
    fn deliveries_are_watched_only_while_a_refusing_route_can_be_sent_to() {
        let (mut r, at) = routes();
        assert!(!r.began(at(0)));
        refused_unit(&mut r, "missing", at(0));
        assert!(r.began(at(30)));
        refused_unit(&mut r, "missing", at(60));
        assert!(r.unroutable("missing", at(61)).is_some());
        assert!(
            !r.began(at(62)),
            "quarantined until 121 s: nothing is sent there"
        );
        assert!(r.began(at(121)), "tried again");
    }

    #[test]
    fn what_a_replaced_producer_sent_is_no_later_units() {
        let (mut r, at) = routes();
        refused_unit(&mut r, "missing", at(0));
        // A unit sends there and its producer is replaced: the driver never ends the unit.
        r.began(at(10));
        r.sending("missing");
        // The next unit sends nothing there and commits: the route still refuses.
        r.began(at(20));
        r.committed();
        assert!(r.unroutable("missing", at(61)).is_some());
    }

    #[test]
    fn refusals_a_long_unit_apart_still_reach_the_bound() {
        let (mut r, at) = routes();
        // --commit-interval 5m: each unit sends at its start and learns the refusal when it
        // ends, a few seconds before the next begins.
        for start in [0, 305] {
            assert_eq!(r.unroutable("elsewhere", at(start)), None, "at {start} s");
            r.began(at(start));
            r.sending("elsewhere");
            r.refused("elsewhere", MISSING, at(start + 300));
            r.aborted();
        }
        assert!(r.unroutable("elsewhere", at(610)).is_some());
    }

    #[test]
    fn a_quiet_route_is_forgotten_when_a_unit_begins() {
        let (mut r, at) = routes();
        refused_unit(&mut r, "once", at(0));
        // Nothing routed there for longer than the gap: forgotten, and its bound starts
        // again with the next refusal.
        assert!(r.began(at(GAP.as_secs())));
        assert!(!r.began(at(GAP.as_secs() + 1)));
        assert_eq!(r.unroutable("once", at(3_600)), None);
        refused_unit(&mut r, "once", at(3_600));
        assert_eq!(r.unroutable("once", at(3_610)), None);
        assert!(r.unroutable("once", at(3_660)).is_some());
        // A quarantined route nothing is routed to any more: freed a gap after its
        // quarantine ended.
        assert!(r.began(at(3_720 + GAP.as_secs())));
        assert!(!r.began(at(3_721 + GAP.as_secs())));
        assert!(r.refusing.is_empty());
    }

    #[test]
    fn a_denied_route_excuses_its_own_unit_only() {
        let (mut r, at) = routes();
        r.began(at(0));
        assert!(r.refused("missing", MISSING, at(0)));
        assert!(!r.denied(), "a missing topic is no permission");
        r.refused("secret", DENIED, at(0));
        assert!(r.denied());
        assert!(r.take_denied() && !r.denied());
        // A late report after the decision is forgotten when the next unit begins.
        r.refused("secret", DENIED, at(1));
        r.began(at(1));
        assert!(!r.denied());
    }
}
