/* A TEST DOUBLE of the Neuron Runtime (libnrt.so.1), built only for backplane's tests. It implements the
 * documented entry points the Neuron plugin uses, with the documented signatures and status codes, on
 * host memory and TCP sockets:
 *   - tensors are host buffers (placement and core recorded; a per-core memory limit gives NRT_RESOURCE);
 *   - a "NEFF" is a small text format of this double (see nrt_load), with two operations;
 *   - collectives meet at NEURON_RT_ROOT_COMM_ID: global rank 0 runs a hub that gathers each operation's
 *     contributions, reduces them (f16/bf16 in f32, integers wrapping) and answers every member; each
 *     process runs scheduled collectives in order on a worker thread, as the runtime's queue does.
 * It proves the plugin's logic up to the runtime boundary. It is not the runtime and talks to no
 * hardware. Built as NRT_TEST_DOUBLE_INCOMPLETE it lacks nrta_cc_prepare, like a runtime too old. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

enum { NRT_SUCCESS = 0, NRT_FAILURE = 1, NRT_INVALID = 2, NRT_RESOURCE = 4, NRT_TIMEOUT = 5,
       NRT_UNINITIALIZED = 13, NRT_EXEC_BAD_INPUT = 1002, NRT_EXEC_COMPLETED_WITH_NUM_ERR = 1003 };
enum { DT_INT8 = 0x2, DT_UINT8 = 0x3, DT_BF16 = 0x6, DT_F16 = 0x7, DT_INT32 = 0x8, DT_F32 = 0xA, DT_INT64 = 0xC };
enum { OP_ADD = 0, OP_MAX = 2, OP_MIN = 3 };
enum { CC_ALLGATHER = 0, CC_ALLREDUCE = 1, CC_REDUCESCATTER = 2 };
#define COLLECTIVES_XU 4ull
#define SEQ_MASK ((1ull << 48) - 1)
#define MAX_GROUP 64

/* ---- state ---- */

static int initialized;
static size_t bytes_used, bytes_limit = (size_t)1 << 30; /* per core; NRT_TEST_DOUBLE_MEMORY_LIMIT overrides */
static pthread_mutex_t state_mutex = PTHREAD_MUTEX_INITIALIZER;

static int env_int(const char* name, int fallback) {
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

static void stop_collectives(void);

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

typedef struct nrt_tensor {
  char* data;
  size_t size;
  int owns, placement;
  char name[64];
} nrt_tensor_t;

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

static size_t dtype_bytes(int dtype) {
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

/* ---- collectives ---- */

typedef struct {
  uint32_t* replica_group;
  uint32_t rank, rank_n, ctx_device_id, ctx_device_count, vnc;
} nrt_cc_comm_t;
typedef struct {
  nrt_tensor_t** tensors;
  size_t num_tensors;
} nrt_tensor_list_t;
typedef struct {
  uint64_t seq_id, error_code;
} nrta_error_t;
typedef struct nrta_error_tracker {
  pthread_mutex_t mutex;
  size_t count;
  nrta_error_t errors[1024];
} nrta_error_tracker_t;

/* One scheduled collective: a copy of its communicator and tensors. */
typedef struct nrt_cc_context {
  uint32_t group[MAX_GROUP];
  uint32_t rank, rank_n;
  nrt_tensor_t *in, *out;
  int dtype, op, cc_op;
  uint64_t sequence;
  nrta_error_tracker_t* errors;
  struct nrt_cc_context* next;
} nrt_cc_context_t;

/* What a member sends the hub, then its input; the hub answers a reply, then the member's output. */
typedef struct {
  uint32_t group_n, rank, cc_op, dtype, op, pad;
  uint64_t instance; /* how many collectives this member ran on this group before */
  uint64_t in_bytes, out_bytes;
  uint32_t group[MAX_GROUP];
} request_t;
typedef struct {
  uint64_t status, bytes;
} reply_t;

static struct {
  pthread_mutex_t mutex;
  pthread_cond_t wake;
  int global_rank, world, socket, stopping, started;
  time_t stop_deadline; /* the hub serves the others until they leave, or until then */
  pthread_t worker, hub;
  int hub_listener;
  nrt_cc_context_t *head, *tail;
  uint64_t scheduled, completed;
  /* per-group instance counters of this member */
  uint32_t groups[64][MAX_GROUP + 1];
  uint64_t instances[64];
  int group_count;
} cc = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 1, -1, 0, 0, 0, 0, 0, -1, NULL, NULL, 0, 0, {{0}}, {0}, 0};

static int send_all(int fd, const void* data, size_t size) {
  const char* p = data;
  while (size > 0) {
    ssize_t n = send(fd, p, size, MSG_NOSIGNAL);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return -1;
    }
    p += n, size -= (size_t)n;
  }
  return 0;
}
static int recv_all(int fd, void* data, size_t size) {
  char* p = data;
  while (size > 0) {
    ssize_t n = recv(fd, p, size, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      return -1;
    }
    p += n, size -= (size_t)n;
  }
  return 0;
}

