#!/usr/bin/env bash
# Prepares the build dependencies for a machine without network access (a GPU box): downloads the
# Debian packages of the libraries pagellm builds against, unpacks them into .carry/root, and
# packs that tree into .carry/pkg/deps.tar.gz (small enough to travel with a copy of the repo).
# scripts/gpu-check.sh unpacks the tarball there and points CMake at it when the system lacks
# any of these libraries.
#
#   scripts/carry-deps.sh          (re)build .carry/ on a Debian 12 machine with apt access
#
# Static archives are kept and shared objects removed where Debian ships both (pcre2, utf8proc,
# xxhash), so binaries do not depend on carried shared libraries at run time; sentencepiece only
# ships a shared library (its build tree RUNPATH finds it; gpu-check.sh also sets
# LD_LIBRARY_PATH). Debian 12's libraries need glibc >= 2.34 on the target.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(
  nlohmann-json3-dev
  libpcre2-dev libpcre2-8-0
  libutf8proc-dev libutf8proc2
  libxxhash-dev libxxhash0
  libsentencepiece-dev libsentencepiece0
  libboost1.74-dev
  libyaml-cpp-dev libyaml-cpp0.7
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev libbenchmark1debian
  pkgconf-bin libpkgconf3
)

carry=.carry
rm -rf "$carry/debs" "$carry/root" "$carry/pkg"
mkdir -p "$carry/debs" "$carry/root" "$carry/pkg"
(cd "$carry/debs" && apt-get download "${pkgs[@]}")
for deb in "$carry"/debs/*.deb; do
  dpkg-deb -x "$deb" "$carry/root"
done

lib="$carry/root/usr/lib/x86_64-linux-gnu"
# Prefer the static archives: drop the shared objects of libraries that ship a .a.
for name in pcre2-8 pcre2-16 pcre2-32 pcre2-posix utf8proc xxhash; do
  if [ -f "$lib/lib$name.a" ]; then rm -f "$lib/lib$name.so" "$lib/lib$name.so."*; fi
done
# Nothing a build needs: documentation, manuals, googletest's sources.
rm -rf "$carry/root/usr/share/doc" "$carry/root/usr/share/man" "$carry/root/usr/src"

# pkg-config files say prefix=/usr; rewrite them relative to their own location so the tree works
# wherever it is unpacked (pkgconf understands ${pcfiledir}).
while IFS= read -r pc; do
  dir=$(dirname "$pc")
  rel=$(realpath --relative-to="$dir" "$carry/root/usr")
  sed -i "s|^prefix=/usr\$|prefix=\${pcfiledir}/$rel|" "$pc"
done < <(find "$carry/root" -name '*.pc')

tar -C "$carry" -czf "$carry/pkg/deps.tar.gz" root
rm -rf "$carry/debs"
echo "carry-deps: $(du -sh "$carry/root" | cut -f1) unpacked in $carry/root," \
     "$(du -h "$carry/pkg/deps.tar.gz" | cut -f1) packed in $carry/pkg/deps.tar.gz"
