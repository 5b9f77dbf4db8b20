# Packaging recipes for sites (doc/site-install.md, "Packaging").
EXTRA_DIST += contrib/easybuild/moetrain-0.1.0.eb contrib/spack/moetrain/package.py
