#!/bin/bash
# Every command of the docs, run: the shell blocks of README.md and doc/*.md
# and the example blocks of the man pages doc/*.[1-9] (extract-commands.awk),
# found afresh on each run, so that a command added to the docs is tested
# without editing this test. Each doc file is followed in one bash session, its
# commands in order, as a reader would in one terminal, in a scratch directory
# that stands for the top of the source tree; moetrain is the build's. A
# command that cannot run here as written is replaced by what `plan` says, and
# both are printed. A failure names the file, the line and the command.
# Ends 77 (skip) when nothing failed but a command needed a tool this machine
# lacks (mpirun, Lmod); the commands affected are listed.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
top=$MT_TOP_SRCDIR
mkdir -p "$tmp/bin" "$tmp/no-apt" "$tmp/log" "$tmp/run"
: > "$tmp/failed"
: > "$tmp/unavailable"

# moetrain as the docs call it: the first moetrain on PATH after this wrapper
# (the build's, or an installed one once a module is loaded), with training
# runs cut to two iterations and a one-batch evaluation, so that the docs'
# runs of hundreds of iterations take a second each: the docs' training
# commands are tested for starting, reading their data, stepping and
# evaluating, not for how far the loss falls (tests/train does that).
cat > "$tmp/bin/moetrain" << EOF
#!/bin/sh
real=
IFS=:
for d in \$PATH; do
    [ "\$d" = "$tmp/bin" ] && continue
    [ -x "\$d/moetrain" ] && { real=\$d/moetrain; break; }
done
unset IFS
[ -n "\$real" ] || { echo "no moetrain on PATH" >&2; exit 127; }
for a; do
    case \$a in
    --check|--print-config|--help-config|--help|-h|--version|-V) exec "\$real" "\$@" ;;
    esac
done
case "\${1:-}" in topo|from-megatron|ckpt|export-hf) exec "\$real" "\$@" ;; esac
exec "\$real" "\$@" training%train_iters=2 training%eval_iters=1 \\
    optimizer%lr_warmup_iters=1 logging%log_interval=1
EOF
chmod +x "$tmp/bin/moetrain"

# An apt-get that refuses, for scripts/install-deps.sh: a test installs nothing.
cat > "$tmp/no-apt/apt-get" << 'EOF'
#!/bin/sh
echo "apt-get $*: refused (a test installs nothing): a package install-deps.sh names is missing" >&2
exit 1
EOF
chmod +x "$tmp/no-apt/apt-get"

# The files the docs' commands name as placeholders, made in each scratch
# directory: my.nml (the srun example's job, checked for its 2 x 4 tasks) is
# the tiny job with a micro-batch that 8 data-parallel ranks divide; nodes.txt
# (moetrain topo --dry-run with 4 GPUs per node) is four full GB200 NVL72 racks.
make_placeholders() {
    "$MOETRAIN" --print-config "$top/namelists/tiny_moe.nml" training%micro_batch_size=2 > my.nml &&
        cp "$top/tests/fixtures/topo/nvl72-4racks.nodes" nodes.txt
}

# The commands that cannot run here as written, and what runs instead, matched
# (bash patterns, first match wins) against each part of a command line split
# at "&&". A part that matches nothing runs as written. Sets reason (empty:
# as written) and instead (evaluated in the part's place).
plan() {
    reason= instead=$1
    case $1 in
    scripts/install-deps.sh*)
        reason="installs Debian packages; as root it runs, with apt-get refusing"
        instead="without_apt $1" ;;
    "autoreconf "*)
        reason="rewrites the build system of a source tree other builds share"
        instead="autoreconf --version" ;;
    ./configure*)
        reason="a new build takes minutes; configure --help must know its options"
        instead="configure_knows ${1#./configure}" ;;
    "make check"|"make -j"*" check")
        reason="the test suite, which is running this test: nothing instead"
        instead=":" ;;
    "make install"|"make -j"*" install")
        reason="writes to the prefix; staged under the scratch root"
        instead="staged_install" ;;
    make|"make -j"*)
        reason="make check has built the tree under test"
        instead='test -x "$MOETRAIN"' ;;
    "mpirun "*)
        reason="as root, more processes than cores: one thread each"
        instead="mpirun_here ${1#mpirun }" ;;
    "srun "*)
        reason="needs a Slurm allocation (tests/slurm runs srun); the job checked for its size"
        instead="srun_as_check ${1#srun }" ;;
    "sbatch "*)
        reason="submits a cluster job; the script checks its layout itself"
        instead="sbatch_as_check ${1#sbatch }" ;;
    "module load "*)
        reason="the site's module tree: the one the doc made under the scratch root"
        instead="module_load_staged ${1#module load }" ;;
    "mkdir "*" /"*|"cp "*" /"*)
        reason="writes to the site's directories: under the scratch root"
        instead=${1//' /'/" $root/"} ;;
    *" [options] "*)
        reason="a usage synopsis"
        instead="${1%% *} --help" ;;
    esac
}

