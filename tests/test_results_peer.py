"""The results harness's peer rows (benchmarks/results/run.py): PureJaxRL's PPO configuration maps
onto ddprl keys that resolve to the same sizes on both engines, and PureJaxRL's per-step logs become
ddprl's metrics rows. Nothing here runs PureJaxRL or trains."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ddprl import plot
from ddprl.checkpoint import load_checkpoint
from ddprl.config import load_config

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


sys.path.insert(0, str(RESULTS.parent))  # the results package, and the benchmarks' modules it imports
from results import page, peers, rows, stats, store, training  # noqa: E402 (the path above first)


def unwrapped_page() -> str:
    """The page with each bullet on one line again (the page wraps prose at 100 columns)."""
    return page.page().replace("\n  ", " ")


def load_module(name: str, folder: Path = RESULTS.parent):
    """A module of benchmarks/ (beside the results package), or of ``folder``, loaded afresh."""
    spec = importlib.util.spec_from_file_location(f"results_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


PEER_RUNS = [(row, impl) for row in ("jax-cartpole", "jax-acrobot") for impl in ("jax1", "jax", "torch")] + [
    (row, impl) for row in ("jax-breakout", "jax-spaceinvaders") for impl in ("jax1", "jax")
]


@pytest.fixture
def page_store(tmp_path, monkeypatch):
    """Kept runs, the page and its PNGs under ``tmp_path`` (runs/, results.md, images/)."""
    monkeypatch.setattr(store, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(store, "IMAGES", tmp_path / "images")
    monkeypatch.setattr(store, "PAGE", tmp_path / "results.md")


def write_metrics(folder: Path, records: list[dict]) -> None:
    """A run's metrics.jsonl as ddprl writes it, one record a line."""
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.mark.parametrize("row,impl", PEER_RUNS)
def test_keys_resolve_to_purejaxrl_sizes(row, impl):
    peer = rows.PEER_ROWS[row]
    config = peer.config()
    cfg = load_config(list(peer.keys(impl)))
    assert cfg.engine == ("jax" if impl.startswith("jax") else "torch")
    devices = cfg.devices if cfg.engine == "jax" else cfg.world_size
    assert devices == rows.DEVICES[impl] == (1 if impl == "jax1" else rows.PEER_DEVICES)
    rollout = cfg.num_envs * cfg.n_steps  # num_envs is global
    sizes = {"jax-breakout": (8192, 1220, 1024), "jax-spaceinvaders": (8192, 1220, 1024)}  # MinAtar's notebook
    size, updates, minibatch = sizes.get(row, (512, 976, 128))  # ppo.py's configuration
    assert rollout == config["NUM_ENVS"] * config["NUM_STEPS"] == size
    assert cfg.steps // rollout == int(config["TOTAL_TIMESTEPS"]) // rollout == updates  # same updates, same anneal
    assert cfg.steps % rollout == 0
    # the global minibatch and the optimizer steps per epoch are PureJaxRL's
    assert cfg.effective_batch_size(devices) == rollout // config["NUM_MINIBATCHES"] == minibatch
    assert (rollout // devices) // cfg.batch_size == config["NUM_MINIBATCHES"]
    expected = {
        "epochs": config["UPDATE_EPOCHS"],
        "lr": config["LR"],
        "anneal_lr": config["ANNEAL_LR"],
        "gamma": config["GAMMA"],
        "gae_lambda": config["GAE_LAMBDA"],
        "clip_coef": config["CLIP_EPS"],
        "clip_vloss": True,
        "vf_coef": config["VF_COEF"],
        "ent_coef": config["ENT_COEF"],
        "max_grad_norm": config["MAX_GRAD_NORM"],
        "norm_adv": True,
        "norm_obs": False,
        "norm_reward": False,
        "target_kl": None,
        "hidden_sizes": [64, 64],
        "activation": config["ACTIVATION"],
        "policy": "mlp",
    }
    assert {k: getattr(cfg, k) for k in expected} == expected
    # no training value left to a task preset (Acrobot-v1 has one for the torch engine)
    assert [k for k, source in cfg.sources.items() if source == "task preset"] in ([], ["checkpoint_freq"])


def test_minatar_rows_run_the_notebooks_relu_configuration_on_jax_only():
    for name in ("jax-breakout", "jax-spaceinvaders"):
        row = rows.PEER_ROWS[name]
        assert row.impls == ("purejaxrl", "jax1", "jax")  # MinAtar is a gymnax task: no torch run
        assert row.config()["ACTIVATION"] == "relu" and row.config()["ENV_NAME"].endswith("-MinAtar")
        assert "eval_freq=500000" in row.keys("jax")
    assert rows.PEER_ROWS["jax-cartpole"].impls == tuple(rows.IMPLS)


def test_purejaxrl_curve_rows():
    driver = load_module("purejaxrl_ppo", RESULTS)
    # 3 updates x 2 steps x 2 envs: update 0 ends episodes of 10 and 20, update 1 none, update 2 one of 5
    returns = np.zeros((3, 2, 2))
    ended = np.zeros((3, 2, 2), bool)
    returns[0, 0, 0], ended[0, 0, 0] = 10, True
    returns[0, 1, 1], ended[0, 1, 1] = 20, True
    returns[1] = 20  # stale values of episodes ended before: not counted
    returns[2, 1, 0], ended[2, 1, 0] = 5, True
    rows = driver.curve_rows({"returned_episode_returns": returns, "returned_episode": ended}, 4, 3.0)
    got = [(r["step"], r["train/episode_return"], r["train/episodes"]) for r in rows]
    assert got == [(4, 15.0, 2.0), (12, 5.0, 1.0)]
    assert [r["wall_time"] for r in rows] == [1.0, 3.0]


def test_five_tuple_step_merges_terminated_and_truncated_and_drops_the_final_observation():
    driver = load_module("purejaxrl_ppo", RESULTS)

    class Env:  # gymnax >= 1.0's step
        name = "fake"

        def step(self, key, state, action, params=None):
            return "obs", state + 1, 1.0, np.array(False), np.array(True), {"info": 0, "final_observation": "obs"}

    env = driver.FiveTupleStep(Env())
    obs, state, reward, done, info = env.step(None, 0, 0)
    # gymnax < 1.0 had no final_observation: left out, or PureJaxRL returns one per step (OOM on MinAtar)
    assert (obs, state, reward, bool(done), info) == ("obs", 1, 1.0, True, {"info": 0})
    assert env.name == "fake"  # everything else is the env's own


def test_a_row_keeps_each_finished_seed_and_resumes_with_the_others(tmp_path, monkeypatch):
    """A long row stopped part-way (here: seed 2 fails) keeps seed 1 in its summary; ``--resume``
    trains seeds 2 and 3 only. No training: train_and_keep is replaced by a fake run."""
    trained = []

    def fake_train(keys, seed, keep, what, env=None, work=None):
        trained.append(seed)
        if seed == 2 and trained.count(2) == 1:
            raise SystemExit(f"{what}: ddprl train exited 1")
        keep.mkdir(parents=True)
        rows = [{"step": 50_000, "eval/return_mean": 100.0 * seed}, {"step": 100_000, "eval/return_mean": 200.0 * seed}]
        (keep / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 1.0

    monkeypatch.setattr(store, "RUNS", tmp_path)
    monkeypatch.setattr(training, "train_and_keep", fake_train)
    with pytest.raises(SystemExit):
        training.run_row("ppo-cartpole", 3)
    kept = json.loads((tmp_path / "ppo-cartpole" / "summary.json").read_text())
    assert [s["seed"] for s in kept["seeds"]] == [1] and kept["seeds"][0]["final"] == 200.0
    summary = training.run_row("ppo-cartpole", 3, resume=True)
    assert trained == [1, 2, 2, 3]
    assert [s["final"] for s in summary["seeds"]] == [200.0, 400.0, 600.0]
    assert training.run_row("ppo-cartpole", 3, resume=True) == summary and trained == [1, 2, 2, 3]  # all kept


def test_a_peer_row_keeps_each_finished_seed_and_resumes_with_the_others(tmp_path, monkeypatch):
    """A peer row stopped part-way keeps its finished seeds; ``--resume`` runs PureJaxRL and ddprl
    for the missing seeds only, and refuses kept seeds that ran another configuration. Nothing
    trains: PureJaxRL's and ddprl's runs are replaced by fakes writing one metrics row each."""
    ran, failed = [], []

    def fake_purejaxrl(config, seed, keep, checkout, python):
        ran.append(("purejaxrl", seed))
        keep.mkdir(parents=True, exist_ok=True)  # as purejaxrl_ppo.py: a seed stopped part-way runs again
        (keep / "metrics.jsonl").write_text(json.dumps({"step": 16384, "train/episode_return": float(seed)}) + "\n")
        (keep / "result.json").write_text(json.dumps({"compile_s": 1.0, "train_s": 2.0, "versions": {"jax": "x"}}))
        return 3.0

    def fake_train(keys, seed, keep, what, env=None, work=None):
        impl = what.split()[1]
        if impl == "jax" and seed == 2 and not failed:  # the first sitting stops here
            failed.append(seed)
            raise SystemExit(f"{what}: ddprl train exited 1")
        ran.append((impl, seed))
        keep.mkdir(parents=True, exist_ok=True)
        row = {"step": 16384, "train/episode_return": 10.0 * seed, "time/iteration_s": 1.0, "time/compile_s": 0.5}
        (keep / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        return 2.0

    monkeypatch.setattr(store, "RUNS", tmp_path)
    monkeypatch.setattr(peers, "check_purejaxrl", lambda checkout, python: None)
    monkeypatch.setattr(peers, "run_purejaxrl", fake_purejaxrl)
    monkeypatch.setattr(training, "train_and_keep", fake_train)
    with pytest.raises(SystemExit):
        peers.run_peer_row("jax-breakout", 3, tmp_path, "python", steps=8192 * 2)
    kept = json.loads((tmp_path / "jax-breakout" / "summary.json").read_text())
    assert [s["seed"] for s in kept["seeds"]] == [1] and kept["seeds"][0]["jax"]["train_return"] == 10.0
    ran.clear()
    summary = peers.run_peer_row("jax-breakout", 3, tmp_path, "python", steps=8192 * 2, resume=True)
    assert [s["seed"] for s in summary["seeds"]] == [1, 2, 3]
    assert ran == [(impl, seed) for seed in (2, 3) for impl in ("purejaxrl", "jax1", "jax")]
    assert summary["seeds"][2]["purejaxrl"]["train_return"] == 3.0
    with pytest.raises(SystemExit, match="other commands"):  # another budget: the kept seeds do not count
        peers.run_peer_row("jax-breakout", 4, tmp_path, "python", steps=8192 * 4, resume=True)


def test_a_row_without_a_transcribed_reference_shows_ours_at_the_end_and_best(tmp_path, monkeypatch, page_store):
    """The QMIX rows (Papoudakis et al.'s table not transcribed): the page gives the final and the
    best evaluation over seeds, at LBF's two decimals, and draws the curves."""

    def fake_train(keys, seed, keep, what, env=None, work=None):
        keep.mkdir(parents=True)
        write_metrics(keep, [{"step": 50_000, rows.EVAL: 0.2 * seed}, {"step": 100_000, rows.EVAL: 0.1 * seed}])
        return 60.0

    monkeypatch.setattr(training, "train_and_keep", fake_train)
    training.run_row("qmix-lbf-8x8-2p-2f-coop", 2)
    text = unwrapped_page()
    assert (
        "| QMIX, Foraging-8x8-2p-2f-coop-v3 | not transcribed | 100,000 | 0.15 ± 0.07 "
        "| 0.30 ± 1.27 (95 % CI) at 50,000 | 2 | 1.0 min |" in text  # the mean over seeds peaks at 50k
    )
    assert "maximum returns 0.30 ± 1.27" in text and "average returns over all evaluations 0.23 ± 0.95" in text
    assert "| QMIX, Foraging-10x10-3p-3f-v3 | not transcribed | | not run yet |" in text
    assert (tmp_path / "images" / "qmix-lbf-8x8-2p-2f-coop.png").exists()
    # the seeds still to run are counted from the summaries, not written by hand
    assert "| Foraging-8x8-2p-2f-coop-v3 | 2 of 3 | 0 of 3 | 0 of 3 | not measured |" in text


def test_papoudakis_returns_peak_where_the_mean_over_seeds_does():
    """Maximum returns: the step of the highest mean over seeds (not each seed's own best);
    average returns: each seed's mean over its evaluations; steps some seed lacks left out."""
    curves = [
        [(50, 0.0), (100, 1.0), (150, 0.2)],
        [(50, 0.6), (100, 0.2), (150, 0.7), (200, 1.0)],  # 200: only this seed reached it
        [(50, 0.0), (100, 0.9), (150, 0.6)],
    ]
    out = stats.papoudakis_returns(curves)
    assert out["max_step"] == 100 and out["max_mean"] == pytest.approx(0.7)
    # each seed's best is 1.0, 0.7 (without step 200), 0.9: their mean would be 0.87
    assert out["max_ci95"] == pytest.approx(4.302653 * np.std([1.0, 0.2, 0.9], ddof=1) / 3**0.5, rel=1e-6)
    assert out["average_mean"] == pytest.approx(np.mean([0.4, 0.5, 0.5]))


def test_every_row_command_is_a_valid_configuration():
    """A row's keys resolve (no unknown key or bad value waits for a sitting to be found)."""
    for name, row in {**rows.ROWS, **rows.SUPERVISED_ROWS}.items():
        cfg = load_config(list(row.keys))
        # the zoo's keys: one env; TD-MPC2: one update per agent step, as the published runs
        assert cfg.world_size == (1 if name.endswith("-zoo") or name.startswith("tdmpc2-") else 2), name
    epymarl = load_config(list(rows.ROWS["qmix-lbf-8x8-2p-2f-coop-epymarl"].keys))
    assert (epymarl.batch_size * 2, epymarl.standardise_state, epymarl.bootstrap_truncated) == (32, False, False)
    zoo = load_config(list(rows.ROWS["ppo-halfcheetah-zoo"].keys))  # hyperparams/ppo.yml's HalfCheetah-v3
    assert (zoo.num_envs, zoo.n_steps, zoo.batch_size, zoo.epochs, zoo.hidden_sizes) == (1, 512, 64, 20, [256, 256])
    assert (zoo.log_std_init, zoo.ortho_init, zoo.activation, zoo.anneal_lr) == (-2.0, False, "relu", False)


def test_a_kept_run_is_packed_the_same_bytes_every_time_and_reads_back(tmp_path):
    """Kept runs travel gzipped (store.pack): the rows read back unchanged, and packing the same
    file twice gives the same bytes (no time stamp inside), so a rerun page does not churn git."""
    rows = [{"step": 512 * i, "eval/return_mean": 1.5 * i} for i in range(1, 4)]
    packed = []
    for name in ("a", "b"):
        keep = tmp_path / name
        keep.mkdir()
        (keep / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        store.pack(keep)
        assert not (keep / "metrics.jsonl").exists()
        assert store.read_rows(keep) == rows
        packed.append((keep / "metrics.jsonl.gz").read_bytes())
    assert packed[0] == packed[1]


def test_epymarl_tests_are_read_from_sacred_not_from_its_console(tmp_path):
    """EPyMARL's console prints the mean of the last 5 tests; the per-test values are in sacred's
    info.json, numpy floats jsonpickled as EPyMARL's logger leaves them (the format of a real run)."""
    qmix_learning = load_module("qmix_learning")
    info = tmp_path / "sacred" / "qmix" / "lbforaging:Foraging-8x8-2p-2f-coop-v3" / "1" / "info.json"
    info.parent.mkdir(parents=True)
    values = [0.0, 0.25, 0.5]
    pickled = [{"dtype": "float64", "py/object": "numpy.float64", "value": v} for v in values]
    info.write_text(json.dumps({"test_return_mean": pickled, "test_return_mean_T": [50, 50_062, 100_101]}))
    assert qmix_learning.epymarl_tests(tmp_path / "sacred") == {50: 0.0, 50_062: 0.25, 100_101: 0.5}
    drifted = {50: 0.0, 50_062: 0.25, 2_049_180: 0.5}
    assert qmix_learning.on_grid(drifted, 50_000) == {0: 0.0, 50_000: 0.25, 2_050_000: 0.5}
    (info.parent.parent / "2").mkdir()
    (info.parent.parent / "2" / "info.json").write_text("{}")
    with pytest.raises(RuntimeError, match="found 2"):  # two runs: which one is this seed's is unknown
        qmix_learning.epymarl_tests(tmp_path / "sacred")


def test_epymarl_run_here_is_the_reference_of_both_qmix_rows_of_its_task(tmp_path, monkeypatch, page_store):
    """An EPyMARL row keeps each seed's tests on the 50k grid (and the step each ran at); the two
    QMIX rows of its task show its final test as their reference, its curve on their PNG and its
    details. Nothing runs EPyMARL or trains: fakes stand in for both."""
    qmix_learning = load_module("qmix_learning")
    ran = []

    def fake_epymarl(args, tmp):
        ran.append(args.seed)
        assert (args.task, args.steps, args.eval_freq, args.eval_episodes) == (
            "Foraging-8x8-2p-2f-coop-v3",
            2_050_000,
            50_000,
            100,
        )
        return {50: 0.0, 50_049: 0.1 * args.seed, 100_081: 0.2 * args.seed}, 120.0

    def fake_train(keys, seed, keep, what, env=None, work=None):
        keep.mkdir(parents=True)
        rows = [{"step": s, "eval/return_mean": r} for s, r in ((0, 0.0), (50_000, 0.3), (100_000, 0.4 * seed))]
        (keep / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return 60.0

    monkeypatch.setattr(qmix_learning, "run_epymarl", fake_epymarl)
    monkeypatch.setitem(sys.modules, "qmix_learning", qmix_learning)
    monkeypatch.setattr(training, "train_and_keep", fake_train)
    checkout = tmp_path / "epymarl"
    (checkout / "src").mkdir(parents=True)
    (checkout / "src" / "main.py").write_text("")
    (checkout / "COMMIT").write_text("cbc38c09588064eab978501d0f12c2cf58fa7fc2\n")
    with pytest.raises(SystemExit, match="not an EPyMARL tree"):
        peers.run_epymarl_row("epymarl-lbf-8x8-2p-2f-coop", 2, tmp_path, sys.executable)
    peers.run_epymarl_row("epymarl-lbf-8x8-2p-2f-coop", 2, checkout, sys.executable, jobs=2)  # seeds at once
    peers.run_epymarl_row("epymarl-lbf-8x8-2p-2f-coop", 2, checkout, sys.executable, resume=True)
    assert sorted(ran) == [1, 2]  # the resumed row had both seeds
    kept = store.read_rows(tmp_path / "runs" / "epymarl-lbf-8x8-2p-2f-coop" / "seed2")
    assert kept == [
        {"step": 0, "t_env": 50, "eval/return_mean": 0.0},
        {"step": 50_000, "t_env": 50_049, "eval/return_mean": 0.2},
        {"step": 100_000, "t_env": 100_081, "eval/return_mean": 0.4},
    ]
    summary = json.loads((tmp_path / "runs" / "epymarl-lbf-8x8-2p-2f-coop" / "summary.json").read_text())
    assert summary["epymarl_commit"].startswith("cbc38c0") and "seed=" not in summary["command"]
    assert "numpy " in summary["epymarl_versions"]  # what EPyMARL's python has (here: the test's own)
    assert summary["command"].startswith("python src/main.py --config=qmix --env-config=gymma with ")
    training.run_row("qmix-lbf-8x8-2p-2f-coop", 2)
    training.run_row("qmix-lbf-8x8-2p-2f-coop-epymarl", 2)
    text = unwrapped_page()
    for title in ("QMIX, Foraging-8x8-2p-2f-coop-v3", "QMIX, Foraging-8x8-2p-2f-coop-v3, EPyMARL's settings"):
        assert f"| {title} | EPyMARL run here: 0.30 ± 0.14 at 100,000 | 100,000 | 0.60 ± 0.28 |" in text
    assert text.count("EPyMARL's maximum returns here 0.30 ± 1.27 (95 % CI, at step 100,000)") == 2
    assert text.count("2.0 min per seed (up to 2 seeds at once, one core each)") == 2
    assert "| QMIX, Foraging-10x10-3p-3f-v3 | not transcribed | | not run yet |" in text
    assert (tmp_path / "images" / "qmix-lbf-8x8-2p-2f-coop.png").exists()
    # the seeds still to run are counted from the summaries, not written by hand
    mean_above = "2 of 3, above EPyMARL's by more than one std"
    assert f"| Foraging-8x8-2p-2f-coop-v3 | {mean_above} | {mean_above} | 2 of 3 | not measured |" in text
    assert "| Foraging-10x10-3p-3f-v3 | 0 of 3 | 0 of 3 | 0 of 3 | not measured |" in text


def test_a_qmix_row_is_set_against_epymarl_in_its_standard_deviations(tmp_path, monkeypatch):
    """Within one of EPyMARL's standard deviations, or how many below with Welch's t-test and where
    the maximum returns fall against EPyMARL's confidence interval; nothing while either side has
    one seed."""
    monkeypatch.setattr(store, "RUNS", tmp_path)

    def keep(row, finals):
        (tmp_path / row).mkdir()
        seeds = [{"seed": i + 1, "final": f} for i, f in enumerate(finals)]
        (tmp_path / row / "summary.json").write_text(json.dumps({"seeds": seeds}))
        for seed in seeds:  # each seed's one test: its final
            (tmp_path / row / f"seed{seed['seed']}").mkdir()
            test = {"step": 50_000, "eval/return_mean": seed["final"]}
            (tmp_path / row / f"seed{seed['seed']}" / "metrics.jsonl").write_text(json.dumps(test) + "\n")

    keep("epymarl-lbf-8x8-2p-2f-coop", [0.5, 0.6, 0.7])  # mean 0.6, std 0.1
    keep("qmix-lbf-8x8-2p-2f-coop", [0.45, 0.55, 0.6])  # mean 0.533: within
    keep("qmix-lbf-8x8-2p-2f-coop-epymarl", [0.1, 0.2, 0.3])  # mean 0.2: 4 std below; t = -4.90, 4 dof
    assert page.against_epymarl("qmix-lbf-8x8-2p-2f-coop") == ", within one std of EPyMARL's"
    assert page.against_epymarl("qmix-lbf-8x8-2p-2f-coop-epymarl") == (
        ", 4.00 std below EPyMARL's (Welch's t-test p = 0.01); its maximum returns outside EPyMARL's 95 % "
        "confidence interval"  # 0.2 against 0.6 ± 0.25 (t(2) 4.30 times 0.1 / sqrt(3))
    )
    keep("qmix-lbf-2s-8x8-2p-2f-coop", [0.35, 0.4, 0.45])  # 2 std below, but within 0.6 ± 0.25
    keep("epymarl-lbf-2s-8x8-2p-2f-coop", [0.5, 0.6, 0.7])
    assert page.against_epymarl("qmix-lbf-2s-8x8-2p-2f-coop").endswith(
        "its maximum returns inside EPyMARL's 95 % confidence interval"
    )
    keep("qmix-lbf-10x10-3p-3f", [0.1, 0.2])
    keep("epymarl-lbf-10x10-3p-3f", [0.3])
    assert page.against_epymarl("qmix-lbf-10x10-3p-3f") == ""


def test_the_divergence_with_time_limits_bootstrapped_is_read_from_the_kept_seeds(tmp_path, monkeypatch):
    """The page's account of QMIX diverging on simple_spread comes from the row's seeds: mean Q at
    110k and 1.2M steps, the greedy return per agent (team return / 3) at the first and last test;
    one number where the seeds agree, a span where they differ."""
    monkeypatch.setattr(store, "RUNS", tmp_path)
    name = "qmix-mpe-simple-spread-bootstrap"
    assert page.bootstrap_divergence() == "not run yet"
    (tmp_path / name).mkdir()
    (tmp_path / name / "summary.json").write_text(json.dumps({"seeds": [{"seed": 1}, {"seed": 2}]}))
    for seed, (q_late, last) in enumerate([(15_000.4, -150.0), (18_000.0, -159.0)], start=1):
        rows_kept = [
            {"step": 50_000, "eval/return_mean": -60.0},
            {"step": 110_000, "train/q_taken_mean": 24.2},
            {"step": 1_200_000, "train/q_taken_mean": q_late},
            {"step": 2_050_000, "eval/return_mean": last},
        ]
        (tmp_path / name / f"seed{seed}").mkdir()
        (tmp_path / name / f"seed{seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_kept))
    assert page.bootstrap_divergence() == (
        "mean Q 24 at 110k, 15,000 to 18,000 at 1.2M; the greedy return per agent -20 at the first test, -53 to "
        "-50 at the last; 2 seeds"
    )


def test_random_actions_on_a_qmix_task_are_kept_reproducibly_and_shown(tmp_path, monkeypatch):
    """``run.py ROW --random`` steps ddprl's own environment with random available actions; the
    same seed gives the same returns, kept in the row's folder and shown on both rows of its task."""
    monkeypatch.setattr(store, "RUNS", tmp_path)
    first = peers.random_baseline("qmix-lbf-8x8-2p-2f-coop", episodes=12)
    assert peers.random_baseline("qmix-lbf-8x8-2p-2f-coop", episodes=12) == first
    assert (first["task"], first["episodes"]) == ("Foraging-8x8-2p-2f-coop-v3", 12)
    assert 0 <= first["positive"] <= 12 and first["mean"] >= 0
    assert json.loads((tmp_path / "qmix-lbf-8x8-2p-2f-coop" / "random.json").read_text()) == first
    for row in ("qmix-lbf-8x8-2p-2f-coop", "qmix-lbf-8x8-2p-2f-coop-epymarl"):
        (line,) = page.random_line(row, 1, 2)
        command = "python benchmarks/results/run.py qmix-lbf-8x8-2p-2f-coop --random"
        assert line.startswith(f"- random actions (`{command}`): {first['mean']:.2f} ± ")
    assert page.random_line("qmix-lbf-10x10-3p-3f", 1, 2) == []


def test_a_row_resumed_on_another_machine_gives_each_machine_its_wall_time(tmp_path, monkeypatch):
    """Seeds kept from a summary that named one machine for all keep that machine when the row is
    resumed elsewhere; the page's wall time is then per machine."""
    monkeypatch.setattr(store, "RUNS", tmp_path)
    out = tmp_path / "ppo-cartpole"
    (out / "seed1").mkdir(parents=True)
    old = {"command": rows.ROWS["ppo-cartpole"].command(), "machine": "AMD EPYC, 2 cores", "date": "2026-11-25"}
    (out / "summary.json").write_text(json.dumps({**old, "seeds": [{"seed": 1, "wall_s": 600.0}]}))
    monkeypatch.setattr(store, "this_machine", lambda: "Intel(R) Xeon(R) Processor, 2 cores")
    kept = store.kept_seeds(out, "ppo-cartpole", old["command"], 3)
    assert kept == [{"seed": 1, "wall_s": 600.0, "machine": "AMD EPYC, 2 cores"}]
    new = store.seed_summary(2, 180.0, [(100, 1.0)])
    summary = {**old, "machine": store.this_machine(), "seeds": [*kept, new]}
    assert page.wall_per_seed(summary) == "10.0 min (AMD EPYC); 3.0 min (Intel Xeon)"
    assert page.machine_line(summary).startswith("machines: seed 1: AMD EPYC, 2 cores; seed 2: Intel(R)")
    assert page.wall_per_seed({**summary, "seeds": [new]}) == "3.0 min"
    # a long row's seed whose sittings ran on two machines names both, with the hours on each
    both = [{"wall_s": 7200.0, "machine": "AMD EPYC, 2 cores"}, {"wall_s": 1800.0, "machine": store.this_machine()}]
    long_seed = {**new, "seed": 3, "wall_s": 9000.0, "machine": store.sittings_machine(both)}
    assert long_seed["machine"] == "AMD EPYC, 2 cores (2.0 h) + Intel(R) Xeon(R) Processor, 2 cores (0.5 h)"
    assert (
        page.wall_per_seed({**summary, "seeds": [new, long_seed]})
        == "3.0 min (Intel Xeon); 150.0 min (AMD EPYC + Intel Xeon)"
    )


def test_epymarl_on_mpe_steps_its_pettingzoo_key_and_the_page_divides_by_the_agents(tmp_path, monkeypatch):
    """simple_spread's EPyMARL row runs EPyMARL's PettingZoo key with MPE's 25-step episodes, and
    its team returns are divided by the 3 agents in the reference cell and in its maximum returns,
    as ddprl's own are."""
    qmix_learning = load_module("qmix_learning")
    assert qmix_learning.task_spec("simple_spread_v3") == ("pz-mpe-simple-spread-v3", 25)
    assert rows.EPYMARL_ROWS["epymarl-mpe-simple-spread"] == "simple_spread_v3"
    assert rows.ROWS["qmix-mpe-simple-spread"].epymarl == "epymarl-mpe-simple-spread"
    command = peers.epymarl_row_command("simple_spread_v3")
    assert "env_args.key=pz-mpe-simple-spread-v3 env_args.time_limit=25 " in command

    def fake_epymarl(args, tmp):
        return {50: -90.0, 50_010: -60.0 - 3 * args.seed}, 60.0

    monkeypatch.setattr(qmix_learning, "run_epymarl", fake_epymarl)
    monkeypatch.setitem(sys.modules, "qmix_learning", qmix_learning)
    monkeypatch.setattr(store, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(store, "IMAGES", tmp_path / "images")
    checkout = tmp_path / "epymarl"
    (checkout / "src").mkdir(parents=True)
    (checkout / "src" / "main.py").write_text("")
    peers.run_epymarl_row("epymarl-mpe-simple-spread", 2, checkout, sys.executable, jobs=2)
    reference, details = page.epymarl_lines(
        rows.ROWS["qmix-mpe-simple-spread"], page.epymarl_runs(rows.ROWS["qmix-mpe-simple-spread"])
    )
    assert reference == "EPyMARL run here: -21.50 ± 0.71 at 50,000"  # team returns -63 and -66, per agent
    assert "EPyMARL's maximum returns here -21.50 ± 6.35 (95 % CI, at step 50,000)" in details[-1]  # per agent too


@pytest.mark.slow
def test_a_long_row_stopped_by_sigterm_goes_on_from_its_checkpoint(tmp_path):
    """A real run in a long row's work directory: SIGTERM to it (as to run.py, passed on) saves a
    checkpoint, keeps how far it got in ``in_progress/`` and raises Stopped; the next sitting resumes
    it to the end, keeps the one metrics file and the wall time of both sittings, keeps the final
    agent, and removes the work directory and the in-progress copy."""
    keys = ("task=CartPole-v1", "world_size=1", "steps=30000", "checkpoint_freq=4096", "eval_episodes=2")
    work, keep = tmp_path / "work", tmp_path / "runs" / "row" / "seed1"
    progress = tmp_path / "runs" / "row" / store.IN_PROGRESS / "seed1"
    stopped = []

    def first_sitting():
        try:
            training.train_and_keep(keys, 1, keep, "cartpole seed 1", work=work)
        except training.Stopped as e:
            stopped.append(str(e))

    sitting = threading.Thread(target=first_sitting)
    sitting.start()
    deadline = time.time() + 120
    while not (work / "metrics.jsonl").exists() or not (work / "metrics.jsonl").read_text():
        assert time.time() < deadline and sitting.is_alive(), "the run logged nothing"
        time.sleep(0.1)
    for proc in list(training.LIVE_RUNS):
        proc.send_signal(signal.SIGTERM)
    sitting.join(timeout=120)
    assert stopped and "--resume" in stopped[0] and (work / "checkpoints" / "latest.pt").exists()
    assert not keep.exists()  # nothing kept of an unfinished run but how far it got:
    so_far = store.read_rows(progress)
    assert so_far == store.read_rows(work) and (progress / "config.yaml").exists()
    assert so_far[-1]["step"] <= load_checkpoint(work / "checkpoints" / "latest.pt")["step"]

    (first,) = store.sittings(progress)  # the whole command: at least the training it logged
    assert first["machine"] == store.this_machine()
    first = first["wall_s"]
    assert first >= so_far[-1]["wall_time"]

    wall = training.train_and_keep(keys, 1, keep, "cartpole seed 1", work=work)
    rows = store.read_rows(keep)
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)) and steps[-1] >= 30000  # one curve, no step twice
    assert rows[: len(so_far)] == so_far  # the first sitting's rows, then the second's
    # the seed's wall time is its sittings' summed: the first, then at least the second's training
    # (its rows' wall_time runs on from the first sitting's last kept row)
    second = rows[-1]["wall_time"] - so_far[-1]["wall_time"]
    assert wall >= round(first + second, 1) and wall - first < second + 60
    assert [s["wall_s"] for s in store.sittings(keep)][0] == first  # kept with the run: where it ran
    assert store.sittings_machine(store.sittings(keep)) == store.this_machine()
    assert not work.exists() and not progress.parent.exists()
    final = load_checkpoint(tmp_path / "final" / "work.pt")  # the agent, to evaluate again later
    assert final["step"] >= 30000


def test_a_long_row_refused_at_its_start_fails_with_the_exit_and_leaves_nothing(tmp_path):
    """``ddprl train`` refusing its keys (exit 2, no run directory) ends a long row's seed with that
    exit, not with an error writing the sitting's time into a directory that was never made."""
    keys = ("algo=tdmpc2", "task=cartpole-swingup", "model_size=3")  # no such size
    work, keep = tmp_path / "work", tmp_path / "runs" / "row" / "seed1"
    with pytest.raises(SystemExit, match="exited 2"):
        training.train_and_keep(keys, 1, keep, "row seed 1", work=work)
    assert not work.exists() and not keep.parent.exists()


def test_a_long_row_part_way_shows_how_far_each_seed_got(tmp_path, monkeypatch, page_store):
    """No seed of the TD-MPC2 row has ended: the page says where each one stands, with its
    evaluations and training time so far (two sittings: wall time summed), and draws its curve."""
    row = "tdmpc2-cartpole-swingup"
    seeds = {  # (step, wall_time, evaluation) rows; each sitting's wall time
        1: ([(2500, 10.0, None), (10000, 3600.0, 277.9), (12000, 600.0, None)], [3600.0, 600.0]),
        2: ([(5000, 1800.0, None)], [{"wall_s": 1800.0, "machine": "Intel(R) Xeon(R) Processor, 2 cores"}]),
        3: ([(4000, 1400.0, None)], [900.0, *({"wall_s": w, "machine": "AMD EPYC, 2 cores"} for w in (360, 540))]),
    }
    for seed, (points, walls) in seeds.items():
        keep = tmp_path / "runs" / row / store.IN_PROGRESS / f"seed{seed}"
        keep.mkdir(parents=True)
        lines = [{"step": step, "wall_time": wall, **({rows.EVAL: ev} if ev else {})} for step, wall, ev in points]
        (keep / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        (keep / store.SITTINGS).write_text(json.dumps(walls))
    text = unwrapped_page()
    assert (
        "| 50,000 | not reached: 3 in progress, at 12,000 and 5,000 and 4,000 | 277.9 so far (seed 1) | 0 | | "
        "[png](images/tdmpc2-cartpole-swingup.png) |" in text
    )
    # each seed's machines, where its sittings recorded them (seed 1's, kept as bare seconds, did not)
    assert (
        "seed 1 at 12,000 of 50,000 steps after 1.2 h of training, evaluations: 277.9 at 10,000; "
        "seed 2 at 5,000 of 50,000 steps after 0.5 h of training on the Intel Xeon, evaluations: none yet; "
        "seed 3 at 4,000 of 50,000 steps after 0.5 h of training (not recorded 0.2 h, AMD EPYC 0.2 h), "
        "evaluations: none yet" in text
    )
    assert (tmp_path / "images" / f"{row}.png").exists()


def test_a_long_row_before_its_first_evaluation_has_no_curve(tmp_path, monkeypatch, page_store):
    """A seed stopped before its first evaluation: the page says how far it got, draws no figure
    (it would hold the reference alone) and links none."""
    row = "tdmpc2-reacher-easy"
    keep = tmp_path / "runs" / row / store.IN_PROGRESS / "seed1"
    keep.mkdir(parents=True)
    (keep / "metrics.jsonl").write_text(json.dumps({"step": 7000, "wall_time": 2400.0}) + "\n")
    (keep / store.SITTINGS).write_text(json.dumps([2460.0]))
    text = unwrapped_page()
    assert "| 50,000 | not reached: 1 in progress, at 7,000 |  | 0 | | no evaluation yet |" in text
    assert "seed 1 at 7,000 of 50,000 steps after 0.7 h of training, evaluations: none yet" in text
    assert not (tmp_path / "images" / f"{row}.png").exists()
    assert f"images/{row}.png" not in text


def test_a_long_row_whose_checkpoint_is_gone_keeps_the_lost_attempt_and_shows_both(tmp_path, monkeypatch, page_store):
    """A sitting on a new machine finds a seed's in-progress record but no checkpoint (the work
    directory is not committed): the record moves to ``lost/`` (a second loss beside the first)
    rather than being overwritten by the fresh start, and the page shows both attempts apart."""
    row = "tdmpc2-cartpole-swingup"
    out, work = tmp_path / "runs" / row, tmp_path / "work" / "seed1"

    def record(folder: str, points: list[tuple[int, float, float | None]], walls: list[float]) -> None:
        keep = out / folder / "seed1"
        keep.mkdir(parents=True)
        lines = [{"step": step, "wall_time": wall, **({rows.EVAL: ev} if ev else {})} for step, wall, ev in points]
        (keep / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        (keep / store.SITTINGS).write_text(json.dumps(walls))

    assert store.set_aside_lost(out, 1, work) is None  # nothing recorded: nothing to set aside
    record(store.IN_PROGRESS, [(10000, 3600.0, 277.9), (40000, 9000.0, 819.5)], [30600.0])
    (work / "checkpoints").mkdir(parents=True)
    (work / "checkpoints" / "latest.pt").write_bytes(b"")
    assert store.set_aside_lost(out, 1, work) is None  # its checkpoint is there: it goes on
    (work / "checkpoints" / "latest.pt").unlink()
    assert store.set_aside_lost(out, 1, work) == out / store.LOST / "seed1"
    assert not (out / store.IN_PROGRESS).exists()
    record(store.IN_PROGRESS, [(2500, 100.0, None)], [100.0])
    assert store.set_aside_lost(out, 1, work) == out / store.LOST / "seed1-2"  # lost again: both kept

    record(store.IN_PROGRESS, [(5000, 1800.0, None)], [1800.0])  # the third attempt, going on
    drawn, draw_figure = [], plot.figure

    def figure(runs, keys, x="step", styles=None):
        drawn.append((list(runs), styles))
        return draw_figure(runs, keys, x, styles)

    monkeypatch.setattr(plot, "figure", figure)
    text = unwrapped_page()
    # both lost attempts dashed in the colour of the seed's run in progress
    dashed = {"linestyle": "--", "color": "C0"}
    labels = ["seed1, in progress", "seed1, lost", "seed1-2, lost"]
    assert drawn == [(labels, {"seed1, lost": dashed, "seed1-2, lost": dashed})]
    assert "| not reached: 1 in progress, at 5,000; 2 lost, at 40,000 and 2,500 | 819.5 so far (seed 1, lost) |" in text
    assert "seed 1 at 5,000 of 50,000 steps after 0.5 h of training, evaluations: none yet\n- lost (" in text
    assert (
        "seed 1 at 40,000 of 50,000 steps after 8.5 h of training, evaluations: 277.9 at 10,000, 819.5 at 40,000; "
        "seed 1 at 2,500 of 50,000 steps after 0.0 h of training, evaluations: none yet" in text
    )
    assert (tmp_path / "images" / f"{row}.png").exists()


def test_a_stopped_long_row_keeps_the_seeds_that_finished_and_exits_75(tmp_path, monkeypatch):
    """Seeds run ``jobs`` at once; one stopped with its checkpoint leaves the others kept, starts no
    further seed, and run.py exits 75 (as ddprl does); each kept seed says how many ran beside it."""
    calls = []

    def fake_train(keys, seed, keep, what, env=None, work=None):
        calls.append((seed, work))
        if seed == 2:
            raise training.Stopped(f"{what}: stopped")
        keep.mkdir(parents=True)
        (keep / "metrics.jsonl").write_text(json.dumps({"step": 50_000, "eval/return_mean": 800.0}) + "\n")
        return 60.0

    monkeypatch.setattr(store, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(store, "WORK", tmp_path / "work")
    monkeypatch.setattr(training, "train_and_keep", fake_train)
    with pytest.raises(SystemExit) as stop:
        training.run_row("tdmpc2-cartpole-swingup", 2, jobs=2)
    assert stop.value.code == 75
    assert sorted(calls) == [(s, tmp_path / "work" / "tdmpc2-cartpole-swingup" / f"seed{s}") for s in (1, 2)]
    kept = json.loads((tmp_path / "runs" / "tdmpc2-cartpole-swingup" / "summary.json").read_text())
    assert [(s["seed"], s["jobs"], s["at_reference"]) for s in kept["seeds"]] == [(1, 2, [800.0])]

    # one at a time, resumed: the stopped seed ends the sitting, no seed starts after it
    calls.clear()
    with pytest.raises(SystemExit) as stop:
        training.run_row("tdmpc2-cartpole-swingup", 3, resume=True, jobs=1)
    assert stop.value.code == 75 and [seed for seed, _ in calls] == [2]


CLEANRL_OUTPUT = """\
/venv/lib/python3.11/site-packages/gymnasium/wrappers/normalize.py:1: DeprecationWarning: a warning
global_step=17, episodic_return=[81.67697]
global_step=35, episodic_return=[-3.5e+01]
SPS: 564
global_step=2090, episodic_return=[ 102.5 ]
global_step=2100, episodic_length=[23]
model saved to runs/Humanoid-v4__ppo_continuous_action__1__1764400000/ppo_continuous_action.cleanrl_model
"""


def test_cleanrl_output_becomes_training_episode_records():
    """CleanRL's script prints each training episode as it ends; those lines, and only those,
    become ddprl's metrics records at the step each ended (its other output is skipped)."""
    episodes = [e for line in CLEANRL_OUTPUT.splitlines() if (e := peers.cleanrl_episode(line))]
    assert episodes == [
        {"step": 17, rows.TRAIN: 81.67697},
        {"step": 35, rows.TRAIN: -35.0},
        {"step": 2090, rows.TRAIN: 102.5},
    ]
    assert peers.cleanrl_episode("global_step=8124, episodic_return=[82.50758]\n") == {
        "step": 8124,
        rows.TRAIN: 82.50758,
    }
    assert peers.cleanrl_episode("SPS: 121") is None


def test_cleanrl_rows_run_its_script_unchanged_from_the_checkout():
    """A CleanRL row's command: the script of the checkout under CleanRL's own python, on the row's
    task and budget (``steps``: a smoke run's), on the CPU; the page's command is the same, seed apart.
    The PPO Humanoid-v4 rows, and only they, name it."""
    argv = peers.cleanrl_argv("cleanrl-humanoid-v4", 2, Path("/peers/cleanrl"), "/peers/venv/bin/python")
    assert argv == [
        "/peers/venv/bin/python",
        "/peers/cleanrl/cleanrl/ppo_continuous_action.py",
        "--env-id",
        "Humanoid-v4",
        "--total-timesteps",
        "1000000",
        "--no-cuda",
        "--seed",
        "2",
    ]
    assert "8192" in peers.cleanrl_argv("cleanrl-humanoid-v4", 1, Path("c"), "python", steps=8192)
    assert peers.cleanrl_row_command("cleanrl-humanoid-v4") == (
        "OMP_NUM_THREADS=1 python cleanrl/ppo_continuous_action.py --env-id Humanoid-v4 --total-timesteps 1000000 "
        "--no-cuda"
    )
    named = {name for name, row in rows.ROWS.items() if row.cleanrl}
    assert named == {"ppo-humanoid-v4", "ppo-humanoid-v4-mbadv"}
    assert rows.ROWS["ppo-humanoid-v4"].cleanrl in rows.CLEANRL_ROWS


def test_cleanrl_refuses_a_missing_python_and_a_checkout_at_another_commit(tmp_path):
    """One line that says what is wrong and how to make it right: CleanRL's environment, or its clone."""
    with pytest.raises(SystemExit, match="--cleanrl-python") as refused:
        peers.check_cleanrl(tmp_path, str(tmp_path / "no-python"))
    assert rows.CLEANRL_VENV in str(refused.value)
    with pytest.raises(SystemExit, match="no git checkout, not CleanRL at fe8d8a0"):
        peers.check_cleanrl(tmp_path, sys.executable)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=60)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "other"], check=True, timeout=60)
    with pytest.raises(SystemExit) as refused:
        peers.check_cleanrl(tmp_path, sys.executable)
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=60)
    assert f"{head.stdout.strip()}, not CleanRL at {rows.CLEANRL_COMMIT}; {rows.CLEANRL_CLONE}" in str(refused.value)


# CleanRL's script as the runner sees it: prints two episodes and the steps per second, writes runs/ into
# its working directory (which must not be the repository's), fails once for seed 2.
FAKE_CLEANRL = """\
import os, pathlib, sys
args = sys.argv[1:]
seed, steps = int(args[args.index("--seed") + 1]), int(args[args.index("--total-timesteps") + 1])
assert os.environ["OMP_NUM_THREADS"] == "1" and not pathlib.Path("benchmarks").exists()
pathlib.Path("runs").mkdir()
if seed == 2 and not pathlib.Path(sys.argv[0]).with_name("failed").exists():
    pathlib.Path(sys.argv[0]).with_name("failed").write_text("")
    sys.exit("Traceback: the fake failed")
print("a warning")
print(f"global_step={steps // 2}, episodic_return=[{10.0 * seed}]")
print(f"global_step={steps}, episodic_return=[{20.0 * seed}]")
print("SPS: 100")
"""


def test_a_cleanrl_row_keeps_each_seed_that_ran_and_says_which_failed(tmp_path, monkeypatch):
    """Each seed runs the script in a scratch directory; its episodes are kept as the seed's
    metrics, the summary has its return over the last 5 % of the steps; a failed seed is said, the
    others kept, the row exits nonzero, and ``--resume`` runs only the failed one."""
    checkout = tmp_path / "cleanrl"
    (checkout / "cleanrl").mkdir(parents=True)
    (checkout / "cleanrl" / "ppo_continuous_action.py").write_text(FAKE_CLEANRL)
    monkeypatch.setattr(store, "RUNS", tmp_path / "runs")
    monkeypatch.setattr(peers, "check_cleanrl", lambda checkout, python: None)
    with pytest.raises(SystemExit, match=r"failed on seed\(s\) \[2\]"):
        peers.run_cleanrl_row("cleanrl-humanoid-v4", 3, checkout, sys.executable, steps=1000)
    out = tmp_path / "runs" / "cleanrl-humanoid-v4"
    assert store.read_rows(out / "seed3") == [{"step": 500, rows.TRAIN: 30.0}, {"step": 1000, rows.TRAIN: 60.0}]
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["seed"], s["train_return"], s["episodes"], s["sps"]) for s in summary["seeds"]] == [
        (1, 20.0, 2, 100),
        (3, 60.0, 2, 100),
    ]
    assert (summary["steps"], summary["cleanrl_commit"]) == (1000, rows.CLEANRL_COMMIT)
    assert summary["command"].endswith("--total-timesteps 1000 --no-cuda") and "numpy " in summary["cleanrl_versions"]
    peers.run_cleanrl_row("cleanrl-humanoid-v4", 3, checkout, sys.executable, resume=True, steps=1000)
    summary = json.loads((out / "summary.json").read_text())
    assert [s["train_return"] for s in summary["seeds"]] == [20.0, 40.0, 60.0]


def test_cleanrl_run_here_stands_beside_the_published_number_on_the_page(tmp_path, monkeypatch, page_store):
    """A kept CleanRL run: the rows that name it get a table line 'CleanRL run here' with ddprl's
    training episodes measured alike at its steps, a details line, and its binned mean ± std on the
    training-episode axis of the PNG; a row not run yet shows it beside 'not run yet'. Before any
    CleanRL run is kept the page shows none of it."""

    def fake_train(keys, seed, keep, what, env=None, work=None):
        keep.mkdir(parents=True)
        logged = [(960_000, 600.0), (1_000_000, 620.0)] if seed == 1 else [(960_000, 640.0), (1_000_000, 660.0)]
        write_metrics(keep, [{"step": s, rows.TRAIN: r, rows.EVAL: r + 100} for s, r in logged])
        return 1200.0

    monkeypatch.setattr(training, "train_and_keep", fake_train)
    training.run_row("ppo-humanoid-v4", 2)
    before = unwrapped_page()
    assert "CleanRL run here:" not in before and "CleanRL run here (" not in before

    out = tmp_path / "runs" / "cleanrl-humanoid-v4"
    episodes = {1: [(10_000, 100.0), (15_000, 200.0), (990_000, 700.0)], 2: [(12_000, 300.0), (30_000, 50.0)]}
    episodes[2].append((995_000, 650.0))
    for seed, points in episodes.items():
        (out / f"seed{seed}").mkdir(parents=True)
        write_metrics(out / f"seed{seed}", [{"step": s, rows.TRAIN: r} for s, r in points])
    seeds = [{"seed": seed, "wall_s": 3600.0, "train_return": r, "jobs": 2} for seed, r in ((1, 700.0), (2, 650.0))]
    summary = {
        "row": "cleanrl-humanoid-v4",
        "command": peers.cleanrl_row_command("cleanrl-humanoid-v4"),
        "steps": 1_000_000,
        "cleanrl_commit": rows.CLEANRL_COMMIT,
        "cleanrl_versions": "torch 2.13.0, gymnasium 0.29.1, mujoco 2.3.3, numpy 1.26.4",
        "machine": "AMD EPYC, 2 cores",
        "date": "2026-11-29",
        "seeds": seeds,
    }
    (out / "summary.json").write_text(json.dumps(summary))
    drawn = []

    def mean_band(ax, at, label):
        drawn.append((label, at))
        return draw_band(ax, at, label)

    draw_band = page.mean_band
    monkeypatch.setattr(page, "mean_band", mean_band)
    text = unwrapped_page()
    assert (
        "| PPO, Humanoid-v4 (CleanRL's task version) | CleanRL run here: 675.0 ± 35.4 (training episodes) "
        "| 1,000,000 | 630.0 ± 28.3 | 740.0 ± 28.3 | 2 | 20.0 min | [png](images/ppo-humanoid-v4.png) |" in text
    )
    assert (
        "| PPO, Humanoid-v4, advantages normalised per minibatch | CleanRL run here: 675.0 ± 35.4 (training "
        "episodes) | 1,000,000 | not run yet |" in text
    )
    (line,) = [line for line in text.splitlines() if line.startswith("- CleanRL run here (commit `fe8d8a0`;")]
    assert f"`{summary['command']}` (+ `--seed K`, in CleanRL's tree; " in line
    assert "`python benchmarks/results/run.py cleanrl-humanoid-v4 --cleanrl DIR --cleanrl-python PY` runs it" in line
    assert "machine: AMD EPYC, 2 cores, 2026-11-29; 60.0 min per seed (up to 2 seeds at once, one core each)" in line
    assert line.endswith("seed 1: 700.0; seed 2: 650.0; mean ± std 675.0 ± 35.4")
    # the bins of 20k steps both seeds have an episode in: their means, one per seed
    assert drawn == [("CleanRL here (2 seeds)", {10_000: [150.0, 300.0], 990_000: [700.0, 650.0]})]
    assert (tmp_path / "images" / "ppo-humanoid-v4.png").exists()
