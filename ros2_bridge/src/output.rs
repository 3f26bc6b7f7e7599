//! Action chunk → ROS messages. These build owned messages (ros2-client's `publish` takes the
//! message by value), so they allocate; they run on the publisher thread, never on the inference
//! thread.

use std::time::Duration;

use crate::msg::{
    Float32MultiArray, Float64MultiArray, Header, JointTrajectory, JointTrajectoryPoint, MultiArrayDimension, MultiArrayLayout, Time,
};

/// What every published chunk shares.
pub struct ChunkFormat {
    pub joint_names: Vec<String>,
    pub horizon: usize,
    pub action_dim: usize,
    /// Time between trajectory points (the control period).
    pub period: Duration,
    pub frame_id: String,
}

impl ChunkFormat {
    /// `horizon` points; point `i` is reached at `(i + 1) × period` after `stamp`, the time of the
    /// observation: the first action is the one to reach one control period after the frame.
    pub fn trajectory(&self, actions: &[f32], stamp: Time) -> JointTrajectory {
        let points = actions
            .chunks_exact(self.action_dim)
            .enumerate()
            .map(|(i, row)| JointTrajectoryPoint {
                positions: row.iter().map(|&a| a as f64).collect(),
                time_from_start: (self.period * (i as u32 + 1)).into(),
                ..JointTrajectoryPoint::default()
            })
            .collect();
        JointTrajectory { header: Header { stamp, frame_id: self.frame_id.clone() }, joint_names: self.joint_names.clone(), points }
    }

    /// The chunk row-major as `[horizon][action_dim]`, with the two dimensions labelled.
    pub fn array(&self, actions: &[f32]) -> Float32MultiArray {
        let (h, a) = (self.horizon as u32, self.action_dim as u32);
        Float32MultiArray {
            layout: MultiArrayLayout {
                dim: vec![
                    MultiArrayDimension { label: "horizon".into(), size: h, stride: h * a },
                    MultiArrayDimension { label: "action".into(), size: a, stride: a },
                ],
                data_offset: 0,
            },
            data: actions.to_vec(),
        }
    }
}

/// Stream mode's per-tick message: the action as `std_msgs/Float64MultiArray`, one value per
/// action column and an empty layout, as a `forward_command_controller` (e.g.
/// `position_controllers/JointGroupPositionController`) takes it on `~/commands`.
pub fn command(action: &[f32]) -> Float64MultiArray {
    Float64MultiArray { layout: MultiArrayLayout::default(), data: action.iter().map(|&a| a as f64).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trajectory_and_array_shapes() {
        let f = ChunkFormat {
            joint_names: vec!["a".into(), "b".into()],
            horizon: 3,
            action_dim: 2,
            period: Duration::from_millis(20),
            frame_id: "base".into(),
        };
        let actions = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        let stamp = Time { sec: 5, nanosec: 7 };
        let t = f.trajectory(&actions, stamp);
        assert_eq!(t.header, Header { stamp, frame_id: "base".into() });
        assert_eq!(t.joint_names, ["a", "b"]);
        assert_eq!(t.points.len(), 3);
        assert_eq!(t.points[2].positions, [4.0, 5.0]);
        assert_eq!(t.points[0].time_from_start, crate::msg::Duration { sec: 0, nanosec: 20_000_000 });
        assert_eq!(t.points[2].time_from_start, crate::msg::Duration { sec: 0, nanosec: 60_000_000 });
        let m = f.array(&actions);
        assert_eq!(m.data, actions);
        assert_eq!((m.layout.dim[0].size, m.layout.dim[0].stride, m.layout.dim[1].size, m.layout.dim[1].stride), (3, 6, 2, 2));
    }
}
