#!/usr/bin/env python3
"""Writes the committed seed corpora under fuzz/corpus/ (run from the repository root after
`flashrt synth --size micro --out target/fuzz-seed-micro`). Inputs follow each target's format:
checkpoint: [slot, mode, bytes] (slot order as SLOTS in fuzz_targets/checkpoint.rs; mode 0
replaces the file, 1 overwrites its start: safetensors files are seeded with their header only);
(slot 16, an observation log, is encoded here from the format's description);
ros2_msg: [message type, byte order, CDR payload] from ros2_bridge/tests/data/cdr_golden.json;
tokenizer: a tokenizer.json as it is.
The observation and c_abi targets decode their bytes field by field and start from a few
hand-picked byte strings."""
import json, os, struct, sys

root = os.getcwd()
micro = sys.argv[1] if len(sys.argv) > 1 else "target/fuzz-seed-micro"
pi05_tiny = "tests/data/pi05_tiny"
groot = "tests/data/groot_n17_tiny"

def write(target, name, data):
    d = os.path.join("fuzz/corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

def read(path):
    with open(path, "rb") as f:
        return f.read()

def header(path):
    data = read(path)
    (n,) = struct.unpack("<Q", data[:8])
    return data[: 8 + n]

# (slot, source file, is safetensors) in SLOTS order; a slot may take seeds from several sources.
slots = [
    (0, [f"{micro}/config.json", f"{pi05_tiny}/config.json"]),
    (1, [f"{micro}/model.safetensors", f"{pi05_tiny}/model.safetensors"]),
    (2, [f"{micro}/policy_preprocessor_step_3_normalizer_processor.safetensors"]),
    (3, [f"{pi05_tiny}/policy_postprocessor_step_0_unnormalizer_processor.safetensors"]),
    (4, [f"{micro}/tokenizer.json"]),
    (5, [f"{pi05_tiny}/config.json"]),
    (6, []),
    (7, [f"{micro}/model.safetensors"]),
    (8, []),
    (9, [f"{groot}/config.json"]),
    (10, [f"{groot}/backbone/config.json"]),
    (11, [f"{groot}/model.safetensors"]),
    (12, [f"{groot}/processor_config.json"]),
    (13, [f"{groot}/statistics.json"]),
    (14, [f"{groot}/embodiment_id.json"]),
    (15, [f"{groot}/tokenizer.json"]),
]
for slot, sources in slots:
    for i, src in enumerate(sources):
        if src.endswith(".safetensors"):
            # Whole files (the lerobot statistics are ~1 KB), else the header over the real data.
            data = read(src)
            if len(data) <= 4096:
                write("checkpoint", f"slot{slot:02}-{i}-replace", bytes([slot, 0]) + data)
            write("checkpoint", f"slot{slot:02}-{i}-header", bytes([slot, 1]) + header(src))
        else:
            write("checkpoint", f"slot{slot:02}-{i}-replace", bytes([slot, 0]) + read(src))
names = [k for k in json.loads(header(f"{micro}/model.safetensors")[8:]) if k != "__metadata__"]
shard = {"metadata": {}, "weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}
write("checkpoint", "slot06-index", bytes([6, 0]) + json.dumps(shard).encode())
q = lambda d: {"mean": [0.0] * d, "std": [1.0] * d, "q01": [-1.0] * d, "q99": [1.0] * d}
write("checkpoint", "slot08-norm-stats", bytes([8, 0]) + json.dumps({"norm_stats": {"state": q(8), "actions": q(7)}}).encode())
write("checkpoint", "slot00-remove", bytes([0, 2]))

# Slot 16: an observation log (runtime/src/observation_log.rs), encoded here from the format's
# description (postcard: varint integers, a byte for an Option's tag and for a u8, f32 little-endian;
# each record a u32 little-endian length, then its bytes): 2 cameras, state 3, 3 records.
def varint(n):
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)
text = lambda s: varint(len(s.encode())) + s.encode()
floats = lambda values: varint(len(values)) + b"".join(struct.pack("<f", v) for v in values)
def frame(w, h, fmt, bpp):
    return b"\x01" + varint(w) + varint(h) + bytes([fmt]) + varint(w * h * bpp) + bytes(i % 251 for i in range(w * h * bpp))
log_header = b"FRTOBS\0\0" + varint(1) + text("pi05") + varint(2) + varint(3) + varint(1764000000) + text("seed")
log = log_header
for r, (prompt, cameras, noise) in enumerate([
    ("pick up the cube", [frame(4, 3, 0, 3), frame(2, 2, 2, 4)], None),
    (None, [frame(4, 3, 1, 3), b"\x00"], [0.5] * 6),
    ("place it", [b"\x00", frame(1, 1, 0, 3)], None),
]):
    record = varint(20_000_000 * r) + (b"\x01" + text(prompt) if prompt else b"\x00") + varint(2) + b"".join(cameras)
    record += floats([0.1 * r, -0.2, 0.3]) + (b"\x01" + floats(noise) if noise else b"\x00")
    log += struct.pack("<I", len(record)) + record
write("checkpoint", "slot16-0-replace", bytes([16, 0]) + log)
write("checkpoint", "slot16-0-header", bytes([16, 1]) + log_header)

golden = json.load(open("ros2_bridge/tests/data/cdr_golden.json"))["payload_hex"]
kinds = {"Image": 0, "JointState": 1, "String": 2, "JointTrajectory": 3, "Float32MultiArray": 4}
for name, hexdata in golden.items():
    if name in kinds:
        write("ros2_msg", name, bytes([kinds[name], 0]) + bytes.fromhex(hexdata))

# tokenizer: the two models' tokenizer files, and the findings of the checkpoint target.
write("tokenizer", "pi05-micro", read(f"{micro}/tokenizer.json"))
write("tokenizer", "groot-tiny", read(f"{groot}/tokenizer.json"))
for finding in ["truncated-decoder", "merge-longer-than-vocab"]:
    write("tokenizer", f"regress-{finding}", read(f"tests/data/fuzz/pi05__tokenizer.json__{finding}"))
# This target's own first finding: a vocabulary that skips ids (here 600..999, as the unit test
# vocab_size_is_one_past_the_largest_id_when_ids_skip_numbers builds it) had Pi0.5's prompt
# tokenizer report a vocab_size below the ids it produced.
sparse = json.loads(read("tests/data/tokenizer/tokenizer.json"))
sparse["model"]["vocab"] = {t: i for t, i in sparse["model"]["vocab"].items() if not 600 <= i < 1000}
sparse["model"]["merges"] = []
write("tokenizer", "regress-sparse-ids", json.dumps(sparse).encode())

for target in ["observation", "c_abi"]:
    write(target, "zeros", bytes(64))
    write(target, "ones", bytes([1] * 256))
    write(target, "ramp", bytes(range(256)) * 2)

# serve_msg: requests as openpi-client 0.1.2 packs them (its msgpack_numpy), for each preset key
# map, small images HWC and CHW; written only where the client is installed (the CI venv).
try:
    import numpy as np
    from openpi_client import msgpack_numpy
except ImportError:
    print("openpi_client not installed: serve_msg seeds not written")
else:
    img = lambda h, w: (np.arange(h * w * 3) % 251).astype(np.uint8).reshape(h, w, 3)
    requests = {
        "libero": {"observation/image": img(8, 8), "observation/wrist_image": img(6, 10),
                   "observation/state": np.linspace(-1, 1, 8).astype(np.float32), "prompt": "pick up the bowl"},
        "aloha": {"images": {"cam_high": img(8, 8).transpose(2, 0, 1), "cam_left_wrist": img(4, 4).transpose(2, 0, 1)},
                  "state": np.zeros(8, np.float64), "prompt": "fold"},
        "droid": {"observation/exterior_image_1_left": img(8, 8), "observation/wrist_image_left": img(8, 8),
                  "observation/joint_position": np.zeros(7, np.float32), "observation/gripper_position": np.ones(1, np.float32),
                  "prompt": "open the drawer"},
    }
    for name, request in requests.items():
        write("serve_msg", name, msgpack_numpy.packb(request))
