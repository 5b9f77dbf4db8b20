# What a site installs: the module files, loaded by Lmod and Environment Modules.
TESTS += tests/install/modules.sh
EXTRA_DIST += tests/install/modules.sh
tests/install/modules.log: tests/runtime/build.env
