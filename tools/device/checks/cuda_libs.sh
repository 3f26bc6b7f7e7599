# Sourced by the device scripts: puts cuBLASLt and NVRTC on LD_LIBRARY_PATH, the toolkit's and/or
# the Python wheels' copies (cudarc loads them by name; the wheels', added last, come first).
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    $(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, s, "lib") for p in nvidia.__path__ for s in ("cu13", "cublas", "cuda_nvrtc")))' 2>/dev/null); do
    if [ -d "$d" ]; then export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"; fi
done
