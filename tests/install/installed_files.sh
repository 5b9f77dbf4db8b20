#!/bin/bash
# doc/site-install.md lists everything `make install` writes: the bullets after
# "`make install` puts in place" against a staged install (DESTDIR) of this
# build, with the module files in their default directory. Each `path` of a
# bullet is a file under the prefix; `dir/` alone covers everything under it,
# `dir/` followed by names on its bullet lists exactly those files. Fails on a
# file installed but not listed, and on a listed file or directory not installed.
set -u
fail() { echo "FAIL: $*"; exit 1; }
doc=$MT_TOP_SRCDIR/doc/site-install.md
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

prefix=$(sed -n 's/^prefix = //p' "$MT_TOP_BUILDDIR/Makefile")
[ -n "$prefix" ] || fail "no prefix in $MT_TOP_BUILDDIR/Makefile"
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$MT_TOP_BUILDDIR" install \
    DESTDIR="$tmp/root" modulefilesdir="$prefix/share/moetrain/modulefiles" > "$tmp/make.log" 2>&1 ||
    { tail -20 "$tmp/make.log"; fail "staged make install"; }
(cd "$tmp/root$prefix" && find . \( -type f -o -type l \) | sed 's|^\./||' | sort) > "$tmp/installed"

# The doc's entries, one per line: "file PATH" or "dir PATH/" (everything under it).
awk '
    /^`make install` puts in place/ { on = 1; next }
    on && /^## / { exit }
    on && /^- / { if (b != "") print b; b = $0; next }
    on && /^  +[^ ]/ && b != "" { b = b " " $0; next }
    on && b != "" { print b; b = "" }
    END { if (b != "") print b }
' "$doc" > "$tmp/bullets"
[ -s "$tmp/bullets" ] || fail "no list after '\`make install\` puts in place' in $doc"
while IFS= read -r bullet; do
    dir= named=0
    rest=$bullet
    while [[ $rest =~ \`([^\`]*)\`(.*) ]]; do
        tok=${BASH_REMATCH[1]} rest=${BASH_REMATCH[2]}
        case $tok in
        -*) continue ;;                        # a configure option
        */) [ -n "$dir" ] && [ "$named" = 0 ] && echo "dir $dir"
            dir=$tok named=0 ;;
        bin/*|share/*|lib/*|libexec/*|include/*|etc/*) echo "file $tok" ;;
        *) [ -n "$dir" ] || fail "'$tok' in '$bullet' is neither under the prefix nor after a directory"
           echo "file $dir$tok"
           named=1 ;;
        esac
    done
    [ -n "$dir" ] && [ "$named" = 0 ] && echo "dir $dir"
done < "$tmp/bullets" > "$tmp/listed"
[ "$(wc -l < "$tmp/listed")" -ge 10 ] || { cat "$tmp/listed"; fail "too few entries read from $doc: the parsing is broken"; }

bad=0
while read -r kind path; do
    case $kind in
    file) grep -qxF "$path" "$tmp/installed" ||
              { echo "listed in doc/site-install.md, not installed: $path"; bad=1; } ;;
    dir) grep -q "^${path//./\\.}" "$tmp/installed" ||
             { echo "listed in doc/site-install.md, nothing installed under: $path"; bad=1; } ;;
    esac
done < "$tmp/listed"
while read -r f; do
    covered=0
    while read -r kind path; do
        case $kind in
        file) [ "$f" = "$path" ] && covered=1 ;;
        dir) [ "${f#"$path"}" != "$f" ] && covered=1 ;;
        esac
        [ "$covered" = 1 ] && break
    done < "$tmp/listed"
    [ "$covered" = 1 ] || { echo "installed, not listed in doc/site-install.md: $f"; bad=1; }
done < "$tmp/installed"
[ "$bad" = 0 ] || fail "doc/site-install.md's list of what make install writes is out of date"
echo "ok: the $(wc -l < "$tmp/installed") installed files are the $(wc -l < "$tmp/listed") entries of doc/site-install.md"
