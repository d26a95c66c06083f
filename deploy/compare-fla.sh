#!/usr/bin/env bash
# compare-fla.sh — flash-linear-attention and hyla side by side on one checkpoint, in one run, on a
# GPU machine (issue: long documents faster than anyone). Needs: torch, transformers, triton, FLA's
# source (nothing of it is committed here; fetch it and point FLA_SRC at it) and hyla's binaries.
#
#   FLA_SRC=/path/to/flash-linear-attention HYLA_BIN=build/bin deploy/compare-fla.sh OUTDIR
#
# Makes the 1.68B Gated DeltaNet checkpoint with FLA's save_pretrained (random bf16 weights),
# times FLA's Hugging Face model (prefill 4k to 1M tokens, decode B = 1 and 64), then `hyla-bench e2e`
# on the same directory, and prints one table; OUTDIR/prefill.png plots both (with matplotlib).
# Environment: PREFILL (4096,32768,131072,524288,1048576; a length FLA cannot hold, e.g. 1M on an
# 80 GB GPU, is reported as out of memory; ~5 minutes in all on an H100 for 4k, 32k and 128k,
# checkpoint included, longer with 512k and 1M), BATCH (1,64), DEVICE (cuda:0), MODEL (where the
# checkpoint goes, default OUTDIR/gdn-1.68b: 3.4 GB, so keep it out of a folder that is copied
# back), HYLA_COMMIT (printed in the table's header; default: git describe of this checkout).
# FLA's prefill is one forward over the prompt with use_cache and the last position's logits;
# hyla's is `hyla-bench e2e` feeding the prompt to one session (its prefill pieces, no logits),
# the median of PREFILL_REPEAT (3) such prefills, each a fresh session (FLA's is the mean of 2
# forwards up to 32k, 1 beyond: one 4k prefill moves by several percent from call to call).
# KERNELS (32768,131072; empty to skip): the chunked GLA and GDN kernels alone on one sequence of
# each length, 18 heads of 128 (FLA's chunk_gla / chunk_gated_delta_rule on bf16 inputs against
# `hyla-bench kernels --only seq` on fp32 ones), as rows of the same table.
# PARTS (fla,hyla: both, then the table): which halves to time now; a half left out keeps its
# OUTDIR/fla.jsonl or hyla.jsonl from an earlier call (same OUTDIR and MODEL), so a GPU session
# short of time can run the halves in two calls. The table is written when both files exist.
set -euo pipefail
out=${1:?usage: compare-fla.sh OUTDIR}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
: "${FLA_SRC:?set FLA_SRC to the flash-linear-attention source tree}"
HYLA_BIN=${HYLA_BIN:-$here/../build/bin}
PREFILL=${PREFILL:-4096,32768,131072,524288,1048576}
BATCH=${BATCH:-1,64}
DEVICE=${DEVICE:-cuda:0}
KERNELS=${KERNELS-32768,131072}
PREFILL_REPEAT=${PREFILL_REPEAT:-3}
PARTS=${PARTS:-fla,hyla}
case ",$PARTS," in *,fla,*) do_fla=1 ;; *) do_fla=0 ;; esac
case ",$PARTS," in *,hyla,*) do_hyla=1 ;; *) do_hyla=0 ;; esac
if [ $do_fla = 0 ] && [ $do_hyla = 0 ]; then echo "compare-fla: PARTS=$PARTS names neither fla nor hyla" >&2; exit 2; fi
mkdir -p "$out"
export PYTHONPATH=$FLA_SRC${PYTHONPATH:+:$PYTHONPATH}
model=${MODEL:-$out/gdn-1.68b}
commit=${HYLA_COMMIT:-$(git -C "$here" describe --always --dirty 2>/dev/null || echo unknown)}
[ -f "$model/config.json" ] || python3 "$here/compare_fla.py" make --out "$model"
if [ $do_fla = 1 ]; then
  echo "compare-fla: timing flash-linear-attention" >&2
  python3 "$here/compare_fla.py" fla --model "$model" --prefill "$PREFILL" --batch "$BATCH" --out "$out/fla.jsonl"
  if [ -n "$KERNELS" ]; then
    echo "compare-fla: timing FLA's chunked kernels (KERNELS=$KERNELS)" >&2
    python3 "$here/compare_fla.py" kernels --seq "$KERNELS" --out "$out/fla-kernels.jsonl"
    cat "$out/fla-kernels.jsonl" >> "$out/fla.jsonl"
  fi
fi
if [ $do_hyla = 1 ]; then
  echo "compare-fla: timing hyla" >&2
  "$HYLA_BIN/hyla-bench" e2e --model "$model" --device "$DEVICE" --prefill "$PREFILL" --batch "$BATCH" --ctx 16 \
      --prefill-repeat "$PREFILL_REPEAT" > "$out/hyla.jsonl"
  if [ -n "$KERNELS" ]; then
    echo "compare-fla: timing hyla's chunked kernels (KERNELS=$KERNELS)" >&2
    "$HYLA_BIN/hyla-bench" kernels --device "$DEVICE" --only seq --ctx "$KERNELS" >> "$out/hyla.jsonl"
  fi
fi
for f in fla hyla; do
  if [ ! -s "$out/$f.jsonl" ]; then
    echo "compare-fla: no $out/$f.jsonl yet (PARTS=$PARTS): run the other half into the same OUTDIR for the table" >&2
    exit 0
  fi
done
{
  echo "hyla $commit vs flash-linear-attention $(python3 -c 'import fla; print(fla.__version__)'), $(date -u +%Y-%m-%dT%H:%MZ),"\
       "$(python3 -c 'import torch; print(torch.cuda.get_device_name(0))'); PREFILL=$PREFILL BATCH=$BATCH"
  echo
  python3 "$here/compare_fla.py" table --fla "$out/fla.jsonl" --hyla "$out/hyla.jsonl" --png "$out/prefill.png"
} | tee "$out/table.md"
