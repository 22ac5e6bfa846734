//! Liveness of the pipeline loop, watched from outside it.
//!
//! librdkafka's transaction calls block the loop thread. The loop records a heartbeat on every
//! turn and names each blocking call while it is in it; [`Health::stalled`] tells from another
//! thread whether the loop has been stuck longer than a bound, and in what. The watchdog logs
//! it; the HTTP health endpoint (`/livez`) will answer from it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use humantime::format_duration;
use prometheus::HistogramVec;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// A librdkafka call this long is logged as waiting (and every [`AGAIN`] after).
const NOTICE: Duration = Duration::from_secs(5);
/// See [`NOTICE`].
const AGAIN: Duration = Duration::from_secs(15);

/// Shared between the loop (writer) and its watchers (readers).
#[derive(Debug)]
pub struct Health {
    epoch: Instant,
    last_beat_ms: AtomicU64,
    /// The call in progress: its name, since when, and whether it is a librdkafka call that
    /// was given a timeout (only those can be stuck for good, see [`Health::watch`]).
    call: Mutex<Option<(&'static str, Instant, bool)>>,
    ready: AtomicBool,
    /// Where each call's time goes when it ends, if anywhere
    /// (`exactly_blocking_call_duration_seconds`).
    durations: Option<HistogramVec>,
}

/// Clears the current call when dropped.
pub struct InCall<'a>(&'a Health);

impl Drop for InCall<'_> {
    fn drop(&mut self) {
        let ended = self.0.call.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let (Some((name, since, _)), Some(h)) = (ended, &self.0.durations) {
            h.with_label_values(&[name])
                .observe(since.elapsed().as_secs_f64());
        }
        self.0.beat();
    }
}

impl Default for Health {
    fn default() -> Self {
        Health {
            epoch: Instant::now(),
            last_beat_ms: AtomicU64::new(0),
            call: Mutex::new(None),
            ready: AtomicBool::new(false),
            durations: None,
        }
    }
}

impl Health {
    /// A health whose calls' durations are observed in `durations` (by call name).
    pub fn timed(durations: HistogramVec) -> Health {
        Health {
            durations: Some(durations),
            ..Health::default()
        }
    }

    /// The loop is alive now.
    pub fn beat(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last_beat_ms.store(ms, Ordering::Relaxed);
    }

