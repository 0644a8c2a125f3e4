#!/usr/bin/env bash
# scripts/asr-adapt/adapt.sh [OUT_DIR]
#
# MAP-adapts PocketSphinx's en-us acoustic model (Debian pocketsphinx-en-us)
# to Flite's `slt` voice, for `arbiter bench modalities --asr-path OUT_DIR`
# (docs/BENCHMARKS.md "Modalities"). This is adaptation to one deterministic
# TTS voice, not to human speakers: the demo's `asr` model stays en-us.
#
#   1. en-us's `sendump` -> Sphinx-3 `mixture_weights` (sendump2mixw.py) and a
#      text mdef, which SphinxTrain needs;
#   2. the adaptation text (harvard-lists-3-18.txt + extra-sentences.txt, 329
#      sentences) is checked to share no sentence with the bench's test set
#      (Harvard lists 1-2, read from bench/modalities_bench.cc) and to have no
#      word outside the dictionary, then spoken with `flite -voice slt`
#      (the lists 3-18 text may differ from the canonical Harvard wording in
#      places; flite reads exactly this text, so that does not matter; the
#      extra sentences are everyday sentences written for this);
#   3. sphinx_fe features, then 2 MAP iterations: bw + map_adapt on en-us,
#      bw + map_adapt again with the first result as the prior;
#   4. OUT_DIR is laid out like /usr/share/pocketsphinx/model/en-us, which is
#      what a pocketsphinx model's `path` must be (src/backends/pocketsphinx.cc):
#        OUT_DIR/en-us/               the adapted acoustic model (feat.params,
#                                     mdef, noisedict, means, variances,
#                                     mixture_weights, transition_matrices)
#        OUT_DIR/en-us.lm.bin         -> the Debian file (symlink)
#        OUT_DIR/cmudict-en-us.dict   -> the Debian file (symlink)
#        OUT_DIR/en-us-phone.lm.bin   -> the Debian file (symlink; for vad)
#
# Default OUT_DIR: ${XDG_CACHE_HOME:-$HOME/.cache}/arbiter/asr-en-us-slt.
# Built in OUT_DIR.tmp.<pid> and renamed into place (an existing OUT_DIR is
# replaced only when the new one is complete); the intermediate audio,
# features, converted base model and accumulators (≈ 90 MB) are deleted.
# About 40 s on a 2-core VM; OUT_DIR then holds 12 MB. Deterministic: a
# second run writes byte-identical model files.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/arbiter/asr-en-us-slt}
out=${out%/}
model=/usr/share/pocketsphinx/model/en-us
st=/usr/lib/sphinxtrain
dict=$model/cmudict-en-us.dict
bench_src=$repo/bench/modalities_bench.cc
adapt_text=("$here/harvard-lists-3-18.txt" "$here/extra-sentences.txt")

log() { echo "adapt: [$(( SECONDS ))s] $*"; }
die() { echo "adapt: $*" >&2; exit 1; }

