"""The results harness (benchmarks/results): its rows resolve, the page's statistics and tables come from the kept
runs, and the runner keeps and resumes seeds, ddprl's and its peers'. Fakes stand in for training but in two tests."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ddprl.checkpoint import load_checkpoint
from ddprl.config import load_config

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
sys.path.insert(0, str(RESULTS.parent))  # the results package, and the benchmarks' modules it imports
from results import page, peers, rows, store, training  # noqa: E402 (the path above first)

EVAL, TRAIN = rows.EVAL, rows.TRAIN


def load_module(name: str, folder: Path = RESULTS.parent):
    spec = importlib.util.spec_from_file_location(f"results_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def write_run(folder: Path, records: list[dict]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def keep(name: str, runs: dict[str, list[dict]], seeds: list[dict] | None = None, **extra) -> None:
    """Fake kept runs of a row (``runs``: folder name -> records) and its summary."""
    for folder, records in runs.items():
        write_run(store.RUNS / name / folder, records)
    seeds = seeds or [{"seed": int(f.split("seed")[1])} for f in runs]
    (store.RUNS / name / "summary.json").write_text(json.dumps({"command": "x", **extra, "seeds": seeds}))


@pytest.fixture
def tmp_store(tmp_path, monkeypatch):
    for name, path in (("RUNS", "runs"), ("WORK", "work"), ("IMAGES", "results"), ("PAGE", "results.md")):
        monkeypatch.setattr(store, name, tmp_path / path)
    return tmp_path


PEER_RUNS = [(name, impl) for name, row in rows.PEER_ROWS.items() for impl in row.ddprl_impls]


@pytest.mark.parametrize("name,impl", PEER_RUNS)
def test_peer_keys_resolve_to_purejaxrl_sizes(name, impl):
    row = rows.PEER_ROWS[name]
    c, cfg = row.config(), load_config(list(row.keys(impl)))
    devices = cfg.devices if cfg.engine == "jax" else cfg.world_size
    assert cfg.engine == ("torch" if impl == "torch" else "jax") and devices == rows.DEVICES[impl]
    size, updates, minibatch = (8192, 1220, 1024) if "MinAtar" in row.task else (512, 976, 128)
    assert cfg.num_envs * cfg.n_steps == c["NUM_ENVS"] * c["NUM_STEPS"] == size and cfg.steps == updates * size
    assert cfg.effective_batch_size(devices) == minibatch and size // devices // cfg.batch_size == c["NUM_MINIBATCHES"]
    ours = (cfg.epochs, cfg.lr, cfg.anneal_lr, cfg.gamma, cfg.gae_lambda, cfg.clip_coef, cfg.vf_coef, cfg.ent_coef)
    assert ours == tuple(c[k] for k in "UPDATE_EPOCHS LR ANNEAL_LR GAMMA GAE_LAMBDA CLIP_EPS VF_COEF ENT_COEF".split())
    assert (cfg.clip_vloss, cfg.norm_adv, cfg.norm_obs, cfg.target_kl, cfg.max_grad_norm) == (1, 1, 0, None, 0.5)
    assert (cfg.hidden_sizes, cfg.activation, cfg.policy) == ([64, 64], c["ACTIVATION"], "mlp")
    assert [k for k, source in cfg.sources.items() if source == "task preset"] in ([], ["checkpoint_freq"])


def test_every_row_is_a_valid_configuration_and_a_kept_run_of_another_command_is_stale():
    for name, row in {**rows.ROWS, **rows.SUPERVISED_ROWS}.items():
        cfg = load_config(list(row.keys))
        one_rank = name.endswith("-zoo") or (name.startswith(("tdmpc2-", "ppo-atari-")) and not name.endswith("-cpu"))
        assert cfg.world_size == (1 if one_rank else 2), name
        if (kept := store.kept_summary(name)) and kept["command"] != row.command():  # the page marks it stale
            # unless the keys the row adds name the values its seeds ran (a preset's default, named since)
            ran = (store.RUNS / name / f"seed{kept['seeds'][0]['seed']}" / "config.yaml").read_text()
            added = set(row.command().split()) - set(kept["command"].split())
            as_ran = all(
                re.search(rf"^{k}: {re.escape(v)}( |$)", ran, re.M) for k, _, v in (a.partition("=") for a in added)
            )
            assert page.stale(name) or as_ran, (
                f"{name}: its seeds ran `{kept['command']}`, and the page does not say so"
            )
    epymarl = load_config(list(rows.ROWS["qmix-lbf-8x8-2p-2f-coop-epymarl"].keys))
    assert (epymarl.batch_size * 2, epymarl.standardise_state, epymarl.bootstrap_truncated) == (32, False, False)
    atari = load_config(list(rows.ROWS["ppo-atari-breakout"].keys))  # the preset, as CleanRL's published runs
    assert (atari.steps, atari.num_envs, atari.n_steps, atari.policy) == (10_000_000, 8, 128, "nature_cnn")
    assert rows.PEER_ROWS["jax-breakout"].impls == ("purejaxrl", "jax1", "jax")  # MinAtar is gymnax's only


def test_statistics():
    points = [(1000, 1.0), (9600, 2.0), (10_000, 4.0), (10_200, 6.0), (11_000, 8.0)]
    assert store.at_steps(points, 10_000) == 6.0  # the last evaluation within 2.5 % past the budget
    assert store.window_mean(points, 10_000) == 4.0  # the last 5 %: 9,600, 10,000 and 10,200
    assert store.mean_std([1.0, 2.0, 3.0], 2) == "2.00 ± 1.00" and store.mean_std([1.0], 1) == "1.0 (1 seed)"
    assert store.welch([0.1, 0.2, 0.3], [0.5, 0.6, 0.7]) == pytest.approx(0.00805, abs=1e-5)  # t = -4.90, 4 dof


def test_the_tables_and_the_csv_are_computed_from_the_kept_runs(tmp_store):
    """Fake runs of a Humanoid-v4 row with CleanRL run here, a QMIX row with EPyMARL's, a peer row and a supervised
    row: each table line is the runs' IQM over seeds with its bootstrap interval, the reference's, and the verdict;
    the suites' verdicts counted at the top."""
    two = lambda records: {f"seed{s}": records(s) for s in (1, 2)}  # noqa: E731 (two seeds' runs)
    keep("ppo-humanoid-v4", two(lambda s: [{"step": 900_000, TRAIN: 0}, {"step": 960_000, TRAIN: 540.0 + 60 * s}]))
    cleanrl = {"steps": 10**6, "cleanrl_commit": "fe8d8a0"}
    keep("cleanrl-humanoid-v4", two(lambda s: [{"step": 999_000, TRAIN: 700.0 - 50 * s}]), **cleanrl)
    for name, (a, b) in {"qmix-mpe-simple-spread": (-45, -48), "epymarl-mpe-simple-spread": (-42, -48)}.items():
        keep(name, {f"seed{s}": [{"step": 2_050_000, EVAL: r}] for s, r in ((1, a), (2, b))}, epymarl_commit="c")
    impls, times = ("purejaxrl", "jax1", "jax"), {"wall_s": 3.0, "compile_s": 1.0, "train_s": 2.0}
    runs = {f"{i}-seed{s}": [{"step": 9_994_240, TRAIN: 10.0 * s}] for i in impls for s in (1, 2)}
    seeds = [{"seed": s, **dict.fromkeys(impls, times)} for s in (1, 2)]
    keep("jax-breakout", runs, seeds, steps=9_994_240, purejaxrl={"commit": "31756b1"})
    seeds = [{"seed": s, "baselines": {"LR": 0.95, "MLP": 0.9 + s / 100}} for s in (1, 2)]
    keep("supervised-digits", two(lambda s: [{"step": 10, "test/accuracy": 0.9 + 0.02 * s}]), seeds)
    text = page.page()
    last5, v4 = "training episodes, last 5 % of 1M", "| Humanoid-v4 | `ppo-humanoid-v4` | 630.0 [600.0, 660.0] |"
    # two seeds: IQM = mean, the bootstrap's replicates 600, 630 or 660; a published mean is a point to compare
    assert f"{v4} 716.11 ± 49.08 (3 seeds) | CleanRL pr-424 | {last5} | below | 2 |" in text
    assert f"{v4} 625.0 [600.0, 650.0] | CleanRL `fe8d8a0` run here | {last5} | within | 2 / 2 |" in text
    assert "| Humanoid-v5 | `ppo-humanoid` | not run | 716.11 ± 49.08 (3 seeds) | CleanRL pr-424, Humanoid-v4 |" in text
    assert "| `qmix-mpe-simple-spread` | -15.50 [-16.00, -15.00] | -15.00 [-16.00, -14.00] | EPyMARL `c` run" in text
    assert "| final greedy test at 2.05M (EPyMARL's at 2.05M) | within | 2 / 2 |" in text  # per agent
    assert "| `jax-breakout` jax, 2 devices | 15.0 [10.0, 20.0] | 15.0 [10.0, 20.0] | PureJaxRL `31756b1` run" in text
    assert "| `jax-breakout` | 3.0 / 1.0 / 2.0 | 3.0 / 1.0 / 2.0 | 3.0 / 1.0 / 2.0 | — |" in text  # seconds per seed
    assert "| `supervised-digits` | 0.9300 [0.9200, 0.9400] | 0.9500 [0.9500, 0.9500] | LR |" in text
    assert (
        "| `supervised-digits` | 0.9300 [0.9200, 0.9400] | 0.9150 [0.9100, 0.9200] | MLP | test accuracy | within |"
        in text
    )
    assert "| `jax-cartpole` | not run |" in text and (tmp_store / "results" / "ppo-mujoco.png").exists()
    assert "| PPO, MuJoCo | 18 | 0 | 1 | 1 | 16 | 0 |" in text  # the verdicts counted
    assert "| Supervised | 2 | 0 | 1 | 1 | 0 | 0 |" in text
    assert text.count(f"{page.COLUMNS}\n|---|---|---|---|---|---|---|---|---|---|\n") == len(page.SUITES)
    table = (tmp_store / "results.csv").read_text().splitlines()
    assert table[0] == "row,algorithm,task,seed,metric,value,steps_reached,commit,library_commit,machine,torch,date"
    assert 'ppo-humanoid-v4,PPO,Humanoid-v4,2,"training episodes, last 5 % of 1M",660.0,960000,,,,,' in table
    assert "epymarl-mpe-simple-spread,QMIX (EPyMARL),simple_spread_v3,1,final greedy test,-14.0,2050000,,,,," in table
    assert len(table) == 1 + 2 * (1 + 1 + 2 + 3 + 1 + 2)  # per seed, each measure of each row once


