//! The ROS 2 node's receive path without DDS: CDR payloads (either byte order) decoded as the
//! node's subscriptions decode them, into `sensor_msgs/Image`, `sensor_msgs/JointState` and
//! `std_msgs/String` (and the two message types it publishes), then validated and stored as the
//! node stores them (`FrameSlot`, `StateSlot`, `check_prompt`). Decoding and storing must return
//! Ok or Err, never panic or allocate without bound.
//!
//! Input: `[message type, byte order, CDR payload...]`.

#![no_main]

use std::time::Instant;

use flashrt::Frame;
use flashrt_ros2::inputs::{FrameSlot, StateSlot, check_prompt};
use flashrt_ros2::msg::{Float32MultiArray, Image, JointState, JointTrajectory, StringMsg};
use libfuzzer_sys::fuzz_target;
use ros2_client::dds::rustdds::RepresentationIdentifier;
use ros2_client::dds::rustdds::serialization::deserialize_from_cdr_with_rep_id;
use serde::de::DeserializeOwned;

fn decode<M: DeserializeOwned>(bytes: &[u8], rep: RepresentationIdentifier) -> Option<M> {
    deserialize_from_cdr_with_rep_id::<M>(bytes, rep).ok().map(|(m, _)| m)
}

/// A stored frame must describe a readable packed buffer (the inference thread steps it).
fn check_frame(slot: &FrameSlot) {
    if let Some(f) = slot.frame() {
        let f: Frame = f;
        f.validate("fuzz", 64, 48).expect("a stored frame is valid for the slot's maximum");
    }
}

fuzz_target!(|data: &[u8]| {
    let [kind, order, payload @ ..] = data else { return };
    let rep = if order & 1 == 0 { RepresentationIdentifier::CDR_LE } else { RepresentationIdentifier::CDR_BE };
    let now = Instant::now();
    match kind % 5 {
        0 => {
            if let Some(img) = decode::<Image>(payload, rep) {
                let mut slot = FrameSlot::new(64, 48);
                let _ = slot.store(&img, None, now);
                check_frame(&slot);
                let _ = slot.store(&img, Some((32, 24)), now);
                check_frame(&slot);
            }
        }
        1 => {
            if let Some(js) = decode::<JointState>(payload, rep) {
                let mut slot = StateSlot::new(3);
                let _ = slot.store(&js, &[], now);
                let names: Vec<String> = ["a", "bc", "elbow"].map(String::from).to_vec();
                let _ = slot.store(&js, &names, now);
                assert_eq!(slot.values().len(), 3);
            }
        }
        2 => {
            if let Some(msg) = decode::<StringMsg>(payload, rep) {
                let _ = check_prompt(&msg.data);
            }
        }
        3 => {
            let _ = decode::<JointTrajectory>(payload, rep);
        }
        _ => {
            let _ = decode::<Float32MultiArray>(payload, rep);
        }
    }
});
