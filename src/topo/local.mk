# src/topo: hwloc discovery, NVLink-domain keys (NVML via dlopen), placement,
# CPU/NUMA affinity, and the `moetrain topo` subcommand (mt_topo_cli).
noinst_LTLIBRARIES += libmt_topo.la
MT_MODULE_LIBS += libmt_topo.la
libmt_topo_la_SOURCES = src/topo/topo.h src/topo/topo_internal.h \
	src/topo/node.c src/topo/nvml.c src/topo/domain.c src/topo/place.c \
	src/topo/affinity.c src/topo/cluster.c src/topo/report.c src/topo/topo_cli.c
# dlopen is in libc from glibc 2.34; -ldl keeps older systems linking.
libmt_topo_la_LIBADD = -ldl

include tests/topo/local.mk

dist_doc_DATA += doc/topology.md
EXTRA_DIST += bench/topo_place.sh
