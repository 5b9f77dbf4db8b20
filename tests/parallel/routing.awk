# Reads the routing decisions that MT_DEBUG_ROUTING dumps (src/model/model_moe.c; used
# by tests/parallel/common.sh). With -v bound=B:
#   awk -f routing.awk REF             the reference's decision margins: the smallest of
#                                      each kind, and how many are below B
#   awk -f routing.awk REF RUN...      a layout's dump (its ranks' files) against the
#                                      reference: the decisions that differ, with the
#                                      reference's margin, and the largest difference
#                                      of a score (key or routing probability)
# The last line is "margins MIN_TOPK MIN_AUX MIN_CAPACITY" (NA: none of that kind) or
# "compare DIFFERING MAX_DIFFERENCE"; the others are for people.
function abs(x) { return x < 0 ? -x : x }
function minat(kind, v, where) {
    if (!(kind in low) || v < low[kind]) { low[kind] = v; at[kind] = where }
    if (v < bound) below[kind]++
    n[kind]++
}
function fmt(kind) { return kind in low ? sprintf("%.2e", low[kind]) : "NA" }
function where(mb, l) { return "micro-batch " mb ", layer " l }
# topk MB L TOK k: E.. keys: K.. margin M [aux_margin A]: fields of the line
# chosen: the experts as listed (by score); chosen_set: the same ascending, the decision
# (the order of a token's experts is its scores' order, which rounding can swap between
# two chosen experts without changing what the token is sent to)
function topk_fields(   j, c, nc, a, b, t) {
    chosen = ""
    nc = 0
    for (j = 6; $j != "keys:"; j++) { chosen = chosen " " $j; c[++nc] = $j + 0 }
    for (a = 2; a <= nc; a++)
        for (b = a; b > 1 && c[b - 1] > c[b]; b--) { t = c[b]; c[b] = c[b - 1]; c[b - 1] = t }
    chosen_set = ""
    for (a = 1; a <= nc; a++) chosen_set = chosen_set " " c[a]
    nkeys = 0
    for (j++; $j != "margin"; j++) keys[++nkeys] = $j
    margin = $(j + 1)
    aux = $(j + 2) == "aux_margin" ? $(j + 3) : ""
}
FNR == 1 { file++ }
file == 1 && $1 == "topk" {
    topk_fields()
    k = $2 " " $3 " " $4
    if (k in ref_chosen) { dup = k; next }
    ref_chosen[k] = chosen
    ref_set[k] = chosen_set
    ntopk++
    ref_margin[k] = margin
    for (i = 1; i <= nkeys; i++) ref_key[k, i] = keys[i]
    minat("top-k", margin, where($2, $3) ", token " $4)
    if (aux != "") minat("balancing top-k", aux, where($2, $3) ", token " $4)
    next
}
file == 1 && $1 == "slot" { k = $2 " " $3 " " $4 " " $5; ref_prob[k] = $6; ref_kept[k] = $7; nslots++; next }
file == 1 && $1 == "capacity" {
    ref_cap[$2 " " $3 " " $4] = $8
    ncuts++
    if ($8 >= 0) minat("capacity", $8, where($2, $3) ", expert " $4)
    next
}
file > 1 && $1 == "topk" {
    topk_fields()
    k = $2 " " $3 " " $4
    if (!(k in ref_chosen)) { extra++; next }
    seen_topk++
    if (chosen != ref_chosen[k] && chosen_set == ref_set[k]) reordered++
    if (chosen_set != ref_set[k]) {
        if (differ++ < 10)
            printf "  %s, token %s: experts%s here,%s in the reference (its margin %s)\n", where($2, $3), $4, chosen, ref_chosen[k], ref_margin[k]
    }
    for (i = 1; i <= nkeys; i++) if (abs(keys[i] - ref_key[k, i]) > worst) { worst = abs(keys[i] - ref_key[k, i]); worst_at = where($2, $3) ", token " $4 ", key of expert " i - 1 }
    next
}
file > 1 && $1 == "slot" {
    k = $2 " " $3 " " $4 " " $5
    if (!(k in ref_prob)) { extra++; next }
    seen_slots++
    if ($7 != ref_kept[k]) {
        if (differ++ < 10)
            printf "  %s, token %s, expert %s: %s here, %s in the reference (probability %s here, %s there; the expert's capacity margin %s)\n", where($2, $3), $4, $5, $7, ref_kept[k], $6, ref_prob[k], ref_cap[$2 " " $3 " " $5]
    }
    if (abs($6 - ref_prob[k]) > worst) { worst = abs($6 - ref_prob[k]); worst_at = where($2, $3) ", token " $4 ", probability of expert " $5 }
    next
}
END {
    if (dup != "") { print "  the reference routes micro-batch " dup " twice (the same tokens): compare by hand"; exit 2 }
    if (file == 1) {
        printf "  routing: %d top-k decisions, %d capacity cuts (%d by probability); smallest margins:\n", ntopk, ncuts, n["capacity"]
        for (i = 1; i <= 3; i++) {
            kind = i == 1 ? "top-k" : i == 2 ? "balancing top-k" : "capacity"
            if (kind in low)
                printf "    %-16s %.2e (%s), %d below %g\n", kind, low[kind], at[kind], below[kind], bound
        }
        print "margins", fmt("top-k"), fmt("balancing top-k"), fmt("capacity")
        exit
    }
    missing = seen_topk != ntopk || seen_slots != nslots || extra
    if (missing)
        printf "  the dump has %d of the reference's %d top-k decisions, %d of its %d slots, and %d it lacks\n", seen_topk, ntopk, seen_slots, nslots, extra
    if (worst_at != "") printf "  routing: scores differ by at most %.2e (%s)\n", worst, worst_at
    if (reordered) printf "  routing: %d tokens have their experts in another order (the same experts)\n", reordered
    print "compare", differ + missing, worst + 0
}
