# What a site installs: the module files, loaded by Lmod and Environment Modules;
# the EasyBuild easyconfig, built by eb from the release tarball.
TESTS += tests/install/modules.sh tests/install/easybuild.sh
EXTRA_DIST += tests/install/modules.sh tests/install/easybuild.sh
tests/install/modules.log tests/install/easybuild.log: tests/runtime/build.env
# doc/site-install.md's list of what make install writes, against a staged install.
TESTS += tests/install/installed_files.sh
EXTRA_DIST += tests/install/installed_files.sh
# configure --with-blas=blis: a CPU-only build against BLIS trains as the OpenBLAS one.
TESTS += tests/install/blas_blis.sh
EXTRA_DIST += tests/install/blas_blis.sh
tests/install/blas_blis.log: moetrain
