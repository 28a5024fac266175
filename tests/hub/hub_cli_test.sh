#!/usr/bin/env bash
# granule-cli search, pull and fit hf:// against the fake hub, and the cross-check that the
# fake speaks the real API: huggingface_hub (when installed in PYDIR) pointed at it with
# HF_ENDPOINT downloads into the same cache that granule-cli then finds without a transfer,
# and finds what granule-cli downloaded.
#   usage: hub_cli_test.sh GRANULE_CLI MAKE_HUB_REPOS FAKE_HUB_PY PYDIR
set -euo pipefail
cli=$1 make_repos=$2 fake_hub=$3 pydir=$4
work=$(mktemp -d)
hub_pid=
cleanup() {
  [[ -n $hub_pid ]] && kill "$hub_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$make_repos" "$work/repos"
python3 "$fake_hub" --root "$work/repos" --idle 120 --lifetime 280 >"$work/port" &
hub_pid=$!
for _ in $(seq 50); do [[ -s $work/port ]] && break; sleep 0.1; done
port=$(awk '/^PORT/ { print $2 }' "$work/port")
[[ -n $port ]] || fail "the fake hub did not start"
export HF_ENDPOINT=http://127.0.0.1:$port HF_HUB_CACHE=$work/cache HF_HOME=$work/hfhome
unset HF_TOKEN
stats() { python3 -c "import json,urllib.request; print(json.load(urllib.request.urlopen('$HF_ENDPOINT/_stats'))['$1'])"; }
control() { python3 -c "import urllib.request,sys; urllib.request.urlopen(urllib.request.Request('$HF_ENDPOINT/_control', data=sys.argv[1].encode(), method='POST'))" "$1"; }

# search: sorted, architecture, support
out=$("$cli" search shaped)
echo "$out"
head -2 <<<"$out" | tail -1 | grep -q '^granule-test/Llama-3-8B-Shaped-GGUF .* llama .*supported' || fail "search order or support"
grep -q 'other-org/Phi-Shaped-GGUF .* phi3 .*not supported' <<<"$out" || fail "unsupported architecture not said"
"$cli" search shaped --sort recent | sed -n 2p | grep -q '^other-org/Phi' || fail "recent order"

# proxies from the environment (curl's http_proxy): the Hub's name does not resolve here,
# so only the proxy (the fake, which answers absolute-URI requests) can serve the search
env -u no_proxy -u NO_PROXY http_proxy="$HF_ENDPOINT" HF_ENDPOINT=http://hub.invalid \
  "$cli" search shaped | grep -q '^granule-test/Llama-3-8B-Shaped-GGUF' || fail "search through http_proxy"

# fit hf://: the header by range, the same numbers as the local file
"$cli" fit "hf://granule-test/Llama-3-8B-Shaped-GGUF/Llama-3-8B-Shaped-Q4_K_M.gguf" --vram-budget 8GiB -c 8192 --json >"$work/remote.json" 2>"$work/remote.err"
cat "$work/remote.err"
grep -q 'read the header of .* in [0-9]* range requests' "$work/remote.err" || fail "fit hf:// did not say what it read"
"$cli" fit "$work/repos/granule-test/Llama-3-8B-Shaped-GGUF/Llama-3-8B-Shaped-Q4_K_M.gguf" --vram-budget 8GiB -c 8192 --json >"$work/local.json"
python3 - "$work/remote.json" "$work/local.json" <<'PY' || fail "remote and local fit differ"
import json, sys
r, l = (json.load(open(p)) for p in sys.argv[1:3])
for k in ("resident_layers", "streamed_layers", "weights_bytes", "kv_capacity_tokens", "block_type", "file_bytes", "verdict"):
    assert r[k] == l[k], (k, r[k], l[k])
PY
[[ $(stats body_bytes) -lt $((16 << 20)) ]] || fail "fit hf:// read more than 16 MiB"

# errors
"$cli" pull granule-test/Gated-Tiny-GGUF 2>"$work/err" && fail "gated pull worked without a token"
grep -q 'wants a token' "$work/err" || { cat "$work/err"; fail "401 message"; }
"$cli" pull granule-test/Nope-GGUF 2>"$work/err" && fail "missing repo pulled"
grep -q 'not found on the Hub' "$work/err" || { cat "$work/err"; fail "404 message"; }
"$cli" pull granule-test/Tiny-Chat-GGUF:Q2_K 2>"$work/err" && fail "missing quant pulled"
grep -q 'has no Q2_K GGUF; it has Q8_0, F32' "$work/err" || { cat "$work/err"; fail "quant list message"; }
control '{"rate_limit": 3, "retry_after": 7200}'
"$cli" search tiny 2>"$work/err" && fail "rate-limited search worked"
grep -q 'rate-limited by the Hub; retry in 7200 s' "$work/err" || { cat "$work/err"; fail "429 message"; }
control '{"reset": true}'

# pull with a token, then pull again: a cache hit
path=$(HF_TOKEN=hf_granule_test "$cli" pull granule-test/Gated-Tiny-GGUF:Q8_0)
[[ -f $path && $path == "$HF_HUB_CACHE"/models--granule-test--Gated-Tiny-GGUF/snapshots/*/Gated-Tiny-Q8_0.gguf ]] || fail "pull path $path"
cmp "$path" "$work/repos/granule-test/Gated-Tiny-GGUF/Gated-Tiny-Q8_0.gguf" || fail "pulled bytes differ"
# pull without a quant: the largest that fits (both tiny ones fit; F32 is larger)
path=$("$cli" pull granule-test/Tiny-Chat-GGUF 2>"$work/err")
grep -q 'taking F32, the largest that fits' "$work/err" || { cat "$work/err"; fail "recommendation"; }
"$cli" info "$path" >/dev/null || fail "the pulled model does not open"

# the cross-check with huggingface_hub
if ! PYTHONPATH=$pydir python3 -c 'import huggingface_hub' 2>/dev/null; then
  echo "SKIP: huggingface_hub is not installed in $pydir (bash packaging/setup.sh pydeps): cross-check not run"
  exit 77
fi
control '{"reset": true}'
hf_path=$(PYTHONPATH=$pydir HF_HUB_DISABLE_XET=1 HF_HUB_DISABLE_TELEMETRY=1 python3 -c '
import huggingface_hub, sys
print(huggingface_hub.hf_hub_download("granule-test/Tiny-Chat-GGUF", "Tiny-Chat-Q8_0.gguf"))')
echo "huggingface_hub $(PYTHONPATH=$pydir python3 -c 'import huggingface_hub as h; print(h.__version__)') downloaded $hf_path"
sent=$(stats body_bytes)
[[ $sent -eq $(stat -c %s "$work/repos/granule-test/Tiny-Chat-GGUF/Tiny-Chat-Q8_0.gguf") ]] || fail "huggingface_hub fetched $sent bytes"
control '{"reset": true}'
path=$("$cli" pull granule-test/Tiny-Chat-GGUF:Q8_0 2>"$work/err")
cat "$work/err"
[[ $path == "$hf_path" ]] || fail "granule-cli found $path, huggingface_hub wrote $hf_path"
[[ $(stats body_bytes) -eq 0 ]] || fail "granule-cli downloaded again what huggingface_hub had"
# ... and huggingface_hub finds what granule-cli downloaded (offline: no request)
got=$(PYTHONPATH=$pydir HF_HUB_OFFLINE=1 python3 -c '
import huggingface_hub
print(huggingface_hub.hf_hub_download("granule-test/Gated-Tiny-GGUF", "Gated-Tiny-Q8_0.gguf"))')
[[ -f $got ]] || fail "huggingface_hub did not find granule-cli's download"
# huggingface_hub's file listing of the fake, as a check of the fields it reads
PYTHONPATH=$pydir python3 - <<'PY' || fail "huggingface_hub could not read the fake's listing or search"
import huggingface_hub as h
api = h.HfApi()
files = {f.path: f for f in api.list_repo_tree("granule-test/Llama-3-8B-Shaped-GGUF", recursive=True)}
q4 = files["Llama-3-8B-Shaped-Q4_K_M.gguf"]
assert q4.lfs is not None and len(q4.lfs.sha256) == 64 and q4.size > 5e9, q4
models = list(api.list_models(search="shaped", filter="gguf", sort="downloads", expand=["downloads", "gguf"]))
assert [m.id for m in models][0] == "granule-test/Llama-3-8B-Shaped-GGUF", models
assert models[0].gguf["architecture"] == "llama"
print("huggingface_hub reads the fake's tree and search:", len(files), "files,", len(models), "models")
PY
echo "PASS"
