/* NVLink-domain keys: where each GPU's domain comes from. Keys carry their
 * source as a prefix ("nvml:", "slurm:", "host:", "file:") so keys from
 * different sources never collide. */
#include "config.h"

#include "topo/topo_internal.h"

#include <stdlib.h>
#include <string.h>

void mt_topo_map_free(struct mt_topo_map *m)
{
    free(m->host);
    free(m->key);
    memset(m, 0, sizeof *m);
}

static int map_push(struct mt_topo_map *m, int *cap, const char *host, const char *key,
                    struct mt_err *err)
{
    if (m->n == *cap) {
        int nc = *cap ? 2 * *cap : 64;
        void *h = realloc(m->host, (size_t)nc * sizeof m->host[0]);
        if (h) m->host = h;
        void *k = h ? realloc(m->key, (size_t)nc * sizeof m->key[0]) : NULL;
        if (!k) return mt_err_set(err, MT_ENOMEM, "out of memory reading a map of %d lines", nc);
        m->key = k;
        *cap = nc;
    }
    mt_topo_copy(m->host[m->n], sizeof m->host[0], host);
    mt_topo_copy(m->key[m->n], sizeof m->key[0], key);
    m->n++;
    return MT_OK;
}

int mt_topo_map_read(const char *path, struct mt_topo_map *out, struct mt_err *err)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return mt_err_errno(err, "%s", path);
    char line[1024];
    int lineno = 0, cap = 0, rc = MT_OK;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char host[256], key[256], extra[8];
        int got = sscanf(line, "%255s %255s %7s", host, key, extra);
        if (got <= 0) continue;
        if (got != 2) {
            rc = mt_err_set(err, MT_EINVAL,
                            "%s:%d: expected 'hostname domain_key' (two words), got '%s'", path,
                            lineno, strtok(line, "\n"));
            break;
        }
        if (strlen(host) >= MT_TOPO_HOST_MAX || strlen(key) >= MT_TOPO_DOMAIN_MAX - 8) {
            rc = mt_err_set(err, MT_EINVAL, "%s:%d: hostname (max %d) or domain key (max %d) "
                                            "too long",
                            path, lineno, MT_TOPO_HOST_MAX - 1, MT_TOPO_DOMAIN_MAX - 9);
            break;
        }
        if ((rc = map_push(out, &cap, host, key, err)) != MT_OK) break;
    }
    if (rc == MT_OK && ferror(f)) rc = mt_err_errno(err, "reading %s", path);
    fclose(f);
    if (rc == MT_OK && out->n == 0)
        rc = mt_err_set(err, MT_EINVAL, "%s: no 'hostname domain_key' lines", path);
    if (rc != MT_OK) mt_topo_map_free(out);
    return rc;
}

/* Exact hostname first, then equal short names (up to the first '.'). */
static const char *map_lookup(const struct mt_topo_map *m, const char *host)
{
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->host[i], host)) return m->key[i];
    size_t hl = strcspn(host, ".");
    for (int i = 0; i < m->n; i++)
        if (strcspn(m->host[i], ".") == hl && !strncmp(m->host[i], host, hl)) return m->key[i];
    return NULL;
}

static int from_file(const char *path, const char *host, char *key, size_t len,
                     struct mt_err *err)
{
    if (!path[0])
        return mt_err_set(err, MT_EINVAL,
                          "&topology nvlink_domain_source = 'file' needs domain_map_file = "
                          "'FILE' (lines of 'hostname domain_key')");
    struct mt_topo_map m;
    MT_CHECK(mt_topo_map_read(path, &m, err));
    const char *k = map_lookup(&m, host);
    int rc = MT_OK;
    if (k)
        snprintf(key, len, "file:%s", k);
    else
        rc = mt_err_set(err, MT_EINVAL,
                        "&topology domain_map_file = '%s' has no line for host '%s' (%d hosts "
                        "listed); add '%s DOMAIN_KEY'",
                        path, host, m.n, host);
    mt_topo_map_free(&m);
    return rc;
}

/* SLURM_TOPOLOGY_ADDR is the dotted path of switch names from the top switch
 * down to the leaf, ending with the node name (topology/tree; topology/block
 * gives block.node). Everything but the node is the domain: the leaf switch
 * or block, with its ancestors so that equal leaf names stay distinct. */
static int from_slurm(char *key, size_t len, struct mt_err *err)
{
    const char *addr = getenv("SLURM_TOPOLOGY_ADDR");
    const char *pattern = getenv("SLURM_TOPOLOGY_ADDR_PATTERN");
    if (!addr || !addr[0])
        return mt_err_set(err, MT_EINVAL,
                          "&topology nvlink_domain_source = 'slurm': SLURM_TOPOLOGY_ADDR is not "
                          "set (Slurm sets it only with TopologyPlugin=topology/tree or "
                          "topology/block and a topology.conf); use 'nvml', 'host' or 'file'");
    const char *dot = strrchr(addr, '.');
    if (!dot || dot == addr)
        return mt_err_set(err, MT_EINVAL,
                          "&topology nvlink_domain_source = 'slurm': SLURM_TOPOLOGY_ADDR = '%s' "
                          "names no switch or block above the node (SLURM_TOPOLOGY_ADDR_PATTERN "
                          "= '%s'); check topology.conf",
                          addr, pattern ? pattern : "");
    snprintf(key, len, "slurm:%.*s", (int)(dot - addr), addr);
    return MT_OK;
}

static int from_nvml(const struct mt_topo_node *n, int gpu, char *key, size_t len,
                     struct mt_err *err)
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (gpu < 0)
        return mt_err_set(err, MT_EINVAL,
                          "&topology nvlink_domain_source = 'nvml': this process has no GPU "
                          "(%d NVIDIA GPUs on %s, CUDA_VISIBLE_DEVICES %s%s%s); use 'host' for "
                          "CPU runs",
                          n->ngpus, n->source, vis ? "= '" : "unset", vis ? vis : "",
                          vis ? "'" : "");
    const struct mt_topo_gpu *g = &n->gpus[gpu];
    if (!g->fabric[0])
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "&topology nvlink_domain_source = 'nvml': GPU %s has no NVLink fabric "
                          "domain (%s); multi-node NVLink (GB200 NVL72 and the like) needs the "
                          "driver's fabric manager/IMEX; use 'auto' or 'host' where each node "
                          "is its own NVLink domain",
                          g->pci, g->fabric_why);
    snprintf(key, len, "nvml:%s", g->fabric);
    return MT_OK;
}

int mt_topo_domain_key(const struct mt_config_topology *t, const struct mt_topo_node *n,
                       int gpu, const char *hostname, char *key, size_t keylen,
                       struct mt_err *err)
{
    const char *src = t->nvlink_domain_source;
    if (!strcmp(src, "auto"))
        src = gpu >= 0 && n->gpus[gpu].fabric[0] ? "nvml" : "host";
    if (!strcmp(src, "nvml")) return from_nvml(n, gpu, key, keylen, err);
    if (!strcmp(src, "slurm")) return from_slurm(key, keylen, err);
    if (!strcmp(src, "file")) return from_file(t->domain_map_file, hostname, key, keylen, err);
    if (!strcmp(src, "host")) {
        snprintf(key, keylen, "host:%s", hostname);
        return MT_OK;
    }
    return mt_err_set(err, MT_EINVAL, "&topology nvlink_domain_source = '%s' is not one of "
                                      "auto, nvml, slurm, host, file", t->nvlink_domain_source);
}
