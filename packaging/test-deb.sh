#!/usr/bin/env bash
# Packaging test: build the .deb with CPack, install it into a clean Debian 12 root made by
# debootstrap, run granule-cli --version and the window offscreen there for a few seconds,
# then purge it and check nothing of it is left. Needs root and a Debian mirror: the one this
# system's apt uses for bookworm (its apt sources), or GRANULE_DEB_MIRROR.
#   usage: bash packaging/test-deb.sh [BUILD_DIR]        (default build/, made by setup.sh build)
# Not part of ctest: it downloads a base system (~40 MB) and the package's dependencies.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD=${1:-$ROOT/build}
CACHE=${GRANULE_DEB_TEST_CACHE:-/var/cache/granule-deb-test}

say() { printf '\n==== %s  [%ds]\n' "$*" "$SECONDS"; }
die() { printf 'test-deb.sh: error: %s\n' "$*" >&2; exit 1; }

# The URIs of this system's `deb` sources for bookworm itself (not -updates or -security), in
# the order apt reads them: one-line entries in sources.list and sources.list.d/*.list, then
# deb822 stanzas in sources.list.d/*.sources (Types, URIs, Suites, Enabled).
system_mirrors() {
  local lists=() sources=()
  shopt -s nullglob
  [[ -f /etc/apt/sources.list ]] && lists+=(/etc/apt/sources.list)
  lists+=(/etc/apt/sources.list.d/*.list)
  sources=(/etc/apt/sources.list.d/*.sources)
  shopt -u nullglob
  if ((${#lists[@]} > 0)); then
    awk '{ sub(/#.*/, "") }
      $1 == "deb" {
        i = 2
        if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }  # skip [ options ]
        if ($(i + 1) == "bookworm") print $i
      }' "${lists[@]}"
  fi
  if ((${#sources[@]} > 0)); then
    awk 'function flush() {
           if ((" " types " ") ~ / deb / && tolower(enabled) != "no" && (" " suites " ") ~ / bookworm /) {
             split(uris, u, " "); print u[1]
           }
           types = uris = suites = enabled = key = ""
         }
      FNR == 1 { flush() }
      /^#/ { next }
      /^[ \t]*$/ { flush(); next }
      /^[ \t]/ { if (key == "uris") uris = uris " " $0; else if (key == "suites") suites = suites " " $0; next }
      {
        key = tolower(substr($0, 1, index($0, ":") - 1)); value = substr($0, index($0, ":") + 1)
        if (key == "types") types = value; else if (key == "uris") uris = value
        else if (key == "suites") suites = value; else if (key == "enabled") { enabled = value; gsub(/[ \t]/, "", enabled) }
      }
      END { flush() }' "${sources[@]}"
  fi
}

MIRROR=${GRANULE_DEB_MIRROR:-$(system_mirrors | head -1)}
[[ -n $MIRROR ]] ||
  die "no bookworm source in this system's apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/): set GRANULE_DEB_MIRROR to a Debian mirror"
CHROOT=$(mktemp -d /tmp/granule-deb-root.XXXXXX)
cleanup() {
  for m in proc sys dev/pts dev; do umountpoint "$CHROOT/$m"; done
  rm -rf "$CHROOT"
}
umountpoint() { mountpoint -q "$1" 2>/dev/null && umount -l "$1" || true; }
trap cleanup EXIT

((EUID == 0)) || die "needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null ||
  die "debootstrap is missing and could not be installed"
[[ -f $BUILD/CMakeCache.txt ]] || die "$BUILD is not a build folder: run 'bash packaging/setup.sh build' first"

say "CPack: the .deb"
(cd "$BUILD" && cpack -G DEB >/dev/null) || die "cpack failed"
deb=$(ls -t "$BUILD"/granule_*_amd64.deb | head -1)
printf 'package: %s, %s bytes (%s)\n' "$(basename "$deb")" "$(stat -c %s "$deb")" "$(du -h "$deb" | cut -f1)"

say "A clean Debian 12 root (debootstrap minbase, cached in $CACHE)"
mkdir -p "$CACHE"
if [[ ! -f $CACHE/bookworm-minbase.tar ]]; then
  debootstrap --variant=minbase bookworm "$CHROOT" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 ||
    die "debootstrap failed (see $CACHE/debootstrap.log)"
  tar -C "$CHROOT" -cf "$CACHE/bookworm-minbase.tar" .
else
  tar -C "$CHROOT" -xf "$CACHE/bookworm-minbase.tar"
fi
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\n' "$MIRROR" "$MIRROR" >"$CHROOT/etc/apt/sources.list"
mount -t proc proc "$CHROOT/proc"
mount --bind /dev "$CHROOT/dev"
cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
in_root() { chroot "$CHROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"; }
before=$(in_root dpkg-query -W -f='${Package}\n' | sort)

say "Install"
cp "$deb" "$CHROOT/tmp/granule.deb"
in_root apt-get update -q >/dev/null || die "apt-get update failed in the clean root"
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends /tmp/granule.deb \
  >"$CACHE/install.log" 2>&1 || { tail -20 "$CACHE/install.log"; die "installing the .deb failed"; }
printf 'installed with %s dependency packages\n' "$(($(in_root dpkg-query -W -f='${Package}\n' | wc -l) - $(wc -l <<<"$before") - 1))"
in_root dpkg -L granule | grep -E '^/usr/(bin|share/applications|share/metainfo)/' || true

say "Run: granule-cli --version"
in_root granule-cli --version || die "granule-cli --version failed in the clean root"

say "Run: the window offscreen for 5 s (no GPU, no driver, no model)"
set +e
in_root env QT_QPA_PLATFORM=offscreen XDG_DATA_HOME=/tmp/xdg XDG_RUNTIME_DIR=/tmp/xdg-run \
  timeout -s TERM 5 granule >"$CACHE/gui.log" 2>&1
rc=$?
set -e
tail -5 "$CACHE/gui.log"
# 124: still running when timeout stopped it (what we want); 0: it quit on SIGTERM cleanly.
[[ $rc == 124 || $rc == 0 ]] || die "the window exited with status $rc within 5 s (see $CACHE/gui.log)"
printf 'window ran 5 s and stopped on SIGTERM (status %s)\n' "$rc"

say "Purge"
in_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q --autoremove granule >/dev/null || die "purge failed"
after=$(in_root dpkg-query -W -f='${Package}\n' | sort)
[[ $before == "$after" ]] || { diff <(echo "$before") <(echo "$after") || true; die "packages left after purge"; }
for f in /usr/bin/granule /usr/bin/granule-cli /usr/share/applications/granule.desktop; do
  [[ ! -e $CHROOT$f ]] || die "$f left after purge"
done
echo "purged: the root has the same packages as before and no Granule files"
say "Packaging test passed"