/* f16 and bf16 to and from f32, rounding to nearest even. */
static float half_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  float value;
  if (exponent == 0) value = ldexpf((float)mantissa, -24);
  else if (exponent == 31) value = mantissa ? NAN : INFINITY;
  else value = ldexpf((float)(mantissa | 0x400), (int)exponent - 25);
  uint32_t bits;
  memcpy(&bits, &value, 4);
  bits |= sign;
  memcpy(&value, &bits, 4);
  return value;
}
static uint16_t float_to_half(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
  const float magnitude = fabsf(f);
  if (isnan(f)) return sign | 0x7e00;
  if (magnitude >= 65520.0f) return sign | 0x7c00;
  if (magnitude < ldexpf(1.0f, -14)) return sign | (uint16_t)lrintf(magnitude * ldexpf(1.0f, 24));
  int exponent;
  const float fraction = frexpf(magnitude, &exponent); /* magnitude = fraction * 2^exponent, fraction in [0.5, 1) */
  long mantissa = lrintf(ldexpf(fraction, 11));       /* 11 bits, rounded to nearest even */
  if (mantissa == 2048) mantissa = 1024, ++exponent;
  return sign | (uint16_t)(((exponent + 14) << 10) | (mantissa & 0x3ff));
}
static float bf16_to_float(uint16_t b) {
  uint32_t bits = (uint32_t)b << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
static uint16_t float_to_bf16(float f) {
  uint32_t bits;
  memcpy(&bits, &f, 4);
  if (isnan(f)) return (uint16_t)((bits >> 16) | 0x40);
  bits += 0x7fff + ((bits >> 16) & 1);
  return (uint16_t)(bits >> 16);
}

/* out[i] = reduction over `n` inputs in order, accumulating floats in f32 and wrapping integers. */
static void reduce_all(void* out, char** in, int n, size_t count, int dtype, int op) {
#define REDUCE(T, W)                                                                         \
  for (size_t i = 0; i < count; ++i) {                                                       \
    T acc = ((T*)in[0])[i];                                                                  \
    for (int r = 1; r < n; ++r) {                                                            \
      T v = ((T*)in[r])[i];                                                                  \
      acc = op == OP_ADD ? (T)((W)acc + (W)v) : op == OP_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc); \
    }                                                                                        \
    ((T*)out)[i] = acc;                                                                      \
  }
#define REDUCE_16(TO_FLOAT, FROM_FLOAT)                                                      \
  for (size_t i = 0; i < count; ++i) {                                                       \
    float acc = TO_FLOAT(((uint16_t*)in[0])[i]);                                             \
    for (int r = 1; r < n; ++r) {                                                            \
      float v = TO_FLOAT(((uint16_t*)in[r])[i]);                                             \
      acc = op == OP_ADD ? acc + v : op == OP_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc); \
    }                                                                                        \
    ((uint16_t*)out)[i] = FROM_FLOAT(acc);                                                   \
  }
  switch (dtype) {
    case DT_F32: REDUCE(float, float) break;
    case DT_INT8: REDUCE(int8_t, uint8_t) break;
    case DT_UINT8: REDUCE(uint8_t, uint8_t) break;
    case DT_INT32: REDUCE(int32_t, uint32_t) break;
    case DT_INT64: REDUCE(int64_t, uint64_t) break;
    case DT_F16: REDUCE_16(half_to_float, float_to_half) break;
    case DT_BF16: REDUCE_16(bf16_to_float, float_to_bf16) break;
  }
