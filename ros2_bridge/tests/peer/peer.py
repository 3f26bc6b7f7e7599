"""The interop test's independent DDS peer (PyPI cyclonedds), standing in for a ROS 2 system: it
publishes camera frames, joint states and a prompt the way ROS 2 nodes do (topics `rt/...`, types
`<pkg>::msg::dds_::<Name>_`, XCDR1), and checks the flashrt-ros2 node's trajectories.

Phases, each bounded in time:
  1. publish frames + joint states + the prompt (repeated until the first trajectory, since the
     node's prompt subscription is volatile) until --min-trajectories well-formed trajectories;
  2. the bad-input case: a malformed Image (truncated: undecodable as sensor_msgs/Image) and a
     wrong-encoding frame on camera 0, a joint state with NaN, then good input again;
  3. check the node still publishes well-formed trajectories and that its health report counted
     the bad messages.
Throughout, two endpoints whose QoS the node cannot match stand by (a best-effort prompt
publisher for the node's reliable prompt subscription, a transient-local trajectory subscriber for
its volatile publisher): the health report must name both (`incompatible_qos`).

With --stream-actions (the node in stream mode, one std_msgs/Float64MultiArray action per control
tick) the phases are instead: inputs and the prompt until the first action; then --window seconds
of inputs while counting the actions that arrive (each must have --action-dim finite values); then
until a health report shows the stream's counters. The count is reported for the caller to judge
against the control rate.
With --flood N (the flood test): inputs and the prompt until the first trajectory, then N
messages (camera frames and joint states in turn) as fast as the writers take them, reading the
node's trajectories meanwhile, then a second of ordinary inputs; reports how many trajectories
arrived during the flood. --flood 0 floods until the process is killed (the vanishing peer: it
prints "flooding" when it starts, and frames above 1500 bytes travel as fragments, so a kill can
leave a message half sent).
Prints one JSON line with the result; exits 0 on success, 1 on failure.

Only ever run inside an isolated network namespace (the Rust test and ci.sh arrange that)."""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cyclonedds.core import Policy, Qos  # noqa: E402
from cyclonedds.domain import DomainParticipant  # noqa: E402
from cyclonedds.pub import DataWriter  # noqa: E402
from cyclonedds.sub import DataReader  # noqa: E402
from cyclonedds.topic import Topic  # noqa: E402
from cyclonedds.util import duration  # noqa: E402

import ros2_msgs as m  # noqa: E402

# ROS 2 puts XCDR1 on the wire; rmw_cyclonedds asks for it explicitly too.
XCDR1 = Policy.DataRepresentation(use_cdrv0_representation=True)
SENSOR = Qos(Policy.Reliability.BestEffort, Policy.History.KeepLast(1), Policy.Durability.Volatile, XCDR1)
RELIABLE = Qos(Policy.Reliability.Reliable(duration(seconds=1)), Policy.History.KeepLast(10), Policy.Durability.Volatile, XCDR1)
LATCHED = Qos(Policy.Reliability.Reliable(duration(seconds=1)), Policy.History.KeepLast(1), Policy.Durability.TransientLocal, XCDR1)
FORMATS = [("rgb8", 3), ("bgr8", 3), ("rgba8", 4)]


def dds(topic):
    """ROS 2 topic name -> DDS topic name."""
    return "rt" + topic


def log(*a):
    print("[peer]", *a, file=sys.stderr, flush=True)


