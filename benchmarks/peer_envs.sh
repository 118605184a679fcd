#!/usr/bin/env bash
# Creates one virtual environment per peer loader of benchmarks/bench_peers.py, under
# benchmarks/.venvs/ (ignored by git):
#
#   grain  grain + numpy
#   nodes  torchdata (for torchdata.nodes) + torch (CPU build) + numpy
#
# Idempotent: a venv whose stamp file lists the same requirements, and whose packages
# import, is left alone (a re-run takes about a second). The stamp is written last, once
# the install and the import check passed, so a venv left half-made by an interrupted run
# is made again. Prints the versions each venv holds. Needs python3.11 as `python3` (or PYTHON=...).
#
# torch: pip takes torch from the machine's pip configuration (`pip config list`); the
# pin below is the CPU build there. The script refuses a torch built for CUDA rather than
# leave a multi-GiB install behind.
#
# Usage: bash benchmarks/peer_envs.sh [grain] [nodes]   (both by default)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venvs="$here/.venvs"
python="${PYTHON:-python3}"
# numpy is the project venv's version, so that the per-item numpy work costs the same in
# every loader's process.
numpy_pin="numpy==2.4.6"
declare -A requirements=(
  [grain]="grain==0.2.18 $numpy_pin"
  [nodes]="torchdata==0.11.0 torch==2.13.0 $numpy_pin"
)
declare -A check=(
  [grain]="import grain, numpy; print('grain', grain.__version__ if hasattr(grain, '__version__') else '?', '| numpy', numpy.__version__)"
  [nodes]="import torch, torchdata, numpy; from torchdata.nodes import IterableWrapper, ParallelMapper, Loader; assert torch.version.cuda is None, 'torch ' + torch.__version__ + ' is a CUDA build'; print('torchdata', torchdata.__version__, '| torch', torch.__version__, '| numpy', numpy.__version__)"
)

version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [[ "$version" != "3.11" ]]; then
  echo "peer_envs.sh: $python is Python $version; the benchmark compares loaders under Python 3.11 (set PYTHON=...)" >&2
  exit 2
fi

names=("$@")
if [[ ${#names[@]} -eq 0 ]]; then
  names=(grain nodes)
fi
mkdir -p "$venvs"
for name in "${names[@]}"; do
  if [[ -z "${requirements[$name]+x}" ]]; then
    echo "peer_envs.sh: unknown peer '$name'; choose from: ${!requirements[*]}" >&2
    exit 2
  fi
  target="$venvs/$name"
  wanted="${requirements[$name]}"
  if [[ -x "$target/bin/python" && "$(cat "$target/.peer-requirements" 2>/dev/null)" == "$wanted" ]] &&
    "$target/bin/python" -c "${check[$name]}" >/dev/null 2>&1; then
    echo "$name: present ($target): $("$target/bin/python" -c "${check[$name]}" 2>/dev/null)"
    continue
  fi
  echo "$name: installing $wanted into $target" >&2
  rm -rf "$target"
  "$python" -m venv "$target"
  # shellcheck disable=SC2086  # the requirements are words on purpose
  "$target/bin/python" -m pip install --quiet --disable-pip-version-check $wanted
  if ! "$target/bin/python" -c "${check[$name]}" >/dev/null; then
    rm -rf "$target"
    echo "peer_envs.sh: the $name venv installed but its check failed (see above); it was removed" >&2
    exit 1
  fi
  echo "$wanted" >"$target/.peer-requirements" # written last: its presence says the venv is complete
  echo "$name: installed ($target): $("$target/bin/python" -c "${check[$name]}" 2>/dev/null)"
done