#undef REDUCE
#undef REDUCE_16
}

/* Computes what every member of a completed operation receives. `in[r]` is member r's input. */
static char** outputs_of(const request_t* q, char** in) {
  char** out = calloc(q->group_n, sizeof(char*));
  const int n = (int)q->group_n;
  if (q->cc_op == CC_ALLGATHER) {
    char* all = malloc(q->out_bytes);
    for (int r = 0; r < n; ++r) memcpy(all + (size_t)r * q->in_bytes, in[r], q->in_bytes);
    for (int r = 0; r < n; ++r) out[r] = r == 0 ? all : memcpy(malloc(q->out_bytes), all, q->out_bytes);
  } else {
    char* reduced = malloc(q->in_bytes);
    reduce_all(reduced, in, n, q->in_bytes / dtype_bytes((int)q->dtype), (int)q->dtype, (int)q->op);
    for (int r = 0; r < n; ++r) {
      out[r] = malloc(q->out_bytes);
      memcpy(out[r], reduced + (q->cc_op == CC_REDUCESCATTER ? (size_t)r * q->out_bytes : 0), q->out_bytes);
    }
    free(reduced);
  }
  return out;
}

/* ---- the hub (global rank 0's process) ---- */

typedef struct pending {
  request_t request;   /* of the first member to arrive: the operation's key */
  int arrived;
  int fd[MAX_GROUP];   /* by member rank; -1 until it arrives */
  char* in[MAX_GROUP];
  struct pending* next;
} pending_t;

static int same_operation(const request_t* a, const request_t* b) {
  return a->group_n == b->group_n && a->instance == b->instance &&
         memcmp(a->group, b->group, a->group_n * sizeof(uint32_t)) == 0;
}

static void answer(pending_t* p, uint64_t status) {
  char** out = status == NRT_SUCCESS ? outputs_of(&p->request, p->in) : NULL;
  for (uint32_t r = 0; r < p->request.group_n; ++r) {
    if (p->fd[r] >= 0) {
      reply_t reply = {status, status == NRT_SUCCESS ? p->request.out_bytes : 0};
      send_all(p->fd[r], &reply, sizeof(reply));
      if (out != NULL) send_all(p->fd[r], out[r], p->request.out_bytes);
    }
    if (out != NULL) free(out[r]);
    free(p->in[r]);
  }
  free(out);
}

