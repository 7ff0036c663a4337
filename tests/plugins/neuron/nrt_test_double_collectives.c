/* The libnrt test double's collectives (see nrt_test_double.c): each process runs its scheduled
 * collectives in order on a worker thread, as the runtime's queue does, each a request to the hub
 * (nrt_test_double_hub.c) answered with the member's output. */
#define _GNU_SOURCE
#include "nrt_test_double.h"

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

static struct {
  pthread_mutex_t mutex;
  pthread_cond_t wake;
  int global_rank, world, socket, stopping, started;
  pthread_t worker;
  nrt_cc_context_t *head, *tail;
  uint64_t scheduled, completed;
  /* per-group instance counters of this member */
  uint32_t groups[64][MAX_GROUP + 1];
  uint64_t instances[64];
  int group_count;
} cc = {.mutex = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .world = 1, .socket = -1};

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
  if (!runtime_initialized()) return NRT_UNINITIALIZED;
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
    if (global_device_id == 0 && hub_start(root, (int)global_device_count) != 0) return NRT_FAILURE;
    cc.socket = open_socket(root, 0);
    if (cc.socket < 0) return NRT_TIMEOUT;
    const uint32_t me = global_device_id;
    if (send_all(cc.socket, &me, sizeof(me)) != 0) return NRT_FAILURE;
  }
  pthread_create(&cc.worker, NULL, worker_main, NULL);
  cc.started = 1;
  return NRT_SUCCESS;
}

void stop_collectives(void) {
  if (!cc.started) return;
  pthread_mutex_lock(&cc.mutex);
  cc.stopping = 1;
  pthread_cond_broadcast(&cc.wake);
  pthread_mutex_unlock(&cc.mutex);
  if (cc.socket >= 0) shutdown(cc.socket, SHUT_RDWR); /* a worker waiting on a peer returns */
  pthread_join(cc.worker, NULL);
  if (cc.socket >= 0) close(cc.socket);
  cc.socket = -1;
  hub_stop();
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
