# extract-commands.awk: the commands of the shell blocks of Markdown files
# (fences ``` or ~~~ tagged sh, bash, shell, console, zsh, sh-session or
# shell-session) and of the example blocks of man pages (.EX/.EE, .nf/.fi in
# files named *.1 to *.9), one line each: FILE<TAB>LINE<TAB>COMMAND, where FILE
# is the path without the prefix `-v top=DIR/` and LINE the command's first line.
#
# In a block where some lines carry a "$ " prompt, only those are commands (the
# rest is their output); otherwise every line is, but blank lines and comments.
# A line ending in a backslash continues on the next. Fences in untagged or
# other blocks (output, synopses, namelists) hold no commands.
function flush(    i, prompted, line, cmd, start) {
    prompted = 0
    for (i = 1; i <= n; i++)
        if (text[i] ~ /^[ \t]*\$ /)
            prompted = 1
    cmd = ""
    for (i = 1; i <= n; i++) {
        line = text[i]
        gsub(/\t/, " ", line)
        if (cmd == "") {
            if (prompted && line !~ /^[ \t]*\$ /)
                continue
            sub(/^[ \t]*(\$ )?[ \t]*/, "", line)
            if (line == "" || line ~ /^#/)
                continue
            start = where[i]
        }
        if (line ~ /\\$/) {
            cmd = cmd substr(line, 1, length(line) - 1)
            continue
        }
        print name, start, cmd line
        cmd = ""
    }
    if (cmd != "")
        print name, start, cmd
    n = 0
}
# man page text as typed: font changes dropped, escapes resolved
function unroff(s) {
    gsub(/\\f(\[[^]]*\]|\(..|.)/, "", s)
    gsub(/\\-/, "-", s)
    gsub(/\\\(aq/, "'", s)
    gsub(/\\\(dq/, "\"", s)
    gsub(/\\&/, "", s)
    gsub(/\\ /, " ", s)
    gsub(/\\e/, "\\", s)
    return s
}
BEGIN { OFS = "\t" }
FNR == 1 {
    name = FILENAME
    if (top != "" && index(name, top "/") == 1)
        name = substr(name, length(top) + 2)
    man = name ~ /\.[1-9]$/
    inblock = 0
    n = 0
}
!man && /^[ \t]*(```|~~~)/ {
    if (inblock) {
        if (shell)
            flush()
        inblock = 0
    } else {
        lang = $0
        sub(/^[ \t]*(```|~~~)[ \t]*/, "", lang)
        sub(/[^-A-Za-z0-9_].*/, "", lang)
        shell = lang ~ /^(sh|bash|shell|console|zsh|sh-session|shell-session)$/
        inblock = 1
        n = 0
    }
    next
}
man && /^\.(EX|nf)([ \t]|$)/ { inblock = 1; shell = 1; n = 0; next }
man && /^\.(EE|fi)([ \t]|$)/ { if (inblock) flush(); inblock = 0; next }
man && inblock && /^[.']/ { next }
inblock && shell { n++; text[n] = man ? unroff($0) : $0; where[n] = FNR }
