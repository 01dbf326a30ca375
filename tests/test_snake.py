"""Batched torch Snake (ddprl.envs.snake) against hand-computed boards and the numpy reference."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from ddprl.envs.snake import DELTAS, DOWN, LEFT, RIGHT, UP, SnakeEnv, render_rgb, render_text
from ddprl.envs.snake_gym import SnakeGymEnv


def step(env, actions):
    return env.step(torch.as_tensor(actions, dtype=torch.long))


def body_plane(obs_i):
    return {(r, c): float(v) for (r, c), v in np.ndenumerate(obs_i[1].numpy()) if v > 0}


# --------------------------------------------------------------------------- API surface
def test_spaces_shapes_dtypes():
    env = SnakeEnv(5, grid_size=8)
    obs = env.reset()
    assert obs.shape == (5, 7, 8, 8) and obs.dtype == torch.float32
    assert env.single_observation_space.shape == (7, 8, 8)
    assert env.single_observation_space.dtype == np.float32
    assert env.single_action_space == gym.spaces.Discrete(4)
    assert all(env.single_observation_space.contains(o.numpy()) for o in obs)
    obs, rew, term, trunc, info = step(env, [0, 1, 2, 3, 0])
    assert rew.shape == (5,) and rew.dtype == torch.float32
    assert term.dtype == torch.bool and trunc.dtype == torch.bool
    assert info["final_obs"].shape == (5, 7, 8, 8)
    assert info["episode_return"].dtype == torch.float32
    assert info["episode_length"].dtype == torch.int64
    assert info["episode_score"].dtype == torch.int64
    assert SnakeEnv(2, grid_size=6, obs_mode="compact").reset().shape == (2, 3, 6, 6)
    assert env.max_steps_without_food == 4 * 8 * 8


def test_fresh_start_boards():
    """New episodes: straight length-3 snake, body values 1, 2/3, 1/3, a free cell ahead,
    one food off the snake, and every direction about equally often."""
    g = 5
    env = SnakeEnv(4000, grid_size=g, seed=7)
    obs = env.reset()
    dirs = obs[:, 3:7, 0, 0].argmax(1)
    assert torch.equal(obs[:, 3:7].sum(1), torch.ones(4000, g, g))  # exactly one dir plane
    counts = torch.bincount(dirs, minlength=4)
    assert counts.min() > 850 and counts.max() < 1150  # expected 1000 each, sd ~27
    for i in range(300):
        st = env.get_state(i)
        (hr, hc), d = st["body"][0], st["direction"]
        dr, dc = DELTAS[d]
        assert st["body"] == [(hr - k * dr, hc - k * dc) for k in range(3)]
        assert 0 <= hr + dr < g and 0 <= hc + dc < g
        assert body_plane(obs[i]) == pytest.approx({st["body"][0]: 1.0, st["body"][1]: 2 / 3, st["body"][2]: 1 / 3})
        assert st["food"] not in st["body"] and obs[i, 2].sum() == 1


# --------------------------------------------------------------------------- moves
def test_moves_in_each_direction_and_reversal_is_ignored():
    env = SnakeEnv(8, grid_size=8)
    for i in range(4):  # facing up: body below the head
        env.set_state(i, [(4, 4), (5, 4), (6, 4)], UP, food=(0, 0))
    for i in range(4, 8):  # facing right: body left of the head
        env.set_state(i, [(4, 4), (4, 3), (4, 2)], RIGHT, food=(0, 0))
    obs, rew, term, trunc, _ = step(env, [UP, RIGHT, DOWN, LEFT, UP, RIGHT, DOWN, LEFT])
    # DOWN while facing up and LEFT while facing right are reversals: go straight instead.
    heads = [(3, 4), (4, 5), (3, 4), (4, 3), (3, 4), (4, 5), (5, 4), (4, 5)]
    dirs = [UP, RIGHT, UP, LEFT, UP, RIGHT, DOWN, RIGHT]
    for i in range(8):
        neck_tail = [(4, 4), (5, 4)] if i < 4 else [(4, 4), (4, 3)]
        st = env.get_state(i)
        assert st["body"] == [heads[i]] + neck_tail
        assert st["direction"] == dirs[i]
        assert body_plane(obs[i]) == pytest.approx({heads[i]: 1.0, neck_tail[0]: 2 / 3, neck_tail[1]: 1 / 3})
        assert obs[i, 0, heads[i][0], heads[i][1]] == 1 and obs[i, 0].sum() == 1
        assert obs[i, 3 + dirs[i]].min() == 1 and obs[i, 3:7].sum() == 64
    assert rew.tolist() == [0.0] * 8 and not term.any() and not trunc.any()


def test_eating_grows_by_one_and_tail_stays_that_step():
    env = SnakeEnv(1, grid_size=6)
    env.set_state(0, [(2, 2), (2, 1), (2, 0)], RIGHT, food=(2, 3))
    obs, rew, term, trunc, _ = step(env, [RIGHT])
    assert rew.tolist() == [1.0] and not term[0] and not trunc[0]
    st = env.get_state(0)
    assert st["body"] == [(2, 3), (2, 2), (2, 1), (2, 0)]
    assert body_plane(obs[0]) == {(2, 3): 1.0, (2, 2): 0.75, (2, 1): 0.5, (2, 0): 0.25}
    assert st["food"] not in st["body"] and obs[0, 2].sum() == 1
    assert obs[0, 2, st["food"][0], st["food"][1]] == 1
    env.set_food(0, (0, 5))  # out of the way, so the next step is a plain move
    obs, rew, *_ = step(env, [DOWN])
    assert rew.tolist() == [0.0]
    assert env.get_state(0)["body"] == [(3, 3), (2, 3), (2, 2), (2, 1)]  # length stays 4


def test_hitting_each_wall_terminates_with_pre_move_final_obs():
    env = SnakeEnv(5, grid_size=6, step_penalty=0.25)
    env.set_state(0, [(0, 2), (1, 2), (2, 2)], UP, food=(5, 5))
    env.set_state(1, [(2, 5), (2, 4), (2, 3)], RIGHT, food=(5, 5))
    env.set_state(2, [(5, 2), (4, 2), (3, 2)], DOWN, food=(0, 0))
    env.set_state(3, [(2, 0), (2, 1), (2, 2)], LEFT, food=(5, 5))
    env.set_state(4, [(3, 3), (3, 2), (3, 1)], RIGHT, food=(0, 0))  # control, survives
    before = env.observe()
    obs, rew, term, trunc, info = step(env, [UP, RIGHT, DOWN, LEFT, RIGHT])
    assert term.tolist() == [True] * 4 + [False] and not trunc.any()
    assert rew.tolist() == [-1.0] * 4 + [-0.25]
    assert torch.equal(info["final_obs"][:4], before[:4])
    assert info["episode_return"][:4].tolist() == [-1.0] * 4
    assert info["episode_length"][:4].tolist() == [1] * 4
    assert info["episode_score"][:4].tolist() == [0] * 4
    for i in range(4):  # auto-reset: the returned obs is a fresh length-3 start
        assert len(env.get_state(i)["body"]) == 3 and (obs[i, 1] > 0).sum() == 3
        assert obs[i, 0].sum() == 1 and obs[i, 2].sum() == 1
    assert env.get_state(4)["body"] == [(3, 4), (3, 3), (3, 2)]


def test_hitting_own_body_but_chasing_the_tail_is_legal():
    env = SnakeEnv(2, grid_size=6)
    # Hook of 5: moving down from (2,2) enters (3,2), second to last, still there next step.
    env.set_state(0, [(2, 2), (2, 3), (3, 3), (3, 2), (3, 1)], LEFT, food=(0, 0))
    # Square of 4: moving down enters (3,2), the tail, which leaves this very step.
    env.set_state(1, [(2, 2), (2, 3), (3, 3), (3, 2)], LEFT, food=(0, 0))
    before = env.observe()
    obs, rew, term, trunc, info = step(env, [DOWN, DOWN])
    assert term.tolist() == [True, False] and rew.tolist() == [-1.0, 0.0]
    assert torch.equal(info["final_obs"][0], before[0])
    assert env.get_state(1)["body"] == [(3, 2), (2, 2), (2, 3), (3, 3)]
    assert env.get_state(1)["direction"] == DOWN


def test_growth_is_immediate_so_tail_moves_again_the_step_after_eating():
    """The tail stays put on the eating step only. (The rule "the tail cell is legal unless the
    snake eats" cannot trigger on the eating step itself: food never lies on the snake.)"""
    env = SnakeEnv(1, grid_size=6)
    env.set_state(0, [(0, 0), (0, 1), (1, 1), (2, 1), (2, 0)], LEFT, food=(1, 0))
    _, rew, term, *_ = step(env, [DOWN])
    assert rew.tolist() == [1.0]
    assert env.get_state(0)["body"] == [(1, 0), (0, 0), (0, 1), (1, 1), (2, 1), (2, 0)]
    env.set_food(0, (5, 5))
    _, rew, term, *_ = step(env, [DOWN])  # into (2,0): the tail, leaving now
    assert rew.tolist() == [0.0] and not term[0]
    assert env.get_state(0)["body"] == [(2, 0), (1, 0), (0, 0), (0, 1), (1, 1), (2, 1)]


def test_filling_the_board_is_a_win():
    g = 4
    path = [(r, c) for r in range(g) for c in (range(g) if r % 2 == 0 else range(g - 1, -1, -1))]
    body = path[:-1][::-1]  # 15 cells, head at (3,1), last free cell (3,0)
    env, ref = SnakeEnv(1, grid_size=g), SnakeGymEnv(grid_size=g)
    env.set_state(0, body, LEFT, food=(3, 0))
    ref.set_state(body, LEFT, food=(3, 0))
    obs, rew, term, trunc, info = step(env, [LEFT])
    assert rew.tolist() == [1.0] and term.tolist() == [True] and not trunc[0]
    assert info["episode_score"].tolist() == [1]
    final = info["final_obs"][0]
    assert (final[1] > 0).all() and final[2].sum() == 0 and final[0, 3, 0] == 1
    assert len(env.get_state(0)["body"]) == 3  # auto-reset
    r_obs, r_rew, r_term, r_trunc, _ = ref.step(LEFT)
    assert (r_rew, r_term, r_trunc) == (1.0, True, False)
    np.testing.assert_array_equal(final.numpy(), r_obs)


# --------------------------------------------------------------------------- episodes
def test_truncation_after_steps_without_food():
    env = SnakeEnv(2, grid_size=8, step_penalty=0.1, max_steps_without_food=5)
    env.set_state(0, [(4, 4), (5, 4), (6, 4)], UP, food=(0, 0))
    env.set_state(1, [(4, 4), (5, 4), (6, 4)], UP, food=(5, 5))  # eaten on step 2
    loop = [RIGHT, DOWN, LEFT, UP, RIGHT]  # around the 2x2 square (4..5, 4..5)
    for t, a in enumerate(loop[:4]):
        _, rew, term, trunc, _ = step(env, [a, a])
        assert not term.any() and not trunc.any()
        assert rew.tolist() == pytest.approx([-0.1, 1.0 if t == 1 else -0.1])
    obs, rew, term, trunc, info = step(env, [RIGHT, RIGHT])
    assert trunc.tolist() == [True, False] and not term.any()
    assert body_plane(info["final_obs"][0]) == pytest.approx(
        {(4, 5): 1.0, (4, 4): 2 / 3, (5, 4): 1 / 3}
    )  # post-move board, for bootstrapping
    assert info["episode_length"][0] == 5 and info["episode_score"][0] == 0
    assert float(info["episode_return"][0]) == pytest.approx(-0.5)
    assert len(env.get_state(0)["body"]) == 3 and env.get_state(0)["steps_since_food"] == 0
    # Game 1 ate at step 2 and chased its own tail since: truncated 5 steps after eating.
    assert env.get_state(1)["body"] == [(4, 5), (4, 4), (5, 4), (5, 5)]
    _, _, _, trunc, _ = step(env, [DOWN, DOWN])
    assert not trunc[1]
    _, _, term, trunc, info = step(env, [LEFT, LEFT])
    assert trunc[1] and not term[1]
    assert info["episode_length"][1] == 7 and info["episode_score"][1] == 1
    assert float(info["episode_return"][1]) == pytest.approx(1.0 - 6 * 0.1)


def test_episode_stats_restart_after_auto_reset():
    g, pen = 6, 0.05
    env = SnakeEnv(1, grid_size=g, step_penalty=pen)
    env.set_state(0, [(2, 2), (2, 1), (2, 0)], RIGHT, food=(2, 3))
    step(env, [RIGHT])  # eat
    env.set_food(0, (0, 0))
    for _ in range(2):
        step(env, [RIGHT])
    before = env.observe()
    _, rew, term, _, info = step(env, [RIGHT])  # into the right wall
    assert term[0] and info["episode_length"][0] == 4 and info["episode_score"][0] == 1
    assert float(info["episode_return"][0]) == pytest.approx(1 - 2 * pen - 1)
    assert torch.equal(info["final_obs"][0], before[0])
    # Second episode: move the food off the straight line and drive into the wall ahead.
    st = env.get_state(0)
    (hr, hc), d = st["body"][0], st["direction"]
    dr, dc = DELTAS[d]
    k = {UP: hr + 1, RIGHT: g - hc, DOWN: g - hr, LEFT: hc + 1}[d]  # moves until off-board
    path = {(hr + j * dr, hc + j * dc) for j in range(1, k)}
    env.set_food(0, next((r, c) for r in range(g) for c in range(g) if (r, c) not in path and (r, c) not in st["body"]))
    for j in range(k):
        _, rew, term, _, info = step(env, [d])
        assert bool(term[0]) == (j == k - 1)
    assert info["episode_length"][0] == k and info["episode_score"][0] == 0
    assert float(info["episode_return"][0]) == pytest.approx(-1 - pen * (k - 1))


# --------------------------------------------------------------------------- randomness
def greedy_actions(obs, gen, eps=0.3):
    """Head for the food (so games eat often), with eps random moves."""
    n, _, h, w = obs.shape
    head, food = obs[:, 0].reshape(n, -1).argmax(1), obs[:, 2].reshape(n, -1).argmax(1)
    dr, dc = food // w - head // w, food % w - head % w
    a = torch.where(dr < 0, UP, torch.where(dr > 0, DOWN, torch.where(dc > 0, RIGHT, LEFT)))
    rand = torch.randint(0, 4, (n,), generator=gen)
    return torch.where(torch.rand(n, generator=gen) < eps, rand, a)


def test_food_never_on_snake_and_boards_stay_consistent():
    env = SnakeEnv(256, grid_size=6, seed=1)
    obs, gen, eats = env.reset(), torch.Generator().manual_seed(0), 0
    for _ in range(300):
        obs, rew, term, *_ = env.step(greedy_actions(obs, gen))
        eats += int((rew == 1).sum())
        body = obs[:, 1].reshape(256, -1)
        length = (body > 0).sum(1)
        assert (obs[:, 2] * obs[:, 1]).sum() == 0  # food never under the snake
        assert (obs[:, 2].reshape(256, -1).sum(1) == 1).all()
        assert (obs[:, 0].reshape(256, -1).sum(1) == 1).all()
        assert (obs[:, 0] * obs[:, 1] == obs[:, 0]).all()  # head has body value 1
        # Values are exactly {1/L, ..., L/L}: their sum is (L+1)/2.
        assert torch.allclose(body.sum(1), (length + 1) / 2)
    assert eats > 1000  # the check above ran on many fresh food draws


def test_food_placement_is_uniform_over_free_cells():
    n, g = 3000, 5
    env = SnakeEnv(n, grid_size=g, seed=2)
    for i in range(n):
        env.set_state(i, [(2, 2), (2, 1), (2, 0)], RIGHT, food=(2, 3))
    obs, rew, *_ = step(env, [RIGHT] * n)
    assert (rew == 1).all()
    counts = obs[:, 2].sum(0)  # (g, g)
    snake = [(2, 3), (2, 2), (2, 1), (2, 0)]
    for r in range(g):
        for c in range(g):
            if (r, c) in snake:
                assert counts[r, c] == 0
            else:  # 21 free cells, 3000/21 = 143 expected each, sd about 12
                assert 90 < counts[r, c] < 200


def test_determinism_per_seed():
    def rollout(seed):
        env = SnakeEnv(64, grid_size=7, seed=seed, max_steps_without_food=20)
        gen, out = torch.Generator().manual_seed(5), [env.reset()]
        for _ in range(150):
            obs, rew, term, trunc, info = env.step(torch.randint(0, 4, (64,), generator=gen))
            out += [obs, rew, term, trunc, info["final_obs"], info["episode_return"]]
        return out

    a, b, c = rollout(3), rollout(3), rollout(4)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])
    env = SnakeEnv(64, grid_size=7, seed=3)
    assert torch.equal(env.observe(), a[0])  # usable before reset(), same first board
    env.step(torch.zeros(64, dtype=torch.long))
    assert torch.equal(env.reset(seed=3), a[0])
    assert not torch.equal(env.reset(), a[0])  # without a seed the stream goes on


