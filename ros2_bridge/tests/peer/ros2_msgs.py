"""ROS 2 message types for the PyPI `cyclonedds` binding, named as ROS 2 names them on DDS
(`<pkg>::msg::dds_::<Name>_`) and laid out like the .msg files (Humble and Jazzy are identical for
these). Written independently of the Rust structs: this is the peer the Rust side is checked
against."""

from dataclasses import dataclass, field

import cyclonedds.idl.types as t
from cyclonedds.idl import IdlStruct


@dataclass
class Time_(IdlStruct, typename="builtin_interfaces::msg::dds_::Time_"):
    sec: t.int32 = 0
    nanosec: t.uint32 = 0


@dataclass
class Duration_(IdlStruct, typename="builtin_interfaces::msg::dds_::Duration_"):
    sec: t.int32 = 0
    nanosec: t.uint32 = 0


@dataclass
class Header_(IdlStruct, typename="std_msgs::msg::dds_::Header_"):
    stamp: Time_ = field(default_factory=Time_)
    frame_id: str = ""


@dataclass
class String_(IdlStruct, typename="std_msgs::msg::dds_::String_"):
    data: str = ""


@dataclass
class Image_(IdlStruct, typename="sensor_msgs::msg::dds_::Image_"):
    header: Header_ = field(default_factory=Header_)
    height: t.uint32 = 0
    width: t.uint32 = 0
    encoding: str = ""
    is_bigendian: t.uint8 = 0
    step: t.uint32 = 0
    data: t.sequence[t.uint8] = field(default_factory=list)


@dataclass
class JointState_(IdlStruct, typename="sensor_msgs::msg::dds_::JointState_"):
    header: Header_ = field(default_factory=Header_)
    name: t.sequence[str] = field(default_factory=list)
    position: t.sequence[t.float64] = field(default_factory=list)
    velocity: t.sequence[t.float64] = field(default_factory=list)
    effort: t.sequence[t.float64] = field(default_factory=list)


@dataclass
class MultiArrayDimension_(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayDimension_"):
    label: str = ""
    size: t.uint32 = 0
    stride: t.uint32 = 0


@dataclass
class MultiArrayLayout_(IdlStruct, typename="std_msgs::msg::dds_::MultiArrayLayout_"):
    dim: t.sequence[MultiArrayDimension_] = field(default_factory=list)
    data_offset: t.uint32 = 0


@dataclass
class Float32MultiArray_(IdlStruct, typename="std_msgs::msg::dds_::Float32MultiArray_"):
    layout: MultiArrayLayout_ = field(default_factory=MultiArrayLayout_)
    data: t.sequence[t.float32] = field(default_factory=list)


@dataclass
class Float64MultiArray_(IdlStruct, typename="std_msgs::msg::dds_::Float64MultiArray_"):
    layout: MultiArrayLayout_ = field(default_factory=MultiArrayLayout_)
    data: t.sequence[t.float64] = field(default_factory=list)


@dataclass
class JointTrajectoryPoint_(IdlStruct, typename="trajectory_msgs::msg::dds_::JointTrajectoryPoint_"):
    positions: t.sequence[t.float64] = field(default_factory=list)
    velocities: t.sequence[t.float64] = field(default_factory=list)
    accelerations: t.sequence[t.float64] = field(default_factory=list)
    effort: t.sequence[t.float64] = field(default_factory=list)
    time_from_start: Duration_ = field(default_factory=Duration_)


@dataclass
class JointTrajectory_(IdlStruct, typename="trajectory_msgs::msg::dds_::JointTrajectory_"):
    header: Header_ = field(default_factory=Header_)
    joint_names: t.sequence[str] = field(default_factory=list)
    points: t.sequence[JointTrajectoryPoint_] = field(default_factory=list)


@dataclass
class TruncatedImage_(IdlStruct, typename="sensor_msgs::msg::dds_::Image_"):
    """Claims to be an Image but stops after `width`: a subscriber decoding it as
    sensor_msgs/Image runs out of bytes. The interop test's malformed message."""

    header: Header_ = field(default_factory=Header_)
    height: t.uint32 = 0
    width: t.uint32 = 0
