"""What every benchmark script records beside its numbers: the machine it ran on and the commit it measured."""
import os
import platform
import subprocess

SOURCE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def machine():
    """CPU model, its SIMD flags that Sparrow's kernels use, cores, memory and OS."""
    cpu, flags, mem_kib = "unknown", [], 0
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and cpu == "unknown":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = [f for f in line.split(":", 1)[1].split()
                         if f in ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "fma", "f16c")]
    except OSError:
        pass
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    return {"cpu": cpu, "simd_flags": flags, "cores": os.cpu_count(), "memory_gib": round(mem_kib / 2**20, 1),
            "os": platform.platform()}


def commit():
    """The checkout's short commit, with -dirty when tracked files differ from it."""
    git = ["git", "-C", SOURCE_DIR]
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           check=True).stdout.strip()
    return head + ("-dirty" if dirty else "")
