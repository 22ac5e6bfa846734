//! Outputs routed by the record (an envelope's or the application's `topic`) to a destination
//! that refuses them for what it is, not for what they are: a topic that does not exist, or
//! that exactly may not write. Retrying cannot help the record until someone creates the topic
//! or grants the permission, which may well be under way (a topic created a minute late should
//! still get its records); holding every partition back for ever cannot be right either.
//!
//! So a refused route is first the cluster's fault (abort, rewind, back off, as any failed
//! delivery), and becomes the record's once the destination has kept refusing for
//! `--route-timeout`: its records follow `--on-error` with reason `route_refused`, naming the
//! topic. A delivery to the destination in a committed unit clears it. The main output and the
//! dead-letter topic are no routes: a refusal there stays the configuration error it is.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// Destinations refusing the records routed to them.
#[derive(Debug)]
pub struct Routes {
    bound: Duration,
    /// The output and dead-letter topics: never routes.
    fixed: Vec<String>,
    /// Each refusing route: since when, and its error.
    refusing: HashMap<String, (Instant, &'static str)>,
    /// Refusing routes sent to in the open unit: cleared when it commits.
    sent: HashSet<String>,
    /// A route was refused a permission since the last take: the unit failed for that route,
    /// not for a permission exactly needs.
    denied: bool,
}

impl Default for Routes {
    /// No route ever becomes the record's fault.
    fn default() -> Self {
        Routes {
            bound: Duration::MAX,
            fixed: Vec::new(),
            refusing: HashMap::new(),
            sent: HashSet::new(),
            denied: false,
        }
    }
}

impl Routes {
    /// A destination refusing for `bound` makes its records bad ones; `fixed` are no routes.
    pub fn new(bound: Duration, fixed: Vec<String>) -> Routes {
        Routes {
            bound,
            fixed,
            refusing: HashMap::new(),
            sent: HashSet::new(),
            denied: false,
        }
    }

    /// Whether `topic` is a route (not the output or dead-letter topic).
    pub fn is_route(&self, topic: &str) -> bool {
        !self.fixed.iter().any(|f| f == topic)
    }

    /// `topic` refused a record with `error`, at `now`. Whether it is a route (else a refusal
    /// of the output or dead-letter topic: the configuration's fault).
    pub fn refused(&mut self, topic: &str, error: &'static str, now: Instant) -> bool {
        if !self.is_route(topic) {
            return false;
        }
        self.refusing
            .entry(topic.to_string())
            .and_modify(|e| e.1 = error)
            .or_insert((now, error));
        self.denied |= error == "TOPIC_AUTHORIZATION_FAILED";
        true
    }

    /// Whether a route was refused a permission since the last take.
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

    /// The open unit ended without a commit.
    pub fn aborted(&mut self) {
        self.sent.clear();
    }

    /// Why a record routed to `topic` is its own fault now, if it is: the route has refused for
    /// longer than the bound.
    pub fn unroutable(&self, topic: &str, now: Instant) -> Option<String> {
        if self.refusing.is_empty() {
            return None;
        }
        let (since, error) = self.refusing.get(topic)?;
        let refusing = now.saturating_duration_since(*since);
        (refusing >= self.bound).then(|| {
            format!(
                "the output's topic '{topic}' refused it ({error}) for {} (--route-timeout {})",
                humantime::format_duration(Duration::from_secs(refusing.as_secs())),
                humantime::format_duration(self.bound)
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_refusing_past_the_bound_makes_its_records_bad_until_a_commit_clears_it() {
        let t0 = Instant::now();
        let later = |s| t0 + Duration::from_secs(s);
        let mut r = Routes::new(
            Duration::from_secs(60),
            vec!["out".into(), "out.dlq".into()],
        );
        assert!(
            !r.refused("out", "UNKNOWN_TOPIC_OR_PARTITION", t0),
            "the output is no route"
        );
        assert!(r.refused("elsewhere", "UNKNOWN_TOPIC_OR_PARTITION", t0));
        assert!(!r.denied(), "a missing topic is no permission");
        assert_eq!(r.unroutable("elsewhere", later(59)), None);
        let why = r.unroutable("elsewhere", later(61)).unwrap();
        assert!(
            why.contains("'elsewhere'") && why.contains("UNKNOWN_TOPIC"),
            "{why}"
        );
        // Refused again: still since the first time.
        r.refused("elsewhere", "TOPIC_AUTHORIZATION_FAILED", later(61));
        assert!(r.take_denied() && !r.denied());
        assert!(
            r.unroutable("elsewhere", later(62))
                .unwrap()
                .contains("AUTHORIZATION")
        );
        // A unit that aborts clears nothing; one that commits with a record there does.
        r.sending("elsewhere");
        r.aborted();
        r.committed();
        assert!(r.unroutable("elsewhere", later(62)).is_some());
        r.sending("elsewhere");
        r.committed();
        assert_eq!(r.unroutable("elsewhere", later(62)), None);
        assert_eq!(r.unroutable("never-refused", later(62)), None);
    }
}
