//! Incompatible QoS, reported per topic. DDS does not match a reader with a writer whose QoS
//! cannot serve it (a best-effort publisher for a reliable subscription, a transient-local
//! subscriber for a volatile publisher, ...): nothing flows, and all the subscription would show
//! is `received: 0`. RustDDS reports each such pair on the participant's status channel
//! (`DomainParticipantStatusEvent::Remote{Writer,Reader}QosIncompatible`, with both QoS sets);
//! [`QosWatch`] matches them to the node's subscriptions and publishers by GUID, counts them in
//! the health report (`incompatible_qos`, `qos_mismatch`) and logs a warning that names the
//! topic, the policy, what was offered and what was requested, and the key to change.

use std::time::{Duration, Instant};

use ros2_client::dds::rustdds::qos::QosPolicyId;
use ros2_client::dds::rustdds::{DomainParticipantStatusEvent, GUID, QosPolicies, policy};

use crate::shared::Health;
use crate::warn::{Suppressed, Warnings};

/// The mismatch in words: the first policy that fails (as RustDDS checks them), with the offered
/// (writer's) and the requested (reader's) value, e.g. `reliability: offered best_effort,
/// requested reliable`.
pub fn describe_mismatch(offered: &QosPolicies, requested: &QosPolicies) -> String {
    let Some(policy) = offered.compliance_failure_wrt(requested) else {
        return "no policy differs".into();
    };
    // Unset policies are compared as their DDS defaults; they read the same here.
    let reliability = |r: Option<policy::Reliability>, writer: bool| match r {
        Some(policy::Reliability::BestEffort) => "best_effort".to_string(),
        Some(policy::Reliability::Reliable { .. }) => "reliable".to_string(),
        None if writer => "reliable (default)".to_string(),
        None => "best_effort (default)".to_string(),
    };
    let durability = |d: Option<policy::Durability>| match d {
        None | Some(policy::Durability::Volatile) => "volatile".to_string(),
        Some(policy::Durability::TransientLocal) => "transient_local".to_string(),
        Some(policy::Durability::Transient) => "transient".to_string(),
        Some(policy::Durability::Persistent) => "persistent".to_string(),
    };
    let debug = |v: &dyn std::fmt::Debug| format!("{v:?}");
    let (name, off, req) = match policy {
        QosPolicyId::Reliability => ("reliability", reliability(offered.reliability(), true), reliability(requested.reliability(), false)),
        QosPolicyId::Durability => ("durability", durability(offered.durability()), durability(requested.durability())),
        QosPolicyId::Deadline => ("deadline", debug(&offered.deadline()), debug(&requested.deadline())),
        QosPolicyId::Liveliness => ("liveliness", debug(&offered.liveliness()), debug(&requested.liveliness())),
        QosPolicyId::Ownership => ("ownership", debug(&offered.ownership()), debug(&requested.ownership())),
        QosPolicyId::LatencyBudget => ("latency_budget", debug(&offered.latency_budget()), debug(&requested.latency_budget())),
        QosPolicyId::Presentation => ("presentation", debug(&offered.presentation()), debug(&requested.presentation())),
        QosPolicyId::DestinationOrder => ("destination_order", debug(&offered.destination_order()), debug(&requested.destination_order())),
        QosPolicyId::Representation => {
            ("data_representation", debug(&offered.data_representation()), debug(&requested.data_representation()))
        }
        other => return format!("{other:?}"),
    };
    format!("{name}: offered {off}, requested {req}")
}

/// An endpoint of the node: an input (numbered like [`Health::input`]) or an output (numbered
/// like [`crate::shared::outputs`] of the mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Input(usize),
    Output(usize),
}

