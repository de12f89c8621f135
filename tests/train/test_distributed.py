"""torchrun runs: ranks split the directions, exchange fitness only, and end bit-identical to one process."""

import csv
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

ARGS = {
    "cartpole": ["--task", "cartpole", "--population", "16", "--steps", "4", "--hidden", "4"],
    "digits": ["--task", "digits", "--population", "16", "--steps", "4", "--hidden", "8", "--batch-size", "8"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nesgpu(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "nesgpu", *args], capture_output=True, text=True, timeout=300,
                          **kwargs)


def torchrun(nproc, *args):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                           f"--master_port={free_port()}", "-m", "nesgpu", *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("task", sorted(ARGS))
def test_two_processes_bit_identical_to_one(tmp_path, task):
    two = torchrun(2, "train", *ARGS[task], "--device", "cpu", "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-3000:]
    # one process making the same computations: blocks of D / 2 = 4 directions, on one thread as torchrun's
    # workers (CPU kernels may split their sums differently on more threads)
    one = nesgpu("train", *ARGS[task], "--device", "cpu", "--chunk-size", "4", "--out", str(tmp_path / "one"),
                 env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # the step statistics summed over the ranks equal those summed over one process's blocks
    def metrics(run):
        with open(tmp_path / run / "metrics.csv") as f:
            return [{k: v for k, v in row.items() if k != "seconds"} for row in csv.DictReader(f)]
    assert metrics("one") == metrics("two")
    # only rank 0 wrote: one row per step, one summary line on stdout
    rows = (tmp_path / "two" / "metrics.csv").read_text().strip().splitlines()
    assert len(rows) == 1 + 4
    assert two.stdout.count('"task"') == 1 and '"processes": 2' in two.stdout


def test_dead_rank_ends_the_job_with_a_clear_error_and_resume_continues(tmp_path):
    out = tmp_path / "run"
    port = free_port()
    args = [sys.executable, "-m", "nesgpu", "train", *ARGS["cartpole"][:4], "--steps", "100000", "--hidden", "4",
            "--device", "cpu", "--checkpoint-every", "1", "--dist-timeout", "30", "--out", str(out)]
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    deadline = time.time() + 120
    while not (out / "checkpoint" / "state.pt").exists():
        assert time.time() < deadline, "training did not start"
        assert procs[0].poll() is None, procs[0].stderr.read()
        time.sleep(0.2)
    procs[1].send_signal(signal.SIGKILL)
    start = time.time()
    _, err = procs[0].communicate(timeout=90)
    assert procs[0].returncode != 0
    assert time.time() - start < 60
    assert "another process died or hung" in err, err[-2000:]
    # the last checkpoint is intact: one process continues the run (blocks of D / 2, as the two did)
    resumed = nesgpu("train", "--resume", str(out), "--steps", "12", "--chunk-size", "4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert '"steps": 12' in resumed.stdout
