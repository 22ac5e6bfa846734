//! Which generation of the group a consumer is a member of: what its transactional offset
//! commits are fenced by. rust-rdkafka's `ConsumerGroupMetadata` does not show it, so this reads
//! librdkafka's metadata back through its own serialisation
//! (`rd_kafka_consumer_group_metadata_write`: `CGMDv2:`, the generation as a native-endian
//! `i32`, then the group id and the member id, each NUL-terminated, then the instance id).

use std::ffi::c_void;

use rdkafka::client::{Client, ClientContext};
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka_sys as rdsys;

/// The group's generation as a transactional offset commit carries it, to the coordinator
/// that fences a commit of an older one (opaque outside the Kafka clients).
pub struct Generation(pub(crate) ConsumerGroupMetadata);

/// A consumer's membership in its group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The group generation (the member epoch with the consumer protocol); -1 before joining.
    pub generation: i32,
    /// The member id; empty before joining.
    pub id: String,
}

impl Member {
    /// Joined: offsets committed with this membership are fenced by it. Without it (no
    /// generation, no member id) a commit would be taken from a member that is not one.
    pub fn joined(&self) -> bool {
        self.generation >= 0 && !self.id.is_empty()
    }
}

/// The membership of the consumer behind `client` now; `None` when it has no group or it
/// cannot be read.
pub fn of<C: ClientContext>(client: &Client<C>) -> Option<Member> {
    let rk = client.native_ptr();
    // SAFETY: `rk` is alive for the call (borrowed from the client). The metadata is ours to
    // destroy; the buffer librdkafka allocates is ours to free with rd_kafka_mem_free, after
    // it was copied.
    unsafe {
        let md = rdsys::rd_kafka_consumer_group_metadata(rk);
        if md.is_null() {
            return None;
        }
        let mut buffer: *mut c_void = std::ptr::null_mut();
        let mut size = 0usize;
        let error = rdsys::rd_kafka_consumer_group_metadata_write(md, &mut buffer, &mut size);
        rdsys::rd_kafka_consumer_group_metadata_destroy(md);
        if !error.is_null() {
            rdsys::rd_kafka_error_destroy(error);
            return None;
        }
        if buffer.is_null() {
            return None;
        }
        let bytes = std::slice::from_raw_parts(buffer as *const u8, size).to_vec();
        rdsys::rd_kafka_mem_free(std::ptr::null_mut(), buffer);
        parse(&bytes)
    }
}

/// Reads a serialised consumer group metadata.
fn parse(bytes: &[u8]) -> Option<Member> {
    let rest = bytes.strip_prefix(b"CGMDv2:")?;
    let generation = i32::from_ne_bytes(rest.get(..4)?.try_into().ok()?);
    let rest = rest.get(4..)?;
    let group_end = rest.iter().position(|&c| c == 0)?;
    let rest = rest.get(group_end + 1..)?;
    let id_end = rest.iter().position(|&c| c == 0)?;
    let id = String::from_utf8(rest[..id_end].to_vec()).ok()?;
    Some(Member { generation, id })
}

/// A consumer of group `g` on a mock cluster with topic `topic`, not joined yet.
#[cfg(test)]
pub(crate) fn unjoined_mock_consumer(
    topic: &str,
) -> (
    rdkafka::mocking::MockCluster<'static, rdkafka::producer::DefaultProducerContext>,
    rdkafka::consumer::BaseConsumer,
) {
    let cluster = rdkafka::mocking::MockCluster::new(1).expect("mock cluster");
    cluster.create_topic(topic, 1, 1).expect("topic");
    let consumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap_servers())
        .set("group.id", "g")
        .create()
        .expect("consumer");
    (cluster, consumer)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use rdkafka::consumer::Consumer;

    use super::*;

    #[test]
    fn the_format_reads_back() {
        let mut b = b"CGMDv2:".to_vec();
        b.extend(7i32.to_ne_bytes());
        b.extend(b"g\0member-1\0\x01");
        assert_eq!(
            parse(&b),
            Some(Member {
                generation: 7,
                id: "member-1".into()
            })
        );
        assert_eq!(parse(b"CGMDv1:xxxx"), None);
        assert_eq!(parse(b"CGMDv2:\x01\x00"), None);
        assert!(
            !Member {
                generation: -1,
                id: String::new()
            }
            .joined()
        );
        assert!(
            !Member {
                generation: 3,
                id: String::new()
            }
            .joined()
        );
    }

    #[test]
    fn a_consumer_is_no_member_before_it_joined_and_one_after() {
        let (_cluster, consumer) = unjoined_mock_consumer("t");
        let before = of(consumer.client()).expect("metadata");
        assert!(!before.joined(), "{before:?}");
        consumer.subscribe(&["t"]).expect("subscribe");
        let until = Instant::now() + Duration::from_secs(30);
        while consumer.assignment().map_or(0, |a| a.count()) == 0 {
            assert!(Instant::now() < until, "never joined");
            consumer.poll(Duration::from_millis(100));
        }
        let after = of(consumer.client()).expect("metadata");
        assert!(after.joined(), "{after:?}");
    }
}
