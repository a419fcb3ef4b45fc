/*
 * A fake libnvidia-ml.so.1 for machines without a GPU (tests, the lab, the demo).
 *
 * wedgewatch loads it through the real nvml-wrapper code path (--nvml-lib / WEDGEWATCH_NVML_LIB).
 * It exports the NVML functions nvml-wrapper 0.13 calls for a GPU-activity sampler, with the
 * same struct layouts as nvml-wrapper-sys 0.10 (x86_64), and reads every value from state files
 * that the lab's schedulers write. Files are re-read on every call, so a writer can flip a GPU
 * from busy to idle between two samples (writers replace files atomically by rename).
 *
 * State directory: $FAKE_NVML_DIR, default /tmp/wedgewatch-lab/nvml.
 *   devices   key=value lines: device_count=N, driver_version=..., optional init_error=<code>,
 *             optional error.<nvmlSystemFunction>=<code>, optional call_delay_ms=<ms> (every
 *             call after init sleeps that long: a hung driver, for timeout tests)
 *   gpu<N>    name, uuid, util.gpu, util.memory, mem.total, mem.used, power.mw, power.limit.mw,
 *             procs=<pid>:<usedBytes>:<smPct>:<memPct>,...   optional error.<nvmlFunction>=<code>
 *
 * Real-driver quirks copied on purpose:
 *   - a missing state directory / devices file makes nvmlInit_v2 return DRIVER_NOT_LOADED (9);
 *   - nvmlDeviceGetProcessUtilization returns NOT_FOUND when no sample is newer than lastSeen,
 *     and only processes with non-zero utilization get samples.
 * $FAKE_NVML_TRACE=1 prints each call to stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

#define FAKE_MAX_FILE 16384
#define FAKE_MAX_PROCS 256

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

/* nvmlInit/nvmlShutdown are reference counted, as in the real library. */
static int g_init_count = 0;

static int init_count(void) { return __atomic_load_n(&g_init_count, __ATOMIC_SEQ_CST); }

static void trace(const char *fn) {
    const char *t = getenv("FAKE_NVML_TRACE");
    if (t && t[0] == '1') fprintf(stderr, "fake_nvml: %s\n", fn);
}

static const char *state_dir(void) {
    const char *d = getenv("FAKE_NVML_DIR");
    return (d && d[0]) ? d : "/tmp/wedgewatch-lab/nvml";
}

/* Reads <state_dir>/<name> into buf (NUL-terminated). Returns 0 on success. */
static int read_state(const char *name, char *buf, size_t cap) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", state_dir(), name);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    return 0;
}

/* Finds `key=value` at the start of a line; copies value (to end of line) into out. */
static int get_str(const char *text, const char *key, char *out, size_t cap) {
    size_t klen = strlen(key);
    const char *p = text;
    while (p && *p) {
        while (*p == ' ' || *p == '\t') p++;
        if (strncmp(p, key, klen) == 0 && p[klen] == '=') {
            const char *v = p + klen + 1;
            size_t n = strcspn(v, "\r\n");
            if (n >= cap) n = cap - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 0;
        }
        p = strchr(p, '\n');
        if (p) p++;
    }
    return -1;
}

static int get_ull(const char *text, const char *key, unsigned long long *out) {
    char v[64];
    if (get_str(text, key, v, sizeof v) != 0) return -1;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    if (end == v) return -1;
    *out = x;
    return 0;
}

/* Forced error for function `fn` in the given state text: error.<fn>=<code>. */
static nvmlReturn_t forced_error(const char *text, const char *fn) {
    char key[160];
    unsigned long long code;
    snprintf(key, sizeof key, "error.%s", fn);
    if (get_ull(text, key, &code) == 0) return (nvmlReturn_t)code;
    return NVML_SUCCESS;
}

/* A slow or hung driver: call_delay_ms in the devices file delays every call after init. */
static void maybe_delay(void) {
    char buf[FAKE_MAX_FILE];
    unsigned long long ms;
    if (read_state("devices", buf, sizeof buf) == 0 && get_ull(buf, "call_delay_ms", &ms) == 0 && ms > 0)
        usleep((useconds_t)(ms * 1000ULL));
}

