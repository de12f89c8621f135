"""nesgpu play: episodes of a trained RL policy, optionally filmed through gymnasium."""

import json

import pytest
import torch

from nesgpu.cli import main
from nesgpu.frontends import play_run
from nesgpu.frontends.play import VERIFIED_TWINS, gym_episodes
from nesgpu.train import TrainConfig, load_run
from nesgpu.train.trainer import train


def quiet(*args, **kwargs):
    pass


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("play") / "cartpole"
    train(TrainConfig(task="cartpole", steps=2, out=str(out), device="cpu"), log=quiet)
    return out


def test_play_runs_the_episodes_that_evaluate_runs(cartpole_run):
    result = play_run(cartpole_run, episodes=4, device="cpu")
    assert result["episodes"] == 4 and len(result["returns"]) == 4 and len(result["lengths"]) == 4
    assert all(torch.isfinite(torch.tensor(r)) for r in result["returns"])
    assert all(1 <= n <= 500 for n in result["lengths"])
    assert result["returns"] == [float(n) for n in result["lengths"]]  # cartpole: +1 per step
    assert result["mean_return"] == pytest.approx(sum(result["returns"]) / 4)
    # the run's seed and eval_episodes give task.evaluate's episodes
    run = load_run(cartpole_run, "cpu")
    same = play_run(cartpole_run, episodes=run.config.option("eval_episodes"), seed=run.config.seed, device="cpu")
    assert same["mean_return"] == pytest.approx(run.task.evaluate(run.model))
    assert "video" not in result


@pytest.mark.parametrize("episodes", [0, -1])
def test_bad_episode_counts_are_refused(cartpole_run, episodes):
    with pytest.raises(ValueError, match="episodes must be >= 1"):
        play_run(cartpole_run, episodes=episodes)
    with pytest.raises(TypeError, match="episodes must be an int"):
        play_run(cartpole_run, episodes=2.5)


def test_bad_video_paths_are_refused(cartpole_run, tmp_path):
    with pytest.raises(ValueError, match=r"\.mp4 or \.gif"):
        play_run(cartpole_run, episodes=1, video=tmp_path / "out.avi")
    with pytest.raises(ValueError, match="does not exist"):
        play_run(cartpole_run, episodes=1, video=tmp_path / "missing" / "out.mp4")
    (tmp_path / "dir.gif").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        play_run(cartpole_run, episodes=1, video=tmp_path / "dir.gif")


def test_a_run_of_a_task_of_ones_own_is_refused_with_advice_play_can_follow(tmp_path):
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "config.json").write_text(json.dumps({"task": "custom:toy"}))
    with pytest.raises(ValueError, match=r"trained a task of your own \(custom:toy\), which nesgpu play cannot "
                                         r"rebuild; evaluate it with nesgpu eval .* or load it in Python"):
        play_run(tmp_path / "own")


def test_supervised_runs_are_refused(tmp_path):
    out = tmp_path / "digits"
    train(TrainConfig(task="digits", steps=1, population=4, out=str(out), device="cpu"), log=quiet)
    with pytest.raises(ValueError, match="play is for RL runs; use nesgpu eval"):
        play_run(out)