static void* hub_main(void* unused) {
  (void)unused;
  const int world = cc.world < 1 ? 1 : cc.world > MAX_GROUP ? MAX_GROUP : cc.world;
  int fds[MAX_GROUP], dead[MAX_GROUP] = {0};
  uint32_t member_of_fd[MAX_GROUP];
  int connected = 0;
  pending_t* pending = NULL;
  while (connected < world) { /* every member says hello with its global rank */
    int fd = accept(cc.hub_listener, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR) continue;
      return NULL; /* closed by stop_collectives */
    }
    uint32_t who = 0;
    if (recv_all(fd, &who, sizeof(who)) != 0 || who >= (uint32_t)world) {
      close(fd);
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    fds[connected] = fd, member_of_fd[connected] = who, ++connected;
  }
  struct pollfd polls[MAX_GROUP];
  for (;;) {
    for (int i = 0; i < world; ++i) polls[i] = (struct pollfd){dead[member_of_fd[i]] ? -1 : fds[i], POLLIN, 0};
    if (poll(polls, (nfds_t)world, 200) < 0 && errno != EINTR) break;
    int gone = 0;
    for (int i = 0; i < world; ++i) gone += dead[i];
    if (gone == world || (cc.stopping && time(NULL) >= cc.stop_deadline)) break;
    for (int i = 0; i < world; ++i) {
      if (polls[i].revents == 0) continue;
      request_t q;
      if (recv_all(fds[i], &q, sizeof(q)) != 0) { /* a member went away: fail what waits on it */
        dead[member_of_fd[i]] = 1;
        for (pending_t** p = &pending; *p != NULL;) {
          int involved = 0;
          for (uint32_t r = 0; r < (*p)->request.group_n; ++r) involved |= (*p)->request.group[r] == member_of_fd[i];
          if (!involved) { p = &(*p)->next; continue; }
          pending_t* gone = *p;
          *p = gone->next;
          answer(gone, NRT_FAILURE);
          free(gone);
        }
        continue;
      }
      char* input = malloc(q.in_bytes ? q.in_bytes : 1);
      if (recv_all(fds[i], input, q.in_bytes) != 0) { free(input); dead[member_of_fd[i]] = 1; continue; }
      int member_dead = 0;
      for (uint32_t r = 0; r < q.group_n; ++r) member_dead |= dead[q.group[r]];
      pending_t* p = pending;
      while (p != NULL && !same_operation(&p->request, &q)) p = p->next;
      if (p == NULL) {
        p = calloc(1, sizeof(*p));
        p->request = q;
        for (int r = 0; r < MAX_GROUP; ++r) p->fd[r] = -1;
        p->next = pending, pending = p;
      }
      p->fd[q.rank] = fds[i], p->in[q.rank] = input;
      /* Members that disagree on the operation get NRT_INVALID, as a mismatched collective would fail. */
      const int mismatch = q.cc_op != p->request.cc_op || q.dtype != p->request.dtype || q.op != p->request.op ||
                           q.in_bytes != p->request.in_bytes || q.out_bytes != p->request.out_bytes;
      if (member_dead || mismatch || ++p->arrived == (int)q.group_n) {
        for (pending_t** link = &pending; *link != NULL; link = &(*link)->next)
          if (*link == p) { *link = p->next; break; }
        answer(p, member_dead ? NRT_FAILURE : mismatch ? NRT_INVALID : NRT_SUCCESS);
        free(p);
      }
    }
  }
  while (pending != NULL) {
    pending_t* p = pending;
    pending = p->next;
    answer(p, NRT_FAILURE);
    free(p);
  }
  for (int i = 0; i < connected; ++i) close(fds[i]);
  return NULL;
}

static int open_socket(const char* address, int listening) {
  char host[256];
  snprintf(host, sizeof(host), "%s", address);
  char* colon = strrchr(host, ':');
  if (colon == NULL) return -1;
  *colon = '\0';
  struct addrinfo hints = {0}, *found = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = listening ? AI_PASSIVE : 0;
  if (getaddrinfo(host, colon + 1, &hints, &found) != 0) return -1;
  int fd = -1;
  const time_t give_up = time(NULL) + env_int("NRT_TEST_DOUBLE_CONNECT_TIMEOUT_S", 60);
  for (;;) {
    for (struct addrinfo* a = found; a != NULL && fd < 0; a = a->ai_next) {
      fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      int one = 1;
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)); /* a header, then data: no Nagle wait */
      if (listening ? bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0
                    : connect(fd, a->ai_addr, a->ai_addrlen) == 0)
        break;
      close(fd);
      fd = -1;
    }
    if (fd >= 0 || listening || time(NULL) >= give_up) break;
    usleep(20000); /* the hub is not listening yet */
  }
  freeaddrinfo(found);
  return fd;
}

/* ---- each process: the collectives queue ---- */

static void record_error(nrta_error_tracker_t* errors, uint64_t sequence, uint64_t code) {
  if (errors == NULL) return;
  pthread_mutex_lock(&errors->mutex);
  if (errors->count < sizeof(errors->errors) / sizeof(errors->errors[0]))
    errors->errors[errors->count++] = (nrta_error_t){sequence, code};
  pthread_mutex_unlock(&errors->mutex);
}

static uint64_t next_instance(const nrt_cc_context_t* c) {
  for (int g = 0; g < cc.group_count; ++g)
    if (cc.groups[g][0] == c->rank_n && memcmp(&cc.groups[g][1], c->group, c->rank_n * sizeof(uint32_t)) == 0)
      return cc.instances[g]++;
  if (cc.group_count == 64) return UINT64_MAX;
  cc.groups[cc.group_count][0] = c->rank_n;
  memcpy(&cc.groups[cc.group_count][1], c->group, c->rank_n * sizeof(uint32_t));
  cc.instances[cc.group_count] = 1;
  cc.group_count++;
  return 0;
}

