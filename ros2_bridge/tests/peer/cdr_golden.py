"""Writes ../data/cdr_golden.json: the CDR encoding (XCDR1, little endian, as ROS 2 Humble/Jazzy
put on the wire) of one sample of every message type, produced by the PyPI `cyclonedds` binding.
tests/cdr.rs builds the same samples in Rust and compares bytes in both directions.

Run from anywhere: python3 ros2_bridge/tests/peer/cdr_golden.py  (needs cyclonedds==11.0.1)"""

import importlib.metadata
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ros2_msgs as m  # noqa: E402

STAMP = m.Time_(sec=1_700_000_000, nanosec=123_456_789)
HEADER = m.Header_(stamp=STAMP, frame_id="base_link")
LAYOUT = m.MultiArrayLayout_(
    dim=[m.MultiArrayDimension_("horizon", 2, 6), m.MultiArrayDimension_("action", 3, 3)], data_offset=0
)
POINTS = [
    m.JointTrajectoryPoint_(positions=[0.125, -1.5], time_from_start=m.Duration_(0, 20_000_000)),
    m.JointTrajectoryPoint_(positions=[0.25, -3.0], velocities=[1.0], time_from_start=m.Duration_(0, 40_000_000)),
]

# Keep in step with `samples()` in tests/cdr.rs.
SAMPLES = {
    "Time": STAMP,
    "Duration": m.Duration_(sec=-1, nanosec=500_000_000),
    "Header": HEADER,
    "String": m.String_(data="pick up the red cube"),
    "Image": m.Image_(header=m.Header_(STAMP, "cam"), height=2, width=1, encoding="rgb8", is_bigendian=0, step=3,
                      data=[1, 2, 3, 4, 5, 6]),
    "JointState": m.JointState_(header=HEADER, name=["a", "bc"], position=[1.5, -2.25], velocity=[], effort=[0.5]),
    "MultiArrayDimension": m.MultiArrayDimension_(label="horizon", size=50, stride=350),
    "MultiArrayLayout": LAYOUT,
    "Float32MultiArray": m.Float32MultiArray_(layout=LAYOUT, data=[1.0, -0.5, 3.25, 0.0, 2.0, -8.0]),
    "Float64MultiArray": m.Float64MultiArray_(layout=m.MultiArrayLayout_(dim=[m.MultiArrayDimension_("action", 3, 3)]),
                                              data=[0.125, -1.5, 1e300]),
    "JointTrajectoryPoint": POINTS[1],
    "JointTrajectory": m.JointTrajectory_(header=HEADER, joint_names=["j1", "j2"], points=POINTS),
}


def main():
    out = {"generator": f"cyclonedds {importlib.metadata.version('cyclonedds')} (tests/peer/cdr_golden.py)",
           "encapsulation": "0001 0000 (CDR_LE), stripped below", "payload_hex": {}}
    for name, sample in SAMPLES.items():
        data = sample.serialize()
        assert data[:4] == b"\x00\x01\x00\x00", (name, data[:4])
        out["payload_hex"][name] = data[4:].hex()
        assert type(sample).deserialize(data) == sample
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "cdr_golden.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    print(f"wrote {os.path.normpath(path)}")


if __name__ == "__main__":
    main()
