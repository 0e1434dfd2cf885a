# Source this on a GPU machine that has torch, numba and numba-cuda but no network (see docs/howto):
#   source tests/gpu/setup_env.sh
# It puts numpy 2.4 (numba-cuda 0.30 breaks on numpy 2.5) and this project on the path from wheels
# carried in .whl/ (download them with the command in tests/gpu/README.md).
set -e
site=/tmp/numba-flash-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/numpy-2.4*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --upgrade --target "$site" . >/dev/null
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
python3 -c "import numpy, numba, numba_flash; print('numpy', numpy.__version__, '| numba', numba.__version__, '|', numba_flash.describe())"
set +e
