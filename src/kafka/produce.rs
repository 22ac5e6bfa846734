//! Producing through topic handles made once per topic.
//!
//! rust-rdkafka's `send` names the topic for every record (`RD_KAFKA_VTYPE_TOPIC`): a `CString`
//! allocated and freed, and librdkafka looking the topic up by name under its handle lock,
//! taking and dropping a reference. [`HandleProducer::send`] here hands librdkafka a topic handle
//! (`RD_KAFKA_VTYPE_RKT`) it keeps per topic instead; everything else is what rust-rdkafka
//! passes: the payload and key copied, the headers given over on success, the delivery opaque
//! as rust-rdkafka's `usize` opaque (so its delivery callback sees the same value).

use std::cell::RefCell;
use std::ffi::{CString, c_void};
use std::ptr::{self, NonNull};

use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{Producer as _, ProducerContext, ThreadedProducer};
use rdkafka_sys as rdsys;
use rdsys::rd_kafka_vtype_t::*;

/// More topics than this (an envelope transform spreading records over many) and the handles
/// are let go and made again as needed.
const MAX_HANDLES: usize = 64;

/// One record to produce.
pub struct Message<'a> {
    /// Topic.
    pub topic: &'a str,
    /// Partition, or `None` for the partitioner's choice (by key).
    pub partition: Option<i32>,
    /// Key, copied by librdkafka.
    pub key: Option<&'a [u8]>,
    /// Value, copied by librdkafka.
    pub value: Option<&'a [u8]>,
    /// Milliseconds since the epoch, or `None` for the time of sending.
    pub timestamp: Option<i64>,
    /// Headers; librdkafka takes them when the record is accepted.
    pub headers: OwnedHeaders,
    /// The delivery opaque.
    pub opaque: usize,
}

/// A producer and its topic handles. The handles go first (fields drop in order), before the
/// producer they belong to.
pub struct HandleProducer<C: ProducerContext<DeliveryOpaque = usize> + 'static> {
    handles: RefCell<Vec<(String, Handle)>>,
    inner: ThreadedProducer<C>,
}

impl<C: ProducerContext<DeliveryOpaque = usize> + 'static> HandleProducer<C> {
    /// Wraps `inner`.
    pub fn new(inner: ThreadedProducer<C>) -> Self {
        HandleProducer {
            handles: RefCell::default(),
            inner,
        }
    }

    /// The rust-rdkafka producer, for everything but sending.
    pub fn inner(&self) -> &ThreadedProducer<C> {
        &self.inner
    }

    /// Hands one record to librdkafka. On failure the record's headers come back (librdkafka
    /// took nothing), to send again after `QueueFull`.
    pub fn send(&self, r: Message<'_>) -> Result<(), (RDKafkaErrorCode, OwnedHeaders)> {
        let rkt = match self.handle(r.topic) {
            Ok(rkt) => rkt,
            Err(code) => return Err((code, r.headers)),
        };
        let (value, value_len) = bytes(r.value);
        let (key, key_len) = bytes(r.key);
        // The headers object's address: `as_borrowed` is a view of the native pointer.
        let headers = r.headers.as_borrowed() as *const _ as *mut rdsys::rd_kafka_headers_t;
        // SAFETY: the client and the topic handle are alive for the call (the handle belongs
        // to this client); payload and key are copied (MSG_F_COPY) before the call returns;
        // the argument list is what rd_kafka_producev expects, ended by VTYPE_END.
        let err = unsafe {
            rdsys::rd_kafka_producev(
                self.inner.client().native_ptr(),
                RD_KAFKA_VTYPE_RKT,
                rkt,
                RD_KAFKA_VTYPE_PARTITION,
                // RD_KAFKA_PARTITION_UA: the partitioner's choice.
                r.partition.unwrap_or(-1i32),
                RD_KAFKA_VTYPE_MSGFLAGS,
                rdsys::RD_KAFKA_MSG_F_COPY,
                RD_KAFKA_VTYPE_VALUE,
                value,
                value_len,
                RD_KAFKA_VTYPE_KEY,
                key,
                key_len,
                RD_KAFKA_VTYPE_OPAQUE,
                r.opaque as *mut c_void,
                RD_KAFKA_VTYPE_TIMESTAMP,
                r.timestamp.unwrap_or(0),
                RD_KAFKA_VTYPE_HEADERS,
                headers,
                RD_KAFKA_VTYPE_END,
            )
        };
        if err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            // librdkafka owns the headers now.
            std::mem::forget(r.headers);
            Ok(())
        } else {
            Err((err.into(), r.headers))
        }
    }

    /// The handle of `topic`, made on first use.
    fn handle(&self, topic: &str) -> Result<*mut rdsys::rd_kafka_topic_t, RDKafkaErrorCode> {
        let mut handles = self.handles.borrow_mut();
        if let Some((_, h)) = handles.iter().find(|(name, _)| name == topic) {
            return Ok(h.0.as_ptr());
        }
        let name = CString::new(topic).map_err(|_| RDKafkaErrorCode::InvalidArgument)?;
        // SAFETY: the client is alive; librdkafka copies the name; a null config means the
        // client's defaults.
        let rkt = unsafe {
            rdsys::rd_kafka_topic_new(
                self.inner.client().native_ptr(),
                name.as_ptr(),
                ptr::null_mut(),
            )
        };
        // SAFETY: reads this thread's last librdkafka error.
        let last_error = || RDKafkaErrorCode::from(unsafe { rdsys::rd_kafka_last_error() });
        let rkt = NonNull::new(rkt).ok_or_else(last_error)?;
        if handles.len() == MAX_HANDLES {
            handles.clear();
        }
        handles.push((topic.to_string(), Handle(rkt)));
        Ok(rkt.as_ptr())
    }
}