# ---- prerequisites ---------------------------------------------------------
missing=()
need() {  # need PACKAGE FILE... : PACKAGE is missing unless every FILE exists
  local pkg=$1 f; shift
  for f in "$@"; do
    if [[ ! -e $f ]]; then missing+=("$pkg"); return; fi
  done
}
need_cmd() {  # need_cmd PACKAGE COMMAND : PACKAGE is missing unless COMMAND is on PATH
  command -v "$2" >/dev/null 2>&1 || missing+=("$1")
}
need sphinxtrain "$st/bw" "$st/map_adapt"
need_cmd flite flite
need_cmd sphinxbase-utils sphinx_fe
need_cmd pocketsphinx pocketsphinx_mdef_convert
need_cmd sox sox
need_cmd python3 python3
need pocketsphinx-en-us "$model/en-us/sendump" "$model/en-us/mdef" "$model/en-us.lm.bin" "$dict"
if [[ ${#missing[@]} -gt 0 ]]; then
  die "missing: ${missing[*]}. Install them with:
  sudo apt-get install -y ${missing[*]}
(or scripts/install-deps.sh --with-asr-adapt)"
fi
[[ -f $bench_src ]] || die "$bench_src not found (the test sentences are read from it)"

# ---- work directory --------------------------------------------------------
mkdir -p "$(dirname "$out")"
tmp=$out.tmp.$$
trap 'rm -rf "$tmp"' EXIT
rm -rf "$tmp"
mkdir -p "$tmp/work/wav" "$tmp/en-us"
work=$tmp/work
cd "$work"

# ---- 1. a SphinxTrain-readable copy of en-us -------------------------------
log "converting en-us's sendump to mixture_weights"
mkdir base
cp "$model"/en-us/{feat.params,mdef,means,noisedict,transition_matrices,variances} base/
python3 "$here/sendump2mixw.py" "$model/en-us/sendump" base/mixture_weights
pocketsphinx_mdef_convert -text "$model/en-us/mdef" base/mdef.txt >mdef_convert.log 2>&1 ||
  die "pocketsphinx_mdef_convert failed (see $work/mdef_convert.log)"

# ---- 2. adaptation text: disjoint from the test set, in the dictionary -----
cat "${adapt_text[@]}" | grep -v '^[[:space:]]*$' >adapt.txt
# The bench's test sentences: the string literals of its kHarvard array.
sed -n '/kHarvard\[\] = {/,/^};/p' "$bench_src" | sed -n 's/^ *"\(.*\)",$/\1/p' >test.txt
# Writes adapt.words: each adaptation sentence as the words bw is given
# (lower case, only a-z and apostrophes), one line per line of adapt.txt.
python3 - test.txt adapt.txt "$dict" <<'PY' || die "adaptation text check failed"
import re, sys
def norm(s):
    return ' '.join(re.sub(r"[^a-z' ]", ' ', s.lower()).split())
test = [norm(l) for l in open(sys.argv[1]) if l.strip()]
adapt = [norm(l) for l in open(sys.argv[2]) if l.strip()]
with open('adapt.words', 'w') as f:
    f.writelines(s + '\n' for s in adapt)
words = {l.split()[0] for l in open(sys.argv[3], encoding='latin-1') if l.strip()}
overlap = sorted(set(test) & set(adapt))
oov = sorted({w for s in adapt for w in s.split() if w not in words})
print('adapt: %d adaptation sentences, %d test sentences (bench/modalities_bench.cc), '
      'shared: %d, adaptation words not in the dictionary: %d'
      % (len(adapt), len(test), len(overlap), len(oov)))
if len(test) != 20:
    sys.exit('expected the 20 Harvard test sentences in the bench source, found %d' % len(test))
if overlap:
    sys.exit('adaptation sentences also in the test set: %s' % overlap)
if oov:
    sys.exit('adaptation words not in the dictionary: %s' % oov)
PY

# ---- 3. speech: flite slt, 16 kHz mono 16-bit ------------------------------
log "synthesizing $(wc -l <adapt.txt) sentences with flite -voice slt"
: >adapt.ctl
: >adapt.transcription
i=0
while IFS= read -r line && IFS= read -r words <&3; do
  i=$((i + 1))
  id=$(printf 'adapt_%03d' "$i")
  flite -voice slt -t "$line" -o "wav/$id.flite.wav"
  # slt already speaks 16 kHz mono s16; sox guarantees it for sphinx_fe.
  sox "wav/$id.flite.wav" -r 16000 -c 1 -b 16 -e signed-integer "wav/$id.wav"
  rm "wav/$id.flite.wav"
  echo "wav/$id" >>adapt.ctl
  echo "<s> $words </s> ($id)" >>adapt.transcription
done <adapt.txt 3<adapt.words

log "sphinx_fe"
sphinx_fe -argfile base/feat.params -samprate 16000 -c adapt.ctl -di . -do . \
  -ei wav -eo mfc -mswav yes >fe.log 2>&1 || die "sphinx_fe failed (see $work/fe.log)"

# ---- 4. two MAP iterations --------------------------------------------------
baum_welch() {  # baum_welch HMM_DIR ACCUM_DIR
  mkdir -p "$2"
  "$st/bw" -hmmdir "$1" -moddeffn base/mdef.txt -ts2cbfn .ptm. \
    -feat 1s_c_d_dd -svspec 0-12/13-25/26-38 -cmn batch -agc none \
    -dictfn "$dict" -fdictfn base/noisedict -ctlfn adapt.ctl -lsnfn adapt.transcription \
    -cepdir . -cepext mfc -accumdir "$2" >"$2.log" 2>&1 || die "bw failed (see $work/$2.log)"
  grep -m1 -o 'overall>.*' <(tac "$2.log") | sed 's/^/adapt:   bw /' || true
}
map_adapt() {  # map_adapt PRIOR_DIR ACCUM_DIR OUT_DIR
  mkdir -p "$3"
  cp base/{feat.params,mdef,noisedict} "$3/"
  "$st/map_adapt" -moddeffn base/mdef.txt -ts2cbfn .ptm. \
    -meanfn "$1/means" -varfn "$1/variances" -mixwfn "$1/mixture_weights" \
    -tmatfn "$1/transition_matrices" -accumdir "$2" \
    -mapmeanfn "$3/means" -mapvarfn "$3/variances" -mapmixwfn "$3/mixture_weights" \
    -maptmatfn "$3/transition_matrices" >"$3.log" 2>&1 || die "map_adapt failed (see $work/$3.log)"
}
log "MAP iteration 1 (bw + map_adapt, prior en-us)"
baum_welch base acc1
map_adapt base acc1 map1
log "MAP iteration 2 (bw + map_adapt, prior iteration 1)"
baum_welch map1 acc2
map_adapt map1 acc2 map2

# ---- 5. the model directory --------------------------------------------------
cp map2/{feat.params,mdef,noisedict,means,variances,mixture_weights,transition_matrices} "$tmp/en-us/"
ln -s "$model/en-us.lm.bin" "$tmp/en-us.lm.bin"
ln -s "$dict" "$tmp/cmudict-en-us.dict"
[[ -e $model/en-us-phone.lm.bin ]] && ln -s "$model/en-us-phone.lm.bin" "$tmp/en-us-phone.lm.bin"
cat >"$tmp/README" <<TXT
PocketSphinx en-us ($model/en-us) MAP-adapted (2 iterations) to
Flite's slt voice on $(wc -l <adapt.txt) synthesized sentences, none of them in the
test set of arbiter bench modalities. Made by scripts/asr-adapt/adapt.sh on
$(date -u '+%Y-%m-%d %H:%M UTC'). Use this directory as a pocketsphinx model's path.
TXT
cd "$tmp"
rm -rf "$work"

if [[ -e $out ]]; then
  mv "$out" "$out.old.$$"
  mv "$tmp" "$out"
  rm -rf "$out.old.$$"
else
  mv "$tmp" "$out"
fi
trap - EXIT
log "done: $out ($(du -sh "$out" | cut -f1); en-us/ $(du -sh "$out/en-us" | cut -f1))"
