"""How long a two-process run takes to end after one rank dies (SIGKILL): the survivor should stop within about
--dist-timeout, with "another process died or hung", not hang. The timed half of
tests/train/test_distributed.py::test_dead_rank_ends_the_job_with_a_clear_error_and_resume_continues, which
checks the error and the resume without a clock.

Run: python benchmarks/dead_rank_timeout.py [--dist-timeout 30] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(dist_timeout: int, out: Path) -> float:
    """Seconds from rank 1's SIGKILL to rank 0's exit."""
    args = [sys.executable, "-m", "nesgpu", "train", "--task", "cartpole", "--population", "16", "--steps", "100000",
            "--hidden", "4", "--device", "cpu", "--checkpoint-every", "1", "--dist-timeout", str(dist_timeout),
            "--out", str(out)]
    port, procs = free_port(), []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    try:
        while not (out / "checkpoint" / "state.pt").exists():
            if procs[0].poll() is not None:
                raise SystemExit(f"rank 0 ended before training: {procs[0].stderr.read()[-2000:]}")
            time.sleep(0.2)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        _, err = procs[0].communicate(timeout=10 * dist_timeout + 300)
        elapsed = time.perf_counter() - killed
    finally:
        for proc in procs:
            proc.kill()
    if procs[0].returncode == 0 or "another process died or hung" not in err:
        raise SystemExit(f"rank 0 did not report the dead rank (exit {procs[0].returncode}): {err[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist-timeout", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            times.append(one_round(args.dist_timeout, Path(tmp) / f"run{i}"))
            print(f"round {i + 1}: the survivor ended {times[-1]:.1f} s after the kill", flush=True)
    print(f"median {statistics.median(times):.1f} s, max {max(times):.1f} s (--dist-timeout {args.dist_timeout} s)")


if __name__ == "__main__":
    main()
