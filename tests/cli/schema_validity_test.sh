# Every reply to the JSON-Schema-Test-Suite's schemas validates (schema_validity_test.py).
source "$(dirname "$0")/cli_test_lib.sh"

require_server
require_python openai jsonschema
SUITE=$TESTDATA/json-schema-suite
if ! compgen -G "$SUITE/*.json" >/dev/null; then
  echo "skip: the JSON-Schema-Test-Suite is absent (bash packaging/setup.sh schemasuite)"
  exit 77
fi
require_default_model
require_structured_output "$MODEL"
if python3 "$(dirname "$0")/schema_validity_test.py" "$CLI" "$MODEL" "$SUITE"; then pass; else fail "schema_validity_test.py"; fi
finish
