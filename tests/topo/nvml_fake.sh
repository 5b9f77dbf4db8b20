#!/bin/sh
# NVML through dlopen against the fake libnvidia-ml.so.1 (tests/topo/fake_nvml.c),
# once with nvmlDeviceGetGpuFabricInfoV and once with only the v1 call.
b=${MT_TOP_BUILDDIR:-.}
for lib in fake-nvml fake-nvml-v1; do
    if [ ! -f "$b/tests/topo/$lib/libnvidia-ml.so.1" ]; then
        echo "SKIP: $b/tests/topo/$lib/libnvidia-ml.so.1 not built"
        exit 77
    fi
    echo "== $lib"
    LD_LIBRARY_PATH="$b/tests/topo/$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        HWLOC_THISSYSTEM=1 CMOCKA_MESSAGE_OUTPUT=stdout "$b/tests/topo/test_nvml" || exit 1
done
