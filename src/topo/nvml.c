/* NVML through dlopen("libnvidia-ml.so.1"): no NVML headers are needed at
 * build time, so the few types and entry points used are declared here, as
 * NVIDIA's nvml.h (API version 12) defines them. */
#include "topo/topo_internal.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef struct nvml_device *nvml_device_t; /* nvmlDevice_t */
typedef int nvml_return_t;                 /* nvmlReturn_t; 0 = NVML_SUCCESS */

#define NVML_SUCCESS 0
#define NVML_P2P_CAPS_INDEX_NVLINK 2      /* nvmlGpuP2PCapsIndex_t */
#define NVML_P2P_STATUS_OK 0              /* nvmlGpuP2PStatus_t */
#define NVML_GPU_FABRIC_UUID_LEN 16
#define NVML_GPU_FABRIC_STATE_NOT_SUPPORTED 0
#define NVML_GPU_FABRIC_STATE_NOT_STARTED 1
#define NVML_GPU_FABRIC_STATE_IN_PROGRESS 2
#define NVML_GPU_FABRIC_STATE_COMPLETED 3

/* nvmlGpuFabricInfo_v2_t (nvmlGpuFabricInfoV_t), for
 * nvmlDeviceGetGpuFabricInfoV: version first, healthMask last. */
struct nvml_fabric_info_v2 {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvml_return_t status;
    unsigned int cliqueId;
    unsigned char state;          /* nvmlGpuFabricState_t */
    unsigned int healthMask;
};
/* NVML_STRUCT_VERSION(GpuFabricInfo, 2) */
#define NVML_GPU_FABRIC_INFO_V2 \
    ((unsigned int)(sizeof(struct nvml_fabric_info_v2) | (2u << 24)))
_Static_assert(sizeof(struct nvml_fabric_info_v2) == 36, "nvmlGpuFabricInfo_v2_t layout");

/* nvmlGpuFabricInfo_t (v1, drivers before nvmlDeviceGetGpuFabricInfoV). */
struct nvml_fabric_info_v1 {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvml_return_t status;
    unsigned int cliqueId;
    unsigned char state;
};
_Static_assert(sizeof(struct nvml_fabric_info_v1) == 28, "nvmlGpuFabricInfo_t layout");

struct nvml {
    void *lib;
    nvml_return_t (*init)(void);
    nvml_return_t (*shutdown)(void);
    const char *(*error_string)(nvml_return_t);
    nvml_return_t (*by_pci)(const char *, nvml_device_t *);
    nvml_return_t (*uuid)(nvml_device_t, char *, unsigned int);
    nvml_return_t (*p2p)(nvml_device_t, nvml_device_t, int, int *);
    nvml_return_t (*fabric_v)(nvml_device_t, struct nvml_fabric_info_v2 *);
    nvml_return_t (*fabric_v1)(nvml_device_t, struct nvml_fabric_info_v1 *);
};

/* dlsym into a function pointer without the object/function pointer cast. */
static void sym(void *lib, const char *name, void *fnptr)
{
    void *p = dlsym(lib, name);
    memcpy(fnptr, &p, sizeof p);
}

static const char *errstr(const struct nvml *nv, nvml_return_t rc)
{
    static char buf[32];
    if (nv->error_string) return nv->error_string(rc);
    snprintf(buf, sizeof buf, "NVML error %d", rc);
    return buf;
}

static bool nvml_open(struct nvml *nv, char *why, size_t len)
{
    memset(nv, 0, sizeof *nv);
    nv->lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!nv->lib) {
        const char *e = dlerror();
        snprintf(why, len, "NVML is not available (dlopen libnvidia-ml.so.1: %s)",
                 e ? e : "not found");
        return false;
    }
    sym(nv->lib, "nvmlInit_v2", &nv->init);
    sym(nv->lib, "nvmlShutdown", &nv->shutdown);
    sym(nv->lib, "nvmlErrorString", &nv->error_string);
    sym(nv->lib, "nvmlDeviceGetHandleByPciBusId_v2", &nv->by_pci);
    sym(nv->lib, "nvmlDeviceGetUUID", &nv->uuid);
    sym(nv->lib, "nvmlDeviceGetP2PStatus", &nv->p2p);
    sym(nv->lib, "nvmlDeviceGetGpuFabricInfoV", &nv->fabric_v);
    sym(nv->lib, "nvmlDeviceGetGpuFabricInfo", &nv->fabric_v1);
    if (!nv->init || !nv->shutdown || !nv->by_pci) {
        snprintf(why, len, "NVML library lacks nvmlInit_v2/nvmlDeviceGetHandleByPciBusId_v2 "
                           "(driver too old)");
        dlclose(nv->lib);
        return false;
    }
    nvml_return_t rc = nv->init();
    if (rc != NVML_SUCCESS) {
        snprintf(why, len, "nvmlInit_v2 failed: %s", errstr(nv, rc));
        dlclose(nv->lib);
        return false;
    }
    return true;
}

