//! The process's barrier before its exit handlers: `kafka::wait_destroyed` answers false while
//! a client lives and true once it is gone (`main` exits without exit handlers on false: they
//! would race librdkafka's threads). Alone in its file: a client of another test in the same
//! process would hold the barrier.

use std::time::{Duration, Instant};

use exactly::kafka::wait_destroyed;
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;

#[test]
fn wait_destroyed_waits_for_every_client_and_its_threads() {
    assert!(wait_destroyed(Duration::ZERO), "no client yet");
    // Unreachable: the broker thread keeps reconnecting, as in a failed start-up.
    let client: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", "127.0.0.1:9")
        .create()
        .expect("client");
    assert!(
        !wait_destroyed(Duration::from_millis(200)),
        "a client lives"
    );

    let started = Instant::now();
    let dropper = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        drop(client);
    });
    assert!(
        wait_destroyed(Duration::from_secs(10)),
        "the client was dropped"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "waited for the drop"
    );
    dropper.join().expect("dropper");
}
