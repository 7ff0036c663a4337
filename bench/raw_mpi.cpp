// Raw MPI: the blocking calls a user of MPI makes, on MPI_COMM_WORLD's duplicate. bf16, which MPI lacks,
// travels as 16-bit words with a user-defined sum (what MPI users write for it).
#include "raw_library.h"

#ifdef BPL_BENCH_WITH_MPI
#include <c10/util/BFloat16.h>
#include <mpi.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace backplane::bench {
namespace {

void bf16_sum(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* x = static_cast<const c10::BFloat16*>(in);
  auto* y = static_cast<c10::BFloat16*>(inout);
  for (int i = 0; i < *length; ++i) y[i] = static_cast<float>(x[i]) + static_cast<float>(y[i]);
}

void check(int code, const char* what) {
  if (code != MPI_SUCCESS) throw std::runtime_error(std::string("raw MPI: ") + what + " failed");
}

class RawMpi : public RawLibrary {
 public:
  RawMpi() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) throw std::runtime_error("raw MPI: MPI is not initialised (is the mpi backend running?)");
    check(MPI_Comm_dup(MPI_COMM_WORLD, &comm_), "MPI_Comm_dup");
    check(MPI_Op_create(&bf16_sum, 1, &bf16_sum_op_), "MPI_Op_create");
  }
  ~RawMpi() override {
    MPI_Op_free(&bf16_sum_op_);
    MPI_Comm_free(&comm_);
  }

  std::string description() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string text(version, static_cast<size_t>(length));
    return text.substr(0, text.find_first_of(",\n"));
  }

  void allreduce(void* buf, size_t count, bpl_dtype dtype) override {
    check(MPI_Allreduce(MPI_IN_PLACE, buf, static_cast<int>(count), type(dtype), sum(dtype), comm_), "MPI_Allreduce");
  }
  void allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    check(MPI_Allgather(send, static_cast<int>(count), type(dtype), recv, static_cast<int>(count), type(dtype), comm_),
          "MPI_Allgather");
  }
  void reduce_scatter(void* send, void* recv, size_t recvcount, bpl_dtype dtype) override {
    check(MPI_Reduce_scatter_block(send, recv, static_cast<int>(recvcount), type(dtype), sum(dtype), comm_),
          "MPI_Reduce_scatter_block");
  }
  void broadcast(void* buf, size_t count, bpl_dtype dtype, int root) override {
    check(MPI_Bcast(buf, static_cast<int>(count), type(dtype), root, comm_), "MPI_Bcast");
  }
  void alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    check(MPI_Alltoall(send, static_cast<int>(count), type(dtype), recv, static_cast<int>(count), type(dtype), comm_),
          "MPI_Alltoall");
  }
  void gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    check(MPI_Gather(send, static_cast<int>(count), type(dtype), recv, static_cast<int>(count), type(dtype), root, comm_),
          "MPI_Gather");
  }
  void scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    check(MPI_Scatter(send, static_cast<int>(count), type(dtype), recv, static_cast<int>(count), type(dtype), root, comm_),
          "MPI_Scatter");
  }
  void allgatherv(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    const std::vector<int> counts(static_cast<size_t>(size()), static_cast<int>(count)), displs = prefix_sums(counts);
    check(MPI_Allgatherv(send, static_cast<int>(count), type(dtype), recv, counts.data(), displs.data(), type(dtype), comm_),
          "MPI_Allgatherv");
  }
  void alltoallv(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    const std::vector<int> counts(static_cast<size_t>(size()), static_cast<int>(count)), displs = prefix_sums(counts);
    check(MPI_Alltoallv(send, counts.data(), displs.data(), type(dtype), recv, counts.data(), displs.data(), type(dtype), comm_),
          "MPI_Alltoallv");
  }
  void send(const void* buf, size_t bytes, int peer) override {
    check(MPI_Send(buf, static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_), "MPI_Send");
  }
  void recv(void* buf, size_t bytes, int peer) override {
    check(MPI_Recv(buf, static_cast<int>(bytes), MPI_BYTE, peer, 0, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  }
  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }

 private:
  MPI_Datatype type(bpl_dtype dtype) const { return dtype == BPL_DTYPE_BF16 ? MPI_UINT16_T : MPI_FLOAT; }
  int size() const {
    int n = 1;
    MPI_Comm_size(comm_, &n);
    return n;
  }
  static std::vector<int> prefix_sums(const std::vector<int>& counts) {
    std::vector<int> displs(counts.size(), 0);
    for (size_t i = 1; i < counts.size(); ++i) displs[i] = displs[i - 1] + counts[i - 1];
    return displs;
  }
  MPI_Op sum(bpl_dtype dtype) const { return dtype == BPL_DTYPE_BF16 ? bf16_sum_op_ : MPI_SUM; }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Op bf16_sum_op_ = MPI_OP_NULL;
};

}  // namespace

std::unique_ptr<RawLibrary> open_raw_mpi() { return std::make_unique<RawMpi>(); }

}  // namespace backplane::bench
#else
std::unique_ptr<backplane::bench::RawLibrary> backplane::bench::open_raw_mpi() { return nullptr; }
#endif
