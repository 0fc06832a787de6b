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

from plateauscope.model.backend import installed_transformer_lens

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
    """What the numbers of a training process depend on: the CPU and its instruction sets, the
    instruction set torch's own kernels run (``torch.backends.cpu.get_cpu_capability()``: the CPU's best,
    unless ``ATEN_CPU_CAPABILITY`` lowers it), the torch thread count and version, the device (a GPU's
    name when one trains) and the installed TransformerLens (its evaluation forwards differ between
    majors in the last bits)."""
    cpu, isa = _cpu()
    device = torch.device(device)
    return {"cpu": cpu, "isa": list(isa), "kernels": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(), "torch": str(torch.__version__),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
            "transformer_lens": installed_transformer_lens()}


def lowered_kernels(record: dict) -> str | None:
    """The instruction set of torch's kernels where it is below the CPU's best (``ATEN_CPU_CAPABILITY``
    set lower: the float path of a CPU without the wider extension), else None."""
    isa, kernels = set(record.get("isa") or ()), record.get("kernels")
    best = "AVX512" if "avx512f" in isa else "AVX2" if "avx2" in isa else None
    return kernels if kernels and best and kernels != best else None


def same_machine(before: dict, here: dict) -> bool:
    """Whether ``here`` is the machine of the record ``before`` (fields ``before`` lacks, written before
    they were recorded, are not compared)."""
    return all(before[key] == value for key, value in here.items() if key in before)


def describe(record: dict) -> str:
    """One line: ``Intel(R) Xeon(R) ... [avx2 fma avx512f; torch kernels AVX512], 2 threads, torch
    2.13.0+cpu, cpu`` (the kernels and ``, TransformerLens 4.3.0`` when recorded)."""
    lens = f", TransformerLens {record['transformer_lens']}" if record.get("transformer_lens") else ""
    kernels = f"; torch kernels {record['kernels']}" if record.get("kernels") else ""
    return (f"{record.get('cpu')} [{' '.join(record.get('isa') or [])}{kernels}], {record.get('threads')} threads, "
            f"torch {record.get('torch')}, {record.get('device')}{lens}")