    /// The loop enters a blocking call named `name` until the guard drops.
    pub fn in_call(&self, name: &'static str) -> InCall<'_> {
        self.enter(name, false)
    }

    /// Like [`Health::in_call`], for a librdkafka call given the transaction timeout: past
    /// the watchdog's bound it counts as stuck for good and the process leaves. (A database
    /// write or an at-least-once settle may legitimately take longer: only logged.)
    pub fn in_kafka_call(&self, name: &'static str) -> InCall<'_> {
        self.enter(name, true)
    }

    fn enter(&self, name: &'static str, kafka: bool) -> InCall<'_> {
        *self.call.lock().unwrap_or_else(|p| p.into_inner()) = Some((name, Instant::now(), kafka));
        self.beat();
        InCall(self)
    }

    /// Initialised and consuming (true), or starting / shutting down (false).
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// See [`Health::set_ready`].
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// `Some(description)` when the loop has not moved for longer than `bound`.
    pub fn stalled(&self, bound: Duration) -> Option<String> {
        self.stalled_at(Instant::now(), bound)
    }

    fn stalled_at(&self, now: Instant, bound: Duration) -> Option<String> {
        let last = self.epoch + Duration::from_millis(self.last_beat_ms.load(Ordering::Relaxed));
        let quiet = now.saturating_duration_since(last);
        if quiet <= bound {
            return None;
        }
        let call = *self.call.lock().unwrap_or_else(|p| p.into_inner());
        Some(match call {
            Some((name, since, _)) => format!(
                "pipeline loop stuck in {name} for {:.0?}",
                now.saturating_duration_since(since)
            ),
            None => format!("pipeline loop has not turned for {quiet:.0?}"),
        })
    }

    /// `Some(description)` when the loop has been inside one client call for longer than
    /// `bound`: a call that ignores its own timeout (librdkafka has some, see
    /// [`Health::watch`]). Time spent outside a call (a long transform) never counts.
    pub fn stuck_in_call(&self, bound: Duration) -> Option<String> {
        self.stuck_in_call_at(Instant::now(), bound)
    }

    fn stuck_in_call_at(&self, now: Instant, bound: Duration) -> Option<String> {
        let (name, since) = self.kafka_call()?;
        let inside = now.saturating_duration_since(since);
        (inside > bound).then(|| {
            format!(
                "the pipeline loop is stuck in {name} for {inside:.0?}, waiting on {}, past \
                 --stuck-call-timeout {}",
                waits_on(name),
                format_duration(bound)
            )
        })
    }

    /// `Some(description)` when the loop is inside a librdkafka call as the shutdown grace
    /// ends: the call kept the loop from committing and leaving in time, so it is stuck as
    /// surely as one past `--stuck-call-timeout` (the restart fences what it holds).
    pub fn stuck_at_grace(&self) -> Option<String> {
        self.stuck_at_grace_at(Instant::now())
    }

    fn stuck_at_grace_at(&self, now: Instant) -> Option<String> {
        let (name, since) = self.kafka_call()?;
        let inside = now.saturating_duration_since(since);
        Some(format!(
            "the pipeline loop is stuck in {name} for {inside:.0?}, waiting on {}, as the \
             shutdown grace ends",
            waits_on(name)
        ))
    }

    /// The librdkafka call the loop is in, and since when.
    fn kafka_call(&self) -> Option<(&'static str, Instant)> {
        match *self.call.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((name, since, true)) => Some((name, since)),
            _ => None,
        }
    }

    /// Logs when the loop stalls (`bound`) and when it recovers, until `stop` is cancelled;
    /// returns the description when the loop has been inside one client call for longer than
    /// `leave_after`, so that the process can leave.
    ///
    /// Every call is given a timeout, but librdkafka does not always keep it: a transactional
    /// request to a coordinator that died or froze can wait for ever (librdkafka #5456: the
    /// coordinator request's timeout is never checked). Nothing returns the loop from there;
    /// a restart of the process does, safely: the new producer's `init_transactions` fences
    /// the stuck one and aborts its transaction, and the group's offsets are where the last
    /// commit left them.
    ///
    /// While the loop waits inside a librdkafka call, `exactly_kafka_call_waiting_seconds` says
    /// for how long, and a call past [`NOTICE`] is logged with what it waits on, and again
    /// when it returns.
    pub async fn watch(
        self: Arc<Self>,
        bound: Duration,
        leave_after: Duration,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
    ) -> Option<String> {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut stalled = false;
        let mut notices = Notices::default();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return None,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            let call = self.kafka_call();
            let inside = call.map_or(Duration::ZERO, |(_, s)| now.saturating_duration_since(s));
            metrics.kafka_call_waiting.set(inside.as_secs_f64());
            for notice in notices.tick(now, call) {
                notice.log(leave_after);
            }
            if let Some(what) = self.stuck_in_call(leave_after) {
                return Some(what);
            }
            match self.stalled(bound) {
                Some(what) if !stalled => {
                    tracing::error!(bound = ?bound, "{what}");
                    stalled = true;
                }
                None if stalled => {
                    tracing::info!("pipeline loop moving again");
                    stalled = false;
                }
                _ => {}
            }
        }
    }
}

/// What a librdkafka call waits on, for the operator reading why it takes long.
fn waits_on(call: &str) -> &'static str {
    match call {
        "init_transactions" | "begin_transaction" | "commit_transaction" | "abort_transaction" => {
            "the transaction coordinator"
        }
        // AddOffsetsToTxn to the transaction coordinator, then TxnOffsetCommit to the group's.
        "send_offsets_to_transaction" => "the transaction coordinator, then the group coordinator",
        "flush" => "the output partitions' leaders",
        _ => "the brokers",
    }
}