static void nvml_close(struct nvml *nv)
{
    nv->shutdown();
    dlclose(nv->lib);
}

static const char *state_name(unsigned state)
{
    switch (state) {
    case NVML_GPU_FABRIC_STATE_NOT_SUPPORTED: return "NOT_SUPPORTED";
    case NVML_GPU_FABRIC_STATE_NOT_STARTED: return "NOT_STARTED";
    case NVML_GPU_FABRIC_STATE_IN_PROGRESS: return "IN_PROGRESS";
    case NVML_GPU_FABRIC_STATE_COMPLETED: return "COMPLETED";
    default: return "unknown";
    }
}

/* The fabric key needs clusterUuid and cliqueId together: clique ids are only
 * unique within one cluster (one NVLink fabric manager domain). */
static void fabric(const struct nvml *nv, nvml_device_t dev, struct mt_topo_gpu *g)
{
    unsigned char uuid[NVML_GPU_FABRIC_UUID_LEN];
    unsigned clique, state;
    nvml_return_t rc, status;
    if (nv->fabric_v) {
        struct nvml_fabric_info_v2 fi;
        memset(&fi, 0, sizeof fi);
        fi.version = NVML_GPU_FABRIC_INFO_V2;
        rc = nv->fabric_v(dev, &fi);
        memcpy(uuid, fi.clusterUuid, sizeof uuid);
        clique = fi.cliqueId;
        state = fi.state;
        status = fi.status;
    } else if (nv->fabric_v1) {
        struct nvml_fabric_info_v1 fi;
        memset(&fi, 0, sizeof fi);
        rc = nv->fabric_v1(dev, &fi);
        memcpy(uuid, fi.clusterUuid, sizeof uuid);
        clique = fi.cliqueId;
        state = fi.state;
        status = fi.status;
    } else {
        snprintf(g->fabric_why, sizeof g->fabric_why, "driver has no GPU fabric info");
        return;
    }
    if (rc != NVML_SUCCESS) {
        snprintf(g->fabric_why, sizeof g->fabric_why, "GPU fabric info: %s", errstr(nv, rc));
        return;
    }
    if (state != NVML_GPU_FABRIC_STATE_COMPLETED) {
        snprintf(g->fabric_why, sizeof g->fabric_why, "fabric state %s", state_name(state));
        return;
    }
    if (status != NVML_SUCCESS) {
        snprintf(g->fabric_why, sizeof g->fabric_why, "fabric registration failed: %s",
                 errstr(nv, status));
        return;
    }
    bool zero = true;
    for (int i = 0; i < NVML_GPU_FABRIC_UUID_LEN; i++) zero = zero && uuid[i] == 0;
    if (zero) {
        snprintf(g->fabric_why, sizeof g->fabric_why, "fabric cluster UUID is zero");
        return;
    }
    char *p = g->fabric;
    for (int i = 0; i < NVML_GPU_FABRIC_UUID_LEN; i++) {
        p += sprintf(p, "%02x", uuid[i]);
        if (i == 3 || i == 5 || i == 7 || i == 9) *p++ = '-';
    }
    sprintf(p, "/%u", clique);
}

void mt_nvml_describe(struct mt_topo_node *n)
{
    struct nvml nv;
    n->nvml = nvml_open(&nv, n->nvml_why, sizeof n->nvml_why);
    if (!n->nvml) {
        for (int i = 0; i < n->ngpus; i++)
            snprintf(n->gpus[i].fabric_why, sizeof n->gpus[i].fabric_why, "%s", n->nvml_why);
        return;
    }
    nvml_device_t dev[MT_TOPO_MAX_GPUS] = { 0 };
    for (int i = 0; i < n->ngpus; i++) {
        struct mt_topo_gpu *g = &n->gpus[i];
        nvml_return_t rc = nv.by_pci(g->pci, &dev[i]);
        if (rc != NVML_SUCCESS) {
            dev[i] = NULL;
            snprintf(g->fabric_why, sizeof g->fabric_why, "NVML does not know GPU %s: %s",
                     g->pci, errstr(&nv, rc));
            continue;
        }
        if (nv.uuid && nv.uuid(dev[i], g->uuid, sizeof g->uuid) != NVML_SUCCESS)
            g->uuid[0] = '\0';
        fabric(&nv, dev[i], g);
    }
    for (int i = 0; i < n->ngpus && nv.p2p; i++) {
        if (!dev[i]) continue;
        n->gpus[i].nvlink_known = true;
        for (int j = 0; j < n->ngpus; j++) {
            int st = -1;
            if (j != i && dev[j] &&
                nv.p2p(dev[i], dev[j], NVML_P2P_CAPS_INDEX_NVLINK, &st) == NVML_SUCCESS &&
                st == NVML_P2P_STATUS_OK)
                n->gpus[i].nvlink_peers |= (uint64_t)1 << j;
        }
    }
    nvml_close(&nv);
}
