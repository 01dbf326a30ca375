#!/usr/bin/env bash
# Wheels that ddprl needs on a GPU machine which has PyTorch, a CUDA JAX (with flax, optax,
# chex), tensorboard, tqdm, imageio, matplotlib, seaborn and nvidia-ml-py but no package index:
# Python 3.12, manylinux x86-64. Writes them to .whl/ (git-ignored), small enough to travel with
# the working tree (64 MiB together with the tracked files, which the kept result runs make
# ~27 MB). Left out of the wheels, as the Control Suite and the benchmarks never load them:
# dm_control's locomotion and test assets (~40 MB), MuJoCo's experimental "studio" viewer
# (16 MB) and labmaze's maze textures (5 MB). Versions are the
# ones the dev extras resolve to here (gymnasium 1.3: gymnax 1.0.1 pins it below 1.4).
#
#   bash scripts/gpu_wheels.sh            # then, on the GPU machine: bash benchmarks/gpu_session.sh ...
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
rm -rf .whl && mkdir -p .whl
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
# ddprl itself; DeepMind Control; VMAS (it imports gym); the JAX engine's gymnax and brax/MJX
for req in gymnasium==1.3.0 farama-notifications==0.0.6 hydra-core==1.3.8 omegaconf==2.3.1 \
           mujoco==3.17.0 dm-control==1.0.50 dm-env==1.6 dm-tree==0.1.10 labmaze==1.0.6 glfw==2.11.0 pyopengl==3.1.10 \
           pyglet==1.5.27 six==1.17.0 gym-notices==0.0.8 \
           gymnax==1.0.1 brax==0.14.2 mujoco-mjx==3.17.0 jaxopt==0.8.5 trimesh==5.2.0; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d .whl "$req"
done
# antlr4 (hydra's parser), vmas and gym (VMAS imports its spaces) are published as source
# archives only; all three are pure Python.
"$PY" -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3 vmas==1.5.2 gym==0.26.2

"$PY" - <<'EOF'
"""Repack wheels without the data files ddprl never loads (their Python files stay)."""
import base64, glob, hashlib, os, zipfile

DROP = {
    "dm_control-*.whl": ("dm_control/locomotion/", "dm_control/mujoco/testing/", "dm_control/mjcf/test_assets/",
                         "dm_control/blender/"),
    "mujoco-3*.whl": ("mujoco/experimental/",),
    "labmaze-*.whl": ("labmaze/assets/",),
}
for pattern, prefixes in DROP.items():
    src = glob.glob(".whl/" + pattern)[0]
    tmp = src + ".tmp"
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        kept = []
        for info in zin.infolist():
            name = info.filename
            if name == record_name or (name.startswith(prefixes) and not name.endswith(".py")):
                continue
            data = zin.read(name)
            zout.writestr(info, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            kept.append(f"{name},sha256={digest},{len(data)}")
        zout.writestr(record_name, "\n".join(kept + [f"{record_name},,"]) + "\n")
    os.replace(tmp, src)
EOF
du -sh .whl
ls .whl
