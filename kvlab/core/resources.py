"""What this machine can hold: memory available now, and a refusal, before any work, of runs that need more.

Each engine states what one request costs it (bytes held at the peak, seconds of work), measured by
`make bench`; a run is refused when its estimate exceeds the memory available now (less a margin for the
interpreter and libraries), with one line naming the input, the estimate, the memory available and the
largest size that fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvlab.core import validate
from kvlab.core.units import GIB, MIB

# Room kept for the interpreter, numpy, pandas and the notebook kernel: a run may use this share of what is free.
USABLE_SHARE = 0.8


def available_memory_bytes() -> int:
    """Memory this process can still allocate: the smaller of the system's MemAvailable and the cgroup's free room."""
    found = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:  # a container's own limit (cgroup v2)
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        if limit != "max":
            found.append(int(limit) - used)
    except (OSError, ValueError):
        pass
    return max(0, min(found)) if found else 16 * GIB  # unknown platform: assume a modest machine


@dataclass(frozen=True)
class Estimate:
    """What a run needs: bytes held at its peak and seconds of work (estimates, from make bench)."""

    peak_bytes: float
    seconds: float

    def __add__(self, other: Estimate) -> Estimate:
        # Parts of one run that happen one after another: memory is the larger peak, time adds up.
        return Estimate(max(self.peak_bytes, other.peak_bytes), self.seconds + other.seconds)


def _gib(x: float) -> str:
    return f"{x / GIB:,.1f} GiB" if x >= GIB / 10 else f"{x / MIB:,.0f} MiB"


def refuse_if_too_big(
    name: str,
    value: int,
    bytes_per_unit: float,
    *,
    fixed_bytes: float = 0.0,
    unit: str = "requests",
    available_bytes: int | None = None,
) -> None:
    """Raise the one-line ValueError when value units of bytes_per_unit (plus fixed_bytes) do not fit in memory."""
    available = available_memory_bytes() if available_bytes is None else available_bytes
    usable = USABLE_SHARE * available
    needed = fixed_bytes + value * bytes_per_unit
    if needed > usable:
        largest = max(0, int((usable - fixed_bytes) // bytes_per_unit))
        validate.fail(
            name,
            value,
            f"needs about {_gib(needed)} of memory and this machine has {_gib(available)} "
            f"available; at most {largest:,} {unit} fit",
        )
