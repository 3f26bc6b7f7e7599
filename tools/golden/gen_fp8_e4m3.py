"""Reference e4m3 (float8_e4m3fn) conversions from PyTorch, for runtime/src/fp8.rs's tests.

Writes tests/data/fp8/e4m3_torch.safetensors:
  decoded  f32 [256]  every code's value (NaN for 0x7f / 0xff)
  inputs   f32 [N]    values across the whole range: every code, every midpoint between
                      neighbouring codes (ties: round to nearest even), points just off them,
                      subnormals, values under the smallest subnormal, and random magnitudes
  encoded  u8  [N]    torch's float8_e4m3fn code of each input

Inputs stay within +-448: past it torch gives NaN where the runtime saturates (as CUDA's
__NV_SATFINITE conversion does); the runtime's saturation is tested on its own.
"""
import torch
from safetensors.torch import save_file

codes = torch.arange(256, dtype=torch.uint8)
decoded = codes.view(torch.float8_e4m3fn).float()
finite = decoded[torch.isfinite(decoded)].unique()
mids = (finite[1:] + finite[:-1]) / 2
gen = torch.Generator().manual_seed(0)
rand = torch.exp2(torch.empty(4000).uniform_(-12, 8.8, generator=gen)) * torch.randn(4000, generator=gen).sign()
inputs = torch.cat([
    finite,
    mids,
    mids * (1 + 2**-12),
    mids * (1 - 2**-12),
    torch.tensor([2.0**-10, 2.0**-11, 2.0**-12, 3 * 2.0**-11, 1e-30, -1e-30, 0.0, -0.0]),
    rand,
]).float().clamp(-448, 448)
encoded = inputs.to(torch.float8_e4m3fn).view(torch.uint8)
save_file({"decoded": decoded.contiguous(), "inputs": inputs.contiguous(), "encoded": encoded.contiguous()},
          "tests/data/fp8/e4m3_torch.safetensors", metadata={"generator": "tools/golden/gen_fp8_e4m3.py", "torch": torch.__version__})
print(len(inputs), "inputs")