/// A topic handle, released on drop.
struct Handle(NonNull<rdsys::rd_kafka_topic_t>);

// SAFETY: librdkafka's topic handles may be used and released from any thread.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: made by rd_kafka_topic_new, released once; records already handed over keep
        // librdkafka's own reference to the topic.
        unsafe { rdsys::rd_kafka_topic_destroy(self.0.as_ptr()) }
    }
}

/// A plain producer, for a tool that writes a batch and waits for it (`exactly state import`).
pub struct Writer(ThreadedProducer<rdkafka::producer::DefaultProducerContext>);

impl Writer {
    /// Created by `client` (its role says how: idempotent, say).
    pub fn create(client: &super::Client) -> Result<Writer, super::NotCreated> {
        Ok(Writer(client.create()?))
    }

    /// Writes `records` (partition, key, value) to `topic`, and waits up to `timeout` for all
    /// of them to be sent.
    pub fn write_all(
        &self,
        topic: &str,
        records: &[(i32, Vec<u8>, Vec<u8>)],
        timeout: std::time::Duration,
    ) -> Result<(), String> {
        write_all(&self.0, topic, records, timeout)
    }
}

fn write_all(
    producer: &ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
    topic: &str,
    records: &[(i32, Vec<u8>, Vec<u8>)],
    timeout: std::time::Duration,
) -> Result<(), String> {
    use rdkafka::producer::BaseRecord;
    for (partition, key, value) in records {
        let mut record = BaseRecord::to(topic)
            .partition(*partition)
            .key(key)
            .payload(value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, r)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                    record = r;
                    producer.poll(std::time::Duration::from_millis(10));
                }
                Err((e, _)) => return Err(format!("producing: {e}")),
            }
        }
    }
    (producer.flush(timeout)).map_err(|e| format!("delivering the keys: {e}"))
}