# --------------------------------------------------------------------------- reference
def random_board(rng, g, max_len):
    """A random self-avoiding snake (head first), its direction and a free food cell."""
    cells = [(int(rng.integers(g)), int(rng.integers(g)))]  # grown from the tail
    for _ in range(int(rng.integers(0, max_len))):
        r, c = cells[-1]
        nxt = [
            (r + dr, c + dc)
            for dr, dc in DELTAS
            if 0 <= r + dr < g and 0 <= c + dc < g and (r + dr, c + dc) not in cells
        ]
        if not nxt:
            break
        cells.append(nxt[int(rng.integers(len(nxt)))])
    body = cells[::-1]
    direction = (
        DELTAS.index((body[0][0] - body[1][0], body[0][1] - body[1][1])) if len(body) > 1 else int(rng.integers(4))
    )
    free = [(r, c) for r in range(g) for c in range(g) if (r, c) not in body]
    return body, direction, free[int(rng.integers(len(free)))]


def reference_action(ref, rng):
    """Mostly a non-fatal move (long snakes, many meals), sometimes any of the four."""
    body, g = list(ref.body), ref.grid_size
    safe = [
        a
        for a in range(4)
        if a != (ref.direction + 2) % 4
        and 0 <= body[0][0] + DELTAS[a][0] < g
        and 0 <= body[0][1] + DELTAS[a][1] < g
        and (body[0][0] + DELTAS[a][0], body[0][1] + DELTAS[a][1]) not in body[:-1]
    ]
    if safe and rng.random() < 0.8:
        return safe[int(rng.integers(len(safe)))]
    return int(rng.integers(4))


