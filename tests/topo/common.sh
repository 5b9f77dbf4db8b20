# Shared by the tests/topo scripts (sourced).

# check_groups FILE.json: for every group, the set of domains of its members
# has one element. TP x CP groups are the ranks with equal (dp, pp), ETP x EP
# groups those with equal (edp, pp): the coordinates of the other dimensions.
check_groups() {
    awk '
    function field(k,   m) {
        if (match($0, "\"" k "\": (\"[^\"]*\"|-?[0-9]+|null)")) {
            m = substr($0, RSTART + length(k) + 4, RLENGTH - length(k) - 4)
            gsub(/"/, "", m); return m
        }
        print "no key " k " in: " $0; bad = 1; return ""
    }
    /"rank"/ {
        n++; d = field("domain")
        a = field("dp") "/" field("pp"); e = field("edp") "/" field("pp")
        if ((a in ad) && ad[a] != d) { split_a++ } ; ad[a] = d
        if ((e in ed) && ed[e] != d) { split_e++ } ; ed[e] = d
        seen[field("rank")]++
    }
    END {
        for (r in seen) if (seen[r] != 1) { print "rank " r " appears " seen[r] " times"; bad = 1 }
        printf "%d processes, split: %d TPxCP, %d ETPxEP\n", n, split_a, split_e
        exit (bad || split_a || split_e) ? 1 : 0
    }' "$1"
}
