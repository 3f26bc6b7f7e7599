//! `flashrt-ros2`: a FlashRT policy as a ROS 2 node over pure-Rust DDS (ros2-client / RustDDS),
//! with no ROS installation needed. Camera images and joint states in, the action chunk out as a
//! `trajectory_msgs/JointTrajectory` and a `std_msgs/Float32MultiArray`, health at 1 Hz.
//!
//! The pieces, from the wire inwards: [`msg`] (ROS 2 messages as serde structs), [`config`] (file
//! and flags), [`inputs`] (validated latest-value slots sized at start), [`intake`] (each received
//! message validated, stored, counted), [`infer`] (observations from the slots; chunk mode's
//! inference thread), [`control`] (stream mode's control thread over `flashrt::ActionStream`),
//! [`output`] (chunk and action to messages), [`shared`] (what the threads share, health), [`qos_watch`] (incompatible QoS per
//! topic) and [`node`] (DDS entities and threads). The README has the topics and parameters.

pub mod config;
pub mod control;
pub mod infer;
pub mod inputs;
pub mod intake;
pub mod msg;
pub mod node;
pub mod output;
pub mod qos_watch;
pub mod shared;
pub mod warn;

/// The log filter when `RUST_LOG` is not set. RustDDS logs every discovery event at info level and
/// a warning for every datagram over 1500 bytes (each published trajectory), and cdr-encoding a
/// warning per malformed string: their errors are kept, their warnings and chatter are not, so
/// that the node's own (rate-limited) warnings stand out. The node reports what matters from the
/// library itself (undecodable messages, incompatible QoS) under its own target.
pub const DEFAULT_LOG_FILTER: &str = "info,rustdds=error,cdr_encoding=error,ros2_client=warn";

#[cfg(test)]
mod tests {
    use log::{Level, Log, Metadata};

    #[test]
    fn default_log_filter_keeps_the_node_and_quiets_the_dds_library() {
        let logger = env_logger::Builder::new().parse_filters(super::DEFAULT_LOG_FILTER).build();
        let enabled = |level, target| logger.enabled(&Metadata::builder().level(level).target(target).build());
        // What the library floods the log with: a warning per datagram over 1500 bytes, per
        // string without its NUL, and discovery at info.
        assert!(!enabled(Level::Warn, "rustdds::network::udp_sender"));
        assert!(!enabled(Level::Warn, "cdr_encoding::cdr_deserializer"));
        assert!(!enabled(Level::Info, "rustdds::rtps::reader"));
        // Its errors, and everything the node says, stay.
        assert!(enabled(Level::Error, "rustdds::rtps::writer"));
        for level in [Level::Info, Level::Warn, Level::Error] {
            assert!(enabled(level, "flashrt_ros2::node"));
            assert!(enabled(level, "flashrt_ros2"));
        }
        assert!(enabled(Level::Info, "flashrt::policy"), "the runtime's messages stay");
    }
}
