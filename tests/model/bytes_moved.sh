#!/bin/sh
# bench/bytes_moved on a small MoE model: per decoder layer forward, bf16 storage moves
# fewer activation bytes than fp32 storage rounded in place, and makes no rounding pass
# (the fp32-stored reference makes one per stored activation). The counts come from
# the op table's typed arguments, so they are the same on every machine.
out=$(MOETRAIN_DATADIR="$MT_TOP_BUILDDIR" "$MT_TOP_BUILDDIR/bench/bytes_moved" \
    "$MT_TOP_SRCDIR/tests/parallel/moe.nml" training%seq_length=32 training%micro_batch_size=2) || { echo "$out"; echo "FAIL: bench/bytes_moved failed"; exit 1; }
echo "$out"
echo "$out" | awk '
    function per_token(line) { sub(/.*\(/, "", line); sub(/ bytes\/token.*/, "", line); return line + 0 }
    /bf16 storage \(producers/ { a16 = per_token($0); for (i = 1; i <= NF; i++) if ($i == "passes") p16 = $(i + 1) }
    /rounded in place/ { a32 = per_token($0); for (i = 1; i <= NF; i++) if ($i == "passes") p32 = $(i + 1) }
    END {
        if (a16 == "" || a32 == "") { print "FAIL: no figures"; exit 1 }
        if (p16 != 0) { print "FAIL: bf16 storage makes " p16 " rounding passes per layer"; exit 1 }
        if (p32 < 10) { print "FAIL: the fp32-stored reference makes only " p32 " rounding passes"; exit 1 }
        if (a16 <= 0 || a16 * 1.3 > a32) { print "FAIL: bf16 storage moves " a16 " bytes/token, fp32 storage " a32; exit 1 }
    }' || exit 1
