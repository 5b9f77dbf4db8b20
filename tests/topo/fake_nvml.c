/* A stand-in libnvidia-ml.so.1 for tests on machines without NVIDIA's
 * driver: the entry points moetrain uses, answering from the environment.
 *   FAKE_NVML_GPUS    comma-separated PCI bus ids it knows (others: NOT_FOUND)
 *   FAKE_NVML_FABRIC  UUIDHEX32/cliqueId/state/status for every GPU
 *                     (state 3 = COMPLETED; status 0 = success)
 *   FAKE_NVML_PEERS   "all" (every pair NVLink-connected) or "none"
 * Built twice: with nvmlDeviceGetGpuFabricInfoV (API v12 drivers), and with
 * -DFAKE_NVML_V1 only the older nvmlDeviceGetGpuFabricInfo. The structures
 * are nvml.h's own (API version 12), written out independently of
 * src/topo/nvml.c so that a layout mistake there fails here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct fake_device *nvmlDevice_t;

#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25

typedef struct {
    unsigned int version;
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
    unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct {
    unsigned char clusterUuid[16];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned char state;
} nvmlGpuFabricInfo_t;

#define nvmlGpuFabricInfo_v2 ((unsigned int)(sizeof(nvmlGpuFabricInfo_v2_t) | (2u << 24)))

struct fake_device {
    char pci[32];
};
static struct fake_device devices[64];

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char *nvmlErrorString(nvmlReturn_t r);
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pci, nvmlDevice_t *dev);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int len);
nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status);
#ifndef FAKE_NVML_V1
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t dev, nvmlGpuFabricInfo_v2_t *info);
#endif
nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t dev, nvmlGpuFabricInfo_t *info);

nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t r)
{
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pci, nvmlDevice_t *dev)
{
    const char *list = getenv("FAKE_NVML_GPUS");
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", list ? list : "");
    int i = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t && i < 64;
         t = strtok_r(NULL, ",", &save), i++)
        if (!strcmp(t, pci)) {
            snprintf(devices[i].pci, sizeof devices[i].pci, "%s", pci);
            *dev = &devices[i];
            return NVML_SUCCESS;
        }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int len)
{
    snprintf(uuid, len, "GPU-fake-%s", dev->pci);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status)
{
    const char *peers = getenv("FAKE_NVML_PEERS");
    if (index != 2) return NVML_ERROR_INVALID_ARGUMENT; /* only the NVLink index is asked */
    *status = a != b && peers && !strcmp(peers, "all") ? 0 : 5;
    return NVML_SUCCESS;
}

static nvmlReturn_t fabric(unsigned char *uuid, nvmlReturn_t *status, unsigned int *clique,
                           unsigned char *state)
{
    const char *f = getenv("FAKE_NVML_FABRIC");
    char hex[33] = "";
    unsigned c = 0, st = 0;
    int stat = 0;
    if (!f) return NVML_ERROR_NOT_SUPPORTED;
    if (sscanf(f, "%32[0-9a-f]/%u/%u/%d", hex, &c, &st, &stat) != 4 || strlen(hex) != 32)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < 16; i++) {
        unsigned byte;
        sscanf(hex + 2 * i, "%2x", &byte);
        uuid[i] = (unsigned char)byte;
    }
    *clique = c;
    *state = (unsigned char)st;
    *status = stat;
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_V1
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t dev, nvmlGpuFabricInfo_v2_t *info)
{
    (void)dev;
    if (info->version != nvmlGpuFabricInfo_v2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    info->healthMask = 0;
    return fabric(info->clusterUuid, &info->status, &info->cliqueId, &info->state);
}
#endif

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t dev, nvmlGpuFabricInfo_t *info)
{
    (void)dev;
    return fabric(info->clusterUuid, &info->status, &info->cliqueId, &info->state);
}