# What the table's entries run. Each returns non-zero on failure, and calls
# `unavailable` (and returns 0) when this machine lacks the tool to run it.

# without_apt CMD...: as root, CMD with an apt-get that refuses (so a missing
# package fails the test instead of being installed); otherwise a syntax check.
without_apt() {
    if [ "$(id -u)" -ne 0 ]; then sh -n "$1"; return; fi
    PATH=$tmp/no-apt:$PATH "$@"
}
# configure_knows ARG...: configure --help lists every option the ARGs use;
# remembers --prefix and --with-modulefiles-dir for staged_install.
configure_knows() {
    help=$("$top/configure" --help) || return 1
    for a; do
        case $a in
        --prefix=*) doc_prefix=${a#--prefix=} ;;
        --with-modulefiles-dir=*) doc_modulefiles=${a#*=} ;;
        esac
        o=${a%%=*}
        case $o in
        --with-*|--without-*) re="--with(out)?-${o#--with*-}" ;;
        --enable-*|--disable-*) re="--(enable|disable)-${o#--*able-}" ;;
        --*) re=$o ;;
        *) continue ;;
        esac
        printf '%s\n' "$help" | grep -qE -- "^ +$re([=[ ]|$)" ||
            { echo "configure --help has no $o"; return 1; }
    done
}
# staged_install: make install into $root (DESTDIR) under the prefix and module
# directory the doc's configure named (else the build's), with the module files'
# paths pointed at the staged tree, as a build configured with that prefix would
# have them.
staged_install() {
    p=${doc_prefix:-$(sed -n 's/^prefix = //p' "$MT_TOP_BUILDDIR/Makefile")}
    env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
        make -C "$MT_TOP_BUILDDIR" install DESTDIR="$root" prefix="$p" \
        ${doc_modulefiles:+modulefilesdir="$doc_modulefiles"} || return 1
    find "$root" -path '*/modulefiles/moetrain/*' -exec sed -i "s#$p\([/\" ]\\|\$\)#$root$p\1#g" {} +
}
# module_load_staged MODULE...: module load, from the module trees under $root
# that the doc's commands made; then the wrapper first on PATH again.
module_load_staged() {
    if ! type module > /dev/null 2>&1; then
        for f in "${LMOD_PKG:-/usr/share/lmod/lmod}/init/bash" /usr/share/lmod/lmod/init/bash; do
            [ -r "$f" ] && . "$f" && break
        done
    fi
    type module > /dev/null 2>&1 || { unavailable "no Lmod"; return 0; }
    MODULEPATH=$(find "$root" -type d -name modulefiles ! -path '*/share/*' | paste -sd:)
    [ -n "$MODULEPATH" ] || { echo "no module tree under $root: the doc installs none before loading"; return 1; }
    export MODULEPATH
    module load "$@" || return 1
    PATH=$tmp/bin:$PATH
}
# mpirun_here ARGS: OpenMPI's mpirun (the one configure found), bounded
mpirun_here() {
    have_mpirun || { unavailable "$why"; return 0; }
    OMP_NUM_THREADS=1 timeout 120 "$MPIRUN" --allow-run-as-root --oversubscribe "$@"
}
# srun_as_check SRUN-ARGS: the moetrain job of an srun line, validated with
# --check for as many processes as srun would start.
srun_as_check() {
    nodes=1 per_node=1 ntasks=
    while [ $# -gt 0 ]; do
        case $1 in
        -N) nodes=$2; shift ;;
        -N*) nodes=${1#-N} ;;
        --nodes=*) nodes=${1#*=} ;;
        -n) ntasks=$2; shift ;;
        -n*) ntasks=${1#-n} ;;
        --ntasks=*) ntasks=${1#*=} ;;
        --ntasks-per-node=*) per_node=${1#*=} ;;
        -*) ;;
        *) break ;;
        esac
        shift
    done
    [ "${1:-}" = moetrain ] || { echo "srun of '${1:-}': add an entry to plan's table"; return 1; }
    shift
    moetrain --check --world-size "${ntasks:-$((nodes * per_node))}" "$@"
}
# sbatch_as_check SBATCH-ARGS: the batch script's own --check mode, which
# validates its layout for the job's size without Slurm.
sbatch_as_check() {
    while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
    grep -q -- '--check' "$1" ||
        { echo "$1 has no --check mode: add an entry to plan's table"; return 1; }
    script=$1
    shift
    bash "$script" --check "$@"
}
# unavailable WHY: the current command could not run on this machine
unavailable() { printf '%s:%s: %s: not run: %s\n' "$doc" "$doc_line" "$doc_cmd" "$1" >> "$tmp/unavailable"; }

