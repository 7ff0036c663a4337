/* A TEST DOUBLE of the Neuron Runtime (libnrt.so.1), built only for backplane's tests. It implements the
 * documented entry points the Neuron plugin uses, with the documented signatures and status codes, on
 * host memory and TCP sockets:
 *   - tensors are host buffers (placement and core recorded; a per-core memory limit gives NRT_RESOURCE);
 *   - a "NEFF" is a small text format of this double (see nrt_load), with two operations;
 *   - collectives meet at NEURON_RT_ROOT_COMM_ID: global rank 0 runs a hub that gathers each operation's
 *     contributions, reduces them (f16/bf16 in f32, integers wrapping) and answers every member; each
 *     process runs scheduled collectives in order on a worker thread, as the runtime's queue does.
 * Here: init, cores, tensors, tensor sets and "NEFFs"; the collectives in
 * nrt_test_double_collectives.c, the hub in nrt_test_double_hub.c. It proves the plugin's logic up to the
 * runtime boundary. It is not the runtime and talks to no
 * hardware. Built as NRT_TEST_DOUBLE_INCOMPLETE it lacks nrta_cc_prepare, like a runtime too old. */
#define _GNU_SOURCE
#include "nrt_test_double.h"

/* ---- state ---- */

static int initialized;
int runtime_initialized(void) { return initialized; }
static size_t bytes_used, bytes_limit = (size_t)1 << 30; /* per core; NRT_TEST_DOUBLE_MEMORY_LIMIT overrides */
static pthread_mutex_t state_mutex = PTHREAD_MUTEX_INITIALIZER;

int env_int(const char* name, int fallback) {
  const char* value = getenv(name);
  return value != NULL && *value != '\0' ? atoi(value) : fallback;
}

/* ---- version, init, cores ---- */

typedef struct {
  uint64_t rt_major, rt_minor, rt_patch, rt_maintenance;
  char rt_detail[128];
  char git_hash[64];
} nrt_version_t;

EXPORT int nrt_get_version(nrt_version_t* version, size_t size) {
  if (size < 160) return NRT_INVALID; /* as the runtime answers a struct that is too small */
  memset(version, 0, size < sizeof(*version) ? size : sizeof(*version));
  version->rt_major = 2;
  version->rt_minor = 99;
  strcpy(version->rt_detail, "backplane test double");
  return NRT_SUCCESS;
}

EXPORT int nrt_init(int framework, const char* fw_version, const char* fal_version) {
  (void)fw_version, (void)fal_version;
  if (framework != 1) return NRT_INVALID; /* the plugin runs framework-less */
  const char* limit = getenv("NRT_TEST_DOUBLE_MEMORY_LIMIT");
  if (limit != NULL) bytes_limit = (size_t)strtoull(limit, NULL, 10);
  initialized = 1;
  return NRT_SUCCESS;
}
EXPORT void nrt_close(void) {
  stop_collectives();
  initialized = 0;
}
EXPORT int nrt_get_total_vnc_count(uint32_t* count) {
  *count = (uint32_t)env_int("NRT_TEST_DOUBLE_CORES", 2);
  return NRT_SUCCESS;
}
EXPORT int nrt_get_visible_vnc_count(uint32_t* count) {
  *count = 1;
  return NRT_SUCCESS;
}

/* ---- tensors ---- */

