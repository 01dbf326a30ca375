from smac.env.starcraft2.maps import smac_maps


def get_map_params(map_name):
    return smac_maps.get_smac_map_registry()[map_name]
