#!/usr/bin/env bash
# Puts a carried library into DIR/make_inplace (default: this tree): a
# _C*.so, or one compressed with xz (`xz -k _C*.so`: about 4 MB against 30,
# so several builds fit in one carry to the device machine).
#   bash lab/install_lib.sh LIB [DIR]
set -euo pipefail
lib=$1
dir=${2:-$(dirname "$0")/..}
rm -f "$dir"/make_inplace/_C*.so
# The loader looks for make_inplace/_C*.so: a library named otherwise (N.so.xz)
# goes in as _C.so.
name=$(basename "$lib" .xz)
case $name in _C*.so) ;; *) name=_C.so ;; esac
case $lib in
  *.xz) xz -dc "$lib" > "$dir/make_inplace/$name" ;;
  *) cp "$lib" "$dir/make_inplace/$name" ;;
esac
