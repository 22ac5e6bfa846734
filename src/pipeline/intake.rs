//! How a record read comes to be applied: decided once, at start, the mode carrying its own
//! state (Arroyo's `ConsistencyMode`).
//!
//! - [`Intake::Direct`]: the transform turns each record into outputs as it is read.
//! - [`Intake::Staged`]: the call-out. Records wait in the [`Stage`] until the application's
//!   answer for their batch is back; [`crate::transform::call::outputs`] turns each record and
//!   its answer into outputs.
//!
//! Either way the record then takes the same path into the open unit (`writer.rs`). The
//! intake is the one source of what was read but not yet applied ([`Unapplied`]): the first
//! records of partitions held for the direct mode ([`Held`]), the stage's first offsets for
//! the staged one.

use tokio_util::sync::CancellationToken;

use crate::config::{Config, TransformSpec};
use crate::error::Error;
use crate::kafka::Tp;
use crate::metrics::Metrics;
use crate::sink::{Settled, Unapplied};
use crate::transform::{self, Limits, Transform, call};

use super::held::Held;
use super::stage::Stage;

/// How records are applied.
pub enum Intake {
    /// As they are read, by the transform; the partitions it cannot take now are held.
    Direct(Box<dyn Transform>, Held),
    /// When the application's answer for their batch is back.
    Staged(Box<Stage>),
}

/// Partitions gained or lost, for the transform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// Now owned.
    Assigned(Vec<Tp>),
    /// No longer owned; their last transaction is settled.
    Revoked(Vec<Tp>),
}

impl Intake {
    /// The configured intake: the stateful stage (`--window`), the call-out (its calls run
    /// on `runtime`), or the transform (`--test-unavailable`: testing only, it refuses its
    /// first records as unavailable).
    pub async fn build(
        config: &Config,
        runtime: tokio::runtime::Handle,
        metrics: &Metrics,
        shutdown: &CancellationToken,
    ) -> Result<Intake, Error> {
        let transform = &config.transform;
        if let Some(dedup) = &config.dedup {
            let stage = transform::dedup::build(config, dedup, metrics, shutdown).await?;
            return Ok(Intake::direct(Box::new(stage)));
        }
        if let TransformSpec::Call(spec) = &transform.spec {
            let app = call::Http::new(spec, runtime)?;
            let stage = Stage::new(spec.clone(), Box::new(app), Limits::of(transform));
            return Ok(Intake::Staged(Box::new(stage)));
        }
        let t = transform::build(transform)?;
        let unavailable = config.test.unavailable;
        Ok(Intake::direct(transform::unavailable_first(t, unavailable)))
    }

    /// Records applied as they are read, by `t`.
    pub fn direct(t: Box<dyn Transform>) -> Intake {
        Intake::Direct(t, Held::default())
    }

    /// The partitions held, in the direct mode.
    pub fn held(&mut self) -> Option<&mut Held> {
        match self {
            Intake::Direct(_, held) => Some(held),
            Intake::Staged(_) => None,
        }
    }

    /// The stage, in the staged mode.
    pub fn stage(&mut self) -> Option<&mut Stage> {
        match self {
            Intake::Direct(..) => None,
            Intake::Staged(s) => Some(s.as_mut()),
        }
    }

    /// Whether records are staged or calls out.
    pub fn holds_records(&self) -> bool {
        matches!(self, Intake::Staged(s) if !s.is_empty())
    }

    /// The transform hears how the unit its records went into ended.
    pub fn settle(&mut self, settled: Settled) {
        if let Intake::Direct(t, _) = self {
            match settled {
                Settled::Committed => t.committed(),
                Settled::Dropped => t.dropped(true),
                Settled::Unknown => t.dropped(false),
            }
        }
    }

    /// The transform hears of a partition change.
    pub fn hear(&mut self, change: &Change) {
        if let Intake::Direct(t, _) = self {
            match change {
                Change::Assigned(ps) => t.assigned(ps),
                Change::Revoked(ps) => t.revoked(ps),
            }
        }
    }

    /// Partitions are revoked: nothing staged of them is applied.
    pub fn revoke(&mut self, partitions: &[Tp]) {
        if let Intake::Staged(s) = self {
            s.revoke(partitions);
        }
    }

    /// Drops everything staged: the rewind reads it again.
    pub fn clear(&mut self) {
        if let Intake::Staged(s) = self {
            s.clear();
        }
    }
}

impl Unapplied for Intake {
    fn firsts(&self) -> Vec<(Tp, i64)> {
        match self {
            Intake::Direct(_, held) => held.firsts().collect(),
            Intake::Staged(s) => s.firsts(),
        }
    }
}
