"""torchrun runs: ranks split the directions, exchange fitness only, and end bit-identical to one process."""

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from nesgpu.train.storage.checkpoint import find_checkpoint

ARGS = {
    "cartpole": ["--task", "cartpole", "--population", "16", "--steps", "4", "--hidden", "4"],
    "digits": ["--task", "digits", "--population", "16", "--steps", "4", "--hidden", "8", "--batch-size", "8"],
    "digits-snes": ["--task", "digits", "--strategy", "snes", "--layer", "gaussian", "--population", "16", "--steps",
                    "4", "--hidden", "8", "--batch-size", "8"],  # a sigma per parameter, adapted on every rank
    "digits-sgd-bf16": ["--task", "digits", "--update", "sgd", "--dtype", "bfloat16", "--population", "16", "--steps",
                        "4", "--hidden", "8", "--batch-size", "8"],  # in place, stochastically rounded on every rank
    "digits-adam-bf16": ["--task", "digits", "--update", "adam", "--dtype", "bfloat16", "--population", "16", "--steps",
                         "4", "--hidden", "8", "--batch-size", "8"],  # Adam's bf16 moments, in place on every rank
    "digits-subspace": ["--task", "digits", "--subspace", "0.5", "--population", "16", "--steps", "4", "--hidden",
                        "8,8", "--batch-size", "8"],  # each step's subset of the modules, the same on every rank
    "cartpole-cma_es": ["--task", "cartpole", "--strategy", "cma_es", "--layer", "gaussian", "--population", "16",
                        "--steps", "4", "--hidden", "4"],  # a full covariance, adapted on every rank
}
HALF_SHARE = {"cartpole-cma_es": "8"}  # independent members (cma_es's default): D = 16, 8 per process; else D = 8


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
    # one process making the same computations: blocks of D / 2 directions, on one thread as torchrun's
    # workers (CPU kernels may split their sums differently on more threads)
    one = nesgpu("train", *ARGS[task], "--device", "cpu", "--chunk-size", HALF_SHARE.get(task, "4"), "--out",
                 str(tmp_path / "one"), env=dict(os.environ, OMP_NUM_THREADS="1"))
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
    assert len(rows) == 1 + 1 + 4  # the header, step 0, steps 1-4
    assert two.stdout.count('"task"') == 1 and '"processes": 2' in two.stdout


