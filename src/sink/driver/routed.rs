//! Records routed to a destination that refuses them for what it is (`sink::routes`): the
//! driver's part.

use std::time::{Duration, Instant};

use rdkafka::error::RDKafkaErrorCode;
use tracing::warn;

use super::Driver;
use crate::error::Error;
use crate::events::AbortReason;
use crate::sink::SendError;
use crate::sink::routes::Routes;

/// How long a unit that failed for want of a permission waits to hear why (librdkafka's log
/// lines, which its producer thread serves within milliseconds).
const HEAR_DENIAL: Duration = Duration::from_secs(2);

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
        self.routes.accepted(self.sink.take_accepted_routes());
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
        if error == crate::error::TOPIC_DENIED {
            // The output or dead-letter topic itself: nothing to do at run time.
            return Err(SendError::Fatal(Error::Denied(format!(
                "may not write topic '{topic}' ({error})"
            ))));
        }
        self.aborted(AbortReason::ProduceFailed)
    }

    /// Takes what the sink says of refusing destinations.
    pub(super) fn collect_routes(&mut self) {
        let now = Instant::now();
        for (topic, error) in self.sink.take_refused_routes() {
            if self.routes.refused(&topic, error, now) {
                warn!(
                    topic,
                    error, "an output's topic refuses it; aborting, rewinding, backing off"
                );
            }
        }
    }

    /// A unit failed for want of a permission (`e`, an error that would stop exactly): whether
    /// a route was refused it meanwhile, which makes it the route's failure (the abort takes
    /// it). The sink hears the route's refusal before the unit's denial but may hear both
    /// after the call returned `e`: the denial first, up to [`HEAR_DENIAL`].
    pub(super) fn failed_for_a_route(&mut self) -> bool {
        let _ = self.sink.take_denied(HEAR_DENIAL);
        self.collect_routes();
        self.routes.denied()
    }
}

/// Whether `e` is the cluster refusing a topic's permission (which a route may have caused).
pub(super) fn topic_denied(e: &Error) -> bool {
    matches!(e, Error::Unrecoverable { source, .. }
        if source.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed))
}