static uint64_t run_collective(nrt_cc_context_t* c) {
  if (c->rank_n == 1) { /* a group of one: the result is the input */
    memcpy(c->out->data, c->in->data, c->out->size);
    return NRT_SUCCESS;
  }
  if (cc.socket < 0) return NRT_FAILURE;
  request_t q = {c->rank_n, c->rank, (uint32_t)c->cc_op, (uint32_t)c->dtype, (uint32_t)c->op, 0,
                 next_instance(c), c->in->size, c->out->size, {0}};
  memcpy(q.group, c->group, c->rank_n * sizeof(uint32_t));
  reply_t reply;
  if (send_all(cc.socket, &q, sizeof(q)) != 0 || send_all(cc.socket, c->in->data, c->in->size) != 0 ||
      recv_all(cc.socket, &reply, sizeof(reply)) != 0) {
    return NRT_FAILURE; /* the hub is gone */
  }
  if (reply.status != NRT_SUCCESS) return reply.status;
  return recv_all(cc.socket, c->out->data, reply.bytes) == 0 ? NRT_SUCCESS : NRT_FAILURE;
}

static void* worker_main(void* unused) {
  (void)unused;
  pthread_mutex_lock(&cc.mutex);
  for (;;) {
    while (cc.head == NULL && !cc.stopping) pthread_cond_wait(&cc.wake, &cc.mutex);
    if (cc.head == NULL) break;
    nrt_cc_context_t* c = cc.head;
    cc.head = c->next;
    if (cc.head == NULL) cc.tail = NULL;
    pthread_mutex_unlock(&cc.mutex);
    const uint64_t status = run_collective(c);
    if (status != NRT_SUCCESS) record_error(c->errors, c->sequence, status);
    pthread_mutex_lock(&cc.mutex);
    cc.completed = c->sequence & SEQ_MASK;
    free(c); /* the runtime frees the context once the operation has run */
  }
  pthread_mutex_unlock(&cc.mutex);
  return NULL;
}

EXPORT int nrt_cc_global_comm_init(uint32_t vnc, uint32_t global_device_id, uint32_t global_device_count) {
  if (!initialized) return NRT_UNINITIALIZED;
  if (vnc != 0 || global_device_id >= global_device_count || global_device_count > MAX_GROUP) return NRT_INVALID;
  cc.global_rank = (int)global_device_id;
  cc.world = (int)global_device_count;
  cc.stopping = 0;
  cc.group_count = 0;
  cc.scheduled = cc.completed = 0;
  if (global_device_count > 1) {
    const char* root = getenv("NEURON_RT_ROOT_COMM_ID");
    if (root == NULL || strchr(root, ':') == NULL) {
      fprintf(stderr, "nrt test double: NEURON_RT_ROOT_COMM_ID is not host:port\n");
      return NRT_INVALID;
    }
    if (global_device_id == 0) {
      cc.hub_listener = open_socket(root, 1);
      if (cc.hub_listener < 0) return NRT_FAILURE;
      pthread_create(&cc.hub, NULL, hub_main, NULL);
    }
    cc.socket = open_socket(root, 0);
    if (cc.socket < 0) return NRT_TIMEOUT;
    const uint32_t me = global_device_id;
    if (send_all(cc.socket, &me, sizeof(me)) != 0) return NRT_FAILURE;
  }
  pthread_create(&cc.worker, NULL, worker_main, NULL);
  cc.started = 1;
  return NRT_SUCCESS;
}

static void stop_collectives(void) {
  if (!cc.started) return;
  pthread_mutex_lock(&cc.mutex);
  cc.stopping = 1;
  cc.stop_deadline = time(NULL) + 30;
  pthread_cond_broadcast(&cc.wake);
  pthread_mutex_unlock(&cc.mutex);
  if (cc.socket >= 0) shutdown(cc.socket, SHUT_RDWR); /* a worker waiting on a peer returns */
  pthread_join(cc.worker, NULL);
  if (cc.socket >= 0) close(cc.socket);
  cc.socket = -1;
  if (cc.hub_listener >= 0) {
    shutdown(cc.hub_listener, SHUT_RDWR);
    pthread_join(cc.hub, NULL);
    close(cc.hub_listener);
    cc.hub_listener = -1;
  }
  while (cc.head != NULL) {
    nrt_cc_context_t* c = cc.head;
    cc.head = c->next;
    free(c);
  }
  cc.tail = NULL;
  cc.started = 0;
}

