// Raw oneCCL (Intel's collective library for CPU training), as its users call it: a communicator made
// from a key-value store that rank 0 creates, whose address the job's MPI carries to the others (what
// oneCCL's own examples do), and every call's event waited for at once.
#include <mpi.h>

#include <cstring>
#include <oneapi/ccl.hpp>
#include <string>
#include <vector>

#include "raw_library.h"

// The CPU archive of PyPI's oneccl-cpu-devel refers to the Intel compiler's memcpy and memset (the
// wheel's shared library instead asks for a libccl.so.2 no wheel ships) and to Intel's ITT tracing
// hooks, null where no tracing collector is loaded: libc's routines and null hooks stand in.
extern "C" {
void* _intel_fast_memcpy(void* to, const void* from, size_t n) { return std::memcpy(to, from, n); }
void* _intel_fast_memset(void* to, int value, size_t n) { return std::memset(to, value, n); }
void* __itt_domain_create_ptr__3_0 = nullptr;
void* __itt_event_create_ptr__3_0 = nullptr;
void* __itt_event_end_ptr__3_0 = nullptr;
void* __itt_event_start_ptr__3_0 = nullptr;
void* __itt_metadata_add_ptr__3_0 = nullptr;
void* __itt_string_handle_create_ptr__3_0 = nullptr;
void* __itt_task_begin_ptr__3_0 = nullptr;
void* __itt_task_end_ptr__3_0 = nullptr;
void* __itt_thread_set_name_ptr__3_0 = nullptr;
}

namespace backplane::bench {
namespace {

class RawOneCcl : public RawLibrary {
 public:
  RawOneCcl() : comm_(make_communicator()) {}

  std::string description() const override {
    const ccl::library_version version = ccl::get_library_version();
    return "oneCCL " + std::to_string(version.major) + "." + std::to_string(version.minor) + "." +
           std::to_string(version.update);
  }

  void allreduce(void* buf, size_t count, bpl_dtype dtype) override {
    ccl::allreduce(buf, buf, count, type(dtype), ccl::reduction::sum, comm_).wait();
  }
  void allgather(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    ccl::allgather(send, recv, count, type(dtype), comm_).wait();
  }
  void reduce_scatter(void* send, void* recv, size_t recvcount, bpl_dtype dtype) override {
    ccl::reduce_scatter(send, recv, recvcount, type(dtype), ccl::reduction::sum, comm_).wait();
  }
  void broadcast(void* buf, size_t count, bpl_dtype dtype, int root) override {
    ccl::broadcast(buf, count, type(dtype), root, comm_).wait();
  }
  void reduce(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    ccl::reduce(send, recv, count, type(dtype), ccl::reduction::sum, root, comm_).wait();
  }
  void alltoall(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    ccl::alltoall(send, recv, count, type(dtype), comm_).wait();
  }
  void gather(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    ccl::gather(send, recv, count, type(dtype), root, comm_).wait();
  }
  void scatter(const void* send, void* recv, size_t count, bpl_dtype dtype, int root) override {
    ccl::scatter(send, recv, count, type(dtype), root, comm_).wait();
  }
  void allgatherv(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    const std::vector<size_t> counts(static_cast<size_t>(comm_.size()), count);
    ccl::allgatherv(send, count, recv, counts, type(dtype), comm_).wait();
  }
  void alltoallv(const void* send, void* recv, size_t count, bpl_dtype dtype) override {
    const std::vector<size_t> counts(static_cast<size_t>(comm_.size()), count);
    ccl::alltoallv(send, counts, recv, counts, type(dtype), comm_).wait();
  }
  void send(const void* buf, size_t bytes, int peer) override {
    ccl::send(const_cast<void*>(buf), bytes, ccl::datatype::uint8, peer, comm_).wait();
  }
  void recv(void* buf, size_t bytes, int peer) override {
    ccl::recv(buf, bytes, ccl::datatype::uint8, peer, comm_).wait();
  }
  void barrier() override { ccl::barrier(comm_).wait(); }

 private:
  static ccl::communicator make_communicator() {
    ccl::init();
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    ccl::shared_ptr_class<ccl::kvs> kvs;
    ccl::kvs::address_type address;
    if (rank == 0) {
      kvs = ccl::create_main_kvs();
      address = kvs->get_address();
    }
    MPI_Bcast(address.data(), static_cast<int>(address.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
    if (rank != 0) kvs = ccl::create_kvs(address);
    return ccl::create_communicator(size, rank, kvs);
  }

  static ccl::datatype type(bpl_dtype dtype) {
    return dtype == BPL_DTYPE_BF16 ? ccl::datatype::bfloat16 : ccl::datatype::float32;
  }

  ccl::communicator comm_;
};

}  // namespace

std::unique_ptr<RawLibrary> open_raw_oneccl() { return std::make_unique<RawOneCcl>(); }

}  // namespace backplane::bench
