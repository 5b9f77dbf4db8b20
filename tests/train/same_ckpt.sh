# same_ckpt A B (sourced by the training and layout tests): two checkpoint directories
# (iter_*) hold the same state, byte for byte: the same index.json and shard files (or
# state.bin); config.nml may differ. Uses $tmp.
same_ckpt() {
    (cd "$1" && ls) | grep -v '^config.nml$' > "$tmp/same_ckpt.a"
    (cd "$2" && ls) | grep -v '^config.nml$' > "$tmp/same_ckpt.b"
    cmp -s "$tmp/same_ckpt.a" "$tmp/same_ckpt.b" || { echo "$1 and $2 hold other files"; return 1; }
    [ -s "$tmp/same_ckpt.a" ] || { echo "$1 holds no checkpoint"; return 1; }
    while read -r f; do cmp "$1/$f" "$2/$f" || return 1; done < "$tmp/same_ckpt.a"
}
