#!/usr/bin/env bash
# The Debian packages the build needs that the GPU machine lacks and cannot download (it has no
# network): fetched here with apt-get download and unpacked into .cache/gpu-deps (ignored), which
# the device tool carries (carry [".cache/gpu-deps"]) and scripts/gpu-check.sh puts on the paths.
# Today: cpp-httplib (cpfill serve), brotli, and the headers its httplib.h includes (openssl, zlib,
# brotli); gpu-check.sh adds the include folders to CPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=.cache/gpu-deps
rm -rf "$dest" && mkdir -p "$dest/debs"
(cd "$dest/debs" && apt-get download libcpp-httplib-dev libcpp-httplib0.11 libbrotli1 \
    libbrotli-dev libssl-dev zlib1g-dev 2>/dev/null)
for deb in "$dest"/debs/*.deb; do dpkg -x "$deb" "$dest"; done
rm -rf "$dest/debs" "$dest/usr/share"
find "$dest" -name "*.a" -delete
# Links become copies (the device tool carries plain files only); links to libraries of packages
# not fetched (libssl.so → libssl.so.3: the machine's own) are dropped.
find "$dest" -type l | while read -r link; do
    target=$(readlink -f "$link")
    if [ -f "$target" ]; then cp --remove-destination "$target" "$link"; else rm "$link"; fi
done
echo "fetch-gpu-deps: $(du -sh "$dest" | cut -f1) in $dest"
