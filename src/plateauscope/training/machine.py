"""The machine a run trains on: what decides whether two runs can agree to the last bit.

Float kernels (oneDNN, MKL, torch's own) pick their code path by the CPU's instruction sets, and
parallel reductions round by the thread count, so a run is bit-identical only on the same kind of
CPU, with the same thread count and torch. ``summary.json`` lists the machines that trained a run
(``machines``), and a run resumed on another one says so in one line.
"""

from __future__ import annotations

import functools
import platform

import torch

ISA_FLAGS: tuple[str, ...] = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16",
                              "asimd", "sve")
"""The CPU flags (``/proc/cpuinfo``) that select different float kernels."""


@functools.cache
def _cpu() -> tuple[str, tuple[str, ...]]:
    """The CPU's model name and which of :data:`ISA_FLAGS` it has (Linux; elsewhere the name only)."""
    name, flags = "", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not name:
                    name = value.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    return name or platform.processor() or platform.machine(), tuple(f for f in ISA_FLAGS if f in flags)


def machine_record(device: torch.device | str = "cpu") -> dict:
    """What the numbers of a training process depend on: the CPU and its instruction sets, the torch
    thread count and version, and the device (a GPU's name when one trains)."""
    cpu, isa = _cpu()
    device = torch.device(device)
    return {"cpu": cpu, "isa": list(isa), "threads": torch.get_num_threads(), "torch": str(torch.__version__),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type}


def describe(record: dict) -> str:
    """One line: ``Intel(R) Xeon(R) ... [avx2 fma avx512f], 2 threads, torch 2.13.0+cpu, cpu``."""
    return (f"{record.get('cpu')} [{' '.join(record.get('isa') or [])}], {record.get('threads')} threads, "
            f"torch {record.get('torch')}, {record.get('device')}")