EXPORT int nrt_tensor_allocate(int placement, int vnc, size_t size, const char* name, nrt_tensor_t** tensor) {
  if (!initialized) return NRT_UNINITIALIZED;
  if (placement == 0 && vnc != 0) return NRT_INVALID; /* one visible core per process: index 0 */
  if (size == 0) return NRT_INVALID;
  pthread_mutex_lock(&state_mutex);
  const int full = placement == 0 && bytes_used + size > bytes_limit;
  if (!full && placement == 0) bytes_used += size;
  pthread_mutex_unlock(&state_mutex);
  if (full) return NRT_RESOURCE;
  nrt_tensor_t* t = calloc(1, sizeof(*t));
  t->data = calloc(1, size);
  t->size = size;
  t->owns = 1;
  t->placement = placement;
  snprintf(t->name, sizeof(t->name), "%s", name != NULL ? name : "");
  *tensor = t;
  return NRT_SUCCESS;
}
EXPORT void nrt_tensor_free(nrt_tensor_t** tensor) {
  if (tensor == NULL || *tensor == NULL) return;
  if ((*tensor)->owns) {
    if ((*tensor)->placement == 0) {
      pthread_mutex_lock(&state_mutex);
      bytes_used -= (*tensor)->size;
      pthread_mutex_unlock(&state_mutex);
    }
    free((*tensor)->data);
  }
  free(*tensor);
  *tensor = NULL;
}
EXPORT int nrt_tensor_allocate_slice(const nrt_tensor_t* source, size_t offset, size_t size, const char* name,
                                     nrt_tensor_t** slice) {
  if (source == NULL || size == 0 || offset > source->size || size > source->size - offset) return NRT_INVALID;
  nrt_tensor_t* t = calloc(1, sizeof(*t));
  t->data = source->data + offset;
  t->size = size;
  t->placement = source->placement;
  snprintf(t->name, sizeof(t->name), "%s", name != NULL ? name : "");
  *slice = t;
  return NRT_SUCCESS;
}
static int in_range(const nrt_tensor_t* t, size_t offset, size_t size) {
  return t != NULL && offset <= t->size && size <= t->size - offset;
}
EXPORT int nrt_tensor_read(const nrt_tensor_t* t, void* buf, size_t offset, size_t size) {
  if (!in_range(t, offset, size)) return NRT_INVALID;
  memcpy(buf, t->data + offset, size);
  return NRT_SUCCESS;
}
EXPORT int nrt_tensor_write(nrt_tensor_t* t, const void* buf, size_t offset, size_t size) {
  if (!in_range(t, offset, size)) return NRT_INVALID;
  memcpy(t->data + offset, buf, size);
  return NRT_SUCCESS;
}
EXPORT int nrt_tensor_copy(const nrt_tensor_t* s, size_t so, nrt_tensor_t* d, size_t dof, size_t size) {
  if (!in_range(s, so, size) || !in_range(d, dof, size)) return NRT_INVALID;
  memmove(d->data + dof, s->data + so, size);
  return NRT_SUCCESS;
}
EXPORT size_t nrt_tensor_get_size(const nrt_tensor_t* t) { return t->size; }

typedef struct { size_t bytes_used, bytes_limit; } nrt_vnc_memory_stats_t;
EXPORT int nrt_get_vnc_memory_stats(uint32_t vnc, nrt_vnc_memory_stats_t* stats, size_t size_in, size_t* size_out) {
  if (vnc != 0 || size_in < sizeof(*stats)) return NRT_INVALID;
  pthread_mutex_lock(&state_mutex);
  stats->bytes_used = bytes_used;
  stats->bytes_limit = bytes_limit;
  pthread_mutex_unlock(&state_mutex);
  *size_out = sizeof(*stats);
  return NRT_SUCCESS;
}

/* ---- tensor sets ---- */

#define SET_CAPACITY 16
typedef struct {
  int count;
  char names[SET_CAPACITY][256];
  nrt_tensor_t* tensors[SET_CAPACITY];
} tensor_set_t;

EXPORT int nrt_allocate_tensor_set(void** set) {
  *set = calloc(1, sizeof(tensor_set_t));
  return NRT_SUCCESS;
}
EXPORT void nrt_destroy_tensor_set(void** set) {
  free(*set);
  *set = NULL;
}
EXPORT int nrt_add_tensor_to_tensor_set(void* set, const char* name, nrt_tensor_t* tensor) {
  tensor_set_t* s = set;
  if (s == NULL || name == NULL || strlen(name) >= 256 || s->count == SET_CAPACITY) return NRT_INVALID;
  snprintf(s->names[s->count], 256, "%s", name);
  s->tensors[s->count++] = tensor;
  return NRT_SUCCESS;
}
static nrt_tensor_t* set_lookup(const tensor_set_t* s, const char* name) {
  for (int i = 0; s != NULL && i < s->count; ++i)
    if (strcmp(s->names[i], name) == 0) return s->tensors[i];
  return NULL;
}

/* ---- "NEFFs": the double's own text format ----
 *   bpl-test-neff
 *   op add            (out0 = in0 + in1, f32) | op nan (completes with NRT_EXEC_COMPLETED_WITH_NUM_ERR)
 *   in <name> <dtype code> <dims…>
 *   out <name> <dtype code> <dims…>                                                                    */

#define MAX_PORTS 8
typedef struct {
  char name[256];
  int usage; /* 0 input, 1 output */
  size_t size;
  int dtype;
  uint32_t* shape;
  uint32_t ndim;
} tensor_info_t;
typedef struct {
  uint64_t count;
  tensor_info_t array[];
} tensor_info_array_t;

