#!/usr/bin/env bash
# The BLAS candidates side by side: GFLOP/s of float32 GEMM for the peer models'
# products (bench/blas_gemm.c), each library in its own process, configurations
# interleaved, median of ROUNDS rounds. Single-threaded and timed in process CPU time,
# so that other load on a shared machine changes little. Needs the candidates:
#   apt-get install libopenblas0-pthread libopenblas0-openmp libblis4-openmp libdnnl2
# Run: bash bench/blas.sh [ROUNDS]    (about 1 minute per round)
set -u
cd "$(dirname "$0")/.."
rounds=${1:-3}
L=/usr/lib/$(gcc -print-multiarch)
bin=$(mktemp -d)/blas_gemm
cc -O2 -o "$bin" bench/blas_gemm.c -ldl || exit 1
configs=(
  "openblas-pthread|$L/openblas-pthread/libopenblas.so.0|cblas|"
  "openblas-openmp|$L/openblas-openmp/libopenblas.so.0|cblas|"
  "openblas-openmp+Prescott|$L/openblas-openmp/libopenblas.so.0|cblas|Prescott"
  "openblas-openmp+Haswell|$L/openblas-openmp/libopenblas.so.0|cblas|Haswell"
  "blis-openmp|$L/blis-openmp/libblis.so.4|cblas|"
  "onednn|$L/libdnnl.so.2|dnnl|"
)
out=$(mktemp)
for r in $(seq "$rounds"); do
  for c in "${configs[@]}"; do
    IFS='|' read -r name lib kind core <<<"$c"
    [ -e "$lib" ] || continue
    env -u OPENBLAS_CORETYPE ${core:+OPENBLAS_CORETYPE=$core} CPUT=1 OMP_NUM_THREADS=1 \
      OPENBLAS_NUM_THREADS=1 BLIS_NUM_THREADS=1 "$bin" "$lib" "$kind" | sed "s/^/$name /" >> "$out"
  done
done
echo "GFLOP/s, 1 thread, CPU time, median of $rounds rounds; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
awk '{ v[$1" "$2] = v[$1" "$2] " " $3; if (!($1 in seen)) { seen[$1]; libs[++nl] = $1 } if (!($2 in sh)) { sh[$2]; shapes[++ns] = $2 } }
  function median(s,   a, n, i, j, t) { n = split(s, a, " "); for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
  END { printf "%-26s", "library"; for (j = 1; j <= ns; j++) printf " %14s", shapes[j]; print ""
        for (i = 1; i <= nl; i++) { printf "%-26s", libs[i]; for (j = 1; j <= ns; j++) printf " %14.1f", median(v[libs[i]" "shapes[j]]); print "" } }' "$out"
rm -f "$out" "$bin"
