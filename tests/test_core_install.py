"""The core install (``pip install nesgpu``: torch only) is a working library: the optional packages are
blocked in a fresh interpreter, as on a machine without them."""

import subprocess
import sys

EXTRAS = ["numpy", "safetensors", "sklearn", "mnist1d", "yaml", "tqdm", "tensorboard", "matplotlib", "gymnasium",
          "mujoco", "optuna", "transformers", "tokenizers", "wandb", "mlflow", "pdoc", "imageio"]
BLOCK = f"import sys\nfor name in {EXTRAS!r}:\n    sys.modules[name] = None\n"


def run(code: str, tmp_path, *warning_options: str):
    return subprocess.run([sys.executable, "-W", "error::UserWarning", *warning_options, "-c", BLOCK + code],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)


# torch's own note that numpy is missing, shown to a library user as torch shows it (importing nesgpu changes no
# warning filter); the CLI hides it (test_the_cli_says_which_extra_to_install runs with every UserWarning an error)
TORCHS_NOTE = ("-W", "ignore:Failed to initialize NumPy:UserWarning")


def test_the_library_trains_with_torch_alone(tmp_path):
    result = run(
        "import warnings\n"
        "before = list(warnings.filters)\n"
        "import nesgpu\n"
        "assert warnings.filters == before, 'importing nesgpu changed the warning filters'\n"
        "import torch\n"
        "from torch import nn\n"
        "from nesgpu.tasks import make_task\n"
        "from nesgpu.strategies import centered_ranks\n"
        "make_task('cartpole')  # the built-in torch environments need no gymnasium\n"
        "torch.manual_seed(0)\n"
        "x = torch.randn(64, 3); y = x @ torch.tensor([[1.0], [-2.0], [0.5]])\n"
        "model = nesgpu.convert(nn.Sequential(nn.Linear(3, 1)), 'lowrank')\n"
        "pm = nesgpu.PerturbedModel(model, 32, sigma=0.1, antithetic=True)\n"
        "opt = torch.optim.Adam(model.parameters(), lr=0.05)\n"
        "first = ((model(x) - y) ** 2).mean().item()\n"
        "for _ in range(100):\n"
        "    pm.set_noise()\n"
        "    losses = ((pm.shared_input(x).view(2, 64, 32) - y.view(1, 64, 1)) ** 2).mean(1)\n"
        "    opt.zero_grad(); pm.update(centered_ranks(losses)); opt.step()\n"
        "last = ((model(x) - y) ** 2).mean().item()\n"
        "assert last < 0.5 * first, (first, last)\n"
        "print('ok', nesgpu.__version__)\n", tmp_path, *TORCHS_NOTE)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("ok")


def test_the_cli_says_which_extra_to_install(tmp_path):
    result = run("from nesgpu.cli import main\n"
                 "main(['--version'])\n", tmp_path)
    assert result.returncode == 0 and "nesgpu" in result.stdout, result.stderr[-3000:]
    result = run("from nesgpu.cli import main\n"
                 "main(['train', '--task', 'cartpole', '--steps', '1', '--log', 'none', '--out', 'r'])\n", tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == (
        "nesgpu train: error: the trainer saves the weights with safetensors, which is not installed: "
        "pip install 'nesgpu[train]'")
    assert not (tmp_path / "r").exists()


def test_the_readme_quick_start_runs_on_the_core_install(tmp_path):
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start"):]
    snippet = re.search(r"```python\n(.*?)```", quick_start, flags=re.S).group(1)
    snippet = re.sub(r"range\((\d+)\)", "range(101)", snippet)  # two progress lines, and the accuracy
    result = run(snippet, tmp_path, *TORCHS_NOTE)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["step 0", "step 100"] and lines[-1].startswith("accuracy")
    assert float(lines[-1].split()[-1]) > 0.3  # 10 classes: chance is 0.1
