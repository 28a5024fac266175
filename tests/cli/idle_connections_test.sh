# granule-cli serve answers /health and completions at once beside hundreds of idle or slow
# connections (idle_connections_test.py).
source "$(dirname "$0")/cli_test_lib.sh"

require_server
MODEL=$(loadable_model)
if [[ -z $MODEL ]]; then
  echo "skip: no model (bash packaging/setup.sh model)"
  exit 77
fi
if python3 "$(dirname "$0")/idle_connections_test.py" "$CLI" "$MODEL"; then pass; else fail "idle_connections_test.py"; fi
finish
