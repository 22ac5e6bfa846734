//! The stateful stage built at start: its programs compiled first (a bad one fails start-up
//! before any client exists), then its local store opened and its changelog topic created or
//! checked.

use tokio_util::sync::CancellationToken;

use super::{Dedup, programs};
use crate::config::{self, Config, DedupConfig};
use crate::error::Error;
use crate::metrics::Metrics;
use crate::state;

/// The stage of `dedup`, in front of `config`'s transform.
pub async fn build(
    config: &Config,
    dedup: &DedupConfig,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Result<Dedup, Error> {
    let programs = programs(dedup, &config.transform)?;
    let store = match &dedup.state_dir {
        None => None,
        Some(dir) => {
            let open = || {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                state::store::Redb::open(&dir.join(format!("{}.redb", dedup.changelog)))
            };
            let store = open().map_err(|e| Error::Config(format!("--state-dir: {e}")))?;
            Some(Box::new(store) as Box<dyn state::store::Store>)
        }
    };
    let config::Input::Topics(topics) = &config.group.input else {
        return Err(Error::Config("--window: needs --input-topics".into()));
    };
    let input = topics.first().map(String::as_str).unwrap_or_default();
    let wanted = state::topic::Wanted {
        changelog: &dedup.changelog,
        input,
        retention: dedup.retention,
    };
    let admin = state::topic::admin(&config.kafka)?;
    state::topic::ensure(&admin, &wanted, config.sink.startup_timeout)
        .await
        .map_err(|e| Error::Startup(format!("--state-changelog: {e}")))?;
    let source = state::restore::KafkaChangelog::new(
        &config.kafka,
        &dedup.changelog,
        config.sink.transaction_timeout,
        shutdown.clone(),
    )?
    .growing(admin, tokio::runtime::Handle::current());
    let t = Dedup::new(dedup, programs, Box::new(source), store, metrics.clone());
    Ok(t)
}