def test_two_nodes_through_c10d_rendezvous_bit_identical_to_one_process(tmp_path):
    # two torchrun launchers, one process each, meeting at a c10d rendezvous: how a multi-node job starts
    port = free_port()
    launch = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1",
              "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=nesgpu-test", "-m", "nesgpu",
              "train", *ARGS["digits"], "--device", "cpu", "--out", str(tmp_path / "nodes")]
    nodes = [subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True) for _ in range(2)]
    try:
        outputs = [node.communicate(timeout=300) for node in nodes]
    finally:  # never leave a launcher and its workers behind
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    assert all(node.returncode == 0 for node in nodes), [err[-2000:] for _, err in outputs]
    one = nesgpu("train", *ARGS["digits"], "--device", "cpu", "--chunk-size", "4", "--out", str(tmp_path / "one"),
                 env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert one.returncode == 0, one.stderr[-3000:]
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "nodes" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert sum(out.count('"processes": 2') for out, _ in outputs) == 1  # one summary, from global rank 0


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
    deadline = time.time() + 300
    while not (out / "checkpoint" / "state.pt").exists():
        assert time.time() < deadline, "training did not start"
        assert procs[0].poll() is None, procs[0].stderr.read()
        time.sleep(0.2)
    procs[1].send_signal(signal.SIGKILL)
    try:
        _, err = procs[0].communicate(timeout=300)  # a guard against a hang, not a speed limit
    finally:
        procs[0].kill()
    assert procs[0].returncode != 0
    assert "another process died or hung" in err, err[-2000:]
    # the last checkpoint is intact: one process continues the run (blocks of D / 2, as the two did)
    at = torch.load(find_checkpoint(out / "checkpoint") / "state.pt", weights_only=True)["strategy"]["step"]
    resumed = nesgpu("train", "--resume", str(out), "--steps", str(at + 2), "--chunk-size", "4")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f'"steps": {at + 2}' in resumed.stdout


# ----- the exchange itself, in a real 3-process gloo group -------------------------------------------------
def _rank_data(rank):
    fitness = torch.arange(4, dtype=torch.float32).view(2, 2) + 10 * rank
    totals = {
        "float32": torch.tensor([1.0, 2.0**-24, 2.0**-24][rank]),  # float32 adds round at every step
        "int64": torch.tensor(2**40 + rank),
        "vector": torch.tensor([0.1, 0.2], dtype=torch.float64) * (rank + 1),
        "python_float": 0.1 * (rank + 1),
        "python_int": rank + 7,
    }
    return fitness, totals


def _exchange_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    from nesgpu.distributed import Ranks

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        fitness, totals = Ranks(rank, world).exchange(*_rank_data(rank))
        torch.save({"fitness": fitness, **totals}, f"{out_dir}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_exchange_equals_one_process_adding_its_blocks_in_order(tmp_path):
    world = 3
    torch.multiprocessing.spawn(_exchange_worker, args=(world, str(tmp_path / "init"), str(tmp_path)), nprocs=world)
    data = [_rank_data(r) for r in range(world)]
    expected = {"fitness": torch.cat([f for f, _ in data], dim=-1)}
    for key in data[0][1]:
        values = [torch.as_tensor(t[key], dtype=torch.float64 if isinstance(t[key], float) else None)
                  for _, t in data]
        total = values[0]
        for v in values[1:]:
            total = total + v
        expected[key] = total
    assert expected["float32"] == 1.0  # the case a float64 sum rounded once would get wrong
    for rank in range(world):
        got = torch.load(tmp_path / f"{rank}.pt", weights_only=True)
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), (rank, key)


def _own_group_worker(rank, world, port, out_dir):
    import torch.distributed as dist

    from nesgpu.distributed import init_from_environment

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    ranks = init_from_environment(torch.device("cpu"), timeout_s=60, own_group=True)
    fitness, totals = ranks.exchange(*_rank_data(rank))
    mean = ranks.mean(torch.tensor([float(rank)]))
    ranks.barrier()
    untouched = not dist.is_initialized()  # the default group stays free for an engine of the process (vLLM's)
    ranks.close()
    torch.save({"fitness": fitness, "mean": mean, "untouched": torch.tensor(untouched), **totals},
               f"{out_dir}/{rank}.pt")


def test_ranks_with_a_group_of_their_own_exchange_as_through_the_default_group(tmp_path):
    world = 2
    torch.multiprocessing.spawn(_own_group_worker, args=(world, free_port(), str(tmp_path)), nprocs=world)
    data = [_rank_data(r) for r in range(world)]
    for rank in range(world):
        got = torch.load(tmp_path / f"{rank}.pt", weights_only=True)
        assert bool(got["untouched"]) and float(got["mean"]) == 0.5
        assert torch.equal(got["fitness"], torch.cat([f for f, _ in data], dim=-1))
        assert float(got["python_int"]) == sum(t["python_int"] for _, t in data)


def test_two_processes_whose_members_all_tie_leave_the_weights_as_they_were(tmp_path):
    from nesgpu.train import TrainConfig
    from nesgpu.train.setup.build import build

    # sigma 1e-12 vanishes beside every weight: each member is the plain model, so every fitness ties exactly
    args = [*ARGS["digits"], "--sigma", "1e-12", "--device", "cpu", "--out", str(tmp_path / "two")]
    two = torchrun(2, "train", *args)
    assert two.returncode == 0, two.stderr[-3000:]
    with open(tmp_path / "two" / "metrics.csv") as f:
        assert [row["no_signal"] for row in csv.DictReader(f)][1:] == ["1"] * 4
    assert '"steps_without_signal": 1.0' in two.stdout
    start = build(TrainConfig.flat(task="digits", population=16, steps=4, hidden=(8,), batch_size=8).resolved(),
                  torch.device("cpu")).model.state_dict()
    trained = load_file(tmp_path / "two" / "model.safetensors")
    assert set(trained) == set(start) and all(torch.equal(trained[k], start[k]) for k in start)


def test_two_processes_probe_the_same_sigma_as_one(tmp_path):
    # --sigma auto: every rank runs the probe's evaluations, exchanges their fitness, and so finds the same sigma
    args = [*ARGS["digits"], "--sigma", "auto", "--lr", "auto", "--device", "cpu"]
    two = torchrun(2, "train", *args, "--out", str(tmp_path / "two"))
    assert two.returncode == 0, two.stderr[-3000:]
    one = nesgpu("train", *args, "--chunk-size", "4", "--out", str(tmp_path / "one"),
                 env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert one.returncode == 0, one.stderr[-3000:]
    assert two.stderr.count("sigma auto: ") == 1  # rank 0 says it
    summaries = [json.loads((tmp_path / run / "summary.json").read_text()) for run in ("one", "two")]
    assert summaries[0]["sigma_probe"]["tried"] == summaries[1]["sigma_probe"]["tried"]
    assert summaries[0]["sigma"] == summaries[1]["sigma"] and summaries[0]["lr"] == summaries[1]["lr"]
    a, b = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
