"""``StarCraft2Env`` with SMAC's interface: reset() -> (obs, state); step(actions) -> (reward,
terminated, info) with info["battle_won"]; get_obs/get_state/get_avail_actions/get_env_info;
death_tracker_ally/enemy; render(mode); close(). The battle: an ally attacking enemy j (action
6 + j) takes one of its 3 hit points; every living enemy takes one of a random living ally's 5."""

import numpy as np

from smac.env.starcraft2.maps import get_map_params


class StarCraft2Env:
    def __init__(self, map_name="8m", seed=None, continuing_episode=False, reward_scale=True, **kwargs):
        params = get_map_params(map_name)
        self.map_name, self._seed, self.continuing_episode = map_name, seed, continuing_episode
        self.n_agents, self.n_enemies, self.episode_limit = params["n_agents"], params["n_enemies"], params["limit"]
        self.n_actions = 6 + self.n_enemies
        self.reward_scale = reward_scale
        self._rng = None
        self.launches = 0

    def get_total_actions(self):
        return self.n_actions

    def get_obs_size(self):
        return 4 + 2 * self.n_enemies + self.n_agents

    def get_state_size(self):
        return self.n_agents + self.n_enemies

    def get_env_info(self):
        return {
            "state_shape": self.get_state_size(),
            "obs_shape": self.get_obs_size(),
            "n_actions": self.get_total_actions(),
            "n_agents": self.n_agents,
            "episode_limit": self.episode_limit,
        }

    def reset(self):
        if self._rng is None:  # SMAC launches the game on the first reset, with the seed
            self._rng = np.random.default_rng(self._seed)
            self.launches += 1
        self.ally_health = np.full(self.n_agents, 5)
        self.enemy_health = np.full(self.n_enemies, 3)
        self.death_tracker_ally = np.zeros(self.n_agents)
        self.death_tracker_enemy = np.zeros(self.n_enemies)
        self.offset = self._rng.uniform(-1, 1)
        self._steps = 0
        return self.get_obs(), self.get_state()

    def get_avail_agent_actions(self, agent_id):
        avail = [0] * self.n_actions
        if self.ally_health[agent_id] <= 0:
            avail[0] = 1
            return avail
        avail[1:6] = [1] * 5
        for j in range(self.n_enemies):
            avail[6 + j] = int(self.enemy_health[j] > 0)
        return avail

    def get_avail_actions(self):
        return [self.get_avail_agent_actions(i) for i in range(self.n_agents)]

    def get_obs_agent(self, agent_id):
        own = [self.ally_health[agent_id] / 5, self.offset, float(agent_id), float(self._steps) / self.episode_limit]
        enemies = np.stack([self.enemy_health / 3, self.enemy_health > 0], axis=1).reshape(-1)
        return np.concatenate([own, enemies, self.ally_health / 5]).astype(np.float32)

    def get_obs(self):
        return [self.get_obs_agent(i) for i in range(self.n_agents)]

    def get_state(self):
        return np.concatenate([self.ally_health / 5, self.enemy_health / 3]).astype(np.float32)

    def step(self, actions):
        actions = [int(a) for a in actions]
        for i, a in enumerate(actions):
            assert self.get_avail_agent_actions(i)[a] == 1, f"Agent {i} cannot perform action {a}"
        before = self.enemy_health.clip(0).sum()
        for a in actions:
            if a >= 6:
                self.enemy_health[a - 6] -= 1
        for _ in range(int((self.enemy_health > 0).sum())):
            alive = np.flatnonzero(self.ally_health > 0)
            if len(alive):
                self.ally_health[self._rng.choice(alive)] -= 1
        self.death_tracker_ally = (self.ally_health <= 0).astype(float)
        self.death_tracker_enemy = (self.enemy_health <= 0).astype(float)
        self._steps += 1
        reward = float(before - self.enemy_health.clip(0).sum()) / 3
        info = {"battle_won": False}
        terminated = False
        if self.death_tracker_enemy.all() and not self.death_tracker_ally.all():
            terminated, info["battle_won"] = True, True
            reward += 2.0
        elif self.death_tracker_ally.all() or self.death_tracker_enemy.all():
            terminated = True
        elif self._steps >= self.episode_limit:
            terminated = True
            if self.continuing_episode:
                info["episode_limit"] = True
        if self.reward_scale:
            reward /= (self.n_enemies + 2.0) / 20
        return reward, terminated, info

    def render(self, mode="human"):
        frame = np.zeros((32, 32, 3), dtype=np.uint8)
        frame[:, :16, 2] = int(255 * self.ally_health.clip(0).mean() / 5)
        frame[:, 16:, 0] = int(255 * self.enemy_health.clip(0).mean() / 3)
        return frame

    def close(self):
        pass