class Peer:
    def __init__(self, args):
        self.args = args
        self.dp = DomainParticipant(args.domain)
        self.cameras = [DataWriter(self.dp, Topic(self.dp, dds(t), m.Image_), SENSOR) for t in args.cameras]
        self.joints = DataWriter(self.dp, Topic(self.dp, dds(args.joint_states), m.JointState_), SENSOR)
        self.prompt = DataWriter(self.dp, Topic(self.dp, dds(args.prompt), m.String_), RELIABLE)
        self.trajectories = DataReader(self.dp, Topic(self.dp, dds(args.trajectory), m.JointTrajectory_), RELIABLE)
        self.chunks = DataReader(self.dp, Topic(self.dp, dds(args.chunk), m.Float32MultiArray_), RELIABLE)
        self.health = DataReader(self.dp, Topic(self.dp, dds(args.health), m.String_), RELIABLE)
        # Never matched by the node: it reports them instead of showing only `received: 0`.
        self.best_effort_prompt = DataWriter(self.dp, Topic(self.dp, dds(args.prompt), m.String_), SENSOR)
        self.latched_trajectories = DataReader(self.dp, Topic(self.dp, dds(args.trajectory), m.JointTrajectory_), LATCHED)
        # The malformed writer lives in its own participant: its type has the name of
        # sensor_msgs/Image but a different structure.
        self.bad_dp = DomainParticipant(args.domain)
        self.bad_camera = DataWriter(self.bad_dp, Topic(self.bad_dp, dds(args.cameras[0]), m.TruncatedImage_), SENSOR)
        self.good, self.bad, self.chunks_ok, self.last_health, self.tick = 0, [], 0, None, 0
        self.actions = None
        if args.stream_actions:
            self.actions = DataReader(self.dp, Topic(self.dp, dds(args.stream_actions), m.Float64MultiArray_), RELIABLE)
        self.n_actions = 0

    def stamp(self):
        t = time.time_ns()
        return m.Time_(sec=t // 1_000_000_000, nanosec=t % 1_000_000_000)

    def publish_inputs(self, nan=False):
        a = self.args
        self.tick += 1
        for i, w in enumerate(self.cameras):
            enc, bpp = FORMATS[i % len(FORMATS)]
            row = a.width * bpp
            data = [(self.tick * 7 + i * 31 + k) % 256 for k in range(row * a.height)]
            w.write(m.Image_(m.Header_(self.stamp(), f"camera_{i}"), a.height, a.width, enc, 0, row, data))
        pos = [0.1 * j + 0.01 * (self.tick % 10) for j in range(a.state_dim)]
        if nan:
            pos[0] = math.nan
        self.joints.write(m.JointState_(m.Header_(self.stamp(), ""), [f"j{j}" for j in range(a.state_dim)], pos, [], []))

    def read(self):
        for t in self.trajectories.take(N=64):
            problem = self.check_trajectory(t)
            if problem:
                self.bad.append(problem)
            else:
                self.good += 1
        for c in self.chunks.take(N=64):
            dims = [(d.label, d.size, d.stride) for d in c.layout.dim]
            want = [("horizon", self.args.horizon, self.args.horizon * self.args.action_dim), ("action", self.args.action_dim, self.args.action_dim)]
            if dims == want and len(c.data) == self.args.horizon * self.args.action_dim:
                self.chunks_ok += 1
            else:
                self.bad.append(f"action chunk layout {dims}, {len(c.data)} values")
        for h in self.health.take(N=16):
            self.last_health = json.loads(h.data)
        for c in self.actions.take(N=256) if self.actions else []:
            if len(c.data) == self.args.action_dim and all(math.isfinite(x) for x in c.data):
                self.n_actions += 1
            else:
                self.bad.append(f"action {list(c.data)}")

    def check_trajectory(self, t):
        a = self.args
        if list(t.joint_names) != a.joint_names:
            return f"joint_names {list(t.joint_names)}"
        if len(t.points) != a.horizon:
            return f"{len(t.points)} points"
        period_ns = round(1e9 / a.control_rate)
        for i, p in enumerate(t.points):
            if len(p.positions) != a.action_dim or not all(math.isfinite(x) for x in p.positions):
                return f"point {i}: positions {list(p.positions)}"
            ns = p.time_from_start.sec * 1_000_000_000 + p.time_from_start.nanosec
            if abs(ns - (i + 1) * period_ns) > 1000:
                return f"point {i}: time_from_start {ns} ns"
        if t.header.stamp.sec <= 0:
            return "header.stamp not set"
        return None

    def run_until(self, deadline, done, prompt=False, period=0.05):
        while time.monotonic() < deadline:
            if prompt and self.good == 0 and self.n_actions == 0:
                self.prompt.write(m.String_(self.args.task))
            self.publish_inputs()
            self.read()
            if done():
                return True
            time.sleep(period)
        return False

    def stream_main(self):
        a = self.args
        deadline = time.monotonic() + a.timeout
        if not self.run_until(deadline, lambda: self.n_actions > 0, prompt=True):
            return self.fail("no action before the timeout")
        log(f"phase 1: first action after {a.timeout - (deadline - time.monotonic()):.1f} s")
        self.n_actions = 0
        self.run_until(time.monotonic() + a.window, lambda: False)
        counted = self.n_actions

        def reported():
            h = self.last_health or {}
            return h.get("mode") == "stream" and (h.get("stream") or {}).get("ticks", 0) > counted

        if not self.run_until(deadline, reported):
            return self.fail(f"no health report with the stream's counters: {self.last_health}")
        if self.bad:
            return self.fail(f"malformed actions: {self.bad[:3]}")
        print(json.dumps({"ok": True, "actions": counted, "window_s": a.window, "health": self.last_health}), flush=True)
        return 0

    def flood_main(self):
        a = self.args
        deadline = time.monotonic() + a.timeout
        if not self.run_until(deadline, lambda: self.good >= 1, prompt=True):
            return self.fail("no trajectory before the flood")
        before, sent, started = self.good, 0, time.monotonic()
        frames = []
        for i in range(len(self.cameras)):
            enc, bpp = FORMATS[i % len(FORMATS)]
            frames.append((enc, a.width * bpp, bytes((i * 31 + k) % 256 for k in range(a.width * bpp * a.height))))
        print("flooding", flush=True)
        writers = len(self.cameras) + 1
        while a.flood == 0 or sent < a.flood:
            which = sent % writers
            if which < len(self.cameras):
                enc, row, data = frames[which]
                self.cameras[which].write(m.Image_(m.Header_(self.stamp(), f"camera_{which}"), a.height, a.width, enc, 0, row, data))
            else:
                pos = [0.1 * j for j in range(a.state_dim)]
                self.joints.write(m.JointState_(m.Header_(self.stamp(), ""), [f"j{j}" for j in range(a.state_dim)], pos, [], []))
            sent += 1
            if sent % 200 == 0:
                self.read()
        seconds = time.monotonic() - started
        self.read()
        during = self.good - before
        self.run_until(time.monotonic() + 1.0, lambda: False)
        if self.bad:
            return self.fail(f"malformed trajectories: {self.bad[:3]}")
        print(json.dumps({"ok": True, "messages": sent, "seconds": seconds, "trajectories_during_flood": during,
                          "trajectories_after": self.good - before - during, "health": self.last_health}), flush=True)
        return 0

    def main(self):
        a = self.args
        if a.stream_actions:
            return self.stream_main()
        if a.flood is not None:
            return self.flood_main()
        deadline = time.monotonic() + a.timeout
        if not self.run_until(deadline, lambda: self.good >= a.min_trajectories, prompt=True):
            return self.fail(f"only {self.good} well-formed trajectories before the timeout")
        log(f"phase 1: {self.good} trajectories")
        before = self.good

        # Phase 2: bad input. The malformed frame, a wrong encoding and a NaN joint state.
        self.bad_camera.write(m.TruncatedImage_(m.Header_(self.stamp(), "camera_0"), a.height, a.width))
        self.cameras[0].write(m.Image_(m.Header_(self.stamp(), "camera_0"), a.height, a.width, "mono8", 0, a.width, [0] * (a.width * a.height)))
        self.publish_inputs(nan=True)
        time.sleep(0.2)

        # Phase 3: the node carries on, and says what it dropped.
        def recovered():
            h = self.last_health or {}
            cam0 = (h.get("cameras") or [{}])[0]
            incompatible = (h.get("prompt", {}).get("incompatible_qos", 0) >= 1
                            and h.get("outputs", {}).get("trajectory", {}).get("incompatible_qos", 0) >= 1)
            return (self.good >= before + a.min_trajectories and cam0.get("malformed", 0) >= 1 and cam0.get("rejected", 0) >= 1
                    and h.get("joint_states", {}).get("rejected", 0) >= 1 and incompatible)

        if not self.run_until(deadline, recovered):
            return self.fail(f"after the bad input: {self.good - before} more trajectories, health {self.last_health}")
        if self.bad:
            return self.fail(f"malformed trajectories: {self.bad[:3]}")
        if self.chunks_ok == 0:
            return self.fail("no well-formed Float32MultiArray action chunk")
        print(json.dumps({"ok": True, "trajectories": self.good, "chunks": self.chunks_ok, "health": self.last_health}), flush=True)
        return 0

    def fail(self, why):
        print(json.dumps({"ok": False, "error": why, "trajectories": self.good, "health": self.last_health}), flush=True)
        return 1


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--domain", type=int, required=True)
    p.add_argument("--cameras", nargs="+", required=True, help="ROS 2 topic names, policy order")
    p.add_argument("--joint-states", required=True)
    p.add_argument("--prompt", required=True)
    p.add_argument("--trajectory", required=True)
    p.add_argument("--chunk", required=True)
    p.add_argument("--health", required=True)
    p.add_argument("--joint-names", nargs="+", required=True)
    p.add_argument("--state-dim", type=int, required=True)
    p.add_argument("--action-dim", type=int, required=True)
    p.add_argument("--horizon", type=int, required=True)
    p.add_argument("--control-rate", type=float, required=True)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--height", type=int, default=48)
    p.add_argument("--task", default="pick up the red cube")
    p.add_argument("--min-trajectories", type=int, default=5)
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--stream-actions", help="stream mode: the node's per-tick action topic")
    p.add_argument("--window", type=float, default=2.0, help="stream mode: seconds over which actions are counted")
    p.add_argument("--flood", type=int, help="send this many input messages as fast as possible (0: until killed)")
    return p.parse_args()


if __name__ == "__main__":
    sys.exit(Peer(parse()).main())