#ifndef NRT_TEST_DOUBLE_INCOMPLETE
EXPORT int nrta_cc_prepare(nrt_cc_comm_t* comm, nrt_tensor_list_t* input, nrt_tensor_list_t* output, int dtype, int op,
                           int cc_op, nrt_cc_context_t** context) {
  if (!cc.started) return NRT_UNINITIALIZED;
  if (comm == NULL || comm->rank_n == 0 || comm->rank_n > MAX_GROUP || comm->rank >= comm->rank_n ||
      input == NULL || output == NULL || input->num_tensors != 1 || output->num_tensors != 1 ||
      dtype_bytes(dtype) == 0 || (op != OP_ADD && op != OP_MAX && op != OP_MIN) || cc_op < 0 || cc_op > 2)
    return NRT_INVALID;
  nrt_tensor_t *in = input->tensors[0], *out = output->tensors[0];
  const size_t expected = cc_op == CC_ALLREDUCE ? in->size : cc_op == CC_ALLGATHER ? in->size * comm->rank_n
                                                                                   : in->size / comm->rank_n;
  if (out->size != expected || in->size % dtype_bytes(dtype) != 0 ||
      (cc_op == CC_REDUCESCATTER && in->size % comm->rank_n != 0))
    return NRT_INVALID;
  for (uint32_t r = 0; r < comm->rank_n; ++r)
    if (comm->replica_group[r] >= (uint32_t)cc.world) return NRT_INVALID;
  if (comm->replica_group[comm->rank] != (uint32_t)cc.global_rank) return NRT_INVALID;
  nrt_cc_context_t* c = calloc(1, sizeof(*c));
  memcpy(c->group, comm->replica_group, comm->rank_n * sizeof(uint32_t));
  c->rank = comm->rank, c->rank_n = comm->rank_n;
  c->in = in, c->out = out, c->dtype = dtype, c->op = op, c->cc_op = cc_op;
  *context = c;
  return NRT_SUCCESS;
}
#endif

EXPORT int nrta_cc_schedule(nrt_cc_context_t** context, int queue, nrta_error_tracker_t* errors, uint64_t* sequence) {
  if (context == NULL || *context == NULL || queue != 0) return NRT_INVALID;
  nrt_cc_context_t* c = *context;
  pthread_mutex_lock(&cc.mutex);
  c->sequence = (COLLECTIVES_XU << 48) | ++cc.scheduled;
  c->errors = errors;
  if (cc.tail != NULL) cc.tail->next = c;
  else cc.head = c;
  cc.tail = c;
  *sequence = c->sequence; /* before unlocking: the worker frees the context once it has run */
  pthread_cond_signal(&cc.wake);
  pthread_mutex_unlock(&cc.mutex);
  *context = NULL;
  return NRT_SUCCESS;
}

EXPORT int nrta_is_completed(uint64_t sequence, bool* completed) {
  if ((sequence >> 48) != COLLECTIVES_XU) return NRT_INVALID;
  pthread_mutex_lock(&cc.mutex);
  const uint64_t number = sequence & SEQ_MASK;
  const int valid = number >= 1 && number <= cc.scheduled;
  *completed = number <= cc.completed;
  pthread_mutex_unlock(&cc.mutex);
  return valid ? NRT_SUCCESS : NRT_INVALID;
}

EXPORT int nrta_error_tracker_create(uint32_t vnc, nrta_error_tracker_t** tracker) {
  if (vnc != 0) return NRT_INVALID;
  *tracker = calloc(1, sizeof(**tracker));
  pthread_mutex_init(&(*tracker)->mutex, NULL);
  return NRT_SUCCESS;
}
EXPORT void nrta_error_tracker_destroy(nrta_error_tracker_t* tracker) {
  if (tracker == NULL) return;
  pthread_mutex_destroy(&tracker->mutex);
  free(tracker);
}
EXPORT int nrta_error_tracker_get_list(nrta_error_tracker_t* tracker, const nrta_error_t** list, size_t* count) {
  pthread_mutex_lock(&tracker->mutex);
  *list = tracker->errors;
  *count = tracker->count;
  pthread_mutex_unlock(&tracker->mutex);
  return NRT_SUCCESS;
}
