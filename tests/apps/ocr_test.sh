#!/usr/bin/env bash
# Tests of dtrain-ocr through the dtrain launcher.
#   ocr_test.sh ci    DTRAIN DTRAIN_OCR JOB_TOML WORKDIR   short 2-worker run on rendered words: CTC loss falls,
#                                                          both workers' parameters bit-identical and scores equal,
#                                                          render and predict (one image, a list) work, stroke
#                                                          and stretch change training words, not test words
#   ocr_test.sh list  DTRAIN DTRAIN_OCR JOB_TOML WORKDIR   a PaddleOCR list and dictionary written here train, and
#                                                          predict --list scores as the evaluation did; bad lines
#                                                          and dictionaries give errors naming file and line
# Exit 77 (skipped) when the word list or the fonts are not installed.
set -euo pipefail
mode=$1 dtrain=$2 ocr=$3 job=$4 work=$5 app=$3
need="/usr/share/dict/words /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
      /usr/share/fonts/truetype/liberation2/LiberationSerif-Regular.ttf /usr/share/fonts/opentype/urw-base35/P052-Roman.otf"
source "$(dirname "$0")/app_lib.sh"

# A small model on a few hundred rendered words, 3 training fonts and 1 held out.
small=(-o model.width=8 -o model.hidden=32 -o model.layers=1 -o data.eval_samples=40
       -o 'data.fonts=["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf","/usr/share/fonts/truetype/liberation2/LiberationSerif-Regular.ttf","/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"]'
       -o 'data.heldout_fonts=["/usr/share/fonts/opentype/urw-base35/P052-Roman.otf"]'
       -o train.batch_size=16 -o train.eval_batch_size=20 -o train.lr=0.003 -o train.warmup_epochs=0
       -o log.every_steps=2 -o eval.every_epochs=0 -o checkpoint.resume=false -o train.threads=1)

case $mode in
ci)
  # With SyncBatchNorm: the CRNN's normalization layers are dtrain::fleet::BatchNorm2d.
  ci_job 3 10 0.5 -o data.train_samples=320 -o strategy.sync_batch_norm=true
  grep -E "^dtrain-ocr: rank 0/2 .*strategy: .*sync_batch_norm" log/workerlog.0 || fail "sync_batch_norm is not in use"
  for r in 0 1; do
    grep -E "^eval epoch 3 test: acc [01]\.[0-9]{4} norm_edit_dis [01]\.[0-9]{4} .*\(40 words" log/workerlog.$r \
      || fail "worker $r: no final test-word scores over the 40 test words"
    grep -E "^eval epoch 3 heldout_fonts: acc " log/workerlog.$r || fail "worker $r: no held-out-font scores"
  done
  [[ $(grep "^eval epoch" log/workerlog.0 | sed 's/, [0-9.]* s)$//') == \
     $(grep "^eval epoch" log/workerlog.1 | sed 's/, [0-9.]* s)$//') ]] || fail "the workers report different scores"
  grep -E "^data: words: [0-9]+ train / [0-9]+ test .* 3 fonts, 1 held out" log/workerlog.0 || fail "no data line"
  [[ -s ckpt/latest.pt ]] || fail "no final checkpoint"
  grep -qa "eval/test/acc" tb/events.out.tfevents.* || fail "no TensorBoard accuracy in tb/"
  # render writes the test words as a PaddleOCR list; predict --list decodes them with the saved model.
  "$ocr" render "$job" "${small[@]}" --output test_words --split test --count 40 > render.log 2>&1 \
    || { cat render.log >&2; fail "render failed"; }
  [[ $(wc -l < test_words/list.txt) == 40 && -s test_words/sheet.png && -s test_words/images/00039.png ]] \
    || fail "render did not write 40 images, their list and the sheet"
  # stroke and stretch change the training words only: the test words render the same with them.
  distort=(-o augment.stroke=0.05 -o augment.stretch=0.3)
  for split in test train; do
    "$ocr" render "$job" "${small[@]}" --output plain_$split --split $split --count 8 > /dev/null 2>&1
    "$ocr" render "$job" "${small[@]}" "${distort[@]}" --output distorted_$split --split $split --count 8 \
      > /dev/null 2>&1 || fail "render with stroke and stretch failed"
  done
  cmp -s plain_test/sheet.png distorted_test/sheet.png || fail "stroke/stretch changed the test words"
  ! cmp -s plain_train/sheet.png distorted_train/sheet.png || fail "stroke/stretch left the training words alone"
  "$ocr" predict "$job" "${small[@]}" -o checkpoint.dir=ckpt --list test_words/list.txt \
      -o data.root=test_words > predict.log 2>&1 || { cat predict.log >&2; fail "predict failed"; }
  tail -2 predict.log
  [[ $(grep -c $'\t'"\(ok\|wrong\)" predict.log) == 40 ]] || fail "predict did not print 40 results"
  grep -E "^\[EVAL\] list test_words/list.txt acc: [01]\.[0-9]{6}, norm_edit_dis: [01]\.[0-9]{6}, samples: 40$" \
    predict.log || fail "predict --list printed no scores"
  # One image without a list: path, text, score.
  "$ocr" predict "$job" "${small[@]}" -o checkpoint.dir=ckpt test_words/images/00000.png > one.log 2>&1 \
    || { cat one.log >&2; fail "predict of one image failed"; }
  grep -E "^test_words/images/00000.png"$'\t'".*"$'\t'"[01]\.[0-9]{4}$" one.log || fail "predict printed no result"
  echo PASS
  ;;