typedef struct nrt_model {
  char op[16];
  int ports;
  tensor_info_t port[MAX_PORTS];
  uint32_t dims[MAX_PORTS][8];
} nrt_model_t;

size_t dtype_bytes(int dtype) {
  switch (dtype) {
    case DT_INT8: case DT_UINT8: return 1;
    case DT_BF16: case DT_F16: return 2;
    case DT_INT32: case DT_F32: return 4;
    case DT_INT64: return 8;
    default: return 0;
  }
}

EXPORT int nrt_load(const void* neff, size_t size, int32_t vnc, int32_t vnc_count, nrt_model_t** model) {
  (void)vnc_count;
  if (!initialized) return NRT_UNINITIALIZED;
  if (vnc != 0) return NRT_INVALID;
  static const char magic[] = "bpl-test-neff\n";
  if (size < sizeof(magic) - 1 || memcmp(neff, magic, sizeof(magic) - 1) != 0) return NRT_INVALID;
  char* text = strndup(neff, size);
  nrt_model_t* m = calloc(1, sizeof(*m));
  int status = NRT_SUCCESS;
  char* save = NULL;
  for (char* line = strtok_r(text + sizeof(magic) - 1, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
    char kind[8], name[200];
    int used = 0;
    if (sscanf(line, "op %15s", m->op) == 1) continue;
    if (sscanf(line, "%7s %199s %d%n", kind, name, &m->port[m->ports].dtype, &used) != 3 || m->ports == MAX_PORTS ||
        dtype_bytes(m->port[m->ports].dtype) == 0) {
      status = NRT_INVALID;
      break;
    }
    tensor_info_t* p = &m->port[m->ports];
    snprintf(p->name, sizeof(p->name), "%s", name);
    p->usage = strcmp(kind, "out") == 0;
    p->shape = m->dims[m->ports];
    p->size = dtype_bytes(p->dtype);
    for (char* rest = line + used; p->ndim < 8;) {
      char* end = NULL;
      const unsigned long extent = strtoul(rest, &end, 10);
      if (end == rest) break;
      p->shape[p->ndim++] = (uint32_t)extent;
      p->size *= extent;
      rest = end;
    }
    m->ports++;
  }
  free(text);
  if (status == NRT_SUCCESS && strcmp(m->op, "add") != 0 && strcmp(m->op, "nan") != 0) status = NRT_INVALID;
  if (status != NRT_SUCCESS) {
    free(m);
    return status;
  }
  *model = m;
  return NRT_SUCCESS;
}
EXPORT int nrt_unload(nrt_model_t* model) {
  free(model);
  return NRT_SUCCESS;
}
EXPORT int nrt_get_model_tensor_info(nrt_model_t* model, tensor_info_array_t** info) {
  tensor_info_array_t* a = calloc(1, sizeof(*a) + (size_t)model->ports * sizeof(tensor_info_t));
  a->count = (uint64_t)model->ports;
  for (int i = 0; i < model->ports; ++i) {
    a->array[i] = model->port[i];
    a->array[i].shape = malloc(8 * sizeof(uint32_t));
    memcpy(a->array[i].shape, model->port[i].shape, 8 * sizeof(uint32_t));
  }
  *info = a;
  return NRT_SUCCESS;
}
EXPORT int nrt_free_model_tensor_info(tensor_info_array_t* info) {
  for (uint64_t i = 0; i < info->count; ++i) free(info->array[i].shape);
  free(info);
  return NRT_SUCCESS;
}
EXPORT int nrt_execute(nrt_model_t* model, const void* inputs, void* outputs) {
  nrt_tensor_t* bound[MAX_PORTS];
  for (int i = 0; i < model->ports; ++i) {
    bound[i] = set_lookup(model->port[i].usage ? outputs : inputs, model->port[i].name);
    if (bound[i] == NULL || bound[i]->size != model->port[i].size) return NRT_EXEC_BAD_INPUT;
  }
  if (strcmp(model->op, "nan") == 0) return NRT_EXEC_COMPLETED_WITH_NUM_ERR;
  /* add: the first output = the first two inputs, elementwise in f32 */
  const float* a = (const float*)bound[0]->data;
  const float* b = (const float*)bound[1]->data;
  float* out = (float*)bound[2]->data;
  for (size_t i = 0; i < model->port[2].size / sizeof(float); ++i) out[i] = a[i] + b[i];
  return NRT_SUCCESS;
}
