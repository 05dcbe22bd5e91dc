"""How busy the machine was while tuning: the share of its CPU time that other processes took
(issue 13: measurements taken while another process competes for the cores may not hold on a
quiet machine, and a plan tuned then may be the wrong one).

The share comes from the machine-wide busy time in ``/proc/stat`` minus this process's own CPU
time (``os.times``), over the wall time and every CPU; the 1-minute load average lags a
process that starts with the tuning by most of a minute, and counts the tuner itself.
Elsewhere than Linux the share is not known (``None``).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

#: the share of the machine's CPU time taken by other processes from which tuning counts as
#: done on a busy machine (one busy core of two is 0.5)
BUSY_SHARE = 0.2


@dataclass(frozen=True)
class CpuSnapshot:
    wall_s: float
    machine_busy_s: float
    own_s: float
    cpus: int


def snapshot() -> CpuSnapshot | None:
    """The machine's and this process's CPU time so far, ``None`` where /proc/stat is missing."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 8:
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    user, nice, system, _idle, _iowait, irq, softirq = (int(v) for v in fields[1:8])
    steal = int(fields[8]) if len(fields) > 8 else 0
    t = os.times()
    return CpuSnapshot(time.monotonic(), (user + nice + system + irq + softirq + steal) / ticks,
                       t.user + t.system + t.children_user + t.children_system, os.cpu_count() or 1)


def others_share(start: CpuSnapshot | None, end: CpuSnapshot | None) -> float | None:
    """The share of the machine's CPU time between ``start`` and ``end`` that other processes
    took (0: only this process ran; 1: every CPU busy with others), ``None`` when unknown."""
    if start is None or end is None:
        return None
    wall = end.wall_s - start.wall_s
    if wall <= 0:
        return None
    others = (end.machine_busy_s - start.machine_busy_s) - (end.own_s - start.own_s)
    return max(0.0, min(1.0, others / (wall * end.cpus)))