@pytest.mark.parametrize("obs_mode,steps", [("planes", 500), ("compact", 150)])
def test_matches_numpy_reference(obs_mode, steps):
    """Same board + same action -> same obs, reward, terminated, truncated, episode stats.

    The two envs draw food from different RNGs, so after each meal the torch draw is checked
    to be a free cell of the *reference's* board and copied into it; after an auto-reset the
    reference is put on the torch env's new board. Everything else must agree bit for bit.
    """
    n, g, limit, pen = 64, 7, 25, 0.01
    rng = np.random.default_rng(0)
    env = SnakeEnv(n, grid_size=g, step_penalty=pen, max_steps_without_food=limit, obs_mode=obs_mode)
    refs = [SnakeGymEnv(g, step_penalty=pen, max_steps_without_food=limit, obs_mode=obs_mode) for _ in range(n)]
    stats = [[np.float32(0), 0, 0] for _ in range(n)]  # return, length, score
    for i, ref in enumerate(refs):
        ref.reset(seed=i)
        body, d, food = random_board(rng, g, 30)
        sff = int(rng.integers(limit))
        env.set_state(i, body, d, food, steps_since_food=sff)
        ref.set_state(body, d, food, steps_since_food=sff)
    np.testing.assert_array_equal(env.observe().numpy(), np.stack([r.observe() for r in refs]))
    seen = dict(eat=0, die=0, trunc=0, reversal=0)
    for _ in range(steps):
        acts = [reference_action(ref, rng) for ref in refs]
        seen["reversal"] += sum(a == (r.direction + 2) % 4 for a, r in zip(acts, refs, strict=True))
        obs, rew, term, trunc, info = step(env, acts)
        obs, rew, term, trunc = obs.numpy(), rew.numpy(), term.numpy(), trunc.numpy()
        for i, ref in enumerate(refs):
            r_obs, r_rew, r_term, r_trunc, _ = ref.step(acts[i])
            assert (rew[i], term[i], trunc[i]) == (np.float32(r_rew), r_term, r_trunc)
            s = stats[i]
            s[0], s[1], s[2] = np.float32(s[0] + np.float32(r_rew)), s[1] + 1, s[2] + (r_rew == 1)
            if r_term or r_trunc:
                seen["die" if r_rew == -1 else "trunc"] += 1
                np.testing.assert_array_equal(info["final_obs"][i].numpy(), r_obs)
                assert info["episode_return"][i] == s[0]
                assert (info["episode_length"][i], info["episode_score"][i]) == (s[1], s[2])
                stats[i] = [np.float32(0), 0, 0]
                ref.set_state(**env.get_state(i))
            elif r_rew == 1:
                seen["eat"] += 1
                food = env.get_state(i)["food"]
                assert food not in ref.body  # a legal draw on the reference's own board
                ref.set_food(food)
            np.testing.assert_array_equal(obs[i], ref.observe())
    # The comparison exercised every kind of transition.
    assert min(seen.values()) > (5 if steps < 300 else 20), seen