/* Common prologue of system-level calls: initialized, devices file readable, no forced error. */
static nvmlReturn_t system_state(const char *fn, char *buf) {
    trace(fn);
    if (init_count() <= 0) return NVML_ERROR_UNINITIALIZED;
    maybe_delay();
    if (read_state("devices", buf, FAKE_MAX_FILE) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    return forced_error(buf, fn);
}

/* Device handles are index+1 cast to a pointer; nvml-wrapper never dereferences them. */
static nvmlReturn_t device_state(const char *fn, nvmlDevice_t dev, char *buf) {
    trace(fn);
    if (init_count() <= 0) return NVML_ERROR_UNINITIALIZED;
    unsigned long idx1 = (unsigned long)dev;
    if (idx1 == 0) return NVML_ERROR_INVALID_ARGUMENT;
    char name[32];
    snprintf(name, sizeof name, "gpu%lu", idx1 - 1);
    if (read_state(name, buf, FAKE_MAX_FILE) != 0) return NVML_ERROR_INVALID_ARGUMENT;
    return forced_error(buf, fn);
}

static nvmlReturn_t copy_str(const char *s, char *out, unsigned int len) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    size_t n = strlen(s);
    if (n + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, s, n + 1);
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int pid;
    unsigned long long used;
    unsigned int sm, mem;
} fake_proc;

/* Parses procs=<pid>:<usedBytes>:<smPct>:<memPct>,... ; returns the count. */
static int parse_procs(const char *text, fake_proc *out, int cap) {
    char v[FAKE_MAX_FILE];
    if (get_str(text, "procs", v, sizeof v) != 0) return 0;
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(v, ",", &save); tok && n < cap; tok = strtok_r(NULL, ",", &save)) {
        unsigned int pid = 0, sm = 0, mem = 0;
        unsigned long long used = 0;
        if (sscanf(tok, " %u:%llu:%u:%u", &pid, &used, &sm, &mem) >= 2 && pid != 0) {
            out[n].pid = pid;
            out[n].used = used;
            out[n].sm = sm;
            out[n].mem = mem;
            n++;
        }
    }
    return n;
}

/* ------------------------------------------------------------------------------------------ */