def test_the_reconstruction_table_gives_each_rows_interval_and_its_verdict_against_the_limited_view(tmp_store):
    """QMIX sight-limited / reconstructed / oracle rows: each the IQM of its seeds' final win rates with rliable's
    stratified-bootstrap interval (benchmarks/results/stats.py) and above/within/below the sight-limited row's."""
    from results import stats

    won = {"qmix-smax-3m-sight6": (0.5, 0.6, 0.7), "qmix-smax-3m-sight6-reconstruct": (0.9, 0.95, 1.0)}
    won["qmix-smax-3m-sight6-full"] = (0.6,)
    for name, finals in won.items():
        keep(
            name,
            {
                f"seed{s}": [{"step": 250_000, rows.WON: 0.0}, {"step": 500_000, rows.WON: v}]
                for s, v in enumerate(finals, 1)
            },
        )
    text = page.page()
    low, high = stats.bootstrap_interval([0.5, 0.6, 0.7])
    assert f"| `qmix-smax-3m-sight6` | sight-limited | 0.600 [{low:.3f}, {high:.3f}] | 0.600 ± 0.100 | — | 3 |" in text
    low, high = stats.bootstrap_interval([0.9, 0.95, 1.0])
    assert f"| reconstructed | 0.950 [{low:.3f}, {high:.3f}] | 0.950 ± 0.050 | above | 3 |" in text
    assert "| full observation (oracle) | 0.600 | 0.600 (1 seed) | — | 1 |" in text
    assert (
        'qmix-smax-3m-sight6-reconstruct,QMIX,smax/3m sight 6,2,"win rate, final greedy test at 500k",0.95'
        in (tmp_store / "results.csv").read_text()
    )


