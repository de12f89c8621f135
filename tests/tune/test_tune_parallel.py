"""Two nesgpu tune processes on one directory share the study: the cap holds over both, no trial twice."""

import os
import subprocess
import sys

import optuna
from optuna.trial import TrialState

TRIALS = 6


def test_two_processes_on_one_directory_end_with_the_requested_trials(tmp_path):
    (tmp_path / "space.yaml").write_text("lr: {low: 1.0e-4, high: 0.3, log: true}\n")
    out = tmp_path / "tune"
    argv = [sys.executable, "-m", "nesgpu", "tune", "--task", "digits", "--steps", "30", "--population", "16",
            "--batch-size", "8", "--hidden", "8", "--log", "none", "--device", "cpu", "--trials", str(TRIALS),
            "--out", str(out), "--space", str(tmp_path / "space.yaml"), "--heartbeat", "1",
            "--pruner", "none"]  # the median pruner stops a 6th trial or not by the two processes' timing
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
                 for _ in range(2)]
    results = [p.communicate(timeout=300) for p in processes]
    for p, (stdout, stderr) in zip(processes, results):
        assert p.returncode == 0, stderr
        assert f"{TRIALS} complete" in stdout.splitlines()[0], stdout
    study = optuna.load_study(study_name="tune", storage=f"sqlite:///{out / 'study.db'}")
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * TRIALS
    assert [t.number for t in study.trials] == list(range(TRIALS))
    run_dirs = [t.user_attrs["run_dir"] for t in study.trials]
    assert len(set(run_dirs)) == TRIALS and all((out / "trials" / f"{n:04d}" / "summary.json").is_file()
                                                 for n in range(TRIALS))
    assert len({t.params["lr"] for t in study.trials}) == TRIALS  # the processes do not repeat each other's draws
    # which process ran which trial: the stderr lines "trial N ..." of each
    ran = [{int(line.split()[1]) for line in stderr.splitlines() if line.startswith("trial ")}
           for _, stderr in results]
    assert ran[0] | ran[1] == set(range(TRIALS)) and not ran[0] & ran[1]
