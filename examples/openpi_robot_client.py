"""A robot-side openpi client talking to `flashrt serve`, unchanged from how it talks to openpi.

Start a server on a tiny random Pi0.5 (any checkpoint works the same way):

    cargo run --release -p flashrt -- synth --model pi05 --size tiny --out /tmp/pi05_tiny
    cargo run --release -p flashrt -- serve --checkpoint /tmp/pi05_tiny --keys libero --port 8000

then, in a Python environment with the client (`pip install openpi-client==0.1.2 typing_extensions`):

    python examples/openpi_robot_client.py --port 8000 --steps 20

It sends LIBERO-style observations (agent view and wrist camera as uint8 HWC, an 8-value state,
the task text), prints the server's metadata and each action chunk's shape and round-trip time.
Pass `--api-key` when the server was started with one.
"""

import argparse
import time

import numpy as np
from openpi_client import websocket_client_policy


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=None)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--prompt", default="put the bowl on the plate")
    args = p.parse_args()

    policy = websocket_client_policy.WebsocketClientPolicy(args.host, args.port, api_key=args.api_key)
    meta = policy.get_server_metadata()
    print(f"server: {meta['server']} {meta['version']}, model {meta['model']} on {meta['device']}")
    print(f"cameras {meta['cameras']} fed by keys {meta['camera_keys']}, state from {meta['state_keys']}")

    rng = np.random.default_rng(0)
    times = []
    for step in range(args.steps):
        obs = {
            # A camera frame as the robot delivers it: any size, uint8, HWC (CHW works too).
            "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
            "observation/wrist_image": rng.integers(0, 256, (480, 640, 3), dtype=np.uint8),
            "observation/state": rng.uniform(-1, 1, 8),
            "prompt": args.prompt,
        }
        start = time.monotonic()
        result = policy.infer(obs)
        times.append((time.monotonic() - start) * 1e3)
        actions = result["actions"]
        if step == 0:
            print(f"actions {actions.dtype} {actions.shape}; first row {np.round(actions[0], 3)}")
    times.sort()
    print(f"{args.steps} round trips: p50 {times[len(times) // 2]:.1f} ms, max {times[-1]:.1f} ms "
          f"(the last one's step in the server: {result['policy_timing']['infer_ms']:.1f} ms)")


if __name__ == "__main__":
    main()