def test_gym_env_checks_and_vectorises():
    from gymnasium.utils.env_checker import check_env

    check_env(SnakeGymEnv(grid_size=6), skip_render_check=True)
    venv = gym.vector.SyncVectorEnv([lambda: SnakeGymEnv(grid_size=6) for _ in range(3)])
    obs, _ = venv.reset(seed=0)
    assert obs.shape == (3, 7, 6, 6)
    obs, rew, term, trunc, _ = venv.step(np.array([0, 1, 2]))
    assert rew.shape == (3,)
    venv.close()


# --------------------------------------------------------------------------- rendering
def test_render_text_and_rgb():
    env = SnakeEnv(1, grid_size=5)
    env.set_state(0, [(1, 1), (1, 2), (2, 2), (3, 2)], LEFT, food=(4, 0))
    assert env.render_ascii(0) == "\n".join(
        ["+-----+", "|.....|", "|.<o..|", "|..o..|", "|..t..|", "|*....|", "+-----+"]
    )
    ref = SnakeGymEnv(grid_size=5, render_mode="ansi")
    ref.set_state([(1, 1), (1, 2), (2, 2), (3, 2)], LEFT, food=(4, 0))
    assert ref.render() == env.render_ascii(0)
    img = env.render_rgb(0)
    assert img.shape == (100, 100, 3) and img.dtype == np.uint8
    assert img[30, 30].tolist() == [250, 230, 60]  # head cell (1, 1), away from grid lines
    assert img[90, 10].tolist() == [220, 50, 50]  # food cell (4, 0)
    assert img[70, 50, 1] < img[50, 50, 1] < img[30, 50, 1]  # body fades towards the tail
    assert render_rgb(env.observe()[0], px=1).shape == (5, 5, 3)
    compact = SnakeEnv(1, grid_size=5, obs_mode="compact")
    compact.set_state(0, [(1, 1), (1, 2)], LEFT, food=(0, 0))
    assert render_text(compact.observe()[0]).splitlines()[1:3] == ["|*....|", "|.Ht..|"]