nvmlReturn_t nvmlInit_v2(void) {
    char buf[FAKE_MAX_FILE];
    trace("nvmlInit_v2");
    if (read_state("devices", buf, sizeof buf) != 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    unsigned long long code;
    if (get_ull(buf, "init_error", &code) == 0 && code != 0) return (nvmlReturn_t)code;
    __atomic_add_fetch(&g_init_count, 1, __ATOMIC_SEQ_CST);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void) {
    trace("nvmlShutdown");
    if (__atomic_sub_fetch(&g_init_count, 1, __ATOMIC_SEQ_CST) < 0) {
        __atomic_store_n(&g_init_count, 0, __ATOMIC_SEQ_CST);
        return NVML_ERROR_UNINITIALIZED;
    }
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    char buf[FAKE_MAX_FILE];
    nvmlReturn_t r = system_state("nvmlSystemGetDriverVersion", buf);
    if (r) return r;
    char v[128];
    if (get_str(buf, "driver_version", v, sizeof v) != 0) strcpy(v, "550.54.15");
    return copy_str(v, version, length);
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    char buf[FAKE_MAX_FILE];
    nvmlReturn_t r = system_state("nvmlDeviceGetCount_v2", buf);
    if (r) return r;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long n = 0;
    get_ull(buf, "device_count", &n);
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    char buf[FAKE_MAX_FILE];
    nvmlReturn_t r = system_state("nvmlDeviceGetHandleByIndex_v2", buf);
    if (r) return r;
    unsigned long long n = 0;
    get_ull(buf, "device_count", &n);
    if (!device || index >= n) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)(unsigned long)(index + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    char buf[FAKE_MAX_FILE];
    nvmlReturn_t r = device_state("nvmlDeviceGetName", dev, buf);
    if (r) return r;
    char v[256];
    if (get_str(buf, "name", v, sizeof v) != 0) strcpy(v, "Fake GPU");
    return copy_str(v, name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    char buf[FAKE_MAX_FILE];
    nvmlReturn_t r = device_state("nvmlDeviceGetUUID", dev, buf);
    if (r) return r;
    char v[256];
    if (get_str(buf, "uuid", v, sizeof v) != 0)
        snprintf(v, sizeof v, "GPU-fake-%08lu", (unsigned long)dev - 1);
    return copy_str(v, uuid, length);
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u) {
    char buf[FAKE_MAX_FILE];
    nvmlReturn_t r = device_state("nvmlDeviceGetUtilizationRates", dev, buf);
    if (r) return r;
    if (!u) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long g = 0, m = 0;
    get_ull(buf, "util.gpu", &g);
    get_ull(buf, "util.memory", &m);
    u->gpu = (unsigned int)g;
    u->memory = (unsigned int)m;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *mem) {
    char buf[FAKE_MAX_FILE];
    nvmlReturn_t r = device_state("nvmlDeviceGetMemoryInfo_v2", dev, buf);
    if (r) return r;
    if (!mem) return NVML_ERROR_INVALID_ARGUMENT;
    if (mem->version != (unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    unsigned long long total = 0, used = 0, reserved = 0;
    get_ull(buf, "mem.total", &total);
    get_ull(buf, "mem.used", &used);
    get_ull(buf, "mem.reserved", &reserved);
    mem->total = total;
    mem->used = used;
    mem->reserved = reserved;
    mem->free = total > used + reserved ? total - used - reserved : 0;
    return NVML_SUCCESS;
}

static nvmlReturn_t get_uint_field(const char *fn, nvmlDevice_t dev, const char *key,
                                   unsigned int *out) {
    char buf[FAKE_MAX_FILE];
    nvmlReturn_t r = device_state(fn, dev, buf);
    if (r) return r;
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned long long v;
    /* A GPU without the value behaves like one that does not support the query. */
    if (get_ull(buf, key, &v) != 0) return NVML_ERROR_NOT_SUPPORTED;
    *out = (unsigned int)v;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *power) {
    return get_uint_field("nvmlDeviceGetPowerUsage", dev, "power.mw", power);
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned int *limit) {
    return get_uint_field("nvmlDeviceGetEnforcedPowerLimit", dev, "power.limit.mw", limit);
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t dev, unsigned int *limit) {
    return get_uint_field("nvmlDeviceGetPowerManagementLimit", dev, "power.limit.mw", limit);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *infoCount,
                                                     nvmlProcessInfo_t *infos) {
    char buf[FAKE_MAX_FILE];
    fake_proc procs[FAKE_MAX_PROCS];
    nvmlReturn_t r = device_state("nvmlDeviceGetComputeRunningProcesses_v3", dev, buf);
    if (r) return r;
    if (!infoCount) return NVML_ERROR_INVALID_ARGUMENT;
    int n = parse_procs(buf, procs, FAKE_MAX_PROCS);
    if (*infoCount < (unsigned int)n || (!infos && n > 0)) {
        *infoCount = (unsigned int)n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++) {
        infos[i].pid = procs[i].pid;
        infos[i].usedGpuMemory = procs[i].used;
        infos[i].gpuInstanceId = 0xFFFFFFFFu;
        infos[i].computeInstanceId = 0xFFFFFFFFu;
    }
    *infoCount = (unsigned int)n;
    return NVML_SUCCESS;
}

static unsigned long long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ULL + (unsigned long long)ts.tv_nsec / 1000ULL;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev,
                                             nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount,
                                             unsigned long long lastSeenTimeStamp) {
    char buf[FAKE_MAX_FILE];
    fake_proc procs[FAKE_MAX_PROCS];
    nvmlReturn_t r = device_state("nvmlDeviceGetProcessUtilization", dev, buf);
    if (r) return r;
    if (!processSamplesCount) return NVML_ERROR_INVALID_ARGUMENT;
    int n = parse_procs(buf, procs, FAKE_MAX_PROCS);
    /* Every call "produces" samples stamped now; the driver keeps only non-zero ones. */
    unsigned long long ts = now_us();
    int active = 0;
    for (int i = 0; i < n; i++)
        if (procs[i].sm > 0 || procs[i].mem > 0) active++;
    if (active == 0 || ts <= lastSeenTimeStamp) return NVML_ERROR_NOT_FOUND;
    if (!utilization || *processSamplesCount < (unsigned int)active) {
        *processSamplesCount = (unsigned int)active;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (procs[i].sm == 0 && procs[i].mem == 0) continue;
        utilization[k].pid = procs[i].pid;
        utilization[k].timeStamp = ts;
        utilization[k].smUtil = procs[i].sm;
        utilization[k].memUtil = procs[i].mem;
        utilization[k].encUtil = 0;
        utilization[k].decUtil = 0;
        k++;
    }
    *processSamplesCount = (unsigned int)k;
    return NVML_SUCCESS;
}