def test_a_long_rows_seeds_in_training_say_how_far_they_got(tmp_store):
    for seed, last in ((2, 1_000_000), (10, 2_500_000)):
        progress = store.RUNS / "ppo-atari-pong-cpu" / training.IN_PROGRESS / f"seed{seed}"
        progress.mkdir(parents=True)
        records = [{"step": step, TRAIN: step / 100_000 - 21} for step in range(last // 4, last + 1, last // 4)]
        (progress / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    text = page.page()  # and their curves in the figure
    assert "| `ppo-atari-pong-cpu` | in training (notes) | 20.45 ± 0.09 (3 seeds) |" in text
    said = "In training: seed 2 at 1M of 10M steps (training return over its last 5 % -11.0); seed 10 at 2.5M"
    assert said in " ".join(text.split()) and "(training return over its last 5 % 4.0)." in " ".join(text.split())
    assert "`ppo-atari-breakout`: In training" not in text


def test_a_long_rows_lost_attempts_say_how_far_they_got(tmp_store):
    """An attempt whose checkpoint went with its machine counts for nothing, and the notes say how far it got."""
    for attempt in ("seed1", "seed1-2"):
        gone = store.RUNS / "ppo-atari-pong-cpu" / training.LOST / attempt
        gone.mkdir(parents=True)
        last = 1_000_000 if attempt == "seed1" else 500_000
        records = [{"step": step, TRAIN: step / 100_000 - 21} for step in range(last // 4, last + 1, last // 4)]
        (gone / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    text = " ".join(page.page().split())
    assert "| `ppo-atari-pong-cpu` | stopped (notes) | 20.45 ± 0.09 (3 seeds) |" in text and "In training" not in text
    said = "Attempts lost with their machine's checkpoint: seed 1 at 1M of 10M steps (training return over its last"
    assert said in text and "5 % -11.0); seed 1, attempt 2 at 500k of 10M steps" in text


@pytest.mark.slow
def test_the_committed_page_and_csv_are_the_kept_runs(tmp_store, monkeypatch):
    """docs/results.md and .csv rebuilt from benchmarks/results/runs are the committed ones, within their bounds."""
    monkeypatch.setattr(store, "RUNS", RESULTS / "runs")
    text, docs = page.page(), RESULTS.parents[1] / "docs"
    assert text == (docs / "results.md").read_text()
    assert (tmp_store / "results.csv").read_text() == (docs / "results.csv").read_text()
    assert len(text.splitlines()) <= 400
    # The CSV grows with the results: a line per seed and measure of each library in a row, none twice.
    lines = list(csv.DictReader((docs / "results.csv").read_text().splitlines()))
    assert len({(line["row"], line["algorithm"], line["seed"], line["metric"]) for line in lines}) == len(lines) > 100
    assert max(len(line) for line in text.splitlines()) <= 400
    assert not [line for line in text.splitlines() if re.search(r"20\d\d-\d\d-\d\d", line)]  # no dates


def test_a_kept_run_is_packed_the_same_bytes_every_time_and_reads_back(tmp_path):
    records, packed = [{"step": 512 * i, EVAL: 1.5 * i} for i in range(1, 4)], []
    for name in ("a", "b"):
        write_run(tmp_path / name, records)
        store.pack(tmp_path / name)
        assert store.read_rows(tmp_path / name) == records and not (tmp_path / name / "metrics.jsonl").exists()
        packed.append((tmp_path / name / "metrics.jsonl.gz").read_bytes())
    assert packed[0] == packed[1]


def test_a_row_keeps_each_finished_seed_and_resumes_with_the_others(tmp_store, monkeypatch):
    trained = []

    def fake_train(keys, seed, keep, what, env=None, work=None):
        trained.append(seed)
        if seed == 2 and trained.count(2) == 1:
            raise SystemExit(f"{what}: ddprl train exited 1")
        write_run(keep, [{"step": 50_000, EVAL: 100.0 * seed}, {"step": 100_000, EVAL: 200.0 * seed}])
        return 1.0

    monkeypatch.setattr(training, "train_and_keep", fake_train)
    with pytest.raises(SystemExit, match=r"failed on seed\(s\) \[2\]"):
        training.run_row("ppo-cartpole", 3)
    kept = store.kept_summary("ppo-cartpole")["seeds"]
    assert [(s["seed"], s["final"], s["best"], s["at_reference"]) for s in kept] == [(1, 200.0, 200.0, [200.0])]
    summary = training.run_row("ppo-cartpole", 3, resume=True)
    assert trained == [1, 2, 2, 3] and [s["final"] for s in summary["seeds"]] == [200.0, 400.0, 600.0]
    assert training.run_row("ppo-cartpole", 3, resume=True) == summary and trained == [1, 2, 2, 3]  # all kept


# purejaxrl_ppo.py as the runner sees it under PureJaxRL's python: writes its curve and result
FAKE_PUREJAXRL = """#!/usr/bin/env python3
import json, pathlib, sys
args = dict(zip(sys.argv[2::2], sys.argv[3::2]))
out, seed = pathlib.Path(args["--out"]), int(args["--seed"])
out.mkdir(parents=True, exist_ok=True)
(out / "metrics.jsonl").write_text(json.dumps({"step": 16384, "train/episode_return": float(seed)}) + "\\n")
(out / "result.json").write_text(json.dumps({"compile_s": 1.0, "train_s": 2.0, "versions": {"jax": "x"}}))
"""


def test_a_peer_row_keeps_each_finished_seed_and_resumes_with_the_others(tmp_store, monkeypatch):
    python, failed = tmp_store / "python", []
    python.write_text(FAKE_PUREJAXRL)
    python.chmod(0o755)

    def fake_train(keys, seed, keep, what, env=None, work=None):
        if what.split()[1] == "jax" and seed == 2 and not failed:  # the first sitting stops here
            failed.append(seed)
            raise SystemExit(f"{what}: ddprl train exited 1")
        write_run(keep, [{"step": 16384, TRAIN: 10.0 * seed, "time/iteration_s": 1.0, "time/compile_s": 0.5}])
        return 2.0

    monkeypatch.setattr(peers, "check_checkout", lambda *args: None)
    monkeypatch.setattr(training, "train_and_keep", fake_train)
    with pytest.raises(SystemExit):
        peers.run_peer_row("jax-breakout", 3, tmp_store, str(python), steps=8192 * 2)
    assert [s["seed"] for s in store.kept_summary("jax-breakout")["seeds"]] == [1]
    summary = peers.run_peer_row("jax-breakout", 3, tmp_store, str(python), steps=8192 * 2, resume=True)
    got = [(s["seed"], s["purejaxrl"]["train_return"], s["jax"]["train_return"]) for s in summary["seeds"]]
    assert got == [(1, 1.0, 10.0), (2, 2.0, 20.0), (3, 3.0, 30.0)]
    measured = dict(wall_s=2.0, compile_s=0.5, train_s=1.0, train_return=10.0, eval_return=None, final_step=16384)
    assert summary["seeds"][0]["jax"] == measured and summary["seeds"][0]["purejaxrl"]["compile_s"] == 1.0
    with pytest.raises(SystemExit, match="other commands"):  # another budget: the kept seeds do not count
        peers.run_peer_row("jax-breakout", 4, tmp_store, str(python), steps=8192 * 4, resume=True)


def test_purejaxrl_curve_and_its_gymnax_adapter():
    driver = load_module("purejaxrl_ppo", RESULTS)
    returns, ended = np.zeros((3, 2, 2)), np.zeros((3, 2, 2), bool)  # 3 updates x 2 steps x 2 envs
    returns[0, 0, 0], ended[0, 0, 0], returns[0, 1, 1], ended[0, 1, 1] = 10, True, 20, True
    returns[1], returns[2, 1, 0], ended[2, 1, 0] = 20, 5, True  # update 1: stale values of ended episodes
    curve = driver.curve_rows({"returned_episode_returns": returns, "returned_episode": ended}, 4, 3.0)
    got = [(r["step"], r[TRAIN], r["train/episodes"], r["wall_time"]) for r in curve]
    assert got == [(4, 15.0, 2.0, 1.0), (12, 5.0, 1.0, 3.0)]

    class Env:  # gymnax >= 1.0's step
        name = "fake"

        def step(self, key, state, action, params=None):
            return "obs", state + 1, 1.0, np.array(False), np.array(True), {"info": 0, "final_observation": "obs"}

    env = driver.FiveTupleStep(Env())
    obs, state, reward, done, info = env.step(None, 0, 0)
    assert (obs, state, reward, bool(done), info, env.name) == ("obs", 1, 1.0, True, {"info": 0}, "fake")


def test_epymarl_tests_are_read_from_sacred_and_kept_on_the_grid(tmp_store, monkeypatch):
    info = tmp_store / "sacred" / "qmix" / "lbforaging:Foraging-8x8-2p-2f-coop-v3" / "1" / "info.json"
    info.parent.mkdir(parents=True)
    pickled = [{"dtype": "float64", "py/object": "numpy.float64", "value": v} for v in (0.0, 0.25, 0.5)]
    info.write_text(json.dumps({"test_return_mean": pickled, "test_return_mean_T": [50, 50_062, 100_101]}))
    assert peers.epymarl_tests(tmp_store / "sacred") == {50: 0.0, 50_062: 0.25, 100_101: 0.5}
    mpe = peers.epymarl_row_command("simple_spread_v3")
    assert " env_args.key=pz-mpe-simple-spread-v3 env_args.time_limit=25 " in mpe and "seed=" not in mpe
    monkeypatch.setattr(peers, "run_epymarl", lambda args, tmp: ({50: 0.0, 50_049: 0.1 * args.seed}, 120.0))
    checkout = tmp_store / "epymarl"
    with pytest.raises(SystemExit, match="not an EPyMARL tree"):
        peers.run_epymarl_row("epymarl-lbf-8x8-2p-2f-coop", 2, checkout, sys.executable)
    (checkout / "src").mkdir(parents=True)
    (checkout / "src" / "main.py").write_text("")
    peers.run_epymarl_row("epymarl-lbf-8x8-2p-2f-coop", 2, checkout, sys.executable, jobs=2)
    kept = store.read_rows(store.RUNS / "epymarl-lbf-8x8-2p-2f-coop" / "seed2")
    assert kept == [{"step": 0, "t_env": 50, EVAL: 0.0}, {"step": 50_000, "t_env": 50_049, EVAL: 0.2}]
    summary = store.kept_summary("epymarl-lbf-8x8-2p-2f-coop")
    assert summary["command"].startswith("python src/main.py --config=qmix --env-config=gymma with ")
    assert [(s["final"], s["jobs"]) for s in summary["seeds"]] == [(0.1, 2), (0.2, 2)]


def test_random_actions_on_a_qmix_task_are_kept_reproducibly(tmp_store):
    first = peers.random_baseline("qmix-lbf-8x8-2p-2f-coop", episodes=12)
    assert peers.random_baseline("qmix-lbf-8x8-2p-2f-coop", episodes=12) == first
    assert (first["task"], first["episodes"]) == ("Foraging-8x8-2p-2f-coop-v3", 12) and 0 <= first["positive"] <= 12
    assert json.loads((store.RUNS / "qmix-lbf-8x8-2p-2f-coop" / "random.json").read_text()) == first
    assert "won" not in first  # LBF has no battles


def test_random_actions_on_a_smax_battle_count_the_battles_won(tmp_store):
    pytest.importorskip("jaxmarl")
    floor = peers.random_baseline("qmix-smax-3m", episodes=8)
    assert (floor["task"], floor["episodes"]) == ("smax/3m", 8) and 0 <= floor["won"] <= 8
    assert json.loads((store.RUNS / "qmix-smax-3m" / "random.json").read_text()) == floor


@pytest.mark.slow
def test_a_long_row_stopped_by_sigterm_goes_on_from_its_checkpoint(tmp_path):
    """A real run in a long row's work directory: SIGTERM saves a checkpoint, keeps how far it got with the
    checkpoint and raises Stopped; the next sitting, its work directory gone, rebuilds it from what was kept and
    resumes it to the end, keeps one curve, both sittings' time and the final agent."""
    keys = ("task=CartPole-v1", "world_size=1", "steps=30000", "checkpoint_freq=4096", "eval_episodes=2")
    work, keep = tmp_path / "work", tmp_path / "runs" / "row" / "seed1"
    progress, stopped = tmp_path / "runs" / "row" / training.IN_PROGRESS / "seed1", []

    def first_sitting():
        try:
            training.train_and_keep(keys, 1, keep, "cartpole seed 1", work=work)
        except training.Stopped as e:
            stopped.append(str(e))

    sitting, deadline = threading.Thread(target=first_sitting), time.time() + 120
    sitting.start()
    while not (work / "metrics.jsonl").exists() or not (work / "metrics.jsonl").read_text():
        assert time.time() < deadline and sitting.is_alive(), "the run logged nothing"
        time.sleep(0.1)
    for proc in list(training.LIVE_RUNS):
        proc.send_signal(signal.SIGTERM)
    sitting.join(timeout=120)
    assert stopped and "--resume" in stopped[0] and (work / "checkpoints" / "latest.pt").exists() and not keep.exists()
    so_far, (first,) = store.read_rows(progress), training.sittings(progress)
    assert so_far == store.read_rows(work) and first["machine"] == store.this_machine()
    state = load_checkpoint(progress / training.STATE)  # committed between sittings: the next may be elsewhere
    assert state["step"] == load_checkpoint(work / "checkpoints" / "latest.pt")["step"] > 0
    assert not training.restore_state(progress.parents[1], 1, work)  # the work directory's own checkpoint first
    shutil.rmtree(work)  # the next sitting on another machine: only the repository's files
    assert training.restore_state(progress.parents[1], 1, work) and training.sittings(work) == [first]
    wall = training.train_and_keep(keys, 1, keep, "cartpole seed 1", work=work)
    steps = [r["step"] for r in store.read_rows(keep)]
    assert steps == sorted(set(steps)) and steps[-1] >= 30000 and store.read_rows(keep)[: len(so_far)] == so_far
    assert wall >= first["wall_s"] and len(training.sittings(keep)) == 2
    assert not work.exists() and not progress.parent.exists()
    assert load_checkpoint(tmp_path / "final" / "work.pt")["step"] >= 30000  # the agent, to evaluate again later


def test_a_long_row_refused_at_its_start_fails_with_the_exit_and_leaves_nothing(tmp_path):
    keys = ("algo=tdmpc2", "task=cartpole-swingup", "model_size=3")  # no such size
    with pytest.raises(SystemExit, match="exited 2"):
        training.train_and_keep(keys, 1, tmp_path / "runs" / "row" / "seed1", "row seed 1", work=tmp_path / "work")
    assert not (tmp_path / "work").exists() and not (tmp_path / "runs").exists()


def test_a_long_row_sets_aside_a_lost_attempt_and_a_stop_exits_75(tmp_store, monkeypatch):
    out, work = store.RUNS / "tdmpc2-cartpole-swingup", store.WORK / "tdmpc2-cartpole-swingup" / "seed1"
    assert training.set_aside_lost(out, 1, work) is None  # nothing recorded: nothing to set aside
    for attempt in ("seed1", "seed1-2"):  # no checkpoint in the work directory: the record is lost, each kept
        write_run(out / training.IN_PROGRESS / "seed1", [{"step": 2500}])
        assert training.set_aside_lost(out, 1, work) == out / training.LOST / attempt
    calls = []

    def fake_train(keys, seed, keep, what, env=None, work=None):
        calls.append((seed, work))
        if seed == 2:
            raise training.Stopped(f"{what}: stopped")
        write_run(keep, [{"step": 50_000, EVAL: 800.0}])
        (keep / training.SITTINGS).write_text(json.dumps([3600.0, {"wall_s": 1800.0, "machine": "B"}]))
        return 60.0

    monkeypatch.setattr(training, "train_and_keep", fake_train)
    with pytest.raises(SystemExit) as stop:
        training.run_row("tdmpc2-cartpole-swingup", 2, jobs=2)
    assert stop.value.code == 75 and sorted(calls) == [(s, work.parent / f"seed{s}") for s in (1, 2)]
    (seed,) = store.kept_summary("tdmpc2-cartpole-swingup")["seeds"]
    assert (seed["seed"], seed["jobs"], seed["at_reference"]) == (1, 2, [800.0])
    assert seed["machine"] == "machine not recorded (1.0 h) + B (0.5 h)"
    assert not list((out / training.LOST).iterdir())  # not resuming: no earlier attempt of the seed is kept


# CleanRL's script as the runner sees it: prints its episodes, writes runs/ where it runs, fails once for seed 2
FAKE_CLEANRL = """import os, pathlib, sys
args = sys.argv[1:]
seed, steps = int(args[args.index("--seed") + 1]), int(args[args.index("--total-timesteps") + 1])
assert os.environ["OMP_NUM_THREADS"] == "1" and not pathlib.Path("benchmarks").exists()
pathlib.Path("runs").mkdir()
if seed == 2 and not pathlib.Path(sys.argv[0]).with_name("failed").exists():
    pathlib.Path(sys.argv[0]).with_name("failed").write_text("")
    sys.exit("Traceback: the fake failed")
print("a warning\\nglobal_step=2100, episodic_length=[23]\\nSPS: 100")
for step, ret in ((steps // 2, 10.0 * seed), (steps, 20.0 * seed)):
    print(f"global_step={step}, episodic_return=[ {ret} ]")
"""


def test_cleanrl_runs_its_script_unchanged_and_keeps_each_seed_that_ran(tmp_store, monkeypatch):
    assert peers.cleanrl_episode("global_step=35, episodic_return=[-3.5e+01]") == {"step": 35, TRAIN: -35.0}
    assert peers.cleanrl_row_command("cleanrl-humanoid-v4").endswith("Humanoid-v4 --total-timesteps 1000000 --no-cuda")
    with pytest.raises(SystemExit, match="--cleanrl-python"):
        peers.run_cleanrl_row("cleanrl-humanoid-v4", 1, tmp_store, str(tmp_store / "no-python"))
    with pytest.raises(SystemExit, match="no git checkout, not CleanRL at fe8d8a0"):
        peers.run_cleanrl_row("cleanrl-humanoid-v4", 1, tmp_store, sys.executable)
    checkout = tmp_store / "cleanrl"
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    (checkout / "cleanrl").mkdir(parents=True)
    (checkout / "cleanrl" / "ppo_continuous_action.py").write_text(FAKE_CLEANRL)
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "fake"]):  # the script unchanged since
        subprocess.run([*git, *command], check=True, timeout=60)
    monkeypatch.setattr(peers, "check_checkout", lambda *args: None)
    with pytest.raises(SystemExit, match=r"failed on seed\(s\) \[2\]"):
        peers.run_cleanrl_row("cleanrl-humanoid-v4", 3, checkout, sys.executable, steps=1000)
    seed3 = store.read_rows(store.RUNS / "cleanrl-humanoid-v4" / "seed3")
    assert seed3 == [{"step": 500, TRAIN: 30.0}, {"step": 1000, TRAIN: 60.0}]
    peers.run_cleanrl_row("cleanrl-humanoid-v4", 3, checkout, sys.executable, resume=True, steps=1000)
    summary = store.kept_summary("cleanrl-humanoid-v4")
    assert [(s["train_return"], s["sps"]) for s in summary["seeds"]] == [(20.0, 100), (40.0, 100), (60.0, 100)]
    assert (summary["steps"], summary["cleanrl_commit"]) == (1000, rows.CLEANRL_COMMIT)


FAKE_JAXMARL_PYTHON = """#!/bin/sh
# stands in for JaxMARL's python running jaxmarl_qmix.py: seed K's one greedy test, won 0.K of its battles
while [ $# -gt 0 ]; do case $1 in --out) out=$2;; --seed) seed=$2;; esac; shift; done
[ -n "$out" ] || exit 0
printf '{"step": 24576, "eval/won_mean": 0.%s, "eval/return_mean": 1.0}\\n' "$seed" > "$out/metrics.jsonl"
echo '{"jaxmarl_commit": "c793d09", "seconds": 1.0}' > "$out/result.json"
"""


def test_jaxmarl_qmix_on_smax_is_kept_per_seed_and_tabled_as_a_win_rate(tmp_store, monkeypatch):
    python = tmp_store / "python"
    python.write_text(FAKE_JAXMARL_PYTHON)
    python.chmod(0o755)
    monkeypatch.setattr(peers, "check_checkout", lambda *args: None)
    peers.run_jaxmarl_row("jaxmarl-smax-3m", 2, tmp_store, str(python))
    won = rows.WON
    assert store.read_rows(store.RUNS / "jaxmarl-smax-3m" / "seed2") == [{"step": 24576, won: 0.2, EVAL: 1.0}]
    summary = store.kept_summary("jaxmarl-smax-3m")
    assert [s["final"] for s in summary["seeds"]] == [0.1, 0.2] and summary["jaxmarl_commit"] == rows.JAXMARL_COMMIT
    keep("qmix-smax-3m", {f"seed{s}": [{"step": 500_000, won: 0.8 + s / 10, EVAL: 1.5}] for s in (1, 2)})
    text = page.page()
    where = "JaxMARL `c793d09` run here | win rate, final greedy test at 500k (JaxMARL's at 24.6k) | above | 2 / 2 |"
    assert f"| smax/3m | `qmix-smax-3m` | 0.950 [0.900, 1.000] | 0.150 [0.100, 0.200] | {where}" in text


def test_a_suite_of_one_scale_pools_its_tasks_first_seeds_into_an_aggregate_and_a_profile(tmp_store):
    """SMAX: ddprl's win rates on 3 battles (5 seeds on 3m, whose last two would lift the IQM) against JaxMARL's
    (3 a battle) pool into runs x battles matrices of the first 3 seeds; LBF, not run, says so."""
    ours = {"3m": [0.5, 0.6, 0.7, 1.0, 1.0], "2s3z": [0.4, 0.5, 0.6], "5m_vs_6m": [0.0, 0.1, 0.2]}
    theirs = {"3m": [0.2, 0.3, 0.4], "2s3z": [0.0, 0.1, 0.1], "5m_vs_6m": [0.0, 0.0, 0.0]}
    for battle in ours:
        keep(
            f"qmix-smax-{battle}", {f"seed{s}": [{"step": 500_000, rows.WON: v}] for s, v in enumerate(ours[battle], 1)}
        )
        runs = {f"seed{s}": [{"step": 491_520, rows.WON: v}] for s, v in enumerate(theirs[battle], 1)}
        keep(f"jaxmarl-smax-{battle}", runs, jaxmarl_commit="c793d09")
    text = page.page()
    cells = []
    for side in (ours, theirs):
        matrix = np.array([side[battle][:3] for battle in side]).T
        low, high = page.stats.bootstrap_interval(matrix)
        cells.append(f"{page.stats.iqm(matrix):.3f} [{low:.3f}, {high:.3f}]")
    assert cells[0].startswith("0.440 ")  # the middle 5 of the 9 first seeds: 0.2, 0.4, 0.5, 0.5, 0.6
    line = f"| SMAX, 3 battles | win rate | ddprl | {cells[0]} | JaxMARL `c793d09` run here | {cells[1]} | above |"
    assert f"{line} 3 / 3 a task |" in text
    assert "| LBF, 3 tasks | team return (1: all the food loaded) | ddprl | not run |" in text
    assert (tmp_store / "results" / "across-tasks.png").exists()


def test_mujoco_pools_over_d4rls_tasks_each_on_its_own_random_to_expert_scale(tmp_store):
    """ddprl's and CleanRL's training returns on the 4 tasks D4RL scores map each task's random return to 0 and its
    expert's to 1 before they pool: a raw HalfCheetah return would outweigh a Hopper one."""
    ours = {"HalfCheetah": [2000.0, 3000.0], "Hopper": [2500.0, 2900.0], "Walker2d": [3000.0, 3600.0]}
    ours |= {"Ant": [2400.0, 2800.0]}
    theirs = {"HalfCheetah": [1400.0, 1500.0], "Hopper": [2200.0, 2600.0], "Walker2d": [2000.0, 2600.0]}
    theirs |= {"Ant": [1000.0, 1400.0]}
    tasks, where = "MuJoCo, D4RL's 4 tasks (v4) | D4RL score (0: random, 1: expert)", "CleanRL `fe8d8a0` run here"
    for task in ours:
        name = task.lower() + "-v4"
        keep(f"ppo-{name}", {f"seed{s}": [{"step": 990_000, TRAIN: v}] for s, v in enumerate(ours[task], 1)})
    assert f"| {tasks} | ddprl | — | | not run | — | |" in page.page()  # ddprl kept, CleanRL not yet
    for task in theirs:
        runs = {f"seed{s}": [{"step": 999_000, TRAIN: v}] for s, v in enumerate(theirs[task], 1)}
        keep(f"cleanrl-{task.lower()}-v4", runs, steps=10**6, cleanrl_commit="fe8d8a0")
    text = page.page()
    cells = []
    for side in (ours, theirs):
        low, high = np.array([page.D4RL[f"{task}-v4"] for task in side]).T
        matrix = (np.array([side[task] for task in side]).T - low) / (high - low)
        interval = page.stats.bootstrap_interval(matrix)
        cells.append(f"{page.stats.iqm(matrix):.3f} [{interval[0]:.3f}, {interval[1]:.3f}]")
    assert cells[0].startswith("0.705 ")  # the middle 4 of 8 runs: Ant 2400 and 2800, Walker2d 3000, Hopper 2500
    assert f"| {tasks} | ddprl | {cells[0]} | {where} | {cells[1]} | above | 2 / 2 a task |" in text
    assert "| Ant-v4 | `ppo-ant-v4` | 2600.0 [2400.0, 2800.0] | 1200.0 [1000.0, 1400.0] | CleanRL `fe8d8a0`" in text


def test_the_commands_table_gives_each_row_once_and_rows_differing_in_their_task_alone_one_line():
    lines = page.commands()
    named = [name for line in lines for name in re.findall(r"`([a-z0-9_-]+)`", line.split(" | ")[0])]
    assert sorted(named) == sorted([*rows.ROWS, *rows.SUPERVISED_ROWS])
    mujoco = next(line for line in lines if line.startswith("| `ppo-halfcheetah`, `ppo-hopper`"))
    assert mujoco.endswith("| `ddprl train task=<task> world_size=2 n_steps=1024 batch_size=32` |")
    assert "| `ppo-acrobot` | `ddprl train task=Acrobot-v1 world_size=2 steps=1000000` |" in lines  # alone: its task
    for line in lines:  # each row's own command is the shared one with its task
        shared, names = line.split(" | ")[-1].strip("` |"), re.findall(r"`([a-z0-9_-]+)`", line.split(" | ")[0])
        for name in names:
            row = {**rows.ROWS, **rows.SUPERVISED_ROWS}[name]
            assert shared.replace("task=<task>", f"task={row.key('task')}") == row.command()


def test_a_row_whose_kept_run_ran_other_keys_is_marked_stale_and_counted_apart(tmp_store):
    kept = RESULTS / "runs" / "ppo-cartpole" / "seed1" / "config.yaml"
    keep("ppo-cartpole", {f"seed{s}": [{"step": 100_000, EVAL: 500.0}] for s in (1, 2)})
    for s, lr in ((1, "0.001"), (2, "0.002")):  # the preset's lr, and another
        (store.RUNS / "ppo-cartpole" / f"seed{s}" / "config.yaml").write_text(
            kept.read_text().replace("lr: 0.001\n", f"lr: {lr}\n")
        )
    text = page.page()
    assert "| CartPole-v1 | `ppo-cartpole` (stale: notes) |" in text
    assert "| PPO, classic control | 6 | 0 | 0 | 0 | 5 | 1 |" in text  # its verdict counted as stale alone
    assert "lr: 0.002 -> 0.001 (seed 2)" in " ".join(text.split())