def test_set_state_rejects_illegal_boards():
    env = SnakeEnv(1, grid_size=5)
    with pytest.raises(ValueError):
        env.set_state(0, [(1, 1), (1, 3)], LEFT, food=(0, 0))  # not adjacent
    with pytest.raises(ValueError):
        env.set_state(0, [(1, 1), (1, 2)], RIGHT, food=(0, 0))  # direction vs neck
    with pytest.raises(ValueError):
        env.set_state(0, [(1, 1), (1, 2)], LEFT, food=(1, 2))  # food on the body
    with pytest.raises(ValueError):
        env.set_state(0, [(1, 1), (1, 1)], LEFT, food=(0, 0))  # repeated cell


# --------------------------------------------------------------------------- CUDA
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_and_never_syncs():
    cpu, gpu = SnakeEnv(8, grid_size=8), SnakeEnv(8, grid_size=8, device="cuda")
    for env in (cpu, gpu):
        for i in range(4):
            env.set_state(i, [(4, 4), (5, 4), (6, 4)], UP, food=(0, 0))
        for i in range(4, 8):
            env.set_state(i, [(2, 2), (2, 1), (2, 0)], RIGHT, food=(2, 3))
    acts = [UP, RIGHT, DOWN, LEFT, RIGHT, RIGHT, UP, DOWN]
    c_obs, c_rew, c_term, _, _ = step(cpu, acts)
    g_obs, g_rew, g_term, _, _ = gpu.step(torch.tensor(acts, device="cuda"))
    assert g_obs.device.type == "cuda"
    torch.testing.assert_close(g_rew.cpu(), c_rew)
    for i in range(8):  # food differs after meals (different generators): compare the rest
        assert gpu.get_state(i)["body"] == cpu.get_state(i)["body"]
        keep = [0, 1, 3, 4, 5, 6]
        torch.testing.assert_close(g_obs[i, keep].cpu(), c_obs[i, keep])
    big = SnakeEnv(1024, grid_size=10, device="cuda", seed=0)
    actions = torch.randint(0, 4, (50, 1024), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for t in range(50):
            obs, *_ = big.step(actions[t])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert ((obs[:, 2] * obs[:, 1]).sum() == 0).item()