def test_a_language_model_run_is_refused_before_its_model_is_built(tmp_path, monkeypatch, capsys):
    tf = pytest.importorskip("transformers")
    from conftest import char_tokenizer

    from nesgpu.train.storage import runs

    torch.manual_seed(0)
    hf = tmp_path / "m"
    tf.LlamaForCausalLM(tf.LlamaConfig(
        vocab_size=len(char_tokenizer()), hidden_size=16, intermediate_size=24, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
        eos_token_id=1)).save_pretrained(hf)
    char_tokenizer().save_pretrained(hf)
    lm, digits = tmp_path / "arithmetic", tmp_path / "digits"
    train(TrainConfig.flat(task="arithmetic", model=f"hf:{hf}", steps=1, population=4, batch_size=2, log="none",
                      out=str(lm), device="cpu"), log=quiet)
    train(TrainConfig(task="digits", steps=1, population=4, log="none", out=str(digits), device="cpu"), log=quiet)

    def never(*args, **kwargs):
        raise AssertionError("play built the run's model before refusing the run")

    monkeypatch.setattr(runs, "build", never)
    with pytest.raises(ValueError, match=r"play is for RL runs; use nesgpu eval \(.* is a run of the task "
                                         r"'arithmetic'; play needs a run of an RL task: cartpole, .*gym:<id>\)"):
        play_run(lm)
    with pytest.raises(ValueError, match="is a run of the supervised task 'digits'"):
        play_run(digits)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["play", str(lm), "--device", "cpu"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nesgpu play: error: play is for RL runs") and "'arithmetic'" in err[0]


def test_not_a_run_directory(tmp_path):
    with pytest.raises(ValueError, match="not a run directory"):
        play_run(tmp_path)


def _mp4_frames(path):
    import imageio.v2 as imageio

    with imageio.get_reader(str(path)) as reader:
        return reader.count_frames()


@pytest.mark.parametrize("suffix, episodes", [(".gif", 1), (".mp4", 2)])
def test_video_has_a_frame_per_step_and_the_same_episodes(cartpole_run, tmp_path, suffix, episodes):
    pytest.importorskip("gymnasium")
    pytest.importorskip("pygame")
    pytest.importorskip("PIL") if suffix == ".gif" else pytest.importorskip("imageio_ffmpeg")
    path = tmp_path / f"cartpole{suffix}"
    result = play_run(cartpole_run, episodes=episodes, video=path, device="cpu")
    assert path.is_file() and path.stat().st_size > 0
    assert result["video"] == str(path) and result["env"].startswith("CartPole-v1")
    assert result["frames"] == sum(result["lengths"]) + episodes  # the start of each episode, then one per step
    if suffix == ".mp4":
        assert _mp4_frames(path) == result["frames"]
    else:  # Pillow merges identical consecutive frames (adding their delays): count the delays
        from PIL import Image

        with Image.open(path) as im:
            total, kept = 0, im.n_frames
            for i in range(kept):
                im.seek(i)
                total += im.info["duration"]
        assert 1 <= kept <= result["frames"] and total == result["frames"] * 20  # CartPole renders at 50 fps
    # the twin starts from the same states as the batched torch episodes, so it plays the same episodes
    plain = play_run(cartpole_run, episodes=episodes, device="cpu")
    assert result["lengths"] == plain["lengths"]
    assert result["returns"] == pytest.approx(plain["returns"])


@pytest.mark.parametrize("name", sorted(VERIFIED_TWINS))
def test_each_twin_plays_the_episodes_of_our_env(name):
    """Same start states, same policy: the gymnasium twin and our torch env give the same returns (the
    observation order, scaling and the action meaning agree, or the policy would act differently)."""
    pytest.importorskip("gymnasium")
    from nesgpu.noise import derive_seed
    from nesgpu.tasks import make_task
    from nesgpu.tasks.rl import EVAL_STREAM, rollout

    task = make_task(name, eval_episodes=3, seed=0)
    torch.manual_seed(1)
    model = task.make_model((8,))
    with torch.no_grad():  # a random policy, with observation statistics that are not the identity
        for p in model.net.parameters():
            p.normal_(0, 1.0)
        model.norm.mean.normal_(0, 0.1)
        model.norm.var.uniform_(0.5, 2.0)
        model.norm.count.fill_(10)
        model.eval()
        ours, lengths, _ = rollout(task.make_env(3, "cpu"), model, torch.arange(3), derive_seed(7, EVAL_STREAM),
                                   task.max_steps)
        returns, twin_lengths = gym_episodes(task, model, 3, seed=7)
    assert twin_lengths == lengths.tolist()
    assert returns == pytest.approx(ours.tolist(), rel=1e-4, abs=1e-3)


def test_gym_task_is_filmed_in_its_own_env(tmp_path):
    pytest.importorskip("gymnasium")
    pytest.importorskip("pygame")
    pytest.importorskip("PIL")
    out = tmp_path / "gym"
    train(TrainConfig(task="gym:CartPole-v1", steps=1, population=4, out=str(out), device="cpu"), log=quiet)
    plain = play_run(out, episodes=2, device="cpu")
    filmed = play_run(out, episodes=2, video=tmp_path / "gym.gif", device="cpu")
    assert filmed["env"] == "CartPole-v1 (gymnasium)" and (tmp_path / "gym.gif").stat().st_size > 0
    assert filmed["returns"] == plain["returns"] and filmed["frames"] == sum(filmed["lengths"]) + 2


def test_cli_play_prints_episodes_then_json(cartpole_run, capsys):
    assert main(["play", str(cartpole_run), "--episodes", "2", "--device", "cpu"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[0].startswith("episode 1: return ") and lines[1].startswith("episode 2: ")
    summary = json.loads(lines[-1])
    assert summary["episodes"] == 2 and summary["task"] == "cartpole"


def test_cli_play_bad_directory_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["play", str(tmp_path / "nothing")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nesgpu play: error:") and "not a run directory" in err[0]


def test_cli_play_bad_episodes_is_one_line(cartpole_run, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["play", str(cartpole_run), "--episodes", "0"])
    assert exit_info.value.code == 2
    assert "episodes must be >= 1" in capsys.readouterr().err
