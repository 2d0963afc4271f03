#!/usr/bin/env bash
# `stretchd report` and `stretchd run --report` pages, loaded in a real browser (Debian's
# Chromium, headless): the page of a recorded K-means run (report/testdata: it consolidated on
# node 0) shows that decision with its reason and the most-shared page; the page a run writes
# now has every part; both parse into the elements the report is made of, and render.
set -u
root=${TEST_SRCDIR:-.}/${TEST_WORKSPACE:-stretch}
bin=$root/stretchd/stretchd
kmeans=$root/experiments/workloads/kmeans
fixture=$root/report/testdata/kmeans_stats.json
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail=0
die() { echo "FAIL: $*"; exit 1; }
check() {  # check <description> <command...>
  local what=$1; shift
  "$@" || { echo "FAIL: $what"; fail=1; }
}

command -v chromium >/dev/null || die "chromium is not installed (tools/setup installs it)"
[ "$(id -u)" = 0 ] || die "needs root (stretchd run makes network namespaces)"

browse() {  # browse <page> <flag...>: Chromium, headless, its own profile; stderr kept
  HOME=$tmp timeout 120 chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$tmp/profile" --window-size=1100,2400 "${@:2}" "file://$1" \
    2>>"$tmp/chromium.err"
}

# The parts a page must have once the browser has parsed it.
has_parts() {  # has_parts <dom file>
  local dom=$1 id
  for id in summary timeline timeline-picture faults hot-pages futex traffic decisions; do
    grep -q "id=\"$id\"" "$dom" || { echo "FAIL: $dom has no element #$id"; return 1; }
  done
  # The browser kept the pictures as SVG: rectangles inside the timeline's <svg>.
  sed -n '/<svg id="timeline-picture"/,/<\/svg>/p' "$dom" | grep -q '<rect' \
    || { echo "FAIL: $dom: the timeline picture has no rectangles"; return 1; }
}

# 1. The recorded K-means run.
"$bin" report --out="$tmp/kmeans.html" "$fixture" >"$tmp/report.out" 2>&1 \
  || die "stretchd report failed: $(cat "$tmp/report.out")"
browse "$tmp/kmeans.html" --dump-dom >"$tmp/kmeans.dom" || die "chromium --dump-dom failed: $(tail -3 "$tmp/chromium.err")"
check "the recorded run's page has its parts" has_parts "$tmp/kmeans.dom"
# Its consolidation, with the reason the controller gave.
check "the consolidation and its reason are in the decisions table" \
  grep -q '<tr class="consolidate">.*predicts 0.26 cores busy all on node 0' "$tmp/kmeans.dom"
check "the consolidation is marked on the timeline" \
  sh -c "sed -n '/<svg id=\"timeline-picture\"/,/<\/svg>/p' '$tmp/kmeans.dom' | grep -q '>consolidate</text>'"
# The page both nodes faulted on most, written by threads 3 and 5, heads the heat map.
check "the most-shared page heads the heat map" \
  sh -c "sed -n '/<svg id=\"hot-pages-picture\"/,/<\/svg>/p' '$tmp/kmeans.dom' | grep -o '0x[0-9a-f]* ([0-9,]*)' | head -1 | grep -qx '0x558cfe70e000 (0,1)'"
check "the heat map names the page's writers" \
  grep -q 'page 0x558cfe70e000, thread 5: 2 reads, 34 writes' "$tmp/kmeans.dom"
browse "$tmp/kmeans.html" --screenshot="$tmp/kmeans.png" >/dev/null || die "chromium --screenshot failed"
check "the page renders (a PNG of some size)" \
  sh -c "head -c 8 '$tmp/kmeans.png' | od -An -tx1 | grep -q '89 50 4e 47' && [ \$(stat -c %s '$tmp/kmeans.png') -gt 20000 ]"

# 2. A run now, writing its report at the end.
"$bin" run --nodes=2 --migrate_after=0 --report="$tmp/run.html" -- \
  "$kmeans" --size=100000 --threads=4 >"$tmp/run.out" 2>"$tmp/run.err" \
  || die "stretchd run failed: $(tail -5 "$tmp/run.err")"
check "the run says where its report is" grep -q "the run's report is $tmp/run.html" "$tmp/run.err"
browse "$tmp/run.html" --dump-dom >"$tmp/run.dom" || die "chromium --dump-dom of the run's page failed"
check "the run's page has its parts" has_parts "$tmp/run.dom"
check "the run's page shows its command" grep -q "kmeans --size=100000 --threads=4" "$tmp/run.dom"

# 3. What is not a run's stats is refused with one line.
"$bin" report "$tmp/run.out" >/dev/null 2>"$tmp/bad.err"
check "stats that are not JSON exit 1" test $? = 1
check "with a line naming the file and the byte" grep -q "run.out: JSON: .* at byte" "$tmp/bad.err"

[ $fail = 0 ] && echo PASS
exit $fail