/// Something to tell about a librdkafka call that takes long.
#[derive(Debug, PartialEq)]
enum Notice {
    /// Still inside `call`, for `inside`.
    Waiting {
        call: &'static str,
        inside: Duration,
    },
    /// A call that was told about returned, after about `after`.
    Returned { call: &'static str, after: Duration },
}

impl Notice {
    fn log(&self, leave_after: Duration) {
        match *self {
            Notice::Waiting { call, inside } => tracing::warn!(
                call,
                waiting_on = waits_on(call),
                inside_s = inside.as_secs(),
                "waiting on {} in {call} for {}; exactly leaves at {} (--stuck-call-timeout)",
                waits_on(call),
                format_duration(Duration::from_secs(inside.as_secs())),
                format_duration(leave_after)
            ),
            Notice::Returned { call, after } => tracing::info!(
                call,
                after_s = after.as_secs(),
                "{call} returned after about {}",
                format_duration(Duration::from_secs(after.as_secs()))
            ),
        }
    }
}

/// Which long librdkafka calls were told about: each once it passes [`NOTICE`], again every
/// [`AGAIN`], and once when it returns.
#[derive(Debug, Default)]
struct Notices {
    /// The call told about (name, since) and when it was last told.
    told: Option<(&'static str, Instant, Instant)>,
}

impl Notices {
    /// What to tell at `now`, the loop being in `call` (name, since) or in none.
    fn tick(&mut self, now: Instant, call: Option<(&'static str, Instant)>) -> Vec<Notice> {
        let mut notices = Vec::new();
        if let Some((name, since, _)) = self.told
            && call != Some((name, since))
        {
            // It returned before the next call began (or before now).
            let end = call.map_or(now, |(_, next)| next);
            notices.push(Notice::Returned {
                call: name,
                after: end.saturating_duration_since(since),
            });
            self.told = None;
        }
        let Some((name, since)) = call else {
            return notices;
        };
        let inside = now.saturating_duration_since(since);
        let due = match self.told {
            None => inside >= NOTICE,
            Some((_, _, last)) => now.saturating_duration_since(last) >= AGAIN,
        };
        if due {
            self.told = Some((name, since, now));
            notices.push(Notice::Waiting { call: name, inside });
        }
        notices
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_call_is_told_at_5s_every_15s_after_and_when_it_returns() {
        let mut n = Notices::default();
        let t0 = Instant::now();
        let s = |secs| t0 + Duration::from_secs(secs);
        let call = Some(("send_offsets_to_transaction", t0));
        let waiting = |secs| Notice::Waiting {
            call: "send_offsets_to_transaction",
            inside: Duration::from_secs(secs),
        };
        let told: Vec<Vec<Notice>> = (1..=36).map(|i| n.tick(s(i), call)).collect();
        let at: Vec<u64> = (1..=36)
            .filter(|i| !told[*i as usize - 1].is_empty())
            .collect();
        assert_eq!(at, [5, 20, 35]);
        assert_eq!(told[4], [waiting(5)]);
        assert_eq!(told[19], [waiting(20)]);
        // It returned; the next call began at 37 s and is quick: one line, with its length.
        let next = Some(("commit_transaction", s(37)));
        assert_eq!(
            n.tick(s(38), next),
            [Notice::Returned {
                call: "send_offsets_to_transaction",
                after: Duration::from_secs(37)
            }]
        );
        assert!(n.tick(s(39), next).is_empty());
        assert!(n.tick(s(40), None).is_empty());
        // A quick call is never told about; a retry of the same call is a new call.
        let mut n = Notices::default();
        assert!(n.tick(s(4), Some(("flush", t0))).is_empty());
        assert!(n.tick(s(8), Some(("flush", s(5)))).is_empty());
        assert_eq!(n.tick(s(10), Some(("flush", s(5)))).len(), 1);
    }

    #[test]
    fn a_call_still_open_when_the_grace_ends_is_stuck_and_none_is_not() {
        let h = Health::default();
        assert_eq!(h.stuck_at_grace(), None);
        {
            let _g = h.in_call("transform");
            assert_eq!(h.stuck_at_grace(), None, "not a librdkafka call");
        }
        let _g = h.in_kafka_call("send_offsets_to_transaction");
        let s = h
            .stuck_at_grace_at(Instant::now() + Duration::from_secs(30))
            .unwrap();
        assert!(
            s.contains("stuck in send_offsets_to_transaction for 30")
                && s.contains("the group coordinator")
                && s.contains("shutdown grace"),
            "{s}"
        );
    }

    #[test]
    fn a_stuck_call_names_what_it_waits_on_and_the_bound() {
        let h = Health::default();
        let _g = h.in_kafka_call("send_offsets_to_transaction");
        let bound = Duration::from_secs(36);
        let s = h
            .stuck_in_call_at(Instant::now() + Duration::from_secs(37), bound)
            .unwrap();
        assert!(
            s.contains("stuck in send_offsets_to_transaction")
                && s.contains("the group coordinator")
                && s.contains("--stuck-call-timeout 36s"),
            "{s}"
        );
    }

    #[test]
    fn a_fresh_beat_is_not_stalled() {
        let h = Health::default();
        h.beat();
        assert_eq!(h.stalled(Duration::from_secs(5)), None);
    }

    #[test]
    fn a_long_call_is_reported_by_name() {
        let h = Health::default();
        let _g = h.in_call("commit_transaction");
        let later = Instant::now() + Duration::from_secs(30);
        let s = h.stalled_at(later, Duration::from_secs(10)).unwrap();
        assert!(s.contains("commit_transaction"), "{s}");
    }

    #[test]
    fn leaving_the_call_clears_it() {
        let h = Health::default();
        drop(h.in_call("abort_transaction"));
        let later = Instant::now() + Duration::from_secs(30);
        let s = h.stalled_at(later, Duration::from_secs(10)).unwrap();
        assert!(s.contains("has not turned"), "{s}");
    }

    #[test]
    fn only_a_call_past_the_bound_is_stuck() {
        let h = Health::default();
        let (now, bound) = (Instant::now(), Duration::from_secs(40));
        // Outside any call (a transform that takes long): never stuck.
        assert_eq!(
            h.stuck_in_call_at(now + Duration::from_secs(600), bound),
            None
        );
        // A call that may legitimately take long (a database write): never stuck.
        let g = h.in_call("database commit");
        assert_eq!(
            h.stuck_in_call_at(now + Duration::from_secs(600), bound),
            None
        );
        drop(g);
        let g = h.in_kafka_call("send_offsets_to_transaction");
        assert_eq!(
            h.stuck_in_call_at(now + Duration::from_secs(30), bound),
            None
        );
        let s = h
            .stuck_in_call_at(now + Duration::from_secs(41), bound)
            .unwrap();
        assert!(s.contains("send_offsets_to_transaction"), "{s}");
        // A retry enters the call anew: the bound is per call, not per loop turn.
        drop(g);
        let _g = h.in_kafka_call("send_offsets_to_transaction");
        assert_eq!(
            h.stuck_in_call_at(Instant::now() + Duration::from_secs(30), bound),
            None
        );
    }

    #[test]
    fn each_call_is_timed_under_its_name_when_it_ends() {
        let m = Metrics::new();
        let h = Health::timed(m.blocking_call_duration.clone());
        let count = |name| {
            m.blocking_call_duration
                .with_label_values(&[name])
                .get_sample_count()
        };
        let g = h.in_kafka_call("flush");
        assert_eq!(count("flush"), 0, "observed only when the call ends");
        std::thread::sleep(Duration::from_millis(20));
        drop(g);
        drop(h.in_call("commit_transaction"));
        assert_eq!((count("flush"), count("commit_transaction")), (1, 1));
        let flush = m.blocking_call_duration.with_label_values(&["flush"]);
        assert!(flush.get_sample_sum() >= 0.02, "{}", flush.get_sample_sum());
    }

    #[test]
    fn readiness_flag() {
        let h = Health::default();
        assert!(!h.is_ready());
        h.set_ready(true);
        assert!(h.is_ready());
    }
}
