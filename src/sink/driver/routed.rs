//! Records routed to a destination that refuses them for what it is (`sink::routes`): the
//! driver's part.

use std::time::Instant;

use tracing::warn;

use super::Driver;
use crate::error::Error;
use crate::events::AbortReason;
use crate::sink::SendError;
use crate::sink::routes::Routes;

impl Driver {
    /// Routes refusing for `routes`' bound make their records bad ones.
    pub fn set_routes(&mut self, routes: Routes) {
        self.routes = routes;
    }

    /// Why a record routed to `topic` is its own fault now, if it is.
    pub fn unroutable(&mut self, topic: &str) -> Option<String> {
        if !self.routes.refusing(topic) {
            return None;
        }
        // A delivery there since the unit began clears it, before a quarantine can start.
        self.hear(crate::sink::Wait::Now);
        self.routes
            .accepted(std::mem::take(&mut self.heard.accepted));
        self.routes.unroutable(topic, Instant::now())
    }

    /// A send to `topic` was refused at once for what the destination is.
    pub(super) fn unroutable_send(
        &mut self,
        topic: &str,
        error: &'static str,
    ) -> Result<(), SendError> {
        if self.routes.refused(topic, error, Instant::now()) {
            warn!(
                topic,
                error, "an output's topic refuses it; aborting, rewinding, backing off"
            );
            return self.aborted(AbortReason::RouteRefused);
        }
        if error == crate::kafka::failure::TOPIC_DENIED {
            // The output or dead-letter topic itself: nothing to do at run time.
            return Err(SendError::Fatal(self.write_denied(topic)));
        }
        self.aborted(AbortReason::ProduceFailed)
    }

    /// Takes what the sink says of refusing destinations. Returns the output or dead-letter
    /// topic if it was refused the permission to write (no route: exactly cannot run).
    pub(super) fn collect_routes(&mut self) -> Option<String> {
        let now = Instant::now();
        let mut denied = None;
        for (topic, error) in std::mem::take(&mut self.heard.routes) {
            if self.routes.refused(&topic, error, now) {
                warn!(
                    topic,
                    error, "an output's topic refuses it; aborting, rewinding, backing off"
                );
            } else if error == crate::kafka::failure::TOPIC_DENIED {
                denied = Some(topic);
            }
        }
        denied
    }

    /// A unit failed for want of a permission (`e`, an error that would stop exactly): for a
    /// route (the route's failure, which the abort takes), for the output or dead-letter
    /// topic, or for what the destination did not say (the sink waited to hear it: its
    /// feedback is heard).
    pub(super) fn denial(&mut self) -> Denial {
        self.heard.denied = None;
        let own = self.collect_routes();
        match own {
            _ if self.routes.denied() => Denial::Route,
            Some(topic) => Denial::Topic(self.write_denied(&topic)),
            None => Denial::Unsaid,
        }
    }

    /// The error that stops exactly when `topic`, the output or dead-letter topic, may not be
    /// written: the topic and the permission to grant.
    pub(super) fn write_denied(&self, topic: &str) -> Error {
        let which = self.routes.fixed_role(topic).unwrap_or("routed");
        Error::Denied(format!(
            "may not write the {which} topic '{topic}': grant the principal WRITE on topic \
             '{topic}' ({})",
            crate::kafka::failure::TOPIC_DENIED
        ))
    }
}

/// What a unit that failed for want of a permission failed for.
pub(super) enum Denial {
    /// A route: the route's failure.
    Route,
    /// The output or dead-letter topic: this error stops exactly.
    Topic(Error),
    /// librdkafka said no topic.
    Unsaid,
}
