//! The rewind after an abort: every partition read since it was assigned goes back to what is
//! committed for it.
//!
//! One rule covers every record the loop read and did not commit, whatever became of it (in
//! the aborted unit, staged for the call-out, polled while the rewind was owed, failed on its
//! way out): the sink's ledger (`sink::ledger`) notes the first offset read of each partition,
//! once, as it is polled, and the rewind seeks each such partition to its committed offset, as
//! the sink reads it back, or, where it has none, to what this instance last committed for it,
//! or, where nothing was, to that first offset; where the offsets are the group's, never below
//! what this process committed there (the driver holds it, `sink::ledger`). A commit never passes a record read but not
//! applied (`sink::offsets`), so each target is at or before every record that must come
//! again. A partition nothing was read from since it was assigned has not moved, and is left
//! alone (a seek of a partition still waiting for its first fetch fails in librdkafka).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::Interrupt;
use crate::backoff::Backoff;
use crate::error::Error;
use crate::health::Health;
use crate::kafka::{Tp, describe};
use crate::sink::{Committed, Driver, Group, SeekFailed, Unreadable};

/// What a rewind did.
#[derive(Debug, Default)]
pub struct Rewound {
    /// What the sink answered is committed (the partitions read, and those of a commit whose
    /// outcome is unknown).
    pub committed: Committed,
    /// Where each partition read went back to: its committed offset, or what stood in for it.
    pub to: Vec<(Tp, i64)>,
}

/// Seeks every assigned partition read since it was assigned to its committed offset (or what
/// this instance last committed, or its first offset read, with nothing committed: both from
/// the driver's [`Ledger`](crate::sink::ledger::Ledger)). Reading the committed offsets is
/// retried for up to `timeout`, then the consumer is replaced (a new one starts from the
/// committed offsets); a shutdown stops it at once (nothing is open, the loop ends next). What
/// is committed for the partitions read, and for those of a commit whose outcome the driver
/// does not know yet that are still assigned, and where each went back to, once the consumer
/// is back there (`None`: shutdown came first).
pub fn perform(
    group: &dyn Group,
    driver: &Driver,
    timeout: Duration,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<Option<Rewound>, Interrupt> {
    let assignment = (group.assignment()).map_err(|e| Error::kafka("reading the assignment", e))?;
    let (ledger, unresolved) = (driver.ledger(), driver.unresolved_partitions());
    let (read, also): (Vec<Tp>, Vec<Tp>) = assignment
        .into_iter()
        .filter(|tp| ledger.first_read(tp).is_some() || unresolved.contains(tp))
        .partition(|tp| ledger.first_read(tp).is_some());
    if read.is_empty() && also.is_empty() {
        return Ok(Some(Rewound::default()));
    }
    let asked: Vec<Tp> = read.iter().chain(&also).cloned().collect();
    let Some(answer) = committed(group, driver, &asked, timeout, health, shutdown)? else {
        return Ok(None);
    };
    // Each partition read: the sink's answer for it, if it gave one.
    let committed: HashMap<Tp, Option<i64>> = answer.iter().cloned().collect();
    let mut targets: Committed = read
        .into_iter()
        .map(|tp| {
            let c = committed.get(&tp).copied().flatten();
            let to = c
                .or_else(|| ledger.last_committed(&tp))
                .or_else(|| ledger.first_read(&tp));
            (tp, to)
        })
        .collect();
    // None below what this process committed: a group that lost its offsets answers less.
    driver.hold(&mut targets);
    let targets: Vec<(Tp, i64)> = (targets.into_iter())
        .filter_map(|(tp, to)| Some((tp, to?)))
        .collect();
    if targets.is_empty() {
        return Ok(Some(Rewound {
            committed: answer,
            to: targets,
        }));
    }
    match group.seek(&targets, timeout) {
        Ok(()) => {}
        Err(SeekFailed::Call(e)) => {
            let context = "rewinding to the committed offsets";
            return Err(Interrupt::Fail(Error::kafka(context, e)));
        }
        Err(SeekFailed::Partition((topic, partition), err)) => {
            // A partition that cannot be rewound must not be read on from where it stands:
            // its aborted records would be skipped. This consumer is being fenced or
            // rebalanced away; a new one starts from the committed offsets.
            warn!(topic, partition, error = %err, "seek failed");
            return Err(Interrupt::ReplaceConsumer(format!("seek failed: {err}")));
        }
    }
    let moved: Vec<Tp> = targets.iter().map(|(tp, _)| tp.clone()).collect();
    info!(partitions = %describe(&moved), "rewound to the committed offsets");
    Ok(Some(Rewound {
        committed: answer,
        to: targets,
    }))
}

/// What is committed for `partitions`, read again while that fails ([`Backoff::READ_COMMITTED`])
/// for up to `timeout`; `None` when shutdown began meanwhile.
fn committed(
    group: &dyn Group,
    driver: &Driver,
    partitions: &[Tp],
    timeout: Duration,
    health: &Health,
    shutdown: &CancellationToken,
) -> Result<Option<Committed>, Interrupt> {
    let give_up = Instant::now() + timeout;
    let mut failures = 0;
    loop {
        health.beat();
        let result = {
            let _g = health.in_call("committed offsets");
            // librdkafka answers on a queue of its own, so no rebalance callback (which takes
            // the session too) runs meanwhile.
            driver.committed(group, partitions, timeout)
        };
        let why = match result {
            Ok(c) => return Ok(Some(c)),
            Err(Unreadable::Exit(e)) => return Err(Interrupt::Fail(e)),
            Err(Unreadable::Retry(why)) => why,
        };
        if shutdown.is_cancelled() {
            return Ok(None);
        }
        if Instant::now() >= give_up {
            warn!(error = %why, "committed offsets unreadable; replacing the consumer");
            return Err(Interrupt::ReplaceConsumer(format!(
                "committed offsets unreadable: {why}"
            )));
        }
        warn!(error = %why, "reading committed offsets failed; retrying");
        failures += 1;
        let pause = Backoff::READ_COMMITTED.after(failures);
        crate::clock::pause(pause.min(give_up.saturating_duration_since(Instant::now())));
    }
}
