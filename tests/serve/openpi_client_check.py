"""Drives `flashrt serve` (LIBERO keys, tiny Pi0.5) with the real openpi-client 0.1.2.

Run by tests/serve_openpi.rs, which starts the server and afterwards compares the recorded
actions with in-process `Policy::step` on the same inputs. Checks: metadata on connect;
round trips with uint8 images of several sizes, HWC and CHW; two clients at once; malformed
requests (unknown and missing keys, wrong dtypes and shapes, arrays and messages over the
limits, garbage bytes, a text frame, a policy step error) each answered with an error text
frame while the server keeps serving; the API key; the connection limit; graceful shutdown
(SIGTERM: the request in flight is answered, then the connection closes with 1001).

Everything is bounded: a fixed number of requests, socket timeouts, and an alarm for the whole
script. Loopback only.
"""

import argparse
import json
import os
import signal
import struct
import sys
import threading
import time
import warnings

import numpy as np
import websockets.exceptions
import websockets.sync.client
from openpi_client import msgpack_numpy
from openpi_client import websocket_client_policy as wcp

HORIZON, ACTION_DIM, STATE_DIM = 50, 7, 8


def log(*args):
    print(*args, flush=True)


class Checker:
    def __init__(self, port, api_key):
        self.port, self.api_key = port, api_key
        self.uri = f"ws://127.0.0.1:{port}"
        self.rng = np.random.default_rng(1234)
        self.records = []  # (hwc images, state f32, noise f32, prompt, actions)

    def client(self, api_key=None):
        return wcp.WebsocketClientPolicy("127.0.0.1", self.port, api_key=api_key or self.api_key)

    def raw(self):
        """A websocket without openpi_client's packing, for bytes no client would send. Retries
        a refusal for a full server for a while: closed connections free their slots within the
        server's poll interval."""
        deadline = time.monotonic() + 10
        while True:
            try:
                ws = websockets.sync.client.connect(
                    self.uri, compression=None, max_size=None, open_timeout=10, close_timeout=5,
                    additional_headers={"Authorization": f"Api-Key {self.api_key}"},
                )
                break
            except websockets.exceptions.InvalidStatus as e:
                if e.response.status_code != 503 or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        msgpack_numpy.unpackb(ws.recv(timeout=10))  # metadata
        return ws

    def observation(self, size, chw=False, state_dtype=np.float64, prompt="put the bowl on the plate"):
        h, w = size
        image = self.rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        wrist = self.rng.integers(0, 256, (w, h, 3), dtype=np.uint8)  # transposed size: not square
        state = self.rng.uniform(-1, 1, STATE_DIM).astype(state_dtype)
        noise = self.rng.standard_normal(self.noise_shape).astype(np.float32)
        obs = {
            "observation/image": np.ascontiguousarray(image.transpose(2, 0, 1)) if chw else image,
            "observation/wrist_image": wrist,
            "observation/state": state,
            "prompt": prompt,
            "noise": noise,
        }
        return obs, (image, wrist, state.astype(np.float32), noise, prompt)

    def check_metadata(self):
        c = self.client()
        meta = c.get_server_metadata()
        log("metadata:", meta)
        assert meta["server"] == "flashrt" and meta["model"] == "pi05", meta
        assert meta["action_shape"] == [HORIZON, ACTION_DIM], meta
        assert meta["camera_keys"] == ["observation/image", "observation/wrist_image", None], meta
        assert meta["state_keys"] == ["observation/state"] and meta["state_dim"] == STATE_DIM, meta
        self.noise_shape = tuple(meta["noise_shape"])
        assert self.noise_shape[0] == HORIZON, meta
        return c

    def round_trips(self, c):
        cases = [((224, 224), False, np.float64), ((96, 128), True, np.float32), ((480, 640), False, np.float64),
                 ((33, 57), True, np.float64)]
        for i, (size, chw, dtype) in enumerate(cases):
            obs, record = self.observation(size, chw, dtype, prompt="put the bowl on the plate" if i % 2 == 0 else "open the drawer")
            out = c.infer(obs)
            actions = out["actions"]
            assert isinstance(actions, np.ndarray) and actions.dtype == np.float32, type(actions)
            assert actions.shape == (HORIZON, ACTION_DIM), actions.shape
            assert np.isfinite(actions).all()
            assert out["policy_timing"]["infer_ms"] > 0 and out["server_timing"]["infer_ms"] > 0, out
            if i > 0:
                assert out["server_timing"]["prev_total_ms"] > 0, out
            self.records.append(record + (actions.copy(),))
            log(f"round trip {size} {'CHW' if chw else 'HWC'} {np.dtype(dtype).name} state: actions {actions.shape} ok")
        # The same request twice gives the same actions; other noise gives others.
        obs, _ = self.observation((64, 64))
        a, b = c.infer(obs)["actions"], c.infer(obs)["actions"]
        assert np.array_equal(a, b)
        obs["noise"] = obs["noise"] + 0.5
        assert not np.array_equal(a, c.infer(obs)["actions"])
        # Without noise the server draws it.
        del obs["noise"]
        assert np.isfinite(c.infer(obs)["actions"]).all()
        log("determinism with a given noise ok")

    def two_clients(self):
        clients = [self.client(), self.client()]  # both connected before either sends
        obs = [self.observation((64 + 16 * i, 80))[0] for i in range(2)]
        results, errors = [[], []], []

        def run(k):
            try:
                for _ in range(4):
                    results[k].append(clients[k].infer(obs[k])["actions"])
            except Exception as e:  # reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors, errors
        for k in range(2):
            assert len(results[k]) == 4 and all(np.array_equal(r, results[k][0]) for r in results[k]), k
        assert not np.array_equal(results[0][0], results[1][0])
        for c in clients:
            c._ws.close()
        log("two clients at once ok")

    def expect_error(self, name, obs=None, raw=None, text=None, needle=""):
        """Sends one bad request on a fresh connection; expects an error text frame naming the
        problem, then the close (openpi's behaviour), and the server still serving."""
        if obs is not None:
            c = self.client()
            try:
                c.infer(obs)
            except RuntimeError as e:
                message = str(e)
            else:
                raise AssertionError(f"{name}: the server accepted it")
            ws = c._ws
        else:
            ws = self.raw()
            ws.send(raw if raw is not None else text)
            message = ws.recv(timeout=20)
            assert isinstance(message, str), f"{name}: expected a text frame, got {type(message)}"
        assert needle in message, f"{name}: {message!r} lacks {needle!r}"
        try:
            ws.recv(timeout=10)
            raise AssertionError(f"{name}: the connection stayed open")
        except websockets.exceptions.ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code in (1011, 1009), f"{name}: {closed!r}"
        log(f"{name}: refused: {message.splitlines()[-1][:160]}")

    def malformed(self):
        good = lambda: self.observation((64, 64))[0]  # noqa: E731
        obs = good()
        obs["observation/img"] = obs.pop("observation/image")
        self.expect_error("wrong key", obs, needle='unknown key(s) ["observation/img"]')
        obs = good()
        del obs["observation/state"]
        self.expect_error("missing key", obs, needle='request["observation/state"]: missing')
        obs = good()
        obs["observation/image"] = obs["observation/image"].astype(np.float32)
        self.expect_error("float image", obs, needle="must be uint8, found dtype <f4")
        obs = good()
        obs["observation/image"] = obs["observation/image"][:, :, 0]
        self.expect_error("2-D image", obs, needle="found shape [64, 64]")
        obs = good()
        obs["observation/state"] = np.array(["a", "b"])
        self.expect_error("string state", obs, needle="is not supported")
        obs = good()
        obs["observation/state"] = obs["observation/state"][:7]
        self.expect_error("short state", obs, needle="the state has 7 values, the policy expects 8")
        obs = good()
        obs["prompt"] = 42
        self.expect_error("numeric prompt", obs, needle='request["prompt"]: expected a string')
        obs = good()
        obs["observation/image"] = np.zeros((700, 700, 3), np.uint8)  # 1.47 MB > --max-array-bytes
        self.expect_error("oversized array", obs, needle="exceed the limit of 1048576 bytes")
        obs = good()
        obs["observation/wrist_image"] = np.zeros((1400, 1400, 3), np.uint8)  # 5.9 MB > --max-message-bytes
        self.expect_error("oversized message", obs, needle="per message")
        obs = good()
        obs["observation/state"][2] = np.nan
        self.expect_error("step error (NaN state)", obs, needle="observation.state[2]: value NaN is not finite")
        obs = good()
        obs["noise"] = obs["noise"][:10]
        self.expect_error("step error (short noise)", obs, needle="invalid observation.noise")
        self.expect_error("garbage bytes", raw=b"\xc1\x00\xffgarbage", needle="not msgpack")
        self.expect_error("truncated msgpack", raw=msgpack_numpy.packb(good())[:-100], needle="truncated")
        self.expect_error("msgpack list", raw=msgpack_numpy.packb([1, 2, 3]), needle="expected a map")
        self.expect_error("text frame", text="hello", needle="a text frame")
        # Still serving, on a new connection.
        c = self.client()
        assert c.infer(good())["actions"].shape == (HORIZON, ACTION_DIM)
        c._ws.close()
        log("still serving after malformed requests ok")

    def check_api_key(self):
        for key in ["wrong", None]:
            headers = {"Authorization": f"Api-Key {key}"} if key else None
            try:
                websockets.sync.client.connect(self.uri, additional_headers=headers, open_timeout=10)
                raise AssertionError(f"api key {key!r} accepted")
            except websockets.exceptions.InvalidStatus as e:
                assert e.response.status_code == 401, e
        try:
            wcp.WebsocketClientPolicy("127.0.0.1", self.port, api_key="wrong")
            raise AssertionError("openpi client with a wrong key accepted")
        except websockets.exceptions.InvalidStatus as e:
            assert e.response.status_code == 401, e
        log("api key: wrong and missing refused (401), right one served ok")

    def connection_limit(self, limit):
        held = [self.raw() for _ in range(limit)]
        try:
            websockets.sync.client.connect(self.uri, open_timeout=10,
                                           additional_headers={"Authorization": f"Api-Key {self.api_key}"})
            raise AssertionError("a connection over the limit was accepted")
        except websockets.exceptions.InvalidStatus as e:
            assert e.response.status_code == 503, e
        except (ConnectionError, websockets.exceptions.InvalidMessage):
            pass  # the refusal raced the client's request
        held.pop().close()
        deadline = time.monotonic() + 10
        while True:  # the server notices the close within its poll interval
            try:
                c = self.client()
                break
            except websockets.exceptions.InvalidStatus:
                assert time.monotonic() < deadline, "a freed connection slot was not reused"
                time.sleep(0.1)
        assert c.infer(self.observation((32, 32))[0])["actions"].shape == (HORIZON, ACTION_DIM)
        c._ws.close()
        for ws in held:
            ws.close()
        log(f"connection limit {limit}: refused with 503, freed slot reused ok")

    def shutdown(self, server_pid):
        ws = self.raw()
        ws.send(msgpack_numpy.packb(self.observation((64, 64))[0]))
        # The request is on its way; stop the server now: it must still answer it.
        os.kill(server_pid, signal.SIGTERM)
        reply = ws.recv(timeout=30)
        assert isinstance(reply, bytes), reply
        assert msgpack_numpy.unpackb(reply)["actions"].shape == (HORIZON, ACTION_DIM)
        try:
            ws.recv(timeout=20)
            raise AssertionError("the connection stayed open after SIGTERM")
        except websockets.exceptions.ConnectionClosed as closed:
            assert closed.rcvd is not None and closed.rcvd.code == 1001, closed
        log("graceful shutdown: request in flight answered, connection closed with 1001 ok")

    def write_record(self, path):
        """The round trips' inputs (images HWC) and actions, as safetensors (written by hand:
        the CI venv has no safetensors package)."""
        tensors, metadata = {}, {}
        for i, (image, wrist, state, noise, prompt, actions) in enumerate(self.records):
            for name, a in [("image.0", image), ("image.1", wrist), ("state", state), ("noise", noise), ("actions", actions)]:
                tensors[f"case{i}.{name}"] = np.ascontiguousarray(a)
            metadata[f"case{i}.prompt"] = prompt
        header, offset, blobs = {"__metadata__": metadata}, 0, []
        for name, a in tensors.items():
            dtype = {np.dtype(np.uint8): "U8", np.dtype(np.float32): "F32"}[a.dtype]
            blob = a.tobytes()
            header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
            blobs.append(blob)
            offset += len(blob)
        text = json.dumps(header).encode()
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api-key", required=True)
    p.add_argument("--server-pid", type=int, required=True)
    p.add_argument("--max-connections", type=int, required=True)
    p.add_argument("--record", required=True)
    args = p.parse_args()
    signal.alarm(240)  # the whole script, whatever hangs
    # websockets 14+ prefers `with connect(...)`; the connections here are closed explicitly.
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    c = Checker(args.port, args.api_key)
    client = c.check_metadata()
    c.round_trips(client)
    client._ws.close()
    c.two_clients()
    c.malformed()
    c.check_api_key()
    c.connection_limit(args.max_connections)
    c.write_record(args.record)
    c.shutdown(args.server_pid)
    log("ALL OK")


if __name__ == "__main__":
    sys.exit(main())