# follow DOC: runs DOC's commands in order in this (sub)shell, in a scratch
# directory with the source tree's entries linked in and ./moetrain the wrapper.
follow() {
    doc=$1
    root=$tmp/run/${doc//\//_}.root
    dir=$tmp/run/${doc//\//_}
    mkdir -p "$dir" "$root" && cd "$dir" || exit 1
    for f in "$top"/*; do
        case ${f##*/} in moetrain|moetrain-preprocess) ;; *) ln -s "$f" . ;; esac
    done
    ln -s "$tmp/bin/moetrain" moetrain
    ln -s "$MT_TOP_BUILDDIR/moetrain-preprocess" moetrain-preprocess
    make_placeholders || { echo "$doc: making the placeholder files" >> "$tmp/failed"; return; }
    PATH=$tmp/bin:$MT_TOP_BUILDDIR:$PATH
    set +u
    while IFS=$'\t' read -r -u 3 file doc_line doc_cmd; do
        [ "$file" = "$doc" ] || continue
        echo "$doc:$doc_line: $doc_cmd"
        log=$tmp/log/${doc//\//_}.$doc_line
        rest=$doc_cmd
        while [ -n "$rest" ]; do
            part=${rest%%&&*}
            case $rest in *"&&"*) rest=${rest#*&&} ;; *) rest= ;; esac
            part=${part#"${part%%[! ]*}"}
            part=${part%"${part##*[! ]}"}
            plan "$part"
            if [ -n "$reason" ]; then
                [ "$part" = "$doc_cmd" ] || echo "    $part"
                echo "      not as written ($reason): $instead"
            fi
            eval "$instead" >> "$log" 2>&1 < /dev/null
            rc=$?
            if [ $rc -ne 0 ]; then
                echo "FAIL: $doc:$doc_line: $doc_cmd"
                [ "$part" = "$doc_cmd" ] || echo "      (at: $part)"
                echo "      exit status $rc; its output ends:"
                tail -n 25 "$log" | sed 's/^/      | /'
                echo "$doc:$doc_line: $doc_cmd" >> "$tmp/failed"
                break
            fi
        done
    done 3< "$tmp/commands"
}

docs=$(cd "$top" && ls README.md doc/*.md doc/*.[1-9] 2> /dev/null)
(cd "$top" && awk -f "$top/tests/doc/extract-commands.awk" $docs) > "$tmp/commands" ||
    fail "extract-commands.awk"
grep -q '^README\.md	' "$tmp/commands" ||
    fail "no command found in README.md: the extraction is broken"
for doc in $docs; do
    (follow "$doc")
done

ran=$(wc -l < "$tmp/commands")
if [ -s "$tmp/failed" ]; then
    echo "FAIL: $(wc -l < "$tmp/failed") of $ran doc commands failed:"
    cat "$tmp/failed"
    exit 1
fi
if [ -s "$tmp/unavailable" ]; then
    cat "$tmp/unavailable"
    skip "$ran doc commands, all that ran passed; the above could not run here"
fi
echo "PASS: $ran doc commands from $(echo $docs | wc -w) files"
