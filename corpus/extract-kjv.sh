#!/bin/sh
# Regenerates kjv.txt from Debian's bible-kjv package (apt-get install bible-kjv).
# One chapter per paragraph: a "Book N" heading line, then one line per verse
# ("V text"); paragraphs are separated by one blank line, which is what
# moetrain-preprocess takes as the document boundary in plain-text input.
set -eu
out=${1:-kjv.txt}
bible -l 100000 'Esth1:1-Mal4:6' |
  awk '/^$/ { next }
       /^  / { sub(/^  /, ""); print; next }
       { if (n++) print ""; print }' > "$out.tmp"
mv "$out.tmp" "$out"
