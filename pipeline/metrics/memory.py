"""The driver's peak memory: what a run's summary and bench-pipeline report."""

from __future__ import annotations

import resource


def peak_rss_mib() -> float:
    """This process's peak resident memory in MiB: /proc's VmHWM where there is one (the peak of this program,
    reset by exec), else getrusage's ru_maxrss, which on Linux also carries over the peak of the process that
    forked it (a bench's 500 MiB parent would show in every child)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 if peak < 1 << 40 else peak / (1 << 20)  # KiB on Linux, bytes on macOS
