//! One process per instance on a host. Two `exactly run` of one group with one instance id
//! share a transactional id and (static membership) a `group.instance.id`: each start fences the
//! other's producer and consumer, which fence back, for as long as both run. Nothing is lost or
//! doubled, and little progresses. The likeliest way to get there is two processes on one host
//! with the default instance id, the host name; so before any client exists the process claims
//! an abstract Unix socket named after its cluster, group and instance, and a second claim on
//! the host (in the same network namespace: containers with `--network host` share it) fails
//! at once. The kernel releases the name when the process ends, however it ends (kill -9 too),
//! so a restart is never refused by a dead process.

use crate::error::Error;

/// The claim, held for as long as the process lives.
#[derive(Debug)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub struct HostClaim {
    #[cfg(target_os = "linux")]
    _socket: std::os::unix::net::UnixListener,
}

/// Claims `instance` of `group` on the cluster at `bootstrap`, on this host;
/// `Err(InstanceClash)` when another live process holds it. `None` where the claim cannot be
/// made (not Linux, or the socket refused for another reason, logged): the run goes on
/// unguarded, as before this check.
pub fn claim_on_host(
    bootstrap: &str,
    group: &str,
    instance: &str,
) -> Result<Option<HostClaim>, Error> {
    #[cfg(target_os = "linux")]
    {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixListener};

        let name = socket_name(bootstrap, group, instance);
        let bound = SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|addr| UnixListener::bind_addr(&addr));
        match bound {
            Ok(socket) => Ok(Some(HostClaim { _socket: socket })),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                Err(Error::InstanceClash(format!(
                    "another exactly process on this host runs group '{group}' as instance \
                     '{instance}' (--instance-id; default: $POD_NAME, else the host name) on \
                     {bootstrap}: two processes of one instance fence each other's producer \
                     and consumer in turn. Give each process its own --instance-id (the claim \
                     is the abstract socket @{name}, `ss -xlp | grep {name}` shows its holder)"
                )))
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot claim the instance on this host; not checked");
                Ok(None)
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (bootstrap, group, instance);
        Ok(None)
    }
}

/// The socket's abstract name: a digest of the three, which any build computes alike (an
/// upgrade runs two builds side by side), and which fits the 107 bytes a name may take.
fn socket_name(bootstrap: &str, group: &str, instance: &str) -> String {
    format!("exactly-{:016x}", fnv1a([bootstrap, group, instance]))
}

/// FNV-1a (64 bits) over the parts, each followed by a NUL, so that no two lists of parts
/// read alike.
fn fnv1a(parts: [&str; 3]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in parts.iter().flat_map(|p| p.bytes().chain([0])) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn a_second_claim_of_one_instance_fails_naming_it_and_a_released_one_is_free() {
        let group = format!("g-{}", std::process::id());
        let first = claim_on_host("b:9092", &group, "i-0")
            .unwrap()
            .expect("claimed");
        let e = claim_on_host("b:9092", &group, "i-0").unwrap_err();
        assert_eq!(e.exit_code(), 5);
        let said = e.to_string();
        assert!(said.contains(&group) && said.contains("'i-0'"), "{said}");
        assert!(said.contains("--instance-id"), "{said}");
        // Another instance of the group, the same id in another group or on another
        // cluster: other claims.
        let others = [
            claim_on_host("b:9092", &group, "i-1"),
            claim_on_host("b:9092", &format!("{group}-b"), "i-0"),
            claim_on_host("c:9092", &group, "i-0"),
        ];
        assert!(
            others.iter().all(|c| matches!(c, Ok(Some(_)))),
            "{others:?}"
        );
        drop(first);
        assert!(claim_on_host("b:9092", &group, "i-0").unwrap().is_some());
    }

    #[test]
    fn names_fit_are_stable_and_do_not_run_parts_together() {
        let long = "x".repeat(300);
        assert!(socket_name(&long, &long, &long).len() <= 107);
        assert_ne!(socket_name("b", "a/b", "c"), socket_name("b", "a", "b/c"));
        assert_ne!(socket_name("b", "ab", "c"), socket_name("b", "a", "bc"));
        // The same in every build: FNV-1a of "b\0g\0i\0" (computed apart, in Python).
        assert_eq!(socket_name("b", "g", "i"), "exactly-c3500c78a060a539");
    }
}
