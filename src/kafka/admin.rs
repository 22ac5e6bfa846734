//! Topics, as the changelog needs them: listed, created, described, grown. Errors are the
//! cluster's words; what they mean to a changelog is `state::topic`'s to say.

use std::time::Duration;

use rdkafka::admin::{
    AdminClient, AdminOptions, NewPartitions, NewTopic, ResourceSpecifier, TopicReplication,
};
use rdkafka::client::DefaultClientContext;

use super::failure::Code;
use super::{Client, NotCreated};

/// An admin client.
pub struct Admin(AdminClient<DefaultClientContext>);

/// What a creation or a growth did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// It was done.
    Done,
    /// It was so already (another client did it first).
    Already,
}

impl Admin {
    /// Created by `client` (the admin role).
    pub fn create(client: &Client) -> Result<Admin, NotCreated> {
        Ok(Admin(client.create()?))
    }

    /// The partitions and replicas of topic `name`, if it exists. All topics are asked for:
    /// asking for one by name may create it with the broker's defaults.
    pub fn partitions(
        &self,
        name: &str,
        timeout: Duration,
    ) -> Result<Option<(usize, usize)>, String> {
        let md = (self.0.inner())
            .fetch_metadata(None, timeout)
            .map_err(|e| format!("the cluster's topics: {e}"))?;
        Ok(md.topics().iter().find(|t| t.name() == name).map(|t| {
            let replicas = t.partitions().first().map_or(1, |p| p.replicas().len());
            (t.partitions().len(), replicas)
        }))
    }

    /// Creates topic `name` with `partitions`, `replicas` and `configs`.
    pub async fn create_topic(
        &self,
        name: &str,
        (partitions, replicas): (usize, usize),
        configs: &[(&str, &str)],
        timeout: Duration,
    ) -> Result<Done, String> {
        let mut topic = NewTopic::new(
            name,
            i32::try_from(partitions).unwrap_or(i32::MAX),
            TopicReplication::Fixed(i32::try_from(replicas).unwrap_or(1)),
        );
        for (key, value) in configs {
            topic = topic.set(key, value);
        }
        let created = (self.0)
            .create_topics([&topic], &options(timeout))
            .await
            .map_err(|e| format!("creating '{name}': {e}"))?;
        let mut done = Done::Done;
        for result in created {
            match result {
                Ok(_) => {}
                Err((_, Code::TopicAlreadyExists)) => done = Done::Already,
                Err((name, code)) => return Err(format!("creating '{name}': {code}")),
            }
        }
        Ok(done)
    }

    /// The values of topic `name`'s configuration entries `keys` (`None`: not set).
    pub async fn configs(
        &self,
        name: &str,
        keys: &[&str],
        timeout: Duration,
    ) -> Result<Vec<Option<String>>, String> {
        let configs = (self.0)
            .describe_configs([&ResourceSpecifier::Topic(name)], &options(timeout))
            .await
            .map_err(|e| format!("describing '{name}': {e}"))?;
        let resource = (configs.into_iter().next())
            .ok_or_else(|| format!("describing '{name}': no answer"))?
            .map_err(|e| format!("describing '{name}': {e}"))?;
        Ok(keys
            .iter()
            .map(|k| resource.get(k).and_then(|e| e.value.clone()))
            .collect())
    }

    /// Grows topic `name` to `partitions`.
    pub async fn grow(
        &self,
        name: &str,
        partitions: usize,
        timeout: Duration,
    ) -> Result<Done, NotGrown> {
        let wanted = NewPartitions::new(name, partitions);
        let grown = (self.0)
            .create_partitions([&wanted], &options(timeout))
            .await
            .map_err(|e| NotGrown::Unanswered(e.to_string()))?;
        let mut done = Done::Done;
        for result in grown {
            match result {
                Ok(_) => {}
                // It has that many already.
                Err((_, Code::InvalidPartitions)) => done = Done::Already,
                Err((_, code)) => return Err(NotGrown::Refused(code.to_string())),
            }
        }
        Ok(done)
    }
}

/// Why a topic did not grow, in the cluster's words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotGrown {
    /// The request had no answer (a timeout, the transport).
    Unanswered(String),
    /// The cluster refused it (a grant missing, say).
    Refused(String),
}

fn options(timeout: Duration) -> AdminOptions {
    AdminOptions::new().operation_timeout(Some(timeout))
}
