#!/bin/sh
# collect BINARY: assembles /rootfs, the whole root filesystem of the runtime image: BINARY,
# the shared libraries ldd resolves for it in this (Debian) stage and the dynamic loader, the
# CA bundle, and the nonroot user (65532) with its writable state dir. Runs inside the
# Containerfile's base stage; a library this base lacks, or a glibc older than the one the
# binary was linked against, fails the build here rather than the pod at start.
set -eu
bin=$1
out=/rootfs

status=0
libs=$(ldd "$bin" 2>&1) || status=$?
# "version `GLIBC_2.38' not found": linked against a newer glibc (or libstdc++, libssl) than
# this base has.
if printf '%s\n' "$libs" | grep -q "version .* not found"; then
  printf '%s\n' "$libs" | grep "version .* not found" >&2
  echo "collect: $bin was built on a newer system than BASE_IMAGE: build it on that Debian release, or use a base of the release that built it" >&2
  exit 1
fi
if printf '%s\n' "$libs" | grep -q 'not found'; then
  printf '%s\n' "$libs" | grep 'not found' >&2
  echo "collect: $bin links libraries this base image lacks: add their packages to RUNTIME_PACKAGES" >&2
  exit 1
fi
if [ "$status" -ne 0 ]; then
  printf '%s\n' "$libs" >&2
  echo "collect: ldd $bin failed: is it a dynamically linked binary for this architecture?" >&2
  exit 1
fi
"$bin" --version >/dev/null || { echo "collect: $bin --version fails on this base" >&2; exit 1; }

# Lines are "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" and, for the loader,
# "/lib64/ld-linux-x86-64.so.2 (0x...)"; linux-vdso has no file.
for lib in $(printf '%s\n' "$libs" | sed -n -e 's/^.*=> \(\/[^ ]*\) (0x.*$/\1/p' -e 's/^[[:space:]]*\(\/[^ ]*\) (0x.*$/\1/p'); do
  mkdir -p "$out${lib%/*}"
  cp -L "$lib" "$out$lib"
done
mkdir -p "$out/usr/local/bin"
cp "$bin" "$out/usr/local/bin/"

# OpenSSL (librdkafka) finds the bundle through SSL_CERT_FILE, set in the image, and through
# its default file for programs that clear the environment.
mkdir -p "$out/etc/ssl/certs" "$out/usr/lib/ssl"
cp /etc/ssl/certs/ca-certificates.crt "$out/etc/ssl/certs/"
ln -s /etc/ssl/certs/ca-certificates.crt "$out/usr/lib/ssl/cert.pem"

# The user the pods run as (numeric in the pod spec; named here for tools that look it up).
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin\n' >"$out/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$out/etc/group"
mkdir -p "$out/home/nonroot" "$out/var/lib/eddy" "$out/tmp"
chown 65532:65532 "$out/home/nonroot" "$out/var/lib/eddy"
chmod 1777 "$out/tmp"
