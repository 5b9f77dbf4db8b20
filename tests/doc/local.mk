# Every command of README.md and doc/, run (the commands are found in the docs
# on each run; tests/doc/commands.sh says what it replaces and why).
TESTS += tests/doc/commands.sh
EXTRA_DIST += tests/doc/commands.sh tests/doc/extract-commands.awk