pub struct QosWatch {
    /// The node's endpoints by GUID, with their resolved topic and the config key of their QoS.
    endpoints: Vec<(GUID, Endpoint, String, &'static str)>,
    warnings: Warnings,
}

impl QosWatch {
    /// `endpoints`: each subscription's and publisher's GUID, what it is, its resolved topic and
    /// the config key of its QoS (`qos.prompt`, ...).
    pub fn new(endpoints: Vec<(GUID, Endpoint, String, &'static str)>, warn_interval: Duration) -> QosWatch {
        let warnings = Warnings::new(endpoints.len(), warn_interval);
        QosWatch { endpoints, warnings }
    }

    /// Counts and logs an incompatible-QoS event about one of the node's endpoints; ignores every
    /// other event. Returns the endpoint it was about.
    pub fn handle(&mut self, health: &Health, event: &DomainParticipantStatusEvent, now: Instant) -> Option<Endpoint> {
        let (local, offered, requested) = match event {
            DomainParticipantStatusEvent::RemoteWriterQosIncompatible { local_reader, requested_qos, offered_qos, .. } => {
                (local_reader, offered_qos, requested_qos)
            }
            DomainParticipantStatusEvent::RemoteReaderQosIncompatible { local_writer, requested_qos, offered_qos, .. } => {
                (local_writer, offered_qos, requested_qos)
            }
            _ => return None,
        };
        let k = self.endpoints.iter().position(|(guid, ..)| guid == local)?;
        let (_, endpoint, topic, key) = &self.endpoints[k];
        let mismatch = describe_mismatch(offered, requested);
        let (counters, what) = match *endpoint {
            Endpoint::Input(i) => {
                (&health.input(i).qos, "a publisher's QoS is incompatible with this subscription, its messages are not received")
            }
            Endpoint::Output(o) => (&health.outputs[o], "a subscriber requests QoS this publisher does not offer, it receives nothing"),
        };
        self.warnings.warn(k, now, |n| log::warn!("{topic}: {what} ({mismatch}; the node's side is {key}){}", Suppressed(n)));
        counters.record(mismatch);
        Some(*endpoint)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Durability, Qos};

    fn policies(q: Qos) -> QosPolicies {
        QosPolicies::from(q.profile())
    }

    #[test]
    fn mismatches_in_words() {
        let best_effort = policies(Qos::SENSOR_DATA);
        let reliable = policies(Qos::RELIABLE);
        let latched = policies(Qos { durability: Durability::TransientLocal, ..Qos::RELIABLE });
        assert_eq!(describe_mismatch(&best_effort, &reliable), "reliability: offered best_effort, requested reliable");
        assert_eq!(describe_mismatch(&reliable, &latched), "durability: offered volatile, requested transient_local");
        assert_eq!(describe_mismatch(&reliable, &best_effort), "no policy differs");
        assert_eq!(describe_mismatch(&latched, &reliable), "no policy differs");
    }

    #[test]
    fn events_are_counted_on_their_topic() {
        let health = Health::new(1, crate::config::OutputMode::Chunk);
        let guid = |b: u8| GUID::from_bytes([b; 16]);
        let mut watch = QosWatch::new(
            vec![
                (guid(1), Endpoint::Input(0), "/cam".into(), "qos.images"),
                (guid(2), Endpoint::Input(2), "/prompt".into(), "qos.prompt"),
                (guid(3), Endpoint::Output(0), "/joint_trajectory".into(), "qos.outputs"),
            ],
            Duration::from_secs(5),
        );
        let now = Instant::now();
        let writer = |local: u8, offered: Qos, requested: Qos| DomainParticipantStatusEvent::RemoteWriterQosIncompatible {
            local_reader: guid(local),
            remote_writer: guid(9),
            requested_qos: Box::new(policies(requested)),
            offered_qos: Box::new(policies(offered)),
        };
        assert_eq!(watch.handle(&health, &writer(2, Qos::SENSOR_DATA, Qos::RELIABLE), now), Some(Endpoint::Input(2)));
        assert_eq!(watch.handle(&health, &writer(2, Qos::SENSOR_DATA, Qos::RELIABLE), now), Some(Endpoint::Input(2)));
        assert_eq!(watch.handle(&health, &writer(7, Qos::SENSOR_DATA, Qos::RELIABLE), now), None, "not the node's");
        let reader = DomainParticipantStatusEvent::RemoteReaderQosIncompatible {
            local_writer: guid(3),
            remote_reader: guid(9),
            requested_qos: Box::new(policies(Qos { durability: Durability::TransientLocal, ..Qos::RELIABLE })),
            offered_qos: Box::new(policies(Qos::RELIABLE)),
        };
        assert_eq!(watch.handle(&health, &reader, now), Some(Endpoint::Output(0)));
        let matched = DomainParticipantStatusEvent::RemoteWriterMatched { local_reader: guid(1), remote_writer: guid(9) };
        assert_eq!(watch.handle(&health, &matched, now), None);
        let r = health.report("/n", &["/cam".into()], &["/joint_trajectory".into(), "/a".into(), "/h".into()], &[None]);
        assert_eq!(r["prompt"]["incompatible_qos"], 2);
        assert_eq!(r["prompt"]["qos_mismatch"], "reliability: offered best_effort, requested reliable");
        assert_eq!(r["cameras"][0]["incompatible_qos"], 0);
        assert_eq!(r["outputs"]["trajectory"]["incompatible_qos"], 1);
        assert_eq!(r["outputs"]["trajectory"]["qos_mismatch"], "durability: offered volatile, requested transient_local");
    }
}
