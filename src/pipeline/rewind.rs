//! The rewind after an abort: every owned partition back to what the group has committed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{Interrupt, PipelineConsumer};
use crate::error::{Action, Call, Error, Facts, classify};
use crate::health::Health;
use crate::kafka::describe;
use crate::transform::Tp;

/// Seeks each assigned partition to its committed offset (the broker's word, read after the
/// aborted or unknown transaction was settled). A partition with no committed offset goes back
/// to where the aborted transaction first read it. Reading the committed offsets is retried
/// for up to `timeout`, then the consumer is replaced (a new one starts from the committed
/// offsets); a shutdown stops it at once (nothing is open, the loop ends next).
pub(super) fn rewind(
    consumer: &PipelineConsumer,
    firsts: &HashMap<Tp, i64>,
    timeout: Duration,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<(), Interrupt> {
    let assignment = consumer.assignment().map_err(|e| Error::Unrecoverable {
        context: "reading the assignment".into(),
        source: e,
    })?;
    if assignment.count() == 0 {
        return Ok(());
    }
    let mut backoff = Duration::from_millis(100);
    let give_up = Instant::now() + timeout;
    let committed = loop {
        health.beat();
        let result = {
            let _g = health.in_call("committed offsets");
            // What the sink says is committed. librdkafka answers on a queue of its own, so no
            // rebalance callback (which takes the driver too) runs meanwhile.
            let driver = consumer.context().driver();
            driver.committed(consumer, assignment.clone(), timeout)
        };
        match result {
            Ok(c) => break c,
            Err(e) => {
                if classify(Call::SendOffsets, &Facts::of(&e)) == Action::Exit {
                    return Err(Interrupt::Fail(Error::Unrecoverable {
                        context: "reading committed offsets".into(),
                        source: e,
                    }));
                }
                if shutdown.is_cancelled() {
                    return Ok(());
                }
                if Instant::now() >= give_up {
                    warn!(error = %e, "committed offsets unreadable; replacing the consumer");
                    return Err(Interrupt::ReplaceConsumer(e));
                }
                warn!(error = %e, "reading committed offsets failed; retrying");
                std::thread::sleep(backoff.min(give_up.saturating_duration_since(Instant::now())));
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    };
    let mut seek = TopicPartitionList::new();
    for e in committed.elements() {
        let target = match e.offset() {
            Offset::Offset(o) => Some(o),
            _ => firsts.get(&(e.topic().to_string(), e.partition())).copied(),
        };
        if let Some(o) = target {
            let _ = seek.add_partition_offset(e.topic(), e.partition(), Offset::Offset(o));
        }
    }
    if seek.count() == 0 {
        return Ok(());
    }
    let result = consumer
        .seek_partitions(seek, timeout)
        .map_err(|e| Error::Unrecoverable {
            context: "rewinding to the committed offsets".into(),
            source: e,
        })?;
    for e in result.elements() {
        if let Err(err) = e.error() {
            // A partition that cannot be rewound must not be read on from where it stands:
            // its aborted records would be skipped. This consumer is being fenced or
            // rebalanced away; a new one starts from the committed offsets.
            warn!(topic = e.topic(), partition = e.partition(), error = %err, "seek failed");
            return Err(Interrupt::ReplaceConsumer(err));
        }
    }
    info!(partitions = %describe(&result), "rewound to the committed offsets");
    Ok(())
}
