//! `flashrt-ros2`: a FlashRT policy as a ROS 2 node over pure-Rust DDS (ros2-client / RustDDS),
//! with no ROS installation needed. Camera images and joint states in, the action chunk out as a
//! `trajectory_msgs/JointTrajectory` and a `std_msgs/Float32MultiArray`, health at 1 Hz.
//!
//! The pieces, from the wire inwards: [`msg`] (ROS 2 messages as serde structs), [`config`] (file
//! and flags), [`inputs`] (validated latest-value slots sized at start), [`infer`] (the inference
//! thread), [`output`] (chunk to messages), [`shared`] (what the threads share, health) and
//! [`node`] (DDS entities and threads). The README has the topics and parameters.

pub mod config;
pub mod infer;
pub mod inputs;
pub mod msg;
pub mod node;
pub mod output;
pub mod shared;
pub mod warn;