fn bytes(b: Option<&[u8]>) -> (*mut c_void, usize) {
    b.map_or((ptr::null_mut(), 0), |b| {
        (b.as_ptr() as *mut c_void, b.len())
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rdkafka::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Header, Headers, Message as _};
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::{DeliveryResult, ProducerContext};
    use std::sync::Mutex;

    use super::*;

    /// Keeps the opaque of every delivery report.
    #[derive(Default)]
    struct Reports(Mutex<Vec<(usize, bool)>>);
    impl rdkafka::client::ClientContext for Reports {}
    impl ProducerContext for Reports {
        type DeliveryOpaque = usize;
        fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
            self.0.lock().unwrap().push((opaque, result.is_ok()));
        }
    }

    type Got = (
        String,
        Option<Vec<u8>>,
        Option<Vec<u8>>,
        Option<i64>,
        Option<Vec<u8>>,
    );

    /// Up to `n` records of topics a and b: topic, key, value, timestamp, first header.
    fn read_back(bootstrap: &str, n: usize) -> Vec<Got> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", "g")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("consumer");
        consumer.subscribe(&["a", "b"]).expect("subscribe");
        let mut got = Vec::new();
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while got.len() < n && std::time::Instant::now() < until {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                let h = m.headers().map(|h| h.get(0).value.map(<[u8]>::to_vec));
                got.push((
                    m.topic().to_string(),
                    m.key().map(<[u8]>::to_vec),
                    m.payload().map(<[u8]>::to_vec),
                    m.timestamp().to_millis(),
                    h.flatten(),
                ));
            }
        }
        got
    }

    #[test]
    fn records_arrive_as_sent_through_the_handles_and_errors_return_the_headers() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        for t in ["a", "b"] {
            cluster.create_topic(t, 1, 1).expect("topic");
        }
        let inner: ThreadedProducer<Reports> = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("message.max.bytes", "2000")
            .create_with_context(Reports::default())
            .expect("producer");
        let p = HandleProducer::new(inner);
        let headers = |v: &str| {
            OwnedHeaders::new().insert(Header {
                key: "h",
                value: Some(v),
            })
        };
        let sends = [
            (
                "a",
                Some(&b"k1"[..]),
                Some(&b"v1"[..]),
                Some(1_700_000_000_000),
                7,
            ),
            ("b", None, Some(&b"v2"[..]), None, 8),
            ("a", Some(&b"k3"[..]), None, Some(1_700_000_000_003), 9),
        ];
        for (topic, key, value, timestamp, opaque) in sends {
            let r = Message {
                topic,
                partition: None,
                key,
                value,
                timestamp,
                headers: headers(&format!("h{opaque}")),
                opaque,
            };
            p.send(r).map_err(|(c, _)| c).expect("send");
        }
        // Two topics, two handles, whatever the number of records.
        assert_eq!(p.handles.borrow().len(), 2);
        // librdkafka's own check refuses a record larger than message.max.bytes, and the
        // headers come back.
        let big = vec![0u8; 4000];
        let refused = p.send(Message {
            topic: "a",
            partition: None,
            key: None,
            value: Some(&big),
            timestamp: None,
            headers: headers("back"),
            opaque: 10,
        });
        let (code, back) = refused.expect_err("too large");
        assert_eq!(code, RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(back.get(0).value, Some(&b"back"[..]));
        assert!(crate::kafka::flush(p.inner(), Duration::from_secs(10)).is_ok());

        let mut reports = p.inner().context().0.lock().unwrap().clone();
        reports.sort();
        assert_eq!(reports, [(7, true), (8, true), (9, true)]);

        let mut got = read_back(&cluster.bootstrap_servers(), 3);
        got.sort();
        as_sent(&got);
    }

    #[test]
    fn a_record_goes_to_the_partition_it_names() {
        let cluster = MockCluster::new(1).expect("mock cluster");
        cluster.create_topic("a", 3, 1).expect("topic");
        let inner: ThreadedProducer<Reports> = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .create_with_context(Reports::default())
            .expect("producer");
        let p = HandleProducer::new(inner);
        for (i, key) in [&b"k1"[..], b"k2", b"k3", b"k4"].into_iter().enumerate() {
            let r = Message {
                topic: "a",
                partition: Some(2),
                key: Some(key),
                value: Some(b"v"),
                timestamp: None,
                headers: OwnedHeaders::new(),
                opaque: i,
            };
            p.send(r).map_err(|(c, _)| c).expect("send");
        }
        assert!(crate::kafka::flush(p.inner(), Duration::from_secs(10)).is_ok());
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", cluster.bootstrap_servers())
            .set("group.id", "g")
            .set("auto.offset.reset", "earliest")
            .create()
            .expect("consumer");
        consumer.subscribe(&["a"]).expect("subscribe");
        let mut partitions = Vec::new();
        let until = std::time::Instant::now() + Duration::from_secs(20);
        while partitions.len() < 4 && std::time::Instant::now() < until {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                partitions.push(m.partition());
            }
        }
        assert_eq!(partitions, [2, 2, 2, 2], "keys would spread them");
    }

    /// What `records_arrive_as_sent…` sent, read back (sorted).
    fn as_sent(got: &[Got]) {
        let v = |s: &str| Some(s.as_bytes().to_vec());
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(
            (&got[0].0, &got[0].1, &got[0].2, got[0].3, &got[0].4),
            (
                &"a".to_string(),
                &v("k1"),
                &v("v1"),
                Some(1_700_000_000_000),
                &v("h7")
            )
        );
        assert_eq!(
            (&got[1].0, &got[1].1, &got[1].2, got[1].3, &got[1].4),
            (
                &"a".to_string(),
                &v("k3"),
                &None,
                Some(1_700_000_000_003),
                &v("h9")
            )
        );
        assert_eq!(
            (&got[2].0, &got[2].1, &got[2].2, &got[2].4),
            (&"b".to_string(), &None, &v("v2"), &v("h8"))
        );
        // No timestamp given: the time of sending.
        assert!(got[2].3.is_some_and(|t| t > 1_700_000_000_003));
    }
}
