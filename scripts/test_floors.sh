#!/usr/bin/env bash
# Run the remote tier's tests on the oldest `redis` and `hiredis` that pyproject.toml allows
# (or on REDIS_FLOOR / HIREDIS_FLOOR), to keep those floors true. The two packages go into a
# temporary directory put first on PYTHONPATH: the project's .venv is left as it is.
# Extra arguments go to pytest (e.g. -k tls). Needs network access to the package index.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
floor() { sed -n "s/^ *\"$1>=\([0-9.]*\)\".*/\1/p" pyproject.toml; }
REDIS=${REDIS_FLOOR:-$(floor redis)}
HIREDIS=${HIREDIS_FLOOR:-$(floor hiredis)}
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
"$PY" -m pip install -q --no-deps --target "$DIR" "redis==$REDIS" "hiredis==$HIREDIS"
export PYTHONPATH="$DIR:$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import redis, hiredis; print('test-floors: redis', redis.__version__, 'hiredis', hiredis.__version__, 'from', redis.__file__)"
"$PY" -m pytest -q -p no:cacheprovider tests/tiers/remote/test_remote_tier.py \
  tests/tiers/remote/test_remote_tls.py tests/tiers/remote/test_secrets.py "$@"
