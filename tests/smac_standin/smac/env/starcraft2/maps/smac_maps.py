map_param_registry = {
    "3m": {"n_agents": 3, "n_enemies": 3, "limit": 60, "a_race": "T", "b_race": "T", "unit_type_bits": 0},
    "2s3z": {"n_agents": 5, "n_enemies": 5, "limit": 120, "a_race": "P", "b_race": "P", "unit_type_bits": 2},
}


def get_smac_map_registry():
    return map_param_registry
