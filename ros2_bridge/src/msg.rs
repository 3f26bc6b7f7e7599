//! ROS 2 messages as serde structs, laid out field for field like the `.msg` files so that the CDR
//! (XCDR1, little endian) encoding that RustDDS writes is the one `rmw_fastrtps` / `rmw_cyclonedds`
//! write for Humble and Jazzy. Field order is the wire format: never reorder fields here.
//!
//! Each type carries its ROS 2 package and name ([`RosMessage`]); the DDS type name on the wire is
//! `<package>::msg::dds_::<Name>_` (ros2-client derives it from these).
//!
//! Strings are decoded strictly ([`cdr_string`]): a CDR string is its length, its bytes and a NUL
//! terminator counted in the length, and one without the NUL is malformed (the CDR decoder
//! underneath would drop its last character and accept it).
//!
//! Sources (identical in Humble and Jazzy): `builtin_interfaces/msg/{Time,Duration}.msg`,
//! `std_msgs/msg/{Header,String,MultiArrayDimension,MultiArrayLayout,Float32MultiArray,
//! Float64MultiArray}.msg`,
//! `sensor_msgs/msg/{Image,JointState}.msg`, `trajectory_msgs/msg/{JointTrajectory,
//! JointTrajectoryPoint}.msg`.

use ros2_client::MessageTypeName;
use serde::{Deserialize, Serialize};

/// A message type with its ROS 2 name.
pub trait RosMessage {
    const PACKAGE: &'static str;
    const NAME: &'static str;

    fn type_name() -> MessageTypeName {
        MessageTypeName::new(Self::PACKAGE, Self::NAME)
    }
}

macro_rules! ros_message {
    ($ty:ident, $package:literal, $name:literal) => {
        impl RosMessage for $ty {
            const PACKAGE: &'static str = $package;
            const NAME: &'static str = $name;
        }
    };
}

/// `builtin_interfaces/Time`: seconds and nanoseconds since the epoch of the node's clock.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Time {
    pub sec: i32,
    pub nanosec: u32,
}
ros_message!(Time, "builtin_interfaces", "Time");

impl Time {
    /// Wall-clock time (ROS time without simulation). A clock before 1970 reads as zero.
    pub fn now() -> Time {
        let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        Time { sec: since.as_secs().min(i32::MAX as u64) as i32, nanosec: since.subsec_nanos() }
    }
}

/// `builtin_interfaces/Duration`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Duration {
    pub sec: i32,
    pub nanosec: u32,
}
ros_message!(Duration, "builtin_interfaces", "Duration");

impl From<std::time::Duration> for Duration {
    fn from(d: std::time::Duration) -> Duration {
        Duration { sec: d.as_secs().min(i32::MAX as u64) as i32, nanosec: d.subsec_nanos() }
    }
}

/// `std_msgs/Header`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub stamp: Time,
    #[serde(deserialize_with = "cdr_string::deserialize")]
    pub frame_id: String,
}
ros_message!(Header, "std_msgs", "Header");

/// `std_msgs/String`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StringMsg {
    #[serde(deserialize_with = "cdr_string::deserialize")]
    pub data: String,
}
ros_message!(StringMsg, "std_msgs", "String");

/// `sensor_msgs/Image`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    pub header: Header,
    pub height: u32,
    pub width: u32,
    /// Pixel encoding (`sensor_msgs/image_encodings.hpp` names: `rgb8`, `bgr8`, `rgba8`, ...).
    #[serde(deserialize_with = "cdr_string::deserialize")]
    pub encoding: String,
    pub is_bigendian: u8,
    /// Row length in bytes.
    pub step: u32,
    /// `uint8[]`: encoded as a byte string (same wire bytes as a sequence of octets) so that a
    /// camera frame is copied in one piece rather than visited byte by byte.
    #[serde(with = "flashrt::byte_string")]
    pub data: Vec<u8>,
}
ros_message!(Image, "sensor_msgs", "Image");

/// `sensor_msgs/JointState`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JointState {
    pub header: Header,
    #[serde(deserialize_with = "cdr_string::deserialize_seq")]
    pub name: Vec<String>,
    pub position: Vec<f64>,
    pub velocity: Vec<f64>,
    pub effort: Vec<f64>,
}
ros_message!(JointState, "sensor_msgs", "JointState");

