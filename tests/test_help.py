"""Help that answers (``ddprl keys``, each command's ``--help``) and bad input refused in the
launching process: one line, exit 2, no run directory, no rank started."""

from __future__ import annotations

import json
import re
import sys

import pytest
import torch
from conftest import run_cli

from ddprl.cli import COMMAND_KEYS, main
from ddprl.config import format_value, key_rows, load_config
from ddprl.plot import ARG_KEYS

QMIX = [
    "algo=qmix",
    "task=Foraging-5x5-2p-1f-v3",
    "num_envs=2",
    "batch_size=4",
    "buffer_size=64",
    "update_every=100",
    "log_freq=400",
    "eval_episodes=2",
    "eval_freq=0",
    "checkpoint_freq=0",
    "progress=false",
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """A 0-byte checkpoint, a QMIX checkpoint without an encoder, a YAML file with a syntax error."""
    root = tmp_path_factory.mktemp("inputs")
    (root / "empty.pt").write_bytes(b"")
    (root / "broken.yaml").write_text("steps: [1000, 2000\nlr: 0.001\n")
    res = run_cli(["train", *QMIX, "world_size=1", "steps=400", f"run_dir={root / 'qmix'}"], cwd=root)
    assert res.returncode == 0, res.stderr[-2000:]
    return root


BAD = {
    # encoder_dim=9, the observation's width: the agent network fits the checkpoint's, only the encoder is missing
    "qmix freeze_encoder without an encoder": (
        [*QMIX, "encoder_dim=9", "freeze_encoder=true", "init_from=ROOT/qmix/checkpoints/latest.pt"],
        r"freeze_encoder=true keeps init_from's encoder, but .* has none \(it holds agent, mixer\)",
    ),
    "zero-width network": (["hidden_sizes=[0]"], r"hidden_sizes=\[0\] must be widths >= 1"),
    "unknown env_kwargs key": (
        ["env_kwargs={pole_lenght: 2}"],
        r"env_kwargs: CartPole-v1 takes no 'pole_lenght'; it takes sutton_barto_reward",
    ),
    "0-byte resume=": (["resume=ROOT/empty.pt"], r"checkpoint .*empty.pt cannot be read"),
    "0-byte QMIX init_from=": (
        [*QMIX, "encoder_dim=8", "freeze_encoder=false", "init_from=ROOT/empty.pt"],
        r"checkpoint .*empty.pt cannot be read",
    ),
    "YAML syntax error in --config-name": (
        ["--config-name", "ROOT/broken.yaml"],
        r"broken.yaml is not valid YAML at line 2, column 3",
    ),
    "tdmpc2 on discrete actions": (
        ["algo=tdmpc2", "task=CartPole-v1"],
        r"tdmpc2 needs continuous actions .* CartPole-v1 has Discrete\(2\): use algo=ppo",
    ),
}


@pytest.mark.parametrize("case", [*BAD, "0-byte ddprl eval"])
def test_bad_input_refused_before_any_rank_starts(inputs, tmp_path, case):
    if case == "0-byte ddprl eval":
        args, message = ["eval", f"checkpoint={inputs}/empty.pt"], r"checkpoint .*empty.pt cannot be read"
    else:
        extra, message = BAD[case]
        # world_size=2: a job that would spawn two ranks, so a check left to the ranks would show
        extra = [a.replace("ROOT", str(inputs)) for a in extra]
        args = ["train", "world_size=2", f"run_dir={tmp_path / 'run'}", *extra]
    res = run_cli(args, cwd=tmp_path, timeout=120)
    assert res.returncode == 2, (res.returncode, res.stderr[-2000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddprl: error: "), res.stderr
    assert re.search(message, lines[0]), lines[0]
    assert "[RANK" not in res.stderr  # refused in the launching process: no rank ever started
    assert not (tmp_path / "run").exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_torchrun_world_size_mismatch_one_ddprl_line(tmp_path):
    """Each worker finds the contradiction; one prints it, every one hands it to torchrun's summary.

    The summary is the guarantee: torchrun stops the other workers as soon as one fails, so under
    load rank 1 can fail before rank 0 (the one that prints) gets there (seen once in a full suite
    run beside two training jobs): then the line is only in the summary, never twice."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    res = run_cli(
        ["train", "world_size=4", f"run_dir={tmp_path / 'run'}"], cwd=tmp_path, launcher=launcher, timeout=120
    )
    assert res.returncode != 0  # torchrun's own code for a failed worker: 1
    ours = [line for line in res.stderr.splitlines() if line.startswith("ddprl: error:")]
    assert ours in (
        [],
        ["ddprl: error: world_size=4 contradicts the torchrun launcher's world size 2; drop world_size="],
    ), res.stderr[-2000:]
    root_cause = res.stderr.split("Root Cause")[-1]
    assert "traceback : ddprl: error: world_size=4 contradicts" in root_cause, res.stderr[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "env, prints",
    [
        ({"RANK": "1", "WORLD_SIZE": "2"}, False),
        ({"RANK": "0", "WORLD_SIZE": "2"}, True),
        ({"SLURM_PROCID": "3"}, False),
        ({"SLURM_PROCID": "0"}, True),
    ],
)
def test_bad_input_printed_by_the_first_process_only(monkeypatch, capsys, tmp_path, env, prints):
    """Every process of a torchrun/srun job finds it; one prints it, each writes torchrun's error file."""
    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    assert main(["keys", "algo=ppx"]) == 2
    assert (capsys.readouterr().err != "") == prints
    recorded = json.loads((tmp_path / "error.json").read_text())["message"]
    assert recorded["message"].startswith("ddprl: error: unknown algo 'ppx' (did you mean ppo?)")


# -- ddprl keys -------------------------------------------------------------------------------


def test_keys_print_type_and_default(capsys):
    assert main(["keys", "algo=qmix"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^key\s+type\s+default\s+from\s+help$", out, re.M)
    assert re.search(r"^lr\s+float\s+0\.0005\s+default\s+Adam learning rate$", out, re.M)
    assert re.search(r"^update_every\s+int \| null\s+null\s+default\s+global env steps", out, re.M)
    assert re.search(r"^world_size\s+int \| auto\s+auto\s+default\s+processes in the job", out, re.M)
    assert re.search(r"^env_kwargs\s+dict\s+\{\}\s+default\s+keyword arguments", out, re.M)
    assert re.search(r"^algo\s+str\s+qmix\s+given\s", out, re.M)
    assert re.search(r"^task\s+str\s+Foraging-8x8-2p-2f-coop-v3\s", out, re.M)


def test_keys_of_a_task_show_its_values(capsys):
    assert main(["keys", "algo=ppo", "task=snake"]) == 0
    out = capsys.readouterr().out
    assert "keys of algo=ppo with task=snake" in out
    assert re.search(
        r"^hidden_sizes\s+list\[int\]\s+\[256, 256\]\s+preset\s", out, re.M
    )  # task/snake.yaml's, not [64, 64]
    assert main(["keys", "algo=ppo", "tsak=snake"]) == 2
    assert "did you mean task" in capsys.readouterr().err


def test_key_rows_of_a_resolved_config():
    rows = {name: (typ, default) for name, typ, default, _ in key_rows(load_config(["algo=tdmpc2", "mpc=false"]))}
    assert rows["mpc"] == ("bool", "false")  # the value of this config, not the schema's
    assert rows["enc_dim"] == ("int | null", "null")
    assert rows["run_dir"] == ("str", "''")
    assert [format_value(v) for v in (True, None, [64, 64], {"a": 1, "b": [1]}, 3e-4)] == [
        "true",
        "null",
        "[64, 64]",
        "{a: 1, b: [1]}",
        "0.0003",
    ]


# -- --help of each command -------------------------------------------------------------------


def _help(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", ["eval", "play", "doctor", "plot", "keys"])
def test_help_of_each_command_lists_its_keys(capsys, command):
    out = _help(capsys, [command, "--help"])
    for name, typ, default, _ in COMMAND_KEYS[command]:
        assert re.search(rf"^  {re.escape(name)}\s+{re.escape(typ)}\s+{re.escape(default)}\s", out, re.M), (name, out)


def test_train_help_lists_the_keys_of_the_algorithm_named(capsys):
    out = _help(capsys, ["train", "--help"])
    assert "ddprl keys algo=NAME" in out and "--config-name" in out
    assert re.search(r"^  n_steps\s+int\s+256\s+default\s+rollout length", out, re.M)
    out = _help(capsys, ["train", "algo=qmix", "--help"])
    assert "keys of algo=qmix" in out and re.search(r"^  mixer\s+str\s+qmix\s", out, re.M)


def _accepted_keys(capsys, argv):
    """The keys a command accepts, as its unknown-key error lists them."""
    assert main([*argv, "bogus=1"]) == 2
    err = capsys.readouterr().err
    return err.strip().rsplit("; keys: ", 1)[1].split(", ")


def test_help_tables_name_the_keys_each_command_accepts(capsys, tmp_path):
    for algo, table in (("ppo", "eval"), ("supervised", "eval algo=supervised")):
        fake = tmp_path / f"{algo}.pt"
        torch.save({"format_version": 2, "algo": algo, "config": {"task": "digits"}}, fake)
        assert _accepted_keys(capsys, ["eval", f"checkpoint={fake}"]) == [r[0] for r in COMMAND_KEYS[table]]
    for command in ("play", "doctor", "keys"):
        assert _accepted_keys(capsys, [command]) == [r[0] for r in COMMAND_KEYS[command]]
    assert list(ARG_KEYS) == [r[0] for r in COMMAND_KEYS["plot"] if r[0] != "RUN_DIR"]
