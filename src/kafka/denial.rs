//! What the cluster says when it says no, as librdkafka reports it: a client refused (its
//! error callback), a transaction denied a permission, a partition denied to a transaction, a
//! transactional request timed out (its log lines).

use std::sync::Mutex;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// The cluster refusing a client: a wrong password, a certificate one side does not trust.
/// librdkafka reports it to the client's error callback, once in 30 s, and keeps reconnecting
/// for ever; whoever waits on the client asks here whether it is waiting in vain.
#[derive(Debug, Default)]
pub struct Refusal(Mutex<Option<String>>);

impl Refusal {
    /// Notes an error from a client's error callback if it is a refusal.
    pub fn note(&self, error: &KafkaError, reason: &str) {
        if let Some(code) = error.rdkafka_error_code()
            && refuses(code, reason)
        {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.to_string());
        }
    }

    /// The last refusal, in librdkafka's words.
    pub fn get(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Whether a line librdkafka logs says the open transaction failed for want of a permission
/// ("TXNERR … Topic authorization failed … (TOPIC_AUTHORIZATION_FAILED)"). The calls that
/// fail after it may say only "Erroneous state", and an abort of such a transaction may fail
/// too, so without this line the pipeline would abort, recreate and retry for ever.
pub fn denied(facility: &str, message: &str) -> bool {
    facility == "TXNERR" && message.contains("_AUTHORIZATION_FAILED)")
}

/// The topic of a librdkafka log line saying a partition could not join the transaction for
/// want of the permission to write it (`ADDPARTS`: `Failed to add partition "T" [p] to
/// transaction: Broker: Topic authorization failed`).
pub fn denied_partition<'m>(facility: &str, message: &'m str) -> Option<&'m str> {
    if facility != "ADDPARTS" || !message.contains("Topic authorization failed") {
        return None;
    }
    let (_, rest) = message.split_once("Failed to add partition \"")?;
    rest.split_once("\" [").map(|(topic, _)| topic)
}

/// Whether a line of librdkafka's log says that a request of a transaction timed out on its
/// way to a broker (`REQTMOUT`, "Timed out ProduceRequest …"): the request may still land
/// later, in whatever transaction the producer runs then.
pub fn timed_out_txn_request(facility: &str, message: &str) -> bool {
    const TRANSACTIONAL: [&str; 5] = [
        "Produce",
        "AddPartitionsToTxn",
        "AddOffsetsToTxn",
        "TxnOffsetCommit",
        "EndTxn",
    ];
    facility == "REQTMOUT"
        && message
            .split_once("Timed out ")
            .and_then(|(_, m)| m.split_once("Request"))
            .is_some_and(|(api, _)| TRANSACTIONAL.contains(&api))
}

/// Whether an error of the client's connection means the cluster refuses it, which no
/// reconnect changes: authentication failed, the TLS handshake failed, or the broker ended
/// TLS with an alert (TLS 1.3 rejects a client certificate after the client's side of the
/// handshake, so librdkafka sees the alert as a transport error). Not what a broker going
/// away mid-handshake gives ("SSL transport error: Connection reset…"), nor an OAUTHBEARER
/// token the identity provider did not hand out in time: those pass.
fn refuses(code: RDKafkaErrorCode, reason: &str) -> bool {
    let transient = reason.contains("SSL transport error") || reason.contains("OAUTHBEARER token");
    match code {
        _ if transient => false,
        RDKafkaErrorCode::Authentication
        | RDKafkaErrorCode::SaslAuthenticationFailed
        | RDKafkaErrorCode::SSL => true,
        RDKafkaErrorCode::BrokerTransportFailure => {
            reason.contains("SSL") && reason.contains("alert")
        }
        _ => false,
    }
}
