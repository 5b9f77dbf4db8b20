# Sourced by tests that need every sample to be one known sequence (fail must exist).
# same_sample_data PREFIX: a dataset (PREFIX.bin/.idx) of which every sample of 16
# tokens (training%seq_length = 16) is the same, the bytes of SAME_DOC, the end of
# document (256) and SAME_DOC's first byte: 200 copies of a 15-byte document, each
# 16 tokens with its end, so that every sample starts at a document. A loss at any
# iteration is then the loss of that one sequence (tokens in SAME_TOKENS).
SAME_DOC="In the beginnin"
SAME_TOKENS="$(printf %s "$SAME_DOC" | od -An -tu1 | tr -s ' \n' '  ') 256 73"
same_sample_data() {
    i=0
    while [ $i -lt 200 ]; do echo "{\"text\": \"$SAME_DOC\"}"; i=$((i + 1)); done > "$1.jsonl"
    "$MT_TOP_BUILDDIR/moetrain-preprocess" --input "$1.jsonl" --output-prefix "$1" --append-eod \
        > /dev/null || fail "moetrain-preprocess failed"
}