/// `std_msgs/MultiArrayDimension`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultiArrayDimension {
    #[serde(deserialize_with = "cdr_string::deserialize")]
    pub label: String,
    pub size: u32,
    pub stride: u32,
}
ros_message!(MultiArrayDimension, "std_msgs", "MultiArrayDimension");

/// `std_msgs/MultiArrayLayout`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MultiArrayLayout {
    pub dim: Vec<MultiArrayDimension>,
    pub data_offset: u32,
}
ros_message!(MultiArrayLayout, "std_msgs", "MultiArrayLayout");

/// `std_msgs/Float32MultiArray`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Float32MultiArray {
    pub layout: MultiArrayLayout,
    pub data: Vec<f32>,
}
ros_message!(Float32MultiArray, "std_msgs", "Float32MultiArray");

/// `std_msgs/Float64MultiArray`: what ros2_control's `forward_command_controller` family
/// (`position_controllers/JointGroupPositionController`, ...) takes on `~/commands`, one value per
/// joint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Float64MultiArray {
    pub layout: MultiArrayLayout,
    pub data: Vec<f64>,
}
ros_message!(Float64MultiArray, "std_msgs", "Float64MultiArray");

/// `trajectory_msgs/JointTrajectoryPoint`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JointTrajectoryPoint {
    pub positions: Vec<f64>,
    pub velocities: Vec<f64>,
    pub accelerations: Vec<f64>,
    pub effort: Vec<f64>,
    pub time_from_start: Duration,
}
ros_message!(JointTrajectoryPoint, "trajectory_msgs", "JointTrajectoryPoint");

/// `trajectory_msgs/JointTrajectory`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JointTrajectory {
    pub header: Header,
    #[serde(deserialize_with = "cdr_string::deserialize_seq")]
    pub joint_names: Vec<String>,
    pub points: Vec<JointTrajectoryPoint>,
}
ros_message!(JointTrajectory, "trajectory_msgs", "JointTrajectory");

/// CDR strings, decoded strictly. On the wire a string is a 4-byte length that counts a NUL
/// terminator, then the bytes and the NUL: the same layout as a sequence of octets, which is how
/// it is read here, so that the terminator can be checked. cdr-encoding's own string decoder
/// drops the last byte whatever it is (logging an unlimited warning when it is not a NUL), so a
/// truncated `"abc"` would arrive as `"ab"`. Here a string whose last byte is not a NUL, or that
/// holds a NUL before its end, or is not UTF-8, is an error: the message is undecodable (counted
/// as `malformed`). A length of 0 (no room even for the NUL, sent by some DDS implementations for
/// an empty string) reads as the empty string. Encoding is unchanged (serde's `serialize_str`).
pub mod cdr_string {
    use serde::Deserialize;
    use serde::de::{Deserializer, Error, SeqAccess, Visitor};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        d.deserialize_bytes(CdrStringVisitor)
    }

    /// A `string[]` field.
    pub fn deserialize_seq<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
        d.deserialize_seq(SeqVisitor)
    }

    /// The checks, on the string's bytes as they are on the wire (terminator included).
    pub fn from_wire(bytes: &[u8]) -> Result<&str, &'static str> {
        let text = match bytes.split_last() {
            None => return Ok(""),
            Some((0, text)) => text,
            Some(_) => return Err("string without its NUL terminator"),
        };
        if text.contains(&0) {
            return Err("NUL inside a string");
        }
        std::str::from_utf8(text).map_err(|_| "string is not UTF-8")
    }

    struct CdrStringVisitor;

    impl<'de> Visitor<'de> for CdrStringVisitor {
        type Value = String;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a CDR string (length, bytes, NUL)")
        }

        fn visit_bytes<E: Error>(self, v: &[u8]) -> Result<String, E> {
            from_wire(v).map(str::to_owned).map_err(E::custom)
        }
    }

    struct CdrString(String);

    impl<'de> Deserialize<'de> for CdrString {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CdrString, D::Error> {
            deserialize(d).map(CdrString)
        }
    }

    struct SeqVisitor;

    impl<'de> Visitor<'de> for SeqVisitor {
        type Value = Vec<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a sequence of CDR strings")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
            // The count comes from the wire: it bounds nothing until the elements are read.
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
            while let Some(CdrString(s)) = seq.next_element()? {
                out.push(s);
            }
            Ok(out)
        }
    }
}