list)
  # 48 training and 12 test images rendered as PaddleOCR data, and a dictionary of exactly their characters.
  "$ocr" render "$job" "${small[@]}" --split train --output ds --count 60 > render.log 2>&1 \
    || { cat render.log >&2; fail "render failed"; }
  head -48 ds/list.txt > ds/train.txt
  tail -12 ds/list.txt > ds/val.txt
  cut -f2 ds/list.txt | grep -o . | sort -u > ds/dict.txt
  list=(-o data.dataset=list -o data.root=$PWD/ds -o data.character_dict_path=ds/dict.txt
        -o model.width=8 -o model.hidden=32 -o model.layers=1 -o train.batch_size=8 -o train.eval_batch_size=6
        -o train.epochs=2 -o checkpoint.dir=ckpt_list -o checkpoint.resume=false -o log.every_steps=2
        -o eval.every_epochs=1 -o train.optimizer=adam -o train.lr=0.003)
  # Trained long enough (60 epochs of 48 images, ~15 s) to predict some characters; evaluated on 12 of
  # its training images, which predict --list then decodes and scores the same way.
  head -12 ds/train.txt > ds/seen.txt
  "$ocr" "$job" "${list[@]}" -o data.train_list=ds/train.txt -o data.val_list=ds/seen.txt -o train.epochs=60 \
      -o eval.every_epochs=0 -o model.width=16 -o model.hidden=48 -o train.lr=0.01 -o train.warmup_epochs=0 \
      > list_ok.out 2>&1 || { cat list_ok.out >&2; fail "training on a PaddleOCR list failed"; }
  grep -E "48 train / 12 eval images" list_ok.out || fail "the list run did not see 48 + 12 samples"
  grep -E "^eval epoch 60 test: acc [01]\.[0-9]{4} norm_edit_dis" list_ok.out || fail "the list run did not evaluate"
  "$ocr" predict "$job" "${list[@]}" -o model.width=16 -o model.hidden=48 --list ds/seen.txt > predict.log 2>&1 \
    || { cat predict.log >&2; fail "predict --list failed"; }
  want=$(sed -n 's/^\[EVAL\] test acc: \([0-9.]*\), norm_edit_dis: \([0-9.]*\), samples: 12$/\1 \2/p' list_ok.out)
  got=$(sed -n 's/^\[EVAL\] list .* acc: \([0-9.]*\), norm_edit_dis: \([0-9.]*\), samples: 12$/\1 \2/p' predict.log)
  awk -v w="$want" -v g="$got" 'BEGIN {split(w, a); split(g, b); exit !(g != "" && a[1] == b[1] && a[2] == b[2] && b[2] > 0)}' \
    || { cat predict.log >&2; fail "predict --list scored '$got', the evaluation '$want' (or predicted nothing)"; }
  echo "predict --list matches the evaluation: acc, norm_edit_dis $got"
  echo "ok list training"
  # A label with a character outside the dictionary: an error naming the line, or skipped and counted.
  { head -3 ds/train.txt; printf 'images/00003.png\tna\xc3\xafve\n'; sed -n '5,48p' ds/train.txt; } > ds/unknown.txt
  expect unknown_char "ds/unknown.txt:4: label 'na"$'\xc3\xaf'"ve' has the character '"$'\xc3\xaf'"', which is not in the dictionary" \
      "${list[@]}" -o data.train_list=ds/unknown.txt -o data.val_list=ds/val.txt
  "$ocr" "$job" "${list[@]}" -o data.train_list=ds/unknown.txt -o data.val_list=ds/val.txt -o data.unknown_chars=skip \
      -o train.epochs=1 > skip.out 2>&1 || { cat skip.out >&2; fail "unknown_chars = skip did not train"; }
  grep -F "lists: ds/unknown.txt (1 skipped: 1 unknown characters, 0 too long)" skip.out || fail "the skip was not counted"
  grep -E "47 train / 12 eval images" skip.out || fail "the skipped line was not left out"
  echo "ok unknown_chars = skip"
  { head -2 ds/train.txt; echo "images/00002.png no-tab"; } > ds/notab.txt
  expect no_tab "ds/notab.txt:3: expected 'image_path<TAB>label', got 'images/00002.png no-tab' (no tab)" \
      "${list[@]}" -o data.train_list=ds/notab.txt -o data.val_list=ds/val.txt
  { head -1 ds/train.txt; printf '\nimages/nothere.png\tabc\n'; } > ds/noimage.txt
  expect missing_image "ds/noimage.txt:3: image '$PWD/ds/images/nothere.png' does not exist" \
      "${list[@]}" -o data.train_list=ds/noimage.txt -o data.val_list=ds/val.txt
  { head -5 ds/dict.txt; head -1 ds/dict.txt; } > ds/dupdict.txt
  expect dup_dict "ds/dupdict.txt:6: character '$(head -1 ds/dict.txt)' is listed twice" \
      "${list[@]}" -o data.character_dict_path=ds/dupdict.txt -o data.train_list=ds/train.txt -o data.val_list=ds/val.txt
  expect missing_list "cannot open list file 'ds/none.txt'" "${list[@]}" -o data.train_list=ds/none.txt \
      -o data.val_list=ds/val.txt
  expect unknown_backbone "unknown backbone 'resnet'; known backbones: vgg, mobilenetv3" -o model.backbone=resnet
  expect missing_font "font file '/nonexistent.ttf' does not exist" -o 'data.fonts=["/nonexistent.ttf"]'
  echo PASS
  ;;
*) echo "unknown mode $mode" >&2; exit 2 ;;
esac
