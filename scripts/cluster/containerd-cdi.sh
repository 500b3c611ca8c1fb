#!/usr/bin/env bash
# A CDI-capable containerd for scripts/cluster/cluster.sh, beside the host's own: Debian 13's
# containerd 1.7 package (it depends only on runc and libc6 >= 2.34, so it runs on Debian 12) is
# downloaded with apt and unpacked into DEST, never installed: the host's containerd 1.6, its
# files and apt's own configuration stay as they are.
#
#   scripts/cluster/containerd-cdi.sh [DEST]     # default /opt/containerd-1.7; root; about 10 s
#   CONTAINERD_BIN=/opt/containerd-1.7/usr/bin scripts/cluster/cluster.sh up
#
# apt runs with a private configuration under DEST.apt (a trixie source only, its own lists and
# cache), so nothing is added to /etc/apt. VERSION pins the package version (default: trixie's).
set -euo pipefail

DEST=${1:-/opt/containerd-1.7}
SUITE=${SUITE:-trixie}
VERSION=${VERSION:-}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

die() { echo "containerd-cdi.sh: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "needs root (apt-get)"
if [ -x "$DEST/usr/bin/containerd" ]; then
  echo "containerd-cdi.sh: $("$DEST/usr/bin/containerd" --version) already in $DEST" >&2
  exit 0
fi
apt=$DEST.apt
rm -rf "$apt"
mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/sources.list.d" "$apt/preferences.d"
cat >"$apt/sources.list.d/$SUITE.sources" <<SOURCES
Types: deb
URIs: $DEBIAN_MIRROR
Suites: $SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
opts=(-o "Dir::Etc::sourcelist=/dev/null" -o "Dir::Etc::sourceparts=$apt/sources.list.d"
  -o "Dir::Etc::preferencesparts=$apt/preferences.d" -o "Dir::State::lists=$apt/lists"
  -o "Dir::Cache=$apt/cache" -o "Dir::Cache::archives=$apt/cache/archives"
  -o "APT::Sandbox::User=root")
apt-get "${opts[@]}" -qq update
(cd "$apt" && apt-get "${opts[@]}" -qq download "containerd${VERSION:+=$VERSION}")
deb=$(ls "$apt"/containerd_*.deb)
mkdir -p "$DEST"
dpkg-deb -x "$deb" "$DEST"
rm -rf "$apt"
"$DEST/usr/bin/containerd" --version >&2
echo "containerd-cdi.sh: unpacked into $DEST: CONTAINERD_BIN=$DEST/usr/bin" >&2
