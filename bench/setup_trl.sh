#!/usr/bin/env bash
# Build bench/.trl-venv: TRL for bench/trl_compare.py, isolated from the project's .venv.
#
# torch is pinned to the CPU wheel first (2.13.0+cpu, ~200 MB), so that installing trl can never
# pull a CUDA build of torch (several GB with its nvidia-* packages); the script stops if the
# dry run of `pip install trl` would bring in any nvidia-* package or another torch.
set -euo pipefail
cd "$(dirname "$0")"
VENV=.trl-venv
TORCH="torch==2.13.0"
python3 -m venv "$VENV"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
"$PIP" install -q "$TORCH"   # the CPU wheel: /opt/wheels (pip find-links) on this machine
"$VENV/bin/python" -c "import torch; assert '+cpu' in torch.__version__ or not torch.cuda.is_available(), torch.__version__; print('torch', torch.__version__)"
PLAN=$("$PIP" install --dry-run trl 2>&1)
if echo "$PLAN" | grep -Eiq "nvidia-|Would install.* torch-"; then
  echo "refusing: installing trl would pull CUDA packages or another torch:"; echo "$PLAN" | tail -3; exit 1
fi
"$PIP" install -q trl psutil
"$VENV/bin/python" -c "import trl, transformers, torch; print('trl', trl.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"
