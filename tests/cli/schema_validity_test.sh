# Every reply to the JSON-Schema-Test-Suite's schemas validates (schema_validity_test.py).
source "$(dirname "$0")/cli_test_lib.sh"

if ! "$CLI" serve --help 2>/dev/null | grep -q -- "--api-key"; then
  echo "skip: this granule-cli was built without the server (cpp-httplib, libcpp-httplib-dev, not found)"
  exit 77
fi
export PYTHONPATH="${XDG_DATA_HOME:-$HOME/.local/share}/granule/python${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c 'import openai, jsonschema' 2>/dev/null; then
  echo "skip: the openai or jsonschema Python package is absent (bash packaging/setup.sh pydeps)"
  exit 77
fi
SUITE=$TESTDATA/json-schema-suite
if ! compgen -G "$SUITE/*.json" >/dev/null; then
  echo "skip: the JSON-Schema-Test-Suite is absent (bash packaging/setup.sh schemasuite)"
  exit 77
fi
MODEL=$(default_model)
if [[ -z $MODEL ]]; then
  echo "skip: the default model is absent (bash packaging/setup.sh model)"
  exit 77
fi
if ! "$CLI" info "$MODEL" | grep -qi "structured output: *yes"; then
  echo "skip: this build has no structured output (bash packaging/setup.sh xgrammar, then rebuild)"
  exit 77
fi
if python3 "$(dirname "$0")/schema_validity_test.py" "$CLI" "$MODEL" "$SUITE"; then pass; else fail "schema_validity_test.py"; fi
finish
